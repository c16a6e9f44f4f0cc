/*
 * Vocabulary-parallel embedding and cross-entropy (tensor parallelism): the
 * local passes between the caller's reductions over the tensor group; see
 * include/cllm/kernels.h. The sums follow xent.c (fp32 within blocks of
 * 512, double across blocks), so a one-rank call gives xent.c's values.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cllm/kernels.h"
#include "exp_impl.h"

#define IGNORE_INDEX (-100)
enum { SUM_BLOCK = 512 };

void cllm_xent_vp_max(float *rmax, const float *logits, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
        rmax[n] = m;
    }
}

void cllm_xent_vp_sum(double *st, float *logits, const int32_t *targets, const float *rmax, int N, int V, int v0,
                      bool store) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        int tgt = targets[n];
        st[2 * n] = st[2 * n + 1] = 0.0;
        if (tgt == IGNORE_INDEX) continue;
        if (tgt >= v0 && tgt < v0 + V) st[2 * n + 1] = (double)x[tgt - v0];
        const float m = rmax[n];
        double s = 0.0;
        for (int b0 = 0; b0 < V; b0 += SUM_BLOCK) {
            int b1 = V - b0 < SUM_BLOCK ? V : b0 + SUM_BLOCK;
            float bs = 0.0f;
            if (store) {
#pragma omp simd reduction(+ : bs)
                for (int v = b0; v < b1; v++) {
                    float e = exp_simd(x[v] - m);
                    x[v] = e;
                    bs += e;
                }
            } else {
#pragma omp simd reduction(+ : bs)
                for (int v = b0; v < b1; v++) bs += exp_simd(x[v] - m);
            }
            s += bs;
        }
        st[2 * n] = s;
    }
}

long cllm_xent_vp_finish(float *losses, float *logits, const int32_t *targets, const float *rmax, const double *st,
                         int N, int V, int v0, float dscale) {
    long counted = 0;
#pragma omp parallel for schedule(static) reduction(+ : counted)
    for (int n = 0; n < N; n++) {
        int tgt = targets[n];
        float *x = logits ? logits + (size_t)n * V : NULL;
        if (tgt == IGNORE_INDEX) {
            losses[n] = 0.0f;
            if (x) memset(x, 0, (size_t)V * sizeof *x);
            continue;
        }
        counted++;
        double s = st[2 * n];
        losses[n] = (float)((double)rmax[n] + log(s) - st[2 * n + 1]);
        if (!x) continue;
        float scale = (float)((double)dscale / s);
#pragma omp simd
        for (int v = 0; v < V; v++) x[v] *= scale;
        if (tgt >= v0 && tgt < v0 + V) x[tgt - v0] -= dscale;
    }
    return counted;
}

void cllm_embedding_vp_forward(float *out, const int32_t *tokens, const float *wte, int N, int C, int v0, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        int id = tokens[n] - v0;
        if (id < 0 || id >= V) {
            memset(o, 0, (size_t)C * sizeof *o);
            continue;
        }
        const float *w = wte + (size_t)id * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = w[c];
    }
}

void cllm_embedding_vp_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C, int v0, int V) {
#pragma omp parallel
    {
        /* whole 16-float groups of columns per thread, as embedding.c */
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int groups = (C + 15) / 16;
        int c0 = (int)((long)groups * id / nt) * 16;
        int c1 = (int)((long)groups * (id + 1) / nt) * 16;
        if (c1 > C) c1 = C;
        for (int n = 0; n < N && c0 < c1; n++) {
            int row = tokens[n] - v0;
            if (row < 0 || row >= V) continue;
            float *w = dwte + (size_t)row * C;
            const float *d = dout + (size_t)n * C;
#pragma omp simd
            for (int c = c0; c < c1; c++) w[c] += d[c];
        }
    }
}
