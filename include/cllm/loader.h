/*
 * cllm loader: training samples from a --data spec, by random access.
 *
 * A --data spec is one of
 *   - a prepared dataset prefix (PREFIX.bin / PREFIX.idx, Megatron MMIDIDX,
 *     with the loss-mask side file), written by `cllm data prepare`;
 *   - a raw file: .json (array), .jsonl or .txt, tokenized when opened with
 *     the tokenizer named in the options (sample formats auto-detected);
 *   - a pre-tokenized .jsonl ({"input_ids": [...], "labels": [...]});
 *   - a blend "W1 SPEC1 W2 SPEC2 ..." with Megatron's weighting semantics.
 *
 * The loader defines an endless stream of samples: sample g (g = 0, 1, ...)
 * belongs to epoch g / size and is a fixed function of (seed, g). Training
 * state is therefore one integer, the next g, which a checkpoint stores and
 * a resumed run continues from; data-parallel ranks read disjoint g's of the
 * same global batch. With shuffle off, sample g is sample g % size in order.
 *
 * Rows are [T] tokens with labels (-100 = no loss), already truncated or
 * padded to T (or packed windows, for prepared pretraining data): the caller
 * shifts labels into targets (cllm_model_make_targets).
 *
 * Details (docs/data.md): packed windows are T tokens with stride T-1, so
 * every token after the first is a target once; a blend's size is the sum
 * of its datasets' sizes, each dataset keeping its own shuffled stream;
 * vocab_size <= 0 disables the id check; a raw file whose records are all
 * pre-tokenized needs no tokenizer.
 */
#ifndef CLLM_LOADER_H
#define CLLM_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *spec;      /* see above */
    const char *tokenizer; /* folder with tokenizer.json, for raw text; may be NULL */
    int seq_len;           /* T */
    int vocab_size;        /* ids are checked against it */
    bool shuffle;
    uint64_t seed;
    /* Which split of each dataset to read: "train", "valid", "test" or NULL
     * for everything; `splits` gives the weights ("950,30,20", Megatron's
     * convention; NULL = "100,0,0"). Splits are deterministic ranges of
     * documents. */
    const char *split;
    const char *splits;
    int skip_bad;          /* tolerate up to this many bad records in raw files */
    /* Preference pairs (docs/alignment.md): the spec is one .json/.jsonl
     * file of {"prompt", "chosen", "rejected"} (or pre-tokenized
     * *_input_ids) records; sample 2i is pair i's chosen row and 2i+1 its
     * rejected row, and shuffling permutes pairs, never splitting one, so
     * any even run of the stream starting at an even g holds whole pairs.
     * Blends and prepared datasets are refused. */
    bool pairs;
    /* With pairs: a record of one text ({"text"}, {"prompt", "completion"}
     * or {"input_ids"}, rendered as a pair's row would be) is accepted too,
     * as two equal rows (what `cllm score` reads); see cllm_loader_pair_info. */
    bool singles;
} cllm_loader_opts;

typedef struct cllm_loader cllm_loader;

/* Opens the data named by o->spec. Errors name the file (and line/column for
 * bad records). */
cllm_status cllm_loader_open(cllm_loader **out, const cllm_loader_opts *o);
void cllm_loader_free(cllm_loader *l); /* NULL is a no-op */

/* Samples per epoch (over the selected split). */
uint64_t cllm_loader_size(const cllm_loader *l);

/* Writes sample g of the stream as one row: tokens[T], labels[T]. Returns
 * the number of labels that are not -100. Thread-compatible: distinct
 * loaders may be used from distinct threads. */
cllm_status cllm_loader_get(cllm_loader *l, uint64_t g, int32_t *tokens, int32_t *labels, long *n_labels);

/* Of the preference pair that sample g belongs to: its record's "margin"
 * (trl's reward data; 0 when it has none or the data are not pairs) and,
 * with opts.singles, whether the record was a single text (single may be
 * NULL). */
cllm_status cllm_loader_pair_info(cllm_loader *l, uint64_t g, float *margin, bool *single);

#ifdef __cplusplus
}
#endif
#endif
