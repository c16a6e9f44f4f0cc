/*
 * Shared by train, eval and grad: turning dataset samples into [B,T] token
 * and target rows, and writing small JSON results.
 */
#ifndef CLLM_TOOL_BATCH_H
#define CLLM_TOOL_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "cllm/data.h"
#include "cllm/loader.h"
#include "cllm/model.h"

typedef struct {
    int B, T;
    int32_t *tokens;  /* [B,T] */
    int32_t *labels;  /* [B,T] */
    int32_t *targets; /* [B,T] shifted labels */
} tool_batch;

int tool_batch_init(tool_batch *b, int B, int T);
void tool_batch_free(tool_batch *b);

/* Fills rows from samples idx[0..rows) (rows <= B) and builds targets.
 * Returns the number of counted targets. */
long tool_batch_fill(tool_batch *b, const cllm_dataset *d, const size_t *idx, int rows, int32_t pad_id);

/* Fills rows from loader samples g0, g0+1, ..., g0+rows-1 and builds
 * targets. Returns the number of counted targets, or -1 on a loader error
 * (message in cllm_last_error()). */
long tool_batch_fill_loader(tool_batch *b, cllm_loader *l, uint64_t g0, int rows);

/* Checks that --batch-size and --seq-len are usable for this model. */
int tool_check_shape(const char *cmd, const cllm_model *m, int B, int T);

#endif
