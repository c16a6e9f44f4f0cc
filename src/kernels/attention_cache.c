/*
 * Causal attention of new queries against a key/value cache, for
 * incremental decoding: T new tokens of each of B sequences sit at absolute
 * positions past..past+T-1, and query t attends to every cached key at
 * positions 0..past+t (the cache already holds the new tokens' keys).
 *
 * Dimensions: B batch, T new tokens, NH query heads, NKV key/value heads, HS
 * head size, S the cache's position capacity; query head h reads key/value
 * head g = h / (NH / NKV). Cache layout kc, vc [B, NKV, S, HS]: the keys one
 * query head reads form one contiguous [past+T, HS] block, so a decode step
 * streams it front to back.
 *
 * For the query at position p = past + t of head h:
 *   S[s] = scale * q . k_s + slope_h * (s - p),   s <= p
 *   out  = sum_s softmax(S)[s] v_s
 * The ALiBi term uses the same relative form as the training kernel; it
 * differs from HF BLOOM's slope * s only by a per-row constant, which the
 * softmax cancels.
 *
 * Each (b, h, t) row is one task: keys are visited in tiles of KT with an
 * online softmax (running max and sum, the accumulator rescaled when the
 * max grows), so no scratch is needed and the cost per row is linear in its
 * key count. Dot products and the value updates are `omp simd` loops over
 * HS. A row's arithmetic does not depend on the thread that runs it, so the
 * output is identical for any thread count.
 *
 * Left out: a backward (inference only), paged or ring-buffer caches,
 * padding masks for sequences of different lengths in one batch.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include <assert.h>
#include <math.h>
#include <stddef.h>

#include "cllm/kernels.h"

enum { KT = 64, HSMAX = CLLM_ATTN_MAX_HS };

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One query row: out[HS] = softmax(scores over keys 0..L-1) @ values.
 * k, v: [L, HS] contiguous. slope * (s - pos) is the ALiBi bias. */
static void attend_row(float *restrict out, const float *restrict q, const float *restrict k,
                       const float *restrict v, int L, int pos, int HS, float scale, float slope) {
    float acc[HSMAX];
    float sc[KT];
    float m = -INFINITY, l = 0.0f;
    for (int d = 0; d < HS; d++) acc[d] = 0.0f;
    for (int s0 = 0; s0 < L; s0 += KT) {
        const int n = L - s0 < KT ? L - s0 : KT;
        float mx = m;
        for (int j = 0; j < n; j++) {
            const float x = scale * dot(q, k + (size_t)(s0 + j) * HS, HS) + slope * (float)(s0 + j - pos);
            sc[j] = x;
            mx = x > mx ? x : mx;
        }
        /* m is -inf only before the first tile, where acc and l are zero. */
        const float corr = expf(m - mx);
        if (corr != 1.0f) {
            l *= corr;
#pragma omp simd
            for (int d = 0; d < HS; d++) acc[d] *= corr;
        }
        m = mx;
        for (int j = 0; j < n; j++) {
            const float p = expf(sc[j] - mx);
            const float *restrict vs = v + (size_t)(s0 + j) * HS;
            l += p;
#pragma omp simd
            for (int d = 0; d < HS; d++) acc[d] += p * vs[d];
        }
    }
    const float inv = 1.0f / l;
#pragma omp simd
    for (int d = 0; d < HS; d++) out[d] = acc[d] * inv;
}

void cllm_attention_forward_cached(cllm_view out, cllm_cview q, const float *kc, const float *vc,
                                   const float *alibi, int B, int T, int past, int S, int NH,
                                   int NKV, int HS, float scale) {
    assert(HS > 0 && HS <= HSMAX && NKV > 0 && NH % NKV == 0 && past >= 0 && past + T <= S);
    const int group = NH / NKV;
    const long ntask = (long)B * NH * T;
    /* Rows with more keys first: t runs backwards inside each (b, h). A
     * decode step of a small model is a few thousand multiply-adds, less
     * than waking the thread team costs: run those serially. */
    const double work = (double)ntask * (past + T) * HS;
#pragma omp parallel for schedule(dynamic, 1) if (work > 65536.0)
    for (long task = 0; task < ntask; task++) {
        const int t = T - 1 - (int)(task % T);
        const int h = (int)((task / T) % NH);
        const int b = (int)(task / ((long)T * NH));
        const int g = h / group;
        const int pos = past + t;
        const size_t base = ((size_t)b * NKV + g) * (size_t)S * HS;
        const float *qr = q.p + ((ptrdiff_t)b * T + t) * q.rs + (ptrdiff_t)h * q.hs;
        float *o = out.p + ((ptrdiff_t)b * T + t) * out.rs + (ptrdiff_t)h * out.hs;
        attend_row(o, qr, kc + base, vc + base, pos + 1, pos, HS, scale, alibi ? alibi[h] : 0.0f);
    }
}
