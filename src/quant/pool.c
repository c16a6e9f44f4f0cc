/*
 * The decode matmuls' threads (quant_impl.h): a pool of helper threads
 * that take chunks of a job from a shared counter, the calling thread
 * taking chunks too.
 *
 * Why not an OpenMP team: a decode step is a few hundred matmuls of tens to
 * hundreds of microseconds each, and an OpenMP parallel region ends at a
 * barrier that every thread of the team must reach. When a team thread has
 * lost its core to another process (a shared or busy machine), the barrier
 * waits out that thread's time slice, milliseconds, at every matmul; with
 * spinning waits two threads on two busy cores decoded ten times slower than
 * one. Here the caller only waits for chunks a helper has actually claimed:
 * a helper that is not running claims nothing and the caller does its share,
 * so two threads are never much slower than one, and on idle cores the
 * helpers, spinning briefly between the matmuls of a step, start within a
 * microsecond.
 *
 * Protocol: `ticket` packs the job's generation (32 bits), its chunk count
 * (16 bits) and the next unclaimed chunk (16 bits); a chunk is claimed by a
 * compare-and-swap that also checks the generation, so a helper that wakes
 * late can never claim a chunk of a newer job with an older job's function.
 * A claimed chunk keeps its job alive (the caller waits for `done` to reach
 * the count), so the job's function and context are read only after a
 * successful claim. Helpers that find no new job for SPIN pauses sleep on a
 * condition variable; the caller signals it only when someone sleeps.
 *
 * One job at a time: a second thread calling while the pool is busy (a
 * server's request threads), a call from inside an OpenMP region, or
 * OMP_NUM_THREADS=1 runs the chunks on the calling thread. The helpers are
 * started on first use (omp_get_max_threads() - 1 of them, more when that
 * grows) and live as long as the process.
 */
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "quant_impl.h"

enum { MAX_HELPERS = 63, SPIN = 20000 };

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef struct {
    quant_task_fn fn;
    void *ctx;
    atomic_int done;
} pool_job;

static struct {
    pthread_mutex_t run;           /* held by the caller of the current job */
    pthread_mutex_t lk;            /* with cv: sleeping helpers */
    pthread_cond_t cv;
    _Atomic uint64_t ticket;       /* gen << 32 | n << 16 | next */
    atomic_uint gen;               /* the current job's generation */
    atomic_int sleepers;
    atomic_int want;               /* helpers with index < want take part */
    pool_job jobs[2];              /* by generation parity */
    uint32_t cur;                  /* last generation published (under run) */
    int n_helpers;                 /* started (under run) */
} P = {.run = PTHREAD_MUTEX_INITIALIZER, .lk = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Claims the next chunk of job `gen`; false when it has none left or a
 * newer job has replaced it. */
static bool claim(uint32_t gen, int *idx) {
    uint64_t t = atomic_load_explicit(&P.ticket, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(t >> 32) != gen) return false;
        unsigned n = (unsigned)(t >> 16) & 0xffffu, next = (unsigned)t & 0xffffu;
        if (next >= n) return false;
        if (atomic_compare_exchange_weak_explicit(&P.ticket, &t, t + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *idx = (int)next;
            return true;
        }
    }
}

static void work(uint32_t gen) {
    pool_job *j = &P.jobs[gen & 1];
    int idx;
    while (claim(gen, &idx)) {
        j->fn(j->ctx, idx);
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
    }
}

static void *helper(void *arg) {
    const int me = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&P.gen);
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN) {
                relax();
                continue;
            }
            pthread_mutex_lock(&P.lk);
            atomic_fetch_add(&P.sleepers, 1);
            while (atomic_load(&P.gen) == seen) pthread_cond_wait(&P.cv, &P.lk);
            atomic_fetch_sub(&P.sleepers, 1);
            pthread_mutex_unlock(&P.lk);
            spins = 0;
        }
        seen = g;
        if (me < atomic_load_explicit(&P.want, memory_order_relaxed)) work(g);
    }
    return NULL;
}

/* Starts helpers up to `want` (fewer when the system refuses threads). */
static void grow(int want) {
    while (P.n_helpers < want) {
        pthread_attr_t at;
        pthread_t th;
        if (pthread_attr_init(&at)) return;
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, helper, (void *)(intptr_t)P.n_helpers);
        pthread_attr_destroy(&at);
        if (rc) return;
        P.n_helpers++;
    }
}

int quant_pool_threads(void) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    return nt < 1 ? 1 : nt > MAX_HELPERS + 1 ? MAX_HELPERS + 1 : nt;
}

void quant_pool_run(quant_task_fn fn, void *ctx, int n) {
    const int nt = quant_pool_threads();
    if (n <= 1 || nt <= 1 || n > 0xffff || pthread_mutex_trylock(&P.run)) {
        for (int c = 0; c < n; c++) fn(ctx, c);
        return;
    }
    grow(nt - 1);
    const uint32_t g = ++P.cur;
    pool_job *j = &P.jobs[g & 1];
    j->fn = fn;
    j->ctx = ctx;
    atomic_store_explicit(&j->done, 0, memory_order_relaxed);
    atomic_store_explicit(&P.want, nt - 1, memory_order_relaxed);
    atomic_store_explicit(&P.ticket, (uint64_t)g << 32 | (uint64_t)n << 16, memory_order_release);
    atomic_store(&P.gen, g);
    if (atomic_load(&P.sleepers) > 0) {
        pthread_mutex_lock(&P.lk);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.lk);
    }
    work(g);
    /* only chunks a helper claimed and is still running are waited for */
    for (int spins = 0; atomic_load_explicit(&j->done, memory_order_acquire) < n;)
        if (++spins < SPIN) relax();
        else sched_yield();
    pthread_mutex_unlock(&P.run);
}

void cllm_quant_parallel(cllm_quant_task_fn fn, void *ctx, int n) { quant_pool_run(fn, ctx, n); }

int cllm_quant_threads(void) { return quant_pool_threads(); }
