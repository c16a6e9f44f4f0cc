/*
 * Megatron's blending rule: global sample i goes to the dataset whose
 * shortfall  w_j * max(i, 1) - count_j  is largest (ties to the lowest j),
 * and is that dataset's count_j-th sample. The rule is sequential, so the
 * assignment is computed in blocks: a snapshot of the counts is kept at
 * every block start and one block of assignments is cached. Sequential
 * reads cost O(datasets) per sample; the first read far ahead simulates up
 * to it once (O(g * datasets)), after which any earlier block is one block
 * of work away.
 */
#include <stdlib.h>
#include <string.h>

#include "data/blend_impl.h"

#define BLOCK 4096u

void cllm_blend_free(cllm_blend *b) {
    if (!b) return;
    free(b->w);
    free(b->snap);
    free(b->ds);
    free(b->ks);
    memset(b, 0, sizeof *b);
}

cllm_status cllm_blend_init(cllm_blend *b, const double *weights, int n) {
    memset(b, 0, sizeof *b);
    double sum = 0;
    for (int j = 0; j < n; j++) sum += weights[j];
    b->n = n;
    b->w = malloc((size_t)n * sizeof *b->w);
    b->snap = calloc((size_t)n, sizeof *b->snap);
    b->ds = malloc(BLOCK * sizeof *b->ds);
    b->ks = malloc(BLOCK * sizeof *b->ks);
    if (!b->w || !b->snap || !b->ds || !b->ks) {
        cllm_blend_free(b);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    for (int j = 0; j < n; j++) b->w[j] = weights[j] / sum;
    b->n_snap = 1;
    b->cap_snap = 1;
    b->cur = UINT64_MAX;
    return CLLM_OK;
}

/* Runs block `blk` from its snapshot; fills ds/ks when `record`, and the
 * counts at its end into `end`. */
static void run_block(const cllm_blend *b, uint64_t blk, uint64_t *counts, int *ds, uint64_t *ks) {
    uint64_t g0 = blk * BLOCK;
    for (uint64_t r = 0; r < BLOCK; r++) {
        uint64_t i = g0 + r;
        double x = i > 0 ? (double)i : 1.0;
        int best = 0;
        double err = b->w[0] * x - (double)counts[0];
        for (int j = 1; j < b->n; j++) {
            double e = b->w[j] * x - (double)counts[j];
            if (e > err) {
                err = e;
                best = j;
            }
        }
        if (ds) {
            ds[r] = best;
            ks[r] = counts[best];
        }
        counts[best]++;
    }
}

cllm_status cllm_blend_get(cllm_blend *b, uint64_t g, int *dataset, uint64_t *sample) {
    uint64_t blk = g / BLOCK;
    if (blk != b->cur) {
        size_t n = (size_t)b->n;
        while (b->n_snap <= blk) {
            if (b->n_snap >= b->cap_snap) {
                size_t cap = b->cap_snap ? b->cap_snap * 2 : 64;
                uint64_t *p = realloc(b->snap, cap * n * sizeof *p);
                if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                b->snap = p;
                b->cap_snap = cap;
            }
            uint64_t *next = b->snap + b->n_snap * n;
            memcpy(next, next - n, n * sizeof *next);
            run_block(b, b->n_snap - 1, next, NULL, NULL);
            b->n_snap++;
        }
        uint64_t *counts = malloc(n * sizeof *counts);
        if (!counts) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        memcpy(counts, b->snap + blk * n, n * sizeof *counts);
        run_block(b, blk, counts, b->ds, b->ks);
        free(counts);
        b->cur = blk;
    }
    *dataset = b->ds[g % BLOCK];
    *sample = b->ks[g % BLOCK];
    return CLLM_OK;
}
