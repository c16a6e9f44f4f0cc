/*
 * cllm_matmul_workspace against what oneDNN really allocates inside a GEMM.
 *
 * The measurement is independent of the formula: with glibc's mmap
 * threshold fixed at 128 KiB (as `cllm` sets it) every packed-operand
 * buffer of oneDNN is a fresh mapping, so the rise of the process's peak
 * RSS during one call (VmHWM after the call minus VmRSS before it, the peak
 * reset through /proc/self/clear_refs) is the workspace the call touched.
 * Shapes: copy-based GEMMs of the sizes a training step runs (a logits
 * chunk against a vocabulary-tall head weight in the NT layout of the head
 * forward, its TN weight gradient, an NN FFN GEMM), on the CPU's own ISA
 * and thread count. The formula must be within 12% of the measurement,
 * the largest rise of up to 8 calls (threads that do not overlap in time
 * see less; the rise is the pages touched: k padding and the last panel's
 * tail are not written, so it is slightly below the formula). Also checks
 * the cases the formula answers without measuring: empty shapes, and a
 * no-copy shape (a 64-row GEMM) that allocates (almost) nothing.
 * The blocking and thread split the formula models were calibrated on
 * AVX2 CPUs; on AVX-512 CPUs (16 threads of a Sapphire Rapids measured
 * 0.1-0.9 of the formula: oneDNN gives small GEMMs fewer threads than it
 * has) only the upper bound is checked, which is what `cllm estimate`
 * needs: the formula never under-counts.
 * Skips (exit 0, "SKIP") where the peak cannot be reset (old kernels).
 * Not run under sanitizers (shadow memory is resident too).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/cpu.h"
#include "cllm/kernels.h"

static int failures;
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

/* VmRSS or VmHWM of this process in bytes, 0 if unreadable. */
static size_t status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') kb = strtoull(line + n + 1, NULL, 10);
    fclose(f);
    return kb * 1024;
}

static int reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static float *filled(size_t n) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = (float)(i % 7) * 0.25f - 0.5f;
    return p;
}

/* Runs C = op(A) op(B) once to build primitives and JIT kernels, then up
 * to 8 times more and returns the largest peak RSS rise of one call,
 * stopping once it reaches `enough`. Each thread mallocs its panels when
 * it starts and frees them when done, so on a loaded machine a thread can
 * finish before another starts and one call sees less than all panels at
 * once; the repetitions find the call where they overlap, as they do in a
 * training step's peak. */
static size_t measure(int M, int N, int K, bool ta, bool tb, size_t enough) {
    float *A = filled((size_t)M * K), *B = filled((size_t)K * N), *C = filled((size_t)M * N);
    cllm_status st = cllm_matmul(C, A, B, M, N, K, ta, tb, 1.0f, 0.0f);
    CHECK(!st, "cllm_matmul: %s", cllm_last_error());
    size_t rise = 0;
    for (int rep = 0; rep < 8 && !st && (rep == 0 || rise < enough) && reset_peak() == 0; rep++) {
        size_t before = status_kb("VmRSS");
        st = cllm_matmul(C, A, B, M, N, K, ta, tb, 1.0f, 0.0f);
        CHECK(!st, "cllm_matmul: %s", cllm_last_error());
        size_t peak = status_kb("VmHWM");
        if (peak > before && peak - before > rise) rise = peak - before;
    }
    free(A);
    free(B);
    free(C);
    return rise;
}

int main(void) {
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    if (reset_peak() != 0 || status_kb("VmHWM") == 0) {
        printf("SKIP: /proc/self/clear_refs cannot reset the peak RSS here\n");
        return 0;
    }
    CHECK(cllm_matmul_workspace(0, 8, 8, false, true, 0) == 0, "empty M");
    CHECK(cllm_matmul_workspace(8, 8, 0, false, false, 2) == 0, "empty K");
    /* 64 rows: oneDNN's no-copy kernels on every ISA with AVX; the
     * formula counts 0 and the real call allocates well under 1 MB */
    size_t small = measure(64, 256, 256, false, false, 0);
    CHECK(small < (1u << 20), "64 x 256 x 256 allocated %zu bytes", small);

    /* two-sided where the formula was calibrated, upper bound elsewhere */
    const bool calibrated = cllm_cpu()->isa < CLLM_ISA_AVX512;
    if (!calibrated) printf("AVX-512 CPU: checking the formula as an upper bound only\n");
    static const struct {
        int M, N, K;
        bool ta, tb;
        const char *what;
    } shapes[] = {
        {1024, 8192, 256, false, true, "head forward (logits chunk x V 8192, NT)"},
        {2048, 8192, 256, false, true, "head forward, 2048-row chunk"},
        {1024, 8192, 256, true, false, "TN 1024 x 8192 x 256"},
        {4096, 8192, 256, false, false, "NN 4096 x 8192 x 256"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        size_t model = cllm_matmul_workspace(shapes[i].M, shapes[i].N, shapes[i].K, shapes[i].ta, shapes[i].tb, 0);
        size_t got = measure(shapes[i].M, shapes[i].N, shapes[i].K, shapes[i].ta, shapes[i].tb, model / 100 * 88);
        printf("%-44s formula %10zu measured %10zu\n", shapes[i].what, model, got);
        if (model < (2u << 20)) {
            /* a no-copy shape on this ISA: nothing large may appear */
            CHECK(got < (2u << 20), "%s: formula %zu, measured %zu", shapes[i].what, model, got);
            continue;
        }
        CHECK((!calibrated || (double)got >= 0.88 * (double)model) && (double)got <= 1.02 * (double)model + 65536,
              "%s: formula %zu bytes, measured peak RSS rise %zu", shapes[i].what, model, got);
    }
    cllm_matmul_cleanup();
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
