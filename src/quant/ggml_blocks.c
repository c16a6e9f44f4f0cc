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
 * The block code itself is the inference formats' (src/quant/format.c:
 * int8 and q4 weights are these blocks); this file gives it the GGUF
 * writer's names.
 */
#include "cllm/gguf.h"
#include "cllm/quant.h"

void cllm_ggml_quantize_q8_0(const float *x, size_t n, unsigned char *out) {
    cllm_quant_q8_0_row(out, x, (int64_t)(n / CLLM_GGML_QK * CLLM_GGML_QK));
}

void cllm_ggml_quantize_q4_0(const float *x, size_t n, unsigned char *out) {
    cllm_quant_q4_0_row(out, x, (int64_t)(n / CLLM_GGML_QK * CLLM_GGML_QK));
}

void cllm_ggml_dequantize_q4_0(const unsigned char *in, size_t n, float *x) {
    cllm_quant_dequant_row(x, in, CLLM_WFMT_Q4, (int64_t)(n / CLLM_GGML_QK * CLLM_GGML_QK));
}
