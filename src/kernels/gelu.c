/*
 * GELU, tanh approximation (torch gelu(approximate="tanh"), HF "gelu_new",
 * BLOOM's bloom_gelu), forward and backward.
 *
 * fp32 arithmetic in torch's order with libm's tanhf, so results sit within
 * a few ulp of torch. Parallel over the flat index.
 *
 * Left out: the erf form (no model here uses it) and a vectorised tanh
 * approximation (libm keeps results close to torch; GELU is a small part of
 * a step next to the GEMMs around it).
 */
#include "cllm/kernels.h"

#include <math.h>

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* out[N] = 0.5 * x * (1 + tanh(k * (x + 0.044715 * x^3))), k = sqrt(2/pi) */
void cllm_gelu_forward(float *out, const float *inp, long N) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

/* dinp[N] += dout * gelu'(x), with th = tanh(u) as in the forward:
 *   gelu'(x) = 0.5 * (1 + th) + 0.5 * x * (1 - th^2) * k * (1 + 3 * 0.044715 * x^2) */
void cllm_gelu_backward(float *dinp, const float *dout, const float *inp, long N) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float th = tanhf(u);
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] += dout[i] * g;
    }
}
