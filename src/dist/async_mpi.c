/*
 * The nonblocking collectives of cllm/dist.h on MPI (MPI_Iallgatherv,
 * MPI_Ireduce_scatter, MPI_Iallreduce), and an optional progress thread.
 *
 * OpenMPI 4.1 (Debian 12) provides MPI_THREAD_MULTIPLE but no asynchronous
 * progress: a nonblocking collective moves only while some thread is inside
 * MPI. The progress thread tests the outstanding requests every
 * PROGRESS_SLEEP_US microseconds (sleeping in between, so that it does not
 * take a core from the computation), records when each completed, and
 * wakes a waiting caller. Only the thread touches a registered request with
 * MPI; the caller waits on a condition variable. Without the thread the
 * caller's cllm_dist_test / cllm_dist_wait call MPI_Test / MPI_Wait.
 * Not here: cancellation (a failed rank ends the world with MPI_Abort).
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cllm/dist.h"

#define PROGRESS_SLEEP_US 50

struct cllm_dist_request {
    MPI_Request mpi;
    int *counts;          /* [2 * size]: counts and displacements, alive until done */
    bool done;            /* set under `lock` by the progress thread */
    double finished;
    int rc;
    cllm_dist_request *next; /* the progress thread's list */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;  /* new work, or stop */
static pthread_cond_t finished_cv = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static bool running, stopping;
static cllm_dist_request *outstanding;

static cllm_status fail(int rc, const char *func, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) msg[0] = 0;
    return cllm_fail(CLLM_ERR_INTERNAL, func, "%s failed on rank %d: %s", what, cllm_dist_rank(), msg);
}

static void *progress(void *arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!stopping) {
        if (!outstanding) {
            pthread_cond_wait(&wake, &lock);
            continue;
        }
        bool any = false;
        for (cllm_dist_request **p = &outstanding; *p;) {
            cllm_dist_request *r = *p;
            int flag = 0;
            r->rc = MPI_Test(&r->mpi, &flag, MPI_STATUS_IGNORE);
            if (flag || r->rc != MPI_SUCCESS) {
                r->done = true;
                r->finished = cllm_time_sec();
                *p = r->next;
                any = true;
            } else {
                p = &r->next;
            }
        }
        if (any) pthread_cond_broadcast(&finished_cv);
        pthread_mutex_unlock(&lock);
        struct timespec ts = {0, PROGRESS_SLEEP_US * 1000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

bool cllm_dist_progress_start(void) {
    if (running) return true;
    if (!cllm_dist_active()) return false;
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_MULTIPLE) return false;
    stopping = false;
    if (pthread_create(&thread, NULL, progress, NULL) != 0) return false;
    running = true;
    return true;
}

void cllm_dist_progress_stop(void) {
    if (!running) return;
    pthread_mutex_lock(&lock);
    stopping = true;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
    running = false;
}

/* counts -> int counts and displacements in a new request */
static cllm_status new_request(const size_t *counts, cllm_dist_request **out, const char *func) {
    int size = cllm_dist_size();
    cllm_dist_request *r = calloc(1, sizeof *r);
    int *c = malloc(2 * (size_t)size * sizeof *c);
    if (!r || !c) {
        free(r);
        free(c);
        return cllm_fail(CLLM_ERR_NOMEM, func, "out of memory");
    }
    size_t off = 0;
    for (int i = 0; i < size; i++) {
        if (counts[i] > (size_t)INT_MAX || off > (size_t)INT_MAX) {
            free(r);
            free(c);
            return cllm_fail(CLLM_ERR_ARG, func, "part %d (%zu floats at %zu) exceeds MPI's int counts; use smaller "
                             "buckets", i, counts[i], off);
        }
        c[i] = (int)counts[i];
        c[size + i] = (int)off;
        off += counts[i];
    }
    r->counts = c;
    *out = r;
    return CLLM_OK;
}

/* hands a started request to the progress thread, if there is one */
static void submit(cllm_dist_request *r) {
    if (!running) return;
    pthread_mutex_lock(&lock);
    r->next = outstanding;
    outstanding = r;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&lock);
}

cllm_status cllm_dist_iallgather_f32(float *buf, const size_t *counts, cllm_dist_request **req) {
    *req = NULL;
    if (!cllm_dist_active()) return CLLM_OK;
    cllm_dist_request *r;
    cllm_status st = new_request(counts, &r, __func__);
    if (st) return st;
    int size = cllm_dist_size();
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, r->counts, r->counts + size, MPI_FLOAT,
                             MPI_COMM_WORLD, &r->mpi);
    if (rc != MPI_SUCCESS) {
        free(r->counts);
        free(r);
        return fail(rc, __func__, "MPI_Iallgatherv");
    }
    submit(r);
    *req = r;
    return CLLM_OK;
}

cllm_status cllm_dist_ireduce_scatter_sum_f32(float *buf, const size_t *counts, cllm_dist_request **req) {
    *req = NULL;
    if (!cllm_dist_active()) return CLLM_OK;
    cllm_dist_request *r;
    cllm_status st = new_request(counts, &r, __func__);
    if (st) return st;
    int rc = MPI_Ireduce_scatter(MPI_IN_PLACE, buf, r->counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r->mpi);
    if (rc != MPI_SUCCESS) {
        free(r->counts);
        free(r);
        return fail(rc, __func__, "MPI_Ireduce_scatter");
    }
    submit(r);
    *req = r;
    return CLLM_OK;
}

cllm_status cllm_dist_iallreduce_sum_f32(float *buf, size_t n, cllm_dist_request **req) {
    *req = NULL;
    if (!cllm_dist_active() || n == 0) return CLLM_OK;
    if (n > (size_t)INT_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "%zu floats exceed MPI's int counts; use smaller buckets", n);
    cllm_dist_request *r = calloc(1, sizeof *r);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r->mpi);
    if (rc != MPI_SUCCESS) {
        free(r);
        return fail(rc, __func__, "MPI_Iallreduce");
    }
    submit(r);
    *req = r;
    return CLLM_OK;
}

cllm_status cllm_dist_test(cllm_dist_request *req, bool *done) {
    *done = true;
    if (!req) return CLLM_OK;
    if (running) {
        pthread_mutex_lock(&lock);
        *done = req->done;
        pthread_mutex_unlock(&lock);
        return CLLM_OK;
    }
    if (req->done) return CLLM_OK;
    int flag = 0;
    int rc = MPI_Test(&req->mpi, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return fail(rc, __func__, "MPI_Test");
    if (flag) {
        req->done = true;
        req->finished = cllm_time_sec();
    }
    *done = req->done;
    return CLLM_OK;
}

cllm_status cllm_dist_wait(cllm_dist_request *req, double *finished) {
    if (!req) {
        if (finished) *finished = cllm_time_sec();
        return CLLM_OK;
    }
    int rc = MPI_SUCCESS;
    if (running) {
        pthread_mutex_lock(&lock);
        while (!req->done) pthread_cond_wait(&finished_cv, &lock);
        rc = req->rc;
        pthread_mutex_unlock(&lock);
    } else if (!req->done) {
        rc = MPI_Wait(&req->mpi, MPI_STATUS_IGNORE);
        req->finished = cllm_time_sec();
    }
    if (finished) *finished = req->finished;
    free(req->counts);
    free(req);
    return rc == MPI_SUCCESS ? CLLM_OK : fail(rc, __func__, "nonblocking collective");
}
