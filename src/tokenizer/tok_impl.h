/*
 * Private definitions shared by the tokenizer files: growable buffers, the
 * string->id and pair->merge hash tables, UTF-8 helpers, compiled regexes,
 * the component trees (normalizer, pre-tokenizer, decoder) and the
 * per-call work state. See include/cllm/tokenizer.h for the behaviour.
 */
#ifndef CLLM_TOK_IMPL_H
#define CLLM_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdatomic.h>

#include "cllm/tokenizer.h"

/* ---- growable byte string ---- */
typedef struct {
    char *p;
    size_t n, cap;
} tk_str;
bool tk_str_reserve(tk_str *s, size_t extra);
bool tk_str_put(tk_str *s, const void *p, size_t n);
void tk_str_free(tk_str *s);

/* ---- a list of byte ranges ("pieces") stored in an arena ---- */
typedef struct {
    size_t off, len;
    /* pre-tokenizers: the piece begins at offset 0 of the input;
     * decoders: the piece is an added token (passed through verbatim) */
    bool at_start;
} tk_span;
typedef struct {
    tk_str buf;
    tk_span *v;
    size_t n, cap;
} tk_pieces;
/* Appends a copy of p[0..n) as a new piece. */
bool tk_pieces_add(tk_pieces *l, const char *p, size_t n, bool at_start);
void tk_pieces_clear(tk_pieces *l);
void tk_pieces_free(tk_pieces *l);

/* ---- string -> int32 map (open addressing; keys copied) ---- */
typedef struct {
    uint32_t off, len, hash;
    int32_t val;
} tk_ent;
typedef struct {
    tk_str keys;
    tk_ent *ents;
    size_t n, cap;
    uint32_t *slots; /* 0 = empty, else index into ents + 1 */
    size_t mask;
} tk_strmap;
bool tk_strmap_init(tk_strmap *m, size_t expect);
int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t n); /* -1 if absent */
bool tk_strmap_put(tk_strmap *m, const char *k, size_t n, int32_t val); /* overwrites */
void tk_strmap_free(tk_strmap *m);

/* ---- (id, id) -> (rank, merged id) ---- */
typedef struct {
    uint64_t key; /* UINT64_MAX = empty */
    uint32_t rank;
    int32_t merged;
} tk_pair_ent;
typedef struct {
    tk_pair_ent *e; /* one 16-byte entry per slot: one cache miss per probe */
    size_t mask, n;
} tk_pairmap;
bool tk_pairmap_init(tk_pairmap *m, size_t expect);
/* Keeps the first (lowest-rank) entry when a pair repeats. */
void tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
static inline uint64_t tk_pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}
static inline size_t tk_pair_slot(uint64_t k, size_t mask) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k >> 32 ^ k) & mask;
}
/* Returns true and the rank/merged id if (a, b) is a merge (a, b >= 0). */
static inline bool tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    uint64_t k = tk_pair_key(a, b);
    size_t i = tk_pair_slot(k, m->mask);
    for (;;) {
        const tk_pair_ent *e = &m->e[i];
        if (e->key == k) {
            *rank = e->rank;
            *merged = e->merged;
            return true;
        }
        if (e->key == UINT64_MAX) return false;
        i = (i + 1) & m->mask;
    }
}
void tk_pairmap_free(tk_pairmap *m);

uint64_t tk_hash(const void *p, size_t n);

/* ---- UTF-8 ---- */
/* Decodes one code point at s[0..n) (n > 0) of text known to be valid UTF-8;
 * returns its length in bytes. */
size_t tk_utf8_next(const char *s, size_t n, uint32_t *cp);
/* Length of the valid UTF-8 prefix of s[0..n). */
size_t tk_utf8_valid_prefix(const char *s, size_t n);
/* Appends s[0..n) to out, replacing each maximal invalid subsequence with
 * U+FFFD (the from_utf8_lossy / WHATWG rule). */
bool tk_utf8_lossy(tk_str *out, const char *s, size_t n);
/* Writes cp as UTF-8 into b (4 bytes room); returns the length. */
size_t tk_utf8_put(char *b, uint32_t cp);
/* Unicode White_Space property (Rust char::is_whitespace). */
bool tk_is_space(uint32_t cp);
/* Length of the whitespace prefix / suffix of valid UTF-8 s[0..n). */
size_t tk_space_prefix(const char *s, size_t n);
size_t tk_space_suffix(const char *s, size_t n);

/* ---- regex ---- */
typedef struct {
    pcre2_code *code;
    bool jit;
} tk_regex;
/* Compiles pattern[0..n) with UTF|UCP (LITERAL if literal); JIT if
 * possible. `what` names the pattern in the error message. */
cllm_status tk_regex_compile(tk_regex *re, const char *pattern, size_t n, bool literal, const char *what);
void tk_regex_free(tk_regex *re);

/* Per-call scratch: match data, JIT stack, buffers and the BPE cache. */
typedef struct tk_work tk_work;
/* Finds the next match of re in s[0..n) at or after `start`. Returns 1 and
 * the match bounds, 0 if none, or -1 on a matching error (message set). */
int tk_regex_find(const tk_regex *re, tk_work *w, const char *s, size_t n, size_t start, size_t *ms, size_t *me);

/* ---- components ---- */
typedef enum { NORM_SEQ, NORM_PREPEND, NORM_REPLACE, NORM_STRIP, NORM_UNICODE, NORM_LOWERCASE } tk_norm_kind;
typedef enum { FORM_NFC, FORM_NFD, FORM_NFKC, FORM_NFKD } tk_norm_form;
typedef struct tk_norm {
    tk_norm_kind kind;
    tk_norm_form form; /* UNICODE */
    char *a, *b; /* PREPEND: a = text; REPLACE: a = literal pattern, b = content */
    size_t a_len, b_len;
    bool use_re;
    tk_regex re;
    bool strip_left, strip_right;
    struct tk_norm *kids;
    size_t n_kids;
} tk_norm;

typedef enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_SEQ } tk_pt_kind;
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } tk_split_behavior;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tk_prepend_scheme;
typedef struct tk_pretok {
    tk_pt_kind kind;
    /* BYTELEVEL */
    bool add_prefix_space, use_regex;
    /* BYTELEVEL (use_regex) and SPLIT */
    tk_regex re;
    tk_split_behavior behavior;
    bool invert;
    /* METASPACE */
    char rep[8];
    size_t rep_len;
    tk_prepend_scheme scheme;
    bool split;
    struct tk_pretok *kids;
    size_t n_kids;
} tk_pretok;

typedef enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE, DEC_SEQ } tk_dec_kind;
typedef struct tk_dec {
    tk_dec_kind kind;
    char *a, *b; /* REPLACE: pattern, content; STRIP: a = content char */
    size_t a_len, b_len;
    size_t start, stop;   /* STRIP */
    char rep[8];          /* METASPACE */
    size_t rep_len;
    bool strip_first;     /* METASPACE: drop the leading space of the first token */
    struct tk_dec *kids;
    size_t n_kids;
} tk_dec;

/* Added-token matcher: a byte trie over token contents. */
typedef struct {
    int32_t *child;   /* per node: first child index, -1 none */
    int32_t *sibling; /* per node: next sibling, -1 none */
    uint8_t *byte;    /* per node: edge byte */
    int32_t *tok;     /* per node: index into added[] ending here, -1 none */
    size_t n, cap;
    bool first[256]; /* bytes that can start a token */
} tk_trie;

typedef struct {
    int32_t id;
    char *content;
    size_t len;
    bool lstrip, rstrip, single_word, normalized, special;
} tk_added;

/* ---- per-call state ---- */
#define TK_CACHE_SLOTS 65536
#define TK_CACHE_KEY 30
#define TK_CACHE_IDS 6
typedef struct {
    uint64_t h;
    uint8_t klen, nid;
    char key[TK_CACHE_KEY];
    int32_t ids[TK_CACHE_IDS];
} tk_cache_slot;

typedef struct {
    uint64_t key; /* rank << 32 | left symbol index */
    int32_t idl, idr, merged;
} tk_heap_ent;

typedef struct {
    size_t off, len;
    int32_t id; /* >= 0: an added token; -1: text */
} tk_seg;

struct tk_work {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    tk_str clean, norm, tmp;
    tk_pieces pieces[2];
    tk_seg *segs[2];
    size_t segs_cap[2];
    /* BPE symbols */
    int32_t *sym, *prev, *next;
    uint32_t *soff, *slen;
    size_t sym_cap;
    tk_heap_ent *heap;
    size_t heap_cap;
    tk_cache_slot *cache; /* TK_CACHE_SLOTS direct-mapped entries (4 MiB) */
};

#define TK_POOL 64
typedef struct {
    atomic_flag busy[TK_POOL];
    tk_work *w[TK_POOL];
} tk_pool;

struct cllm_tokenizer {
    char *path;
    tk_strmap vocab; /* model vocabulary and added tokens */
    tk_str tok_arena;  /* token strings, NUL-separated */
    uint32_t *tok_off; /* id -> offset in tok_arena, UINT32_MAX if unused */
    uint32_t *tok_len;
    uint8_t *tok_flags; /* TK_F_ADDED | TK_F_SPECIAL */
    int32_t n_ids;
    /* model */
    tk_pairmap merges;
    int32_t model_unk;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_fb[256];  /* id of "<0xNN>" or -1 */
    bool byte_level;       /* a ByteLevel pre-tokenizer maps bytes to symbols */
    int32_t byte_id[256];  /* byte-level: id of the one-char token for each byte */
    int32_t *cp_id;        /* code point < 0x10000 -> id of the one-char token, or -1 */
    /* SentencePiece-style words may be cut before `cut` (e.g. U+2581) when
     * it follows another character: no vocabulary token spans such a cut,
     * so merges never cross it (checked at load; cut_len 0 = never cut) */
    char cut[8];
    size_t cut_len;
    /* added tokens */
    tk_added *added;
    size_t n_added;
    tk_trie trie_raw, trie_norm;
    bool has_norm_added;
    /* pipeline */
    tk_norm *norm;
    tk_pretok *pretok;
    tk_dec *dec;
    int32_t *pre_ids, *post_ids; /* post-processor ids around the sequence */
    size_t n_pre, n_post;
    int32_t bos, eos, pad, unk;
    int64_t max_len;
    tk_pool *pool;
};
#define TK_F_ADDED 1u
#define TK_F_SPECIAL 2u

/* byte-level alphabet: byte -> code point, and code point -> byte (-1) */
uint32_t tk_byte_to_cp(uint8_t b);
int tk_cp_to_byte(uint32_t cp);

/* ---- stages (each file's entry points) ---- */
tk_work *tk_work_acquire(const cllm_tokenizer *tok, int *slot);
void tk_work_release(const cllm_tokenizer *tok, tk_work *w, int slot);
void tk_work_free(tk_work *w);

cllm_status tk_norm_apply(const tk_norm *n, tk_work *w, const char *s, size_t len, tk_str *out);
void tk_norm_free(tk_norm *n);

/* Pre-tokenizes s[0..n) (at_start: it begins at input offset 0) into
 * w->pieces[result]; returns the index of the list holding the pieces. */
cllm_status tk_pretok_run(const tk_pretok *p, tk_work *w, const char *s, size_t n, bool at_start, int *result);
void tk_pretok_free(tk_pretok *p);

/* Encodes one pre-token with the BPE model, appending ids to out. */
cllm_status tk_bpe_word(const cllm_tokenizer *tok, tk_work *w, const char *s, size_t n, cllm_token_buf *out);

bool tk_trie_add(tk_trie *t, const char *s, size_t n, int32_t tok_index);
void tk_trie_free(tk_trie *t);
/* Splits s[0..n) at added tokens of trie t into w->segs[level]; *n_segs. */
cllm_status tk_added_split(const cllm_tokenizer *tok, const tk_trie *t, tk_work *w, int level, const char *s, size_t n,
                           size_t *n_segs);

void tk_dec_free(tk_dec *d);

bool tk_buf_push(cllm_token_buf *b, int32_t id);

/* Reads a JSON file the way the loader does (whole file, NUL allowed,
 * jansson `flags`); optional: a missing file gives CLLM_OK and *out NULL. */
struct json_t;
cllm_status tk_json_load(struct json_t **out, const char *file, size_t flags, bool optional);
/* Builds a tokenizer from tokenizer.json (root) and tokenizer_config.json
 * (cfg, may be NULL) already in memory; `name` names it in messages. */
cllm_status tk_load_from_json(cllm_tokenizer **out, const struct json_t *root, const struct json_t *cfg,
                              const char *name);

#endif
