/*
 * Memory bandwidth for the decode bound of bench/serve_bench.py: the best of
 * REPS passes that read (sum) and copy (memcpy) an MIB MiB float array with
 * OMP_NUM_THREADS threads, each thread on its own contiguous slice.
 *
 *   cc -O3 -march=native -fopenmp bench/membw.c -o membw
 *   OMP_NUM_THREADS=2 ./membw [MIB=512] [REPS=3]
 *   -> "read_gbs copy_gbs" (copy counts the bytes read plus the bytes written)
 *
 * Deliberately plain: no non-temporal stores, no prefetch tuning; the read
 * loop is what a GEMV over fp32 weights must at least do. The arrays ask
 * for transparent huge pages, as cllm's inference weights do
 * (cllm_alloc_huge): on 4 KiB pages a stream pays a TLB miss per page
 * (a nested page walk in a virtual machine), which understates the bound.
 */
#define _DEFAULT_SOURCE /* madvise */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 512;
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (mib < 1 || mib > (1u << 16) || reps < 1) {
        fprintf(stderr, "membw: usage: membw [MIB in 1..65536] [REPS >= 1]\n");
        return 2;
    }
    size_t n = mib << 18; /* floats */
    const size_t huge = (size_t)2 << 20; /* mib << 20 is a multiple of it */
    float *a = aligned_alloc(huge, n * sizeof(float)), *b = aligned_alloc(huge, n * sizeof(float));
    if (!a || !b) {
        fprintf(stderr, "membw: cannot allocate 2 x %zu MiB\n", mib);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(a, n * sizeof(float), MADV_HUGEPAGE);
    (void)madvise(b, n * sizeof(float), MADV_HUGEPAGE);
#endif
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i & 1023);
        b[i] = 0.0f;
    }
    double best_read = 1e30, best_copy = 1e30, sink = 0.0;
    for (int r = 0; r < reps; r++) {
        double t = omp_get_wtime();
        double total = 0.0;
#pragma omp parallel reduction(+ : total)
        {
            /* each thread sums its slice into 32 lanes (4 AVX2 registers at
             * -O3), so the adds keep up with memory */
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t lo = (n / 32) * id / nt * 32, hi = (n / 32) * (id + 1) / nt * 32;
            float acc[32] = {0};
            for (size_t i = lo; i < hi; i += 32)
                for (int j = 0; j < 32; j++) acc[j] += a[i + j];
            for (int j = 0; j < 32; j++) total += acc[j];
        }
        t = omp_get_wtime() - t;
        sink += total;
        if (t < best_read) best_read = t;

        t = omp_get_wtime();
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t lo = n * id / nt, hi = n * (id + 1) / nt;
            memcpy(b + lo, a + lo, (hi - lo) * sizeof(float));
        }
        t = omp_get_wtime() - t;
        sink += b[n / 3];
        if (t < best_copy) best_copy = t;
    }
    double bytes = (double)n * sizeof(float);
    printf("%.3f %.3f\n", bytes / best_read / 1e9, 2.0 * bytes / best_copy / 1e9);
    fprintf(stderr, "membw: checksum %g\n", sink);
    free(a);
    free(b);
    return 0;
}
