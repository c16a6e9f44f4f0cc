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
 * Work split, deterministic without atomics: the forward and the dq pass run
 * one task per (b, h, query block); the dk/dv pass runs one task per (b, g,
 * key block) and loops over the group's query heads itself, so every output
 * row has exactly one writer. A task's arithmetic does not depend on which
 * thread runs it, so results are identical for any thread count.
 *
 * Left out: non-causal and padding masks, dropout, sliding windows, KV
 * caches for incremental decoding (queries and keys always cover the same T
 * positions), and half-precision inputs.
 */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cllm/kernels.h"

/* Tile sizes: a query block of BQ rows meets a key block of BK columns.
 * 32 x 32 keeps the wasted upper half of the diagonal tiles small at T=256
 * and leaves every scratch tile (at most BK x CLLM_ATTN_MAX_HS floats, 32 KB)
 * resident in L1/L2. */
enum { BQ = 32, BK = 32, HSMAX = CLLM_ATTN_MAX_HS };

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

/* y[0:n] += sum_{k<m} w[k*ws] * x[k*xs + 0:n].
 * The one inner product of this file: every matrix product below is a series
 * of these, with y a contiguous row so the d-loop vectorises; four terms are
 * folded per pass so y is loaded and stored once per four FMAs. */
static inline void rows_axpy(float *restrict y, int n, const float *restrict w, ptrdiff_t ws,
                             const float *restrict x, ptrdiff_t xs, int m) {
    int k = 0;
    for (; k + 4 <= m; k += 4) {
        const float w0 = w[k * ws], w1 = w[(k + 1) * ws], w2 = w[(k + 2) * ws],
                    w3 = w[(k + 3) * ws];
        const float *restrict x0 = x + k * xs;
        const float *restrict x1 = x0 + xs;
        const float *restrict x2 = x1 + xs;
        const float *restrict x3 = x2 + xs;
#pragma omp simd
        for (int d = 0; d < n; d++) y[d] = MADD(w3, x3[d], MADD(w2, x2[d], MADD(w1, x1[d], MADD(w0, x0[d], y[d]))));
    }
    for (; k < m; k++) {
        const float wk = w[k * ws];
        const float *restrict xk = x + k * xs;
#pragma omp simd
        for (int d = 0; d < n; d++) y[d] = MADD(wk, xk[d], y[d]);
    }
}

/* dst[i*HS + d] = row i of a view, i < n: a contiguous [n,HS] tile. */
static void load_rows(float *restrict dst, cllm_cview x, int b, int T, int t0, int n, int h, int HS) {
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * HS, x.p + row_off(b, T, t0 + i, x.rs, h, x.hs),
               (size_t)HS * sizeof(float));
}

/* dst[d*BK + j] = element d of row s0+j, j < n; columns n..BK-1 zeroed.
 * The transposed [HS,BK] tile makes q.k_s for all s one rows_axpy. */
static void load_cols(float *restrict dst, cllm_cview x, int b, int T, int s0, int n, int h, int HS) {
    for (int j = 0; j < n; j++) {
        const float *src = x.p + row_off(b, T, s0 + j, x.rs, h, x.hs);
        for (int d = 0; d < HS; d++) dst[d * BK + j] = src[d];
    }
    if (n < BK)
        for (int d = 0; d < HS; d++) memset(dst + d * BK + n, 0, (size_t)(BK - n) * sizeof(float));
}

/* S[i,0:BK] = A[i,:] @ Bt for i < n: A [n,HS] contiguous, Bt [HS,BK]. */
static void tile_scores(float *restrict S, const float *restrict A, const float *restrict Bt, int n,
                        int HS) {
    for (int i = 0; i < n; i++) {
        float *restrict srow = S + i * BK;
        memset(srow, 0, BK * sizeof(float));
        rows_axpy(srow, BK, A + (size_t)i * HS, 1, Bt, BK, HS);
    }
}

/* Probabilities of one tile from the saved lse: P[i,j] = exp(S - lse) for
 * key s0+j <= query t0+i and j < nk, 0 elsewhere. S holds raw q.k on entry. */
static void tile_probs(float *restrict S, const float *restrict lse_rows, int t0, int nq, int s0,
                       int nk, float scale, float slope) {
    for (int i = 0; i < nq; i++) {
        float *restrict srow = S + i * BK;
        const int t = t0 + i;
        int jmax = t - s0 + 1;
        if (jmax > nk) jmax = nk;
        if (jmax < 0) jmax = 0;
        const float l = lse_rows[i];
        for (int j = 0; j < jmax; j++) srow[j] = expf(MADD(scale, srow[j], slope * (float)(s0 + j - t)) - l);
        for (int j = jmax; j < BK; j++) srow[j] = 0.0f;
    }
}

void cllm_attention_forward(cllm_view out, float *lse, cllm_cview q, cllm_cview k, cllm_cview v,
                            const float *alibi, int B, int T, int NH, int NKV, int HS, float scale) {
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

        float Qs[BQ * HSMAX];  /* [nq,HS] queries */
        float Kt[HSMAX * BK];  /* [HS,BK] keys, transposed */
        float S[BQ * BK];      /* [nq,BK] scores, then probabilities */
        float acc[BQ * HSMAX]; /* [nq,HS] unnormalised output */
        float m[BQ], l[BQ];    /* running row max and sum of exp(S - m) */

        load_rows(Qs, q, b, T, t0, nq, h, HS);
        memset(acc, 0, (size_t)nq * HS * sizeof(float));
        for (int i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }

        for (int s0 = 0; s0 < t0 + nq; s0 += BK) {
            const int nk = t0 + nq - s0 < BK ? t0 + nq - s0 : BK;
            load_cols(Kt, k, b, T, s0, nk, g, HS);
            tile_scores(S, Qs, Kt, nq, HS);
            const float *vs = v.p + row_off(b, T, s0, v.rs, g, v.hs);
            for (int i = 0; i < nq; i++) {
                float *restrict srow = S + i * BK;
                const int t = t0 + i;
                int jmax = t - s0 + 1;
                if (jmax > nk) jmax = nk;
                if (jmax <= 0) continue;
                float mx = m[i];
                for (int j = 0; j < jmax; j++) {
                    srow[j] = MADD(scale, srow[j], slope * (float)(s0 + j - t));
                    mx = fmaxf(mx, srow[j]);
                }
                /* Rescale what was summed under the old max. */
                const float corr = expf(m[i] - mx);
                float sum = 0.0f;
                for (int j = 0; j < jmax; j++) {
                    srow[j] = expf(srow[j] - mx);
                    sum += srow[j];
                }
                l[i] = l[i] * corr + sum;
                m[i] = mx;
                float *restrict arow = acc + (size_t)i * HS;
                if (corr != 1.0f) {
#pragma omp simd
                    for (int d = 0; d < HS; d++) arow[d] *= corr;
                }
                rows_axpy(arow, HS, srow, 1, vs, v.rs, jmax);
            }
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

/* D[i] = dout_t . out_t for the rows of a query block. */
static void row_dots(float *restrict D, const float *restrict dOs, cllm_cview out, int b, int T,
                     int t0, int nq, int h, int HS) {
    for (int i = 0; i < nq; i++) {
        const float *restrict o = out.p + row_off(b, T, t0 + i, out.rs, h, out.hs);
        const float *restrict dO = dOs + (size_t)i * HS;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int d = 0; d < HS; d++) sum = MADD(dO[d], o[d], sum);
        D[i] = sum;
    }
}

/* In place: P becomes dS = P * (dP - D) on the valid part of the tile. */
static void tile_dscores(float *restrict P, const float *restrict dP, const float *restrict D, int nq) {
    for (int i = 0; i < nq; i++) {
        float *restrict prow = P + i * BK;
        const float *restrict dprow = dP + i * BK;
        const float Di = D[i];
#pragma omp simd
        for (int j = 0; j < BK; j++) prow[j] = prow[j] * (dprow[j] - Di);
    }
}

void cllm_attention_backward(cllm_view dq, cllm_view dk, cllm_view dv, cllm_cview dout,
                             cllm_cview out, const float *lse, cllm_cview q, cllm_cview k,
                             cllm_cview v, const float *alibi, int B, int T, int NH, int NKV,
                             int HS, float scale) {
    assert(HS > 0 && HS <= HSMAX && NKV > 0 && NH % NKV == 0);
    const int group = NH / NKV;
    const int nqb = (T + BQ - 1) / BQ;
    const int nkb = (T + BK - 1) / BK;
    const long nkv_task = (long)B * NKV * nkb;
    const long nq_task = (long)B * NH * nqb;

#pragma omp parallel
    {
        /* Pass 1: dk, dv of one key block of one kv head, summed over every
         * query row at or after the block, of every query head in the group.
         * Key blocks near the start see the most queries: run them first. */
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < nkv_task; task++) {
            const int kb = (int)(task % nkb);
            const int g = (int)((task / nkb) % NKV);
            const int b = (int)(task / ((long)nkb * NKV));
            const int s0 = kb * BK;
            const int nk = T - s0 < BK ? T - s0 : BK;

            float Kt[HSMAX * BK], Vt[HSMAX * BK]; /* [HS,BK] transposed keys, values */
            float Qs[BQ * HSMAX], dOs[BQ * HSMAX]; /* [nq,HS] */
            float P[BQ * BK], dP[BQ * BK];         /* [nq,BK] */
            float dKs[BK * HSMAX], dVs[BK * HSMAX]; /* [nk,HS] sums for this block */
            float D[BQ];

            load_cols(Kt, k, b, T, s0, nk, g, HS);
            load_cols(Vt, v, b, T, s0, nk, g, HS);
            memset(dKs, 0, (size_t)nk * HS * sizeof(float));
            memset(dVs, 0, (size_t)nk * HS * sizeof(float));

            for (int h = g * group; h < (g + 1) * group; h++) {
                const float slope = alibi ? alibi[h] : 0.0f;
                const float *lse_h = lse + ((size_t)b * NH + h) * T;
                for (int t0 = (s0 / BQ) * BQ; t0 < T; t0 += BQ) {
                    const int nq = T - t0 < BQ ? T - t0 : BQ;
                    load_rows(Qs, q, b, T, t0, nq, h, HS);
                    load_rows(dOs, dout, b, T, t0, nq, h, HS);
                    row_dots(D, dOs, out, b, T, t0, nq, h, HS);
                    tile_scores(P, Qs, Kt, nq, HS);
                    tile_probs(P, lse_h + t0, t0, nq, s0, nk, scale, slope);
                    tile_scores(dP, dOs, Vt, nq, HS);
                    /* dv_s += sum_i P[i,s] dout_i, before P turns into dS. */
                    for (int j = 0; j < nk; j++)
                        rows_axpy(dVs + (size_t)j * HS, HS, P + j, BK, dOs, HS, nq);
                    tile_dscores(P, dP, D, nq);
                    for (int j = 0; j < nk; j++)
                        rows_axpy(dKs + (size_t)j * HS, HS, P + j, BK, Qs, HS, nq);
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

        /* Pass 2: dq of one query block of one query head (the implicit
         * barrier above keeps the two passes apart when dq, dk and dv are
         * columns of one fused buffer). */
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

            float Kt[HSMAX * BK], Vt[HSMAX * BK];
            float Qs[BQ * HSMAX], dOs[BQ * HSMAX], dQs[BQ * HSMAX];
            float P[BQ * BK], dP[BQ * BK];
            float D[BQ];

            load_rows(Qs, q, b, T, t0, nq, h, HS);
            load_rows(dOs, dout, b, T, t0, nq, h, HS);
            row_dots(D, dOs, out, b, T, t0, nq, h, HS);
            memset(dQs, 0, (size_t)nq * HS * sizeof(float));

            for (int s0 = 0; s0 < t0 + nq; s0 += BK) {
                const int nk = t0 + nq - s0 < BK ? t0 + nq - s0 : BK;
                load_cols(Kt, k, b, T, s0, nk, g, HS);
                load_cols(Vt, v, b, T, s0, nk, g, HS);
                tile_scores(P, Qs, Kt, nq, HS);
                tile_probs(P, lse_h + t0, t0, nq, s0, nk, scale, slope);
                tile_scores(dP, dOs, Vt, nq, HS);
                tile_dscores(P, dP, D, nq);
                const float *ks = k.p + row_off(b, T, s0, k.rs, g, k.hs);
                for (int i = 0; i < nq; i++)
                    rows_axpy(dQs + (size_t)i * HS, HS, P + i * BK, 1, ks, k.rs, nk);
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
