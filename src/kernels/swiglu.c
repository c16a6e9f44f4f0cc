/*
 * SwiGLU gate of LLaMA's MLP: out = silu(gate) * up, forward and backward.
 *
 * silu is computed as g / (1 + exp(-g)) in fp32, as torch's CPU kernel does;
 * for very negative g exp overflows to inf and silu correctly becomes -0.
 *
 * Left out: the fused [gate|up] layout (the model passes two pointers, which
 * covers both separate and fused projections).
 */
#include "cllm/kernels.h"

#include <math.h>

/* out[N] = silu(gate) * up,  silu(g) = g * sigmoid(g) = g / (1 + exp(-g)) */
void cllm_swiglu_forward(float *out, const float *gate, const float *up, long N) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* With sig = sigmoid(g):
 *   dup[N]   += dout * g * sig
 *   dgate[N] += dout * up * sig * (1 + g * (1 - sig))
 * Either gradient may be NULL. */
void cllm_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, long N) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + expf(-g));
        if (dup) dup[i] += dout[i] * (g * sig);
        if (dgate) dgate[i] += dout[i] * up[i] * (sig * (1.0f + g * (1.0f - sig)));
    }
}
