/*
 * Private to src/data: streaming record readers, the MMIDIDX indexed
 * dataset with its loss-mask side file, Megatron's split rule, and the
 * in-memory sample store shared by the loader and prepare. Not part of the
 * public API.
 */
#ifndef CLLM_DATA_IMPL_H
#define CLLM_DATA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "cllm/core.h"
#include "cllm/sample.h"

/* ------------------------------------------------------- record reader */
/* Reads records from a .jsonl (one per line), .json (an array, scanned
 * incrementally: memory is one record, not the file; // and block comments
 * and trailing commas are accepted as in the documented user format) or
 * .txt file (one record per blank-line-separated paragraph). A .json file
 * whose first character is '{' is read as JSON lines. */
typedef enum { CLLM_REC_JSON = 0, CLLM_REC_TEXT } cllm_rec_kind;

typedef struct {
    cllm_rec_kind kind;
    const char *text; /* borrowed until the next call */
    size_t len;
    cllm_loc loc;
} cllm_record;

typedef struct cllm_record_reader cllm_record_reader;

#define CLLM_RECORD_MAX ((size_t)256 << 20) /* bytes in one record */

cllm_status cllm_records_open(cllm_record_reader **out, const char *path);
/* *got = false at the end of the file. A broken file structure (not a
 * record's content) is an error with FILE:LINE:COL. */
cllm_status cllm_records_next(cllm_record_reader *r, cllm_record *rec, bool *got);
uint64_t cllm_records_bytes(const cllm_record_reader *r); /* consumed so far */
void cllm_records_close(cllm_record_reader *r);

/* Records "FILE:LINE:COL: message" as this thread's last error: the
 * location stands where other messages name the failing function. */
cllm_status cllm_fail_at(cllm_status st, const char *file, uint64_t line, uint64_t col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
/* Re-raises a message made by cllm_fail_at for `file` (kept verbatim),
 * with `suffix` appended. */
cllm_status cllm_fail_again(cllm_status st, const char *msg, const char *file, const char *suffix);

/* ------------------------------------------------------ sample store */
/* Samples back to back: tokens and labels (-100 = no loss) plus offsets. */
typedef struct {
    int32_t *tokens, *labels;
    size_t n_tokens, cap_tokens;
    uint64_t *offsets; /* n + 1 */
    size_t n, cap;
} cllm_store;

cllm_status cllm_store_append(cllm_store *s, const int32_t *tokens, const int32_t *labels, size_t n);
void cllm_store_free(cllm_store *s);

/* ---------------------------------------------------- preference pairs */
/* Reads a preference JSONL file (src/data/pairs.c; docs/alignment.md) into
 * mem as two rows per record, chosen then rejected, each the last T tokens
 * of prompt + completion with labels -100 on the prompt. tokenizer: folder
 * for text records (may be NULL when every record is pre-tokenized); *pad:
 * its padding id (else EOS, else 0). extra->margin: each record's
 * "margin" (trl's reward data; 0 without), per row (free() both arrays).
 * With `singles`, a record of one text ({"text"}, {"prompt",
 * "completion"} or {"input_ids"}) is accepted as two equal rows, marked in
 * extra->single (cllm score). Bad records fail with FILE:LINE:COL. */
typedef struct {
    float *margin;         /* per row, or NULL when no record has one */
    unsigned char *single; /* per row: 1 for a single record's rows, or NULL when there is none */
} cllm_pair_extra;
cllm_status cllm_pairs_load(cllm_store *mem, int32_t *pad, cllm_pair_extra *extra, bool singles, const char *path,
                            const char *tokenizer, int vocab, int T);

/* Conversational records (src/data/pairs_chat.c): "prompt", "chosen" and
 * "rejected" as message lists, rendered with the tokenizer folder's chat
 * template (else cllm's conversation format). */
typedef struct {
    struct cllm_chat_template *tmpl;
    char *bos, *eos; /* the template's bos_token / eos_token, or NULL */
    bool loaded;
} cllm_pairs_chat;
void cllm_pairs_chat_free(cllm_pairs_chat *c);
/* Whether the record's "prompt" or completion key kc holds a list. */
bool cllm_pairs_is_chat(json_t *o, const char *kc);
/* Renders record o into text[0] prompt, text[1] chosen (key kc), text[2]
 * rejected (key kr), malloc'ed; trl's apply_chat_template (and, without
 * "prompt", extract_prompt). dir: the tokenizer folder, read on the first
 * call. Bad records fail with FILE:LINE:COL naming the key. */
cllm_status cllm_pairs_chat_render(cllm_pairs_chat *c, const char *dir, const struct cllm_tokenizer *tok, json_t *o,
                                   const cllm_loc *l, const char *kc, const char *kr, char *text[3]);

/* ------------------------------------------------ record -> tokens */
/* Everything needed to turn a record into tokens. */
typedef struct {
    const cllm_tokenizer *tok; /* may be NULL: only pre-tokenized records then */
    const cllm_template *tmpl;
    int vocab_size;
} cllm_encoder;

/* Parses and encodes one record, appending to ids/labels. */
cllm_status cllm_record_encode(const cllm_encoder *e, const cllm_record *rec, cllm_sample *scratch,
                               cllm_token_buf *ids, cllm_token_buf *labels, cllm_sample_type *type);

/* --------------------------------------------------------- splits */
/* Parses "950,30,20" (1 to 3 non-negative numbers, positive sum) into
 * normalized weights w[3] (missing ones 0). */
cllm_status cllm_split_parse(const char *s, double w[3]);
/* Megatron's document ranges: bounds[0..3] with bounds[0] = 0 and
 * bounds[3] = n; split k is [bounds[k], bounds[k+1]). */
void cllm_split_bounds(const double w[3], uint64_t n, uint64_t bounds[4]);
/* "train" -> 0, "valid"/"validation" -> 1, "test" -> 2, else -1. */
int cllm_split_index(const char *name);

/* -------------------------------------------------- indexed dataset */
/* MMIDIDX dtype codes. */
enum { MMI_U8 = 1, MMI_I8 = 2, MMI_I16 = 3, MMI_I32 = 4, MMI_I64 = 5, MMI_F64 = 6, MMI_F32 = 7, MMI_U16 = 8 };

#define CLLM_MASK_FLAG_PACKED 1u
/* preference pairs: every document is two sequences, chosen then rejected */
#define CLLM_MASK_FLAG_PAIRS 2u
/* with PAIRS: one f32 margin per pair follows the bitmap */
#define CLLM_MASK_FLAG_MARGINS 4u

/* An opened PREFIX.bin / .idx (/ .mask) by mmap, validated. */
typedef struct {
    char *prefix;
    int dtype;        /* MMI_* code */
    size_t item;      /* bytes per token */
    uint64_t n_seq, n_doc; /* n_doc = document_indices entries - 1 */
    const int32_t *lengths;   /* [n_seq] (unaligned access avoided: copied) */
    const int64_t *pointers;  /* [n_seq] */
    const int64_t *docs;      /* [n_doc + 1] */
    const unsigned char *bin; /* token bytes */
    uint64_t bin_bytes, n_tokens;
    const unsigned char *mask; /* bitmap, NULL when there is no .mask file */
    const unsigned char *margins; /* CLLM_MASK_FLAG_MARGINS: f32 per pair (little-endian), else NULL */
    uint32_t flags, seq_len;
    int32_t pad_id;
    double split[3]; /* from prepare --split; all 0 when not given */
    void *maps[3];
    size_t map_len[3];
    int32_t *own_lengths; int64_t *own_pointers, *own_docs; /* aligned copies */
} cllm_indexed;

cllm_status cllm_indexed_open(cllm_indexed *d, const char *prefix);
void cllm_indexed_close(cllm_indexed *d);
int32_t cllm_indexed_token(const cllm_indexed *d, uint64_t i); /* token i of the .bin */
float cllm_indexed_margin(const cllm_indexed *d, uint64_t pair); /* 0 without margins */
bool cllm_indexed_loss(const cllm_indexed *d, uint64_t i);

/* FNV-1a 64 of the sequence lengths as little-endian int32 bytes: the .mask
 * file's check that it belongs to this .idx. */
uint64_t cllm_lengths_hash(const int32_t *lengths, uint64_t n);

/* Little-endian field helpers. */
void cllm_put_u32(unsigned char *p, uint32_t v);
void cllm_put_u64(unsigned char *p, uint64_t v);
uint32_t cllm_get_u32(const unsigned char *p);
uint64_t cllm_get_u64(const unsigned char *p);

#define CLLM_MASK_MAGIC "CLLMMASK"
#define CLLM_MASK_VERSION 1u
#define CLLM_MASK_HEADER 80u

#endif
