/*
 * A vectorisable expf for the pointwise kernels (private to src/kernels).
 *
 * libm's expf/tanhf are scalar calls the compiler cannot vectorise without
 * -ffast-math, which made GELU, SwiGLU and cross-entropy cost as much as the
 * GEMMs around them. This version is plain arithmetic, so `omp simd` loops
 * that call it vectorise:
 *   x = j*ln2 + r, j = round(x/ln2), |r| <= ln2/2 (ln2 split in two parts
 *   so r is exact), exp(r) by its degree-7 Taylor polynomial (truncation
 *   below 6e-9 relative), 2^j built in the exponent bits.
 * Error is within 2 ulp of the true value. Inputs are clamped to
 * [-87, 88] so the result is always a finite normal float: exp(-87) ~ 1.6e-38
 * stands in for smaller values, which is below anything the callers can
 * resolve next to the terms they add it to. A NaN comes back as NaN (an
 * overflowed fp16 step must stay non-finite), without the float to integer
 * conversion of a NaN that C leaves undefined.
 */
#ifndef CLLM_KERNELS_EXP_IMPL_H
#define CLLM_KERNELS_EXP_IMPL_H

#include <stdint.h>
#include <string.h>

#pragma omp declare simd notinbranch
static inline float exp_simd(float in) {
    /* written so that NaN fails both tests and becomes -87: converting a NaN
     * j to an integer below would be undefined; the NaN is returned at the end */
    float x = in > -87.0f ? in : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    /* round x*log2(e) to the nearest integer: adding 1.5*2^23 pushes the
     * fraction bits out of the mantissa (no -ffast-math, so it is kept) */
    float j = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - j * 0.693359375f;  /* ln2 high part, exact product */
    r = r - j * -2.12194440e-4f;     /* ln2 low part */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)j + 127) << 23; /* 2^j, j in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return in == in ? p * scale : in; /* NaN in, NaN out */
}

/* tanh(u) = sign(u) * (1 - 2 / (exp(2|u|) + 1)). Absolute error ~1e-7 (the
 * relative error near 0 is larger, which is harmless where it is used: GELU
 * only ever adds tanh to 1). */
#pragma omp declare simd notinbranch
static inline float tanh_simd(float u) {
    float a = u < 0.0f ? -u : u;
    float t = 1.0f - 2.0f / (exp_simd(2.0f * a) + 1.0f);
    return u < 0.0f ? -t : t;
}

#endif
