/* Batches of rows for train, eval and grad (see batch.h). */
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>

int tool_batch_init(tool_batch *b, int B, int T) {
    size_t n = (size_t)B * (size_t)T;
    b->B = B;
    b->T = T;
    b->tokens = malloc(n * sizeof(int32_t));
    b->labels = malloc(n * sizeof(int32_t));
    b->targets = malloc(n * sizeof(int32_t));
    return b->tokens && b->labels && b->targets ? 0 : -1;
}

void tool_batch_free(tool_batch *b) {
    free(b->tokens);
    free(b->labels);
    free(b->targets);
    b->tokens = b->labels = b->targets = NULL;
}

long tool_batch_fill(tool_batch *b, const cllm_dataset *d, const size_t *idx, int rows, int32_t pad_id) {
    for (int r = 0; r < rows; r++)
        cllm_dataset_fill_row(d, idx[r], b->T, pad_id, b->tokens + (size_t)r * b->T, b->labels + (size_t)r * b->T);
    return cllm_model_make_targets(b->targets, b->labels, rows, b->T);
}

long tool_batch_fill_loader(tool_batch *b, cllm_loader *l, uint64_t g0, int rows) {
    for (int r = 0; r < rows; r++)
        if (cllm_loader_get(l, g0 + (uint64_t)r, b->tokens + (size_t)r * b->T, b->labels + (size_t)r * b->T, NULL))
            return -1;
    return cllm_model_make_targets(b->targets, b->labels, rows, b->T);
}

int tool_check_shape(const char *cmd, const cllm_model *m, int B, int T) {
    const cllm_model_config *c = cllm_model_get_config(m);
    if (B <= 0) {
        fprintf(stderr, "cllm %s: --batch-size must be positive\n", cmd);
        return 2;
    }
    if (T < 2) {
        fprintf(stderr, "cllm %s: --seq-len must be at least 2\n", cmd);
        return 2;
    }
    if (c->n_ctx > 0 && T > c->n_ctx) {
        fprintf(stderr, "cllm %s: --seq-len %d exceeds the model's %d positions\n", cmd, T, c->n_ctx);
        return 2;
    }
    return 0;
}
