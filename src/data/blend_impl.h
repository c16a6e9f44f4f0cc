/* Megatron's blending rule with block caching (blend.c). Private to src/data. */
#ifndef CLLM_BLEND_IMPL_H
#define CLLM_BLEND_IMPL_H

#include <stdint.h>

#include "cllm/core.h"

typedef struct {
    int n;
    double *w;      /* normalized weights */
    uint64_t *snap; /* counts at block starts: [n_snap][n] */
    uint64_t n_snap, cap_snap;
    uint64_t cur; /* cached block, UINT64_MAX = none */
    int *ds;
    uint64_t *ks;
} cllm_blend;

cllm_status cllm_blend_init(cllm_blend *b, const double *weights, int n); /* weights > 0 */
void cllm_blend_free(cllm_blend *b);
/* Global sample g -> (dataset, its sample index). */
cllm_status cllm_blend_get(cllm_blend *b, uint64_t g, int *dataset, uint64_t *sample);

#endif
