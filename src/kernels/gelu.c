/*
 * GELU, tanh approximation (torch gelu(approximate="tanh"), HF "gelu_new",
 * BLOOM's bloom_gelu), forward and backward.
 *
 * fp32 arithmetic in torch's order; tanh comes from exp_impl.h so the loops
 * vectorise (libm's tanhf is a scalar call and made GELU as slow as the
 * GEMM next to it). Parallel over the flat index.
 *
 * Left out: the erf form (no model here uses it).
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include "exp_impl.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* out[N] = 0.5 * x * (1 + tanh(k * (x + 0.044715 * x^3))), k = sqrt(2/pi) */
static inline float gelu_one(float x) { return 0.5f * x * (1.0f + tanh_simd(GELU_K * (x + GELU_A * x * x * x))); }
void cllm_gelu_forward(float *out, const float *inp, long N) {
    if (N < CLLM_PAR_MIN) { /* no OpenMP region for a decode step's few values: see cllm_add */
#pragma omp simd
        for (long i = 0; i < N; i++) out[i] = gelu_one(inp[i]);
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) out[i] = gelu_one(inp[i]);
}

/* dinp[N] += dout * gelu'(x), with th = tanh(u) as in the forward:
 *   gelu'(x) = 0.5 * (1 + th) + 0.5 * x * (1 - th^2) * k * (1 + 3 * 0.044715 * x^2) */
void cllm_gelu_backward(float *dinp, const float *dout, const float *inp, long N) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float th = tanh_simd(u);
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] += dout[i] * g;
    }
}
