/*
 * Prompt templates: the built-in defaults (Alpaca for instruct records,
 * "### Human:" / "### Assistant:" turns for conversations and ref_qa) and
 * template files that override them key by key. Rendering lives in
 * sample.c; this file only owns the strings.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/json.h"
#include "cllm/sample.h"

static const char DEF_INSTRUCT[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\n{instruct}\n\n### Response:\n";
static const char DEF_INSTRUCT_INPUT[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruct}\n\n### "
    "Input:\n{input}\n\n### Response:\n";

typedef struct {
    const char *key, *def;
    size_t field; /* offset of the char * in cllm_template */
} str_key;

static const str_key STR_KEYS[] = {
    {"instruct", DEF_INSTRUCT, offsetof(cllm_template, instruct)},
    {"instruct_input", DEF_INSTRUCT_INPUT, offsetof(cllm_template, instruct_input)},
    {"system", "", offsetof(cllm_template, system)},
    {"reference_prefix", "### Reference:\n", offsetof(cllm_template, reference_prefix)},
    {"reference_suffix", "\n\n", offsetof(cllm_template, reference_suffix)},
    {"ask_prefix", "### Human:\n", offsetof(cllm_template, ask_prefix)},
    {"ask_suffix", "\n\n", offsetof(cllm_template, ask_suffix)},
    {"ans_prefix", "### Assistant:\n", offsetof(cllm_template, ans_prefix)},
    {"ans_suffix", "\n\n", offsetof(cllm_template, ans_suffix)},
};
#define N_STR_KEYS (sizeof STR_KEYS / sizeof STR_KEYS[0])

static char **field(cllm_template *t, size_t i) { return (char **)(void *)((char *)t + STR_KEYS[i].field); }

void cllm_template_free(cllm_template *t) {
    if (!t) return;
    for (size_t i = 0; i < N_STR_KEYS; i++) free(*field(t, i));
    memset(t, 0, sizeof *t);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

cllm_status cllm_template_load(cllm_template *t, const char *path) {
    memset(t, 0, sizeof *t);
    t->bos = -1;
    t->eos = true;
    json_t *j = NULL;
    cllm_status st = CLLM_OK;
    if (path) {
        if ((st = cllm_json_load_file(&j, path))) return st;
        if (!json_is_object(j)) {
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a template must be a JSON object", path);
            goto done;
        }
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            bool known = strcmp(key, "bos") == 0 || strcmp(key, "eos") == 0;
            for (size_t i = 0; i < N_STR_KEYS && !known; i++) known = strcmp(key, STR_KEYS[i].key) == 0;
            if (!known) {
                st = CLLM_FAIL(CLLM_ERR_FORMAT,
                               "%s: unknown key \"%s\" (known: instruct, instruct_input, system, reference_prefix, "
                               "reference_suffix, ask_prefix, ask_suffix, ans_prefix, ans_suffix, bos, eos)",
                               path, key);
                goto done;
            }
        }
        json_t *bos = json_object_get(j, "bos");
        if (bos && !json_is_null(bos)) {
            if (!json_is_boolean(bos)) {
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: \"bos\" must be true, false or null (automatic)", path);
                goto done;
            }
            t->bos = json_is_true(bos);
        }
        if ((st = cllm_json_get_bool_opt(j, "eos", &t->eos, path))) goto done;
    }
    for (size_t i = 0; i < N_STR_KEYS; i++) {
        const char *s = STR_KEYS[i].def;
        if (j && (st = cllm_json_get_str_opt(j, STR_KEYS[i].key, &s, path))) goto done;
        if (!(*field(t, i) = dup_str(s))) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory loading a template");
            goto done;
        }
    }
    if (!strstr(t->instruct, "{instruct}") || !strstr(t->instruct_input, "{instruct}") ||
        !strstr(t->instruct_input, "{input}")) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT,
                       "%s: \"instruct\" must contain {instruct}, and \"instruct_input\" both {instruct} and {input}",
                       path ? path : "template");
        goto done;
    }
done:
    json_decref(j);
    if (st) cllm_template_free(t);
    return st;
}

bool cllm_template_wants_bos(const cllm_template *t, const cllm_tokenizer *tok) {
    if (t->bos >= 0) return t->bos != 0;
    if (!tok) return false;
    int32_t b = cllm_tokenizer_bos_id(tok), e = cllm_tokenizer_eos_id(tok);
    return b >= 0 && b != e;
}
