/*
 * The collective watchdog on MPI: a rank that dies or hangs must not leave
 * the others waiting forever in a collective, and the message must say who
 * is missing and where.
 *
 * Arrival protocol (on a duplicate of the world communicator, so its
 * messages never meet the trainer's collectives): before collective #k,
 * every rank > 0 sends k to rank 0, and rank 0 sends k to every rank. Rank 0
 * then waits until every rank has reported k; the others wait until rank 0
 * has. Only then does the (blocking) collective start. Waiting polls with
 * MPI_Iprobe and a deadline of `timeout` seconds (CLLM_DIST_TIMEOUT, default
 * 600); past it the waiting rank prints
 *   cllm dist: rank 0: allreduce of 1234 floats (collective #57, step 12):
 *   rank(s) 1 did not arrive within 10 s ...
 * and calls MPI_Abort, which ends every rank. Rank 0 knows all arrivals, so
 * it names every missing rank; another rank can only name rank 0. A rank
 * that arrived waits for rank 0's verdict: its own deadline starts later
 * than rank 0's, so rank 0 speaks first.
 *
 * A collective that every rank entered but that does not finish (a rank
 * stopped inside it, a network that stalls) is caught by a thread that
 * checks every half second: past 2 x timeout it prints the collective and
 * ends the process with _exit(1), and mpirun then ends the others. The
 * thread never calls MPI, so that it works even when MPI itself is stuck.
 * A rank that dies outright is noticed by mpirun itself, which aborts the
 * job.
 *
 * Cost: one 8-byte message per rank per collective (2(P-1) at rank 0) and a
 * round trip of latency before each collective; the trainer makes a handful
 * of collectives per step. Test hooks (tests/dist_fail_test.py):
 * CLLM_DIST_TEST_HANG=RANK:STEP makes that rank stop forever before its
 * first collective of that step, CLLM_DIST_TEST_DIE=RANK:STEP kills it
 * there (SIGKILL).
 */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cllm/dist.h"
#include "dist/watchdog.h"

#define TAG_ARRIVE 101 /* rank > 0 -> rank 0: "I reached collective k" */
#define TAG_ROOT 102   /* rank 0 -> rank > 0: "rank 0 reached collective k" */

static MPI_Comm wcomm = MPI_COMM_NULL;
static int me, world = 1;
static double timeout_s = 600;
static int64_t seq;              /* collectives entered so far */
static int64_t *arrived;         /* rank 0: last collective each rank reported */
static int64_t root_seen;        /* ranks > 0: last collective rank 0 reported */
static int64_t send_buf;         /* the value in flight (sends complete before reuse) */
static MPI_Request *sends;       /* [world] outstanding sends */
static int n_sends;
static int hang_rank = -1, die_rank = -1;
static long hang_step, die_step;

/* shared with the thread */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static bool thread_on, stopping, in_op;
static double op_start;
static char op_desc[160];

static int abort_rank;

static void *abort_fallback(void *arg) {
    (void)arg;
    struct timespec ts = {DIST_ABORT_GRACE_S, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    char msg[200];
    int n = snprintf(msg, sizeof msg,
                     "cllm dist: rank %d: MPI_Abort did not end this rank within %d s (the launcher is cut off?); "
                     "exiting\n",
                     abort_rank, DIST_ABORT_GRACE_S);
    if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0) {
    }
    _exit(1);
}

_Noreturn void dist_abort_job(int rank) {
    abort_rank = rank;
    pthread_t t;
    if (pthread_create(&t, NULL, abort_fallback, NULL) == 0)
        pthread_detach(t);
    else
        alarm(DIST_ABORT_GRACE_S); /* no thread: SIGALRM's default action ends the process */
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1); /* not reached */
}

static void parse_hook(const char *name, int *rank, long *step) {
    const char *v = getenv(name);
    int r;
    long s;
    if (v && sscanf(v, "%d:%ld", &r, &s) == 2) {
        *rank = r;
        *step = s;
    }
}

static void *watch_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&cv, &mu, &ts);
        if (!stopping && in_op && cllm_time_sec() - op_start > 2 * timeout_s) {
            fprintf(stderr,
                    "cllm dist: rank %d: %s did not finish within %g s after every rank arrived (a rank stopped inside "
                    "it or the network stalled); ending this rank so that mpirun ends the job\n",
                    me, op_desc, 2 * timeout_s);
            fflush(stderr);
            _exit(1);
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

cllm_status dist_watch_init(int rank, int size) {
    cllm_status st = dist_watch_check_env();
    if (st) return st;
    me = rank;
    world = size;
    timeout_s = dist_watch_timeout();
    seq = 0;
    root_seen = 0;
    parse_hook("CLLM_DIST_TEST_HANG", &hang_rank, &hang_step);
    parse_hook("CLLM_DIST_TEST_DIE", &die_rank, &die_step);
    if (size <= 1) return CLLM_OK;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &wcomm) != MPI_SUCCESS)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "MPI_Comm_dup failed on rank %d", rank);
    MPI_Comm_set_errhandler(wcomm, MPI_ERRORS_RETURN);
    arrived = calloc((size_t)size, sizeof *arrived);
    sends = calloc((size_t)size, sizeof *sends);
    if (!arrived || !sends) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    stopping = false;
    if (pthread_create(&thread, NULL, watch_thread, NULL) != 0)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot start the watchdog thread: %s", strerror(errno));
    thread_on = true;
    return CLLM_OK;
}

/* Completes the previous round's sends (long done in practice: their
 * receivers passed that collective). */
static void finish_sends(void) {
    if (n_sends) MPI_Waitall(n_sends, sends, MPI_STATUSES_IGNORE);
    n_sends = 0;
}

void dist_watch_finalize(void) {
    if (thread_on) {
        pthread_mutex_lock(&mu);
        stopping = true;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        pthread_join(thread, NULL);
        thread_on = false;
    }
    if (wcomm != MPI_COMM_NULL) {
        finish_sends();
        MPI_Comm_free(&wcomm);
    }
    free(arrived);
    free(sends);
    arrived = NULL;
    sends = NULL;
}

/* Receives every arrival message already there. */
static void drain(void) {
    for (;;) {
        int flag = 0;
        MPI_Status s;
        int tag = me == 0 ? TAG_ARRIVE : TAG_ROOT;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tag, wcomm, &flag, &s) != MPI_SUCCESS || !flag) return;
        int64_t v = 0;
        if (MPI_Recv(&v, 1, MPI_INT64_T, s.MPI_SOURCE, tag, wcomm, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        if (me == 0) {
            if (v > arrived[s.MPI_SOURCE]) arrived[s.MPI_SOURCE] = v;
        } else if (v > root_seen) {
            root_seen = v;
        }
    }
}

static bool all_here(void) {
    if (me != 0) return root_seen >= seq;
    for (int r = 1; r < world; r++)
        if (arrived[r] < seq) return false;
    return true;
}

static void nap(long iter) {
    if (iter < 2000) return; /* spin first: collectives usually line up */
    struct timespec ts = {0, iter < 20000 ? 20000L : 200000L};
    nanosleep(&ts, NULL);
}

cllm_status dist_watch_enter(const char *what, size_t n, const char *unit) {
    if (world <= 1 || wcomm == MPI_COMM_NULL) return CLLM_OK;
    seq++;
    long step = dist_watch_step();
    char desc[sizeof op_desc];
    if (step > 0)
        snprintf(desc, sizeof desc, "%s of %zu %s (collective #%lld, step %ld)", what, n, unit, (long long)seq, step);
    else
        snprintf(desc, sizeof desc, "%s of %zu %s (collective #%lld, before the first step)", what, n, unit, (long long)seq);
    if (me == die_rank && step == die_step) {
        fprintf(stderr, "cllm dist: rank %d: CLLM_DIST_TEST_DIE: killing this rank before %s\n", me, desc);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (me == hang_rank && step == hang_step) {
        fprintf(stderr, "cllm dist: rank %d: CLLM_DIST_TEST_HANG: stopping forever before %s\n", me, desc);
        fflush(stderr);
        hang_rank = -1;
        for (;;) pause();
    }
    finish_sends();
    send_buf = seq;
    if (me == 0) {
        for (int r = 1; r < world; r++)
            if (MPI_Isend(&send_buf, 1, MPI_INT64_T, r, TAG_ROOT, wcomm, &sends[n_sends++]) != MPI_SUCCESS)
                return CLLM_FAIL(CLLM_ERR_INTERNAL, "rank 0: cannot send the arrival of %s", desc);
    } else if (MPI_Isend(&send_buf, 1, MPI_INT64_T, 0, TAG_ARRIVE, wcomm, &sends[n_sends++]) != MPI_SUCCESS) {
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "rank %d: cannot send the arrival of %s", me, desc);
    }
    double t0 = cllm_time_sec();
    for (long it = 0;; it++) {
        drain();
        if (all_here()) break;
        if ((it & 63) == 0 && cllm_time_sec() - t0 > timeout_s) {
            char missing[512];
            size_t o = 0;
            int k = 0;
            missing[0] = '\0';
            if (me == 0) {
                for (int r = 1; r < world && o < sizeof missing - 16; r++)
                    if (arrived[r] < seq) {
                        o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d", k ? ", " : "", r);
                        k++;
                    }
            } else {
                snprintf(missing, sizeof missing, "0");
                k = 1;
            }
            fprintf(stderr,
                    "cllm dist: rank %d: %s: rank%s %s did not arrive within %g s (hung, dead or far slower; the "
                    "timeout is CLLM_DIST_TIMEOUT); ending the job\n",
                    me, desc, k == 1 ? "" : "s", missing, timeout_s);
            fflush(stderr);
            dist_abort_job(me);
        }
        nap(it);
    }
    pthread_mutex_lock(&mu);
    memcpy(op_desc, desc, sizeof op_desc);
    op_start = cllm_time_sec();
    in_op = true;
    pthread_mutex_unlock(&mu);
    return CLLM_OK;
}

void dist_watch_leave(void) {
    if (world <= 1 || wcomm == MPI_COMM_NULL) return;
    pthread_mutex_lock(&mu);
    in_op = false;
    pthread_mutex_unlock(&mu);
}
