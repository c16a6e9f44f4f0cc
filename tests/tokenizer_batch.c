/*
 * tokenizer_batch: the library side of the oracle test. Loads one
 * tokenizer, reads a JSON array of strings and writes, for each, the same
 * record as tests/tokenizer_oracle_batch.mjs: ids with and without special
 * tokens and three decodings. One process per model keeps the test fast;
 * the `cllm tokenize`/`detokenize` commands are checked separately on a
 * subset of the samples.
 * Usage: tokenizer_batch <model dir> <samples.json> <out.json>
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cllm/tokenizer.h"

static json_t *id_array(const cllm_token_buf *b) {
    json_t *a = json_array();
    for (size_t i = 0; i < b->n; i++) json_array_append_new(a, json_integer(b->ids[i]));
    return a;
}

static json_t *decoded(const cllm_tokenizer *tok, const cllm_token_buf *b, bool skip) {
    char *text = NULL;
    size_t len = 0;
    if (cllm_tokenizer_decode(tok, b->ids, b->n, skip, &text, &len) != CLLM_OK) {
        fprintf(stderr, "decode: %s\n", cllm_last_error());
        return json_null();
    }
    json_t *s = json_stringn(text, len);
    free(text);
    return s ? s : json_string("<decoded text is not valid UTF-8>");
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <model dir> <samples.json> <out.json>\n", argv[0]);
        return 2;
    }
    cllm_tokenizer *tok = NULL;
    if (cllm_tokenizer_load(&tok, argv[1]) != CLLM_OK) {
        fprintf(stderr, "%s\n", cllm_last_error());
        return 1;
    }
    json_error_t err;
    json_t *samples = json_load_file(argv[2], JSON_ALLOW_NUL, &err);
    if (!json_is_array(samples)) {
        fprintf(stderr, "%s:%d:%d: %s\n", argv[2], err.line, err.column, err.text);
        cllm_tokenizer_free(tok);
        return 1;
    }
    json_t *out = json_array();
    int rc = 0;
    for (size_t i = 0; i < json_array_size(samples); i++) {
        json_t *s = json_array_get(samples, i);
        cllm_token_buf a = {0}, b = {0};
        if (cllm_tokenizer_encode(tok, json_string_value(s), json_string_length(s), true, &a) != CLLM_OK ||
            cllm_tokenizer_encode(tok, json_string_value(s), json_string_length(s), false, &b) != CLLM_OK) {
            fprintf(stderr, "encode of sample %zu: %s\n", i, cllm_last_error());
            rc = 1;
        }
        json_t *r = json_object();
        json_object_set_new(r, "ids", id_array(&a));
        json_object_set_new(r, "ids_plain", id_array(&b));
        json_object_set_new(r, "text", decoded(tok, &a, false));
        json_object_set_new(r, "text_skip", decoded(tok, &a, true));
        json_object_set_new(r, "text_plain", decoded(tok, &b, false));
        json_array_append_new(out, r);
        cllm_token_buf_free(&a);
        cllm_token_buf_free(&b);
    }
    if (json_dump_file(out, argv[3], JSON_COMPACT) != 0) {
        fprintf(stderr, "%s: cannot write\n", argv[3]);
        rc = 1;
    }
    json_decref(out);
    json_decref(samples);
    cllm_tokenizer_free(tok);
    return rc;
}
