/*
 * Kernel tests.
 *
 * Without arguments: self-contained checks that need no PyTorch: cllm_matmul
 * against a naive triple loop (all transposes, alpha, beta 0/1), argument
 * errors, the primitive cache under eviction and after cleanup,
 * thread-count independence of the row-reducing backward kernels, and
 * cllm_logsumexp against a float64 reference.
 *
 * With a directory argument: the cases written there by tests/ref/kernels_ref.py
 * (manifest.txt + raw float32/int32 tensors, references from torch autograd
 * in float64). Every forward output and every gradient is compared; gradient
 * buffers are pre-filled with PREFILL so that overwriting instead of
 * accumulating fails.
 */
#include "check.h"
#include "cllm/cpu.h"
#include "cllm/kernels.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PREFILL 0.0625f

/* ------------------------------------------------------------ helpers */

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static float *filled(size_t n, float v) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

static float *copy_of(const float *src, size_t n) {
    float *p = xmalloc(n * sizeof *p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

/* One CHECK per tensor: every element within rtol * (|ref| + rms(ref)) and
 * relative L2 error within l2tol. The rms term keeps elements that cancel to
 * near zero from demanding more than fp32 can give, while the L2 bound keeps
 * the check tight overall. */
static void expect_close(const char *cs, const char *what, const float *got, const float *ref,
                         size_t n, double rtol, double l2tol) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)ref[i] * ref[i];
    double rms = n ? sqrt(ss / (double)n) : 0.0;
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        double lim = rtol * (fabs((double)ref[i]) + rms) + 1e-30;
        if (!(d <= lim)) bad++;
        double ratio = d / lim;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    double l2 = check_rel_l2(got, ref, n);
    CHECK(bad == 0 && l2 <= l2tol,
          "%s %s: %zu/%zu elements off, rel-L2 %.3g (tol %.1g); worst [%zu] got %.9g want %.9g",
          cs, what, bad, n, l2, l2tol, worst, n ? (double)got[worst] : 0.0,
          n ? (double)ref[worst] : 0.0);
}

/* Gradient buffers start at PREFILL; the kernel must have added ref. */
static void expect_grad(const char *cs, const char *what, const float *got, const float *ref,
                        size_t n, double rtol, double l2tol) {
    float *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = got[i] - PREFILL;
    expect_close(cs, what, d, ref, n, rtol, l2tol);
    free(d);
}

/* ----------------------------------------------------- pure-C checks */

/* C[M,N] = alpha * op(A) @ op(B) + beta * C0, in double. */
static void naive_gemm(float *C, const float *C0, const float *A, const float *B, int M, int N,
                       int K, bool ta, bool tb, float alpha, float beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                s += a * b;
            }
            C[(size_t)i * N + j] = (float)(alpha * s + beta * (double)C0[(size_t)i * N + j]);
        }
}

static void rand_fill(cllm_rng *r, float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = cllm_rng_normal(r);
}

static void check_matmul_case(cllm_rng *r, int M, int N, int K, bool ta, bool tb, float alpha,
                              float beta) {
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = xmalloc(na * sizeof *A), *B = xmalloc(nb * sizeof *B);
    float *C = xmalloc(nc * sizeof *C), *want = xmalloc(nc * sizeof *want);
    rand_fill(r, A, na);
    rand_fill(r, B, nb);
    rand_fill(r, C, nc);
    naive_gemm(want, C, A, B, M, N, K, ta, tb, alpha, beta);
    cllm_status st = cllm_matmul(C, A, B, M, N, K, ta, tb, alpha, beta);
    char cs[96];
    snprintf(cs, sizeof cs, "naive matmul M=%d N=%d K=%d ta=%d tb=%d alpha=%g beta=%g", M, N, K,
             ta, tb, (double)alpha, (double)beta);
    CHECK(st == CLLM_OK, "%s: %s", cs, cllm_last_error());
    if (st == CLLM_OK) expect_close(cs, "C", C, want, nc, 1e-4, 1e-5);
    free(A);
    free(B);
    free(C);
    free(want);
}

static void test_matmul_naive(void) {
    cllm_rng r;
    cllm_rng_seed(&r, 42);
    const int shapes[][3] = {{1, 1, 1}, {7, 37, 101}, {64, 33, 128}, {130, 70, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int b = 0; b < 2; b++)
                check_matmul_case(&r, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1,
                                  (t + b) % 3 == 2 ? 0.5f : 1.0f, (float)b);
    /* 1040 x 1040 with a short K: oneDNN's sgemm would take its copy-based
     * path, so on AVX-512 CPUs the NN and TN layouts run on the matmul
     * primitive instead (matmul.c, nn_on_primitive); alpha and beta too */
    for (int t = 0; t < 4; t++)
        for (int b = 0; b < 2; b++) check_matmul_case(&r, 1040, 1040, 40, t & 1, t >> 1, b ? 1.0f : 0.5f, (float)b);
}

/* bf16 GEMM: the naive double GEMM of the bf16-rounded operands is the
 * reference (products of bf16 values are exact; only fp32 accumulation
 * order differs), so the tolerance is fp32's, not bf16's. */
static void check_matmul_bf16_case(cllm_rng *r, int M, int N, int K, bool ta, bool tb, float beta) {
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = xmalloc(na * sizeof *A), *B = xmalloc(nb * sizeof *B);
    float *C = xmalloc(nc * sizeof *C), *want = xmalloc(nc * sizeof *want);
    uint16_t *A16 = xmalloc(na * sizeof *A16), *B16 = xmalloc(nb * sizeof *B16);
    rand_fill(r, A, na);
    rand_fill(r, B, nb);
    rand_fill(r, C, nc);
    cllm_to_bf16(A16, A, (long)na);
    cllm_to_bf16(B16, B, (long)nb);
    for (size_t i = 0; i < na; i++) A[i] = cllm_bf16_to_f32(A16[i]);
    for (size_t i = 0; i < nb; i++) B[i] = cllm_bf16_to_f32(B16[i]);
    naive_gemm(want, C, A, B, M, N, K, ta, tb, 1.0f, beta);
    cllm_status st = cllm_matmul_bf16(C, A16, B16, M, N, K, ta, tb, 1.0f, beta);
    char cs[96];
    snprintf(cs, sizeof cs, "bf16 matmul M=%d N=%d K=%d ta=%d tb=%d beta=%g", M, N, K, ta, tb, (double)beta);
    CHECK(st == CLLM_OK, "%s: %s", cs, cllm_last_error());
    if (st == CLLM_OK) expect_close(cs, "C", C, want, nc, 1e-4, 1e-5);
    free(A);
    free(B);
    free(C);
    free(want);
    free(A16);
    free(B16);
}

static void test_matmul_bf16(void) {
    cllm_rng r;
    cllm_rng_seed(&r, 7);
    const int shapes[][3] = {{1, 1, 1}, {7, 37, 101}, {64, 33, 128}, {130, 70, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int b = 0; b < 2; b++)
                check_matmul_bf16_case(&r, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, (float)b);
}

/* A bf16 GEMM too large for one widened slice on CPUs without a native
 * bf16 GEMM ((M + N) x K floats > 32 MiB: two K slices there), checked on
 * sampled entries against double sums of the bf16 values, for every layout,
 * with alpha and beta = 1 (the second slice accumulates into the first). */
static void test_matmul_bf16_sliced(void) {
    const int M = 1100, N = 1000, K = 4300;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    uint16_t *A16 = xmalloc(na * sizeof *A16), *B16 = xmalloc(nb * sizeof *B16);
    float *C0 = xmalloc(nc * sizeof *C0), *C = xmalloc(nc * sizeof *C);
    cllm_rng r;
    cllm_rng_seed(&r, 9);
    for (size_t i = 0; i < na; i++) A16[i] = cllm_f32_to_bf16(cllm_rng_normal(&r));
    for (size_t i = 0; i < nb; i++) B16[i] = cllm_f32_to_bf16(cllm_rng_normal(&r));
    rand_fill(&r, C0, nc);
    size_t scratch = cllm_matmul_bf16_scratch_bytes(M, N, K);
    if (cllm_matmul_bf16_native())
        CHECK(scratch == 0, "native bf16 GEMM reports %zu bytes of widening scratch", scratch);
    else
        CHECK(scratch > 0 && scratch <= ((size_t)32 << 20) && scratch < ((size_t)M + N) * K * sizeof(float),
              "widening scratch %zu bytes: expected a K slice within 32 MiB", scratch);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t >> 1;
        memcpy(C, C0, nc * sizeof *C);
        cllm_status st = cllm_matmul_bf16(C, A16, B16, M, N, K, ta, tb, 0.5f, 1.0f);
        CHECK(st == CLLM_OK, "sliced bf16 GEMM ta=%d tb=%d: %s", ta, tb, cllm_last_error());
        if (st) continue;
        int bad = 0;
        for (int sample = 0; sample < 200; sample++) {
            int i = (int)(cllm_rng_u64(&r) % (uint64_t)M), j = (int)(cllm_rng_u64(&r) % (uint64_t)N);
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double a = cllm_bf16_to_f32(ta ? A16[(size_t)k * M + i] : A16[(size_t)i * K + k]);
                double b = cllm_bf16_to_f32(tb ? B16[(size_t)j * K + k] : B16[(size_t)k * N + j]);
                sum += a * b;
                mag += fabs(a * b);
            }
            double want = 0.5 * sum + C0[(size_t)i * N + j], got = C[(size_t)i * N + j];
            if (fabs(got - want) > 1e-5 * (0.5 * mag + fabs(C0[(size_t)i * N + j])) + 1e-6) {
                if (bad++ < 3) fprintf(stderr, "  C[%d,%d] = %.7g, want %.7g\n", i, j, got, want);
            }
        }
        CHECK(bad == 0, "sliced bf16 GEMM ta=%d tb=%d: %d of 200 sampled entries off", ta, tb, bad);
        /* the caller's workspace of exactly the reported size: the same bits */
        float *C2 = xmalloc(nc * sizeof *C2), *ws = scratch ? xmalloc(scratch) : NULL;
        memcpy(C2, C0, nc * sizeof *C2);
        st = cllm_matmul_bf16_ws(C2, A16, B16, M, N, K, ta, tb, 0.5f, 1.0f, ws, scratch);
        CHECK(st == CLLM_OK && !memcmp(C, C2, nc * sizeof *C), "bf16 GEMM in a caller's workspace ta=%d tb=%d: %s",
              ta, tb, st ? cllm_last_error() : "results differ");
        if (scratch) {
            st = cllm_matmul_bf16_ws(C2, A16, B16, M, N, K, ta, tb, 0.5f, 1.0f, ws, scratch - sizeof(float));
            CHECK(st == CLLM_ERR_ARG && strstr(cllm_last_error(), "workspace"),
                  "a workspace one float short: status %d, %s", (int)st, cllm_last_error());
        }
        free(C2);
        free(ws);
    }
    free(A16);
    free(B16);
    free(C0);
    free(C);
}

/* cllm_matmul_bf16_scratch_bound covers every row count up to M_max,
 * around the 32 MiB budget (one slice, two, and rows wider than 1/16 of
 * the budget). */
static void test_matmul_bf16_bound(void) {
    const int nk[][3] = {{64, 64, 300}, {1000, 4300, 1200}, {50257, 768, 64}, {600000, 64, 40}, {300, 9000, 3000}};
    for (size_t s = 0; s < sizeof nk / sizeof nk[0]; s++) {
        int N = nk[s][0], K = nk[s][1], M_max = nk[s][2];
        size_t bound = cllm_matmul_bf16_scratch_bound(M_max, N, K), worst = 0;
        int bad = 0;
        for (int M = 1; M <= M_max; M++) {
            size_t b = cllm_matmul_bf16_scratch_bytes(M, N, K);
            if (b > worst) worst = b;
            if (b > bound) bad++;
        }
        CHECK(bad == 0, "N=%d K=%d: %d row counts need more than the bound %zu (worst %zu)", N, K, bad, bound, worst);
        if (cllm_matmul_bf16_native()) CHECK(bound == 0, "native path: bound %zu", bound);
    }
}

/* The CPU facts against /proc/cpuinfo's flags (an independent reading),
 * and the caps of CLLM_MAX_ISA / ONEDNN_MAX_CPU_ISA honoured by the bf16
 * GEMM's choice of path. */
static void test_cpu_detection(void) {
    const cllm_cpu_info *c = cllm_cpu();
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    bool have_flags = false;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "flags", 5) == 0) {
            have_flags = true;
            break;
        }
    if (f) fclose(f);
    if (have_flags) {
        const struct {
            const char *flag;
            bool ours;
        } m[] = {{" avx2 ", c->avx2}, {" fma ", c->fma}, {" avx512f ", c->avx512f}, {" avx512bw ", c->avx512bw},
                 {" avx512_bf16 ", c->avx512_bf16}, {" amx_bf16 ", c->amx_bf16}};
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[len - 1] = ' ';
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
            bool kernel_says = strstr(line, m[i].flag) != NULL;
            CHECK(kernel_says == m[i].ours, "CPU flag%s: /proc/cpuinfo says %d, cllm_cpu %d", m[i].flag, kernel_says,
                  m[i].ours);
        }
    }
    CHECK(c->isa <= c->detected, "isa %s above the detected %s", cllm_isa_name(c->isa), cllm_isa_name(c->detected));
    CHECK(c->detected < CLLM_ISA_AVX2 || (c->avx2 && c->fma), "level %s without avx2+fma", cllm_isa_name(c->detected));
    CHECK(c->detected < CLLM_ISA_AVX512 || c->avx512f, "level %s without avx512f", cllm_isa_name(c->detected));
    cllm_isa cap;
    const char *env = getenv("CLLM_MAX_ISA");
    if (env && cllm_isa_parse(env, &cap)) {
        CHECK(c->isa <= cap, "CLLM_MAX_ISA=%s not honoured: isa %s", env, cllm_isa_name(c->isa));
        if (cap < CLLM_ISA_AVX512) CHECK(!cllm_matmul_bf16_native(), "CLLM_MAX_ISA=%s: bf16 GEMM still native", env);
    }
    const char *denv = getenv("ONEDNN_MAX_CPU_ISA");
    if (denv && (!strcasecmp(denv, "AVX2") || !strcasecmp(denv, "SSE41")))
        CHECK(!cllm_matmul_bf16_native(), "ONEDNN_MAX_CPU_ISA=%s: bf16 GEMM still native", denv);
    if (c->isa < CLLM_ISA_AVX512) CHECK(!cllm_matmul_bf16_native(), "bf16 GEMM native below avx512");
#if defined(__x86_64__)
    const char *want_variant = c->isa >= CLLM_ISA_AVX512 ? "avx512" : c->isa >= CLLM_ISA_AVX2 ? "avx2" : "portable";
#else
    const char *want_variant = "portable";
#endif
    CHECK(strcmp(cllm_kernels_variant(), want_variant) == 0, "kernel build %s for isa %s, expected %s",
          cllm_kernels_variant(), cllm_isa_name(c->isa), want_variant);
    CHECK(strcmp(cllm_matmul_bf16_backend(), cllm_matmul_bf16_native() ? "onednn" : "fp32-widened") == 0,
          "backend name %s", cllm_matmul_bf16_backend());
    char desc[1024];
    cllm_kernels_describe(desc, sizeof desc);
    CHECK(strstr(desc, "bf16 gemm: ") && strstr(desc, cllm_matmul_bf16_backend()) &&
              strstr(desc, cllm_isa_name(c->isa)),
          "description lacks the choices: %s", desc);
    cllm_isa parsed;
    CHECK(cllm_isa_parse("AVX512_BF16", &parsed) && parsed == CLLM_ISA_AVX512_BF16, "level names are case-blind");
    CHECK(!cllm_isa_parse("avx3", &parsed), "unknown level accepted");
    fprintf(stderr, "%s", desc);
}

/* The array conversions agree bit for bit with the scalar converters of
 * core (tested against exact values in test_core), on random values of
 * every magnitude and on the special cases. */
static void test_precision_conversions(void) {
    enum { N = 4096 };
    static float x[N], y[N];
    static uint16_t h[N];
    cllm_rng r;
    cllm_rng_seed(&r, 11);
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, -65519.0f, 1e-8f,
                             5.96e-8f, 2.98e-8f, 6.1e-5f, 3.4e38f, 1.00390625f, 1.01171875f};
    size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)cllm_rng_u64(&r);
        memcpy(&x[i], &bits, sizeof bits);
        if (i < ns) x[i] = special[i];
    }
    cllm_to_bf16(h, x, N);
    cllm_round_f16(y, x, N);
    int bad16 = 0, badh = 0;
    for (size_t i = 0; i < N; i++) {
        bad16 += h[i] != cllm_f32_to_bf16(x[i]);
        float want = cllm_f16_to_f32(cllm_f32_to_f16(x[i]));
        badh += !(want == y[i] || (isnan(want) && isnan(y[i])));
    }
    CHECK(bad16 == 0, "cllm_to_bf16: %d of %d values differ from cllm_f32_to_bf16", bad16, N);
    CHECK(badh == 0, "cllm_round_f16: %d of %d values differ from the scalar round trip", badh, N);
    CHECK(y[5] == 65504.0f && isinf(y[6]) && y[7] == -65504.0f, "fp16 range edge: %g %g %g", (double)y[5],
          (double)y[6], (double)y[7]);
    /* bf16 values kept as fp32: the bits of cllm_to_bf16 in the high half */
    cllm_round_bf16(y, x, N);
    int badb = 0;
    for (size_t i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &y[i], sizeof u);
        badb += (uint16_t)(u >> 16) != h[i] || (u & 0xffffu);
    }
    CHECK(badb == 0, "cllm_round_bf16: %d of %d values differ from cllm_to_bf16", badb, N);
    CHECK(y[14] == 1.015625f && y[13] == 1.0f, "bf16 ties to even: %.9g %.9g", (double)y[13], (double)y[14]);
    cllm_round_bf16(x, x, N); /* in place */
    CHECK(!memcmp(x, y, sizeof x), "cllm_round_bf16 in place differs");
}

static void test_matmul_args(void) {
    float a = 1, b = 2, c = 3;
    CHECK(cllm_matmul(&c, &a, &b, 1, 1, 1, false, false, 1.0f, 0.5f) == CLLM_ERR_ARG,
          "beta 0.5 accepted");
    CHECK(strstr(cllm_last_error(), "beta") != NULL, "error message: %s", cllm_last_error());
    CHECK(cllm_matmul(&c, &a, &b, -1, 1, 1, false, false, 1.0f, 0.0f) == CLLM_ERR_ARG,
          "negative M accepted");
    CHECK(cllm_matmul(&c, NULL, &b, 1, 1, 1, false, false, 1.0f, 0.0f) == CLLM_ERR_ARG,
          "NULL A accepted");
    /* K = 0: an empty sum, C = beta * C */
    c = 3;
    CHECK(cllm_matmul(&c, NULL, NULL, 1, 1, 0, false, false, 1.0f, 1.0f) == CLLM_OK && c == 3,
          "K=0 beta=1 changed C to %g", (double)c);
    CHECK(cllm_matmul(&c, NULL, NULL, 1, 1, 0, false, false, 1.0f, 0.0f) == CLLM_OK && c == 0,
          "K=0 beta=0 left C at %g", (double)c);
}

/* Concurrent GEMMs: more threads than cache slots, each running NT GEMMs
 * (the cached-primitive layout) of its own shape and of one shape all
 * threads share, so entries run on several threads at once and are evicted
 * while others run. Each result must equal the same call made alone. */
enum { CONC_THREADS = 80, CONC_K = 24, CONC_N = 12 };

typedef struct {
    int m;          /* rows of the thread's own shape */
    float A[(CONC_THREADS + 8) * CONC_K], B[CONC_N * CONC_K];
    float got[2][(CONC_THREADS + 8) * CONC_N], want[2][(CONC_THREADS + 8) * CONC_N];
    cllm_status st;
} conc_job;

static void *conc_run(void *arg) {
    conc_job *j = arg;
    for (int rep = 0; rep < 3 && !j->st; rep++) {
        j->st = cllm_matmul(j->got[0], j->A, j->B, j->m, CONC_N, CONC_K, false, true, 1.0f, 0.0f);
        if (!j->st) j->st = cllm_matmul(j->got[1], j->A, j->B, 8, CONC_N, CONC_K, false, true, 1.0f, 0.0f);
    }
    return NULL;
}

static void test_matmul_concurrent(void) {
    cllm_rng r;
    cllm_rng_seed(&r, 5);
    conc_job *jobs = calloc(CONC_THREADS, sizeof *jobs);
    pthread_t th[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        conc_job *j = &jobs[i];
        j->m = 9 + i;
        rand_fill(&r, j->A, sizeof j->A / sizeof j->A[0]);
        rand_fill(&r, j->B, sizeof j->B / sizeof j->B[0]);
        CHECK(cllm_matmul(j->want[0], j->A, j->B, j->m, CONC_N, CONC_K, false, true, 1.0f, 0.0f) == CLLM_OK &&
                  cllm_matmul(j->want[1], j->A, j->B, 8, CONC_N, CONC_K, false, true, 1.0f, 0.0f) == CLLM_OK,
              "alone: %s", cllm_last_error());
    }
    int started = 0;
    for (int i = 0; i < CONC_THREADS; i++)
        if (pthread_create(&th[i], NULL, conc_run, &jobs[i]) == 0) started++;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    CHECK(started == CONC_THREADS, "%d of %d threads started", started, CONC_THREADS);
    int bad = 0;
    for (int i = 0; i < started; i++) {
        conc_job *j = &jobs[i];
        if (j->st || memcmp(j->got[0], j->want[0], (size_t)j->m * CONC_N * sizeof(float)) ||
            memcmp(j->got[1], j->want[1], (size_t)8 * CONC_N * sizeof(float)))
            bad++;
    }
    CHECK(bad == 0, "%d of %d threads' concurrent GEMMs differ from the same calls alone", bad, started);
    free(jobs);
}

/* More distinct shapes than cache slots, twice over, then the same after a
 * cleanup: every result must stay right while entries are evicted/rebuilt. */
static void test_matmul_cache(void) {
    cllm_rng r;
    cllm_rng_seed(&r, 7);
    for (int round = 0; round < 2; round++) {
        int bad = 0;
        for (int m = 1; m <= 100; m++) {
            float A[100 * 3], B[3 * 5], C[100 * 5], want[100 * 5];
            rand_fill(&r, A, (size_t)m * 3);
            rand_fill(&r, B, 15);
            memset(C, 0, sizeof C);
            naive_gemm(want, C, A, B, m, 5, 3, false, false, 1.0f, 0.0f);
            if (cllm_matmul(C, A, B, m, 5, 3, false, false, 1.0f, 0.0f) != CLLM_OK) {
                bad++;
                continue;
            }
            for (int i = 0; i < m * 5; i++)
                if (!check_close_f(C[i], want[i], 1e-5, 1e-6)) {
                    bad++;
                    break;
                }
        }
        CHECK(bad == 0, "round %d: %d of 100 shapes wrong while cycling the cache", round, bad);
        cllm_matmul_cleanup();
    }
}

/* One shape with every (trans, alpha, beta) variant, twice in a row: the
 * second pass hits the cache, which must tell all variants apart. */
static void test_matmul_cache_key(void) {
    cllm_rng r;
    cllm_rng_seed(&r, 11);
    for (int pass = 0; pass < 2; pass++)
        for (int v = 0; v < 16; v++)
            check_matmul_case(&r, 9, 9, 9, v & 1, (v >> 1) & 1, (v & 4) ? 0.5f : 1.0f,
                              (float)((v >> 3) & 1));
}

/* The reductions over rows in these backward kernels are ordered by row,
 * not by thread, so 1 and 2 threads must agree bit for bit. */
static void test_thread_independence(void) {
    enum { N = 57, T = 19, C = 83, V = 11 };
    cllm_rng r;
    cllm_rng_seed(&r, 3);
    float *x = xmalloc(N * C * sizeof *x), *dout = xmalloc(N * C * sizeof *dout);
    float w[C], b[C], mean[N], rstd[N];
    int32_t tok[N];
    rand_fill(&r, x, N * C);
    rand_fill(&r, dout, N * C);
    rand_fill(&r, w, C);
    rand_fill(&r, b, C);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)cllm_rng_below(&r, V);
    float *out = xmalloc(N * C * sizeof *out);
    cllm_layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5f);

    float *res[2][4];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        res[k][0] = filled((size_t)V * C, 0.0f);
        res[k][1] = filled((size_t)T * C, 0.0f);
        res[k][2] = filled(C, 0.0f);
        res[k][3] = filled(C, 0.0f);
        cllm_embedding_backward(res[k][0], res[k][1], dout, tok, N, T, C, V);
        cllm_layernorm_backward(NULL, res[k][2], res[k][3], dout, x, w, mean, rstd, N, C);
    }
    omp_set_num_threads(saved);
    const size_t sizes[4] = {(size_t)V * C, (size_t)T * C, C, C};
    const char *names[4] = {"dwte", "dwpe", "ln dweight", "ln dbias"};
    for (int i = 0; i < 4; i++) {
        CHECK(memcmp(res[0][i], res[1][i], sizes[i] * sizeof(float)) == 0,
              "%s differs between 1 and 2 threads", names[i]);
        free(res[0][i]);
        free(res[1][i]);
    }
    free(x);
    free(dout);
    free(out);
}

/* -------------------------------------------- torch-reference cases */

static const char *g_dir;

/* Reads <dir>/<cs>.<key>, which must hold exactly n 4-byte values.
 * Returns NULL (and records a failed check) otherwise. */
static void *load(const char *cs, const char *key, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", g_dir, cs, key);
    FILE *f = fopen(path, "rb");
    void *p = NULL;
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (f && size == (long)(n * 4) && fseek(f, 0, SEEK_SET) == 0) {
        p = xmalloc(n * 4);
        if (fread(p, 4, n, f) != n) {
            free(p);
            p = NULL;
        }
    }
    if (f) fclose(f);
    CHECK(p != NULL, "cannot read %s as %zu values (size %ld)", path, n, size);
    return p;
}

#define MAXT 24
/* The tensors of one case, freed together. */
typedef struct {
    void *p[MAXT];
    int n;
} tensors;

static void *take(tensors *ts, void *p) {
    if (ts->n == MAXT) {
        fprintf(stderr, "test_kernels: more than %d tensors in one case\n", MAXT);
        exit(2);
    }
    ts->p[ts->n++] = p;
    return p;
}
static float *ld(tensors *ts, const char *cs, const char *key, size_t n) {
    return take(ts, load(cs, key, n));
}
static void release(tensors *ts) {
    for (int i = 0; i < ts->n; i++) free(ts->p[i]);
    ts->n = 0;
}
static bool all_loaded(const tensors *ts) {
    for (int i = 0; i < ts->n; i++)
        if (!ts->p[i]) return false;
    return true;
}

static void run_matmul(const char *cs, const double *p) {
    int M = (int)p[0], N = (int)p[1], K = (int)p[2];
    bool ta = p[3] != 0, tb = p[4] != 0;
    float alpha = (float)p[5], beta = (float)p[6];
    tensors ts = {0};
    float *A = ld(&ts, cs, "A", (size_t)M * K), *B = ld(&ts, cs, "B", (size_t)K * N);
    float *C = ld(&ts, cs, "C0", (size_t)M * N), *want = ld(&ts, cs, "C", (size_t)M * N);
    if (all_loaded(&ts)) {
        cllm_status st = cllm_matmul(C, A, B, M, N, K, ta, tb, alpha, beta);
        CHECK(st == CLLM_OK, "%s: %s", cs, cllm_last_error());
        expect_close(cs, "C", C, want, (size_t)M * N, 1e-4, 1e-5);
    }
    release(&ts);
}

static void run_linear(const char *cs, const double *p) {
    int N = (int)p[0], IN = (int)p[1], OUT = (int)p[2];
    bool w_in_out = p[3] != 0, has_bias = p[4] != 0;
    size_t ni = (size_t)N * IN, no = (size_t)N * OUT, nw = (size_t)IN * OUT;
    tensors ts = {0};
    float *inp = ld(&ts, cs, "inp", ni), *w = ld(&ts, cs, "w", nw), *b = ld(&ts, cs, "b", OUT);
    float *want = ld(&ts, cs, "out", no), *dout = ld(&ts, cs, "dout", no);
    float *dinp_ref = ld(&ts, cs, "dinp", ni), *dw_ref = ld(&ts, cs, "dw", nw);
    float *db_ref = ld(&ts, cs, "db", OUT);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(no, 0.0f));
        float *dinp = take(&ts, filled(ni, PREFILL)), *dw = take(&ts, filled(nw, PREFILL));
        float *db = has_bias ? take(&ts, filled(OUT, PREFILL)) : NULL;
        CHECK(cllm_linear_forward(out, inp, w, has_bias ? b : NULL, N, IN, OUT, w_in_out) ==
                  CLLM_OK,
              "%s forward: %s", cs, cllm_last_error());
        expect_close(cs, "out", out, want, no, 1e-4, 1e-5);
        CHECK(cllm_linear_backward(dinp, dw, db, dout, inp, w, N, IN, OUT, w_in_out) == CLLM_OK,
              "%s backward: %s", cs, cllm_last_error());
        expect_grad(cs, "dinp", dinp, dinp_ref, ni, 1e-4, 1e-5);
        expect_grad(cs, "dweight", dw, dw_ref, nw, 1e-4, 1e-5);
        if (db) expect_grad(cs, "dbias", db, db_ref, OUT, 1e-5, 1e-5);
        /* NULL gradients are skipped, the others still accumulate */
        float *dw2 = take(&ts, filled(nw, PREFILL));
        CHECK(cllm_linear_backward(NULL, dw2, NULL, dout, inp, w, N, IN, OUT, w_in_out) ==
                  CLLM_OK,
              "%s backward (dweight only): %s", cs, cllm_last_error());
        expect_grad(cs, "dweight (alone)", dw2, dw_ref, nw, 1e-4, 1e-5);
    }
    release(&ts);
}

static void run_embedding(const char *cs, const double *p) {
    int B = (int)p[0], T = (int)p[1], C = (int)p[2], V = (int)p[3];
    bool has_wpe = p[4] != 0;
    int N = B * T;
    size_t nc = (size_t)N * C;
    tensors ts = {0};
    int32_t *tok = take(&ts, load(cs, "tok", N));
    float *wte = ld(&ts, cs, "wte", (size_t)V * C), *wpe = ld(&ts, cs, "wpe", (size_t)T * C);
    float *want = ld(&ts, cs, "out", nc), *dout = ld(&ts, cs, "dout", nc);
    float *dwte_ref = ld(&ts, cs, "dwte", (size_t)V * C), *dwpe_ref = ld(&ts, cs, "dwpe", (size_t)T * C);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(nc, 0.0f));
        float *dwte = take(&ts, filled((size_t)V * C, PREFILL));
        float *dwpe = take(&ts, filled((size_t)T * C, PREFILL));
        cllm_embedding_forward(out, tok, wte, has_wpe ? wpe : NULL, N, T, C);
        expect_close(cs, "out", out, want, nc, 1e-6, 1e-6);
        cllm_embedding_backward(dwte, has_wpe ? dwpe : NULL, dout, tok, N, T, C, V);
        expect_grad(cs, "dwte", dwte, dwte_ref, (size_t)V * C, 1e-5, 1e-5);
        if (has_wpe) expect_grad(cs, "dwpe", dwpe, dwpe_ref, (size_t)T * C, 1e-5, 1e-5);
    }
    release(&ts);
}

static void run_layernorm(const char *cs, const double *p) {
    int N = (int)p[0], C = (int)p[1];
    float eps = (float)p[2];
    size_t nc = (size_t)N * C;
    tensors ts = {0};
    float *inp = ld(&ts, cs, "inp", nc), *w = ld(&ts, cs, "w", C), *b = ld(&ts, cs, "b", C);
    float *want = ld(&ts, cs, "out", nc), *mean_ref = ld(&ts, cs, "mean", N);
    float *rstd_ref = ld(&ts, cs, "rstd", N), *dout = ld(&ts, cs, "dout", nc);
    float *dinp_ref = ld(&ts, cs, "dinp", nc), *dw_ref = ld(&ts, cs, "dw", C);
    float *db_ref = ld(&ts, cs, "db", C);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(nc, 0.0f)), *mean = take(&ts, filled(N, 0.0f));
        float *rstd = take(&ts, filled(N, 0.0f));
        cllm_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
        expect_close(cs, "out", out, want, nc, 1e-5, 1e-5);
        expect_close(cs, "mean", mean, mean_ref, N, 1e-5, 1e-5);
        expect_close(cs, "rstd", rstd, rstd_ref, N, 1e-5, 1e-5);
        float *dinp = filled(nc, PREFILL), *dw = filled(C, PREFILL), *db = filled(C, PREFILL);
        cllm_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        expect_grad(cs, "dinp", dinp, dinp_ref, nc, 1e-5, 1e-5);
        expect_grad(cs, "dweight", dw, dw_ref, C, 1e-5, 1e-5);
        expect_grad(cs, "dbias", db, db_ref, C, 1e-5, 1e-5);
        free(dinp);
        free(dw);
        free(db);
    }
    release(&ts);
}

static void run_rmsnorm(const char *cs, const double *p) {
    int N = (int)p[0], C = (int)p[1];
    float eps = (float)p[2];
    size_t nc = (size_t)N * C;
    tensors ts = {0};
    float *inp = ld(&ts, cs, "inp", nc), *w = ld(&ts, cs, "w", C);
    float *want = ld(&ts, cs, "out", nc), *rstd_ref = ld(&ts, cs, "rstd", N);
    float *dout = ld(&ts, cs, "dout", nc), *dinp_ref = ld(&ts, cs, "dinp", nc);
    float *dw_ref = ld(&ts, cs, "dw", C);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(nc, 0.0f)), *rstd = take(&ts, filled(N, 0.0f));
        cllm_rmsnorm_forward(out, rstd, inp, w, N, C, eps);
        expect_close(cs, "out", out, want, nc, 1e-5, 1e-5);
        expect_close(cs, "rstd", rstd, rstd_ref, N, 1e-5, 1e-5);
        float *dinp = take(&ts, filled(nc, PREFILL)), *dw = take(&ts, filled(C, PREFILL));
        cllm_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
        expect_grad(cs, "dinp", dinp, dinp_ref, nc, 1e-5, 1e-5);
        expect_grad(cs, "dweight", dw, dw_ref, C, 1e-5, 1e-5);
    }
    release(&ts);
}

static void run_rope(const char *cs, const double *p) {
    int B = (int)p[0], T = (int)p[1], nh = (int)p[2], HS = (int)p[3];
    int rs = (int)p[4], hs = (int)p[5];
    float theta = (float)p[6];
    size_t nt = (size_t)T * (HS / 2), nb = (size_t)B * T * rs;
    tensors ts = {0};
    float *cos_ref = ld(&ts, cs, "cos", nt), *sin_ref = ld(&ts, cs, "sin", nt);
    float *x = ld(&ts, cs, "x", nb), *y_ref = ld(&ts, cs, "y", nb);
    float *dy = ld(&ts, cs, "dy", nb), *dx_ref = ld(&ts, cs, "dx", nb);
    if (all_loaded(&ts)) {
        float *cos_t = take(&ts, filled(nt, 0.0f)), *sin_t = take(&ts, filled(nt, 0.0f));
        cllm_rope_tables(cos_t, sin_t, T, HS, theta);
        /* HF builds its tables in fp32 too; allow an ulp or two of libm. */
        expect_close(cs, "cos table", cos_t, cos_ref, nt, 1e-6, 1e-6);
        expect_close(cs, "sin table", sin_t, sin_ref, nt, 1e-6, 1e-6);
        /* Untouched elements of the strided buffer must come back bit-exact,
         * which the elementwise check (rtol against their own value) sees. */
        cllm_rope_apply(x, cos_t, sin_t, B, T, nh, HS, rs, hs, 1);
        expect_close(cs, "y", x, y_ref, nb, 1e-5, 1e-5);
        cllm_rope_apply(dy, cos_t, sin_t, B, T, nh, HS, rs, hs, -1);
        expect_close(cs, "dx", dy, dx_ref, nb, 1e-5, 1e-5);
    }
    release(&ts);
}

static void run_gelu(const char *cs, const double *p) {
    long N = (long)p[0];
    tensors ts = {0};
    float *x = ld(&ts, cs, "x", N), *want = ld(&ts, cs, "out", N);
    float *dout = ld(&ts, cs, "dout", N), *dinp_ref = ld(&ts, cs, "dinp", N);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(N, 0.0f)), *dinp = take(&ts, filled(N, PREFILL));
        cllm_gelu_forward(out, x, N);
        expect_close(cs, "out", out, want, N, 1e-5, 1e-5);
        cllm_gelu_backward(dinp, dout, x, N);
        expect_grad(cs, "dinp", dinp, dinp_ref, N, 1e-5, 1e-5);
    }
    release(&ts);
}

static void run_swiglu(const char *cs, const double *p) {
    long N = (long)p[0];
    tensors ts = {0};
    float *gate = ld(&ts, cs, "gate", N), *up = ld(&ts, cs, "up", N);
    float *want = ld(&ts, cs, "out", N), *dout = ld(&ts, cs, "dout", N);
    float *dgate_ref = ld(&ts, cs, "dgate", N), *dup_ref = ld(&ts, cs, "dup", N);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(N, 0.0f));
        float *dgate = take(&ts, filled(N, PREFILL)), *dup = take(&ts, filled(N, PREFILL));
        cllm_swiglu_forward(out, gate, up, N);
        expect_close(cs, "out", out, want, N, 1e-5, 1e-5);
        cllm_swiglu_backward(dgate, dup, dout, gate, up, N);
        expect_grad(cs, "dgate", dgate, dgate_ref, N, 1e-5, 1e-5);
        expect_grad(cs, "dup", dup, dup_ref, N, 1e-5, 1e-5);
    }
    release(&ts);
}

static void run_add(const char *cs, const double *p) {
    long N = (long)p[0];
    tensors ts = {0};
    float *a = ld(&ts, cs, "a", N), *b = ld(&ts, cs, "b", N), *want = ld(&ts, cs, "out", N);
    if (all_loaded(&ts)) {
        float *out = take(&ts, filled(N, 0.0f));
        cllm_add(out, a, b, N);
        expect_close(cs, "out", out, want, N, 1e-6, 1e-6);
        cllm_add(a, a, b, N); /* aliased output */
        expect_close(cs, "out (aliased)", a, want, N, 1e-6, 1e-6);
    }
    release(&ts);
}

static void run_xent(const char *cs, const double *p) {
    int N = (int)p[0], V = (int)p[1];
    long count = (long)p[2];
    size_t nv = (size_t)N * V;
    tensors ts = {0};
    float *logits = ld(&ts, cs, "logits", nv);
    int32_t *tgt = take(&ts, load(cs, "tgt", N));
    float *losses_ref = ld(&ts, cs, "losses", N), *dlogits_ref = ld(&ts, cs, "dlogits", nv);
    if (all_loaded(&ts)) {
        float *losses = take(&ts, filled(N, -1.0f));
        long got = cllm_xent_forward(losses, logits, tgt, N, V);
        CHECK(got == count, "%s forward: counted %ld rows, want %ld", cs, got, count);
        expect_close(cs, "losses (forward)", losses, losses_ref, N, 1e-5, 1e-5);
        float *work = take(&ts, copy_of(logits, nv));
        float *losses2 = take(&ts, filled(N, -1.0f));
        got = cllm_xent_forward_backward(losses2, work, tgt, N, V, 1.0f / (float)count);
        CHECK(got == count, "%s fused: counted %ld rows, want %ld", cs, got, count);
        expect_close(cs, "losses (fused)", losses2, losses_ref, N, 1e-5, 1e-5);
        expect_close(cs, "dlogits", work, dlogits_ref, nv, 1e-5, 1e-5);
    }
    release(&ts);
}

/* Non-finite and extreme inputs of the pointwise kernels built on the
 * vectorised exp: a NaN comes out as NaN (an overflowed fp16 step must stay
 * non-finite) without converting a NaN to an integer on the way (undefined
 * in C; clang's float-cast-overflow check aborts on it), and inputs far
 * beyond the exp's clamp give finite results. */
static void test_pointwise_nonfinite(void) {
    enum { N = 6 };
    const float x[N] = {NAN, 100.0f, -100.0f, 0.0f, 1e30f, -1e30f};
    const float up[N] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    float out[N], dinp[N], dup[N];
    const float dout[N] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    cllm_gelu_forward(out, x, N);
    CHECK(isnan(out[0]), "gelu(NaN) = %g, want NaN", out[0]);
    CHECK(out[1] == 100.0f && fabsf(out[2]) < 1e-30f && out[3] == 0.0f, "gelu(100, -100, 0) = %g %g %g", out[1],
          out[2], out[3]);
    cllm_swiglu_forward(out, x, up, N);
    CHECK(isnan(out[0]), "swiglu(NaN) = %g, want NaN", out[0]);
    CHECK(check_close_f(out[1], 100.0, 1e-6, 0) && fabsf(out[2]) < 1e-30f && out[3] == 0.0f,
          "swiglu(100, -100, 0) = %g %g %g", out[1], out[2], out[3]);
    CHECK(check_close_f(out[4], 1e30, 1e-6, 0) && isfinite(out[5]), "swiglu(+-1e30) = %g %g", out[4], out[5]);
    memset(dinp, 0, sizeof dinp);
    memset(dup, 0, sizeof dup);
    cllm_swiglu_backward(dinp, dup, dout, x, up, N);
    CHECK(isnan(dinp[0]) && isfinite(dinp[1]) && isfinite(dinp[2]), "swiglu backward: %g %g %g", dinp[0], dinp[1],
          dinp[2]);
}

static const struct {
    const char *op;
    void (*run)(const char *cs, const double *params);
} OPS[] = {{"matmul", run_matmul},   {"linear", run_linear}, {"embedding", run_embedding},
           {"layernorm", run_layernorm}, {"rmsnorm", run_rmsnorm}, {"rope", run_rope},
           {"gelu", run_gelu},       {"swiglu", run_swiglu}, {"add", run_add},
           {"xent", run_xent}};

static void run_manifest(const char *dir) {
    g_dir = dir;
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        char op[32], cs[64];
        int used = 0;
        if (sscanf(line, "%31s %63s%n", op, cs, &used) != 2) continue;
        double params[16];
        int np = 0;
        char *s = line + used, *end;
        while (np < 16) {
            double v = strtod(s, &end);
            if (end == s) break;
            params[np++] = v;
            s = end;
        }
        size_t k = 0;
        while (k < sizeof OPS / sizeof OPS[0] && strcmp(OPS[k].op, op) != 0) k++;
        CHECK(k < sizeof OPS / sizeof OPS[0], "unknown op '%s' in manifest", op);
        if (k == sizeof OPS / sizeof OPS[0]) continue;
        OPS[k].run(cs, params);
        cases++;
    }
    fclose(f);
    CHECK(cases > 0, "no cases in %s", path);
    printf("%d reference cases\n", cases);
}

/* cllm_logsumexp against a float64 reference (max + log of the sum of
 * libm's double exp): rows of 1, 7, 513 and 50257 logits (a GPT-2
 * vocabulary, spread like real logits, with a spike and -inf entries),
 * within 1e-6 at three spreads; an all -inf row gives -inf. */
static void test_logsumexp(void) {
    cllm_rng r;
    cllm_rng_seed(&r, 77);
    const int sizes[] = {1, 7, 513, 50257};
    float *x = xmalloc(50257 * sizeof *x);
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const int V = sizes[t];
        for (int rep = 0; rep < 3; rep++) {
            const float spread = rep == 0 ? 1.0f : rep == 1 ? 8.0f : 30.0f;
            for (int i = 0; i < V; i++) x[i] = spread * (2.0f * cllm_rng_uniform(&r) - 1.0f) - 3.0f;
            if (V > 2) {
                x[V / 3] = 4.0f * spread; /* one dominant logit */
                x[V - 1] = -INFINITY;     /* a masked one */
            }
            double mx = -INFINITY, sum = 0.0;
            for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
            for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
            const double want = mx + log(sum), got = cllm_logsumexp(x, V);
            CHECK(fabs(got - want) <= 1e-6, "logsumexp V=%d spread %g: %.9f, float64 %.9f", V, (double)spread, got,
                  want);
        }
    }
    /* rows of -inf: shorter than one group of 8 lanes, and over several */
    for (int n = 7; n <= 37; n += 30) {
        for (int i = 0; i < n; i++) x[i] = -INFINITY;
        CHECK(cllm_logsumexp(x, n) == -INFINITY, "logsumexp of %d -inf logits: %g", n, cllm_logsumexp(x, n));
    }
    /* -FLT_MAX really there is the maximum, not -inf */
    x[20] = -FLT_MAX;
    CHECK(cllm_logsumexp(x, 37) == -FLT_MAX, "logsumexp with one -FLT_MAX: %g", cllm_logsumexp(x, 37));
    free(x);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        run_manifest(argv[1]);
    } else {
        test_matmul_naive();
        test_matmul_bf16();
        test_matmul_bf16_sliced();
        test_matmul_bf16_bound();
        test_cpu_detection();
        test_precision_conversions();
        test_matmul_args();
        test_matmul_cache();
        test_matmul_concurrent();
        test_matmul_cache_key();
        test_thread_independence();
        test_pointwise_nonfinite();
        test_logsumexp();
    }
    cllm_matmul_cleanup();
    return check_summary();
}
