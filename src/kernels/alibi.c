/*
 * ALiBi slopes exactly as HF BLOOM's build_alibi_tensor computes them, in
 * fp32, so a BLOOM checkpoint sees the biases it was trained with. Only the
 * slopes: the bias slope_h * (s - t) itself is added inside the attention
 * kernel, tile by tile.
 *
 * With p = 2^floor(log2(NH)) (the largest power of two <= NH):
 *   base  = 2^(-2^(-(log2(p) - 3))),        slopes[i]     = base^(i+1),   i < p
 *   extra = 2^(-2^(-(log2(2p) - 3))),       slopes[p + i] = extra^(2i+1), i < NH - p
 * HF rounds base and extra to fp32 first and raises them with torch's fp32
 * pow; powf does the same here. glibc's powf is correctly rounded for these
 * arguments, torch's is one ulp away for a few heads (NH=48 head 14, for one),
 * so the two agree to within an ulp rather than bit for bit.
 */
#include "variant.h" /* first: renames the kernels to their ISA variant */
#include <math.h>

#include "cllm/kernels.h"

void cllm_alibi_slopes(float *slopes, int NH) {
    int p = 1, log2p = 0;
    while (2 * p <= NH) {
        p *= 2;
        log2p++;
    }
    const float base = (float)exp2(-exp2(-(double)(log2p - 3)));
    for (int i = 0; i < p && i < NH; i++) slopes[i] = powf(base, (float)(i + 1));
    if (p < NH) {
        const float extra = (float)exp2(-exp2(-(double)(log2p + 1 - 3)));
        /* NH - p < p, so HF's min(p, NH - p) is always NH - p. */
        for (int i = 0; i < NH - p; i++) slopes[p + i] = powf(extra, (float)(2 * i + 1));
    }
}
