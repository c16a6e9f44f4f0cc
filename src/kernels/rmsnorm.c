/*
 * RMSNorm as HF's LlamaRMSNorm in fp32: out = weight * (x * rstd),
 * rstd = 1/sqrt(mean(x^2) + eps), forward and backward.
 *
 * The mean square is summed in double; the scaling is fp32 in torch's
 * order. The weight gradient is reduced over rows by column blocks, serial
 * over rows (thread-count independent, no scratch).
 *
 * Left out: the "1 + weight" (Gemma) variant and no-weight RMSNorm.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include <math.h>

enum { COL_BLOCK = 64 };

/* out[N,C] = weight * (inp * rstd);  rstd[N] saved for backward. */
static inline void rmsnorm_row(float *out, float *rstd, const float *inp, const float *weight, int n, int C,
                               float eps) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    rstd[n] = r;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = weight[c] * (x[c] * r);
}

void cllm_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps) {
    if ((long)N * C < CLLM_PAR_MIN) { /* no OpenMP region for a few rows: see cllm_add */
        for (int n = 0; n < N; n++) rmsnorm_row(out, rstd, inp, weight, n, C, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) rmsnorm_row(out, rstd, inp, weight, n, C, eps);
}

/* With xhat = x * rstd and g = dout * weight (per row):
 *   dinp    += rstd * (g - xhat * mean(g * xhat))
 *   dweight += sum_n dout * xhat
 * dinp[N,C], dweight[C] (either may be NULL); dout, inp [N,C]; rstd[N]. */
void cllm_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float r = rstd[n];
            double sgx = 0.0;
#pragma omp simd reduction(+ : sgx)
            for (int c = 0; c < C; c++) sgx += (d[c] * weight[c]) * (x[c] * r);
            float b = (float)(sgx / C);
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += r * (d[c] * weight[c] - (x[c] * r) * b);
        }
    }
    if (!dweight) return;
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
        double aw[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C + c0, *d = dout + (size_t)n * C + c0;
            float r = rstd[n];
#pragma omp simd
            for (int c = 0; c < nc; c++) aw[c] += d[c] * (x[c] * r);
        }
        for (int c = 0; c < nc; c++) dweight[c0 + c] += (float)aw[c];
    }
}
