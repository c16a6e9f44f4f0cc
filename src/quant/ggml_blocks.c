/*
 * ggml's block quantization formats, as llama.cpp's reference quantizers
 * write them (see cllm/gguf.h, "GGML block formats"). Each block covers 32
 * consecutive values of a row; the scale is stored as IEEE half.
 *   Q8_0  34 bytes: f16 d = max|x| / 127, then 32 int8 q = round(x / d)
 *         (half away from zero); value = d * q.
 *   Q4_0  18 bytes: f16 d = m / -8 where m is the value of largest
 *         magnitude (its sign kept: the extreme value maps to code 0),
 *         then 16 bytes of 4-bit codes q = min(15, trunc(x / d + 8.5));
 *         byte j holds value j in its low nibble and value j + 16 in its
 *         high nibble; value = d * (q - 8).
 * Both divide by the f32 scale and store its f16 rounding, as the reference
 * does, so a file written here matches llama.cpp's quantizer bit for bit.
 */
#include <math.h>
#include <string.h>

#include "cllm/gguf.h"

static void put_f16(unsigned char *out, float d) {
    uint16_t h = cllm_f32_to_f16(d);
    out[0] = (unsigned char)h;
    out[1] = (unsigned char)(h >> 8);
}

static float get_f16(const unsigned char *in) { return cllm_f16_to_f32((uint16_t)(in[0] | in[1] << 8)); }

void cllm_ggml_quantize_q8_0(const float *x, size_t n, unsigned char *out) {
    for (size_t b = 0; b < n / CLLM_GGML_QK; b++, x += CLLM_GGML_QK, out += CLLM_GGML_Q8_0_BYTES) {
        float amax = 0.0f;
        for (int i = 0; i < CLLM_GGML_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(out, d);
        for (int i = 0; i < CLLM_GGML_QK; i++) out[2 + i] = (unsigned char)(int8_t)roundf(x[i] * id);
    }
}

void cllm_ggml_quantize_q4_0(const float *x, size_t n, unsigned char *out) {
    enum { H = CLLM_GGML_QK / 2 };
    for (size_t b = 0; b < n / CLLM_GGML_QK; b++, x += CLLM_GGML_QK, out += CLLM_GGML_Q4_0_BYTES) {
        float amax = 0.0f, m = 0.0f;
        for (int i = 0; i < CLLM_GGML_QK; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                m = x[i];
            }
        const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(out, d);
        for (int j = 0; j < H; j++) {
            const float a = x[j] * id, c = x[j + H] * id;
            int qa = (int)(int8_t)(a + 8.5f), qc = (int)(int8_t)(c + 8.5f);
            qa = qa < 15 ? qa : 15;
            qc = qc < 15 ? qc : 15;
            out[2 + j] = (unsigned char)(qa | qc << 4);
        }
    }
}

void cllm_ggml_dequantize_q4_0(const unsigned char *in, size_t n, float *x) {
    enum { H = CLLM_GGML_QK / 2 };
    for (size_t b = 0; b < n / CLLM_GGML_QK; b++, x += CLLM_GGML_QK, in += CLLM_GGML_Q4_0_BYTES) {
        const float d = get_f16(in);
        for (int j = 0; j < H; j++) {
            x[j] = d * (float)((in[2 + j] & 15) - 8);
            x[j + H] = d * (float)((in[2 + j] >> 4) - 8);
        }
    }
}
