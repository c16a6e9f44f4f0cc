/*
 * Added tokens: a byte trie over their contents and the splitter that cuts
 * text into plain-text segments and added-token segments. Matching is
 * greedy, leftmost then longest (the rule of Hugging Face's Aho-Corasick
 * LeftmostLongest and of transformers.js' DictionarySplitter). Because
 * contents are valid UTF-8 and the text is too, byte matches fall on
 * character boundaries.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

static int32_t trie_node(tk_trie *t) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        int32_t *c = realloc(t->child, cap * sizeof *c);
        if (c) t->child = c;
        int32_t *s = realloc(t->sibling, cap * sizeof *s);
        if (s) t->sibling = s;
        uint8_t *b = realloc(t->byte, cap);
        if (b) t->byte = b;
        int32_t *k = realloc(t->tok, cap * sizeof *k);
        if (k) t->tok = k;
        if (!c || !s || !b || !k) return -1;
        t->cap = cap;
    }
    t->child[t->n] = t->sibling[t->n] = t->tok[t->n] = -1;
    t->byte[t->n] = 0;
    return (int32_t)t->n++;
}

static int32_t trie_child(const tk_trie *t, int32_t node, uint8_t b) {
    for (int32_t c = t->child[node]; c >= 0; c = t->sibling[c])
        if (t->byte[c] == b) return c;
    return -1;
}

bool tk_trie_add(tk_trie *t, const char *s, size_t n, int32_t tok_index) {
    if (n == 0) return true;
    if (t->n == 0 && trie_node(t) < 0) return false;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = trie_child(t, node, b);
        if (c < 0) {
            c = trie_node(t);
            if (c < 0) return false;
            t->byte[c] = b;
            t->sibling[c] = t->child[node];
            t->child[node] = c;
        }
        node = c;
    }
    if (t->tok[node] < 0) t->tok[node] = tok_index; /* first definition wins */
    t->first[(uint8_t)s[0]] = true;
    return true;
}

void tk_trie_free(tk_trie *t) {
    free(t->child);
    free(t->sibling);
    free(t->byte);
    free(t->tok);
    memset(t, 0, sizeof *t);
}

/* An approximation of \w for single_word: letters, digits, '_' and any
 * non-ASCII character that is not whitespace or common punctuation. */
static bool word_char(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == '_';
    if (tk_is_space(cp)) return false;
    if ((cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFF00 && cp <= 0xFF0F)) return false;
    return !(cp >= 0xA1 && cp <= 0xBF);
}

static bool word_before(const char *s, size_t at) {
    if (at == 0) return false;
    size_t st = at - 1;
    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
    uint32_t cp;
    tk_utf8_next(s + st, at - st, &cp);
    return word_char(cp);
}

static bool word_after(const char *s, size_t n, size_t at) {
    if (at >= n) return false;
    uint32_t cp;
    tk_utf8_next(s + at, n - at, &cp);
    return word_char(cp);
}

static bool seg_push(tk_work *w, int level, size_t *nseg, size_t off, size_t len, int32_t id) {
    if (*nseg == w->segs_cap[level]) {
        size_t cap = w->segs_cap[level] ? w->segs_cap[level] * 2 : 64;
        tk_seg *v = realloc(w->segs[level], cap * sizeof *v);
        if (!v) return false;
        w->segs[level] = v;
        w->segs_cap[level] = cap;
    }
    w->segs[level][(*nseg)++] = (tk_seg){off, len, id};
    return true;
}

cllm_status tk_added_split(const cllm_tokenizer *tok, const tk_trie *t, tk_work *w, int level, const char *s, size_t n,
                           size_t *n_segs) {
    size_t ns = 0, done = 0, i = 0;
    if (t->n > 0) {
        while (i < n) {
            if (!t->first[(uint8_t)s[i]]) {
                i++;
                continue;
            }
            int32_t node = 0, best = -1;
            size_t best_end = 0;
            for (size_t j = i; j < n; j++) {
                node = trie_child(t, node, (uint8_t)s[j]);
                if (node < 0) break;
                if (t->tok[node] >= 0) {
                    best = t->tok[node];
                    best_end = j + 1;
                }
            }
            if (best < 0) {
                i++;
                continue;
            }
            const tk_added *a = &tok->added[best];
            size_t ms = i, me = best_end;
            if (a->single_word && (word_before(s, ms) || word_after(s, n, me))) {
                i = me; /* matches do not overlap: resume after this one */
                continue;
            }
            if (a->lstrip) ms -= tk_space_suffix(s + done, ms - done);
            if (a->rstrip) me += tk_space_prefix(s + me, n - me);
            if (ms > done && !seg_push(w, level, &ns, done, ms - done, -1))
                return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            if (!seg_push(w, level, &ns, ms, me - ms, a->id)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            done = i = me;
        }
    }
    if (n > done && !seg_push(w, level, &ns, done, n - done, -1)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    *n_segs = ns;
    return CLLM_OK;
}
