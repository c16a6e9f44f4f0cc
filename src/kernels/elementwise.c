/*
 * Elementwise tensor arithmetic: the residual add out = a + b.
 *
 * Left out: broadcasting and other binary ops (the models need only this).
 */
#include "cllm/kernels.h"

/* out[N] = a + b; out may alias a or b (element i reads before it writes). */
void cllm_add(float *out, const float *a, const float *b, long N) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < N; i++) out[i] = a[i] + b[i];
}
