/*
 * Rotary position embedding in HF's rotate-half convention: the head vector
 * is split into halves [x1, x2] and pair (x1[i], x2[i]) is rotated by the
 * angle t * theta^(-2i/HS). Applied in place through row/head strides so
 * q and k can be rotated inside a fused QKV activation.
 *
 * The tables are computed in fp32 exactly as HF's LlamaRotaryEmbedding does
 * (fp32 inverse frequencies, fp32 product t * inv_freq, fp32 cos/sin), so the
 * rounding of long-position angles matches the reference model.
 *
 * Left out: RoPE scaling variants (linear/NTK/YaRN), partial rotary
 * dimensions and the interleaved (GPT-J) pairing.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include <math.h>

/* cos_t[T,HS/2], sin_t[T,HS/2]:
 *   inv[i] = 1 / theta^((2i)/HS),  cos_t[t,i] = cos(t * inv[i]) (all fp32). */
void cllm_rope_tables(float *cos_t, float *sin_t, int T, int HS, float theta) {
    int half = HS / 2;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float inv = 1.0f / powf(theta, (float)(2 * i) / (float)HS);
            float a = (float)t * inv;
            cos_t[(size_t)t * half + i] = cosf(a);
            sin_t[(size_t)t * half + i] = sinf(a);
        }
    }
}

/* For every (b,t,h), with p = x + (b*T+t)*row_stride + h*head_stride,
 * c = cos_t[t,i], s = sign * sin_t[t,i], i < HS/2:
 *   p[i]        = p[i] * c - p[i+HS/2] * s
 *   p[i+HS/2]   = p[i+HS/2] * c + p[i] * s
 * sign=+1 is the forward rotation; sign=-1 its inverse (= transpose), which
 * maps dy to dx in the backward. */
static inline void rope_row(float *x, const float *cos_t, const float *sin_t, int T, int nh, int half,
                            int row_stride, int head_stride, float sg, int bt) {
    const int t = bt % T;
    const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
    for (int h = 0; h < nh; h++) {
        float *p1 = x + (size_t)bt * row_stride + (size_t)h * head_stride;
        float *p2 = p1 + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float x1 = p1[i], x2 = p2[i], si = sg * s[i];
            p1[i] = x1 * c[i] - x2 * si;
            p2[i] = x2 * c[i] + x1 * si;
        }
    }
}

void cllm_rope_apply(float *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int HS,
                     int row_stride, int head_stride, int sign) {
    const int half = HS / 2;
    const float sg = sign < 0 ? -1.0f : 1.0f;
    if ((long)B * T * nh * HS < CLLM_PAR_MIN) { /* no OpenMP region for a decode step: see cllm_add */
        for (int bt = 0; bt < B * T; bt++) rope_row(x, cos_t, sin_t, T, nh, half, row_stride, head_stride, sg, bt);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) rope_row(x, cos_t, sin_t, T, nh, half, row_stride, head_stride, sg, bt);
}
