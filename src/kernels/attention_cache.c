/*
 * Causal attention of new queries against a paged key/value cache, for
 * incremental decoding and batches of sequences at different positions
 * (ragged): the new rows of sequence i sit at absolute positions
 * past[i]..past[i]+n_i-1, and each attends to every cached key of its own
 * sequence at positions 0..its own (the cache already holds the new rows'
 * keys).
 *
 * Dimensions: NH query heads, NKV key/value heads, HS head size, BS
 * positions per cache block; query head h reads key/value head
 * g = h / (NH / NKV). A layer's pool is [n_blocks, NKV, BS, HS]: within a
 * block, the keys one query head reads form one contiguous [BS, HS] run, so
 * a decode step streams each block front to back. A contiguous cache is
 * the case of one block of S positions per sequence.
 *
 * For the query at position p = past + t of head h:
 *   S[s] = scale * q . k_s + slope_h * (s - p),   s <= p
 *   out  = sum_s softmax(S)[s] v_s
 * The ALiBi term uses the same relative form as the training kernel; it
 * differs from HF BLOOM's slope * s only by a per-row constant, which the
 * softmax cancels.
 *
 * Each (row, head) is one task: keys are visited in tiles of KT with an
 * online softmax (running max and sum, the accumulator rescaled when the
 * max grows), so no scratch is needed and the cost per row is linear in its
 * key count. Dot products and the value updates are `omp simd` loops over
 * HS. A row's arithmetic does not depend on the thread that runs it, so the
 * output is identical for any thread count.
 *
 * A sliding window starts each row's keys at position p - window + 1.
 *
 * Keys and values are fp32, or bf16 (cllm_attention_forward_paged_bf16:
 * half the bytes a decode step reads from the cache; the products and the
 * softmax stay fp32).
 *
 * Left out: a backward (inference only), 8-bit caches.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cllm/kernels.h"

enum { KT = 64, HSMAX = CLLM_ATTN_MAX_HS };

/* Keys and values as fp32, or as bf16 (the upper half of an fp32 value,
 * widened by a shift): one attend_row per storage type. */
static inline float ld_f32(const float *p, int i) { return p[i]; }
static inline float ld_bf16(const uint16_t *p, int i) {
    uint32_t u = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One query row: out[HS] = softmax(scores over keys 0..L-1) @ values.
 * Keys and values come in blocks of BS positions: position s is row s % BS
 * of block table[s / BS], whose [BS, HS] keys start at
 * k + table[s / BS] * bstride (values alike). The online softmax state
 * (max m, sum l, acc) runs across tiles and blocks. slope * (s - pos) is
 * the ALiBi bias. */
#define DEFINE_ATTEND_ROW(NAME, T, LD)                                                                           \
    static void NAME(float *restrict out, const float *restrict q, const T *restrict k, const T *restrict v,     \
                     const int32_t *table, int BS, size_t bstride, int first, int L, int pos, int HS, float scale, \
                     float slope) {                                                                              \
        float acc[HSMAX];                                                                                        \
        float sc[KT];                                                                                            \
        float m = -INFINITY, l = 0.0f;                                                                           \
        for (int d = 0; d < HS; d++) acc[d] = 0.0f;                                                              \
        /* keys first..L-1: from block first / BS, row first % BS of it */                                      \
        for (int bi = first / BS, b0 = bi * BS; b0 < L; b0 += BS, bi++) {                                        \
            const T *restrict kb = k + (size_t)table[bi] * bstride, *restrict vb = v + (size_t)table[bi] * bstride; \
            const int in_block = L - b0 < BS ? L - b0 : BS;                                                      \
            for (int s0 = b0 < first ? first - b0 : 0; s0 < in_block; s0 += KT) {                               \
                const int n = in_block - s0 < KT ? in_block - s0 : KT;                                           \
                float mx = m;                                                                                    \
                for (int j = 0; j < n; j++) {                                                                    \
                    const T *restrict ks = kb + (size_t)(s0 + j) * HS;                                           \
                    float dd = 0.0f;                                                                             \
                    _Pragma("omp simd reduction(+ : dd)") for (int i = 0; i < HS; i++) dd += q[i] * LD(ks, i);   \
                    const float x = scale * dd + slope * (float)(b0 + s0 + j - pos);                             \
                    sc[j] = x;                                                                                   \
                    mx = x > mx ? x : mx;                                                                        \
                }                                                                                                \
                /* m is -inf only before the first tile, where acc and l are zero. */                           \
                const float corr = expf(m - mx);                                                                 \
                if (corr != 1.0f) {                                                                              \
                    l *= corr;                                                                                   \
                    _Pragma("omp simd") for (int d = 0; d < HS; d++) acc[d] *= corr;                            \
                }                                                                                                \
                m = mx;                                                                                          \
                for (int j = 0; j < n; j++) {                                                                    \
                    const float p = expf(sc[j] - mx);                                                            \
                    const T *restrict vs = vb + (size_t)(s0 + j) * HS;                                           \
                    l += p;                                                                                      \
                    _Pragma("omp simd") for (int d = 0; d < HS; d++) acc[d] += p * LD(vs, d);                   \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        const float inv = 1.0f / l;                                                                              \
        _Pragma("omp simd") for (int d = 0; d < HS; d++) out[d] = acc[d] * inv;                                 \
    }
DEFINE_ATTEND_ROW(attend_row, float, ld_f32)
DEFINE_ATTEND_ROW(attend_row_bf16, uint16_t, ld_bf16)

/* Both storage types: kpool / vpool hold floats, or bf16 values when bf16. */
static void paged(cllm_view out, cllm_cview q, const void *kpool, const void *vpool, bool bf16, const int32_t *table,
                  int max_blocks, int BS, const int32_t *rows, const int32_t *past, const float *alibi, int n_seq,
                  int NH, int NKV, int HS, float scale, int window) {
    assert(HS > 0 && HS <= HSMAX && NKV > 0 && NH % NKV == 0 && BS > 0 && n_seq >= 0);
    const int group = NH / NKV, N = n_seq > 0 ? rows[n_seq] : 0;
    const size_t bstride = (size_t)NKV * BS * HS;
    const long ntask = (long)N * NH;
    double keys = 0;
    for (int i = 0; i < n_seq; i++) keys += (double)(rows[i + 1] - rows[i]) * (past[i] + rows[i + 1] - rows[i]);
    /* A decode step of a small model is a few thousand multiply-adds, less
     * than waking the thread team costs: run those serially. Later rows of
     * a sequence have more keys: tasks run from the last row back. */
#pragma omp parallel for schedule(dynamic, 1) if (keys * NH * HS > 65536.0)
    for (long task = 0; task < ntask; task++) {
        const int r = N - 1 - (int)(task / NH), h = (int)(task % NH);
        int lo = 0, hi = n_seq - 1; /* the sequence of row r: rows[i] <= r < rows[i + 1] */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (rows[mid] <= r) lo = mid;
            else hi = mid - 1;
        }
        const int i = lo, pos = past[i] + (r - rows[i]), g = h / group;
        assert((pos + BS) / BS <= max_blocks);
        const float *qr = q.p + (ptrdiff_t)r * q.rs + (ptrdiff_t)h * q.hs;
        float *o = out.p + (ptrdiff_t)r * out.rs + (ptrdiff_t)h * out.hs;
        const size_t goff = (size_t)g * BS * HS;
        const int first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
        const int32_t *tab = table + (size_t)i * max_blocks;
        const float slope = alibi ? alibi[h] : 0.0f;
        if (bf16)
            attend_row_bf16(o, qr, (const uint16_t *)kpool + goff, (const uint16_t *)vpool + goff, tab, BS, bstride,
                            first, pos + 1, pos, HS, scale, slope);
        else
            attend_row(o, qr, (const float *)kpool + goff, (const float *)vpool + goff, tab, BS, bstride, first,
                       pos + 1, pos, HS, scale, slope);
    }
}

void cllm_attention_forward_paged_bf16(cllm_view out, cllm_cview q, const uint16_t *kpool, const uint16_t *vpool,
                                       const int32_t *table, int max_blocks, int BS, const int32_t *rows,
                                       const int32_t *past, const float *alibi, int n_seq, int NH, int NKV, int HS,
                                       float scale, int window) {
    paged(out, q, kpool, vpool, true, table, max_blocks, BS, rows, past, alibi, n_seq, NH, NKV, HS, scale, window);
}

void cllm_attention_forward_paged_window(cllm_view out, cllm_cview q, const float *kpool, const float *vpool,
                                         const int32_t *table, int max_blocks, int BS, const int32_t *rows,
                                         const int32_t *past, const float *alibi, int n_seq, int NH, int NKV,
                                         int HS, float scale, int window) {
    paged(out, q, kpool, vpool, false, table, max_blocks, BS, rows, past, alibi, n_seq, NH, NKV, HS, scale, window);
}
