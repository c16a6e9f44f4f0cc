/*
 * Small-batch matmul speed: cllm's own kernels (cllm/quant.h) for fp32, bf16,
 * int8 and q4 weights against oneDNN's fp32 linear layer (cllm_linear_forward)
 * on the matrices of one gpt2-124M decode step, M = 1, 4 and 16 rows. oneDNN
 * reads the Conv1D layers in their file layout [in, out] (what a model
 * without cllm_model_set_inference runs), every format of cllm's kernels
 * reads them [out, in] (fp32 included: what generate and serve run).
 * Interleaved (oneDNN, then each format, round after round); prints the median
 * time of a whole step's matrices per format, its weight read rate in GB/s, and
 * the speed-up over oneDNN.
 *
 * Run: build/bench/qmatmul_bench [rounds [only]] (threads from OMP_NUM_THREADS);
 * `only` (onednn, fp32, bf16, int8, q4) times that one alone at M = 1, for
 * `perf stat` cycle counts, which a loaded machine does not distort.
 * QMATMUL_BENCH_CLOCK=cpu times CPU seconds, not wall-clock ones (1 thread on a
 * shared machine). QMATMUL_BENCH_M="1,64" picks the row counts (at most 4, each 1 .. 512; the
 * default is 1,4,16); 4 or more rows exercise the tiled prompt kernels of
 * int8 / q4, and the GB/s column then counts the weights once per call.
 * From 16 rows the prompt path cllm_qgemm (panels of widened rows on
 * oneDNN, what a model runs from CLLM_QGEMM_MIN_ROWS rows) is timed too, for
 * bf16, int8 and q4 ("int8-panels" ...), in the same rounds, and on a CPU
 * with AVX512-VNNI its integer tiles for int8 and q4 ("int8-vnni", what
 * cllm_qgemm runs there), from 4 rows.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cllm/kernels.h"
#include "cllm/quant.h"

typedef struct {
    int rows, cols; /* out, in */
    bool in_out;    /* GPT-2 Conv1D */
    int count;      /* per decode step */
} shape;

static const shape shapes[] = {
    {2304, 768, true, 12}, {768, 768, true, 12}, {3072, 768, true, 12}, {768, 3072, true, 12}, {50257, 768, false, 1}};
/* the formats on cllm_qmatmul, oneDNN, then bf16 / int8 / q4 on cllm_qgemm's
 * panels, then int8 / q4 on its VNNI tiles (where the CPU has VNNI) */
enum { NS = sizeof shapes / sizeof shapes[0], ONEDNN = CLLM_WFMT_COUNT, VNNI0 = CLLM_WFMT_COUNT + 4, NF = CLLM_WFMT_COUNT + 6 };
static cllm_wfmt fmt_of(int f) {
    if (f < ONEDNN) return (cllm_wfmt)f;
    if (f >= VNNI0) return f == VNNI0 ? CLLM_WFMT_INT8 : CLLM_WFMT_Q4;
    return f > ONEDNN ? (cllm_wfmt)(f - ONEDNN) : CLLM_WFMT_FP32;
}
static bool skip(int f, int M) {
    if (f >= VNNI0) return M < 4 || strcmp(cllm_qgemm_variant(CLLM_WFMT_INT8), "avx512-vnni") != 0;
    return f > ONEDNN && M < 16;
}

/* QMATMUL_BENCH_CLOCK=cpu: CPU time of the process instead of wall-clock
 * time; with one thread on a machine shared with other work it counts only
 * the time the kernels ran, not the time they waited for a core. */
static double now(void) {
    static int cpu = -1;
    if (cpu < 0) cpu = getenv("QMATMUL_BENCH_CLOCK") && !strcmp(getenv("QMATMUL_BENCH_CLOCK"), "cpu");
    struct timespec t;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 64-byte aligned, as a model's buffers are (cllm_alloc) */
static void *amalloc(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1) rounds = 1;
    void *store[NS][CLLM_WFMT_COUNT];
    float *W[NS], *x = NULL, *out = NULL;
    size_t max_out = 0;
    for (int s = 0; s < NS; s++) {
        size_t n = (size_t)shapes[s].rows * shapes[s].cols;
        W[s] = malloc(n * 4);
        for (size_t i = 0; i < n; i++) W[s][i] = (float)((i * 2654435761u) % 1000) * 1e-4f - 0.05f;
        for (int f = 0; f < CLLM_WFMT_COUNT; f++) {
            store[s][f] = cllm_alloc_huge(cllm_qweight_bytes((cllm_wfmt)f, shapes[s].rows, shapes[s].cols), "weights");
            cllm_quant_matrix(store[s][f], (cllm_wfmt)f, W[s], shapes[s].rows, shapes[s].cols, shapes[s].in_out);
        }
        if ((size_t)shapes[s].rows > max_out) max_out = (size_t)shapes[s].rows;
    }
    enum { MAXM = 512 };
    x = amalloc(MAXM * 3072 * 4);
    size_t sb = cllm_qmatmul_scratch_bytes(CLLM_WFMT_Q4, 3072, MAXM), gb = cllm_qgemm_scratch_bytes(CLLM_WFMT_INT8, 3072, MAXM);
    void *scratch = malloc(sb > gb ? sb : gb);
    out = amalloc(MAXM * max_out * 4);
    for (int i = 0; i < MAXM * 3072; i++) x[i] = (float)(i % 7) * 0.1f;
    printf("qmatmul_bench: gpt2-124M decode-step matrices, %d threads, kernel variant %s, %d rounds\n",
           omp_get_max_threads(), cllm_qmatmul_variant(), rounds);
    int Ms[4] = {1, 4, 16}, nm = 3;
    const char *ms = getenv("QMATMUL_BENCH_M");
    if (ms) {
        nm = 0;
        for (char *e; *ms && nm < 4; ms = *e ? e + 1 : e) {
            long v = strtol(ms, &e, 10);
            if (e == ms || v < 1 || v > MAXM || (*e && *e != ',')) {
                fprintf(stderr, "qmatmul_bench: QMATMUL_BENCH_M: row counts 1 .. %d separated by commas\n", MAXM);
                return 2;
            }
            Ms[nm++] = (int)v;
        }
    }
    const char *only_shape = getenv("QMATMUL_BENCH_SHAPE"); /* a digit: time that matrix alone */
    if (argc > 2) {
        cllm_wfmt f = CLLM_WFMT_COUNT;
        if (strcmp(argv[2], "onednn") && !cllm_wfmt_from_name(argv[2], &f)) return 2;
        for (int r = 0; r < rounds; r++)
            for (int s = 0; s < NS; s++)
                for (int c = 0; c < shapes[s].count; c++) {
                    cllm_qweight w = {f, f < CLLM_WFMT_COUNT ? store[s][f] : NULL, shapes[s].rows, shapes[s].cols,
                                      false};
                    if (f == CLLM_WFMT_COUNT)
                        cllm_linear_forward(out, x, W[s], NULL, 1, shapes[s].cols, shapes[s].rows, shapes[s].in_out);
                    else
                        cllm_qmatmul(out, x, &w, NULL, 1, scratch);
                }
        return 0;
    }
    for (int mi = 0; mi < nm; mi++) {
        int M = Ms[mi];
        double *t = calloc((size_t)rounds * NF, sizeof *t);
        for (int r = 0; r < rounds; r++)
            for (int f = 0; f < NF; f++) {
                if (skip(f, M)) continue;
                double t0 = now();
                for (int s = 0; s < NS; s++)
                    for (int c = 0; c < shapes[s].count && (!only_shape || only_shape[0] - '0' == s); c++) {
                        cllm_qweight w = {fmt_of(f), store[s][fmt_of(f)], shapes[s].rows, shapes[s].cols, false};
                        if (f == ONEDNN)
                            cllm_linear_forward(out, x, W[s], NULL, M, shapes[s].cols, shapes[s].rows, shapes[s].in_out);
                        else if (f > ONEDNN)
                            cllm_qgemm_isa(out, x, &w, NULL, M, scratch, f >= VNNI0 ? CLLM_ISA_COUNT : CLLM_ISA_AVX2);
                        else
                            cllm_qmatmul(out, x, &w, NULL, M, scratch);
                    }
                t[f * rounds + r] = now() - t0;
            }
        double base = 0;
        for (int f = ONEDNN; f >= 0; f = f == ONEDNN ? NF - 1 : f == ONEDNN + 1 ? ONEDNN - 1 : f - 1) {
            if (skip(f, M)) continue;
            qsort(t + f * rounds, (size_t)rounds, sizeof *t, cmp);
            double med = t[f * rounds + rounds / 2], bytes = 0;
            for (int s = 0; s < NS; s++)
                bytes += (double)shapes[s].count *
                         (double)cllm_qweight_bytes(fmt_of(f), shapes[s].rows, shapes[s].cols);
            if (f == ONEDNN) base = med;
            char label[32];
            snprintf(label, sizeof label, "%s%s", f == ONEDNN ? "onednn-fp32" : cllm_wfmt_name(fmt_of(f)),
                     f >= VNNI0 ? "-vnni" : f > ONEDNN ? "-panels" : "");
            printf("  M=%-3d %-12s %8.2f ms  %6.1f GB/s  %5.2fx oneDNN fp32\n", M, label, med * 1e3, bytes / med * 1e-9,
                   base / med);
        }
        free(t);
    }
    for (int s = 0; s < NS; s++) {
        free(W[s]);
        for (int f = 0; f < CLLM_WFMT_COUNT; f++) free(store[s][f]);
    }
    free(x), free(out), free(scratch);
    return 0;
}
