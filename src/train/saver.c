/*
 * The checkpoint saver: a synchronous write, or a copy of params and
 * optimizer state into a private buffer followed by the write on a pthread,
 * so training continues while the files are written and fsynced. One write
 * is in flight at a time; the next save (or the end of the run) waits for it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "train_impl.h"

struct train_saver {
    size_t n;
    bool async, has0, has1;
    float *params, *s0, *s1; /* snapshot (async only) */
    /* the job in flight */
    bool running;
    pthread_t thread;
    const char *out;
    const cllm_model *m;
    cllm_ckpt_state st;
    size_t max_shard;
    long keep;
    cllm_status result;
    char error[1024];
    double write_seconds;
};

cllm_status train_saver_init(train_saver **out, size_t n, bool has0, bool has1, bool async) {
    *out = NULL;
    train_saver *s = calloc(1, sizeof *s);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    s->n = n;
    s->async = async;
    s->has0 = has0;
    s->has1 = has1;
    *out = s;
    return CLLM_OK;
}

static cllm_status write_now(train_saver *s, const float *p, const float *a, const float *b) {
    cllm_ckpt_tensors t = {p, a, b, s->n};
    double t0 = cllm_time_sec();
    cllm_status st = cllm_ckpt_write(s->out, s->m, &t, &s->st, s->max_shard, s->keep);
    s->write_seconds += cllm_time_sec() - t0;
    return st;
}

static void *writer_main(void *arg) {
    train_saver *s = arg;
    s->result = write_now(s, s->params, s->has0 ? s->s0 : NULL, s->has1 ? s->s1 : NULL);
    /* the error message is thread-local: carry it back to the caller */
    if (s->result) snprintf(s->error, sizeof s->error, "%s", cllm_last_error());
    return NULL;
}

cllm_status train_saver_wait(train_saver *s, double *wait_seconds) {
    if (!s || !s->running) return CLLM_OK;
    double t0 = cllm_time_sec();
    pthread_join(s->thread, NULL);
    s->running = false;
    if (wait_seconds) *wait_seconds += cllm_time_sec() - t0;
    if (s->result) return CLLM_FAIL(s->result, "%s", s->error);
    return CLLM_OK;
}

cllm_status train_saver_save(train_saver *s, const char *out, const cllm_model *m, const float *params,
                             const float *s0, const float *s1, const cllm_ckpt_state *st, size_t max_shard,
                             long keep, double *wait_seconds) {
    double t0 = cllm_time_sec();
    cllm_status rc = train_saver_wait(s, NULL);
    if (rc) return rc;
    s->out = out;
    s->m = m;
    s->st = *st;
    s->max_shard = max_shard;
    s->keep = keep;
    if (!s->async) {
        rc = write_now(s, params, s0, s1);
        *wait_seconds = cllm_time_sec() - t0;
        return rc;
    }
    size_t bytes = s->n * sizeof(float);
    if (!s->params && !(s->params = cllm_alloc(bytes, "checkpoint snapshot"))) return CLLM_ERR_NOMEM;
    if (s->has0 && !s->s0 && !(s->s0 = cllm_alloc(bytes, "checkpoint snapshot"))) return CLLM_ERR_NOMEM;
    if (s->has1 && !s->s1 && !(s->s1 = cllm_alloc(bytes, "checkpoint snapshot"))) return CLLM_ERR_NOMEM;
    memcpy(s->params, params, bytes);
    if (s->has0) memcpy(s->s0, s0, bytes);
    if (s->has1) memcpy(s->s1, s1, bytes);
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        /* no thread: write in place */
        rc = write_now(s, s->params, s->has0 ? s->s0 : NULL, s->has1 ? s->s1 : NULL);
    } else {
        s->running = true;
    }
    *wait_seconds = cllm_time_sec() - t0;
    return rc;
}

double train_saver_write_seconds(const train_saver *s) { return s ? s->write_seconds : 0; }

void train_saver_free(train_saver *s) {
    if (!s) return;
    if (s->running) pthread_join(s->thread, NULL);
    cllm_free(s->params);
    cllm_free(s->s0);
    cllm_free(s->s1);
    free(s);
}
