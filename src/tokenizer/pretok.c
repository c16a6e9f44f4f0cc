/*
 * Pre-tokenizers: split normalized text into pre-tokens (the units the BPE
 * model sees). Each step maps the list in w->pieces[cur] to the other list;
 * a Sequence chains steps. Implemented: ByteLevel (GPT-2 regex; the byte to
 * symbol mapping itself happens in the model), Split (with the five
 * delimiter behaviours of the Rust library and invert; Digits, Whitespace
 * and WhitespaceSplit are loaded as Split), Metaspace.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

#define NOMEM() CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory")

static cllm_status step_bytelevel(const tk_pretok *p, tk_work *w, const char *s, size_t n, bool at_start,
                                  tk_pieces *out) {
    if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
        w->tmp.n = 0;
        if (!tk_str_put(&w->tmp, " ", 1) || !tk_str_put(&w->tmp, s, n)) return NOMEM();
        s = w->tmp.p;
        n = w->tmp.n;
        at_start = false;
    }
    if (!p->use_regex) return tk_pieces_add(out, s, n, at_start) ? CLLM_OK : NOMEM();
    size_t i = 0;
    while (i < n) {
        size_t ms, me;
        int rc = tk_regex_find(&p->re, w, s, n, i, &ms, &me);
        if (rc < 0) return CLLM_ERR_INTERNAL;
        if (rc == 0) ms = me = n;
        if (ms > i && !tk_pieces_add(out, s + i, ms - i, at_start && i == 0)) return NOMEM();
        if (me > ms && !tk_pieces_add(out, s + ms, me - ms, at_start && ms == 0)) return NOMEM();
        if (rc == 0) break;
        if (me == ms) { /* cannot happen with the GPT-2 pattern; stay safe */
            uint32_t cp;
            me += tk_utf8_next(s + me, n - me, &cp);
            if (!tk_pieces_add(out, s + ms, me - ms, at_start && ms == 0)) return NOMEM();
        }
        i = me;
    }
    return CLLM_OK;
}

typedef struct {
    size_t a, b;
    bool match;
} span;

static cllm_status step_split(const tk_pretok *p, tk_work *w, const char *s, size_t n, bool at_start,
                              tk_pieces *out) {
    span *v = NULL;
    size_t nv = 0, cap = 0, prev = 0, i = 0;
    cllm_status st = CLLM_OK;
#define PUSH(A, B, M)                                         \
    do {                                                      \
        if (nv == cap) {                                      \
            cap = cap ? cap * 2 : 64;                         \
            span *t = realloc(v, cap * sizeof *t);            \
            if (!t) {                                         \
                st = NOMEM();                                 \
                goto done;                                    \
            }                                                 \
            v = t;                                            \
        }                                                     \
        v[nv++] = (span){(A), (B), (M) != p->invert};         \
    } while (0)
    while (i <= n) {
        size_t ms, me;
        int rc = tk_regex_find(&p->re, w, s, n, i, &ms, &me);
        if (rc < 0) {
            st = CLLM_ERR_INTERNAL;
            goto done;
        }
        if (rc == 0) break;
        if (ms > prev) PUSH(prev, ms, false);
        PUSH(ms, me, true);
        prev = me;
        if (me == ms) {
            if (me >= n) break;
            uint32_t cp;
            i = me + tk_utf8_next(s + me, n - me, &cp);
        } else {
            i = me;
        }
    }
    if (prev < n) PUSH(prev, n, false);
#undef PUSH
    /* apply the delimiter behaviour in place; "match" now means delimiter */
    size_t no = 0;
    switch (p->behavior) {
    case SPLIT_REMOVED:
        for (size_t k = 0; k < nv; k++)
            if (!v[k].match) v[no++] = v[k];
        break;
    case SPLIT_ISOLATED:
        no = nv;
        break;
    case SPLIT_MERGED_PREV: {
        bool prev_match = false;
        for (size_t k = 0; k < nv; k++) {
            if (v[k].match && !prev_match && no > 0) v[no - 1].b = v[k].b;
            else v[no++] = v[k];
            prev_match = v[k].match;
        }
        break;
    }
    case SPLIT_MERGED_NEXT: {
        /* walk backwards: a delimiter joins the piece after it */
        bool next_match = false;
        size_t top = nv;
        for (size_t k = nv; k-- > 0;) {
            bool m = v[k].match;
            if (m && !next_match && top < nv) v[top].a = v[k].a;
            else v[--top] = v[k];
            next_match = m;
        }
        memmove(v, v + top, (nv - top) * sizeof *v);
        no = nv - top;
        break;
    }
    case SPLIT_CONTIGUOUS: {
        bool prev_match = false;
        for (size_t k = 0; k < nv; k++) {
            if (v[k].match == prev_match && no > 0) v[no - 1].b = v[k].b;
            else v[no++] = v[k];
            prev_match = v[k].match;
        }
        break;
    }
    }
    for (size_t k = 0; k < no; k++)
        if (v[k].b > v[k].a && !tk_pieces_add(out, s + v[k].a, v[k].b - v[k].a, at_start && v[k].a == 0)) {
            st = NOMEM();
            goto done;
        }
done:
    free(v);
    return st;
}

static cllm_status step_metaspace(const tk_pretok *p, tk_work *w, const char *s, size_t n, bool at_start,
                                  tk_pieces *out) {
    tk_str *t = &w->tmp;
    t->n = 0;
    bool starts = n >= p->rep_len && memcmp(s, p->rep, p->rep_len) == 0;
    bool prepend = p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && at_start);
    if (!starts && n > 0 && s[0] == ' ') starts = true; /* the space becomes the replacement */
    if (prepend && !starts && !tk_str_put(t, p->rep, p->rep_len)) return NOMEM();
    for (size_t i = 0; i < n;) {
        const char *c = memchr(s + i, ' ', n - i);
        size_t e = c ? (size_t)(c - s) : n;
        if (!tk_str_put(t, s + i, e - i)) return NOMEM();
        if (!c) break;
        if (!tk_str_put(t, p->rep, p->rep_len)) return NOMEM();
        i = e + 1;
    }
    if (!p->split) return tk_pieces_add(out, t->p, t->n, at_start) ? CLLM_OK : NOMEM();
    /* split before every replacement character (MergedWithNext) */
    size_t a = 0;
    for (size_t i = p->rep_len; i + p->rep_len <= t->n; i++) {
        if (memcmp(t->p + i, p->rep, p->rep_len) != 0) continue;
        if (!tk_pieces_add(out, t->p + a, i - a, at_start && a == 0)) return NOMEM();
        a = i;
        i += p->rep_len - 1;
    }
    if (t->n > a && !tk_pieces_add(out, t->p + a, t->n - a, at_start && a == 0)) return NOMEM();
    return CLLM_OK;
}

static cllm_status run(const tk_pretok *p, tk_work *w, int *cur) {
    if (p->kind == PT_SEQ) {
        for (size_t k = 0; k < p->n_kids; k++) {
            cllm_status st = run(&p->kids[k], w, cur);
            if (st) return st;
        }
        return CLLM_OK;
    }
    tk_pieces *in = &w->pieces[*cur], *out = &w->pieces[1 - *cur];
    tk_pieces_clear(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.p + in->v[i].off;
        size_t n = in->v[i].len;
        bool at = in->v[i].at_start;
        cllm_status st;
        switch (p->kind) {
        case PT_BYTELEVEL: st = step_bytelevel(p, w, s, n, at, out); break;
        case PT_SPLIT: st = step_split(p, w, s, n, at, out); break;
        case PT_METASPACE: st = step_metaspace(p, w, s, n, at, out); break;
        default: st = CLLM_FAIL(CLLM_ERR_INTERNAL, "unknown pre-tokenizer kind"); break;
        }
        if (st) return st;
    }
    *cur = 1 - *cur;
    return CLLM_OK;
}

cllm_status tk_pretok_run(const tk_pretok *p, tk_work *w, const char *s, size_t n, bool at_start, int *result) {
    int cur = 0;
    tk_pieces_clear(&w->pieces[0]);
    if (!tk_pieces_add(&w->pieces[0], s, n, at_start)) return NOMEM();
    if (p) {
        cllm_status st = run(p, w, &cur);
        if (st) return st;
    }
    *result = cur;
    return CLLM_OK;
}

void tk_pretok_free(tk_pretok *p) {
    if (!p) return;
    for (size_t k = 0; k < p->n_kids; k++) tk_pretok_free(&p->kids[k]);
    free(p->kids);
    tk_regex_free(&p->re);
}
