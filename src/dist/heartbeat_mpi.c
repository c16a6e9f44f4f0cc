/*
 * The heartbeat on MPI: a rank that stops answering (SIGSTOP, a frozen
 * host, a network partition) ends the job within the heartbeat timeout
 * (CLLM_HEARTBEAT_TIMEOUT or the config's heartbeat_timeout, default 30 s),
 * however long a training step takes. The collective watchdog
 * (watchdog_mpi.c) can only tell that a rank is late at a collective, so its
 * timeout must exceed the longest legitimate step, evaluation or checkpoint
 * write; the heartbeat asks a different question, "is the process running",
 * which a slow step does not delay.
 *
 * Mechanism: one thread per rank, started by cllm_dist_init, sends an 8-byte
 * ping every `period` = min(1 s, timeout / 8) and receives the pings of the
 * others. The pings form a star, as the watchdog's arrivals do: rank 0 pings
 * every rank and watches every rank; every other rank pings and watches rank
 * 0 (2(P-1) messages per period in the job, whatever P). A watched rank from
 * which nothing has arrived for `timeout` seconds is declared hung; the
 * watching thread prints
 *   cllm dist: rank 0 (host node-a, pid 4242): no heartbeat from rank 1
 *   (host node-b, pid 977) for 3.4 s (...); ending the job
 * and calls MPI_Abort, which ends every rank, the stopped one included
 * (mpirun kills it with SIGKILL, which a stopped process cannot ignore).
 * Behind a network partition the abort cannot reach the launcher: a rank
 * whose MPI_Abort has not ended it within DIST_ABORT_GRACE_S exits by
 * itself (dist_abort_job), and `cllm launch` stops an mpirun that waits for
 * a daemon it cannot reach (tools/cllm/launch_supervise.c).
 * Because a stopped or frozen process stops all its threads, its pings stop;
 * because the pings come from this thread, which neither computes nor waits
 * on the trainer, a rank that is busy or asleep inside a step keeps sending
 * them. Detection takes between `timeout` and `timeout + period` seconds.
 *
 * Why MPI and not a TCP/UDP side channel: cllm_dist_init already asks for
 * MPI_THREAD_MULTIPLE, which Debian's OpenMPI 4.1 provides, so this thread
 * may call MPI while the training thread sits in a blocking collective. A
 * duplicate of the world communicator keeps the pings apart from the
 * trainer's messages and the watchdog's, and they travel wherever MPI does
 * (shared memory on one host, TCP between hosts, over the interfaces chosen
 * with btl_tcp_if_include): no second port, address exchange or firewall
 * rule. Sends never block: a ping to a rank whose previous ping is still in
 * flight is skipped (MPI_Test), so a stopped receiver cannot stall the
 * sender. Where MPI provides less than MPI_THREAD_MULTIPLE, no thread is
 * started and rank 0 says so: the collective timeout still ends the job.
 *
 * Edge cases: a rank that finishes (cllm_dist_finalize) first sends a
 * goodbye to those watching it, so that the others, still saving, do not
 * take it for hung; after it, that rank watches nobody. If the watching
 * thread itself did not run for timeout / 2 (this process was stopped and
 * continued, or starved of CPU), it restarts every window instead of
 * accusing ranks that it could not hear. The thread never touches the
 * trainer's state: it reads only the step (an atomic) for its message.
 */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cllm/dist.h"
#include "dist/watchdog.h"

#define TAG_PING 201 /* "still running" */
#define TAG_BYE 202  /* "finished: stop watching me" */
#define HOST_LEN 64  /* host names are cut to 63 bytes in messages */

static const int64_t ping_word = 1, bye_word = 2; /* send buffers: static, so never freed under a send */

static MPI_Comm hcomm = MPI_COMM_NULL;
static int me, world = 1;
static double limit_s, period_s;
static char *hosts;           /* [world * HOST_LEN] each rank's host name */
static int64_t *pids;         /* [world] each rank's process id */
static double *last_seen;     /* [world] cllm_time_sec of the last message from each rank */
static bool *gone;            /* [world] said goodbye */
static MPI_Request *sends;    /* [world] the ping in flight to each rank, or MPI_REQUEST_NULL */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static bool cv_ready, stopping, thread_on;
static pthread_t thread;

/* Rank 0 talks with every rank, the others only with rank 0. */
static bool is_peer(int r) { return r != me && (me == 0 || r == 0); }

/* Receives every ping and goodbye already there. */
static void drain(double now) {
    for (;;) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, hcomm, &flag, &s) != MPI_SUCCESS || !flag) return;
        int64_t v = 0;
        if (MPI_Recv(&v, 1, MPI_INT64_T, s.MPI_SOURCE, s.MPI_TAG, hcomm, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        if (s.MPI_SOURCE < 0 || s.MPI_SOURCE >= world) continue;
        last_seen[s.MPI_SOURCE] = now;
        if (s.MPI_TAG == TAG_BYE) gone[s.MPI_SOURCE] = true;
    }
}

/* Sends one ping to every peer whose previous one has left. */
static void ping(void) {
    for (int r = 0; r < world; r++) {
        if (!is_peer(r) || gone[r]) continue;
        if (sends[r] != MPI_REQUEST_NULL) {
            int done = 0;
            if (MPI_Test(&sends[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) continue;
        }
        if (MPI_Isend(&ping_word, 1, MPI_INT64_T, r, TAG_PING, hcomm, &sends[r]) != MPI_SUCCESS)
            sends[r] = MPI_REQUEST_NULL;
    }
}

static const char *host_of(int r) { return hosts + (size_t)r * HOST_LEN; }

/* Names the silent rank(s) and ends the job; does not return. */
static void report(double now) {
    char who[768];
    size_t o = 0;
    int k = 0;
    double worst = 0;
    who[0] = '\0';
    for (int r = 0; r < world; r++) {
        if (!is_peer(r) || gone[r] || now - last_seen[r] <= limit_s) continue;
        if (now - last_seen[r] > worst) worst = now - last_seen[r];
        if (o < sizeof who - 128)
            o += (size_t)snprintf(who + o, sizeof who - o, "%srank %d (host %s, pid %lld)", k ? ", " : "", r,
                                  host_of(r), (long long)pids[r]);
        k++;
    }
    long step = dist_watch_step();
    char at[48];
    if (step > 0)
        snprintf(at, sizeof at, "at step %ld", step);
    else
        snprintf(at, sizeof at, "before the first step");
    fprintf(stderr,
            "cllm dist: rank %d (host %s, pid %lld): no heartbeat from %s for %.1f s %s (stopped, frozen or cut off "
            "from the network; the limit is %g s: heartbeat_timeout, CLLM_HEARTBEAT_TIMEOUT); ending the job\n",
            me, host_of(me), (long long)pids[me], who, worst, at, limit_s);
    fflush(stderr);
    dist_abort_job(me);
}

static void *heartbeat_thread(void *arg) {
    (void)arg;
    double last_tick = cllm_time_sec();
    pthread_mutex_lock(&mu);
    while (!stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long ns = ts.tv_nsec + (long)(period_s * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        while (!stopping && pthread_cond_timedwait(&cv, &mu, &ts) != ETIMEDOUT) {
        }
        if (stopping) break;
        pthread_mutex_unlock(&mu);
        double now = cllm_time_sec();
        if (now - last_tick > limit_s / 2) /* this process did not run: it cannot tell who was silent */
            for (int r = 0; r < world; r++) last_seen[r] = now;
        last_tick = now;
        drain(now);
        ping();
        for (int r = 0; r < world; r++)
            if (is_peer(r) && !gone[r] && now - last_seen[r] > limit_s) report(now);
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

cllm_status dist_heartbeat_init(int rank, int size) {
    me = rank;
    world = size;
    limit_s = dist_heartbeat_timeout();
    if (size <= 1) return CLLM_OK;
    /* collective, whatever this rank's setting, so that ranks started with
     * different settings still call the same collectives */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &hcomm) != MPI_SUCCESS)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "MPI_Comm_dup failed on rank %d", rank);
    MPI_Comm_set_errhandler(hcomm, MPI_ERRORS_RETURN);
    hosts = calloc((size_t)size, HOST_LEN);
    pids = calloc((size_t)size, sizeof *pids);
    last_seen = calloc((size_t)size, sizeof *last_seen);
    gone = calloc((size_t)size, sizeof *gone);
    sends = malloc((size_t)size * sizeof *sends);
    if (!hosts || !pids || !last_seen || !gone || !sends) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int r = 0; r < size; r++) sends[r] = MPI_REQUEST_NULL;
    char name[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0) snprintf(name, sizeof name, "?");
    char mine[HOST_LEN] = ""; /* the name cut to HOST_LEN - 1 bytes (on purpose) */
    memcpy(mine, name, strnlen(name, HOST_LEN - 1));
    int64_t pid = (int64_t)getpid();
    if (MPI_Allgather(mine, HOST_LEN, MPI_CHAR, hosts, HOST_LEN, MPI_CHAR, hcomm) != MPI_SUCCESS ||
        MPI_Allgather(&pid, 1, MPI_INT64_T, pids, 1, MPI_INT64_T, hcomm) != MPI_SUCCESS)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "rank %d: cannot gather the ranks' host names", rank);
    for (int r = 0; r < size; r++) hosts[(size_t)r * HOST_LEN + HOST_LEN - 1] = '\0';
    if (limit_s <= 0) return CLLM_OK;
    int provided = 0;
    if (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_MULTIPLE) {
        if (rank == 0)
            cllm_log(CLLM_LOG_WARN,
                     "no heartbeat: this MPI provides thread level %d, not MPI_THREAD_MULTIPLE; a stopped rank is "
                     "found by the collective timeout only (CLLM_DIST_TIMEOUT)",
                     provided);
        return CLLM_OK;
    }
    period_s = limit_s / 8 < 1.0 ? limit_s / 8 : 1.0;
    double now = cllm_time_sec();
    for (int r = 0; r < size; r++) last_seen[r] = now;
    if (!cv_ready) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        int rc = pthread_cond_init(&cv, &ca);
        pthread_condattr_destroy(&ca);
        if (rc != 0) return CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot set up the heartbeat thread: %s", strerror(rc));
        cv_ready = true;
    }
    stopping = false;
    int rc = pthread_create(&thread, NULL, heartbeat_thread, NULL);
    if (rc != 0) return CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot start the heartbeat thread: %s", strerror(rc));
    thread_on = true;
    return CLLM_OK;
}

void dist_heartbeat_finalize(void) {
    if (thread_on) {
        pthread_mutex_lock(&mu);
        stopping = true;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        pthread_join(thread, NULL);
        thread_on = false;
        /* goodbye to the ranks that watch this one; it completes in the
         * background (the buffer is static) */
        for (int r = 0; r < world; r++) {
            if (!is_peer(r) || gone[r]) continue;
            MPI_Request q;
            if (MPI_Isend(&bye_word, 1, MPI_INT64_T, r, TAG_BYE, hcomm, &q) == MPI_SUCCESS) MPI_Request_free(&q);
        }
    }
    if (hcomm != MPI_COMM_NULL) {
        for (int r = 0; sends && r < world; r++)
            if (sends[r] != MPI_REQUEST_NULL) MPI_Request_free(&sends[r]);
        if (last_seen && gone) drain(cllm_time_sec());
        MPI_Comm_free(&hcomm);
    }
    free(hosts);
    free(pids);
    free(last_seen);
    free(gone);
    free(sends);
    hosts = NULL;
    pids = NULL;
    last_seen = NULL;
    gone = NULL;
    sends = NULL;
    world = 1;
}
