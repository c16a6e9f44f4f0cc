/*
 * The in-memory sample store (tokens, labels, offsets), record -> tokens
 * glue shared by the loader and prepare, and Megatron's split rule.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"

cllm_status cllm_fail_at(cllm_status st, const char *file, uint64_t line, uint64_t col, const char *fmt, ...) {
    char where[1100], msg[1024];
    snprintf(where, sizeof where, "%s:%llu:%llu", file ? file : "<record>", (unsigned long long)line,
             (unsigned long long)col);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cllm_fail(st, where, "%s", msg);
}

cllm_status cllm_fail_again(cllm_status st, const char *msg, const char *file, const char *suffix) {
    /* msg is "FILE:LINE:COL: text"; split it back into location and text. */
    size_t fl = strlen(file), i = fl + 1;
    int colons = 0;
    if (!strncmp(msg, file, fl) && msg[fl] == ':')
        for (; msg[i] && colons < 2; i++) {
            if (msg[i] == ':') colons++;
            else if (msg[i] < '0' || msg[i] > '9') break;
        }
    if (colons == 2 && msg[i] == ' ') {
        char where[1100];
        snprintf(where, sizeof where, "%.*s", (int)(i - 1), msg);
        return cllm_fail(st, where, "%s%s", msg + i + 1, suffix);
    }
    return cllm_fail(st, "data", "%s%s", msg, suffix);
}

void cllm_store_free(cllm_store *s) {
    if (!s) return;
    free(s->tokens);
    free(s->labels);
    free(s->offsets);
    memset(s, 0, sizeof *s);
}

cllm_status cllm_store_append(cllm_store *s, const int32_t *tokens, const int32_t *labels, size_t n) {
    if (s->n_tokens + n > s->cap_tokens) {
        size_t cap = s->cap_tokens ? s->cap_tokens : 4096;
        while (cap < s->n_tokens + n) cap *= 2;
        int32_t *t = realloc(s->tokens, cap * sizeof *t);
        if (t) s->tokens = t;
        int32_t *l = t ? realloc(s->labels, cap * sizeof *l) : NULL;
        if (l) s->labels = l;
        if (!t || !l) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory holding %zu tokens", s->n_tokens + n);
        s->cap_tokens = cap;
    }
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        uint64_t *o = realloc(s->offsets, cap * sizeof *o);
        if (!o) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory holding samples");
        s->offsets = o;
        s->cap = cap;
        if (s->n == 0) s->offsets[0] = 0;
    }
    if (n) {
        memcpy(s->tokens + s->n_tokens, tokens, n * sizeof *tokens);
        memcpy(s->labels + s->n_tokens, labels, n * sizeof *labels);
    }
    s->n_tokens += n;
    s->offsets[++s->n] = s->n_tokens;
    return CLLM_OK;
}

cllm_status cllm_record_encode(const cllm_encoder *e, const cllm_record *rec, cllm_sample *scratch,
                               cllm_token_buf *ids, cllm_token_buf *labels, cllm_sample_type *type) {
    cllm_status st;
    if (rec->kind == CLLM_REC_TEXT)
        st = cllm_sample_from_text(scratch, rec->text, rec->len, e->tmpl);
    else
        st = cllm_sample_parse(scratch, rec->text, rec->len, &rec->loc, e->tmpl, e->vocab_size);
    if (st) return st;
    if (type) *type = scratch->type;
    return cllm_sample_encode(scratch, e->tok, e->tmpl, e->vocab_size, &rec->loc, ids, labels);
}

cllm_status cllm_split_parse(const char *s, double w[3]) {
    w[0] = w[1] = w[2] = 0;
    if (!s || !*s) return CLLM_FAIL(CLLM_ERR_ARG, "empty split (expected e.g. \"950,30,20\")");
    char buf[256];
    if (strlen(s) >= sizeof buf) return CLLM_FAIL(CLLM_ERR_ARG, "split \"%s\" is too long", s);
    strcpy(buf, s);
    int k = 0;
    double sum = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",/", &save); tok; tok = strtok_r(NULL, ",/", &save)) {
        double v;
        if (k == 3 || !cllm_parse_f64(tok, &v) || !(v >= 0) || !isfinite(v))
            return CLLM_FAIL(CLLM_ERR_ARG, "bad split \"%s\": expected up to 3 non-negative numbers such as 950,30,20",
                             s);
        w[k++] = v;
        sum += v;
    }
    if (!(sum > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "bad split \"%s\": the weights sum to zero", s);
    for (int i = 0; i < 3; i++) w[i] /= sum;
    return CLLM_OK;
}

void cllm_split_bounds(const double w[3], uint64_t n, uint64_t bounds[4]) {
    /* Megatron: cumulative round(w * n) (round half to even, as Python's
     * round()), then every bound shifted so the last one is exactly n. */
    int64_t b[4] = {0, 0, 0, 0};
    for (int i = 0; i < 3; i++) b[i + 1] = b[i] + (int64_t)nearbyint(w[i] * (double)n);
    int64_t diff = b[3] - (int64_t)n;
    for (int i = 1; i < 4; i++) b[i] -= diff;
    for (int i = 0; i < 4; i++) bounds[i] = b[i] < 0 ? 0 : (uint64_t)b[i];
    for (int i = 1; i < 4; i++)
        if (bounds[i] < bounds[i - 1]) bounds[i] = bounds[i - 1];
}

int cllm_split_index(const char *name) {
    if (!strcmp(name, "train")) return 0;
    if (!strcmp(name, "valid") || !strcmp(name, "validation") || !strcmp(name, "val")) return 1;
    if (!strcmp(name, "test")) return 2;
    return -1;
}
