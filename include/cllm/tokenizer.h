/*
 * cllm tokenizer: Hugging Face `tokenizer.json` tokenizers (BPE models:
 * GPT-2 style byte-level BPE and SentencePiece-style BPE with byte fallback)
 * with encode and decode that reproduce the Hugging Face pipeline:
 *
 *   raw text -> added tokens -> normalizer -> pre-tokenizer -> BPE model
 *            -> post-processor (BOS/EOS)                    (encode)
 *   ids -> tokens -> decoder -> text                          (decode)
 *
 * Supported components (anything else fails to load with
 * CLLM_ERR_UNSUPPORTED naming the component and its type):
 *   model           BPE ("type" may be missing; merges as "a b" or ["a","b"];
 *                   unk_token, fuse_unk, byte_fallback, ignore_merges;
 *                   continuing_subword_prefix / end_of_word_suffix only when
 *                   empty or null). WordPiece and Unigram are unsupported.
 *   normalizer      Sequence, Prepend, Replace (String or Regex pattern),
 *                   Strip, NFC, NFD, NFKC, NFKD, Lowercase. (BertNormalizer,
 *                   Precompiled: unsupported.)
 *   pre_tokenizer   ByteLevel (add_prefix_space, use_regex), Split (Regex or
 *                   String pattern, behaviors Isolated, Removed,
 *                   MergedWithPrevious, MergedWithNext, Contiguous, invert),
 *                   Metaspace (replacement, prepend_scheme always/first/never
 *                   or legacy add_prefix_space, split), Digits, Whitespace,
 *                   WhitespaceSplit, Sequence (a ByteLevel step must be last).
 *   post_processor  TemplateProcessing (single template), ByteLevel (no-op),
 *                   BertProcessing, RobertaProcessing, Sequence.
 *   decoder         ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
 *                   Sequence.
 * Regular expressions from the file are compiled with PCRE2 (UTF + UCP, JIT
 * when available), so \s, \p{L} etc. follow Unicode as in the Rust library.
 *
 * Text handling (the contract for every encode call):
 *   - Input is UTF-8. Invalid UTF-8 is defined behaviour: each maximal
 *     invalid subsequence is replaced by U+FFFD before anything else (the
 *     rule of Rust's String::from_utf8_lossy and of WHATWG TextDecoder), which
 *     is what Hugging Face sees when Python decodes bytes with
 *     errors="replace". Embedded NUL bytes are ordinary characters.
 *   - Added tokens (tokenizer.json "added_tokens") are found first, greedily,
 *     leftmost then longest. Tokens with normalized=false are matched in the
 *     raw text; the text between them is normalized and then tokens with
 *     normalized=true are matched in the normalized text (the Hugging Face
 *     order). lstrip/rstrip swallow the whitespace next to a match;
 *     single_word tokens only match when not preceded or followed by a word
 *     character (\w). Added tokens are recognised whether or not special
 *     tokens are requested (like add_special_tokens=False in HF).
 *   - Metaspace's prepend_scheme "first" prepends only to text that starts at
 *     offset 0 of the input (so not after a leading added token).
 *   - add_special selects whether the post-processor adds BOS/EOS. If
 *     tokenizer_config.json has add_bos_token or add_eos_token, they replace
 *     the template (BOS if add_bos_token, default true; EOS if add_eos_token,
 *     default false), as transformers' LlamaTokenizerFast does.
 *
 * Decoding follows the decoder in the file; skip_special drops special added
 * tokens. Invalid UTF-8 produced by byte-level tokens becomes U+FFFD per
 * maximal subpart; a run of <0xNN> byte-fallback tokens that is not valid
 * UTF-8 becomes one U+FFFD per byte token (the Rust library's rule). With no
 * decoder, tokens are joined with single spaces.
 *
 * Threads: a loaded tokenizer is read-only except for an internal pool of
 * per-call BPE caches taken with atomic flags, so encode and decode may be
 * called concurrently on one handle from several threads.
 */
#ifndef CLLM_TOKENIZER_H
#define CLLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cllm_tokenizer cllm_tokenizer;

/* A growable array of token ids. A zero-initialised struct is an empty
 * buffer; encode appends to it (set n = 0 to reuse the memory) and
 * cllm_token_buf_free releases it. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} cllm_token_buf;

/* Frees b->ids and zeroes *b. NULL is a no-op. */
void cllm_token_buf_free(cllm_token_buf *b);

/* Loads a tokenizer. `path` is either a folder holding tokenizer.json (and
 * optionally tokenizer_config.json) or the path of a tokenizer.json file (a
 * tokenizer_config.json next to it is then read too).
 * Returns CLLM_OK and a new handle in *out; on failure *out is NULL and the
 * status is CLLM_ERR_IO (missing/unreadable file), CLLM_ERR_FORMAT
 * (malformed JSON, reported as "path:line:col: message", or bad values,
 * naming the key), CLLM_ERR_UNSUPPORTED (model/normalizer/... type we do not
 * implement, naming it) or CLLM_ERR_NOMEM. The caller frees the handle with
 * cllm_tokenizer_free. */
cllm_status cllm_tokenizer_load(cllm_tokenizer **out, const char *path);

/* Frees everything owned by the handle. NULL is a no-op. Not safe while
 * another thread uses the handle. */
void cllm_tokenizer_free(cllm_tokenizer *tok);

/* Encodes `len` bytes of UTF-8 `text` (NUL bytes allowed; text may be NULL
 * when len is 0) and appends the ids to `out`. add_special: let the
 * post-processor add BOS/EOS (HF add_special_tokens). On failure (only
 * CLLM_ERR_NOMEM or CLLM_ERR_INTERNAL) out->n is restored to its value on
 * entry. Thread-safe. */
cllm_status cllm_tokenizer_encode(const cllm_tokenizer *tok, const char *text, size_t len, bool add_special,
                                  cllm_token_buf *out);

/* Decodes n ids into newly allocated UTF-8 text: *text is NUL-terminated
 * (the text itself may contain NUL bytes, *len is its length without the
 * terminator) and the caller frees it with free(). An id outside
 * [0, vocab_size) or with no token is CLLM_ERR_ARG naming the id and its
 * position. skip_special drops special added tokens. Thread-safe. */
cllm_status cllm_tokenizer_decode(const cllm_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                                  char **text, size_t *len);

/* Largest token id + 1, counting the model vocabulary and added tokens. */
int32_t cllm_tokenizer_vocab_size(const cllm_tokenizer *tok);

/* Special token ids, -1 when the tokenizer has none. Taken from
 * tokenizer_config.json (bos_token, eos_token, pad_token, unk_token: a string
 * or an object with "content"), else unk from the model's unk_token; when the
 * config names no bos/eos but the vocabulary has the special added token
 * "<|endoftext|>", it is used for both (GPT-2's convention). */
int32_t cllm_tokenizer_bos_id(const cllm_tokenizer *tok);
int32_t cllm_tokenizer_eos_id(const cllm_tokenizer *tok);
int32_t cllm_tokenizer_pad_id(const cllm_tokenizer *tok);
int32_t cllm_tokenizer_unk_id(const cllm_tokenizer *tok);

/* model_max_length from tokenizer_config.json, clamped to [0, INT64_MAX]
 * (the file may say 1e30); -1 when absent. */
int64_t cllm_tokenizer_model_max_length(const cllm_tokenizer *tok);

/* The token string of `id` as stored in tokenizer.json (byte-level tokens
 * in their printable alphabet, e.g. "Ġthe"), or NULL if id is out of range
 * or unused. Borrowed: valid until cllm_tokenizer_free. *len (if not NULL)
 * receives its length in bytes. */
const char *cllm_tokenizer_id_to_token(const cllm_tokenizer *tok, int32_t id, size_t *len);

/* The id of the token spelled exactly as `token` (len bytes) in the
 * vocabulary or the added tokens, or -1. */
int32_t cllm_tokenizer_token_to_id(const cllm_tokenizer *tok, const char *token, size_t len);

/* True if id is a special added token (what decode's skip_special drops). */
bool cllm_tokenizer_is_special(const cllm_tokenizer *tok, int32_t id);

/* ---- describing the vocabulary to other runtimes (GGUF export) ---- */

/* The kind of a token id, numbered as llama.cpp's token types (and
 * SentencePiece's piece types): the model's or the configured unk token is
 * UNKNOWN, special added tokens CONTROL, other added tokens USER_DEFINED,
 * the <0xNN> tokens of a byte-fallback model BYTE, ids with no token (or
 * out of range) UNUSED, everything else NORMAL. */
typedef enum {
    CLLM_TOKEN_NORMAL = 1,
    CLLM_TOKEN_UNKNOWN = 2,
    CLLM_TOKEN_CONTROL = 3,
    CLLM_TOKEN_USER_DEFINED = 4,
    CLLM_TOKEN_UNUSED = 5,
    CLLM_TOKEN_BYTE = 6
} cllm_token_kind;
cllm_token_kind cllm_tokenizer_token_kind(const cllm_tokenizer *tok, int32_t id);

/* True for GPT-2 style tokenizers (a ByteLevel pre-tokenizer maps bytes to
 * printable symbols), false for SentencePiece-style ones. */
bool cllm_tokenizer_is_byte_level(const cllm_tokenizer *tok);

/* Whether encode with add_special puts the BOS id first / the EOS id last. */
bool cllm_tokenizer_adds_bos(const cllm_tokenizer *tok);
bool cllm_tokenizer_adds_eos(const cllm_tokenizer *tok);

/* One BPE merge: tokens `left` and `right` become `merged`; lower rank
 * merges first (ranks are the file's order, gaps where a pair repeated). */
typedef struct {
    int32_t left, right, merged;
    uint32_t rank;
} cllm_tokenizer_merge;

/* The model's merges sorted by rank into a new array (*n entries; NULL and
 * 0 when there are none) the caller frees with free(). Fails only with
 * CLLM_ERR_NOMEM. Thread-safe. */
cllm_status cllm_tokenizer_merges(const cllm_tokenizer *tok, cllm_tokenizer_merge **out, size_t *n);

/* ---- training BPE tokenizers ----
 *
 * cllm_tokenizer_train learns a BPE tokenizer from text files and writes
 * tokenizer.json and tokenizer_config.json (atomically) into a folder that
 * Hugging Face tokenizers load:
 *   CLLM_TOKENIZER_BYTE_BPE  GPT-2 style: ByteLevel pre-tokenizer (GPT-2
 *     pattern, no prefix space), the 256 bytes as base symbols, ByteLevel
 *     decoder; encode/decode round-trips any UTF-8 text.
 *   CLLM_TOKENIZER_SP_BPE    SentencePiece/LLaMA style: Metaspace
 *     pre-tokenizer (U+2581, prepend_scheme "first"), characters as base
 *     symbols (those covering `character_coverage` of the character
 *     occurrences; rarer ones fall back to the 256 <0xNN> byte tokens),
 *     <unk> <s> </s> at ids 0, 1, 2, BOS added by a TemplateProcessing
 *     post-processor, decoders Replace/ByteFallback/Fuse/Strip. Training
 *     reads the corpus line by line.
 * Ids: the special tokens first (0..k-1), then the 256 byte symbols, then
 * (sp) the characters by decreasing frequency, then one token per merge in
 * merge order. Added tokens in the text are not learned from. Training is
 * deterministic: the same files and parameters give the same bytes, for
 * any number of workers.
 */
typedef enum { CLLM_TOKENIZER_BYTE_BPE = 0, CLLM_TOKENIZER_SP_BPE } cllm_tokenizer_type;

typedef struct {
    cllm_tokenizer_type type;       /* train only */
    int32_t vocab_size;             /* train: size of the final vocabulary */
    int32_t n_add;                  /* extend: number of new tokens */
    const char *const *special_tokens; /* train only; NULL: byte-bpe "<|endoftext|>", sp-bpe none */
    int n_special;                  /* sp-bpe: added after <unk> <s> </s> */
    int64_t min_frequency;          /* a pair seen fewer times is never merged (values < 1 mean 1) */
    double character_coverage;      /* sp: in (0, 1]; 0 selects the default 0.9995 */
    int n_workers;                  /* threads for reading the corpus; <= 0: OpenMP default */
} cllm_tokenizer_train_params;

/* Filled in by train/extend (may be NULL). */
typedef struct {
    int32_t vocab_size;  /* final size (can be short of the request on a small corpus) */
    size_t n_merges;
    size_t n_words;      /* distinct words */
    size_t n_bytes;      /* corpus size */
    double seconds_count, seconds_merge;
} cllm_tokenizer_train_stats;

/* Trains on n_files text files and writes the tokenizer into out_dir
 * (created if needed). Fails with CLLM_ERR_ARG for bad parameters (e.g. a
 * vocab_size smaller than the special tokens plus the 256 byte tokens),
 * CLLM_ERR_IO for an unreadable input or unwritable output; nothing is
 * written on failure. Not thread-safe with respect to out_dir. */
cllm_status cllm_tokenizer_train(const char *const *files, int n_files, const cllm_tokenizer_train_params *p,
                                 const char *out_dir, cllm_tokenizer_train_stats *stats);

/* Extends the tokenizer in folder `base` (a byte-level or SentencePiece-
 * style BPE tokenizer.json) with p->n_add new tokens learned from the files,
 * and writes the result into out_dir. Every existing token keeps its id and
 * spelling; new tokens get ids after the largest id in use (added tokens
 * included); new merges rank after the existing ones, so text whose
 * encoding no new merge applies to encodes as before. SentencePiece-style
 * tokenizers first gain the corpus characters they lack (within
 * character_coverage), then merges. tokenizer_config.json and
 * special_tokens_map.json are copied unchanged. Uses p->n_add,
 * min_frequency, character_coverage and n_workers. */
cllm_status cllm_tokenizer_extend(const char *base, const char *const *files, int n_files,
                                  const cllm_tokenizer_train_params *p, const char *out_dir,
                                  cllm_tokenizer_train_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
