/*
 * Token (+ learned position) embedding lookup and its gradient scatter.
 *
 * The backward is deterministic without atomics: dwte is split into column
 * ranges, one per thread, and each thread walks all rows in order, so every
 * dwte element is summed in row order whatever the thread count. dwpe is
 * parallel over positions and serial over the batch.
 *
 * Left out: token id validation (the caller checks ids against V once, at
 * the data boundary) and sparse gradients.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include <omp.h>

/* out[N,C] = wte[tokens[n], :] + wpe[n % T, :] (wpe may be NULL).
 * tokens[N], wte[V,C], wpe[T,C]. */
static inline void embed_row(float *out, const int32_t *tokens, const float *wte, const float *wpe, int T, int C,
                             int n) {
    float *o = out + (size_t)n * C;
    const float *w = wte + (size_t)tokens[n] * C;
    if (wpe) {
        const float *p = wpe + (size_t)(n % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = w[c] + p[c];
    } else {
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = w[c];
    }
}

void cllm_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int N, int T, int C) {
    if ((long)N * C < CLLM_PAR_MIN) { /* no OpenMP region for a decode step: see cllm_add */
        for (int n = 0; n < N; n++) embed_row(out, tokens, wte, wpe, T, C, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) embed_row(out, tokens, wte, wpe, T, C, n);
}

/* dwte[V,C] += sum over n with tokens[n]==v of dout[n,:]
 * dwpe[T,C] += sum over n with n%T==t of dout[n,:]   (either may be NULL)
 * dout[N,C]. V is the row count of dwte (documentation of the shape only). */
void cllm_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int N, int T, int C, int V) {
    (void)V;
#pragma omp parallel
    {
        /* Column range of this thread, in whole 16-float (64-byte) groups so
         * two threads never write the same cache line of a row. */
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int groups = (C + 15) / 16;
        int c0 = (int)((long)groups * id / nt) * 16;
        int c1 = (int)((long)groups * (id + 1) / nt) * 16;
        if (c1 > C) c1 = C;
        for (int n = 0; n < N && c0 < c1 && dwte; n++) {
            float *w = dwte + (size_t)tokens[n] * C;
            const float *d = dout + (size_t)n * C;
#pragma omp simd
            for (int c = c0; c < c1; c++) w[c] += d[c];
        }
        if (dwpe) {
#pragma omp for schedule(static)
            for (int t = 0; t < T; t++) {
                float *p = dwpe + (size_t)t * C;
                for (int n = t; n < N; n += T) {
                    const float *d = dout + (size_t)n * C;
#pragma omp simd
                    for (int c = 0; c < C; c++) p[c] += d[c];
                }
            }
        }
    }
}
