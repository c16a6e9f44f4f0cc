/*
 * Optimizer-state offload to a file, streamed through a bounded buffer with
 * an I/O thread (see offload.h and docs/memory.md).
 *
 * Pipeline of one update over K chunks with S >= 3 slots, jobs executed by
 * one I/O thread in posting order:
 *   post read(0)
 *   for i in 0..K-1: post read(i+1); wait for read(i); update chunk i in
 *                    slot i % S; post write(i)
 *   wait for every job
 * While chunk i is updated the thread writes chunk i-1 and reads chunk
 * i+1, whose slots differ from i's when S >= 3; a slot is read into only
 * after the write that last used it, because jobs run in order.
 */
#include "offload.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY "zero_optimization.offload_optimizer"
#define QCAP 8

typedef struct {
    bool write;
    size_t chunk;
    int slot;
} io_job;

struct train_offload {
    int fd;
    char path[4096];
    size_t n;     /* floats per state buffer */
    int n_states; /* 1 or 2 */
    int which[2]; /* which optimizer state each file region holds */
    size_t chunk; /* floats per state per slot */
    int slots;
    float *buf; /* [slots][n_states][chunk] */
    pthread_t thread;
    bool thread_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    io_job q[QCAP];
    long posted, done;
    bool quit;
    int err;           /* first errno of the I/O thread */
    char err_what[64]; /* "read" / "write" */
    double io_seconds, wait_seconds, io_mark, wait_mark;
    void *map;
    size_t map_len;
};

/* ---------------------------------------------------------- I/O thread */

static float *slot_state(train_offload *f, int slot, int k) {
    return f->buf + ((size_t)slot * (size_t)f->n_states + (size_t)k) * f->chunk;
}

static size_t chunk_len(const train_offload *f, size_t c) {
    size_t b = c * f->chunk;
    return f->n - b < f->chunk ? f->n - b : f->chunk;
}

/* Moves one chunk of every state between its slot and the file; errno or 0. */
static int do_job(train_offload *f, const io_job *j) {
    size_t len = chunk_len(f, j->chunk) * sizeof(float);
    for (int k = 0; k < f->n_states; k++) {
        char *p = (char *)slot_state(f, j->slot, k);
        off_t off = (off_t)(((size_t)k * f->n + j->chunk * f->chunk) * sizeof(float));
        size_t got = 0;
        while (got < len) {
            ssize_t r = j->write ? pwrite(f->fd, p + got, len - got, off + (off_t)got)
                                 : pread(f->fd, p + got, len - got, off + (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return errno;
            if (r == 0) return EIO; /* the file is shorter than it was made: treat as an I/O error */
            got += (size_t)r;
        }
    }
    return 0;
}

static void *io_main(void *arg) {
    train_offload *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->quit && f->done == f->posted) pthread_cond_wait(&f->cv, &f->mu);
        if (f->done == f->posted) break; /* quit with nothing left */
        io_job j = f->q[f->done % QCAP];
        bool skip = f->err != 0;
        pthread_mutex_unlock(&f->mu);
        double t0 = cllm_time_sec();
        int e = skip ? 0 : do_job(f, &j);
        double dt = cllm_time_sec() - t0;
        pthread_mutex_lock(&f->mu);
        f->io_seconds += dt;
        if (e && !f->err) {
            f->err = e;
            snprintf(f->err_what, sizeof f->err_what, "%s", j.write ? "writing" : "reading");
        }
        f->done++;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* Queues a job; returns its sequence number. */
static long post(train_offload *f, bool write, size_t chunk, int slot) {
    pthread_mutex_lock(&f->mu);
    while (f->posted - f->done >= QCAP) pthread_cond_wait(&f->cv, &f->mu);
    f->q[f->posted % QCAP] = (io_job){write, chunk, slot};
    long id = f->posted++;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return id;
}

/* Waits until job `id` (and every earlier one) is done; the I/O error, if any. */
static cllm_status wait_job(train_offload *f, long id) {
    double t0 = cllm_time_sec();
    pthread_mutex_lock(&f->mu);
    while (f->done <= id) pthread_cond_wait(&f->cv, &f->mu);
    int e = f->err;
    pthread_mutex_unlock(&f->mu);
    f->wait_seconds += cllm_time_sec() - t0;
    if (e) return CLLM_FAIL(CLLM_ERR_IO, "%s the offloaded optimizer state %s: %s", f->err_what, f->path, strerror(e));
    return CLLM_OK;
}

/* ----------------------------------------------------------- lifetime */

cllm_status train_offload_init(train_offload **out, const cllm_offload_config *oc, const cllm_optim_params *p,
                               size_t n, int rank) {
    static int serial;
    *out = NULL;
    struct stat sb;
    if (stat(oc->nvme_path, &sb) != 0)
        return CLLM_FAIL(CLLM_ERR_IO, "%s.nvme_path: '%s': %s (create the folder or fix the path)", KEY, oc->nvme_path,
                         strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return CLLM_FAIL(CLLM_ERR_IO, "%s.nvme_path: '%s' is not a folder", KEY, oc->nvme_path);
    train_offload *f = calloc(1, sizeof *f);
    if (!f) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    f->fd = -1;
    f->n = n;
    for (int k = 0; k < 2; k++)
        if (cllm_optim_has_state(p, k)) f->which[f->n_states++] = k;
    f->slots = (int)oc->buffer_count;
    f->chunk = (size_t)oc->buffer_size < n ? (size_t)oc->buffer_size : (n > 0 ? n : 1);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    cllm_status st = CLLM_OK;
    snprintf(f->path, sizeof f->path, "%s/cllm-optimizer-state-%ld-rank%d-%d.bin", oc->nvme_path, (long)getpid(), rank,
             serial++);
    f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (f->fd < 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "%s.nvme_path: cannot create %s: %s (the folder must be writable)", KEY, f->path,
                       strerror(errno));
        f->path[0] = 0;
        goto fail;
    }
    size_t bytes = 0;
    if (!cllm_size_mul((size_t)f->n_states * sizeof(float), n, &bytes) || bytes > (size_t)INT64_MAX) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "optimizer state of %zu floats is too large", n);
        goto fail;
    }
    if (ftruncate(f->fd, (off_t)bytes) != 0) {
        st = CLLM_FAIL(CLLM_ERR_IO, "%s.nvme_path: cannot size %s to %zu bytes: %s", KEY, f->path, bytes,
                       strerror(errno));
        goto fail;
    }
    if (f->n_states > 0) {
        size_t floats = (size_t)f->slots * (size_t)f->n_states * f->chunk;
        if (!(f->buf = cllm_alloc(floats * sizeof(float), "offload buffer"))) {
            st = CLLM_ERR_NOMEM;
            goto fail;
        }
    }
    if (pthread_create(&f->thread, NULL, io_main, f) != 0) {
        st = CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot start the offload I/O thread");
        goto fail;
    }
    f->thread_on = true;
    *out = f;
    return CLLM_OK;
fail:
    train_offload_free(f);
    return st;
}

void train_offload_free(train_offload *f) {
    if (!f) return;
    if (f->thread_on) {
        pthread_mutex_lock(&f->mu);
        f->quit = true;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
    }
    train_offload_unmap(f);
    if (f->fd >= 0) close(f->fd);
    if (f->path[0]) unlink(f->path);
    cllm_free(f->buf);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

/* ------------------------------------------------------------- update */

cllm_status train_offload_step(train_offload *f, cllm_optimizer *o, float *params, const float *grads,
                               const cllm_param_range *ranges, int n_ranges, double lr) {
    cllm_optim_step_begin(o);
    if (f->n == 0) return CLLM_OK;
    if (f->n_states == 0) {
        /* plain SGD keeps no state: nothing to stream */
        cllm_optim_step_window(o, params, grads, NULL, NULL, 0, f->n, ranges, n_ranges, lr);
        return CLLM_OK;
    }
    const size_t K = (f->n + f->chunk - 1) / f->chunk;
    long next_read = post(f, false, 0, 0), last = next_read;
    cllm_status st = CLLM_OK;
    for (size_t i = 0; i < K; i++) {
        long this_read = next_read;
        if (i + 1 < K) last = next_read = post(f, false, i + 1, (int)((i + 1) % (size_t)f->slots));
        if ((st = wait_job(f, this_read))) break;
        int slot = (int)(i % (size_t)f->slots);
        float *s[2] = {NULL, NULL};
        for (int k = 0; k < f->n_states; k++) s[f->which[k]] = slot_state(f, slot, k);
        size_t b = i * f->chunk;
        cllm_optim_step_window(o, params, grads, s[0], s[1], b, b + chunk_len(f, i), ranges, n_ranges, lr);
        last = post(f, true, i, slot);
    }
    cllm_status st2 = wait_job(f, last);
    return st ? st : st2;
}

/* ------------------------------------------------------ checkpoint map */

cllm_status train_offload_map(train_offload *f, bool writable, float **s0, float **s1) {
    *s0 = *s1 = NULL;
    train_offload_unmap(f);
    size_t len = (size_t)f->n_states * f->n * sizeof(float);
    if (len == 0) return CLLM_OK;
    void *m = mmap(NULL, len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) return CLLM_FAIL(CLLM_ERR_IO, "cannot map %s: %s", f->path, strerror(errno));
    f->map = m;
    f->map_len = len;
    float *base = m;
    for (int k = 0; k < f->n_states; k++) {
        float *p = base + (size_t)k * f->n;
        if (f->which[k] == 0) *s0 = p;
        else *s1 = p;
    }
    return CLLM_OK;
}

void train_offload_unmap(train_offload *f) {
    if (!f || !f->map) return;
    munmap(f->map, f->map_len);
    f->map = NULL;
    f->map_len = 0;
}

size_t train_offload_buffer_bytes(const train_offload *f) {
    return f ? (size_t)f->slots * (size_t)f->n_states * f->chunk * sizeof(float) : 0;
}

void train_offload_times(train_offload *f, double *io_seconds, double *wait_seconds) {
    pthread_mutex_lock(&f->mu);
    *io_seconds = f->io_seconds;
    pthread_mutex_unlock(&f->mu);
    *wait_seconds = f->wait_seconds;
}

void train_offload_take_step_times(train_offload *f, double *io_seconds, double *wait_seconds) {
    double io, wait;
    train_offload_times(f, &io, &wait);
    *io_seconds = io - f->io_mark;
    *wait_seconds = wait - f->wait_mark;
    f->io_mark = io;
    f->wait_mark = wait;
}
