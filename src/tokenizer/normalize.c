/*
 * Normalizers: Sequence, Prepend, Replace (literal or PCRE2 regex), Strip,
 * the Unicode normal forms NFC/NFD/NFKC/NFKD and Lowercase, each a function
 * from a string to a new string. Normal forms and lowercasing use
 * libunistring's tables (u8_normalize, u8_tolower with Unicode's full,
 * context-sensitive mappings such as final sigma), the same Unicode data HF's
 * tokenizers apply. Offsets back into the original text are not tracked:
 * encode needs only the ids. Input reaching here is valid UTF-8 (encode
 * replaces invalid bytes first).
 */
#include <stdlib.h>
#include <string.h>
#include <unicase.h>
#include <uninorm.h>

#include "tokenizer/tok_impl.h"

static const char *find_lit(const char *s, size_t n, const char *p, size_t pn) {
    if (pn == 0 || pn > n) return NULL;
    const char *end = s + n - pn + 1;
    while (s < end) {
        const char *c = memchr(s, (unsigned char)p[0], (size_t)(end - s));
        if (!c) return NULL;
        if (memcmp(c, p, pn) == 0) return c;
        s = c + 1;
    }
    return NULL;
}

static cllm_status replace(const tk_norm *nm, tk_work *w, const char *s, size_t n, tk_str *out) {
    size_t i = 0;
    while (i <= n) {
        size_t ms, me;
        if (nm->use_re) {
            int rc = tk_regex_find(&nm->re, w, s, n, i, &ms, &me);
            if (rc < 0) return CLLM_ERR_INTERNAL;
            if (rc == 0) break;
            if (me == ms) { /* an empty match replaces nothing; step one character */
                if (ms >= n) break;
                uint32_t cp;
                size_t k = tk_utf8_next(s + ms, n - ms, &cp);
                if (!tk_str_put(out, s + i, ms + k - i)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                i = ms + k;
                continue;
            }
        } else {
            const char *c = find_lit(s + i, n - i, nm->a, nm->a_len);
            if (!c) break;
            ms = (size_t)(c - s);
            me = ms + nm->a_len;
        }
        if (!tk_str_put(out, s + i, ms - i) || !tk_str_put(out, nm->b, nm->b_len))
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        i = me;
    }
    if (i < n && !tk_str_put(out, s + i, n - i)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

cllm_status tk_norm_apply(const tk_norm *nm, tk_work *w, const char *s, size_t n, tk_str *out) {
    out->n = 0;
    if (!tk_str_reserve(out, n)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    out->p[0] = 0;
    switch (nm->kind) {
    case NORM_PREPEND:
        if (n && !tk_str_put(out, nm->a, nm->a_len)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        if (!tk_str_put(out, s, n)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        return CLLM_OK;
    case NORM_REPLACE:
        return replace(nm, w, s, n, out);
    case NORM_STRIP: {
        size_t a = nm->strip_left ? tk_space_prefix(s, n) : 0;
        size_t b = nm->strip_right ? tk_space_suffix(s + a, n - a) : 0;
        return tk_str_put(out, s + a, n - a - b) ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    case NORM_UNICODE:
    case NORM_LOWERCASE: {
        uninorm_t form = nm->form == FORM_NFC ? UNINORM_NFC : nm->form == FORM_NFD ? UNINORM_NFD
                         : nm->form == FORM_NFKC ? UNINORM_NFKC : UNINORM_NFKD;
        size_t len = 0;
        uint8_t *r = nm->kind == NORM_UNICODE ? u8_normalize(form, (const uint8_t *)s, n, NULL, &len)
                                              : u8_tolower((const uint8_t *)s, n, NULL, NULL, NULL, &len);
        if (!r && n) return CLLM_FAIL(CLLM_ERR_FORMAT, "Unicode normalization failed (invalid UTF-8?)");
        bool ok = tk_str_put(out, (const char *)r, len);
        free(r);
        return ok ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    case NORM_SEQ: {
        tk_str tmp = {0};
        cllm_status st = CLLM_OK;
        if (!tk_str_put(out, s, n)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        for (size_t k = 0; k < nm->n_kids && st == CLLM_OK; k++) {
            st = tk_norm_apply(&nm->kids[k], w, out->p, out->n, &tmp);
            if (st == CLLM_OK) {
                tk_str t = *out;
                *out = tmp;
                tmp = t;
            }
        }
        tk_str_free(&tmp);
        return st;
    }
    }
    return CLLM_FAIL(CLLM_ERR_INTERNAL, "unknown normalizer kind");
}

void tk_norm_free(tk_norm *nm) {
    if (!nm) return;
    for (size_t k = 0; k < nm->n_kids; k++) tk_norm_free(&nm->kids[k]);
    free(nm->kids);
    free(nm->a);
    free(nm->b);
    tk_regex_free(&nm->re);
}
