/*
 * fp32 GEMM on oneDNN: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
 *
 * Transposes are expressed as memory-descriptor strides, so no operand is
 * ever copied: A stored [M,K] has strides {K,1}, A stored [K,M] read as
 * [M,K] has strides {1,M}; likewise for B. alpha is a common output scale
 * and beta=1 is a sum post-op (dst = alpha*A@B + 1*dst), both fixed when the
 * primitive is created, so they are part of the cache key.
 *
 * Creating a oneDNN primitive costs far more than running a small GEMM, so
 * each (M,N,K,trans_a,trans_b,alpha,beta) gets one primitive, built on first
 * use and kept in a fixed table together with its three memory objects.
 * When the table is full the least recently used entry that no call is
 * running is replaced. One mutex guards the table and the lazily created
 * engine; the execution runs outside it, so GEMMs called from different
 * threads (KV caches over one model, each on its own thread) run at the
 * same time. An execution takes a stream of its own (from a pool) and
 * memory objects over the caller's buffers (the entry's own, or fresh ones
 * while another thread runs the same entry), and the primitives are built
 * in oneDNN's user scratchpad mode with the scratchpad of the execution's
 * context (exec_ctx, kept with its stream between calls; none for the fp32
 * kernels of AVX2 CPUs): in the default library mode oneDNN shares one
 * scratchpad between primitives, and a primitive may not run from a thread
 * other than the one that created it.
 *
 * Layouts with B not transposed (NN, TN) go to oneDNN's BLAS-style
 * dnnl_sgemm where its no-copy kernels run them or where the CPU lacks
 * AVX-512, and to the primitive otherwise (nn_on_primitive: sgemm's
 * copy-based path allocates inside every call). The choice is a fixed rule
 * of the layout, the shape and the CPU, never timed at run time, so a run's
 * results (and a resumed run's) are reproducible.
 *
 * cllm_matmul_bf16 shares the cache (the data type is part of the key).
 * Where oneDNN has no bf16 matmul for the CPU (oneDNN 2.x implements it
 * for AVX-512 and up only; an AVX2 CPU answers "unimplemented"), or where
 * CLLM_MAX_ISA caps cllm below avx512, the bf16 GEMM widens its operands to
 * fp32 and runs the fp32 GEMM: a bf16 value is exact in fp32, so this is
 * the same product with fp32 accumulation, only the summation order may
 * differ from oneDNN's. The widened operands live in one scratch buffer of
 * this module, at most BF16_WIDEN_BYTES: larger products are cut along K
 * into slices that each fit, accumulated into C (beta = 1 after the
 * first). The buffer grows to the largest slice seen, is used by one call
 * at a time and is released by cllm_matmul_cleanup; cllm_matmul_bf16_ws
 * takes the caller's workspace instead, for callers on several threads.
 *
 * Left out: beta other than 0 or 1 (unused by the models), batched GEMM,
 * data types other than fp32 and bf16, and cllm_linear_* bias fusion into the primitive (the
 * bias add is a cheap separate pass and keeps the cache key small).
 */
#include "cllm/kernels.h"
#include "cllm/quant.h"

#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>

#include "cllm/cpu.h"
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#define CACHE_SLOTS 64

typedef struct {
    int M, N, K;
    bool trans_a, trans_b;
    uint32_t alpha_bits; /* alpha compared bitwise: exact key */
    bool beta_one;
    bool bf16; /* A and B bf16 (C is always fp32) */
    unsigned long last_use; /* 0 = empty slot */
    int busy;               /* executions running it (never evicted then) */
    bool own_busy;          /* one of them uses `own` */
    dnnl_primitive_t prim;
    dnnl_memory_desc_t md_a, md_b, md_c, md_s; /* md_s: its scratchpad */
    size_t scratch_bytes;
    dnnl_memory_t own[3];   /* A, B, C */
} gemm_entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_idle = PTHREAD_COND_INITIALIZER; /* signalled when an entry stops running */
static dnnl_engine_t g_engine;
static gemm_entry g_cache[CACHE_SLOTS];
static unsigned long g_clock;
static int g_running; /* executions outside the lock */
/* An execution context: a stream and the scratchpad its executions reuse,
 * grown to the largest a call has needed. Keeping it between calls matters:
 * cllm sets glibc's mmap threshold low (tools/cllm/main.c), so a scratchpad
 * allocated per call was mapped, faulted in and zeroed by the kernel every
 * time (bf16 weight-gradient GEMMs at a quarter to half their rate). */
typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
} exec_ctx;
static exec_ctx g_streams[CACHE_SLOTS]; /* idle contexts */
static int g_n_streams;

static cllm_status dnnl_check(dnnl_status_t s, const char *what) {
    if (s == dnnl_success) return CLLM_OK;
    return cllm_fail(CLLM_ERR_INTERNAL, "cllm_matmul", "oneDNN %s failed: %s", what,
                     dnnl_status2str(s));
}

static void mems_free(dnnl_memory_t mem[3]) {
    for (int i = 0; i < 3; i++) {
        if (mem[i]) dnnl_memory_destroy(mem[i]);
        mem[i] = NULL;
    }
}

static void entry_free(gemm_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    mems_free(e->own);
    memset(e, 0, sizeof *e);
}

static cllm_status mems_make(const gemm_entry *e, dnnl_memory_t mem[3]);

/* 2-D memory descriptor of logical shape [rows, cols]; stored transposed
 * (as [cols, rows] row-major) when `transposed`. */
static dnnl_status_t md_2d(dnnl_memory_desc_t *md, int rows, int cols, bool transposed, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides;
    strides[0] = transposed ? 1 : cols;
    strides[1] = transposed ? rows : 1;
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

/* Builds the primitive and memory objects of `e` (key fields already set).
 * On failure e is left empty. Called with g_lock held. */
static cllm_status entry_build(gemm_entry *e, float alpha) {
    dnnl_memory_desc_t md_a, md_b, md_c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    cllm_status st;

    dnnl_data_type_t dt = e->bf16 ? dnnl_bf16 : dnnl_f32;
    st = dnnl_check(md_2d(&md_a, e->M, e->K, e->trans_a, dt), "memory_desc (A)");
    if (!st) st = dnnl_check(md_2d(&md_b, e->K, e->N, e->trans_b, dt), "memory_desc (B)");
    if (!st) st = dnnl_check(md_2d(&md_c, e->M, e->N, false, dnnl_f32), "memory_desc (C)");
    if (!st) st = dnnl_check(dnnl_matmul_desc_init(&desc, &md_a, &md_b, NULL, &md_c), "matmul_desc");
    if (!st) st = dnnl_check(dnnl_primitive_attr_create(&attr), "attr_create");
    if (!st)
        st = dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (st) goto undo_attr;
    if (alpha != 1.0f) {
        st = dnnl_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scales");
        if (st) goto undo_attr;
    }
    if (e->beta_one) {
        st = dnnl_check(dnnl_post_ops_create(&post), "post_ops_create");
        if (!st) st = dnnl_check(dnnl_post_ops_append_sum(post, 1.0f), "sum post-op");
        if (!st) st = dnnl_check(dnnl_primitive_attr_set_post_ops(attr, post), "set post-ops");
        if (st) goto undo_post;
    }
    dnnl_status_t ds = dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL);
    /* "no bf16 kernel for this CPU" is not an error: the caller widens */
    if (ds == dnnl_unimplemented && e->bf16)
        st = CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "oneDNN has no bf16 matmul for this CPU");
    else
        st = dnnl_check(ds, "primitive_desc_create");
    if (!st) st = dnnl_check(dnnl_primitive_create(&e->prim, pd), "primitive_create");
    if (!st) {
        const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->md_a = md_a;
        e->md_b = md_b;
        e->md_c = md_c;
        e->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (e->scratch_bytes) e->md_s = *sp;
        st = mems_make(e, e->own);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
undo_post:
    if (post) dnnl_post_ops_destroy(post);
undo_attr:
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st) {
        cllm_fail_context(st, "%s GEMM M=%d N=%d K=%d", e->bf16 ? "bf16" : "fp32", e->M, e->N, e->K);
        entry_free(e);
    }
    return st;
}

/* Returns the cached entry for the key, building it (and evicting the least
 * recently used slot that no call runs if the table is full, after
 * waiting for one if every slot runs) when missing. g_lock held. */
static cllm_status cache_get(gemm_entry **out, int M, int N, int K, bool trans_a, bool trans_b,
                             float alpha, bool beta_one, bool bf16) {
    uint32_t alpha_bits;
    memcpy(&alpha_bits, &alpha, sizeof alpha_bits);
    gemm_entry *victim;
    for (;;) {
        victim = &g_cache[0];
        for (int i = 0; i < CACHE_SLOTS; i++) {
            gemm_entry *e = &g_cache[i];
            if (e->last_use && e->M == M && e->N == N && e->K == K && e->trans_a == trans_a &&
                e->trans_b == trans_b && e->alpha_bits == alpha_bits && e->beta_one == beta_one &&
                e->bf16 == bf16) {
                e->last_use = ++g_clock;
                *out = e;
                return CLLM_OK;
            }
            if (!e->busy && (victim->busy || e->last_use < victim->last_use)) victim = e;
        }
        if (!victim->busy) break;
        /* every slot is running (as many threads as slots): wait for one */
        pthread_cond_wait(&g_idle, &g_lock);
    }
    entry_free(victim);
    victim->M = M;
    victim->N = N;
    victim->K = K;
    victim->trans_a = trans_a;
    victim->trans_b = trans_b;
    victim->alpha_bits = alpha_bits;
    victim->beta_one = beta_one;
    victim->bf16 = bf16;
    cllm_status st = entry_build(victim, alpha);
    if (st) return st;
    victim->last_use = ++g_clock;
    *out = victim;
    return CLLM_OK;
}

/* The engine on first use; g_lock held. */
static cllm_status engine_init(void) {
    if (g_engine) return CLLM_OK;
    return dnnl_check(dnnl_engine_create(&g_engine, dnnl_cpu, 0), "engine_create");
}

/* Runs e on the caller's buffers through memory objects mem (A, B, C),
 * with the context's scratchpad when the primitive needs one (grown to
 * the size oneDNN's library mode would have kept in its shared
 * scratchpad, and kept for the context's next call). oneDNN
 * takes non-const handles; it only reads A and B. */
static cllm_status exec_with(const gemm_entry *e, exec_ctx *x, dnnl_memory_t mem[3], float *C, const void *A,
                             const void *B) {
    dnnl_memory_t sp = NULL;
    cllm_status st = dnnl_check(dnnl_memory_set_data_handle(mem[0], (void *)(uintptr_t)A), "set handle (A)");
    if (!st) st = dnnl_check(dnnl_memory_set_data_handle(mem[1], (void *)(uintptr_t)B), "set handle (B)");
    if (!st) st = dnnl_check(dnnl_memory_set_data_handle(mem[2], C), "set handle (C)");
    if (!st && e->scratch_bytes > x->scratch_bytes) {
        cllm_free(x->scratch);
        x->scratch_bytes = 0;
        if (!(x->scratch = cllm_alloc(e->scratch_bytes, "oneDNN matmul scratchpad")))
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "oneDNN matmul scratchpad of %zu bytes", e->scratch_bytes);
        else
            x->scratch_bytes = e->scratch_bytes;
    }
    if (!st && e->scratch_bytes)
        st = dnnl_check(dnnl_memory_create(&sp, &e->md_s, g_engine, x->scratch), "memory (scratchpad)");
    if (!st) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_SCRATCHPAD, sp}};
        st = dnnl_check(dnnl_primitive_execute(e->prim, x->stream, sp ? 4 : 3, args), "execute");
        if (!st) st = dnnl_check(dnnl_stream_wait(x->stream), "stream_wait");
    }
    if (sp) dnnl_memory_destroy(sp);
    return st;
}

static void ctx_free(exec_ctx *x) {
    if (x->stream) dnnl_stream_destroy(x->stream);
    cllm_free(x->scratch);
    *x = (exec_ctx){0};
}

/* Memory objects for the key's descriptors (handles set per call); on
 * failure whatever was made is freed. */
static cllm_status mems_make(const gemm_entry *e, dnnl_memory_t mem[3]) {
    cllm_status st = dnnl_check(dnnl_memory_create(&mem[0], &e->md_a, g_engine, DNNL_MEMORY_NONE), "memory (A)");
    if (!st) st = dnnl_check(dnnl_memory_create(&mem[1], &e->md_b, g_engine, DNNL_MEMORY_NONE), "memory (B)");
    if (!st) st = dnnl_check(dnnl_memory_create(&mem[2], &e->md_c, g_engine, DNNL_MEMORY_NONE), "memory (C)");
    if (st) mems_free(mem);
    return st;
}

/* Runs the cached matmul primitive of the key on the caller's buffers: the
 * lookup under the lock, the execution outside it. An execution borrows
 * the entry's own memory objects and scratchpad, or, while another thread
 * runs the same entry, makes its own; streams come from a pool. */
static cllm_status run_primitive(float *C, const void *A, const void *B, int M, int N, int K, bool trans_a,
                                 bool trans_b, float alpha, float beta, bool bf16) {
    pthread_mutex_lock(&g_lock);
    gemm_entry *e = NULL;
    exec_ctx x = {0};
    bool own = false;
    cllm_status st = engine_init();
    if (!st) st = cache_get(&e, M, N, K, trans_a, trans_b, alpha, beta == 1.0f, bf16);
    if (!st && g_n_streams > 0)
        x = g_streams[--g_n_streams];
    else if (!st)
        st = dnnl_check(dnnl_stream_create(&x.stream, g_engine, dnnl_stream_default_flags), "stream_create");
    if (!st) {
        e->busy++;
        g_running++;
        own = !e->own_busy;
        e->own_busy = true;
    }
    pthread_mutex_unlock(&g_lock);
    if (st) return st;
    if (own) {
        st = exec_with(e, &x, e->own, C, A, B);
    } else {
        dnnl_memory_t mem[3] = {NULL, NULL, NULL};
        st = mems_make(e, mem);
        if (!st) st = exec_with(e, &x, mem, C, A, B);
        mems_free(mem);
    }
    pthread_mutex_lock(&g_lock);
    if (own) e->own_busy = false;
    if (--e->busy == 0) pthread_cond_broadcast(&g_idle); /* a slot to evict, or all idle */
    if (g_n_streams < CACHE_SLOTS)
        g_streams[g_n_streams++] = x;
    else
        ctx_free(&x);
    g_running--;
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* The checks both GEMMs share, and the cases with nothing to multiply
 * (*done: C is already the result). */
static cllm_status gemm_args(float *C, const void *A, const void *B, int M, int N, int K, float beta, bool *done) {
    *done = true;
    if (M < 0 || N < 0 || K < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "negative size M=%d N=%d K=%d", M, N, K);
    if (beta != 0.0f && beta != 1.0f)
        return CLLM_FAIL(CLLM_ERR_ARG, "beta must be 0 or 1, got %g", (double)beta);
    if (M == 0 || N == 0) return CLLM_OK;
    if (!C || (K > 0 && (!A || !B))) return CLLM_FAIL(CLLM_ERR_ARG, "NULL operand");
    if (K == 0) { /* empty sum: C = beta * C */
        if (beta == 0.0f) memset(C, 0, (size_t)M * (size_t)N * sizeof *C);
        return CLLM_OK;
    }
    *done = false;
    return CLLM_OK;
}

/* NN and TN layouts run on the matmul primitive where oneDNN has its
 * AVX-512 brgemm kernel and its sgemm would take the copy-based path (the
 * shape rule oneDNN follows, sgemm_nocopy below): that path packs its
 * operands into buffers it mallocs and frees inside every call, which under
 * the cllm command's fixed mmap threshold (tools/cllm/main.c) are fresh
 * mappings, faulted in and zeroed each time. Measured on 2 cores of an AMD
 * Zen 5: 1024 x 3072 x 768 NN at 178-184 GFLOP/s on sgemm, 295-311 on the
 * primitive; 512 x 2048 x 768 NN 112-115 against 324-353; 768 x 3072 x 1024
 * TN 167-173 against 280-287. The primitive's scratchpad is kept between
 * calls (exec_ctx) and counted by cllm estimate. Shapes on sgemm's no-copy
 * kernels allocate (almost) nothing and stay there (1024 x 768 x 3072 NN:
 * 362-374 on sgemm, 273-282 on the primitive). On AVX2 CPUs the primitive
 * would run the same copy-based gemm, so NN and TN stay on dnnl_sgemm. */
static bool sgemm_nocopy(dnnl_cpu_isa_t isa, int nthr, bool ta, bool tb, long m, long n, long k, long lda, long ldb,
                         long ldc);
static bool isa_has(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t want);

static bool nn_on_primitive(dnnl_cpu_isa_t isa, int M, int N, int K, bool trans_a, int nthr) {
    /* row-major C = op(A) B is column-major C^T = B^T op(A)^T */
    return isa_has(isa, dnnl_cpu_isa_avx512_core) &&
           !sgemm_nocopy(isa, nthr, false, trans_a, N, M, K, N, trans_a ? M : K, N);
}

/* Shapes: C[M,N]; A[M,K] or [K,M] (trans_a); B[K,N] or [N,K] (trans_b).
 * Returns CLLM_ERR_ARG for negative sizes, NULL operands or beta not in
 * {0,1}; CLLM_ERR_INTERNAL if oneDNN fails. Thread-safe (calls serialise). */
cllm_status cllm_matmul(float *C, const float *A, const float *B, int M, int N, int K, bool trans_a,
                        bool trans_b, float alpha, float beta) {
    bool done = false;
    cllm_status st = gemm_args(C, A, B, M, N, K, beta, &done);
    if (st || done) return st;
    if (!trans_b && !nn_on_primitive(dnnl_get_effective_cpu_isa(), M, N, K, trans_a, omp_get_max_threads())) {
        /* row-major sgemm: lda/ldb are the stored row lengths; thread-safe
         * without the lock (it keeps no state between calls) */
        return dnnl_check(dnnl_sgemm(trans_a ? 'T' : 'N', 'N', M, N, K, alpha, A, trans_a ? M : K, B, N, beta, C, N),
                          "sgemm");
    }

    return run_primitive(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, false);
}

/* ------------------------------------------------------- bf16 (native or widened) */

/* Upper bound of the widened-operand scratch of the fallback path. */
#define BF16_WIDEN_BYTES ((size_t)32 << 20)

static pthread_mutex_t g_wlock = PTHREAD_MUTEX_INITIALIZER; /* taken before g_lock, never after */
static float *g_wbuf;
static size_t g_wcap; /* floats */

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static bool g_bf16_native;

/* Whether oneDNN builds a bf16 matmul here: one small primitive, kept in
 * the cache like any other. Capped by CLLM_MAX_ISA below avx512. */
static void probe_bf16(void) {
    g_bf16_native = false;
    if (cllm_cpu()->isa < CLLM_ISA_AVX512) return;
    pthread_mutex_lock(&g_lock);
    gemm_entry *e = NULL;
    cllm_status st = engine_init();
    if (!st) st = cache_get(&e, 32, 32, 32, false, false, 1.0f, false, true);
    pthread_mutex_unlock(&g_lock);
    g_bf16_native = st == CLLM_OK;
    cllm_error_clear();
}

bool cllm_matmul_bf16_native(void) {
    pthread_once(&g_probe_once, probe_bf16);
    return g_bf16_native;
}

const char *cllm_matmul_bf16_backend(void) { return cllm_matmul_bf16_native() ? "onednn" : "fp32-widened"; }

/* The K slice of the widened path: the largest multiple of 16 (or all of
 * K) whose two widened operand slices, (M + N) x kc floats, fit the
 * budget; then evened out so the slices have equal lengths. */
static int widen_slice(int M, int N, int K) {
    size_t row = ((size_t)M + (size_t)N) * sizeof(float);
    size_t fit = BF16_WIDEN_BYTES / row;
    if (fit >= (size_t)K) return K;
    int kc = fit < 16 ? 16 : (int)(fit / 16 * 16);
    int n = (K + kc - 1) / kc;
    kc = (K + n - 1) / n;
    return (kc + 15) / 16 * 16 < K ? (kc + 15) / 16 * 16 : K;
}

size_t cllm_matmul_bf16_scratch_bytes(int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0 || cllm_matmul_bf16_native()) return 0;
    return ((size_t)M + (size_t)N) * (size_t)widen_slice(M, N, K) * sizeof(float);
}

/* dst[rows, kc] = fp32 of src[rows, ld] columns k0..k0+kc-1. */
static void widen_cols(float *dst, const uint16_t *src, int rows, int ld, int k0, int kc) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const uint16_t *s = src + (size_t)r * (size_t)ld + k0;
        float *d = dst + (size_t)r * (size_t)kc;
#pragma omp simd
        for (int k = 0; k < kc; k++) {
            uint32_t u = (uint32_t)s[k] << 16;
            memcpy(&d[k], &u, sizeof u);
        }
    }
}

/* dst[n] = fp32 of src[n] (a contiguous block of rows). */
static void widen_block(float *dst, const uint16_t *src, size_t n) {
    long len = (long)n;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < len; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* C = alpha * op(A) @ op(B) + beta * C with A, B widened slice by slice
 * along K. Each slice keeps the operands' transposition: A stored [M,K]
 * gives a [M,kc] slice (columns), A stored [K,M] a [kc,M] one (rows);
 * likewise B. */
static cllm_status widened_gemm(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool trans_a,
                                bool trans_b, float alpha, float beta, float *ws, size_t ws_bytes) {
    int kc = widen_slice(M, N, K);
    size_t need = ((size_t)M + (size_t)N) * (size_t)kc;
    cllm_status st = CLLM_OK;
    if (ws && need * sizeof(float) > ws_bytes)
        return CLLM_FAIL(CLLM_ERR_ARG, "bf16 GEMM M=%d N=%d K=%d needs %zu bytes of workspace, %zu given", M, N, K,
                         need * sizeof(float), ws_bytes);
    const bool shared = !ws; /* the module's buffer, under g_wlock */
    if (shared) {
        pthread_mutex_lock(&g_wlock);
        if (need > g_wcap) {
            float *p = cllm_alloc(need * sizeof(float), "widened bf16 GEMM operands");
            if (!p) {
                pthread_mutex_unlock(&g_wlock);
                return CLLM_ERR_NOMEM;
            }
            cllm_free(g_wbuf);
            g_wbuf = p;
            g_wcap = need;
        }
        ws = g_wbuf;
    }
    float *a = ws, *b = ws + (size_t)M * (size_t)kc;
    for (int k0 = 0; k0 < K && !st; k0 += kc) {
        int n = K - k0 < kc ? K - k0 : kc;
        if (trans_a)
            widen_block(a, A + (size_t)k0 * (size_t)M, (size_t)n * (size_t)M);
        else
            widen_cols(a, A, M, K, k0, n);
        if (trans_b)
            widen_cols(b, B, N, K, k0, n);
        else
            widen_block(b, B + (size_t)k0 * (size_t)N, (size_t)n * (size_t)N);
        st = cllm_matmul(C, a, b, M, N, n, trans_a, trans_b, alpha, k0 == 0 ? beta : 1.0f);
    }
    if (shared) pthread_mutex_unlock(&g_wlock);
    return st;
}

/* bf16 operands, fp32 accumulation and fp32 C: oneDNN's matmul primitive
 * where it has a bf16 kernel (measured on an AVX-512 machine with AMX: every
 * layout at 0.45-2 TFLOP/s on 2 threads, 2-10x the fp32 GEMM), else the
 * widened fp32 path in ws (NULL: the module's buffer). */
cllm_status cllm_matmul_bf16_ws(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool trans_a,
                                bool trans_b, float alpha, float beta, float *ws, size_t ws_bytes) {
    bool done = false;
    cllm_status st = gemm_args(C, A, B, M, N, K, beta, &done);
    if (st || done) return st;
    if (cllm_matmul_bf16_native()) {
        st = run_primitive(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, true);
        if (st != CLLM_ERR_UNSUPPORTED) return st;
        cllm_error_clear(); /* this shape has no bf16 kernel: widen */
    }
    return widened_gemm(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, ws, ws_bytes);
}

cllm_status cllm_matmul_bf16(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool trans_a,
                             bool trans_b, float alpha, float beta) {
    return cllm_matmul_bf16_ws(C, A, B, M, N, K, trans_a, trans_b, alpha, beta, NULL, 0);
}

/* For any M <= M_max, with row = (M + N) floats: either all of K fits the
 * budget (row x K <= BF16_WIDEN_BYTES), or the slice is at most the
 * budget's fit (widen_slice rounds down to 16s) or 16 when less than 16 fit.
 * So row x kc <= min(row x K, max(budget, row x 16)), largest at M_max. */
size_t cllm_matmul_bf16_scratch_bound(int M_max, int N, int K) {
    if (M_max <= 0 || N <= 0 || K <= 0 || cllm_matmul_bf16_native()) return 0;
    size_t row = ((size_t)M_max + (size_t)N) * sizeof(float);
    size_t all = row * (size_t)K, cap = row * 16 > BF16_WIDEN_BYTES ? row * 16 : BF16_WIDEN_BYTES;
    return all < cap ? all : cap;
}

void cllm_kernels_describe(char *buf, size_t cap) {
    const cllm_cpu_info *c = cllm_cpu();
    const dnnl_version_t *v = dnnl_version();
    char feats[160] = "";
    const struct {
        bool on;
        const char *name;
    } f[] = {{c->avx2, "avx2"},         {c->fma, "fma"},         {c->f16c, "f16c"},
             {c->avx512f, "avx512f"},   {c->avx512bw, "avx512bw"}, {c->avx512vl, "avx512vl"},
             {c->avx512dq, "avx512dq"}, {c->avx512_vnni, "avx512_vnni"}, {c->avx512_bf16, "avx512_bf16"},
             {c->amx_tile, "amx_tile"}, {c->amx_bf16, "amx_bf16"}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].on) {
            size_t len = strlen(feats);
            snprintf(feats + len, sizeof feats - len, "%s%s", len ? " " : "", f[i].name);
        }
    const char *dnnl_isa = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
    if (dnnl_isa && strncmp(dnnl_isa, "cpu_isa_", 8) == 0) dnnl_isa += 8;
    snprintf(buf, cap,
             "cpu: %s (%d logical CPUs)\n"
             "cpu features: %s\n"
             "isa: %s%s%s\n"
             "onednn: %d.%d.%d, isa %s\n"
             "fp32 gemm: onednn\n"
             "bf16 gemm: %s\n"
             "kernels: %s\n"
             "decode matvec: %s (fp32, bf16, int8, q4 weights)\n",
             c->model[0] ? c->model : "unknown", c->n_cpus, feats[0] ? feats : "none", cllm_isa_name(c->isa),
             c->capped ? ", capped by CLLM_MAX_ISA from " : "", c->capped ? cllm_isa_name(c->detected) : "",
             v->major, v->minor, v->patch, dnnl_isa, cllm_matmul_bf16_backend(),
             cllm_kernels_variant(), cllm_qmatmul_variant());
}

/* Frees every cached primitive and the engine, once the GEMMs running on
 * other threads are done. Safe to call at any time (the next cllm_matmul
 * rebuilds what it needs) and more than once. */
void cllm_matmul_cleanup(void) {
    pthread_mutex_lock(&g_lock);
    while (g_running) pthread_cond_wait(&g_idle, &g_lock);
    for (int i = 0; i < CACHE_SLOTS; i++) entry_free(&g_cache[i]);
    while (g_n_streams > 0) ctx_free(&g_streams[--g_n_streams]);
    if (g_engine) dnnl_engine_destroy(g_engine);
    g_engine = NULL;
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_lock(&g_wlock);
    cllm_free(g_wbuf);
    g_wbuf = NULL;
    g_wcap = 0;
    pthread_mutex_unlock(&g_wlock);
}

/* ------------------------------------------------------------- workspace
 * oneDNN 2.x allocates, inside every copy-based sgemm call (dnnl_sgemm, and
 * the matmul primitive's "gemm:jit" implementation that runs NT layouts on
 * CPUs without AVX-512), packed copies of its operands
 * (src/cpu/x64/gemm/gemm_driver.cpp): per thread an A panel of
 * m_padd x k_padd and a B panel of k_padd x n_padd floats, both in the
 * column-major terms of the call (m = our N, n = our M, op(A) = op(B)^T),
 * with m_padd = roundup(min(m_thread, bm), um), n_padd = roundup(min(n_thread,
 * bn), un), and k_padd = max(128, K) for K <= bk_traditional, K/2 below 2 bk,
 * else bk. The blocking depends on the ISA (gemm_info.cpp): with bm near
 * 10000 rows, a thread packs its whole share of a weight matrix as tall as
 * a vocabulary. Which threads get which share follows the driver's rules
 * (set_thread_opts_nopack: 2-D split, parallel copy of A, or 1-D split);
 * shapes the driver sends to its no-copy kernels (nocopy_checker) allocate
 * almost nothing. The model below follows oneDNN 2.6 for fp32; it is what
 * cllm_memory_estimate counts as the GEMM workspace. */
typedef struct {
    long um, un, bm, bn, bk, bk_trad;
} sgemm_blocking;

static long rnd_up(long a, long b) { return (a + b - 1) / b * b; }
static long lmin(long a, long b) { return a < b ? a : b; }
static long lmax(long a, long b) { return a > b ? a : b; }
static long div_up(long a, long b) { return (a + b - 1) / b; }

static bool isa_has(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t want) { return ((unsigned)isa & (unsigned)want) == (unsigned)want; }

/* col-major (m, n, k): no-copy kernels, as oneDNN 2.6's nocopy_checker */
static bool sgemm_nocopy(dnnl_cpu_isa_t isa, int nthr, bool ta, bool tb, long m, long n, long k, long lda, long ldb,
                         long ldc) {
    if (!isa_has(isa, dnnl_cpu_isa_avx)) return false;
    if (isa_has(isa, dnnl_cpu_isa_avx512_core)) {
        bool nn = !ta && !tb, nt = !ta && tb, tn = ta && !tb;
        bool lda_bad = lda % 256 == 0, ldb_bad = ldb % 256 == 0, ldc_bad = ldc % 256 == 0;
        bool lda_verybad = lda % 1024 == 0;
        if (nthr == 1 && tn && m > 100 && ((m < 1200 && n < 200 && k < 1200) || (lda_bad && ldb_bad))) return false;
        if (nthr <= 8 && nn && lda_verybad && k > 500 && n > 100) return false;
        if (1.0 / (double)m + 1.0 / (double)n >= 0.00196 && !(lda_verybad && nt)) return true;
        if (lda_bad || ldb_bad || ldc_bad) {
            if (m >= 32 && n > 16) return false;
            if (m >= 32 && n == 16 && (k >= 6400 || ta || m == 4096)) return false;
        }
        if (m <= 378 && n <= 378 && k >= nthr * 378L) return false;
        if (m >= nthr * 378L && k >= nthr * 378L) return false;
        if (!tb) return m <= nthr * 28L || n <= nthr * 28L || k <= nthr;
        return (m <= nthr * 28L && m >= n) || n <= nthr * 28L || k <= nthr;
    }
    if (1.0 / (double)m + 1.0 / (double)n >= 0.0038) return true;
    if (m <= 378 && n <= 378 && k >= nthr * 378L) return false;
    if (m >= nthr * 378L && k >= nthr * 378L) return false;
    if (m <= 128 && n <= 128) return true;
    if (!tb) return n <= nthr * 16L || k <= nthr * 2L || (m <= 64 && n >= nthr * 16L);
    return n <= nthr || k <= nthr;
}

/* Bytes one copy-based sgemm call of col-major shape (m, n, k) mallocs. */
static size_t sgemm_workspace(dnnl_cpu_isa_t isa, int nthr, bool ta, bool tb, long m, long n, long k, long lda,
                              long ldb, long ldc) {
    sgemm_blocking b;
    if (isa_has(isa, dnnl_cpu_isa_avx512_core))
        b = (sgemm_blocking){48, 8, 9984, 384, 384, 384};
    else if (isa_has(isa, dnnl_cpu_isa_avx2))
        b = (sgemm_blocking){24, 4, 10000, 384, 192, 256};
    else if (isa_has(isa, dnnl_cpu_isa_avx))
        b = (sgemm_blocking){16, 4, 4096, 96, 256, 256};
    else if (isa_has(isa, dnnl_cpu_isa_sse41))
        b = (sgemm_blocking){8, 4, 4096, 96, 256, 256};
    else
        return 0; /* reference GEMM: no packing */
    if (m <= 0 || n <= 0 || k <= 0 || sgemm_nocopy(isa, nthr, ta, tb, m, n, k, lda, ldb, ldc)) return 0;
    const bool avx512 = isa_has(isa, dnnl_cpu_isa_avx512_core);
    const long page = 4096, T = nthr;
    long kp = k <= b.bk_trad ? lmax(128, k) : k < 2 * b.bk ? (k + 1) / 2 : b.bk;
#define M_PADD(mm) rnd_up(lmin(lmax((mm), b.um), b.bm), b.um)
#define N_PADD(nn) rnd_up(lmin(lmax((nn), b.un), k < 48 ? 24 : b.bn), b.un)
    bool two_d = !avx512 && n <= 384 && m >= T * 384 ? false : (n > T * 384 || n <= T * 192) && m >= 768;
    bool copy_a = avx512 ? m >= 1000 && n >= T * 96 : m >= 1000 && n >= 4000;
    if (copy_a) two_d = false;
    long tm = 1, tn = T;
    if (two_d) {
        while (tn % 2 == 0 && (n / T > 384 || n / tn <= 192) && m / tm >= 768 && tm < 4) {
            tm *= 2;
            tn /= 2;
        }
    } else if (copy_a) {
        /* one shared A panel for all threads, a B panel per thread */
        long mpar = lmin(M_PADD(m) * lmin(T, 10), rnd_up(m, b.um)), np = N_PADD(div_up(n, T));
        size_t shared = (size_t)(mpar * kp) * 4 + (size_t)page;
        size_t per = (size_t)(lmin(k, kp) * np) * 4 + (size_t)page + (size_t)(lmin(m, mpar) + np) * 4 + 2 * (size_t)page;
        return shared + (size_t)T * per;
    } else {
        long veclen = avx512 ? 16 : isa_has(isa, dnnl_cpu_isa_avx) ? 8 : 4;
        if (m > n && (m >= T * veclen || n < T))
            tm = T, tn = 1;
    }
    long mt = div_up(m, tm), nt = div_up(n, tn);
    size_t per = (size_t)(M_PADD(mt) * kp + kp * N_PADD(nt)) * 4 + 2 * (size_t)page + (size_t)(b.um + N_PADD(nt)) * 4 +
                 2 * (size_t)page;
#undef M_PADD
#undef N_PADD
    return (size_t)(tm * tn) * per;
}

/* The matmul primitive of an fp32 GEMM (NT, or NN / TN where
 * nn_on_primitive sends them): its scratchpad as oneDNN reports it, and
 * whether its implementation is the copy-based sgemm. */
static cllm_status primitive_workspace(int M, int N, int K, bool trans_a, bool trans_b, size_t *scratch, bool *gemm) {
    dnnl_memory_desc_t md_a, md_b, md_c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL; /* user scratchpad mode, as the cached primitives: it reports the size */
    dnnl_engine_t engine = NULL; /* its own: nothing is left behind to free */
    cllm_status st = dnnl_check(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine_create");
    if (!st) st = dnnl_check(md_2d(&md_a, M, K, trans_a, dnnl_f32), "memory_desc (A)");
    if (!st) st = dnnl_check(md_2d(&md_b, K, N, trans_b, dnnl_f32), "memory_desc (B)");
    if (!st) st = dnnl_check(md_2d(&md_c, M, N, false, dnnl_f32), "memory_desc (C)");
    if (!st) st = dnnl_check(dnnl_matmul_desc_init(&desc, &md_a, &md_b, NULL, &md_c), "matmul_desc");
    if (!st) st = dnnl_check(dnnl_primitive_attr_create(&attr), "attr_create");
    if (!st)
        st = dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (!st) st = dnnl_check(dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL), "primitive_desc_create");
    if (!st) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        *scratch = md ? dnnl_memory_desc_get_size(md) : 0;
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) impl = NULL;
        *gemm = impl && strncmp(impl, "gemm", 4) == 0;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (engine) dnnl_engine_destroy(engine);
    return st;
}

size_t cllm_matmul_workspace(int M, int N, int K, bool trans_a, bool trans_b, int n_threads) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    int nthr = n_threads > 0 ? n_threads : omp_get_max_threads();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
    long m = N, n = M, k = K, lda = trans_b ? K : N, ldb = trans_a ? M : K, ldc = N;
    if (!trans_b && !nn_on_primitive(isa, M, N, K, trans_a, nthr))
        return sgemm_workspace(isa, nthr, false, trans_a, m, n, k, lda, ldb, ldc);
    size_t scratch = 0;
    bool gemm = false;
    if (primitive_workspace(M, N, K, trans_a, trans_b, &scratch, &gemm)) {
        cllm_error_clear();
        gemm = true; /* no primitive to ask: count the sgemm it would fall back to */
    }
    return scratch + (gemm ? sgemm_workspace(isa, nthr, trans_b, trans_a, m, n, k, lda, ldb, ldc) : 0);
}

/* ---------------------------------------------------------------- linear
 * w_in_out=false: W[OUT,IN], out[N,OUT] = inp[N,IN] @ W^T + b
 * w_in_out=true:  W[IN,OUT], out[N,OUT] = inp[N,IN] @ W   + b
 * The transpose is a flag to cllm_matmul, so both layouts cost the same. */
cllm_status cllm_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                                int N, int IN, int OUT, bool w_in_out) {
    cllm_status st = cllm_matmul(out, inp, weight, N, OUT, IN, false, !w_in_out, 1.0f, 0.0f);
    if (st || !bias) return st;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OUT;
#pragma omp simd
        for (int j = 0; j < OUT; j++) o[j] += bias[j];
    }
    return CLLM_OK;
}

/* dbias[OUT] += sum_n dout[n,:]. Parallel over column blocks, serial over
 * rows, so the summation order (and the result) does not depend on the
 * thread count; partial sums in double. */
static void bias_backward(float *dbias, const float *dout, int N, int OUT) {
    enum { BLK = 64 };
    int nblk = (OUT + BLK - 1) / BLK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * BLK, nj = OUT - j0 < BLK ? OUT - j0 : BLK;
        double acc[BLK] = {0};
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OUT + j0;
#pragma omp simd
            for (int j = 0; j < nj; j++) acc[j] += d[j];
        }
        for (int j = 0; j < nj; j++) dbias[j0 + j] += (float)acc[j];
    }
}

/* dinp[N,IN]   += dout[N,OUT] @ W          (W as [OUT,IN])
 * dweight      += dout^T @ inp  -> [OUT,IN] (w_in_out=false)
 *              += inp^T @ dout  -> [IN,OUT] (w_in_out=true)
 * dbias[OUT]   += column sums of dout. */
cllm_status cllm_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int IN, int OUT,
                                 bool w_in_out) {
    cllm_status st = CLLM_OK;
    if (dinp) st = cllm_matmul(dinp, dout, weight, N, IN, OUT, false, w_in_out, 1.0f, 1.0f);
    if (!st && dweight) {
        if (w_in_out)
            st = cllm_matmul(dweight, inp, dout, IN, OUT, N, true, false, 1.0f, 1.0f);
        else
            st = cllm_matmul(dweight, dout, inp, OUT, IN, N, true, false, 1.0f, 1.0f);
    }
    if (!st && dbias) bias_backward(dbias, dout, N, OUT);
    return st;
}
