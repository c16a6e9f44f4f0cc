/*
 * Incremental detokenization for streaming generated text.
 *
 * Decoding token by token and concatenating is wrong twice over: byte-level
 * tokens may end in the middle of a UTF-8 character (the decoder then
 * yields U+FFFD for the fragment), and decoders such as Metaspace drop the
 * space at the start of a text, which would glue the first word of every
 * token to the previous one. So the stream keeps a window
 *   [anchor, pending tokens...]
 * where the anchor is the last token already printed in full (the last
 * context token at the start). Each push decodes the window, skips the
 * bytes of decode([anchor]) and whatever of the pending text was already
 * returned, and returns the rest up to the last complete character; a
 * trailing U+FFFD or truncated sequence is held back, because the next
 * token may complete it. When nothing is held back, the window collapses to
 * [newest token] (when that token's text alone is whole characters), so
 * each push decodes only a few tokens.
 *
 * Left out: text that a later token rewrites before the hold-back point
 * (no decoder in tokenizer.h does that), skipping the anchor's own text
 * when a decoder changes it in context (Strip with a count).
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/generate.h"

struct cllm_text_stream {
    const cllm_tokenizer *tok;
    int32_t *win;  /* [anchor?, pending...] */
    size_t n, cap;
    size_t base;   /* bytes of decode(anchor) */
    size_t done;   /* bytes of the window's text already returned, after base */
    char *text;    /* last decode (returned pointers point into it) */
    size_t tlen;   /* its length */
};

static cllm_status push_id(cllm_text_stream *ts, int32_t id) {
    if (ts->n == ts->cap) {
        size_t cap = ts->cap ? 2 * ts->cap : 16;
        int32_t *w = realloc(ts->win, cap * sizeof *w);
        if (!w) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        ts->win = w;
        ts->cap = cap;
    }
    ts->win[ts->n++] = id;
    return CLLM_OK;
}

static size_t complete_prefix(const char *s, size_t n);

/* Makes [anchor] the window if the anchor's own text ends with a whole
 * character; otherwise leaves the window alone (keep_else) or empties it.
 * An anchor ending inside a character would break the prefix property: the
 * next token could complete that character, and decode([anchor]) would no
 * longer be a prefix of the window's text. */
static cllm_status set_anchor(cllm_text_stream *ts, int32_t anchor, bool keep_else) {
    char *t = NULL;
    size_t len = 0;
    cllm_status st = cllm_tokenizer_decode(ts->tok, &anchor, 1, true, &t, &len);
    bool ok = !st && complete_prefix(t, len) == len;
    free(t);
    if (st) return st;
    if (!ok && keep_else) return CLLM_OK;
    ts->n = 0;
    ts->base = ts->done = ts->tlen = 0;
    if (!ok) return CLLM_OK;
    ts->base = ts->tlen = len;
    return push_id(ts, anchor);
}

cllm_status cllm_text_stream_init(cllm_text_stream **out, const cllm_tokenizer *tok, const int32_t *context,
                                  size_t n_context) {
    *out = NULL;
    cllm_text_stream *ts = calloc(1, sizeof *ts);
    if (!ts) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    ts->tok = tok;
    cllm_status st = n_context ? set_anchor(ts, context[n_context - 1], false) : CLLM_OK;
    if (st) {
        cllm_text_stream_free(ts);
        return st;
    }
    *out = ts;
    return CLLM_OK;
}

void cllm_text_stream_free(cllm_text_stream *ts) {
    if (!ts) return;
    free(ts->win);
    free(ts->text);
    free(ts);
}

/* Length of the longest prefix of s[0..n) that does not end inside a
 * character: a trailing U+FFFD (EF BF BD) or a lead byte whose
 * continuation bytes have not all arrived is cut off. */
static size_t complete_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (;;) {
        if (n >= 3 && u[n - 3] == 0xEF && u[n - 2] == 0xBF && u[n - 1] == 0xBD) {
            n -= 3;
            continue;
        }
        /* find the start of the last character (at most 3 continuation bytes back) */
        size_t i = n, k = 0;
        while (i > 0 && k < 4 && (u[i - 1] & 0xC0) == 0x80) {
            i--;
            k++;
        }
        if (i == 0) return n;
        unsigned char lead = u[i - 1];
        size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        return (k + 1 < need) ? i - 1 : n;
    }
}

static cllm_status emit(cllm_text_stream *ts, bool final, const char **text, size_t *len) {
    char *t = NULL;
    size_t tlen = 0;
    *text = "";
    *len = 0;
    cllm_status st = cllm_tokenizer_decode(ts->tok, ts->win, ts->n, true, &t, &tlen);
    if (st) return st;
    free(ts->text);
    ts->text = t;
    ts->tlen = tlen;
    size_t start = ts->base + ts->done;
    if (tlen <= start) return CLLM_OK;
    size_t end = final ? tlen : ts->base + complete_prefix(t + ts->base, tlen - ts->base);
    if (end < start) end = start;
    *text = t + start;
    *len = end - start;
    ts->done = end - ts->base;
    return CLLM_OK;
}

cllm_status cllm_text_stream_push(cllm_text_stream *ts, int32_t id, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    cllm_status st = push_id(ts, id);
    if (st) return st;
    st = emit(ts, false, text, len);
    if (st) {
        ts->n--; /* forget the id the tokenizer refused */
        return st;
    }
    /* Everything returned: collapse the window onto the newest token. The
     * returned bytes live in ts->text, which set_anchor does not touch. */
    if (ts->base + ts->done >= ts->tlen) st = set_anchor(ts, id, true);
    return st;
}

cllm_status cllm_text_stream_finish(cllm_text_stream *ts, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (ts->base + ts->done >= ts->tlen) return CLLM_OK;
    cllm_status st = emit(ts, true, text, len);
    if (!st && ts->n) st = set_anchor(ts, ts->win[ts->n - 1], true);
    return st;
}
