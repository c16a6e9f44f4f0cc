/*
 * cllm prepare: users' data files -> a Megatron-compatible indexed dataset.
 *
 * Reads .json / .jsonl / .txt files (formats in cllm/sample.h), renders and
 * tokenizes every record in parallel, and writes
 *   PREFIX.bin   token ids back to back (uint16 when the tokenizer's
 *                vocabulary has at most 65536 ids, else int32)
 *   PREFIX.idx   Megatron's MMIDIDX index, version 1; one sequence and one
 *                document per record
 *   PREFIX.mask  cllm's loss-mask side file (one bit per token), with the
 *                packing flag, the split weights and a checksum of the
 *                sequence lengths that ties it to the .idx
 * (byte layouts: docs/formats/indexed-dataset.md). Output order does not
 * depend on the number of workers. Records stream through a bounded queue of
 * chunks, so memory stays flat however large the input; only the per-record
 * index (12 bytes per record) and the mask bitmap (one bit per token) grow.
 * All three files are written under temporary names and renamed into place
 * only after everything succeeded: an interrupted or failed run never
 * replaces an existing dataset.
 */
#ifndef CLLM_PREPARE_H
#define CLLM_PREPARE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *const *inputs; /* data files, read in this order */
    int n_inputs;
    const char *tokenizer;     /* folder with tokenizer.json (required) */
    const char *template_path; /* prompt template file, NULL = defaults */
    const char *out_prefix;    /* writes out_prefix.bin/.idx/.mask */
    int seq_len;      /* unpacked samples longer than this are truncated (0 = never) */
    bool pack;        /* mark the dataset packed: rows are windows over all tokens */
    const char *split; /* default split weights stored for the loader ("950,30,20"), NULL = none */
    int workers;       /* tokenizing threads (>= 1) */
    long skip_bad;     /* bad records tolerated (skipped and counted) */
    /* Preference pairs (docs/alignment.md): the inputs are preference
     * .json/.jsonl files read as `cllm train --task dpo|reward` reads them
     * (the same rows; seq_len: each row keeps its last seq_len tokens);
     * each pair is one document of two sequences, chosen then rejected,
     * the prompt out of the loss mask; margins go into the .mask. One
     * thread; skip_bad, pack and the template do not apply. */
    bool pairs;
    /* Polled between chunks; when it becomes non-zero the run stops with
     * CLLM_ERR_IO ("interrupted") and removes its temporary files. May be
     * NULL. A signal handler may set it. */
    const volatile sig_atomic_t *cancel;
} cllm_prepare_opts;

#define CLLM_PREPARE_MAX_REPORTED 5

typedef struct {
    uint64_t records;   /* written */
    uint64_t by_type[5]; /* per cllm_sample_type */
    uint64_t tokens;
    uint64_t bytes_in;
    uint64_t truncated, tokens_cut, max_cut; /* samples cut to seq_len, tokens dropped, largest cut */
    uint64_t no_loss; /* written samples with no trained token left */
    uint64_t bad;     /* skipped records (not counting one that stopped the run) */
    char bad_where[CLLM_PREPARE_MAX_REPORTED][512]; /* messages of the first skipped ones */
    uint64_t split_docs[3]; /* documents per split when a split was given */
    int dtype;              /* MMIDIDX dtype code written (8 uint16, 4 int32) */
    double seconds;
} cllm_prepare_report;

/* Runs the whole preparation. On success the three files exist and *r
 * (may be NULL) describes the run. On failure no final file was touched;
 * errors name FILE:LINE:COL of the first bad record beyond skip_bad. */
cllm_status cllm_prepare(const cllm_prepare_opts *o, cllm_prepare_report *r);

#ifdef __cplusplus
}
#endif
#endif
