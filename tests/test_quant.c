/*
 * Weight formats and small-batch kernels (cllm/quant.h).
 *
 * Without arguments: the format table (names, sizes), the int8 / q4
 * kernels' activation codes (rounding, NaN, clamping, read back through
 * one-hot weights), the kernels' batch independence on random data (a
 * row's output alone equals its row of a batch, bit for bit, in every
 * variant, through the tiled prompt path) and their thread pool (the
 * output of 1 thread equals that of 3, and of 4 threads calling at once,
 * bit for bit, over many calls).
 * With a directory: the cases written by tests/ref/quant_ref.py. Each
 * weight matrix is stored by cllm_quant_matrix (from [rows, cols], and from
 * the transposed [cols, rows] layout) and must equal torch's bytes exactly;
 * every kernel variant the CPU runs (portable, avx2, avx512), and the
 * prompt path cllm_qgemm, must give torch's float64 output (int8 / q4: of
 * the Q8_0-quantized activations) to |d| <= 2e-6 * sum_k |x_k w_k| + 1e-6.
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/core.h"
#include "cllm/quant.h"

static void *read_all(const char *dir, const char *name, const char *key, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, key);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *p = malloc(bytes ? bytes : 1);
    size_t got = p ? fread(p, 1, bytes, f) : 0;
    fclose(f);
    if (got != bytes) {
        free(p);
        return NULL;
    }
    return p;
}

static const cllm_isa variants[] = {CLLM_ISA_PORTABLE, CLLM_ISA_AVX2, CLLM_ISA_AVX512};

/* Checks out [M, R] against torch's float64 y within 2e-6 * sum_k |x_k w_k|
 * + 1e-6 (w: the stored values); `via` names the path in the message. */
static void check_out(const char *name, const float *out, const float *y, const float *x, const unsigned char *q,
                      cllm_wfmt fmt, int R, int K, int M, bool in_out, const char *via) {
    double worst = 0;
    int bad = -1;
    float *wrow = malloc((size_t)K * 4);
    CHECK(wrow != NULL, "alloc");
    for (int r = 0; r < R && wrow; r++) {
        cllm_quant_dequant_row(wrow, q + (size_t)r * cllm_wfmt_row_bytes(fmt, K), fmt, K);
        for (int m = 0; m < M; m++) {
            double mag = 0;
            for (int k = 0; k < K; k++) mag += fabs((double)x[(size_t)m * K + k] * wrow[k]);
            double d = fabs((double)out[(size_t)m * R + r] - y[(size_t)m * R + r]), tol = 2e-6 * mag + 1e-6;
            if (!(d <= tol) && bad < 0) bad = m * R + r;
            if (d / tol > worst) worst = d / tol;
        }
    }
    free(wrow);
    CHECK(bad < 0, "%s: %s %dx%d M=%d%s via %s: output %d = %g, torch %g (worst %.2f of tolerance)", name,
          cllm_wfmt_name(fmt), R, K, M, in_out ? " in_out" : "", via, bad, bad >= 0 ? out[bad] : 0.0,
          bad >= 0 ? y[bad] : 0.0, worst);
}

static void run_case(const char *dir, const char *name, cllm_wfmt fmt, int R, int K, int M, bool in_out, bool has_bias) {
    size_t nw = (size_t)R * K;
    float *W = read_all(dir, name, "W", nw * 4), *x = read_all(dir, name, "x", (size_t)M * K * 4);
    float *bias = read_all(dir, name, "bias", (size_t)R * 4), *y = read_all(dir, name, "y", (size_t)M * R * 4);
    size_t qb = cllm_qweight_bytes(fmt, R, K);
    unsigned char *want_q = fmt == CLLM_WFMT_FP32 ? NULL : read_all(dir, name, "q", qb);
    unsigned char *q = malloc(qb), *qt = malloc(qb);
    float *Wt = malloc(nw * 4), *out = malloc((size_t)M * R * 4);
    CHECK(W && x && bias && y && q && qt && Wt && out && (fmt == CLLM_WFMT_FP32 || want_q), "%s: files", name);
    if (!(W && x && bias && y && q && qt && Wt && out && (fmt == CLLM_WFMT_FP32 || want_q))) goto done;
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) Wt[(size_t)k * R + r] = W[(size_t)r * K + k];
    CHECK(cllm_quant_matrix(q, fmt, W, R, K, false) == CLLM_OK, "%s: %s", name, cllm_last_error());
    CHECK(cllm_quant_matrix(qt, fmt, Wt, R, K, true) == CLLM_OK, "%s: %s", name, cllm_last_error());
    if (want_q) {
        size_t bad = 0;
        while (bad < qb && q[bad] == want_q[bad]) bad++;
        CHECK(bad == qb, "%s: %s byte %zu of %zu: %d, torch %d", name, cllm_wfmt_name(fmt), bad, qb,
              bad < qb ? q[bad] : 0, bad < qb ? want_q[bad] : 0);
    }
    CHECK(memcmp(q, qt, qb) == 0, "%s: stored from the transposed layout differs", name);
    /* the dequantized row agrees with the stored values the kernels use */
    cllm_qweight w = {.fmt = fmt, .data = q, .rows = R, .cols = K};
    if (fmt == CLLM_WFMT_FP32 && in_out) w.data = Wt, w.in_out = true;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        if (variants[v] > cllm_cpu()->isa) continue;
        memset(out, 0xff, (size_t)M * R * 4);
        void *scratch = malloc(cllm_qmatmul_scratch_bytes(fmt, K, M) + 1);
        cllm_qmatmul_isa(out, x, &w, has_bias ? bias : NULL, M, scratch, variants[v]);
        free(scratch);
        check_out(name, out, y, x, q, fmt, R, K, M, in_out, cllm_isa_name(variants[v]));
    }
    /* the prompt path, against the same float64 reference: panels of
     * widened rows on oneDNN (int8 / q4: of the rounded activations), and
     * where the CPU has VNNI the integer tiles cllm_qgemm takes there */
    for (int path = 0; path < 2; path++) {
        const cllm_isa isa = path == 0 ? CLLM_ISA_AVX2 : CLLM_ISA_COUNT;
        if (path == 1 && strcmp(cllm_qgemm_variant(fmt), "avx512-vnni") != 0) break;
        memset(out, 0xff, (size_t)M * R * 4);
        void *scratch = malloc(cllm_qgemm_scratch_bytes(fmt, K, M) + 1);
        CHECK(scratch && cllm_qgemm_isa(out, x, &w, has_bias ? bias : NULL, M, scratch, isa) == CLLM_OK,
              "%s: qgemm: %s", name, cllm_last_error());
        free(scratch);
        check_out(name, out, y, x, q, fmt, R, K, M, in_out, path == 0 ? "qgemm panels" : "qgemm avx512-vnni");
    }
done:
    free(W), free(x), free(bias), free(y), free(want_q), free(q), free(qt), free(Wt), free(out);
}

static int run_dir(const char *dir) {
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return check_summary();
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        char op[16], name[64], fmt_name[16];
        int R, K, M, in_out, has_bias;
        if (sscanf(line, "%15s %63s %15s %d %d %d %d %d", op, name, fmt_name, &R, &K, &M, &in_out, &has_bias) != 8)
            continue;
        cllm_wfmt fmt;
        CHECK(cllm_wfmt_from_name(fmt_name, &fmt), "unknown format %s", fmt_name);
        run_case(dir, name, fmt, R, K, M, in_out, has_bias);
        cases++;
    }
    fclose(f);
    CHECK(cases > 0, "no cases in %s", path);
    printf("%d reference cases, kernel variant %s, int8 / q4 prompts on %s\n", cases, cllm_qmatmul_variant(),
           cllm_qgemm_variant(CLLM_WFMT_INT8));
    return check_summary();
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A row computed alone equals the same row inside batches of 2, 19 and
 * 70, bit for bit, for every format and variant: the int8 / q4 batches run
 * on 2-row by 4-token tiles in passes of 64 tokens, q4 rows alone and in a
 * batch of 2 on groups of 4 rows, and 71 rows and these batch sizes leave
 * rows and tokens over for the one-output path. K: 1000 (32 blocks of 32,
 * the last partial) and 976 (31 blocks: the odd last block that the
 * two-blocks-a-step q4 kernel adds on its own). */
static void batch_independence(int K) {
    const int R = 71, MMAX = 70; /* 70 x K inputs: quantized on the pool */
    float *W = malloc((size_t)R * K * 4), *x = malloc((size_t)MMAX * K * 4);
    float *out = malloc((size_t)MMAX * R * 4), *one = malloc((size_t)R * 4);
    void *scratch = malloc(cllm_qmatmul_scratch_bytes(CLLM_WFMT_Q4, K, MMAX));
    unsigned char *q = malloc(cllm_qweight_bytes(CLLM_WFMT_FP32, R, K));
    CHECK(W && x && out && one && q && scratch, "alloc");
    if (!(W && x && out && one && q && scratch)) goto done;
    for (int i = 0; i < R * K; i++) W[i] = frand();
    for (int i = 0; i < MMAX * K; i++) x[i] = frand();
    for (int f = 0; f < CLLM_WFMT_COUNT; f++)
        for (int t = 0; t < (f == CLLM_WFMT_FP32 ? 2 : 1); t++) {
            cllm_qweight w = {.fmt = (cllm_wfmt)f, .data = q, .rows = R, .cols = K, .in_out = t == 1};
            /* in_out: the same values read as a [K, R] matrix */
            CHECK(cllm_quant_matrix(q, (cllm_wfmt)f, W, t ? K : R, t ? R : K, false) == CLLM_OK, "quant");
            for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
                if (variants[v] > cllm_cpu()->isa) continue;
                for (int mi = 0; mi < 3; mi++) {
                    const int M = (const int[]){2, 19, MMAX}[mi];
                    cllm_qmatmul_isa(out, x, &w, NULL, M, scratch, variants[v]);
                    bool same = true;
                    for (int m = 0; m < M && same; m++) {
                        cllm_qmatmul_isa(one, x + (size_t)m * K, &w, NULL, 1, scratch, variants[v]);
                        same = memcmp(one, out + (size_t)m * R, (size_t)R * 4) == 0;
                    }
                    CHECK(same, "%s%s via %s: a row alone differs from its row in a batch of %d",
                          cllm_wfmt_name((cllm_wfmt)f), t ? " in_out" : "", cllm_isa_name(variants[v]), M);
                }
            }
        }
done:
    free(W), free(x), free(out), free(one), free(q), free(scratch);
}

/* The thread pool of the kernels: a matrix large enough to be cut into
 * chunks gives the same bytes with 1 thread, with 3 (two helpers, more
 * threads than this machine may have cores, so helpers get descheduled
 * mid-job), and from 4 threads calling at once (one gets the pool, the
 * others run alone), 40 calls each. */
enum { PR = 1000, PK = 544, PM = 3, PCALLS = 40 };
typedef struct {
    const cllm_qweight *w;
    const float *x, *want;
    bool same;
} pool_arg;

static void *pool_caller(void *p) {
    pool_arg *a = p;
    float *out = malloc((size_t)PM * PR * 4);
    void *scratch = malloc(cllm_qmatmul_scratch_bytes(CLLM_WFMT_Q4, PK, PM));
    a->same = out && scratch;
    for (int i = 0; i < PCALLS && a->same; i++) {
        memset(out, 0, (size_t)PM * PR * 4);
        cllm_qmatmul(out, a->x, a->w, NULL, PM, scratch);
        a->same = memcmp(out, a->want, (size_t)PM * PR * 4) == 0;
    }
    free(out), free(scratch);
    return NULL;
}

static void pool_threads(void) {
    float *W = malloc((size_t)PR * PK * 4), *x = malloc((size_t)PM * PK * 4), *want = malloc((size_t)PM * PR * 4);
    unsigned char *q = malloc(cllm_qweight_bytes(CLLM_WFMT_FP32, PR, PK));
    void *scratch = malloc(cllm_qmatmul_scratch_bytes(CLLM_WFMT_Q4, PK, PM));
    CHECK(W && x && want && q && scratch, "alloc");
    if (!(W && x && want && q && scratch)) goto done;
    for (int i = 0; i < PR * PK; i++) W[i] = frand();
    for (int i = 0; i < PM * PK; i++) x[i] = frand();
    const int threads0 = omp_get_max_threads();
    for (int f = 0; f <= CLLM_WFMT_COUNT; f++) {
        /* the last pass: fp32 read as GPT-2's [cols, rows] (in_out) */
        const bool in_out = f == CLLM_WFMT_COUNT;
        if (in_out) f = CLLM_WFMT_FP32;
        cllm_qweight w = {.fmt = (cllm_wfmt)f, .data = q, .rows = PR, .cols = PK, .in_out = in_out};
        CHECK(cllm_quant_matrix(q, (cllm_wfmt)f, W, in_out ? PK : PR, in_out ? PR : PK, false) == CLLM_OK, "quant");
        omp_set_num_threads(1);
        cllm_qmatmul(want, x, &w, NULL, PM, scratch);
        if ((f == CLLM_WFMT_INT8 || f == CLLM_WFMT_Q4) && cllm_cpu()->isa >= CLLM_ISA_AVX2) {
            /* the integer dots are exact: avx512 (with VNNI where the CPU has
             * it) gives avx2's bytes */
            float *v = malloc((size_t)PM * PR * 4), *v2 = malloc((size_t)PM * PR * 4);
            CHECK(v && v2, "alloc");
            if (v && v2) {
                cllm_qmatmul_isa(v, x, &w, NULL, PM, scratch, CLLM_ISA_AVX2);
                cllm_qmatmul_isa(v2, x, &w, NULL, PM, scratch, CLLM_ISA_AVX512);
                CHECK(memcmp(v, v2, (size_t)PM * PR * 4) == 0, "%s: %s differs from avx2",
                      cllm_wfmt_name((cllm_wfmt)f), cllm_qmatmul_variant());
            }
            free(v), free(v2);
        }
        omp_set_num_threads(3);
        pool_arg one = {.w = &w, .x = x, .want = want};
        pool_caller(&one);
        CHECK(one.same, "%s%s: 3 threads differ from 1", cllm_wfmt_name((cllm_wfmt)f), in_out ? " in_out" : "");
        pool_arg args[4];
        pthread_t th[4];
        int started = 0;
        for (int t = 0; t < 4; t++) {
            args[t] = one;
            if (pthread_create(&th[t], NULL, pool_caller, &args[t]) == 0) started++;
            else break;
        }
        for (int t = 0; t < started; t++) {
            pthread_join(th[t], NULL);
            CHECK(args[t].same, "%s%s: caller %d of 4 at once differs from 1 thread", cllm_wfmt_name((cllm_wfmt)f),
                  in_out ? " in_out" : "", t);
        }
        CHECK(started == 4, "pthread_create");
        if (in_out) break;
    }
    omp_set_num_threads(threads0);
done:
    free(W), free(x), free(want), free(q), free(scratch);
}

static void formats(void) {
    cllm_wfmt f;
    CHECK(cllm_wfmt_from_name("q4", &f) && f == CLLM_WFMT_Q4, "q4");
    CHECK(cllm_wfmt_from_name("int8", &f) && f == CLLM_WFMT_INT8, "int8");
    CHECK(!cllm_wfmt_from_name("q5", &f) && !cllm_wfmt_from_name(NULL, &f), "unknown names refused");
    CHECK(cllm_wfmt_row_bytes(CLLM_WFMT_Q4, 33) == 36 && cllm_wfmt_row_bytes(CLLM_WFMT_INT8, 64) == 68 &&
              cllm_wfmt_row_bytes(CLLM_WFMT_BF16, 3) == 6 && cllm_wfmt_row_bytes(CLLM_WFMT_FP32, 3) == 12,
          "row bytes");
    CHECK(cllm_quant_matrix(NULL, CLLM_WFMT_COUNT, NULL, 1, 1, false) == CLLM_ERR_ARG, "bad format refused");
    /* a q4 block of integers -8..7: m = -8, d = 1, q = x + 8 */
    float row[32];
    for (int i = 0; i < 32; i++) row[i] = (float)(i % 16) - 8.0f;
    unsigned char b[CLLM_Q4_BLOCK_BYTES];
    cllm_quant_q4_0_row(b, row, 32);
    float back[32];
    cllm_quant_dequant_row(back, b, CLLM_WFMT_Q4, 32);
    bool exact = true;
    for (int i = 0; i < 32; i++) exact &= back[i] == row[i];
    CHECK(exact, "q4 round trip of integers -8..7");
    /* non-finite values: defined codes, no undefined conversion (UBSan) */
    row[3] = NAN, row[5] = INFINITY, row[7] = -INFINITY;
    unsigned char b8[CLLM_Q8_BLOCK_BYTES];
    cllm_quant_q8_0_row(b8, row, 32);
    cllm_quant_q4_0_row(b, row, 32);
    CHECK(cllm_quant_code8(NAN) == 0 && cllm_quant_code8(1e30f) == 127 && cllm_quant_code8(-1e30f) == -127 &&
              cllm_quant_code8(-2.5f) == -3 && cllm_quant_code8(2.49f) == 2,
          "int8 codes: NaN 0, clamped, half away from zero");
}

/* The kernels' activation codes, read back through one-hot int8 weight
 * rows (row r: 1.0 at input r, so output r = 127 * code_r * d_w * d_x):
 * rounding half away from zero, NaN as 0 in max|x| and in its code, values
 * at the scale's edge; alone and in a batch of 9 tokens (the tiled path),
 * in every variant. */
static void activation_codes(void) {
    enum { K = 32, M = 9 };
    float W[K * K] = {0}, x[M * K], out[M * K];
    const float v[] = {127.0f, 2.5f, -2.5f, 0.49999997f, -0.5f, NAN, 126.5f, -126.49999f, 1e-30f, -0.0f, 1.5f};
    for (int i = 0; i < K; i++) {
        W[i * K + i] = 1.0f;
        x[i] = i < (int)(sizeof v / sizeof v[0]) ? v[i] : (float)i * 0.37f - 5.0f;
    }
    for (int m = 1; m < M; m++) memcpy(x + m * K, x, sizeof(float) * K);
    unsigned char q[K * CLLM_Q8_BLOCK_BYTES];
    float scratch[M * 68 / sizeof(float)]; /* float-aligned, as the model's scratch is */
    CHECK(cllm_quant_matrix(q, CLLM_WFMT_INT8, W, K, K, false) == CLLM_OK, "quant");
    CHECK(cllm_qmatmul_scratch_bytes(CLLM_WFMT_INT8, K, M) <= sizeof scratch, "scratch");
    cllm_qweight w = {.fmt = CLLM_WFMT_INT8, .data = q, .rows = K, .cols = K};
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        if (variants[vi] > cllm_cpu()->isa) continue;
        for (int n = 1; n <= M; n += M - 1) {
            cllm_qmatmul_isa(out, x, &w, NULL, n, scratch, variants[vi]);
            int bad = -1;
            for (int i = 0; i < n * K && bad < 0; i++) {
                const unsigned char *blk = q + (i % K) * CLLM_Q8_BLOCK_BYTES;
                float dw = cllm_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                /* max|x| = 127: d_x = 1, the codes are the rounded values */
                float want = (float)(127 * cllm_quant_code8(x[i % K])) * (dw * 1.0f);
                if (memcmp(&want, &out[i], sizeof want)) bad = i;
            }
            CHECK(bad < 0, "activation codes via %s, %d tokens: output %d = %g for x = %g", cllm_isa_name(variants[vi]),
                  n, bad, bad >= 0 ? out[bad] : 0.0, bad >= 0 ? x[bad % K] : 0.0);
        }
    }
}

int main(int argc, char **argv) {
    if (argc > 1) return run_dir(argv[1]);
    formats();
    activation_codes();
    batch_independence(1000);
    batch_independence(976);
    pool_threads();
    printf("kernel variant %s\n", cllm_qmatmul_variant());
    return check_summary();
}
