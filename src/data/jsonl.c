/*
 * Pre-tokenized JSONL samples ({"input_ids": [...], "labels": [...]}).
 * The file is read line by line with getline, so a line number is always at
 * hand for messages; ids go into one growing int32 buffer.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/data.h"

struct cllm_dataset {
    int32_t *tokens, *labels; /* labels NULL when no sample has labels */
    size_t n_tokens, cap_tokens;
    size_t *offsets; /* n + 1 */
    size_t n, cap;
    unsigned char *has_labels; /* per sample */
};

void cllm_dataset_free(cllm_dataset *d) {
    if (!d) return;
    free(d->tokens);
    free(d->labels);
    free(d->offsets);
    free(d->has_labels);
    free(d);
}

size_t cllm_dataset_count(const cllm_dataset *d) { return d->n; }
size_t cllm_dataset_tokens(const cllm_dataset *d) { return d->n_tokens; }

static cllm_status grow(cllm_dataset *d, size_t extra) {
    if (d->n_tokens + extra > d->cap_tokens) {
        size_t cap = d->cap_tokens ? d->cap_tokens : 4096;
        while (cap < d->n_tokens + extra) cap *= 2;
        int32_t *t = realloc(d->tokens, cap * sizeof *t);
        if (!t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading samples");
        d->tokens = t;
        int32_t *l = realloc(d->labels, cap * sizeof *l);
        if (!l) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading samples");
        d->labels = l;
        d->cap_tokens = cap;
    }
    if (d->n + 2 > d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 1024;
        size_t *o = realloc(d->offsets, cap * sizeof *o);
        if (!o) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading samples");
        d->offsets = o;
        unsigned char *h = realloc(d->has_labels, cap);
        if (!h) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading samples");
        d->has_labels = h;
        d->cap = cap;
    }
    return CLLM_OK;
}

/* Parses one record; on error, the message names path:line and the field. */
static cllm_status parse_record(cllm_dataset *d, const char *text, size_t len, const char *path, size_t line,
                                int vocab) {
    json_error_t err;
    json_t *j = json_loadb(text, len, 0, &err);
    if (!j) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu:%d: %s", path, line, err.column, err.text);
    cllm_status st = CLLM_OK;
    const json_t *ids = json_object_get(j, "input_ids"), *labels = json_object_get(j, "labels");
    if (!json_is_object(j)) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: a sample must be a JSON object", path, line);
        goto done;
    }
    if (!ids) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: missing field \"input_ids\"", path, line);
        goto done;
    }
    if (!json_is_array(ids) || json_array_size(ids) == 0) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: \"input_ids\" must be a non-empty array of token ids", path, line);
        goto done;
    }
    size_t n = json_array_size(ids);
    if (labels && !json_is_null(labels) && (!json_is_array(labels) || json_array_size(labels) != n)) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: \"labels\" must be an array as long as \"input_ids\" (%zu)", path,
                       line, n);
        goto done;
    }
    if ((st = grow(d, n))) goto done;
    bool with_labels = labels && !json_is_null(labels);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(ids, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || id < 0 || id >= vocab) {
            if (json_is_integer(v))
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: input_ids[%zu] = %lld is outside the vocabulary [0, %d)", path,
                               line, i, (long long)id, vocab);
            else
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: input_ids[%zu] is not an integer", path, line, i);
            goto done;
        }
        d->tokens[d->n_tokens + i] = (int32_t)id;
        int32_t y = (int32_t)id;
        if (with_labels) {
            const json_t *lv = json_array_get(labels, i);
            json_int_t l = json_is_integer(lv) ? json_integer_value(lv) : -2;
            if (!json_is_integer(lv) || (l != -100 && (l < 0 || l >= vocab))) {
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%zu: labels[%zu] must be -100 or a token id in [0, %d)", path, line,
                               i, vocab);
                goto done;
            }
            y = (int32_t)l;
        }
        d->labels[d->n_tokens + i] = y;
    }
    d->offsets[d->n] = d->n_tokens;
    d->has_labels[d->n] = with_labels;
    d->n_tokens += n;
    d->n++;
    d->offsets[d->n] = d->n_tokens;
done:
    json_decref(j);
    return st;
}

cllm_status cllm_dataset_load_jsonl(cllm_dataset **out, const char *path, int vocab_size) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return CLLM_FAIL(CLLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    cllm_dataset *d = calloc(1, sizeof *d);
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    cllm_status st = d ? grow(d, 0) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    ssize_t len;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ' || line[k - 1] == '\t')) k--;
        size_t s = 0;
        while (s < k && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == k) continue;
        st = parse_record(d, line + s, k - s, path, lineno, vocab_size);
    }
    if (!st && ferror(f)) st = CLLM_FAIL(CLLM_ERR_IO, "error reading %s: %s", path, strerror(errno));
    if (!st && d->n == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no samples", path);
    free(line);
    fclose(f);
    if (st) {
        cllm_dataset_free(d);
        return st;
    }
    *out = d;
    return CLLM_OK;
}

void cllm_dataset_fill_row(const cllm_dataset *d, size_t i, int T, int32_t pad_id, int32_t *tokens, int32_t *labels) {
    size_t b = d->offsets[i], n = d->offsets[i + 1] - b;
    for (int t = 0; t < T; t++) {
        if ((size_t)t < n) {
            tokens[t] = d->tokens[b + t];
            labels[t] = d->labels[b + t];
        } else {
            tokens[t] = pad_id;
            labels[t] = -100;
        }
    }
}
