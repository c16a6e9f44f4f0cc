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
 * The avx512 build, for head sizes that are a multiple of 16, runs tiles
 * of up to 8 rows against groups of 16 keys instead (attend_tile below:
 * the query heads that share a key/value head and consecutive positions of
 * a sequence; each key read, or widened from bf16, once per tile, 16
 * scores per transposing reduction, exp on 16 lanes): a 512-token prompt's
 * attention (llama-100M, bf16 cache) in a third of the time, and a decode
 * step reads each cached key once for its whole head group. A row there
 * too gets the same bits whatever its tile, batch or thread.
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
#include "cllm/quant.h"

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

#if defined(__AVX512F__)
#include <immintrin.h>

#include "exp_impl.h"

/* ------------------------------------------------ AVX-512: tiles of rows
 * For head sizes that are a multiple of 16 (64, 128, ...). Keys go by in
 * groups of KG = 16 at absolute positions 16n .. 16n + 15, each group
 * read in place (fp32) or widened once into fp32 buffers (bf16) and used
 * by every row of a tile: up to QT rows that read one key/value head, the
 * query heads of a group (GQA) at consecutive positions of one sequence (a
 * prompt's rows share their keys; a decode step's tile is its row's head
 * group). The next group's keys and values are prefetched. For each row
 * and group:
 *   - the 16 dot products: per key, HS / 16 lane-wise FMAs, then one
 *     transposing reduction of the 16 partial vectors into a vector of 16
 *     scores (no per-key horizontal sum);
 *   - scale, ALiBi and the causal / window mask on the vector, then the
 *     online softmax with exp_simd on 16 lanes and a lane-wise running sum;
 *   - the value update: per key, HS / 16 FMAs with its probability
 *     broadcast.
 * A row's operations depend only on its own position and keys (groups are
 * aligned to absolute positions, masked lanes never mix with others), so it
 * gets the same bits in any tile, batch or thread. */
enum { KG = 16, QT = 8 };

/* out[j] = sum of the 16 lanes of p[j], j < 16 (a fixed order). */
static inline __m512 reduce16(const __m512 p[KG]) {
    __m512 t[8], u[4];
    for (int k = 0; k < 8; k++) /* lanes 0, 2 of each 128-bit part: key 2k; 1, 3: key 2k + 1 */
        t[k] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * k], p[2 * k + 1]), _mm512_unpackhi_ps(p[2 * k], p[2 * k + 1]));
    for (int k = 0; k < 4; k++) { /* each 128-bit part: keys 4k .. 4k + 3, that part's sums */
        const __m512d a = _mm512_castps_pd(t[2 * k]), b = _mm512_castps_pd(t[2 * k + 1]);
        u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    /* the four 128-bit parts of u[k] summed into part k */
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

/* Position s's key or value row (fp32, or bf16 when bf16). */
static inline const void *kv_row(const void *base, bool bf16, const int32_t *table, int BS, size_t bstride, int HS,
                                 int s) {
    const size_t at = (size_t)table[s / BS] * bstride + (size_t)(s % BS) * HS;
    return (const char *)base + at * (bf16 ? sizeof(uint16_t) : sizeof(float));
}

static inline void widen_row(float *dst, const uint16_t *h, int HS) {
    for (int d = 0; d < HS; d += 16) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(h + d));
        _mm512_store_ps(dst + d, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
}

/* What a key group's lanes read past the keys a tile needs. */
static _Alignas(64) const float zero_row[HSMAX];

/* One row of a tile: its query, output, absolute position and ALiBi slope. */
typedef struct {
    const float *q;
    float *out;
    int pos;
    float slope;
} tile_row;

/* One row against one group of KG keys from s0 (kp / vp: the keys' and
 * values' fp32 rows): the online softmax state m, l and acc updated. NV =
 * HS / 16, a constant where the caller can give one, so the dot products
 * of the 16 keys and the 16-lane slices of the value update are unrolled
 * into independent chains instead of one chain of dependent FMAs. */
static inline __attribute__((always_inline)) void row_group(float *acc, float *m, __m512 *l, const tile_row *rw, int f,
                                                            int s0, const float *const *kp, const float *const *vp,
                                                            float scale, const int NV) {
    const int p = rw->pos;
    const float *qr = rw->q;
    const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 part[KG];
#pragma GCC unroll 16
    for (int j = 0; j < KG; j++) {
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qr), _mm512_loadu_ps(kp[j]));
#pragma GCC unroll 8
        for (int c = 1; c < NV; c++)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * c), _mm512_loadu_ps(kp[j] + 16 * c), a);
        part[j] = a;
    }
    const __m512 rel = _mm512_add_ps(lane, _mm512_set1_ps((float)(s0 - p))); /* s - p */
    __m512 sc = _mm512_mul_ps(_mm512_set1_ps(scale), reduce16(part));
    sc = _mm512_fmadd_ps(_mm512_set1_ps(rw->slope), rel, sc);
    const __mmask16 ok = _mm512_cmp_ps_mask(rel, _mm512_setzero_ps(), _CMP_LE_OQ) &
                         _mm512_cmp_ps_mask(rel, _mm512_set1_ps((float)(f - p)), _CMP_GE_OQ);
    sc = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, sc);
    const float gm = _mm512_reduce_max_ps(sc), mx = gm > *m ? gm : *m;
    if (mx != *m) {
        const float corr = exp_simd(*m - mx); /* m is -inf only before the first group: acc, l zero */
        *l = _mm512_mul_ps(*l, _mm512_set1_ps(corr));
        const __m512 cv = _mm512_set1_ps(corr);
        for (int c = 0; c < NV; c++) _mm512_store_ps(acc + 16 * c, _mm512_mul_ps(_mm512_load_ps(acc + 16 * c), cv));
        *m = mx;
    }
    _Alignas(64) float pr[KG];
    _mm512_store_ps(pr, _mm512_sub_ps(sc, _mm512_set1_ps(mx)));
#pragma omp simd
    for (int j = 0; j < KG; j++) pr[j] = exp_simd(pr[j]);
    const __m512 pv = _mm512_maskz_mov_ps(ok, _mm512_load_ps(pr));
    _mm512_store_ps(pr, pv);
    *l = _mm512_add_ps(*l, pv);
    const int j0 = f > s0 ? f - s0 : 0, j1 = p - s0 < KG - 1 ? p - s0 : KG - 1;
    /* up to 8 slices of 16 lanes in registers at a time; each lane adds
     * the keys in ascending order */
    for (int c0 = 0; c0 < NV; c0 += 8) {
        const int cn = NV - c0 < 8 ? NV - c0 : 8;
        __m512 o[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) o[c] = c < cn ? _mm512_load_ps(acc + 16 * (c0 + c)) : _mm512_setzero_ps();
        for (int j = j0; j <= j1; j++) {
            const __m512 pj = _mm512_set1_ps(pr[j]);
#pragma GCC unroll 8
            for (int c = 0; c < cn; c++) o[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vp[j] + 16 * (c0 + c)), o[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < cn; c++) _mm512_store_ps(acc + 16 * (c0 + c), o[c]);
    }
}

/* The rows of one tile (nr <= QT, positions ascending), all reading the
 * same key/value head: consecutive positions of one sequence, the query
 * heads that share a key/value head (grouped-query attention), or both.
 * fp32 keys are read where they lie in the cache; bf16 ones are widened
 * once per group into kf / vf. */
static void attend_tile(const tile_row *rw, int nr, const void *k, const void *v, bool bf16, const int32_t *table,
                        int BS, size_t bstride, int window, int HS, float scale) {
    _Alignas(64) float kf[KG][HSMAX], vf[KG][HSMAX], acc[QT][HSMAX];
    const float *kp[KG], *vp[KG];
    float m[QT];
    __m512 l[QT];
    const int nv = HS / 16, last = rw[nr - 1].pos;
    int first[QT] = {0};
    for (int i = 0; i < nr; i++) {
        const int p = rw[i].pos;
        first[i] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        m[i] = -INFINITY;
        l[i] = _mm512_setzero_ps();
        memset(acc[i], 0, (size_t)HS * sizeof(float));
    }
    const bool whole = BS % KG == 0;
    const size_t rowb = (size_t)HS * (bf16 ? sizeof(uint16_t) : sizeof(float));
    for (int s0 = first[0] / KG * KG; s0 <= last; s0 += KG) {
        const int nk = last + 1 - s0 < KG ? last + 1 - s0 : KG;
        const int lo = s0 > first[0] ? s0 : first[0]; /* no row reads keys before its window */
        /* when blocks hold whole groups (BS a multiple of 16, as every
         * cache cllm makes), a group's keys are consecutive rows of one
         * block: one table lookup for the group, not a division per key */
        const char *kb = whole ? kv_row(k, bf16, table, BS, bstride, HS, s0) : NULL;
        const char *vb = whole ? kv_row(v, bf16, table, BS, bstride, HS, s0) : NULL;
        for (int j = 0; j < KG; j++) {
            if (s0 + j < lo || j >= nk) {
                kp[j] = vp[j] = zero_row;
                continue;
            }
            const void *ks = whole ? kb + j * rowb : kv_row(k, bf16, table, BS, bstride, HS, s0 + j);
            const void *vs = whole ? vb + j * rowb : kv_row(v, bf16, table, BS, bstride, HS, s0 + j);
            if (bf16) {
                widen_row(kf[j], ks, HS);
                widen_row(vf[j], vs, HS);
                kp[j] = kf[j];
                vp[j] = vf[j];
            } else {
                kp[j] = ks;
                vp[j] = vs;
            }
        }
        /* the next group's keys and values start on another 4 KiB page
         * (fp32, head size 64), where the hardware prefetcher stops: asked
         * for here, they arrive while this group computes */
        if (whole && s0 + KG <= last) {
            const int n = last + 1 - (s0 + KG) < KG ? last + 1 - (s0 + KG) : KG;
            const char *nk0 = kv_row(k, bf16, table, BS, bstride, HS, s0 + KG);
            const char *nv0 = kv_row(v, bf16, table, BS, bstride, HS, s0 + KG);
            for (size_t b = 0; b < (size_t)n * rowb; b += 64) {
                __builtin_prefetch(nk0 + b, 0, 3);
                __builtin_prefetch(nv0 + b, 0, 3);
            }
        }
        for (int i = 0; i < nr; i++) {
            const int p = rw[i].pos, f = first[i];
            /* a group wholly before the row's window or after its position
             * adds nothing: skipped, the row runs the operations it runs
             * alone */
            if (s0 + KG <= f || s0 > p) continue;
            switch (nv) { /* head sizes 64 and 128 with their loops unrolled */
            case 4: row_group(acc[i], &m[i], &l[i], &rw[i], f, s0, kp, vp, scale, 4); break;
            case 8: row_group(acc[i], &m[i], &l[i], &rw[i], f, s0, kp, vp, scale, 8); break;
            default: row_group(acc[i], &m[i], &l[i], &rw[i], f, s0, kp, vp, scale, nv); break;
            }
        }
    }
    for (int i = 0; i < nr; i++) {
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(l[i]));
        for (int c = 0; c < nv; c++)
            _mm512_storeu_ps(rw[i].out + 16 * c, _mm512_mul_ps(_mm512_load_ps(acc[i] + 16 * c), inv));
    }
}
#endif

/* One call's operands, shared by its tasks: task t is row N - 1 - t / NH
 * (later rows of a sequence have more keys: they go first), head t % NH. */
typedef struct {
    cllm_view out;
    cllm_cview q;
    const void *kpool, *vpool;
    bool bf16;
    const int32_t *table, *rows, *past;
    const float *alibi;
    int max_blocks, BS, n_seq, NH, NKV, HS, window, N;
    long ntask, per;
    float scale;
} paged_job;

static void paged_task(const paged_job *j, long task) {
    const int BS = j->BS, HS = j->HS, group = j->NH / j->NKV;
    const size_t bstride = (size_t)j->NKV * BS * HS;
    const int r = j->N - 1 - (int)(task / j->NH), h = (int)(task % j->NH);
    int lo = 0, hi = j->n_seq - 1; /* the sequence of row r: rows[i] <= r < rows[i + 1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->rows[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    const int i = lo, pos = j->past[i] + (r - j->rows[i]), g = h / group;
    assert((pos + BS) / BS <= j->max_blocks);
    const float *qr = j->q.p + (ptrdiff_t)r * j->q.rs + (ptrdiff_t)h * j->q.hs;
    float *o = j->out.p + (ptrdiff_t)r * j->out.rs + (ptrdiff_t)h * j->out.hs;
    const size_t goff = (size_t)g * BS * HS;
    const int first = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
    const int32_t *tab = j->table + (size_t)i * j->max_blocks;
    const float slope = j->alibi ? j->alibi[h] : 0.0f;
#if defined(__AVX512F__)
    if (HS % 16 == 0) {
        /* a tile: up to QT rows, hc query heads of one key/value head
         * (all of them when they fit) at pt consecutive positions; the
         * task of its first row and head runs it, the others return */
        const int hc = group < QT ? group : QT, pt = QT / hc;
        const int t = r - j->rows[i], hg = h % group;
        if (t % pt || hg % hc) return;
        const int np = j->rows[i + 1] - r < pt ? j->rows[i + 1] - r : pt, nh = group - hg < hc ? group - hg : hc;
        const size_t esz = j->bf16 ? sizeof(uint16_t) : sizeof(float);
        tile_row rw[QT];
        int nr = 0;
        for (int a = 0; a < np; a++)
            for (int b = 0; b < nh; b++, nr++)
                rw[nr] = (tile_row){.q = qr + (ptrdiff_t)a * j->q.rs + (ptrdiff_t)b * j->q.hs,
                                    .out = o + (ptrdiff_t)a * j->out.rs + (ptrdiff_t)b * j->out.hs,
                                    .pos = pos + a,
                                    .slope = j->alibi ? j->alibi[h + b] : 0.0f};
        attend_tile(rw, nr, (const char *)j->kpool + goff * esz, (const char *)j->vpool + goff * esz, j->bf16, tab,
                    BS, bstride, j->window, HS, j->scale);
        return;
    }
#endif
    if (j->bf16)
        attend_row_bf16(o, qr, (const uint16_t *)j->kpool + goff, (const uint16_t *)j->vpool + goff, tab, BS, bstride,
                        first, pos + 1, pos, HS, j->scale, slope);
    else
        attend_row(o, qr, (const float *)j->kpool + goff, (const float *)j->vpool + goff, tab, BS, bstride, first,
                   pos + 1, pos, HS, j->scale, slope);
}

/* Chunk c: tasks [c * per, (c + 1) * per). */
static void paged_chunk(void *ctx, int c) {
    const paged_job *j = ctx;
    const long t1 = (long)(c + 1) * j->per < j->ntask ? (long)(c + 1) * j->per : j->ntask;
    for (long t = (long)c * j->per; t < t1; t++) paged_task(j, t);
}

/* Both storage types: kpool / vpool hold floats, or bf16 values when bf16.
 * The (row, head) tasks of a decode step (up to POOL_MAX_ROWS rows, whose
 * matmuls run on cllm_qmatmul's pool) run on that pool too
 * (cllm_quant_parallel), about 8 chunks per thread, so no OpenMP team
 * wakes between the matmuls to spin against the pool's threads; longer
 * calls (prompts, whose matmuls are oneDNN's) on OpenMP. */
enum { POOL_MAX_ROWS = 16 };
static void paged(cllm_view out, cllm_cview q, const void *kpool, const void *vpool, bool bf16, const int32_t *table,
                  int max_blocks, int BS, const int32_t *rows, const int32_t *past, const float *alibi, int n_seq,
                  int NH, int NKV, int HS, float scale, int window) {
    assert(HS > 0 && HS <= HSMAX && NKV > 0 && NH % NKV == 0 && BS > 0 && n_seq >= 0);
    paged_job j = {.out = out, .q = q, .kpool = kpool, .vpool = vpool, .bf16 = bf16, .table = table, .rows = rows,
                   .past = past, .alibi = alibi, .max_blocks = max_blocks, .BS = BS, .n_seq = n_seq, .NH = NH,
                   .NKV = NKV, .HS = HS, .window = window, .N = n_seq > 0 ? rows[n_seq] : 0, .scale = scale};
    j.ntask = (long)j.N * NH;
    if (j.ntask == 0) return;
    double keys = 0;
    for (int i = 0; i < n_seq; i++) keys += (double)(rows[i + 1] - rows[i]) * (past[i] + rows[i + 1] - rows[i]);
    /* A decode step of a small model is a few thousand multiply-adds, less
     * than handing out chunks costs: run those on the caller. */
    const bool par = keys * NH * HS > 65536.0;
    if (j.N > POOL_MAX_ROWS) { /* a prompt: its matmuls ran on oneDNN's OpenMP team, so this does too */
#pragma omp parallel for schedule(dynamic, 1) if (par)
        for (long t = 0; t < j.ntask; t++) paged_task(&j, t);
        return;
    }
    const int nt = par ? cllm_quant_threads() : 1;
    if (nt <= 1) {
        j.per = j.ntask;
        paged_chunk(&j, 0);
        return;
    }
    j.per = (j.ntask + 8L * nt - 1) / (8L * nt);
    if (j.per * 0xffffL < j.ntask) j.per = (j.ntask + 0xfffe) / 0xffff; /* the pool takes at most 65535 chunks */
    cllm_quant_parallel(paged_chunk, &j, (int)((j.ntask + j.per - 1) / j.per));
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
