/*
 * Fused softmax + cross-entropy over the vocabulary, in place: the logits
 * buffer becomes the gradient, so the [N,V] probability tensor (the largest
 * activation of a small model) never exists.
 *
 * Per row: max, then sum of exp(x - max) (exp from exp_impl.h, summed in
 * fp32 within blocks of 512 and in double across blocks, so the pass
 * vectorises and the sum stays accurate for a 50k vocabulary); the loss is
 * max + log(sum) - x[target]. In the fused variant exp(x - max) is written
 * over the logits on the way and rescaled in a last pass. Rows are
 * independent and parallel; the counted-row total is an integer reduction.
 *
 * Left out: label smoothing, class weights, and target validation (the
 * caller checks targets against V once, at the data boundary).
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"
#include "exp_impl.h"

#include <math.h>
#include <string.h>

#define IGNORE_INDEX (-100)

/* The largest logit; -inf for a row of -inf. Eight lanes that start at -inf
 * (the compiler vectorises the fixed-width loop), not an OpenMP max
 * reduction: OpenMP leaves its start value to the implementation (clang's is
 * -FLT_MAX, GCC's -inf), which made a row of -inf read -FLT_MAX. */
static float row_max(const float *x, int V) {
    float lane[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int v = 0;
    for (; v + 8 <= V; v += 8)
        for (int i = 0; i < 8; i++) lane[i] = x[v + i] > lane[i] ? x[v + i] : lane[i];
    for (; v < V; v++) lane[0] = x[v] > lane[0] ? x[v] : lane[0];
    float m = lane[0];
    for (int i = 1; i < 8; i++) m = lane[i] > m ? lane[i] : m;
    return m;
}

enum { SUM_BLOCK = 512 };

/* Returns sum_v exp(x[v] - m) and replaces x[v] by exp(x[v] - m). */
static double sum_exp_store(float *x, int V, float m) {
    double s = 0.0;
    for (int v0 = 0; v0 < V; v0 += SUM_BLOCK) {
        int v1 = V - v0 < SUM_BLOCK ? V : v0 + SUM_BLOCK;
        float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
        for (int v = v0; v < v1; v++) {
            float e = exp_simd(x[v] - m);
            x[v] = e;
            bs += e;
        }
        s += bs;
    }
    return s;
}

/* Returns sum_v exp(x[v] - m); x is not modified. */
static double sum_exp(const float *x, int V, float m) {
    double s = 0.0;
    for (int v0 = 0; v0 < V; v0 += SUM_BLOCK) {
        int v1 = V - v0 < SUM_BLOCK ? V : v0 + SUM_BLOCK;
        float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
        for (int v = v0; v < v1; v++) bs += exp_simd(x[v] - m);
        s += bs;
    }
    return s;
}

/* losses[N]: logsumexp(logits[n]) - logits[n, target[n]], 0 for ignored rows.
 * logits[N,V] is overwritten by dscale * (softmax(logits[n]) - onehot(target))
 * (zeros on ignored rows). targets[N]. Returns the number of counted rows. */
long cllm_xent_forward_backward(float *losses, float *logits, const int32_t *targets, int N, int V,
                                float dscale) {
    long counted = 0;
#pragma omp parallel for schedule(static) reduction(+ : counted)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        int tgt = targets[n];
        if (tgt == IGNORE_INDEX) {
            losses[n] = 0.0f;
            memset(x, 0, (size_t)V * sizeof *x);
            continue;
        }
        counted++;
        float m = row_max(x, V), xt = x[tgt];
        double s = sum_exp_store(x, V, m);
        losses[n] = (float)((double)m + log(s) - (double)xt);
        float scale = (float)((double)dscale / s);
#pragma omp simd
        for (int v = 0; v < V; v++) x[v] *= scale;
        x[tgt] -= dscale;
    }
    return counted;
}

/* Forward only: losses[N] as above; logits[N,V] is not modified. */
long cllm_xent_forward(float *losses, const float *logits, const int32_t *targets, int N, int V) {
    long counted = 0;
#pragma omp parallel for schedule(static) reduction(+ : counted)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        int tgt = targets[n];
        if (tgt == IGNORE_INDEX) {
            losses[n] = 0.0f;
            continue;
        }
        counted++;
        float m = row_max(x, V);
        double s = sum_exp(x, V, m);
        losses[n] = (float)((double)m + log(s) - (double)x[tgt]);
    }
    return counted;
}

/* ln sum_v exp(x[v]): the row's max plus the log of sum_exp's sum (the
 * same vectorised exp and blocked sum as the loss), in double. A row with
 * no finite maximum returns that maximum (-inf, +inf or NaN). */
double cllm_logsumexp(const float *x, int V) {
    const float m = row_max(x, V);
    if (!isfinite(m)) return m;
    return (double)m + log(sum_exp(x, V, m));
}
