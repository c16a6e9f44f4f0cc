/*
 * Elementwise tensor arithmetic: the residual add out = a + b, and the
 * fp32 -> bf16 / fp16 roundings of mixed-precision compute.
 *
 * Left out: broadcasting and other binary ops (the models need only this).
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include <string.h>

/* out[N] = a + b; out may alias a or b (element i reads before it writes).
 *
 * Below CLLM_PAR_MIN values this and the other small-input kernels run a
 * plain loop rather than an OpenMP region with a false `if` clause: libgomp
 * starts even such a one-thread region through its team machinery, with
 * futex calls, and a decode step makes about a hundred of them (96 cache
 * writes and ~90 norms, adds and rotations per llama-100M token; a 512-token
 * bf16-cache prompt made 50,000 and ran 1.2x faster without them). */
void cllm_add(float *out, const float *a, const float *b, long N) {
    if (N < CLLM_PAR_MIN) {
#pragma omp simd
        for (long i = 0; i < N; i++) out[i] = a[i] + b[i];
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) out[i] = a[i] + b[i];
}

/* Round to nearest even on the 16 bits kept: add 0x7fff plus the lowest
 * kept bit, then truncate. NaN is kept a (quiet) NaN instead of being
 * carried into the exponent. Branch-free so the loop vectorises. */
static inline uint16_t to_bf16_one(const float *src) {
    uint32_t u;
    memcpy(&u, src, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    return (uint16_t)(nan ? ((u >> 16) | 0x40u) : r);
}
void cllm_to_bf16(uint16_t *dst, const float *src, long N) {
    if (N < CLLM_PAR_MIN) { /* see cllm_add */
#pragma omp simd
        for (long i = 0; i < N; i++) dst[i] = to_bf16_one(&src[i]);
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) dst[i] = to_bf16_one(&src[i]);
}

/* The same rounding with the result widened back to fp32 in place of a
 * bf16 store (dst may alias src): bf16 values to feed an fp32 GEMM. */
static inline void round_bf16_one(float *dst, const float *src) {
    uint32_t u;
    memcpy(&u, src, sizeof u);
    bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t r = (nan ? (u | 0x400000u) : (u + 0x7fffu + ((u >> 16) & 1u))) & 0xffff0000u;
    memcpy(dst, &r, sizeof r);
}
void cllm_round_bf16(float *dst, const float *src, long N) {
    if (N < CLLM_PAR_MIN) { /* see cllm_add */
#pragma omp simd
        for (long i = 0; i < N; i++) round_bf16_one(&dst[i], &src[i]);
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) round_bf16_one(&dst[i], &src[i]);
}

/* Through the scalar converters of core: exact, including subnormals and
 * overflow; the fp16 mode is an emulation and this is not its hot path. */
void cllm_round_f16(float *dst, const float *src, long N) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) dst[i] = cllm_f16_to_f32(cllm_f32_to_f16(src[i]));
}
