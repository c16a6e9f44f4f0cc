/*
 * The BPE model: turns one pre-token into ids.
 *
 * Symbols start as single bytes (byte-level tokenizers, through the GPT-2
 * byte alphabet) or single characters (SentencePiece-style tokenizers) and
 * are merged by rank: always the lowest-ranked adjacent pair, leftmost
 * first, which is the order of both the Rust and the JavaScript Hugging Face
 * implementations. Symbols form a doubly linked list over arrays and
 * candidate pairs sit in a binary min-heap keyed by (rank, left index), with
 * stale entries skipped when popped, so a word of n symbols costs
 * O(n log n): a SentencePiece-style tokenizer without a pre-tokenizer hands
 * the whole input to the model as one word, megabytes long.
 *
 * Characters that are not in the vocabulary never merge; at the end they
 * become <0xNN> byte tokens (byte_fallback) or the unk token (consecutive
 * ones fused into one with fuse_unk), or are dropped if there is no unk.
 * Words up to TK_CACHE_KEY bytes are cached per work state. A
 * SentencePiece-style word is first cut before each U+2581 that follows
 * another character when the vocabulary allows it (tok->cut, see load.c),
 * which keeps the pieces short and cacheable and gives the same result.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

static bool ensure_syms(tk_work *w, size_t n) {
    if (n <= w->sym_cap) return true;
    size_t cap = w->sym_cap ? w->sym_cap : 256;
    while (cap < n) cap *= 2;
    int32_t *sym = realloc(w->sym, cap * sizeof *sym);
    if (sym) w->sym = sym;
    int32_t *prev = realloc(w->prev, cap * sizeof *prev);
    if (prev) w->prev = prev;
    int32_t *next = realloc(w->next, cap * sizeof *next);
    if (next) w->next = next;
    uint32_t *soff = realloc(w->soff, cap * sizeof *soff);
    if (soff) w->soff = soff;
    uint32_t *slen = realloc(w->slen, cap * sizeof *slen);
    if (slen) w->slen = slen;
    if (!sym || !prev || !next || !soff || !slen) return false;
    w->sym_cap = cap;
    return true;
}

static bool heap_push(tk_work *w, size_t *hn, tk_heap_ent e) {
    if (*hn == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 256;
        tk_heap_ent *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return false;
        w->heap = h;
        w->heap_cap = cap;
    }
    tk_heap_ent *h = w->heap;
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= e.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
    return true;
}

static tk_heap_ent heap_pop(tk_work *w, size_t *hn) {
    tk_heap_ent *h = w->heap;
    tk_heap_ent top = h[0], last = h[--(*hn)];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

/* Pushes the pair starting at symbol l (if l and its successor merge). */
static bool push_pair(const cllm_tokenizer *tok, tk_work *w, size_t *hn, int32_t l) {
    if (l < 0) return true;
    int32_t r = w->next[l];
    if (r < 0) return true;
    int32_t a = w->sym[l], b = w->sym[r];
    if (a < 0 || b < 0) return true;
    uint32_t rank;
    int32_t merged;
    if (!tk_pairmap_get(&tok->merges, a, b, &rank, &merged)) return true;
    return heap_push(w, hn, (tk_heap_ent){((uint64_t)rank << 32) | (uint32_t)l, a, b, merged});
}

/* Applies all merges to symbols 0..ns-1 (linked through prev/next). */
static bool merge_symbols(const cllm_tokenizer *tok, tk_work *w, size_t ns) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if (!push_pair(tok, w, &hn, (int32_t)i)) return false;
    while (hn) {
        tk_heap_ent e = heap_pop(w, &hn);
        int32_t l = (int32_t)(uint32_t)e.key;
        if (w->slen[l] == 0 || w->sym[l] != e.idl) continue;
        int32_t r = w->next[l];
        if (r < 0 || w->sym[r] != e.idr) continue;
        w->sym[l] = e.merged;
        w->slen[l] += w->slen[r];
        w->slen[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        if (!push_pair(tok, w, &hn, w->prev[l]) || !push_pair(tok, w, &hn, l)) return false;
    }
    return true;
}

/* Id of the whole word as one token (ignore_merges), or -1. */
static int32_t whole_word_id(const cllm_tokenizer *tok, tk_work *w, const char *s, size_t n) {
    if (!tok->byte_level) return tk_strmap_get(&tok->vocab, s, n);
    w->tmp.n = 0;
    for (size_t i = 0; i < n; i++) {
        char b[4];
        size_t k = tk_utf8_put(b, tk_byte_to_cp((uint8_t)s[i]));
        if (!tk_str_put(&w->tmp, b, k)) return -1;
    }
    return tk_strmap_get(&tok->vocab, w->tmp.p, w->tmp.n);
}

static cllm_status bpe_piece(const cllm_tokenizer *tok, tk_work *w, const char *s, size_t n, cllm_token_buf *out) {
    tk_cache_slot *slot = NULL;
    uint64_t h = 0;
    if (w->cache && n <= TK_CACHE_KEY) {
        h = tk_hash(s, n);
        slot = &w->cache[h & (TK_CACHE_SLOTS - 1)];
        if (slot->h == h && slot->klen == n && memcmp(slot->key, s, n) == 0) {
            for (size_t i = 0; i < slot->nid; i++)
                if (!tk_buf_push(out, slot->ids[i])) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            return CLLM_OK;
        }
    }
    if (!ensure_syms(w, n)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for a %zu-byte word", n);
    size_t ns = 0;
    if (tok->byte_level) {
        for (size_t i = 0; i < n; i++) {
            w->sym[i] = tok->byte_id[(uint8_t)s[i]];
            w->soff[i] = (uint32_t)i;
            w->slen[i] = 1;
        }
        ns = n;
    } else {
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = tk_utf8_next(s + i, n - i, &cp);
            w->sym[ns] = cp < 0x10000 ? tok->cp_id[cp] : tk_strmap_get(&tok->vocab, s + i, k);
            w->soff[ns] = (uint32_t)i;
            w->slen[ns] = (uint32_t)k;
            ns++;
            i += k;
        }
    }
    for (size_t i = 0; i < ns; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    if (ns > 1 && !merge_symbols(tok, w, ns)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");

    size_t start_n = out->n;
    bool last_unk = false;
    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        int32_t id = w->sym[i];
        if (id >= 0) {
            if (!tk_buf_push(out, id)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            last_unk = false;
            continue;
        }
        /* an unknown character: bytes, else unk */
        const uint8_t *b = (const uint8_t *)s + w->soff[i];
        bool all = tok->byte_fallback;
        for (uint32_t j = 0; all && j < w->slen[i]; j++) all = tok->byte_fb[b[j]] >= 0;
        if (all) {
            for (uint32_t j = 0; j < w->slen[i]; j++)
                if (!tk_buf_push(out, tok->byte_fb[b[j]])) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            last_unk = false;
        } else if (tok->model_unk >= 0 && !(tok->fuse_unk && last_unk)) {
            if (!tk_buf_push(out, tok->model_unk)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            last_unk = true;
        }
    }
    if (slot && out->n - start_n <= TK_CACHE_IDS) {
        slot->h = h;
        slot->klen = (uint8_t)n;
        slot->nid = (uint8_t)(out->n - start_n);
        memcpy(slot->key, s, n);
        /* nothing pushed (an unknown character with neither unk nor byte
         * fallback) leaves out->ids NULL: no pointer arithmetic on it */
        if (slot->nid) memcpy(slot->ids, out->ids + start_n, slot->nid * sizeof(int32_t));
    }
    return CLLM_OK;
}

cllm_status tk_bpe_word(const cllm_tokenizer *tok, tk_work *w, const char *s, size_t n, cllm_token_buf *out) {
    if (n == 0) return CLLM_OK;
    if (n >= UINT32_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "a pre-token of %zu bytes is too long (limit 4 GiB)", n);
    if (tok->ignore_merges) {
        int32_t id = whole_word_id(tok, w, s, n);
        if (id >= 0) return tk_buf_push(out, id) ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    size_t cl = tok->cut_len;
    if (tok->byte_level || cl == 0) return bpe_piece(tok, w, s, n, out);
    size_t a = 0;
    for (size_t i = 1; i + cl <= n;) {
        const char *c = memchr(s + i, (unsigned char)tok->cut[0], n - i);
        if (!c) break;
        size_t p = (size_t)(c - s);
        if (p + cl > n) break;
        if (memcmp(c, tok->cut, cl) != 0) {
            i = p + 1;
            continue;
        }
        if (p > a && !(p >= cl && memcmp(s + p - cl, tok->cut, cl) == 0)) {
            cllm_status st = bpe_piece(tok, w, s + a, p - a, out);
            if (st) return st;
            a = p;
        }
        i = p + cl;
    }
    return bpe_piece(tok, w, s + a, n - a, out);
}
