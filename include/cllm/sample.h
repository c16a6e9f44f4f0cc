/*
 * cllm sample: training records as users write them, rendered with a prompt
 * template into text segments, and tokenized segment by segment so that the
 * loss mask lines up with the tokens exactly.
 *
 * Record formats (one JSON object per record, detected per record):
 *   {"type": "pretrain", "text": "..."}                      every token trained
 *   {"type": "instruct", "instruct": "...", "input": "...", "output": "..."}
 *        ("input" optional; "" counts as absent; Alpaca's "instruction" is
 *        accepted for "instruct")
 *   {"type": "conversation", "rounds": [["ask", "..."], ["ans", "..."], ...]}
 *        (several asks in a row are allowed; "user"/"human" mean ask and
 *        "assistant"/"gpt" mean ans)
 *   {"type": "ref_qa", "reference": "...", "rounds": [...]}
 *   {"input_ids": [...], "labels": [...]}                    pre-tokenized
 * Without "type" the format is inferred: input_ids -> pre-tokenized,
 * rounds + reference -> ref_qa, rounds -> conversation, instruct or
 * instruction -> instruct, text -> pretrain. A paragraph of a .txt file is a
 * pretrain record.
 *
 * Loss: pretrain trains on every token (BOS, text, EOS); the other formats
 * train only on answer tokens plus the EOS that closes each answer.
 *
 * Errors are CLLM_ERR_FORMAT with "FILE:LINE:COL: what is wrong", where
 * LINE:COL (1-based, columns in characters) point at the offending field
 * when it exists, else at the record.
 */
#ifndef CLLM_SAMPLE_H
#define CLLM_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CLLM_SAMPLE_PRETRAIN = 0,
    CLLM_SAMPLE_INSTRUCT,
    CLLM_SAMPLE_CONVERSATION,
    CLLM_SAMPLE_REF_QA,
    CLLM_SAMPLE_TOKENS, /* pre-tokenized input_ids */
    CLLM_SAMPLE_TYPE_COUNT
} cllm_sample_type;

/* "pretrain", "instruct", "conversation", "ref_qa", "tokens". */
const char *cllm_sample_type_name(cllm_sample_type t);

/* ------------------------------------------------------------ templates */
/* A prompt template. Defaults (cllm_template_load(&t, NULL)):
 *   instruct (with input):  Alpaca's "Below is an instruction that describes
 *       a task, paired with an input that provides further context. Write a
 *       response that appropriately completes the request.\n\n### Instruction:
 *       \n{instruct}\n\n### Input:\n{input}\n\n### Response:\n"
 *   instruct (no input):    "Below is an instruction that describes a task.
 *       Write a response that appropriately completes the request.\n\n###
 *       Instruction:\n{instruct}\n\n### Response:\n"
 *   conversation / ref_qa:  system "" , reference "### Reference:\n{text}\n\n"
 *       (ref_qa only, first), each ask "### Human:\n{text}\n\n", each answer
 *       "### Assistant:\n" + answer + EOS, then "\n\n" before the next turn.
 *   bos: BOS first when the tokenizer has a BOS token different from EOS
 *       (LLaMA's <s>; not GPT-2, whose BOS is its EOS). eos: EOS after each
 *       answer and after pretrain text.
 * A template file is a JSON object with any of the string keys
 * "instruct", "instruct_input", "system", "reference_prefix",
 * "reference_suffix", "ask_prefix", "ask_suffix", "ans_prefix", "ans_suffix"
 * and the keys "bos" (true, false or null = automatic) and "eos" (bool).
 * {instruct} and {input} in the instruct strings are replaced by the
 * record's fields. Unknown keys are errors (a typo would otherwise be
 * silently ignored). See docs/data.md. */
typedef struct {
    char *instruct;       /* prompt without input */
    char *instruct_input; /* prompt with input */
    char *system;
    char *reference_prefix, *reference_suffix;
    char *ask_prefix, *ask_suffix;
    char *ans_prefix, *ans_suffix;
    int bos; /* 1 yes, 0 no, -1 automatic */
    bool eos;
} cllm_template;

/* Fills *t with the defaults (path NULL) or the defaults overridden by the
 * JSON file at path. Strings are owned by *t; release with
 * cllm_template_free. Errors name the file and key. */
cllm_status cllm_template_load(cllm_template *t, const char *path);
void cllm_template_free(cllm_template *t); /* NULL is a no-op; zeroes *t */

/* -------------------------------------------------------------- samples */
typedef enum { CLLM_SEG_TEXT = 0, CLLM_SEG_BOS, CLLM_SEG_EOS } cllm_segment_kind;

/* One piece of a rendered sample: text (bytes [off, off+len) of the
 * sample's text buffer) or a BOS/EOS token; `loss` says whether its tokens
 * are trained on. Adjacent prompt text is merged into one segment. */
typedef struct {
    cllm_segment_kind kind;
    bool loss;
    size_t off, len;
} cllm_segment;

/* A parsed and rendered record. Reusable: parse calls reset it. */
typedef struct {
    cllm_sample_type type;
    char *text; /* rendered text of all TEXT segments, back to back */
    size_t text_len, text_cap;
    cllm_segment *seg;
    size_t n_seg, seg_cap;
    int32_t *ids, *labels; /* CLLM_SAMPLE_TOKENS only: n_ids each */
    size_t n_ids, ids_cap;
} cllm_sample;

void cllm_sample_free(cllm_sample *s); /* releases buffers; zeroes *s */

/* Where a record starts, for messages. */
typedef struct {
    const char *file;
    uint64_t line, col; /* 1-based; col in characters */
} cllm_loc;

/* Parses one JSON record (len bytes) that starts at `where` and renders it
 * with template t into s. Malformed JSON, an unknown "type", a missing,
 * empty or wrongly typed field fail with CLLM_ERR_FORMAT and a
 * "FILE:LINE:COL: ..." message. Pre-tokenized ids are checked against
 * [0, vocab_size) (no check when vocab_size <= 0); labels must be -100 or a
 * valid id. Thread-safe (s is the caller's). */
cllm_status cllm_sample_parse(cllm_sample *s, const char *json, size_t len, const cllm_loc *where,
                              const cllm_template *t, int vocab_size);

/* Renders plain text (a .txt paragraph) as a pretrain record. */
cllm_status cllm_sample_from_text(cllm_sample *s, const char *text, size_t len, const cllm_template *t);

/* Tokenizes a rendered sample: appends ids to *ids and per-token labels
 * (the id where the loss counts, else -100) to *labels (same length). TEXT
 * segments are encoded one by one without special tokens; BOS/EOS become the
 * tokenizer's ids (tok may be NULL for CLLM_SAMPLE_TOKENS). Fails with
 * CLLM_ERR_ARG when the template needs a BOS/EOS the tokenizer lacks, or an
 * id is outside [0, vocab_size) (vocab_size <= 0: no check). `where` names
 * the record in messages (may be NULL). */
cllm_status cllm_sample_encode(const cllm_sample *s, const cllm_tokenizer *tok, const cllm_template *t,
                               int vocab_size, const cllm_loc *where, cllm_token_buf *ids,
                               cllm_token_buf *labels);

/* True when the template puts a BOS first for this tokenizer (resolves the
 * automatic setting). */
bool cllm_template_wants_bos(const cllm_template *t, const cllm_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
