/*
 * Small-batch matmul over the weight formats of cllm/quant.h:
 * out[M, rows] = x[M, cols] . W^T + bias, for the few rows of a decode step.
 *
 * Compiled once per ISA level (CLLM_KV = portable, avx2, avx512; see
 * CMakeLists.txt); dispatch.c calls the one the CPU allows. The avx2 and
 * avx512 builds share the AVX2 + FMA + F16C intrinsics below (the avx512
 * build runs the fp32 / bf16 tiles on 512-bit registers, and the int8 / q4
 * dots on AVX512-VNNI's vpdpbusd when cllm_cpu() reports it); the portable
 * build is plain C.
 *
 * Every output is the dot product of one weight row with one input row,
 * computed by the same sequence of operations whatever M is (M only decides
 * how often a row is reused), so a sequence's logits do not depend on the
 * batch it runs in.
 *
 * fp32 / bf16: each output accumulates in 8 fp32 lanes (value i to lane
 * i % 8; 16 lanes in the avx512 build), summed in a fixed order at the end;
 * bf16 is widened by a 16-bit shift. Tiles of up to 4 weight rows by 6
 * input rows (3 in the 16-register builds) share their loads (a small GEMM
 * micro-kernel for the rows of a batched decode step) with the same
 * operations per output whatever the tile; with more inputs than one tile
 * takes, the weights of the next rows are prefetched inside the tiles.
 *
 * int8 / q4: the activations are quantized per block of 32 as Q8_0 is (an
 * fp32 scale d_x = max|x| / 127 and int8 codes), and each block contributes
 * d_w * d_x * (exact integer dot of the codes): AVX2's maddubs / madd on 32
 * codes at once, the way llama.cpp multiplies Q4_0 / Q8_0 by Q8_0. That is
 * several times less arithmetic than widening every weight to fp32, which
 * would leave these formats bound by compute rather than memory. A prompt
 * (4 or more rows) runs on tiles of 2 weight rows by 4 tokens (qdot.h; 4
 * rows by 4 tokens on 512-bit registers with VNNI), and a q4 decode step on
 * groups of 4 weight rows, each output still the same operations in the
 * same order as alone.
 *
 * fp32 weights in GPT-2's [cols, rows] layout are read in place, row by
 * row of the stored matrix (axpy form): each thread owns a strip of 64
 * outputs and accumulates x[m, i] * W[i, strip] for i ascending.
 *
 * Threads: the int8 / q4 / bf16 / fp32 [out, in] kernels cut the output
 * rows into chunks (about 8 per thread, each a contiguous run of the
 * matrix) that the pool of pool.c hands out, so a thread that lost its core
 * delays at most the one chunk it holds; the [cols, rows] fp32 kernel runs
 * on OpenMP over output strips. Nothing is allocated.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "quant_impl.h"

#ifndef CLLM_KV
#error "matvec.c is compiled through the variant targets (CLLM_KV=portable|avx2|avx512)"
#endif
#define KV_CAT_(a, b) a##_##b
#define KV_CAT(a, b) KV_CAT_(a, b)
#define QMATMUL KV_CAT(cllm_qmatmul, CLLM_KV)
#define QROUND KV_CAT(cllm_qmatmul_round, CLLM_KV)
#define QQUANTX KV_CAT(cllm_qmatmul_quantx, CLLM_KV)

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QV_SIMD 1
#include <immintrin.h>
#endif

enum { QB = CLLM_QBLOCK, MCHUNK = 16 };

/* A software prefetcher for one chunk's weights, read front to back by a
 * decode step: pf_ahead() asks for every line up to `dist` bytes past the
 * point reached, each line once. The hardware prefetchers leave these
 * streams waiting on memory (rows of 0.4 to 6 KB in groups, the next
 * chunk elsewhere): on a Zen 5 VM, llama-100M's q4 decode went from 243-246
 * to 397-422 tok/s and bf16 from 127-136 to 191-201 with this (2 threads). */
typedef struct {
    const unsigned char *next, *end;
} pf_stream;
/* distances: 8 KiB for the integer dots, 16 KiB for the fp32 / bf16 tiles,
 * which go through their bytes faster (the best of 0, 2, 4, 8, 16 and 32
 * KiB there) */
enum { PF_INT = 8192, PF_FLOAT = 16384 };

static inline pf_stream pf_open(const void *begin, const void *end) {
    const uintptr_t b = (uintptr_t)begin & ~(uintptr_t)63;
    return (pf_stream){(const unsigned char *)b, end};
}

static inline void pf_ahead(pf_stream *s, const void *at, size_t dist) {
    const unsigned char *to = (const unsigned char *)at + dist;
    if (to > s->end) to = s->end;
    for (; s->next < to; s->next += 64) __builtin_prefetch(s->next, 0, 3);
}

/* Below this many weights a matrix runs on the calling thread alone. */
#define QV_PARALLEL_MIN 32768L

static inline float scale_of(const unsigned char *b) {
#ifdef QV_SIMD
    return _cvtsh_ss((unsigned short)(b[0] | b[1] << 8));
#else
    return cllm_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
#endif
}

/* ------------------------------------- fp32 / bf16: 8- or 16-lane tiles */
/* One output accumulates in VL fp32 lanes (value i of the row to lane
 * i % VL, in ascending order; VL = 16 in the avx512 build, 8 in the others),
 * summed in a fixed order at the end. A tile computes
 * RT weight rows times MT input rows at once (up to 4 x MT_MAX: 24 or 12
 * accumulators, the MT inputs of the next VL values, one widened weight
 * vector) so each load feeds several multiply-adds; every output still runs
 * the same operations in the same order, whatever the tile, so the result
 * of a row never depends on M. */
#ifdef QV_SIMD
/* The 8 lanes of s summed in a fixed order (every 8- and 16-lane sum of
 * this file ends here). */
static inline float hsum8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

#if defined(QV_SIMD) && defined(__AVX512F__)
/* 512-bit registers: half the instructions per weight of the 8-lane tiles
 * (a 16-row batched decode step of gpt2-124M is compute-bound) */
enum { VL = 16 };
typedef __m512 vf;
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vf_sum(vf s) { /* the two halves added, then the 8-lane order */
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1)));
}
static inline vf vf_bf16(const uint16_t *src) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)src));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
#elif defined(QV_SIMD)
enum { VL = 8 };
typedef __m256 vf;
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vf_sum(vf s) { return hsum8(s); }
static inline vf vf_bf16(const uint16_t *src) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
#else
enum { VL = 8 };
typedef struct {
    float a[8];
} vf;
static inline vf vf_zero(void) { return (vf){{0}}; }
static inline vf vf_load(const float *p) {
    vf r;
    memcpy(r.a, p, sizeof r.a);
    return r;
}
static inline vf vf_fma(vf a, vf b, vf c) {
    for (int i = 0; i < 8; i++) c.a[i] += a.a[i] * b.a[i];
    return c;
}
static inline float vf_sum(vf s) { /* the SIMD build's order */
    const float h0 = s.a[0] + s.a[4], h1 = s.a[1] + s.a[5], h2 = s.a[2] + s.a[6], h3 = s.a[3] + s.a[7];
    return (h0 + h2) + (h1 + h3);
}
static inline vf vf_bf16(const uint16_t *src) {
    vf r;
    for (int i = 0; i < 8; i++) r.a[i] = cllm_bf16_to_f32(src[i]);
    return r;
}
#endif

/* Inputs per tile: 6 where 32 vector registers hold 4 x 6 accumulators,
 * the 6 inputs and a weight vector (avx512), 3 with 16 registers. */
#if defined(QV_SIMD) && defined(__AVX512F__)
#define MT_MAX 6
#else
#define MT_MAX 3
#endif

/* The VL weights of row w from value k (bf16 widened). */
static inline __attribute__((always_inline)) vf wvec(const unsigned char *w, int k, bool bf16) {
    return bf16 ? vf_bf16((const uint16_t *)(const void *)w + k) : vf_load((const float *)(const void *)w + k);
}

/* out[m + j, r + i] for i < RT, j < MT: rows of w rb bytes apart, inputs K
 * floats apart; a partial last group of VL values is read through
 * zero-padded copies. PF: each step of VL values also prefetches the line
 * at pf (and the next one for fp32), pf moving on by pf_step bytes (about
 * 256 / passes, 128 / passes for bf16), a stream of later rows (rows_chunk). */
static inline __attribute__((always_inline)) void tile_impl(float *out, int R, const unsigned char *w, size_t rb,
                                                            const float *x, int K, const float *bias, uintptr_t pf, size_t pf_step,
                                                            const int RT, const int MT, const bool bf16, const bool PF) {
    vf acc[4][MT_MAX];
    const int full = K & ~(VL - 1);
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 6
        for (int j = 0; j < MT; j++) acc[i][j] = vf_zero();
    for (int k = 0; k < full; k += VL) {
        vf xv[MT_MAX];
        if (PF) {
            __builtin_prefetch((const void *)pf, 0, 3);
            if (!bf16) __builtin_prefetch((const void *)(pf + 64), 0, 3);
            pf += pf_step;
        }
#pragma GCC unroll 6
        for (int j = 0; j < MT; j++) xv[j] = vf_load(x + (size_t)j * K + k);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            vf wv = wvec(w + (size_t)i * rb, k, bf16);
#ifdef QV_SIMD
            /* one load per weight vector: left to itself GCC folds the fp32
             * load into each of the MT multiply-adds (MT loads of it instead
             * of one; gpt2-124M's 16-row step matrices, 2 threads, 31-34 ->
             * 27 ms) */
            if (MT > 1) __asm__("" : "+v"(wv));
#endif
#pragma GCC unroll 6
            for (int j = 0; j < MT; j++) acc[i][j] = vf_fma(wv, xv[j], acc[i][j]);
        }
    }
    if (full < K) {
        float xp[MT_MAX][VL] = {{0}}, wp[VL];
        for (int j = 0; j < MT; j++) memcpy(xp[j], x + (size_t)j * K + full, (size_t)(K - full) * sizeof(float));
        for (int i = 0; i < RT; i++) {
            const unsigned char *wi = w + (size_t)i * rb;
            for (int c = 0; c < VL; c++)
                wp[c] = full + c >= K ? 0.0f
                        : bf16       ? cllm_bf16_to_f32(((const uint16_t *)(const void *)wi)[full + c])
                                     : ((const float *)(const void *)wi)[full + c];
            const vf wv = vf_load(wp);
            for (int j = 0; j < MT; j++) acc[i][j] = vf_fma(wv, vf_load(xp[j]), acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 6
        for (int j = 0; j < MT; j++) out[(size_t)j * R + i] = vf_sum(acc[i][j]) + (bias ? bias[i] : 0.0f);
}

typedef void (*tile_fn)(float *out, int R, const unsigned char *w, size_t rb, const float *x, int K, const float *bias,
                        uintptr_t pf, size_t pf_step);
#define DEFINE_TILE(RT, MT, BF, NAME)                                                                          \
    static void NAME(float *out, int R, const unsigned char *w, size_t rb, const float *x, int K, const float *bias, \
                     uintptr_t pf, size_t pf_step) {                                                           \
        tile_impl(out, R, w, rb, x, K, bias, pf, pf_step, RT, MT, BF, false);                                  \
    }                                                                                                          \
    static void NAME##p(float *out, int R, const unsigned char *w, size_t rb, const float *x, int K, const float *bias, \
                        uintptr_t pf, size_t pf_step) {                                                        \
        tile_impl(out, R, w, rb, x, K, bias, pf, pf_step, RT, MT, BF, true);                                   \
    }
/* the four tiles of MT inputs: fp32 / bf16 weights, 4 rows / 1 row */
#define DEFINE_TILES(MT)                                                                                       \
    DEFINE_TILE(4, MT, false, tile_f4_##MT)                                                                    \
    DEFINE_TILE(1, MT, false, tile_f1_##MT)                                                                    \
    DEFINE_TILE(4, MT, true, tile_b4_##MT)                                                                     \
    DEFINE_TILE(1, MT, true, tile_b1_##MT)
DEFINE_TILES(1)
DEFINE_TILES(2)
DEFINE_TILES(3)
#if MT_MAX == 6
DEFINE_TILES(4)
DEFINE_TILES(5)
DEFINE_TILES(6)
#define TILES_456(P, R, S) , P##R##_4##S, P##R##_5##S, P##R##_6##S
#else
#define TILES_456(P, R, S)
#endif
/* [prefetching][bf16][RT == 4][MT - 1], MT up to MT_MAX */
static const tile_fn tiles[2][2][2][MT_MAX] = {
    {{{tile_f1_1, tile_f1_2, tile_f1_3 TILES_456(tile_f, 1, )}, {tile_f4_1, tile_f4_2, tile_f4_3 TILES_456(tile_f, 4, )}},
     {{tile_b1_1, tile_b1_2, tile_b1_3 TILES_456(tile_b, 1, )}, {tile_b4_1, tile_b4_2, tile_b4_3 TILES_456(tile_b, 4, )}}},
    {{{tile_f1_1p, tile_f1_2p, tile_f1_3p TILES_456(tile_f, 1, p)},
      {tile_f4_1p, tile_f4_2p, tile_f4_3p TILES_456(tile_f, 4, p)}},
     {{tile_b1_1p, tile_b1_2p, tile_b1_3p TILES_456(tile_b, 1, p)},
      {tile_b4_1p, tile_b4_2p, tile_b4_3p TILES_456(tile_b, 4, p)}}}};

/* ------------------------------------- int8 / q4 weights: integer dots */

/* The 32 inputs of block b of x (zero-padded past cols). */
static inline const float *x_block(const float *x, int cols, int b, float pad[QB]) {
    int i0 = b * QB;
    if (i0 + QB <= cols) return x + i0;
    memset(pad, 0, QB * sizeof *pad);
    memcpy(pad, x + i0, (size_t)(cols - i0) * sizeof *pad);
    return pad;
}

typedef quant_xblock xblock; /* quant_impl.h */
_Static_assert(sizeof(xblock) == QUANT_XBLOCK_BYTES, "xblock layout");

#ifdef QV_SIMD
/* The int8 codes of 8 values m = x / d as cllm_quant_code8 gives them:
 * round half away from zero (trunc, then a step away from zero where the
 * exact remainder is at least 1/2), NaN to 0, clamped to +-127. */
static inline __m256i code8x8(__m256 m) {
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(m, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sgn, _mm256_sub_ps(m, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(m, sgn), _mm256_set1_ps(1.0f))));
    r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(r);
}

/* One block of 32 values: d and codes as the scalar rule gives them (a NaN
 * value counts as 0 in max|x|: max_ps returns its second operand when the
 * first is NaN, as fmaxf skips it), and with xc the 8 lanes of -8 times the
 * sum of codes 4i .. 4i + 3 that the q4 dot adds. */
static void quantize_block(xblock *o, int32_t *xc, const float *v) {
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    __m256 x[4], a = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        x[k] = _mm256_loadu_ps(v + 8 * k);
        a = _mm256_max_ps(_mm256_andnot_ps(sgn, x[k]), a);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float d = _mm_cvtss_f32(h) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(code8x8(_mm256_mul_ps(x[0], vid)), code8x8(_mm256_mul_ps(x[1], vid))),
                                   _mm256_packs_epi32(code8x8(_mm256_mul_ps(x[2], vid)), code8x8(_mm256_mul_ps(x[3], vid))));
    /* the packs interleave 4-value groups across the two 128-bit halves */
    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    o->d = d;
    _mm256_storeu_si256((__m256i *)(void *)o->q, q);
    if (xc)
        _mm256_storeu_si256((__m256i *)(void *)xc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), q), _mm256_set1_epi16(-1)));
}
#else
static void quantize_block(xblock *o, int32_t *xc, const float *v) {
    (void)xc; /* the portable dot subtracts 8 from each nibble itself */
    float amax = 0.0f;
    for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    o->d = d;
    for (int i = 0; i < QB; i++) o->q[i] = cllm_quant_code8(v[i] * id);
}
#endif

/* The activations of one call, quantized: xq [M][nb] blocks, and for q4
 * weights xc [M][nb][8] (see qdot.h). */
typedef struct {
    xblock *xq;
    int32_t *xc;
    const float *x;
    int M, K, per;
} qx_job;

static void quantize_chunk(void *ctx, int c) {
    const qx_job *j = ctx;
    const int nb = (j->K + QB - 1) / QB, m1 = (c + 1) * j->per < j->M ? (c + 1) * j->per : j->M;
    for (int m = c * j->per; m < m1; m++)
        for (int b = 0; b < nb; b++) {
            float pad[QB];
            const size_t i = (size_t)m * nb + b;
            quantize_block(j->xq + i, j->xc ? j->xc + 8 * i : NULL, x_block(j->x + (size_t)m * j->K, j->K, b, pad));
        }
}

/* The values d * q of the quantized activations as floats, for cllm_qgemm
 * (the same blocks as quantize_chunk's, so the same codes). */
void QROUND(float *dst, const float *x, int M, int K) {
    const int nb = (K + QB - 1) / QB;
    for (int m = 0; m < M; m++)
        for (int b = 0; b < nb; b++) {
            float pad[QB];
            xblock xb;
            quantize_block(&xb, NULL, x_block(x + (size_t)m * K, K, b, pad));
            const int n = K - b * QB < QB ? K - b * QB : QB;
            float *o = dst + (size_t)m * K + (size_t)b * QB;
            for (int i = 0; i < n; i++) o[i] = xb.d * (float)xb.q[i];
        }
}

/* One matmul cut into chunks of output rows for the thread pool (pool.c):
 * chunk c computes the outputs of rows [c * rows_per, (c + 1) * rows_per)
 * for all M inputs. */
typedef struct {
    float *out;
    const float *x;
    const cllm_qweight *w;
    const float *bias;
    const xblock *xq;
    const int32_t *xc; /* q4 */
    int M, rows_per;
    bool vnni; /* int8 / q4 through the VNNI kernels */
} mm_job;

/* Chunks of at least MIN_CHUNK_BYTES of weights, about 8 per thread (a
 * thread that stalls holds up at most one small chunk), rows a multiple of 8. */
enum { MIN_CHUNK_BYTES = 16384, CHUNKS_PER_THREAD = 8 };

static void run_chunks(quant_task_fn fn, mm_job *j) {
    const int R = j->w->rows, nt = quant_pool_threads();
    const size_t rb = cllm_wfmt_row_bytes(j->w->fmt, j->w->cols);
    if (nt <= 1 || (long)R * j->w->cols * j->M < QV_PARALLEL_MIN) {
        j->rows_per = R;
        fn(j, 0);
        return;
    }
    int per = (R + nt * CHUNKS_PER_THREAD - 1) / (nt * CHUNKS_PER_THREAD);
    const int min_rows = (int)((MIN_CHUNK_BYTES + rb - 1) / rb);
    if (per < min_rows) per = min_rows;
    per = (per + 7) / 8 * 8;
    j->rows_per = per;
    quant_pool_run(fn, j, (R + per - 1) / per);
}

/* Tokens per pass over a chunk's rows: their quantized blocks (36 or 68
 * bytes per 32 inputs) stay in L2 while every row of the chunk reads them. */
enum { TOKEN_STEP = 64 };

/* One output: sum over blocks of d_w * d_x * (integer dot of the codes),
 * the integer dot exact. SIMD: qdot.h, for AVX2 and (the avx512 build,
 * where the CPU has it) AVX512-VNNI; portable: one lane in block order. */
#ifdef QV_SIMD
/* a tile: 2 weight rows by 4 tokens (2x2 to 4x2 and 1x8 timed the same
 * within the noise of a loaded machine, 1 row by 6 or 8 tokens slower) */
enum { TR = 2, TT = 4 };
static inline __m256i dotu_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define QD_SUF avx2
#define QD_ATTR
#define QD_DOTU dotu_avx2
#include "qdot.h"
#undef QD_SUF
#undef QD_ATTR
#undef QD_DOTU
#if defined(__AVX512VL__) && defined(__AVX512BW__)
/* The avx512 build: VNNI where the CPU has it (Cascade Lake, Ice Lake, Zen 4
 * and later; not Skylake-X), checked at run time, so only these functions
 * carry the instruction set. */
#define QV_VNNI 1
#define QD_SUF vnni
#define QD_ATTR __attribute__((target("avx512vnni")))
#define QD_DOTU _mm256_dpbusd_epi32
#define QD_512 1
#include "qdot.h"
#undef QD_512
#undef QD_SUF
#undef QD_ATTR
#undef QD_DOTU
#endif
#else
static float rowdot_portable(cllm_wfmt f, const unsigned char *row, const xblock *xq, const int32_t *xc, int nb) {
    (void)xc;
    const size_t bb = f == CLLM_WFMT_Q4 ? CLLM_Q4_BLOCK_BYTES : CLLM_Q8_BLOCK_BYTES;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const unsigned char *blk = row + (size_t)b * bb;
        int32_t sum = 0;
        if (f == CLLM_WFMT_Q4) {
            for (int j = 0; j < QB / 2; j++)
                sum += ((blk[2 + j] & 15) - 8) * xq[b].q[j] + ((blk[2 + j] >> 4) - 8) * xq[b].q[j + QB / 2];
        } else {
            for (int i = 0; i < QB; i++) sum += (int8_t)blk[2 + i] * xq[b].q[i];
        }
        acc += (float)sum * (scale_of(blk) * xq[b].d);
    }
    return acc;
}
static void rows_portable(const mm_job *j, int r0, int r1, int t0, int t1) {
    const cllm_qweight *w = j->w;
    const int R = w->rows, nb = (w->cols + QB - 1) / QB;
    const size_t rb = cllm_wfmt_row_bytes(w->fmt, w->cols);
    for (int r = r0; r < r1; r++)
        for (int t = t0; t < t1; t++)
            j->out[(size_t)t * R + r] =
                rowdot_portable(w->fmt, (const unsigned char *)w->data + (size_t)r * rb, j->xq + (size_t)t * nb, NULL, nb);
}
#endif

static void quant_chunk(void *ctx, int c) {
    const mm_job *j = ctx;
    const int R = j->w->rows, M = j->M;
    const int r0 = c * j->rows_per, r1 = r0 + j->rows_per < R ? r0 + j->rows_per : R;
    for (int t0 = 0; t0 < M; t0 += TOKEN_STEP) {
        const int t1 = M - t0 < TOKEN_STEP ? M : t0 + TOKEN_STEP;
#if defined(QV_VNNI)
        if (j->vnni)
            rows_vnni(j, r0, r1, t0, t1);
        else
#endif
#if defined(QV_SIMD)
            rows_avx2(j, r0, r1, t0, t1);
#else
        rows_portable(j, r0, r1, t0, t1);
#endif
        if (j->bias)
            for (int t = t0; t < t1; t++) {
                float *o = j->out + (size_t)t * R;
                const float *bias = j->bias;
                /* vectorised (the scalar loop -O2 left was 3% of a 16-client
                 * q4 server's samples) */
#pragma omp simd
                for (int r = r0; r < r1; r++) o[r] += bias[r];
            }
    }
}

/* x[M, K] quantized into xq (and xc: NULL or q4's lanes), on the pool when
 * it is large enough to share. */
static void quantize_x(xblock *xq, int32_t *xc, const float *x, int M, int K) {
    qx_job q = {.xq = xq, .xc = xc, .x = x, .M = M, .K = K, .per = M};
    if ((long)M * K >= 65536 && quant_pool_threads() > 1) {
        q.per = (M + 4 * quant_pool_threads() - 1) / (4 * quant_pool_threads());
        quant_pool_run(quantize_chunk, &q, (M + q.per - 1) / q.per);
    } else {
        quantize_chunk(&q, 0);
    }
}

#if defined(__AVX512F__) /* for qgemm_vnni.c, which only the avx512 build has */
void QQUANTX(xblock *xq, const float *x, int M, int K) { quantize_x(xq, NULL, x, M, K); }
#endif

static void quant_kernel(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch) {
    const int nb = (w->cols + QB - 1) / QB;
    xblock *xq = scratch;
    int32_t *xc = w->fmt == CLLM_WFMT_Q4 ? (int32_t *)(void *)((unsigned char *)scratch + (size_t)M * nb * sizeof *xq)
                                         : NULL;
    quantize_x(xq, xc, x, M, w->cols);
    mm_job j = {.out = out, .x = x, .w = w, .bias = bias, .xq = xq, .xc = xc, .M = M};
#ifdef QV_VNNI
    j.vnni = cllm_cpu()->avx512_vnni;
#endif
    run_chunks(quant_chunk, &j);
}

/* Row-major formats: tiles of 4 weight rows (one row at the chunk's end)
 * by up to MT_MAX inputs; a tile's rows stay in cache while the inputs go
 * by, in as few passes as MT_MAX allows, the inputs spread evenly over them
 * (16 rows: 6 + 5 + 5, or 3 + 3 + 3 + 3 + 2 + 2; never a 4 x 1 tile beside
 * larger ones, which does 4 multiply-adds per 5 loads). */
static void rows_chunk(void *ctx, int c) {
    const mm_job *j = ctx;
    const cllm_qweight *w = j->w;
    const int R = w->rows, K = w->cols, M = j->M;
    const int r0 = c * j->rows_per, r1 = r0 + j->rows_per < R ? r0 + j->rows_per : R;
    const size_t rb = cllm_wfmt_row_bytes(w->fmt, K);
    const int bf = w->fmt == CLLM_WFMT_BF16;
    const int passes = (M + MT_MAX - 1) / MT_MAX; /* tile passes over the inputs */
    pf_stream pf = pf_open((const unsigned char *)w->data + (size_t)r0 * rb, (const unsigned char *)w->data + (size_t)r1 * rb);
    /* several passes: pass p prefetches share bytes of the next 4 rows, pf_step a step */
    const int steps = K / VL > 0 ? K / VL : 1;
    const size_t share = (4 * rb + passes - 1) / passes, pf_step = (share + steps - 1) / steps;
    for (int r = r0; r < r1;) {
        const int rt = r1 - r >= 4 ? 4 : 1;
        const unsigned char *row = (const unsigned char *)w->data + (size_t)r * rb;
        /* a lone pass (a decode step) streams through pf; with several,
         * pass p prefetches its share of the next 4 rows, a line or two
         * per step of its tile (tiles[1]), so they come from memory at an
         * even pace while this tile computes. Without it the first pass
         * waited on memory (gpt2-124M's 16-row step matrices, Zen 5, 2
         * threads: 25.7 -> 18.9 ms); the whole share asked for at once
         * before each pass, the scheme before, filled the miss queue and
         * stalled the tile (slower on Zen 5 than no prefetch at all). */
        if (passes == 1) pf_ahead(&pf, row, PF_FLOAT);
        for (int m = 0, mt, p = 0; m < M; m += mt, p++) {
            mt = (M - m + (passes - p) - 1) / (passes - p); /* the inputs spread evenly over the passes */
            tiles[passes > 1][bf][rt == 4][mt - 1](j->out + (size_t)m * R + r, R, row, rb, j->x + (size_t)m * K, K,
                                                   j->bias ? j->bias + r : NULL,
                                                   (uintptr_t)(row + (size_t)rt * rb) + (uintptr_t)p * share, pf_step);
        }
        r += rt;
    }
}

static void rows_kernel(float *out, const float *x, const cllm_qweight *w, const float *bias, int M) {
    mm_job j = {.out = out, .x = x, .w = w, .bias = bias, .M = M};
    run_chunks(rows_chunk, &j);
}

/* acc[0, n) += xv * wi[0, n): one fused multiply-add per weight (a plain
 * multiply and add in the portable build). */
static inline void axpy(float *acc, float xv, const float *wi, int n) {
    int k = 0;
#ifdef QV_SIMD
    __m256 xb = _mm256_set1_ps(xv);
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(acc + k, _mm256_fmadd_ps(xb, _mm256_loadu_ps(wi + k), _mm256_loadu_ps(acc + k)));
    for (; k < n; k++) acc[k] = fmaf(xv, wi[k], acc[k]);
#else
    for (; k < n; k++) acc[k] += xv * wi[k];
#endif
}

/* fp32 [cols, rows] (in_out): each thread owns one contiguous range of
 * outputs and walks the stored rows in order, accumulating x[m, i] times
 * the row's part in an L1-resident buffer (strips of at most ACC floats
 * over all the inputs of a chunk of up to MCHUNK rows), so each stored row
 * is read as one contiguous piece per thread. Every output is the sum over
 * i in ascending order, whatever M, the strip or the thread count. */
enum { ACC = 4096 };
static void in_out_kernel(float *out, const float *x, const cllm_qweight *w, const float *bias, int M) {
    const int R = w->rows, K = w->cols;
    const float *W = w->data;
#pragma omp parallel if ((long)R * K >= QV_PARALLEL_MIN)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int per = ((R + nt - 1) / nt + 15) / 16 * 16;
        const int j0 = t * per < R ? t * per : R, j1 = j0 + per < R ? j0 + per : R;
        float acc[ACC];
        for (int m0 = 0; m0 < M; m0 += MCHUNK) {
            const int mc = M - m0 < MCHUNK ? M - m0 : MCHUNK, cw = ACC / mc / 16 * 16;
            for (int js = j0; js < j1; js += cw) {
                const int n = j1 - js < cw ? j1 - js : cw;
                memset(acc, 0, (size_t)mc * (size_t)n * sizeof *acc);
                /* the strip of row i + ahead, about PF_FLOAT bytes on:
                 * the hardware prefetcher does not follow a strip per row */
                const int ahead = (int)(PF_FLOAT / ((size_t)n * sizeof(float))) + 1;
                for (int i = 0; i < K; i++) {
                    const float *wi = W + (size_t)i * R + js;
                    if (mc <= 3 && i + ahead < K)
                        for (int b = 0; b < n; b += 16) __builtin_prefetch(wi + (size_t)ahead * R + b, 0, 3);
                    for (int m = 0; m < mc; m++) axpy(acc + (size_t)m * n, x[(size_t)(m0 + m) * K + i], wi, n);
                }
                for (int m = 0; m < mc; m++) {
                    float *o = out + (size_t)(m0 + m) * R + js;
                    for (int k = 0; k < n; k++) o[k] = acc[(size_t)m * n + k] + (bias ? bias[js + k] : 0.0f);
                }
            }
        }
    }
}

void QMATMUL(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch) {
    if (w->fmt == CLLM_WFMT_INT8 || w->fmt == CLLM_WFMT_Q4)
        quant_kernel(out, x, w, bias, M, scratch);
    else if (w->fmt == CLLM_WFMT_FP32 && w->in_out)
        in_out_kernel(out, x, w, bias, M);
    else
        rows_kernel(out, x, w, bias, M);
}
