/*
 * chat_template_render: renders chat-template cases read as JSON lines and
 * prints one JSON line per case, for tests/chat_template_oracle.py.
 *
 *   chat_template_render CASES.jsonl
 * A case: {"template": TEXT, "messages": [...], "add_generation_prompt":
 * bool, "bos_token": str or null, "eos_token": str or null, "extra": {...}}.
 * Output: {"ok": true, "text": ...} or {"ok": false, "error": MESSAGE}.
 * Templates are compiled once per distinct text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/chat_template.h"
#include "cllm/json.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: chat_template_render CASES.jsonl\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    char *line = NULL, *last_src = NULL;
    size_t cap = 0;
    ssize_t len;
    cllm_chat_template *t = NULL;
    cllm_status init_st = CLLM_OK;
    char init_err[1024] = "";
    int lineno = 0, rc = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)len, 0, &je);
        const char *src = json_string_value(json_object_get(c, "template"));
        if (!c || !src) {
            fprintf(stderr, "%s:%d: bad case: %s\n", argv[1], lineno, je.text);
            json_decref(c);
            rc = 1;
            break;
        }
        if (!last_src || strcmp(src, last_src)) {
            cllm_chat_template_free(t);
            t = NULL;
            free(last_src);
            last_src = strdup(src);
            init_st = cllm_chat_template_init(&t, src, "case");
            snprintf(init_err, sizeof init_err, "%s", init_st ? cllm_last_error() : "");
        }
        json_t *res;
        if (init_st) {
            res = json_pack("{sbss}", "ok", 0, "error", init_err);
        } else {
            char *out = NULL;
            const json_t *bos = json_object_get(c, "bos_token"), *eos = json_object_get(c, "eos_token");
            cllm_status st = cllm_chat_template_render(
                t, json_object_get(c, "messages"), json_is_true(json_object_get(c, "add_generation_prompt")),
                json_string_value(bos), json_string_value(eos), json_object_get(c, "extra"), &out);
            if (st) res = json_pack("{sbss}", "ok", 0, "error", cllm_last_error());
            else res = json_pack("{sbss}", "ok", 1, "text", out);
            free(out);
        }
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (!s) {
            fprintf(stderr, "%s:%d: output is not valid UTF-8\n", argv[1], lineno);
            rc = 1;
        } else {
            puts(s);
        }
        free(s);
        json_decref(res);
        json_decref(c);
    }
    cllm_chat_template_free(t);
    free(last_src);
    free(line);
    fclose(f);
    return rc;
}
