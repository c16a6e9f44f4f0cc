/*
 * LayerNorm over the last dimension, as torch.nn.LayerNorm (biased
 * variance, eps inside the square root), forward and backward.
 *
 * Row statistics are summed in double (vectorised with omp simd reductions)
 * and stored as fp32 mean/rstd; the normalisation itself is fp32, in the
 * same order of operations as torch. Parameter gradients are reduced over
 * rows by column blocks, serial over rows, so they do not depend on the
 * thread count and need no scratch.
 *
 * Left out: LayerNorm without affine parameters (every model here has them).
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include <math.h>

enum { COL_BLOCK = 64 };

/* out[N,C] = (inp - mean) * rstd * weight + bias;  mean[N], rstd[N] saved.
 * mean = sum(x)/C, var = sum((x-mean)^2)/C, rstd = 1/sqrt(var + eps). */
static inline void layernorm_row(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                 const float *bias, int C, float eps, int n) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    double m = s / C, v = 0.0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) {
        double d = x[c] - m;
        v += d * d;
    }
    float mf = (float)m, rf = (float)(1.0 / sqrt(v / C + (double)eps));
    mean[n] = mf;
    rstd[n] = rf;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - mf) * rf * weight[c] + bias[c];
}

void cllm_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps) {
    if ((long)N * C < CLLM_PAR_MIN) { /* no OpenMP region for a decode step: see cllm_add */
        for (int n = 0; n < N; n++) layernorm_row(out, mean, rstd, inp, weight, bias, C, eps, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) layernorm_row(out, mean, rstd, inp, weight, bias, C, eps, n);
}

/* With xhat = (x - mean) * rstd and g = dout * weight (per row, length C):
 *   dinp    += rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dweight += sum_n dout * xhat,   dbias += sum_n dout
 * dinp[N,C], dweight[C], dbias[C] (any may be NULL); dout, inp [N,C]. */
void cllm_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
            for (int c = 0; c < C; c++) {
                float g = d[c] * weight[c];
                sg += g;
                sgx += g * ((x[c] - m) * r);
            }
            float a = (float)(sg / C), b = (float)(sgx / C);
#pragma omp simd
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * r;
                dx[c] += r * (d[c] * weight[c] - a - xhat * b);
            }
        }
    }
    if (!dweight && !dbias) return;
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
        double aw[COL_BLOCK] = {0}, ab[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C + c0, *d = dout + (size_t)n * C + c0;
            float m = mean[n], r = rstd[n];
#pragma omp simd
            for (int c = 0; c < nc; c++) {
                aw[c] += d[c] * ((x[c] - m) * r);
                ab[c] += d[c];
            }
        }
        for (int c = 0; c < nc; c++) {
            if (dweight) dweight[c0 + c] += (float)aw[c];
            if (dbias) dbias[c0 + c] += (float)ab[c];
        }
    }
}
