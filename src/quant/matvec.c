/*
 * Small-batch matmul over the weight formats of cllm/quant.h:
 * out[M, rows] = x[M, cols] . W^T + bias, for the few rows of a decode step.
 *
 * Compiled once per ISA level (CLLM_KV = portable, avx2, avx512; see
 * CMakeLists.txt); dispatch.c calls the one the CPU allows. The avx2 and
 * avx512 builds share the AVX2 + FMA + F16C intrinsics below (the avx512
 * build lets the compiler use the wider registers elsewhere); the portable
 * build is plain C.
 *
 * Every output is the dot product of one weight row with one input row,
 * computed by the same sequence of operations whatever M is (M only decides
 * how often a row is reused), so a sequence's logits do not depend on the
 * batch it runs in. The 32 values of a block go to 32 accumulator lanes
 * (value i to lane i % 32); lanes are summed in a fixed order at the end.
 * Weights are widened to fp32 before the multiply: bf16 by a 16-bit shift,
 * int8 / q4 as d * q (exact in fp32: an 11-bit scale times an 8-bit
 * integer), so every format computes the fp32 product of its dequantized
 * weights. For M > 1 a row is widened once into a stack buffer and reused;
 * the values are the same, so the result is too.
 *
 * fp32 weights in GPT-2's [cols, rows] layout are read in place, row by
 * row of the stored matrix (axpy form): each thread owns a strip of 64
 * outputs and accumulates x[m, i] * W[i, strip] for i ascending.
 *
 * Threads: OpenMP over output rows (strips), static schedule, so each
 * thread streams one contiguous part of the matrix. Nothing is allocated.
 */
#include <math.h>
#include <string.h>

#include "quant_impl.h"

#ifndef CLLM_KV
#error "matvec.c is compiled through the variant targets (CLLM_KV=portable|avx2|avx512)"
#endif
#define KV_CAT_(a, b) a##_##b
#define KV_CAT(a, b) KV_CAT_(a, b)
#define QMATMUL KV_CAT(cllm_qmatmul, CLLM_KV)

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QV_SIMD 1
#include <immintrin.h>
#endif

enum { QB = CLLM_QBLOCK, ROWBUF = 8192, STRIP = 64, MCHUNK = 16 };

/* Below this many weights a matrix runs on the calling thread alone. */
#define QV_PARALLEL_MIN 32768L

static inline float scale_of(const unsigned char *b) {
#ifdef QV_SIMD
    return _cvtsh_ss((unsigned short)(b[0] | b[1] << 8));
#else
    return cllm_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
#endif
}

/* ------------------------------------------------------ the 32-lane block */
#ifdef QV_SIMD
typedef struct {
    __m256 a[4];
} lanes;
static inline void lanes_zero(lanes *l) {
    for (int k = 0; k < 4; k++) l->a[k] = _mm256_setzero_ps();
}
static inline void lanes_fma(lanes *l, const __m256 w[4], const float *x) {
    for (int k = 0; k < 4; k++) l->a[k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), l->a[k]);
}
static inline float lanes_sum(const lanes *l) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(l->a[0], l->a[1]), _mm256_add_ps(l->a[2], l->a[3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
/* the 32 fp32 weights of block b of a row */
static inline void widen_f32(__m256 w[4], const float *src) {
    for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps(src + 8 * k);
}
static inline void widen_bf16(__m256 w[4], const uint16_t *src) {
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 8 * k)));
        w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
}
static inline void widen_int8(__m256 w[4], const unsigned char *b) {
    __m256 d = _mm256_set1_ps(scale_of(b));
    for (int k = 0; k < 4; k++) {
        __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + 8 * k));
        w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
}
static inline void widen_q4(__m256 w[4], const unsigned char *b) {
    __m256 d = _mm256_set1_ps(scale_of(b));
    const __m128i m15 = _mm_set1_epi8(15), m8 = _mm_set1_epi8(8);
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
    __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m15), m8);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m15), m8);
    __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])));
}
static inline void store_block(float *dst, const __m256 w[4]) {
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, w[k]);
}
#else
typedef struct {
    float a[QB];
} lanes;
static inline void lanes_zero(lanes *l) { memset(l->a, 0, sizeof l->a); }
static inline void lanes_fma(lanes *l, const float w[QB], const float *x) {
    for (int i = 0; i < QB; i++) l->a[i] += w[i] * x[i];
}
static inline float lanes_sum(const lanes *l) {
    float s[8];
    for (int j = 0; j < 8; j++) s[j] = (l->a[j] + l->a[8 + j]) + (l->a[16 + j] + l->a[24 + j]);
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}
static inline void widen_f32(float w[QB], const float *src) { memcpy(w, src, QB * sizeof *w); }
static inline void widen_bf16(float w[QB], const uint16_t *src) {
    for (int i = 0; i < QB; i++) w[i] = cllm_bf16_to_f32(src[i]);
}
static inline void widen_int8(float w[QB], const unsigned char *b) {
    float d = scale_of(b);
    for (int i = 0; i < QB; i++) w[i] = d * (float)(int8_t)b[2 + i];
}
static inline void widen_q4(float w[QB], const unsigned char *b) {
    float d = scale_of(b);
    for (int j = 0; j < QB / 2; j++) {
        w[j] = d * (float)((b[2 + j] & 15) - 8);
        w[j + QB / 2] = d * (float)((b[2 + j] >> 4) - 8);
    }
}
static inline void store_block(float *dst, const float w[QB]) { memcpy(dst, w, QB * sizeof *dst); }
#endif

#ifdef QV_SIMD
#define WBLOCK __m256 wb[4]
#else
#define WBLOCK float wb[QB]
#endif

/* Block b of a stored row, widened into wb. A partial last block of an
 * fp32 / bf16 row reads through a zero-padded copy. */
static inline void widen_block(cllm_wfmt f, const unsigned char *row, int cols, int b,
#ifdef QV_SIMD
                               __m256 wb[4]
#else
                               float wb[QB]
#endif
) {
    int i0 = b * QB;
    if (f == CLLM_WFMT_INT8) {
        widen_int8(wb, row + (size_t)b * CLLM_Q8_BLOCK_BYTES);
    } else if (f == CLLM_WFMT_Q4) {
        widen_q4(wb, row + (size_t)b * CLLM_Q4_BLOCK_BYTES);
    } else if (f == CLLM_WFMT_BF16) {
        const uint16_t *src = (const uint16_t *)(const void *)row + i0;
        uint16_t pad[QB];
        if (i0 + QB > cols) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, src, (size_t)(cols - i0) * sizeof *pad);
            src = pad;
        }
        widen_bf16(wb, src);
    } else {
        const float *src = (const float *)(const void *)row + i0;
        float pad[QB];
        if (i0 + QB > cols) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, src, (size_t)(cols - i0) * sizeof *pad);
            src = pad;
        }
        widen_f32(wb, src);
    }
}

/* The 32 inputs of block b of x (zero-padded past cols). */
static inline const float *x_block(const float *x, int cols, int b, float pad[QB]) {
    int i0 = b * QB;
    if (i0 + QB <= cols) return x + i0;
    memset(pad, 0, QB * sizeof *pad);
    memcpy(pad, x + i0, (size_t)(cols - i0) * sizeof *pad);
    return pad;
}

/* One output: row . x, widening the row block by block. */
static float dot_row(cllm_wfmt f, const unsigned char *row, const float *x, int cols) {
    lanes acc;
    lanes_zero(&acc);
    float xpad[QB];
    int nb = (cols + QB - 1) / QB;
    for (int b = 0; b < nb; b++) {
        WBLOCK;
        widen_block(f, row, cols, b, wb);
        lanes_fma(&acc, wb, x_block(x, cols, b, xpad));
    }
    return lanes_sum(&acc);
}

/* One output from a row widened beforehand into wrow (nb * 32 floats). */
static float dot_wide(const float *wrow, const float *x, int cols) {
    lanes acc;
    lanes_zero(&acc);
    float xpad[QB];
    int nb = (cols + QB - 1) / QB;
    for (int b = 0; b < nb; b++) {
        WBLOCK;
        widen_f32(wb, wrow + (size_t)b * QB);
        lanes_fma(&acc, wb, x_block(x, cols, b, xpad));
    }
    return lanes_sum(&acc);
}

/* Row-major formats: one output channel per iteration, all M inputs. */
static void rows_kernel(float *out, const float *x, const cllm_qweight *w, const float *bias, int M) {
    const int R = w->rows, K = w->cols, nb = (K + QB - 1) / QB;
    const size_t rb = cllm_wfmt_row_bytes(w->fmt, K);
    const bool widen_once = M > 1 && nb * QB <= ROWBUF;
#pragma omp parallel for schedule(static) if ((long)R * K >= QV_PARALLEL_MIN)
    for (int r = 0; r < R; r++) {
        const unsigned char *row = (const unsigned char *)w->data + (size_t)r * rb;
        const float bv = bias ? bias[r] : 0.0f;
        if (!widen_once) {
            for (int m = 0; m < M; m++) out[(size_t)m * R + r] = dot_row(w->fmt, row, x + (size_t)m * K, K) + bv;
            continue;
        }
        float wrow[ROWBUF];
        for (int b = 0; b < nb; b++) {
            WBLOCK;
            widen_block(w->fmt, row, K, b, wb);
            store_block(wrow + (size_t)b * QB, wb);
        }
        for (int m = 0; m < M; m++) out[(size_t)m * R + r] = dot_wide(wrow, x + (size_t)m * K, K) + bv;
    }
}

/* fp32 [cols, rows] (in_out): strips of STRIP outputs, up to MCHUNK inputs
 * at a time, accumulated over the stored rows in order. */
static void strip(float *out, const float *x, const float *W, const float *bias, int R, int K, int M, int j0,
                  int n) {
    for (int m0 = 0; m0 < M; m0 += MCHUNK) {
        int mc = M - m0 < MCHUNK ? M - m0 : MCHUNK;
        float acc[MCHUNK][STRIP];
        for (int m = 0; m < mc; m++) memset(acc[m], 0, (size_t)n * sizeof(float));
        for (int i = 0; i < K; i++) {
            const float *wi = W + (size_t)i * R + j0;
            for (int m = 0; m < mc; m++) {
                const float xv = x[(size_t)(m0 + m) * K + i];
                float *a = acc[m];
#ifdef QV_SIMD
                if (n == STRIP) {
                    __m256 xb = _mm256_set1_ps(xv);
                    for (int k = 0; k < STRIP; k += 8)
                        _mm256_storeu_ps(a + k, _mm256_fmadd_ps(xb, _mm256_loadu_ps(wi + k), _mm256_loadu_ps(a + k)));
                    continue;
                }
                for (int k = 0; k < n; k++) a[k] = fmaf(xv, wi[k], a[k]);
#else
                for (int k = 0; k < n; k++) a[k] += xv * wi[k];
#endif
            }
        }
        for (int m = 0; m < mc; m++)
            for (int k = 0; k < n; k++) out[(size_t)(m0 + m) * R + j0 + k] = acc[m][k] + (bias ? bias[j0 + k] : 0.0f);
    }
}

#ifdef QV_SIMD
/* M = 1 of the strip, accumulators in registers: the same operations as
 * strip() (one fused multiply-add per weight, rows in order). */
static void strip1(float *out, const float *x, const float *W, const float *bias, int R, int K, int j0) {
    __m256 a[STRIP / 8];
    for (int k = 0; k < STRIP / 8; k++) a[k] = _mm256_setzero_ps();
    for (int i = 0; i < K; i++) {
        const float *wi = W + (size_t)i * R + j0;
        __m256 xb = _mm256_set1_ps(x[i]);
        for (int k = 0; k < STRIP / 8; k++) a[k] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(wi + 8 * k), a[k]);
    }
    for (int k = 0; k < STRIP / 8; k++) {
        __m256 o = a[k];
        if (bias) o = _mm256_add_ps(o, _mm256_loadu_ps(bias + j0 + 8 * k));
        _mm256_storeu_ps(out + j0 + 8 * k, o);
    }
}
#endif

static void in_out_kernel(float *out, const float *x, const cllm_qweight *w, const float *bias, int M) {
    const int R = w->rows, K = w->cols, ns = (R + STRIP - 1) / STRIP;
    const float *W = w->data;
#pragma omp parallel for schedule(static) if ((long)R * K >= QV_PARALLEL_MIN)
    for (int s = 0; s < ns; s++) {
        int j0 = s * STRIP, n = R - j0 < STRIP ? R - j0 : STRIP;
#ifdef QV_SIMD
        if (M == 1 && n == STRIP) {
            strip1(out, x, W, bias, R, K, j0);
            continue;
        }
#endif
        strip(out, x, W, bias, R, K, M, j0, n);
    }
}

void QMATMUL(float *out, const float *x, const cllm_qweight *w, const float *bias, int M) {
    if (w->fmt == CLLM_WFMT_FP32 && w->in_out)
        in_out_kernel(out, x, w, bias, M);
    else
        rows_kernel(out, x, w, bias, M);
}
