/*
 * The weight formats of cllm/quant.h: names, sizes, the block quantizers
 * (shared with the GGUF writer) and dequantization.
 *
 * Q8_0 (int8): per block of 32 values, d = max|x| / 127 (computed in fp32),
 * q = round(x / d) half away from zero (0 when d is 0); stored as fp16(d)
 * and 32 int8.
 * Q4_0 (q4): per block, m = the value of largest magnitude (its sign kept),
 * d = m / -8, q = min(15, trunc(x / d + 8.5)) (0 .. 15); stored as fp16(d)
 * and 16 bytes, byte j holding value j (low nibble) and value j + 16 (high).
 * Both are ggml's reference rules, so blocks match ggml's byte for byte.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cllm/quant.h"

static const char *const fmt_names[CLLM_WFMT_COUNT] = {"fp32", "bf16", "int8", "q4"};

const char *cllm_wfmt_name(cllm_wfmt f) { return (unsigned)f < CLLM_WFMT_COUNT ? fmt_names[f] : NULL; }

bool cllm_wfmt_from_name(const char *name, cllm_wfmt *out) {
    for (int i = 0; name && i < CLLM_WFMT_COUNT; i++)
        if (!strcmp(name, fmt_names[i])) {
            *out = (cllm_wfmt)i;
            return true;
        }
    return false;
}

size_t cllm_wfmt_row_bytes(cllm_wfmt f, int64_t cols) {
    size_t n = (size_t)cols, blocks = (n + CLLM_QBLOCK - 1) / CLLM_QBLOCK;
    switch (f) {
    case CLLM_WFMT_FP32: return n * 4;
    case CLLM_WFMT_BF16: return n * 2;
    case CLLM_WFMT_INT8: return blocks * CLLM_Q8_BLOCK_BYTES;
    case CLLM_WFMT_Q4: return blocks * CLLM_Q4_BLOCK_BYTES;
    default: return 0;
    }
}

size_t cllm_qweight_bytes(cllm_wfmt f, int rows, int cols) { return (size_t)rows * cllm_wfmt_row_bytes(f, cols); }

/* The next block's 32 values, zero-padded past the row's end. */
static const float *block_values(float *pad, const float *src, int64_t n, int64_t b) {
    int64_t i0 = b * CLLM_QBLOCK;
    if (i0 + CLLM_QBLOCK <= n) return src + i0;
    memset(pad, 0, CLLM_QBLOCK * sizeof *pad);
    memcpy(pad, src + i0, (size_t)(n - i0) * sizeof *pad);
    return pad;
}

int8_t cllm_quant_code8(float v) {
    float r = roundf(v);
    /* NaN (a non-finite weight or activation) and out-of-range values are
     * clamped rather than converted: float-to-integer overflow is undefined */
    return r >= -127.0f && r <= 127.0f ? (int8_t)r : r > 127.0f ? 127 : r < -127.0f ? -127 : 0;
}

static void put_scale(unsigned char *dst, float d) {
    uint16_t h = cllm_f32_to_f16(d);
    dst[0] = (unsigned char)h;
    dst[1] = (unsigned char)(h >> 8);
}

static float get_scale(const unsigned char *src) { return cllm_f16_to_f32((uint16_t)(src[0] | src[1] << 8)); }

void cllm_quant_q8_0_row(unsigned char *dst, const float *src, int64_t n) {
    float pad[CLLM_QBLOCK];
    for (int64_t b = 0; b * CLLM_QBLOCK < n; b++, dst += CLLM_Q8_BLOCK_BYTES) {
        const float *x = block_values(pad, src, n, b);
        float amax = 0.0f;
        for (int i = 0; i < CLLM_QBLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_scale(dst, d);
        for (int i = 0; i < CLLM_QBLOCK; i++) dst[2 + i] = (unsigned char)cllm_quant_code8(x[i] * id);
    }
}

void cllm_quant_q4_0_row(unsigned char *dst, const float *src, int64_t n) {
    float pad[CLLM_QBLOCK];
    for (int64_t b = 0; b * CLLM_QBLOCK < n; b++, dst += CLLM_Q4_BLOCK_BYTES) {
        const float *x = block_values(pad, src, n, b);
        float amax = 0.0f, m = 0.0f;
        for (int i = 0; i < CLLM_QBLOCK; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                m = x[i];
            }
        const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_scale(dst, d);
        for (int j = 0; j < CLLM_QBLOCK / 2; j++) {
            float a = x[j] * id + 8.5f, c = x[j + CLLM_QBLOCK / 2] * id + 8.5f;
            int qa = a < 15.0f ? (int)a : 15, qc = c < 15.0f ? (int)c : 15; /* a, c >= 0.5 */
            dst[2 + j] = (unsigned char)(qa | qc << 4);
        }
    }
}

void cllm_quant_dequant_row(float *dst, const void *src, cllm_wfmt f, int64_t n) {
    const unsigned char *s = src;
    if (f == CLLM_WFMT_FP32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    if (f == CLLM_WFMT_BF16) { /* the upper half of the fp32 bits (a loop that vectorises) */
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)h[i] << 16;
            memcpy(dst + i, &bits, sizeof bits);
        }
        return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += CLLM_QBLOCK) {
        float v[CLLM_QBLOCK], d = get_scale(s);
        if (f == CLLM_WFMT_INT8) {
            for (int i = 0; i < CLLM_QBLOCK; i++) v[i] = d * (float)(int8_t)s[2 + i];
            s += CLLM_Q8_BLOCK_BYTES;
        } else {
            for (int j = 0; j < CLLM_QBLOCK / 2; j++) {
                v[j] = d * (float)((s[2 + j] & 15) - 8);
                v[j + CLLM_QBLOCK / 2] = d * (float)((s[2 + j] >> 4) - 8);
            }
            s += CLLM_Q4_BLOCK_BYTES;
        }
        int64_t k = n - i0 < CLLM_QBLOCK ? n - i0 : CLLM_QBLOCK;
        memcpy(dst + i0, v, (size_t)k * sizeof *dst);
    }
}

cllm_status cllm_quant_matrix(void *dst, cllm_wfmt f, const float *src, int rows, int cols, bool transpose) {
    if ((unsigned)f >= CLLM_WFMT_COUNT) return CLLM_FAIL(CLLM_ERR_ARG, "unknown weight format %d", (int)f);
    size_t rb = cllm_wfmt_row_bytes(f, cols);
    int nt = transpose ? omp_get_max_threads() : 0;
    float *gather = nt ? cllm_calloc((size_t)nt * (size_t)cols, sizeof(float), "transposed weight rows") : NULL;
    if (nt && !gather) return CLLM_ERR_NOMEM;
#pragma omp parallel for schedule(static) num_threads(nt ? nt : omp_get_max_threads())
    for (int r = 0; r < rows; r++) {
        unsigned char *d = (unsigned char *)dst + (size_t)r * rb;
        const float *row = src + (size_t)r * cols;
        if (transpose) { /* values r, r + rows, ...: a column of the [cols, rows] source */
            float *g = gather + (size_t)omp_get_thread_num() * (size_t)cols;
            for (int c = 0; c < cols; c++) g[c] = src[(size_t)c * rows + r];
            row = g;
        }
        if (f == CLLM_WFMT_FP32)
            memcpy(d, row, (size_t)cols * sizeof(float));
        else if (f == CLLM_WFMT_BF16)
            for (int c = 0; c < cols; c++) {
                uint16_t h = cllm_f32_to_bf16(row[c]);
                memcpy(d + 2 * (size_t)c, &h, sizeof h);
            }
        else if (f == CLLM_WFMT_INT8)
            cllm_quant_q8_0_row(d, row, cols);
        else
            cllm_quant_q4_0_row(d, row, cols);
    }
    cllm_free(gather);
    return CLLM_OK;
}
