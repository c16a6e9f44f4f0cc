/*
 * Prompts of int8 / q4 weights on AVX512-VNNI (cllm_qgemm picks this where
 * the CPU has VNNI; quant_impl.h). Integer dots on vpdpbusd, as the decode
 * kernels compute them, tiled for many tokens instead of widening the
 * weights to fp32 for oneDNN: each vpdpbusd is 64 multiply-adds where an
 * fp32 FMA is 16.
 *
 * The activations are quantized exactly as cllm_qmatmul quantizes them
 * (quant_xblock: per 32 values an fp32 scale d_x and int8 codes), so every
 * output is the sum over blocks of d_w * d_x * (exact integer dot), the
 * decode kernel's terms, differing from it only in the fp32 order of that
 * sum.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones. The weights take the
 * unsigned side, offset by o: q4's stored nibbles are already q + 8
 * (o = 8); int8 codes are flipped in their top bit, q + 128 (o = 128).
 * Then sum (q_w + o) q_x = sum q_w q_x + o sum q_x, and each token block's
 * o * sum q_x (corr) starts its integer accumulator negated.
 *
 * Packing: a chunk of the job is NR = 32 weight rows (two groups of 16).
 * For every KC blocks of the row (a segment, 1024 values) each group is
 * gathered into the layout the dot wants: per block, 8 vectors of 64 bytes
 * (vector j holds bytes 4j .. 4j + 3 of all 16 rows, one row per 32-bit
 * lane), then the 16 rows' scales widened to fp32. The packed segment (36
 * KiB) stays in L1 while every token of the prompt passes over it, MT = 4
 * tokens at a time: per block, 8 vpdpbusd per token and group with the
 * token's 4 codes broadcast from memory, then one conversion and one FMA
 * into 16 fp32 outputs. A segment's sums are added to the outputs of the
 * ones before it.
 *
 * Threads: an OpenMP team, chunks handed out dynamically. A prompt's other
 * steps (attention, norms, activations) run on OpenMP teams too; with
 * these chunks on cllm_qmatmul's pool instead, the team's threads spun
 * (their wait after a region) against the pool's for the same two cores:
 * a 512-token q4 prompt of llama-100M took 0.39-0.42 s that way, 0.32 s
 * this way (2 threads, Zen 5). Nothing is allocated.
 */
#include <omp.h>
#include <string.h>

#include "quant_impl.h"

#if defined(__AVX512VL__) && defined(__AVX512BW__)
#include <immintrin.h>

#define VNNI __attribute__((target("avx512vnni")))
#define INLINE __attribute__((always_inline)) inline

enum {
    QB = CLLM_QBLOCK,
    GR = 16,              /* rows per group: one per 32-bit lane */
    NG = 2,               /* groups per chunk */
    NR = NG * GR,         /* rows per chunk */
    KC = 32,              /* blocks per segment */
    MT = 4,               /* tokens per tile */
    PB = 8 * 64 + 64,     /* packed bytes per block and group: codes, scales */
    TOKENS_PER_CHUNK = 8, /* quantization: tokens per loop step */
};

typedef struct {
    float *out;
    const cllm_qweight *w;
    const float *bias;
    const quant_xblock *xq;
    int32_t *corr; /* [M][nb]: -o * (sum of the token block's codes) */
    int M, nb, o;
} vjob;

size_t cllm_qgemm_vnni_scratch_bytes(int cols, int M) {
    return (size_t)M * (size_t)((cols + QB - 1) / QB) * (sizeof(quant_xblock) + sizeof(int32_t));
}

/* corr of tokens [c * TOKENS_PER_CHUNK, (c + 1) * TOKENS_PER_CHUNK) */
static void corr_chunk(const vjob *j, int c) {
    const int m1 = (c + 1) * TOKENS_PER_CHUNK < j->M ? (c + 1) * TOKENS_PER_CHUNK : j->M;
    for (size_t i = (size_t)c * TOKENS_PER_CHUNK * j->nb; i < (size_t)m1 * j->nb; i++) {
        int s = 0;
        for (int k = 0; k < QB; k++) s += j->xq[i].q[k];
        j->corr[i] = -j->o * s;
    }
}

/* Group of n (<= 16; 0: all zero) rows from `row`, blocks [b0, b0 + kc),
 * packed at dst, dst + NG * PB, ... (one block per step). */
VNNI static void pack_group(unsigned char *dst, const unsigned char *row, size_t rb, int n, cllm_wfmt f, int b0,
                            int kc) {
    const __mmask16 m = n >= GR ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)rb));
    const __m512i zero = _mm512_setzero_si512(), nib = _mm512_set1_epi8(15), top = _mm512_set1_epi8((char)0x80);
    const size_t bb = f == CLLM_WFMT_Q4 ? CLLM_Q4_BLOCK_BYTES : CLLM_Q8_BLOCK_BYTES;
    for (int b = 0; b < kc; b++) {
        const unsigned char *blk = row + (size_t)(b0 + b) * bb;
        unsigned char *o = dst + (size_t)b * NG * PB;
        if (f == CLLM_WFMT_Q4) {
            /* bytes 0..15 hold values i (low nibble) and i + 16 (high) */
            for (int j = 0; j < 4; j++) {
                const __m512i g = _mm512_mask_i32gather_epi32(zero, m, idx, blk + 2 + 4 * j, 1);
                _mm512_store_si512((void *)(o + 64 * j), _mm512_and_si512(g, nib));
                _mm512_store_si512((void *)(o + 64 * (j + 4)), _mm512_and_si512(_mm512_srli_epi32(g, 4), nib));
            }
        } else {
            for (int j = 0; j < 8; j++) {
                const __m512i g = _mm512_mask_i32gather_epi32(zero, m, idx, blk + 2 + 4 * j, 1);
                _mm512_store_si512((void *)(o + 64 * j), _mm512_xor_si512(g, top));
            }
        }
        const __m512i h = _mm512_mask_i32gather_epi32(zero, m, idx, blk, 1); /* the fp16 scale in the low half */
        _mm512_store_ps((void *)(o + 512), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    }
}

/* acc[t][g] += the packed segment (kc blocks) times tokens xq, xq + nb, ...
 * (mt of them). */
VNNI static INLINE void tile(__m512 acc[MT][NG], const unsigned char *pan, const quant_xblock *xq,
                             const int32_t *corr, int nb, int kc, const int mt) {
    for (int b = 0; b < kc; b++) {
        const unsigned char *pb = pan + (size_t)b * NG * PB;
        __m512i s[MT][NG];
#pragma GCC unroll 4
        for (int t = 0; t < mt; t++) {
            const __m512i c = _mm512_set1_epi32(corr[(size_t)t * nb + b]);
#pragma GCC unroll 2
            for (int g = 0; g < NG; g++) s[t][g] = c;
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i w[NG];
#pragma GCC unroll 2
            for (int g = 0; g < NG; g++) w[g] = _mm512_load_si512((const void *)(pb + (size_t)g * PB + 64 * j));
#pragma GCC unroll 4
            for (int t = 0; t < mt; t++) {
                int32_t a;
                memcpy(&a, xq[(size_t)t * nb + b].q + 4 * j, sizeof a);
                const __m512i av = _mm512_set1_epi32(a);
#pragma GCC unroll 2
                for (int g = 0; g < NG; g++) s[t][g] = _mm512_dpbusd_epi32(s[t][g], w[g], av);
            }
        }
#pragma GCC unroll 2
        for (int g = 0; g < NG; g++) {
            const __m512 dw = _mm512_load_ps((const void *)(pb + (size_t)g * PB + 512));
#pragma GCC unroll 4
            for (int t = 0; t < mt; t++)
                acc[t][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t][g]),
                                            _mm512_mul_ps(dw, _mm512_set1_ps(xq[(size_t)t * nb + b].d)), acc[t][g]);
        }
    }
}

/* Tokens [t0, t0 + mt) against the chunk's packed segment at blocks b0:
 * their outputs (rows r0 .. r0 + NR - 1 that exist) set (first segment) or
 * added to, and the bias added after the last. */
VNNI static INLINE void tokens(const vjob *j, const unsigned char *pan, int r0, int t0, int b0, int kc, const int mt) {
    const int R = j->w->rows;
    __m512 acc[MT][NG];
#pragma GCC unroll 8
    for (int i = 0; i < MT * NG; i++) acc[i / NG][i % NG] = _mm512_setzero_ps();
    tile(acc, pan, j->xq + (size_t)t0 * j->nb + b0, j->corr + (size_t)t0 * j->nb + b0, j->nb, kc, mt);
    const bool first = b0 == 0, last = b0 + kc == j->nb;
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++) {
        const int r = r0 + g * GR;
        if (r >= R) break;
        const __mmask16 m = R - r >= GR ? (__mmask16)0xffff : (__mmask16)((1u << (R - r)) - 1u);
        const __m512 bias = last && j->bias ? _mm512_maskz_loadu_ps(m, j->bias + r) : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int t = 0; t < mt; t++) {
            float *o = j->out + (size_t)(t0 + t) * R + r;
            __m512 v = first ? acc[t][g] : _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), acc[t][g]);
            _mm512_mask_storeu_ps(o, m, _mm512_add_ps(v, bias));
        }
    }
}

/* The outputs of weight rows [c * NR, (c + 1) * NR) for every token. */
VNNI static void rows_chunk(const vjob *j, int c) {
    const cllm_qweight *w = j->w;
    const int R = w->rows, r0 = c * NR;
    const size_t rb = cllm_wfmt_row_bytes(w->fmt, w->cols);
    _Alignas(64) unsigned char pan[KC * NG * PB];
    for (int b0 = 0; b0 < j->nb; b0 += KC) {
        const int kc = j->nb - b0 < KC ? j->nb - b0 : KC;
        for (int g = 0; g < NG; g++) {
            const int r = r0 + g * GR, n = R - r < GR ? R - r : GR;
            pack_group(pan + (size_t)g * PB, (const unsigned char *)w->data + (size_t)(r < R ? r : r0) * rb, rb, n,
                       w->fmt, b0, kc);
        }
        int t = 0;
        for (; t + MT <= j->M; t += MT) tokens(j, pan, r0, t, b0, kc, MT);
        switch (j->M - t) {
        case 3: tokens(j, pan, r0, t, b0, kc, 3); break;
        case 2: tokens(j, pan, r0, t, b0, kc, 2); break;
        case 1: tokens(j, pan, r0, t, b0, kc, 1); break;
        default: break;
        }
    }
}

void cllm_qgemm_vnni_avx512(float *out, const float *x, const cllm_qweight *w, const float *bias, int M, void *scratch) {
    const int nb = (w->cols + QB - 1) / QB;
    quant_xblock *xq = scratch;
    vjob j = {.out = out,
              .w = w,
              .bias = bias,
              .xq = xq,
              .corr = (int32_t *)(void *)(xq + (size_t)M * nb),
              .M = M,
              .nb = nb,
              .o = w->fmt == CLLM_WFMT_Q4 ? 8 : 128};
    const int tchunks = (M + TOKENS_PER_CHUNK - 1) / TOKENS_PER_CHUNK, rchunks = (w->rows + NR - 1) / NR;
#pragma omp parallel if ((long)M * w->rows * w->cols >= 1L << 20)
    {
        /* inside the region quantx runs on the calling thread */
#pragma omp for schedule(static)
        for (int c = 0; c < tchunks; c++) {
            const int m0 = c * TOKENS_PER_CHUNK, mc = M - m0 < TOKENS_PER_CHUNK ? M - m0 : TOKENS_PER_CHUNK;
            cllm_qmatmul_quantx_avx512(xq + (size_t)m0 * nb, x + (size_t)m0 * w->cols, mc, w->cols);
            corr_chunk(&j, c);
        }
#pragma omp for schedule(dynamic, 1)
        for (int c = 0; c < rchunks; c++) rows_chunk(&j, c);
    }
}

#else
/* the other builds have no VNNI; cllm_qgemm never calls them */
typedef int qgemm_vnni_unused;
#endif
