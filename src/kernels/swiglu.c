/*
 * SwiGLU gate of LLaMA's MLP: out = silu(gate) * up, forward and backward.
 *
 * silu is computed as g / (1 + exp(-g)) in fp32, as torch's CPU kernel does,
 * with the vectorisable exp of exp_impl.h (its clamp keeps exp(-g) finite, so
 * silu of a very negative g is a tiny negative number instead of -0).
 *
 * Left out: the fused [gate|up] layout (the model passes two pointers, which
 * covers both separate and fused projections).
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include "cllm/kernels.h"

#include "exp_impl.h"

/* out[N] = silu(gate) * up,  silu(g) = g * sigmoid(g) = g / (1 + exp(-g)) */
static inline float swiglu_one(float g, float u) { return g / (1.0f + exp_simd(-g)) * u; }
void cllm_swiglu_forward(float *out, const float *gate, const float *up, long N) {
    if (N < CLLM_PAR_MIN) { /* no OpenMP region for a decode step's few values: see cllm_add */
#pragma omp simd
        for (long i = 0; i < N; i++) out[i] = swiglu_one(gate[i], up[i]);
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) out[i] = swiglu_one(gate[i], up[i]);
}

/* With sig = sigmoid(g):
 *   dup[N]   += dout * g * sig
 *   dgate[N] += dout * up * sig * (1 + g * (1 - sig))
 * Either gradient may be NULL. */
void cllm_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, long N) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + exp_simd(-g));
        if (dup) dup[i] += dout[i] * (g * sig);
        if (dgate) dgate[i] += dout[i] * up[i] * (sig * (1.0f + g * (1.0f - sig)));
    }
}
