/*
 * Private definitions of the BPE trainer (train.c, train_words.c,
 * train_bpe.c): the word-count table, the vocabulary being built and the
 * merge learner. See cllm_tokenizer_train in include/cllm/tokenizer.h.
 */
#ifndef CLLM_TRAIN_IMPL_H
#define CLLM_TRAIN_IMPL_H

#include "tokenizer/tok_impl.h"

/* ---- word -> count (open addressing, keys copied into an arena) ---- */
typedef struct {
    uint64_t off, hash;
    uint32_t len;
    int64_t count;
} tt_word;
typedef struct {
    tk_str keys;
    tt_word *v;
    size_t n, cap;
    uint32_t *slots; /* 0 = empty, else index into v + 1 */
    size_t mask;
} tt_wordmap;
bool tt_wordmap_add(tt_wordmap *m, const char *k, size_t n, uint64_t hash, int64_t count);
void tt_wordmap_free(tt_wordmap *m);

/* Reads the files and counts the words that the tokenizer's own pipeline
 * (added tokens removed, normalizer, pre-tokenizer) produces, in parallel
 * over ~1 MiB chunks with n_workers threads (<= 0: OpenMP's default). Text is
 * cut into chunks only where the cut cannot change the pre-tokens, so the
 * counts do not depend on the thread count. Byte-level tokenizers see each
 * chunk as one text; the others see one text per line (without the '\n'),
 * the way SentencePiece reads sentences, and their pieces are further cut
 * before each U+2581 that follows another character. *n_bytes receives the
 * corpus size. */
cllm_status tt_count_words(const cllm_tokenizer *tok, const char *const *files, int n_files, int n_workers,
                           tt_wordmap *out, size_t *n_bytes);

/* ---- the vocabulary being built: id <-> token string ---- */
typedef struct {
    tk_str arena;
    uint64_t *off; /* UINT64_MAX: id unused (e.g. an added token outside model.vocab) */
    uint32_t *len;
    uint8_t *reserved; /* 1: special or byte-fallback token, never a merge result */
    int32_t n, cap;    /* ids are [0, n) */
    tk_strmap map;
} tt_vocab;
bool tt_vocab_init(tt_vocab *v, size_t expect);
/* Gives `id` the string s[0..n); extends the id range as needed. */
bool tt_vocab_set(tt_vocab *v, int32_t id, const char *s, size_t n);
static inline const char *tt_vocab_str(const tt_vocab *v, int32_t id) { return v->arena.p + v->off[id]; }
void tt_vocab_free(tt_vocab *v);

/* ---- the words as symbol sequences, and the merge learner ---- */
typedef struct {
    int32_t *sym;    /* all words' symbols; -1 = a barrier that never merges */
    uint64_t *off;   /* word w: sym[off[w] .. off[w] + len[w]) */
    uint32_t *len;
    int64_t *count;
    size_t n_words;
} tt_corpus;
void tt_corpus_free(tt_corpus *c);

typedef struct {
    int32_t a, b, merged;
} tt_merge;

/* Learns merges on c (modified in place) until n_new tokens have been added
 * to v or no pair occurs at least min_freq times. A merge whose result is
 * already a token of v reuses its id. The best pair is the most frequent;
 * ties go to the lexicographically smaller merged string, then the shorter
 * left part, so the result does not depend on word order. *merges (caller
 * frees) receives the merges in rank order, *n_made the tokens added. */
cllm_status tt_learn(tt_corpus *c, tt_vocab *v, int32_t n_new, int64_t min_freq, tt_merge **merges,
                     size_t *n_merges, int32_t *n_made);

/* Applies existing merges (rank order, leftmost first: the encoder's rule)
 * to every word of c. */
cllm_status tt_apply_merges(tt_corpus *c, const tk_pairmap *merges);

#endif
