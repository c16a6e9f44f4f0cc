/*
 * ggml's block formats (cllm_ggml_quantize_q4_0 / _q8_0): blocks whose codes
 * are known by hand (the scale's sign, the value of largest magnitude
 * mapping to code 0, the clipped code 15, an all-zero block, the nibble
 * order, the f16 scale bytes), and on random rows the error bounds of the
 * formats: Q4_0 within |d|/2 where x/d <= 7.5 and within |d| where the top
 * code clips, Q8_0 within d/2.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "cllm/core.h"
#include "cllm/gguf.h"

static float scale_of(const unsigned char *blk) { return cllm_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)); }

static void hand_blocks(void) {
    float x[64], y[64];
    unsigned char b[2 * CLLM_GGML_Q4_0_BYTES];
    /* block 0: value j (j < 16) = (j - 8) / 2, value j + 16 the same: m = -4, d = 0.5, code j */
    for (int j = 0; j < 16; j++) x[j] = x[j + 16] = (float)(j - 8) * 0.5f;
    /* block 1: largest magnitude positive (3 at index 5): d = -0.375; -3 clips to code 15 */
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;
    x[32 + 5] = 3.0f;
    x[32 + 20] = -3.0f;
    x[32 + 7] = 0.75f; /* 0.75 / -0.375 = -2 -> code 6 */
    cllm_ggml_quantize_q4_0(x, 64, b);
    CHECK(scale_of(b) == 0.5f, "block 0 scale %g", (double)scale_of(b));
    for (int j = 0; j < 16; j++)
        CHECK(b[2 + j] == (unsigned char)(j | j << 4), "block 0 byte %d = 0x%02x", j, b[2 + j]);
    const unsigned char *b1 = b + CLLM_GGML_Q4_0_BYTES;
    CHECK(scale_of(b1) == -0.375f, "block 1 scale %g", (double)scale_of(b1));
    CHECK((b1[2 + 5] & 15) == 0, "the largest value takes code 0: 0x%02x", b1[2 + 5]);
    CHECK((b1[2 + 4] >> 4) == 15, "-3 clips to code 15: 0x%02x", b1[2 + 4]);
    CHECK((b1[2 + 7] & 15) == 6, "0.75 -> code 6: 0x%02x", b1[2 + 7]);
    CHECK((b1[2 + 0] & 15) == 8 && (b1[2 + 0] >> 4) == 8, "zeros -> code 8: 0x%02x", b1[2 + 0]);
    cllm_ggml_dequantize_q4_0(b, 64, y);
    for (int j = 0; j < 32; j++) CHECK(y[j] == x[j], "block 0 value %d: %g vs %g", j, (double)y[j], (double)x[j]);
    CHECK(y[32 + 5] == 3.0f && y[32 + 20] == -2.625f && y[32 + 7] == 0.75f && y[32] == 0.0f,
          "block 1 values %g %g %g %g", (double)y[37], (double)y[52], (double)y[39], (double)y[32]);
    /* an all-zero block: scale 0, every code 8, values 0 */
    memset(x, 0, sizeof x);
    cllm_ggml_quantize_q4_0(x, 32, b);
    CHECK(scale_of(b) == 0.0f && b[2] == 0x88 && b[17] == 0x88, "zero block");
}

static void random_rows(void) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static unsigned char q4[N / 32 * CLLM_GGML_Q4_0_BYTES], q8[N / 32 * CLLM_GGML_Q8_0_BYTES];
    cllm_rng rng;
    cllm_rng_seed(&rng, 11);
    for (int i = 0; i < N; i++) x[i] = cllm_rng_normal(&rng) * (i < N / 2 ? 0.02f : 3.0f);
    cllm_ggml_quantize_q4_0(x, N, q4);
    cllm_ggml_dequantize_q4_0(q4, N, y);
    int bad = 0;
    for (int blk = 0; blk < N / 32; blk++) {
        float d = scale_of(q4 + (size_t)blk * CLLM_GGML_Q4_0_BYTES);
        for (int j = 0; j < 32; j++) {
            float v = x[blk * 32 + j], e = fabsf(y[blk * 32 + j] - v);
            /* plus the f16 rounding of the scale: |q - 8| <= 8 steps of 2^-11 |d| */
            float bound = (v / d > 7.5f ? 1.0f : 0.5f) * fabsf(d) + 8.0f * fabsf(d) / 1024.0f + 1e-7f;
            bad += !(e <= bound);
        }
    }
    CHECK(bad == 0, "%d Q4_0 values beyond the bound", bad);
    cllm_ggml_quantize_q8_0(x, N, q8);
    bad = 0;
    for (int blk = 0; blk < N / 32; blk++) {
        const unsigned char *b = q8 + (size_t)blk * CLLM_GGML_Q8_0_BYTES;
        float d = scale_of(b);
        for (int j = 0; j < 32; j++) {
            float v = x[blk * 32 + j], e = fabsf(d * (float)(int8_t)b[2 + j] - v);
            bad += !(e <= 0.5f * d * 1.01f + 127.0f * d * 1e-3f + 1e-7f);
        }
    }
    CHECK(bad == 0, "%d Q8_0 values beyond the bound", bad);
}

int main(void) {
    hand_blocks();
    random_rows();
    return check_summary();
}
