/*
 * bitsandbytes' weight formats for a frozen QLoRA base (cllm/quant.h):
 * nf4 and fp4 blocks of 64 with an fp32 absmax (optionally double
 * quantized to 8 bits in blocks of 256), and LLM.int8()'s row-wise int8.
 *
 * The numerics are bitsandbytes' CUDA kernels' (kQuantizeBlockwise,
 * kDequantizeBlockwise, kInt8VectorQuant, int8_vectorwise_dequant):
 *   - a block's values are scaled by the fp32 reciprocal of its absmax
 *     (x * (1 / a), not x / a); an all-zero block then gives NaN, which
 *     every comparison below sends to code 0 (its value times a = 0 is 0);
 *   - nf4 picks the nearest of its 16 values with the midpoints of the
 *     code book as thresholds (strictly above a midpoint: the upper code);
 *   - fp4 codes the sign (bit 3) and |x| with bitsandbytes' thresholds;
 *   - the 8-bit dynamic map of double quantization is searched as
 *     bitsandbytes searches it (7 halving steps from entry 127, then the
 *     nearer of the bracketing entries, ties to the last pivot).
 * The dynamic map is bitsandbytes' formula (create_dynamic_map(signed))
 * evaluated in double and rounded once to fp32; bitsandbytes builds it with
 * PyTorch's fp32 linspace, whose last bits depend on the vector width of
 * the CPU that ran it (44 of 256 entries differ by an ulp on this AVX2
 * machine), so the exact formula is the reproducible definition.
 *
 * Left out: stochastic rounding, block sizes other than 64, other storage
 * types than uint8 (bnb_4bit_quant_storage), LLM.int8()'s outlier split of
 * the activations (the base's GEMMs run on dequantized fp32 weights).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/quant.h"

/* NormalFloat-4 (QLoRA, appendix E), as bitsandbytes lists it. */
static const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

/* fp4 (e2m1, bias 3, subnormal 0.0625): magnitudes 0, 0.0625, 8, 12, 4, 6,
 * 2, 3 for codes 0..7 (codes 8..15 the same, negative), over 12. */
static float fp4_code[16];
static float nf4_mid[15];
static float dyn_map[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void tables_init(void) {
    static const float mag[8] = {0.0f, 0.0625f, 8.0f, 12.0f, 4.0f, 6.0f, 2.0f, 3.0f};
    for (int i = 0; i < 8; i++) {
        fp4_code[i] = mag[i] / 12.0f;
        fp4_code[i + 8] = -(mag[i] / 12.0f);
    }
    for (int i = 0; i < 15; i++) nf4_mid[i] = (float)(((double)nf4_code[i] + (double)nf4_code[i + 1]) / 2.0);
    /* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
     * for exponent i = 0..6, 2^i fractions, the means of 2^i + 1 points
     * evenly spaced over [0.1, 1], times 10^(i - 6), both signs; then 0
     * and 1; sorted */
    double v[256];
    int n = 0;
    for (int i = 0; i < 7; i++) {
        int pts = (1 << i) + 1;
        double scale = pow(10.0, (double)(i - 6));
        for (int k = 0; k + 1 < pts; k++) {
            double a = 0.1 + 0.9 * (double)k / (double)(pts - 1), b = 0.1 + 0.9 * (double)(k + 1) / (double)(pts - 1);
            double mean = (a + b) / 2.0;
            v[n++] = scale * mean;
            v[n++] = -scale * mean;
        }
    }
    v[n++] = 0.0;
    v[n++] = 1.0;
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    for (int i = 0; i < 256; i++) dyn_map[i] = (float)v[i];
}

const float *cllm_bnb_code4(cllm_bnb_type t) {
    pthread_once(&g_once, tables_init);
    return t == CLLM_BNB_NF4 ? nf4_code : t == CLLM_BNB_FP4 ? fp4_code : NULL;
}

const float *cllm_bnb_dynamic_map(void) {
    pthread_once(&g_once, tables_init);
    return dyn_map;
}

const char *cllm_bnb_type_name(cllm_bnb_type t) {
    switch (t) {
    case CLLM_BNB_INT8: return "int8";
    case CLLM_BNB_NF4: return "nf4";
    case CLLM_BNB_FP4: return "fp4";
    default: return NULL;
    }
}

/* ------------------------------------------------------------ sizes */

static size_t align4(size_t b) { return (b + 3) & ~(size_t)3; }

static size_t n_of(int rows, int cols) { return (size_t)rows * (size_t)cols; }
static size_t blocks_of(size_t n, size_t bs) { return (n + bs - 1) / bs; }

size_t cllm_bnb_bytes(cllm_bnb_type t, bool dq, int rows, int cols) {
    size_t n = n_of(rows, cols);
    if (t == CLLM_BNB_INT8) return align4(n) + (size_t)rows * sizeof(float);
    size_t nb = blocks_of(n, CLLM_BNB_BLOCK), codes = align4((n + 1) / 2);
    if (!dq) return codes + nb * sizeof(float);
    return codes + align4(nb) + blocks_of(nb, CLLM_BNB_DQ_BLOCK) * sizeof(float);
}

void cllm_bnb_view(cllm_bnb_matrix *q, cllm_bnb_type t, bool dq, int rows, int cols, void *buf) {
    unsigned char *p = buf;
    size_t n = n_of(rows, cols), nb = blocks_of(n, CLLM_BNB_BLOCK);
    *q = (cllm_bnb_matrix){.type = t, .double_quant = dq && t != CLLM_BNB_INT8, .rows = rows, .cols = cols, .codes = p};
    if (t == CLLM_BNB_INT8) {
        q->absmax = (float *)(void *)(p + align4(n));
        return;
    }
    p += align4((n + 1) / 2);
    if (!q->double_quant) {
        q->absmax = (float *)(void *)p;
        return;
    }
    q->qabsmax = p;
    q->absmax2 = (float *)(void *)(p + align4(nb));
}

size_t cllm_bnb_quantize_scratch(const cllm_bnb_matrix *q) {
    return q->double_quant ? blocks_of(n_of(q->rows, q->cols), CLLM_BNB_BLOCK) : 0;
}

/* ------------------------------------------------------------ rounding */

/* nf4: the number of midpoints x lies strictly above (NaN: none). */
static unsigned char code_nf4(float x) {
    unsigned char c = 0;
    for (int i = 0; i < 15; i++) c += x > nf4_mid[i];
    return c;
}

/* fp4: bitsandbytes' decision tree on |x| (its thresholds are literal
 * constants, close to but not all exactly the midpoints). */
static unsigned char code_fp4(float x) {
    unsigned char sign = x < 0.0f ? 8 : 0, c;
    float a = fabsf(x);
    if (a > 0.29166667f)
        c = a > 0.583333f ? (a > 0.8333333f ? 3 : 2) : (a > 0.4166667f ? 5 : 4);
    else
        c = a > 0.0859375f ? (a > 0.20833333f ? 7 : 6) : (a > 0.00260417f ? 1 : 0);
    return (unsigned char)(c + sign);
}

/* The dynamic map's code for x in [-1, 1]: bitsandbytes' search. */
static unsigned char code_dyn(float x) {
    const float *map = dyn_map;
    int pivot = 127, hi = 255, lo = 0;
    float above = 1.0f, below = -1.0f, val = map[pivot];
    for (int step = 64; step > 0; step >>= 1) {
        if (x > val) {
            lo = pivot;
            below = val;
            pivot += step;
        } else {
            hi = pivot;
            above = val;
            pivot -= step;
        }
        val = map[pivot];
    }
    if (hi == 255) above = map[255];
    if (lo == 0) below = map[0];
    if (x > val) return (unsigned char)(x > (above + val) * 0.5f ? hi : pivot);
    return (unsigned char)(x < (below + val) * 0.5f ? lo : pivot);
}

/* ------------------------------------------------------------ quantize */

/* Absmax of values [i0, i1) of src. */
static float absmax_of(const float *src, size_t i0, size_t i1) {
    float a = 0.0f;
    for (size_t i = i0; i < i1; i++) a = fmaxf(a, fabsf(src[i]));
    return a;
}

static void quantize_4bit(cllm_bnb_matrix *q, const float *src, float *scratch) {
    const size_t n = n_of(q->rows, q->cols), nb = blocks_of(n, CLLM_BNB_BLOCK);
    float *amax = q->double_quant ? scratch : q->absmax;
    const bool nf4 = q->type == CLLM_BNB_NF4;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * CLLM_BNB_BLOCK, i1 = i0 + CLLM_BNB_BLOCK < n ? i0 + CLLM_BNB_BLOCK : n;
        float a = absmax_of(src, i0, i1), inv = 1.0f / a;
        amax[b] = a;
        for (size_t i = i0; i < i1; i += 2) { /* i0 is even: pairs never straddle blocks */
            float x0 = src[i] * inv, x1 = i + 1 < i1 ? src[i + 1] * inv : 0.0f * inv;
            unsigned char c0 = nf4 ? code_nf4(x0) : code_fp4(x0), c1 = nf4 ? code_nf4(x1) : code_fp4(x1);
            q->codes[i / 2] = (unsigned char)(c0 << 4 | c1);
        }
    }
    if (!q->double_quant) return;
    double sum = 0.0;
    for (size_t b = 0; b < nb; b++) sum += amax[b];
    const float off = (float)(sum / (double)nb);
    q->offset = off;
    for (size_t b = 0; b < nb; b++) amax[b] -= off;
    const size_t nb2 = blocks_of(nb, CLLM_BNB_DQ_BLOCK);
    for (size_t b = 0; b < nb2; b++) {
        size_t i0 = b * CLLM_BNB_DQ_BLOCK, i1 = i0 + CLLM_BNB_DQ_BLOCK < nb ? i0 + CLLM_BNB_DQ_BLOCK : nb;
        float a = absmax_of(amax, i0, i1), inv = 1.0f / a;
        q->absmax2[b] = a;
        for (size_t i = i0; i < i1; i++) q->qabsmax[i] = code_dyn(amax[i] * inv);
    }
}

/* round half to even of an fp32 value into int8; NaN gives 0 */
static signed char rint8(float v) {
    float r = nearbyintf(v);
    return r >= -128.0f && r <= 127.0f ? (signed char)r : r > 127.0f ? 127 : r < -128.0f ? -128 : 0;
}

static void quantize_int8(cllm_bnb_matrix *q, const float *src) {
    const int R = q->rows, K = q->cols;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *x = src + (size_t)r * K;
        float a = absmax_of(x, 0, (size_t)K), scale = 127.0f / a;
        q->absmax[r] = a;
        signed char *o = (signed char *)q->codes + (size_t)r * K;
        for (int c = 0; c < K; c++) o[c] = rint8(x[c] * scale);
    }
}

void cllm_bnb_quantize(cllm_bnb_matrix *q, const float *src, float *scratch) {
    pthread_once(&g_once, tables_init);
    if (q->type == CLLM_BNB_INT8)
        quantize_int8(q, src);
    else
        quantize_4bit(q, src, scratch);
}

/* ------------------------------------------------------------ dequantize */

/* Below this many values a dequantization runs on the calling thread. */
#define BNB_PARALLEL_MIN 32768u

/* The fp32 absmax of 64-block b. */
static inline float block_absmax(const cllm_bnb_matrix *q, size_t b) {
    if (!q->double_quant) return q->absmax[b];
    float v = dyn_map[q->qabsmax[b]] * q->absmax2[b / CLLM_BNB_DQ_BLOCK];
    return v + q->offset;
}

void cllm_bnb_dequantize(float *dst, const cllm_bnb_matrix *q, int r0, int nrows) {
    pthread_once(&g_once, tables_init);
    const size_t K = (size_t)q->cols, e0 = (size_t)r0 * K, e1 = e0 + (size_t)nrows * K;
    if (q->type == CLLM_BNB_INT8) {
        const float inv127 = 7.874015718698502e-3f;
#pragma omp parallel for schedule(static) if (e1 - e0 >= BNB_PARALLEL_MIN)
        for (int r = r0; r < r0 + nrows; r++) {
            const signed char *c = (const signed char *)q->codes + (size_t)r * K;
            float *o = dst + (size_t)(r - r0) * K, s = q->absmax[r];
            for (size_t k = 0; k < K; k++) {
                float v = (float)c[k] * s;
                o[k] = v * inv127;
            }
        }
        return;
    }
    const float *code = q->type == CLLM_BNB_NF4 ? nf4_code : fp4_code;
    const size_t b0 = e0 / CLLM_BNB_BLOCK, b1 = blocks_of(e1, CLLM_BNB_BLOCK);
#pragma omp parallel for schedule(static) if (e1 - e0 >= BNB_PARALLEL_MIN)
    for (size_t b = b0; b < b1; b++) {
        const float a = block_absmax(q, b);
        size_t i0 = b * CLLM_BNB_BLOCK, i1 = i0 + CLLM_BNB_BLOCK;
        if (i0 < e0) i0 = e0;
        if (i1 > e1) i1 = e1;
        for (size_t i = i0; i < i1; i++) {
            unsigned char byte = q->codes[i / 2];
            dst[i - e0] = code[i & 1 ? byte & 15 : byte >> 4] * a;
        }
    }
}
