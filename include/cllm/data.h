/*
 * cllm data: training samples as token ids.
 *
 * A dataset holds samples back to back in one int32 token buffer (and an
 * optional labels buffer of the same length, -100 meaning "no loss here").
 * This module reads pre-tokenized JSONL, one sample per line:
 *   {"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}
 * (`labels` optional; defaults to input_ids, HF semantics). Bad records are
 * reported as FILE:LINE: what is wrong.
 */
#ifndef CLLM_DATA_H
#define CLLM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cllm_dataset cllm_dataset;

/* Reads a JSONL file of pre-tokenized samples. Every id must be in
 * [0, vocab_size) and every label in [0, vocab_size) or -100; an empty
 * `input_ids`, a labels array of a different length, malformed JSON or a
 * wrongly typed field fail with "path:LINE: ..." (blank lines are skipped). */
cllm_status cllm_dataset_load_jsonl(cllm_dataset **out, const char *path, int vocab_size);
void cllm_dataset_free(cllm_dataset *d);

size_t cllm_dataset_count(const cllm_dataset *d);
size_t cllm_dataset_tokens(const cllm_dataset *d); /* total ids over all samples */

/* Writes sample i as one row of length T: tokens truncated to T or
 * right-padded with pad_id; labels likewise, padded with -100. */
void cllm_dataset_fill_row(const cllm_dataset *d, size_t i, int T, int32_t pad_id, int32_t *tokens,
                           int32_t *labels);

#ifdef __cplusplus
}
#endif
#endif
