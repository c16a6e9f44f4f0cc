/*
 * cllm tokenize / detokenize: encode a text file to ids with an HF
 * tokenizer.json, and decode ids back to text.
 *
 *   cllm tokenize --tokenizer DIR --input FILE [--no-special]
 *       prints {"ids": [...]} on one line; the file is read as raw bytes
 *       (no trimming: a trailing newline is part of the text).
 *   cllm detokenize --tokenizer DIR [--input FILE] [--skip-special]
 *       reads a JSON array of ids or {"ids": [...]} from FILE (default
 *       stdin) and writes the decoded text exactly, with no newline added.
 * Exit codes: 0 ok, 1 failure (message names the file or id), 2 usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "args.h"
#include "cllm/core.h"
#include "cllm/tokenizer.h"
#include "commands.h"

/* Reads all of f into a malloc'd buffer (NUL-terminated). */
static cllm_status read_all(FILE *f, const char *name, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory", name);
    for (;;) {
        if (cap - n < 2) {
            if (cap > SIZE_MAX / 2) {
                free(buf);
                return CLLM_FAIL(CLLM_ERR_NOMEM, "%s: too large", name);
            }
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory", name);
            }
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return CLLM_FAIL(CLLM_ERR_IO, "%s: read error", name);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return CLLM_OK;
}

static cllm_status read_file(const char *path, char **out, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return CLLM_FAIL(CLLM_ERR_IO, "%s: %s", path, strerror(errno));
    cllm_status st = read_all(f, path, out, len);
    if (f != stdin) fclose(f);
    return st;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *input = NULL;
    bool no_special = false;
    arg_spec specs[] = {
        {"tokenizer", ARG_STR, &dir, NULL, true, "folder with tokenizer.json (or the file itself)"},
        {"input", ARG_STR, &input, NULL, true, "text file to encode, read as raw bytes ('-' = stdin)"},
        {"no-special", ARG_FLAG, &no_special, NULL, false, "do not add BOS/EOS (added tokens in the text still count)"},
    };
    int rc = args_parse("tokenize", "Encode a text file to token ids; prints {\"ids\": [...]}.", argc, argv, specs,
                        ARGS_COUNT(specs));
    args_free(specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : 2;

    cllm_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    cllm_token_buf ids = {0};
    int ret = 1;
    if (cllm_tokenizer_load(&tok, dir) || read_file(input, &text, &len)) goto done;
    if (cllm_tokenizer_encode(tok, text, len, !no_special, &ids)) {
        cllm_fail_context(CLLM_ERR_INTERNAL, "%s", input);
        goto done;
    }
    fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < ids.n; i++) printf(i ? ", %d" : "%d", ids.ids[i]);
    fputs("]}\n", stdout);
    if (fflush(stdout) != 0) {
        CLLM_FAIL(CLLM_ERR_IO, "stdout: %s", strerror(errno));
        goto done;
    }
    ret = 0;
done:
    if (ret) tool_fail("tokenize");
    cllm_token_buf_free(&ids);
    free(text);
    cllm_tokenizer_free(tok);
    return ret;
}

/* Parses a JSON array of ids or {"ids": [...]} into *ids. */
static cllm_status parse_ids(const char *name, const char *text, size_t len, int32_t **ids, size_t *n) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err);
    if (!root) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d:%d: %s", name, err.line, err.column, err.text);
    json_t *arr = json_is_object(root) ? json_object_get(root, "ids") : root;
    cllm_status st = CLLM_OK;
    if (!json_is_array(arr)) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected a JSON array of ids or {\"ids\": [...]}", name);
        goto done;
    }
    *n = json_array_size(arr);
    *ids = malloc((*n ? *n : 1) * sizeof **ids);
    if (!*ids) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    for (size_t i = 0; i < *n; i++) {
        json_t *v = json_array_get(arr, i);
        double d = json_is_number(v) ? json_number_value(v) : 0.5;
        if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != (double)(int64_t)d) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: element %zu is not an integer token id", name, i);
            goto done;
        }
        (*ids)[i] = (int32_t)d;
    }
done:
    json_decref(root);
    return st;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *input = NULL;
    bool skip_special = false;
    arg_spec specs[] = {
        {"tokenizer", ARG_STR, &dir, NULL, true, "folder with tokenizer.json (or the file itself)"},
        {"input", ARG_STR, &input, "-", false, "JSON file with an id array or {\"ids\": [...]} ('-' = stdin)"},
        {"skip-special", ARG_FLAG, &skip_special, NULL, false, "drop special tokens such as <s> and </s>"},
    };
    int rc = args_parse("detokenize", "Decode token ids to text; writes the text exactly as decoded.", argc, argv,
                        specs, ARGS_COUNT(specs));
    args_free(specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : 2;

    cllm_tokenizer *tok = NULL;
    char *json = NULL, *text = NULL;
    size_t len = 0, n = 0, tlen = 0;
    int32_t *ids = NULL;
    int ret = 1;
    const char *name = strcmp(input, "-") == 0 ? "<stdin>" : input;
    if (cllm_tokenizer_load(&tok, dir) || read_file(input, &json, &len) || parse_ids(name, json, len, &ids, &n))
        goto done;
    if (cllm_tokenizer_decode(tok, ids, n, skip_special, &text, &tlen)) {
        cllm_fail_context(CLLM_ERR_ARG, "%s", name);
        goto done;
    }
    if (fwrite(text, 1, tlen, stdout) != tlen || fflush(stdout) != 0) {
        CLLM_FAIL(CLLM_ERR_IO, "stdout: %s", strerror(errno));
        goto done;
    }
    ret = 0;
done:
    if (ret) tool_fail("detokenize");
    free(text);
    free(ids);
    free(json);
    cllm_tokenizer_free(tok);
    return ret;
}
