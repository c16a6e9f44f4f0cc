/*
 * Decoding: ids -> token strings -> the decoder chain -> text. Each decoder
 * maps a list of strings to a list of strings, as in the Hugging Face
 * libraries; the result is their concatenation. Byte-level and
 * byte-fallback decoders rebuild raw bytes and repair invalid UTF-8 (see
 * the header for the exact rules).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

#define NOMEM() CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory while decoding")

static const char *piece(const tk_pieces *l, size_t i) { return l->buf.p + l->v[i].off; }

/* Appends bytes b[0..n) to out as text, each maximal invalid UTF-8
 * subsequence becoming U+FFFD. */
static bool flush_bytes(tk_str *out, tk_str *bytes) {
    bool ok = tk_utf8_lossy(out, bytes->p ? bytes->p : "", bytes->n);
    bytes->n = 0;
    return ok;
}

static cllm_status dec_bytelevel(const tk_pieces *in, tk_pieces *out) {
    tk_str text = {0}, bytes = {0};
    cllm_status st = CLLM_OK;
    for (size_t i = 0; i < in->n && st == CLLM_OK; i++) {
        const char *s = piece(in, i);
        size_t n = in->v[i].len;
        if (in->v[i].at_start) { /* an added token: verbatim */
            if (!flush_bytes(&text, &bytes) || !tk_str_put(&text, s, n)) st = NOMEM();
            continue;
        }
        size_t mark = bytes.n;
        bool all = true;
        for (size_t j = 0; j < n && all;) {
            uint32_t cp;
            j += tk_utf8_next(s + j, n - j, &cp);
            int b = tk_cp_to_byte(cp);
            if (b < 0) all = false;
            else {
                unsigned char c = (unsigned char)b;
                if (!tk_str_put(&bytes, &c, 1)) st = NOMEM();
            }
        }
        if (!all) { /* a character outside the byte alphabet: keep the token's own bytes */
            bytes.n = mark;
            if (!tk_str_put(&bytes, s, n)) st = NOMEM();
        }
    }
    if (st == CLLM_OK && !flush_bytes(&text, &bytes)) st = NOMEM();
    if (st == CLLM_OK && !tk_pieces_add(out, text.p ? text.p : "", text.n, false)) st = NOMEM();
    tk_str_free(&text);
    tk_str_free(&bytes);
    return st;
}

static bool byte_token(const char *s, size_t n, unsigned char *b) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    unsigned v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                            : 16u;
        if (d > 15) return false;
        v = v * 16 + d;
    }
    *b = (unsigned char)v;
    return true;
}

/* Runs of <0xNN> tokens become their bytes if those are valid UTF-8, else
 * one U+FFFD per byte token (the Rust library's rule). */
static cllm_status dec_bytefallback(const tk_pieces *in, tk_pieces *out) {
    tk_str bytes = {0};
    cllm_status st = CLLM_OK;
    for (size_t i = 0; i <= in->n && st == CLLM_OK; i++) {
        unsigned char b;
        if (i < in->n && byte_token(piece(in, i), in->v[i].len, &b)) {
            if (!tk_str_put(&bytes, &b, 1)) st = NOMEM();
            continue;
        }
        if (bytes.n) {
            if (tk_utf8_valid_prefix(bytes.p, bytes.n) == bytes.n) {
                if (!tk_pieces_add(out, bytes.p, bytes.n, false)) st = NOMEM();
            } else {
                for (size_t k = 0; k < bytes.n && st == CLLM_OK; k++)
                    if (!tk_pieces_add(out, "\xEF\xBF\xBD", 3, false)) st = NOMEM();
            }
            bytes.n = 0;
        }
        if (i < in->n && st == CLLM_OK && !tk_pieces_add(out, piece(in, i), in->v[i].len, in->v[i].at_start))
            st = NOMEM();
    }
    tk_str_free(&bytes);
    return st;
}

static cllm_status dec_replace(const tk_dec *d, const tk_pieces *in, tk_pieces *out, tk_str *tmp) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = piece(in, i);
        size_t n = in->v[i].len;
        tmp->n = 0;
        for (size_t j = 0; j < n;) {
            if (d->a_len && j + d->a_len <= n && memcmp(s + j, d->a, d->a_len) == 0) {
                if (!tk_str_put(tmp, d->b, d->b_len)) return NOMEM();
                j += d->a_len;
            } else {
                if (!tk_str_put(tmp, s + j, 1)) return NOMEM();
                j++;
            }
        }
        if (!tk_pieces_add(out, tmp->p ? tmp->p : "", tmp->n, in->v[i].at_start)) return NOMEM();
    }
    return CLLM_OK;
}

static cllm_status dec_strip(const tk_dec *d, const tk_pieces *in, tk_pieces *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = piece(in, i);
        size_t a = 0, b = in->v[i].len;
        for (size_t k = 0; k < d->start && b - a >= d->a_len && memcmp(s + a, d->a, d->a_len) == 0; k++) a += d->a_len;
        for (size_t k = 0; k < d->stop && b - a >= d->a_len && memcmp(s + b - d->a_len, d->a, d->a_len) == 0; k++)
            b -= d->a_len;
        if (!tk_pieces_add(out, s + a, b - a, in->v[i].at_start)) return NOMEM();
    }
    return CLLM_OK;
}

/* Metaspace: the replacement becomes a space, except in the first token
 * where it is dropped (unless prepend_scheme is "never"). */
static cllm_status dec_metaspace(const tk_dec *d, const tk_pieces *in, tk_pieces *out, tk_str *tmp) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = piece(in, i);
        size_t n = in->v[i].len;
        tmp->n = 0;
        for (size_t j = 0; j < n;) {
            if (j + d->rep_len <= n && memcmp(s + j, d->rep, d->rep_len) == 0) {
                if (!(i == 0 && d->strip_first) && !tk_str_put(tmp, " ", 1)) return NOMEM();
                j += d->rep_len;
            } else {
                if (!tk_str_put(tmp, s + j, 1)) return NOMEM();
                j++;
            }
        }
        if (!tk_pieces_add(out, tmp->p ? tmp->p : "", tmp->n, in->v[i].at_start)) return NOMEM();
    }
    return CLLM_OK;
}

static cllm_status dec_fuse(const tk_pieces *in, tk_pieces *out) {
    if (!tk_pieces_add(out, "", 0, false)) return NOMEM();
    for (size_t i = 0; i < in->n; i++)
        if (!tk_str_put(&out->buf, piece(in, i), in->v[i].len)) return NOMEM();
    out->v[0].len = out->buf.n;
    return CLLM_OK;
}

/* Runs decoder d from lists[*cur] into the other list; flips *cur. */
static cllm_status run(const tk_dec *d, tk_pieces lists[2], int *cur, tk_str *tmp) {
    if (d->kind == DEC_SEQ) {
        for (size_t k = 0; k < d->n_kids; k++) {
            cllm_status st = run(&d->kids[k], lists, cur, tmp);
            if (st) return st;
        }
        return CLLM_OK;
    }
    tk_pieces *in = &lists[*cur], *out = &lists[1 - *cur];
    tk_pieces_clear(out);
    cllm_status st;
    switch (d->kind) {
    case DEC_BYTELEVEL: st = dec_bytelevel(in, out); break;
    case DEC_BYTEFALLBACK: st = dec_bytefallback(in, out); break;
    case DEC_REPLACE: st = dec_replace(d, in, out, tmp); break;
    case DEC_STRIP: st = dec_strip(d, in, out); break;
    case DEC_METASPACE: st = dec_metaspace(d, in, out, tmp); break;
    case DEC_FUSE: st = dec_fuse(in, out); break;
    default: st = CLLM_FAIL(CLLM_ERR_INTERNAL, "unknown decoder kind"); break;
    }
    if (st == CLLM_OK) *cur = 1 - *cur;
    return st;
}

void tk_dec_free(tk_dec *d) {
    if (!d) return;
    for (size_t k = 0; k < d->n_kids; k++) tk_dec_free(&d->kids[k]);
    free(d->kids);
    free(d->a);
    free(d->b);
}

cllm_status cllm_tokenizer_decode(const cllm_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                                  char **text, size_t *len) {
    if (!tok || !text || !len || (!ids && n)) return CLLM_FAIL(CLLM_ERR_ARG, "tok, ids, text and len must not be NULL");
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_ids || tok->tok_off[ids[i]] == UINT32_MAX)
            return CLLM_FAIL(CLLM_ERR_ARG, "token id %d at position %zu is not in the vocabulary (size %d)", ids[i], i,
                             tok->n_ids);
    tk_pieces lists[2] = {{{0}, 0, 0, 0}, {{0}, 0, 0, 0}};
    tk_str tmp = {0}, res = {0};
    int cur = 0;
    cllm_status st = CLLM_OK;
    for (size_t i = 0; i < n && st == CLLM_OK; i++) {
        uint8_t f = tok->tok_flags[ids[i]];
        if (skip_special && (f & TK_F_SPECIAL)) continue;
        if (!tk_pieces_add(&lists[0], tok->tok_arena.p + tok->tok_off[ids[i]], tok->tok_len[ids[i]],
                           (f & TK_F_ADDED) != 0))
            st = NOMEM();
    }
    if (st == CLLM_OK && tok->dec) st = run(tok->dec, lists, &cur, &tmp);
    for (size_t i = 0; st == CLLM_OK && i < lists[cur].n; i++) {
        if (!tok->dec && i > 0 && !tk_str_put(&res, " ", 1)) st = NOMEM();
        if (st == CLLM_OK && !tk_str_put(&res, piece(&lists[cur], i), lists[cur].v[i].len)) st = NOMEM();
    }
    if (st == CLLM_OK && !res.p && !tk_str_put(&res, "", 0)) st = NOMEM();
    tk_pieces_free(&lists[0]);
    tk_pieces_free(&lists[1]);
    tk_str_free(&tmp);
    if (st) {
        tk_str_free(&res);
        return st;
    }
    *text = res.p;
    *len = res.n;
    return CLLM_OK;
}
