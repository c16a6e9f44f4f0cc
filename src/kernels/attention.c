/*
 * Causal multi-head attention, forward and backward, computed in tiles with
 * an online softmax (the FlashAttention scheme on CPU): no T x T score or
 * probability matrix is ever materialised, only BQ x BK tiles on the stack.
 *
 * Dimensions: B batch, T tokens, NH query heads, NKV key/value heads, HS
 * head size; query head h reads key/value head g = h / (NH / NKV).
 * q, k, v, out and their gradients are strided views (see cllm_view in
 * kernels.h): row (b,t) of head h starts at p + (b*T+t)*rs + h*hs.
 *
 *   S[t,s] = scale * q_t . k_s + slope_h * (s - t)      (s <= t)
 *   P[t,s] = exp(S[t,s] - lse_t),  lse_t = log sum_s exp(S[t,s])
 *   out_t  = sum_s P[t,s] v_s
 *
 * Backward, with D_t = dout_t . out_t:
 *   dP[t,s] = dout_t . v_s,   dS[t,s] = P[t,s] * (dP[t,s] - D_t)
 *   dq_t += scale * sum_s dS[t,s] k_s
 *   dk_s += scale * sum_t dS[t,s] q_t      (summed over the query heads of g)
 *   dv_s += sum_t P[t,s] dout_t            (likewise)
 *
 * Work split, deterministic without atomics: the forward runs one task per
 * (b, h, query block). The backward has two schemes, chosen by the shape
 * alone (never the thread count):
 *  - fused, when there are at least FUSED_MIN_TASKS (b, g) pairs: one task
 *    per (b, g) walks its key blocks in order and, from each block's P and
 *    dS tiles, adds dk, dv of the block and the block's part of dq of the
 *    group's query heads. S and dP are computed once (5 tile products).
 *  - two passes otherwise (few sequences and key/value heads: a (b, g) task
 *    each would leave threads idle): one task per (b, g, key block) for dk,
 *    dv, then one per (b, h, query block) for dq, which computes S and dP
 *    again (7 tile products) but gives every thread work.
 * Either way every output row has exactly one writer, and a task's
 * arithmetic does not depend on which thread runs it, so results are
 * identical for any thread count.
 *
 * Tiles: a query-block task transposes its queries once into Qt [HS,BQ] and
 * computes scores transposed, St[j,i] = k_j . q_i, one key row at a time
 * (y[0:BQ] += k_j[d] * Qt[d,0:BQ]); the softmax then runs down columns,
 * i.e. vectorised across the BQ queries. The dk/dv task does the mirror
 * image with its key block transposed once into Kt [HS,BK]. Every product
 * is a sequence of contiguous multiply-adds (rows_axpy, two output rows at a
 * time, four with 512-bit vectors), because -O2 without -ffast-math
 * vectorises no float reduction.
 *
 * A sliding window (key s visible to query t when t - window < s <= t)
 * masks the same way and skips the key blocks wholly before a query
 * block's window, and the query blocks wholly past a key block's.
 *
 * Left out: non-causal and padding masks, dropout, KV
 * caches for incremental decoding (queries and keys always cover the same T
 * positions), and half-precision inputs.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cllm/kernels.h"

/* Tile sizes: a query block of BQ rows meets a key block of BK columns.
 * 32 x 32 keeps the wasted upper half of the diagonal tiles small at T=256
 * and every scratch tile (at most 32 x CLLM_ATTN_MAX_HS floats, 32 KB) in
 * L1/L2. */
enum { BQ = 32, BK = 32, HSMAX = CLLM_ATTN_MAX_HS };

/* The backward fuses its two passes from this many (b, g) tasks on: a
 * LLaMA with 4 key/value heads at batch 1 keeps 4 threads busy (GPT-2
 * 124M at batch 1 has 12 heads). Fewer tasks than threads leave the rest
 * idle for the attention backward; the choice cannot look at the thread
 * count, or results would depend on it. */
enum { FUSED_MIN_TASKS = 4 };

/* Fused multiply-add where the hardware has it (one rounding, twice the
 * throughput of mul+add, which -std=c11 will not contract on its own). */
#ifdef FP_FAST_FMAF
#define MADD(a, b, c) fmaf((a), (b), (c))
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

static inline ptrdiff_t row_off(int b, int T, int t, int rs, int h, int hs) {
    return ((ptrdiff_t)b * T + t) * rs + (ptrdiff_t)h * hs;
}

/* exp(x) in straight-line float arithmetic so a loop of it vectorises
 * (glibc's expf is an opaque call). x = n ln2 + r with |r| <= ln2/2 (ln2 in
 * two parts, Cody-Waite), e^r by its degree-7 Taylor polynomial (truncation
 * 7e-9 relative), times 2^n built in the exponent bits. Measured over every
 * float in [-87, 3]: at most 0.94 ulp from exp. Returns 0 below -87 (where
 * exp < 2^-125: a softmax term that small is zero next to the row max's 1),
 * 0 for -inf, NaN for NaN. Inputs above 88 are clamped (never happens here:
 * arguments are scores minus their row max or lse, so <= 0 up to rounding). */
static inline float exp_tile(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x > -88.0f ? x : -88.0f;
    xc = xc < 88.0f ? xc : 88.0f;
    const float kf = MADD(xc, log2e, shifter) - shifter;
    float r = MADD(kf, -ln2_hi, xc);
    r = MADD(kf, -ln2_lo, r);
    float p = 1.0f / 5040;
    p = MADD(p, r, 1.0f / 720);
    p = MADD(p, r, 1.0f / 120);
    p = MADD(p, r, 1.0f / 24);
    p = MADD(p, r, 1.0f / 6);
    p = MADD(p, r, 0.5f);
    p = MADD(p, r, 1.0f);
    p = MADD(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    const float y = p * two_n;
    return x >= -87.0f ? y : (x < -87.0f ? 0.0f : x);
}

/* y[0:32] += sum_{k<m} w[k*ws] * x[k*xs + 0:32], and the same for a second
 * row y1 with weights w1 sharing the x rows. The 32 (or 64) running sums are
 * a local array under full unrolling, which GCC keeps in vector registers
 * for the whole k loop: y is loaded and stored once, and the two rows give 8
 * independent FMA chains (enough to cover FMA latency) per x load. */
enum { CHUNK = 32 };

static inline void axpy_chunk(float *restrict y, const float *restrict w, ptrdiff_t ws,
                              const float *restrict x, ptrdiff_t xs, int m) {
    float a[CHUNK];
#pragma GCC unroll 32
    for (int d = 0; d < CHUNK; d++) a[d] = y[d];
    for (int k = 0; k < m; k++) {
        const float wk = w[k * ws];
        const float *restrict xk = x + k * xs;
#pragma GCC unroll 32
        for (int d = 0; d < CHUNK; d++) a[d] = MADD(wk, xk[d], a[d]);
    }
#pragma GCC unroll 32
    for (int d = 0; d < CHUNK; d++) y[d] = a[d];
}

static inline void axpy_chunk2(float *restrict y0, float *restrict y1, const float *restrict w0,
                               const float *restrict w1, ptrdiff_t ws, const float *restrict x,
                               ptrdiff_t xs, int m) {
    float a[CHUNK], c[CHUNK];
#pragma GCC unroll 32
    for (int d = 0; d < CHUNK; d++) {
        a[d] = y0[d];
        c[d] = y1[d];
    }
    for (int k = 0; k < m; k++) {
        const float wa = w0[k * ws], wc = w1[k * ws];
        const float *restrict xk = x + k * xs;
#pragma GCC unroll 32
        for (int d = 0; d < CHUNK; d++) {
            a[d] = MADD(wa, xk[d], a[d]);
            c[d] = MADD(wc, xk[d], c[d]);
        }
    }
#pragma GCC unroll 32
    for (int d = 0; d < CHUNK; d++) {
        y0[d] = a[d];
        y1[d] = c[d];
    }
}

/* The tail of a row shorter than a chunk (HS = 80 leaves 16, HS = 7 all). */
static inline void axpy_tail(float *restrict y, int n, const float *restrict w, ptrdiff_t ws,
                             const float *restrict x, ptrdiff_t xs, int m) {
    for (int k = 0; k < m; k++) {
        const float wk = w[k * ws];
        const float *restrict xk = x + k * xs;
#pragma omp simd
        for (int d = 0; d < n; d++) y[d] = MADD(wk, xk[d], y[d]);
    }
}

/* y[0:n] += sum_{k<m} w[k*ws] * x[k*xs + 0:n]: the one inner product of
 * this file. Every matrix product below is a series of these, with y a
 * contiguous row so the n direction vectorises. */
static inline void rows_axpy(float *restrict y, int n, const float *restrict w, ptrdiff_t ws,
                             const float *restrict x, ptrdiff_t xs, int m) {
    int d = 0;
    for (; d + CHUNK <= n; d += CHUNK) axpy_chunk(y + d, w, ws, x + d, xs, m);
    if (d < n) axpy_tail(y + d, n - d, w, ws, x + d, xs, m);
}

/* rows_axpy for two rows y0, y1 (weights w0, w1) against the same x. */
static inline void rows_axpy2(float *restrict y0, float *restrict y1, int n, const float *restrict w0,
                              const float *restrict w1, ptrdiff_t ws, const float *restrict x,
                              ptrdiff_t xs, int m) {
    int d = 0;
    for (; d + CHUNK <= n; d += CHUNK) axpy_chunk2(y0 + d, y1 + d, w0, w1, ws, x + d, xs, m);
    if (d < n) {
        axpy_tail(y0 + d, n - d, w0, ws, x + d, xs, m);
        axpy_tail(y1 + d, n - d, w1, ws, x + d, xs, m);
    }
}

/* Four rows at a time where the vectors are 512 bits wide: a chunk of 32
 * floats is then two registers, so two rows keep only four FMA chains in
 * flight, half of what two FMA pipes with a latency of four cycles need;
 * four rows keep eight (32 registers hold them and the loads). Each output
 * element still sums the same products in the same order, so the results
 * equal those of rows_axpy2 bit for bit. With 256-bit vectors two rows
 * already give eight chains, and four would not fit 16 registers. */
#if defined(__AVX512F__)
#define ATTN_QUAD 1
static inline void axpy_chunk4(float *restrict y0, float *restrict y1, float *restrict y2, float *restrict y3,
                               const float *restrict w0, const float *restrict w1, const float *restrict w2,
                               const float *restrict w3, ptrdiff_t ws, const float *restrict x, ptrdiff_t xs, int m) {
    float a[CHUNK], c[CHUNK], e[CHUNK], f[CHUNK];
#pragma GCC unroll 32
    for (int d = 0; d < CHUNK; d++) {
        a[d] = y0[d];
        c[d] = y1[d];
        e[d] = y2[d];
        f[d] = y3[d];
    }
    for (int k = 0; k < m; k++) {
        const float wa = w0[k * ws], wc = w1[k * ws], we = w2[k * ws], wf = w3[k * ws];
        const float *restrict xk = x + k * xs;
#pragma GCC unroll 32
        for (int d = 0; d < CHUNK; d++) {
            a[d] = MADD(wa, xk[d], a[d]);
            c[d] = MADD(wc, xk[d], c[d]);
            e[d] = MADD(we, xk[d], e[d]);
            f[d] = MADD(wf, xk[d], f[d]);
        }
    }
#pragma GCC unroll 32
    for (int d = 0; d < CHUNK; d++) {
        y0[d] = a[d];
        y1[d] = c[d];
        y2[d] = e[d];
        y3[d] = f[d];
    }
}

/* rows_axpy for rows y + r * ys, weights w + r * wr (r < 4), against x. */
static inline void rows_axpy4(float *restrict y, ptrdiff_t ys, int n, const float *restrict w, ptrdiff_t wr,
                              ptrdiff_t ws, const float *restrict x, ptrdiff_t xs, int m) {
    int d = 0;
    for (; d + CHUNK <= n; d += CHUNK)
        axpy_chunk4(y + d, y + ys + d, y + 2 * ys + d, y + 3 * ys + d, w, w + wr, w + 2 * wr, w + 3 * wr, ws, x + d,
                    xs, m);
    for (int r = 0; d < n && r < 4; r++) axpy_tail(y + r * ys + d, n - d, w + r * wr, ws, x + d, xs, m);
}
#else
#define ATTN_QUAD 0
#endif

/* dst[d*W + j] = element d of row t0+j of head h, j < n; columns n..W-1
 * zeroed. W is BQ or BK. */
static void load_transposed(float *restrict dst, int W, cllm_cview x, int b, int T, int t0, int n,
                            int h, int HS) {
    for (int j = 0; j < n; j++) {
        const float *src = x.p + row_off(b, T, t0 + j, x.rs, h, x.hs);
        for (int d = 0; d < HS; d++) dst[d * W + j] = src[d];
    }
    if (n < W)
        for (int d = 0; d < HS; d++) memset(dst + d * W + n, 0, (size_t)(W - n) * sizeof(float));
}

/* St[j,0:BQ] = x_{s0+j} . Qt[:,0:BQ] for j < nk: rows of a view (keys or
 * values of head g) against a transposed query-side tile. */
static void scores_t(float *restrict St, cllm_cview x, int b, int T, int s0, int nk, int g,
                     const float *restrict Qt, int HS) {
    memset(St, 0, (size_t)nk * BQ * sizeof(float));
    int j = 0;
#if ATTN_QUAD
    for (; j + 3 < nk; j += 4)
        rows_axpy4(St + j * BQ, BQ, BQ, x.p + row_off(b, T, s0 + j, x.rs, g, x.hs), x.rs, 1, Qt, BQ, HS);
#endif
    for (; j + 1 < nk; j += 2)
        rows_axpy2(St + j * BQ, St + (j + 1) * BQ, BQ, x.p + row_off(b, T, s0 + j, x.rs, g, x.hs),
                   x.p + row_off(b, T, s0 + j + 1, x.rs, g, x.hs), 1, Qt, BQ, HS);
    if (j < nk) rows_axpy(St + j * BQ, BQ, x.p + row_off(b, T, s0 + j, x.rs, g, x.hs), 1, Qt, BQ, HS);
}

/* How many keys of a block starting at s0 (nk of them) query t may see. */
static inline int keys_visible(int t, int s0, int nk) {
    const int n = t - s0 + 1;
    return n < 0 ? 0 : n > nk ? nk : n;
}

/* The first key a block of queries starting at t0 may see under a window
 * (0 without one), rounded down to a key block. */
static inline int first_key_block(int t0, int window) {
    const int s = window > 0 && t0 - window + 1 > 0 ? t0 - window + 1 : 0;
    return (s / BK) * BK;
}

/* Whether key s is inside query t's window (every key without one). */
static inline bool in_window(int t, int s, int window) { return window <= 0 || t - s < window; }

void cllm_attention_forward_window(cllm_view out, float *lse, cllm_cview q, cllm_cview k, cllm_cview v,
                                   const float *alibi, int B, int T, int NH, int NKV, int HS, float scale,
                                   int window) {
    assert(HS > 0 && HS <= HSMAX && NKV > 0 && NH % NKV == 0);
    const int group = NH / NKV;
    const int nqb = (T + BQ - 1) / BQ;
    const long ntask = (long)B * NH * nqb;

    /* Largest tasks (last query blocks, most key blocks) first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (long task = 0; task < ntask; task++) {
        const int qb = nqb - 1 - (int)(task % nqb);
        const int h = (int)((task / nqb) % NH);
        const int b = (int)(task / ((long)nqb * NH));
        const int g = h / group;
        const int t0 = qb * BQ;
        const int nq = T - t0 < BQ ? T - t0 : BQ;
        const float slope = alibi ? alibi[h] : 0.0f;

        float Qt[HSMAX * BQ];  /* [HS,BQ] queries, transposed */
        float St[BK * BQ];     /* [BK,BQ] scores, then probabilities, transposed */
        float acc[BQ * HSMAX]; /* [nq,HS] unnormalised output */
        float m[BQ], l[BQ];    /* running max of each score row, sum of exp(S - m) */
        float mx[BQ], corr[BQ];

        load_transposed(Qt, BQ, q, b, T, t0, nq, h, HS);
        memset(acc, 0, (size_t)nq * HS * sizeof(float));
        for (int i = 0; i < BQ; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }

        /* Key block 0 comes first, so every row (padding rows i >= nq too)
         * has a finite max after it and m - mx below is never inf - inf. */
        for (int s0 = first_key_block(t0, window); s0 < t0 + nq; s0 += BK) {
            const int nk = t0 + nq - s0 < BK ? t0 + nq - s0 : BK;
            scores_t(St, k, b, T, s0, nk, g, Qt, HS);
            for (int i = 0; i < BQ; i++) mx[i] = m[i];
            for (int j = 0; j < nk; j++) {
                float *restrict sj = St + j * BQ;
                const int s = s0 + j;
#pragma omp simd
                for (int i = 0; i < BQ; i++) {
                    const int t = t0 + i;
                    const float x = MADD(scale, sj[i], slope * (float)(s - t));
                    /* Masked by adding -inf: GCC will not if-convert a
                     * select between x and -inf (it sinks x into a branch). */
                    const float sv = x + (s <= t && in_window(t, s, window) ? 0.0f : -INFINITY);
                    const float mi = mx[i];
                    sj[i] = sv;
                    mx[i] = sv > mi ? sv : mi;
                }
            }
            /* Rescale what was summed under the old max. Under a window a
             * row may have seen no key yet (max -inf): it subtracts 0, so
             * its masked scores give 0, never inf - inf. */
#pragma omp simd
            for (int i = 0; i < BQ; i++) {
                const float ms = mx[i] == -INFINITY ? 0.0f : mx[i];
                corr[i] = exp_tile(m[i] - ms);
                l[i] *= corr[i];
                m[i] = mx[i];
                mx[i] = ms;
            }
            for (int j = 0; j < nk; j++) {
                float *restrict sj = St + j * BQ;
#pragma omp simd
                for (int i = 0; i < BQ; i++) {
                    sj[i] = exp_tile(sj[i] - mx[i]);
                    l[i] += sj[i];
                }
            }
            for (int i = 0; i < nq; i++) {
                float *restrict arow = acc + (size_t)i * HS;
                if (corr[i] != 1.0f) {
                    const float c = corr[i];
#pragma omp simd
                    for (int d = 0; d < HS; d++) arow[d] *= c;
                }
            }
            /* acc_t += sum_s P[t,s] v_s, two query rows at a time; the pair
             * runs over the keys the later row sees (P is 0 beyond). */
            const float *vs = v.p + row_off(b, T, s0, v.rs, g, v.hs);
            int i = 0;
#if ATTN_QUAD
            for (; i + 3 < nq; i += 4)
                rows_axpy4(acc + (size_t)i * HS, HS, HS, St + i, 1, BQ, vs, v.rs, keys_visible(t0 + i + 3, s0, nk));
#endif
            for (; i + 1 < nq; i += 2)
                rows_axpy2(acc + (size_t)i * HS, acc + (size_t)(i + 1) * HS, HS, St + i, St + i + 1,
                           BQ, vs, v.rs, keys_visible(t0 + i + 1, s0, nk));
            if (i < nq) rows_axpy(acc + (size_t)i * HS, HS, St + i, BQ, vs, v.rs, keys_visible(t0 + i, s0, nk));
        }

        for (int i = 0; i < nq; i++) {
            const float inv = 1.0f / l[i];
            float *restrict o = out.p + row_off(b, T, t0 + i, out.rs, h, out.hs);
            const float *restrict arow = acc + (size_t)i * HS;
#pragma omp simd
            for (int d = 0; d < HS; d++) o[d] = arow[d] * inv;
            lse[((size_t)b * NH + h) * T + t0 + i] = m[i] + logf(l[i]);
        }
    }
}

/* D_t = dout_t . out_t for the nq rows of a query block starting at t0
 * (D[i] = 0 for i >= nq). */
static void row_dots(float *restrict D, cllm_cview dout, cllm_cview out, int b, int T, int t0,
                     int nq, int h, int HS) {
    for (int i = 0; i < BQ; i++) {
        float sum = 0.0f;
        if (i < nq) {
            const float *restrict o = out.p + row_off(b, T, t0 + i, out.rs, h, out.hs);
            const float *restrict dO = dout.p + row_off(b, T, t0 + i, dout.rs, h, dout.hs);
#pragma omp simd reduction(+ : sum)
            for (int d = 0; d < HS; d++) sum = MADD(dO[d], o[d], sum);
        }
        D[i] = sum;
    }
}

/* dk, dv of key block kb of kv head g in sequence b: the sum over every
 * query row at or after the block, of every query head in the group.
 * Tiles here are [query, key]: P[i*BK + j]. With dq.p set, the same dS
 * tiles also add their part of dq (scale * dS @ K_block) into the query
 * rows: the fused pass, whose task owns those rows. */
static void kv_block_backward(cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout, cllm_cview out,
                              const float *lse, cllm_cview q, cllm_cview k, cllm_cview v, const float *alibi,
                              int b, int g, int kb, int T, int NH, int group, int HS, float scale, int window) {
    const int s0 = kb * BK;
    const int nk = T - s0 < BK ? T - s0 : BK;

    float Kt[HSMAX * BK], Vt[HSMAX * BK];   /* [HS,BK] keys, values, transposed */
    float P[BQ * BK], dP[BQ * BK];          /* [BQ,BK] */
    float dKs[BK * HSMAX], dVs[BK * HSMAX]; /* [nk,HS] sums for this block */
    float dQs[BQ * HSMAX];                  /* [nq,HS] this block's part of dq (fused pass) */
    float D[BQ];

    load_transposed(Kt, BK, k, b, T, s0, nk, g, HS);
    load_transposed(Vt, BK, v, b, T, s0, nk, g, HS);
    memset(dKs, 0, (size_t)nk * HS * sizeof(float));
    memset(dVs, 0, (size_t)nk * HS * sizeof(float));
    const float *ks = k.p + row_off(b, T, s0, k.rs, g, k.hs);

    for (int h = g * group; h < (g + 1) * group; h++) {
        const float slope = alibi ? alibi[h] : 0.0f;
        const float *lse_h = lse + ((size_t)b * NH + h) * T;
        /* queries past s0 + nk - 1 + window see nothing of this block */
        const int t_end = window > 0 && s0 + nk - 1 + window < T ? s0 + nk - 1 + window : T;
        for (int t0 = (s0 / BQ) * BQ; t0 < t_end; t0 += BQ) {
            const int nq = T - t0 < BQ ? T - t0 : BQ;
            row_dots(D, dout, out, b, T, t0, nq, h, HS);
            /* S = q Kt, dP = dout Vt, two query rows at a time. */
            const float *qs = q.p + row_off(b, T, t0, q.rs, h, q.hs);
            const float *dos = dout.p + row_off(b, T, t0, dout.rs, h, dout.hs);
            const ptrdiff_t qrs = q.rs, drs = dout.rs;
            memset(P, 0, (size_t)nq * BK * sizeof(float));
            memset(dP, 0, (size_t)nq * BK * sizeof(float));
            int i = 0;
#if ATTN_QUAD
            for (; i + 3 < nq; i += 4) {
                rows_axpy4(P + i * BK, BK, BK, qs + i * qrs, qrs, 1, Kt, BK, HS);
                rows_axpy4(dP + i * BK, BK, BK, dos + i * drs, drs, 1, Vt, BK, HS);
            }
#endif
            for (; i + 1 < nq; i += 2) {
                rows_axpy2(P + i * BK, P + (i + 1) * BK, BK, qs + i * qrs, qs + (i + 1) * qrs, 1, Kt, BK, HS);
                rows_axpy2(dP + i * BK, dP + (i + 1) * BK, BK, dos + i * drs, dos + (i + 1) * drs, 1, Vt, BK, HS);
            }
            if (i < nq) {
                rows_axpy(P + i * BK, BK, qs + i * qrs, 1, Kt, BK, HS);
                rows_axpy(dP + i * BK, BK, dos + i * drs, 1, Vt, BK, HS);
            }
            for (i = 0; i < nq; i++) {
                const int t = t0 + i;
                float *restrict pi = P + i * BK;
                float *restrict dpi = dP + i * BK;
                /* P = exp(S - lse) where visible; dP becomes dS. */
                const float lt = lse_h[t], Dt = D[i];
                const int vis = keys_visible(t, s0, nk);
#pragma omp simd
                for (int j = 0; j < BK; j++) {
                    const float x = MADD(scale, pi[j], slope * (float)(s0 + j - t)) - lt;
                    const float e = exp_tile(x);
                    const float p = j < vis && in_window(t, s0 + j, window) ? e : 0.0f;
                    pi[j] = p;
                    dpi[j] = p * (dpi[j] - Dt);
                }
            }
            /* dv_s += sum_t P[t,s] dout_t ; dk_s += sum_t dS[t,s] q_t
             * (scale applied once at the end). */
            int j = 0;
#if ATTN_QUAD
            for (; j + 3 < nk; j += 4) {
                rows_axpy4(dVs + (size_t)j * HS, HS, HS, P + j, 1, BK, dos, drs, nq);
                rows_axpy4(dKs + (size_t)j * HS, HS, HS, dP + j, 1, BK, qs, qrs, nq);
            }
#endif
            for (; j + 1 < nk; j += 2) {
                rows_axpy2(dVs + (size_t)j * HS, dVs + (size_t)(j + 1) * HS, HS, P + j, P + j + 1, BK, dos, drs, nq);
                rows_axpy2(dKs + (size_t)j * HS, dKs + (size_t)(j + 1) * HS, HS, dP + j, dP + j + 1, BK, qs, qrs,
                           nq);
            }
            if (j < nk) {
                rows_axpy(dVs + (size_t)j * HS, HS, P + j, BK, dos, drs, nq);
                rows_axpy(dKs + (size_t)j * HS, HS, dP + j, BK, qs, qrs, nq);
            }
            if (!dq.p) continue;
            /* dq_t += scale * sum_s dS[t,s] k_s over this block's keys */
            memset(dQs, 0, (size_t)nq * HS * sizeof(float));
            i = 0;
#if ATTN_QUAD
            for (; i + 3 < nq; i += 4)
                rows_axpy4(dQs + (size_t)i * HS, HS, HS, dP + i * BK, BK, 1, ks, k.rs, keys_visible(t0 + i + 3, s0, nk));
#endif
            for (; i + 1 < nq; i += 2)
                rows_axpy2(dQs + (size_t)i * HS, dQs + (size_t)(i + 1) * HS, HS, dP + i * BK, dP + (i + 1) * BK, 1,
                           ks, k.rs, keys_visible(t0 + i + 1, s0, nk));
            if (i < nq) rows_axpy(dQs + (size_t)i * HS, HS, dP + i * BK, 1, ks, k.rs, keys_visible(t0 + i, s0, nk));
            for (i = 0; i < nq; i++) {
                float *restrict dqr = dq.p + row_off(b, T, t0 + i, dq.rs, h, dq.hs);
                const float *restrict dqs = dQs + (size_t)i * HS;
#pragma omp simd
                for (int d = 0; d < HS; d++) dqr[d] = MADD(scale, dqs[d], dqr[d]);
            }
        }
    }

    for (int j = 0; j < nk; j++) {
        float *restrict dkr = dk.p + row_off(b, T, s0 + j, dk.rs, g, dk.hs);
        float *restrict dvr = dv.p + row_off(b, T, s0 + j, dv.rs, g, dv.hs);
        const float *restrict dks = dKs + (size_t)j * HS;
        const float *restrict dvs = dVs + (size_t)j * HS;
#pragma omp simd
        for (int d = 0; d < HS; d++) {
            dkr[d] = MADD(scale, dks[d], dkr[d]);
            dvr[d] += dvs[d];
        }
    }
}

void cllm_attention_backward_window(cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout,
                                    cllm_cview out, const float *lse, cllm_cview q, cllm_cview k,
                                    cllm_cview v, const float *alibi, int B, int T, int NH, int NKV,
                                    int HS, float scale, int window) {
    assert(HS > 0 && HS <= HSMAX && NKV > 0 && NH % NKV == 0);
    const int group = NH / NKV;
    const int nqb = (T + BQ - 1) / BQ;
    const int nkb = (T + BK - 1) / BK;
    const long nq_task = (long)B * NH * nqb;

    if ((long)B * NKV >= FUSED_MIN_TASKS) {
        /* Fused: one task per (b, g) runs its key blocks in order, adding
         * dq as it goes; every dq, dk and dv row has one writer. */
#pragma omp parallel for schedule(dynamic, 1)
        for (long task = 0; task < (long)B * NKV; task++)
            for (int kb = 0; kb < nkb; kb++)
                kv_block_backward(dq, dk, dv, dout, out, lse, q, k, v, alibi, (int)(task / NKV), (int)(task % NKV), kb,
                                  T, NH, group, HS, scale, window);
        return;
    }

#pragma omp parallel
    {
        /* Pass 1: dk, dv of one key block of one kv head. Key blocks near
         * the start see the most queries: they come first. */
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < (long)B * NKV * nkb; task++)
            kv_block_backward((cllm_view){NULL, 0, 0}, dk, dv, dout, out, lse, q, k, v, alibi,
                              (int)(task / ((long)nkb * NKV)), (int)((task / nkb) % NKV), (int)(task % nkb), T, NH,
                              group, HS, scale, window);

        /* Pass 2: dq of one query block of one query head, with transposed
         * [key, query] tiles as in the forward. The implicit barrier above
         * keeps the passes apart when dq, dk and dv are columns of one
         * fused buffer. */
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < nq_task; task++) {
            const int qb = nqb - 1 - (int)(task % nqb);
            const int h = (int)((task / nqb) % NH);
            const int b = (int)(task / ((long)nqb * NH));
            const int g = h / group;
            const int t0 = qb * BQ;
            const int nq = T - t0 < BQ ? T - t0 : BQ;
            const float slope = alibi ? alibi[h] : 0.0f;
            const float *lse_h = lse + ((size_t)b * NH + h) * T;

            float Qt[HSMAX * BQ], dOt[HSMAX * BQ]; /* [HS,BQ] transposed */
            float Pt[BK * BQ], dPt[BK * BQ];       /* [BK,BQ] */
            float dQs[BQ * HSMAX];                 /* [nq,HS] */
            float D[BQ], lt[BQ];

            load_transposed(Qt, BQ, q, b, T, t0, nq, h, HS);
            load_transposed(dOt, BQ, dout, b, T, t0, nq, h, HS);
            row_dots(D, dout, out, b, T, t0, nq, h, HS);
            for (int i = 0; i < BQ; i++) lt[i] = i < nq ? lse_h[t0 + i] : 0.0f;
            memset(dQs, 0, (size_t)nq * HS * sizeof(float));

            for (int s0 = first_key_block(t0, window); s0 < t0 + nq; s0 += BK) {
                const int nk = t0 + nq - s0 < BK ? t0 + nq - s0 : BK;
                scores_t(Pt, k, b, T, s0, nk, g, Qt, HS);
                scores_t(dPt, v, b, T, s0, nk, g, dOt, HS);
                /* P = exp(S - lse) where visible; dP becomes dS. */
                for (int j = 0; j < nk; j++) {
                    float *restrict pj = Pt + j * BQ;
                    float *restrict dpj = dPt + j * BQ;
                    const int s = s0 + j;
#pragma omp simd
                    for (int i = 0; i < BQ; i++) {
                        const int t = t0 + i;
                        const float x = MADD(scale, pj[i], slope * (float)(s - t)) - lt[i];
                        const float e = exp_tile(x);
                        const float p = ((s <= t) & (i < nq) & in_window(t, s, window)) ? e : 0.0f;
                        dpj[i] = p * (dpj[i] - D[i]);
                    }
                }
                /* dq_t += sum_s dS[t,s] k_s (scale applied at the end). */
                const float *ks = k.p + row_off(b, T, s0, k.rs, g, k.hs);
                int i = 0;
#if ATTN_QUAD
                for (; i + 3 < nq; i += 4)
                    rows_axpy4(dQs + (size_t)i * HS, HS, HS, dPt + i, 1, BQ, ks, k.rs, keys_visible(t0 + i + 3, s0, nk));
#endif
                for (; i + 1 < nq; i += 2)
                    rows_axpy2(dQs + (size_t)i * HS, dQs + (size_t)(i + 1) * HS, HS, dPt + i, dPt + i + 1,
                               BQ, ks, k.rs, keys_visible(t0 + i + 1, s0, nk));
                if (i < nq)
                    rows_axpy(dQs + (size_t)i * HS, HS, dPt + i, BQ, ks, k.rs, keys_visible(t0 + i, s0, nk));
            }

            for (int i = 0; i < nq; i++) {
                float *restrict dqr = dq.p + row_off(b, T, t0 + i, dq.rs, h, dq.hs);
                const float *restrict dqs = dQs + (size_t)i * HS;
#pragma omp simd
                for (int d = 0; d < HS; d++) dqr[d] = MADD(scale, dqs[d], dqr[d]);
            }
        }
    }
}
