/*
 * Conversational preference records (docs/alignment.md): "prompt",
 * "chosen" and "rejected" as message lists, rendered into the texts of an
 * explicit-prompt record the way trl's apply_chat_template does:
 *
 *   prompt   = render(prompt), with the generation prompt when its last
 *              message is the user's; when it is the assistant's, the
 *              render is cut after that message's (stripped) content
 *              (transformers' continue_final_message);
 *   chosen   = render(prompt + chosen) minus its leading prompt text (an
 *              error when the render does not start with it); rejected
 *              likewise.
 *
 * Without "prompt" (the implicit prompt), the prompt is the longest run of
 * messages chosen and rejected share from their start (trl's
 * extract_prompt). The template is the tokenizer folder's chat_template,
 * else the conversation format cllm trains on (cllm_chat_template_for_sample
 * with the default prompt template); bos_token / eos_token are the
 * folder's tokenizer_config.json strings, else the tokenizer's BOS / EOS
 * tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/chat_template.h"
#include "cllm/tokenizer.h"
#include "data/data_impl.h"

void cllm_pairs_chat_free(cllm_pairs_chat *c) {
    if (!c) return;
    cllm_chat_template_free(c->tmpl);
    free(c->bos);
    free(c->eos);
    memset(c, 0, sizeof *c);
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* The folder's template and special-token strings, loaded once. */
static cllm_status load(cllm_pairs_chat *c, const char *dir, const cllm_tokenizer *tok) {
    if (c->loaded) return CLLM_OK;
    cllm_status st = cllm_chat_template_load_dir(&c->tmpl, &c->bos, &c->eos, dir);
    if (!st && !c->tmpl) {
        cllm_template t;
        char *src = NULL;
        st = cllm_template_load(&t, NULL);
        if (!st) st = cllm_chat_template_for_sample(&t, &src);
        if (!st) st = cllm_chat_template_init(&c->tmpl, src, "the default conversation template");
        free(src);
        cllm_template_free(&t);
    }
    char **slot[2] = {&c->bos, &c->eos};
    int32_t id[2] = {cllm_tokenizer_bos_id(tok), cllm_tokenizer_eos_id(tok)};
    for (int i = 0; i < 2 && !st; i++) {
        size_t n;
        const char *s = !*slot[i] && id[i] >= 0 ? cllm_tokenizer_id_to_token(tok, id[i], &n) : NULL;
        if (s && !(*slot[i] = dup_n(s, n))) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    c->loaded = !st;
    return st;
}

/* Checks key's value is a list of message objects (a string "role", a
 * "content"). */
static cllm_status check_messages(json_t *o, const char *key, const cllm_loc *l) {
    json_t *a = json_object_get(o, key);
    if (!a) return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "missing key \"%s\"", key);
    if (!json_is_array(a))
        return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                            "\"%s\": expected a list of messages (the prompt is one)", key);
    size_t i;
    json_t *m;
    json_array_foreach(a, i, m) {
        json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")) ||
            !(json_is_string(content) || json_is_array(content) || json_is_null(content)))
            return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                                "\"%s\"[%zu]: expected a message {\"role\": \"...\", \"content\": \"...\"}", key, i);
    }
    return CLLM_OK;
}

/* messages[from, to) as a new array. */
static json_t *slice(json_t *a, size_t from, size_t to) {
    json_t *s = json_array();
    for (size_t i = from; s && i < to; i++)
        if (json_array_append(s, json_array_get(a, i))) {
            json_decref(s);
            return NULL;
        }
    return s;
}

static cllm_status render(const cllm_pairs_chat *c, json_t *msgs, bool gen, const cllm_loc *l, const char *key,
                          char **out) {
    cllm_status st = cllm_chat_template_render(c->tmpl, msgs, gen, c->bos, c->eos, NULL, out);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cllm_last_error());
        return cllm_fail_at(st, l->file, l->line, l->col, "\"%s\": the chat template failed: %s", key, msg);
    }
    return CLLM_OK;
}

/* The prompt's text: the generation prompt after a user message; after an
 * assistant message, the render cut after its stripped content. */
static cllm_status render_prompt(const cllm_pairs_chat *c, json_t *prompt, const cllm_loc *l, char **out) {
    size_t n = json_array_size(prompt);
    if (n == 0) return (*out = dup_n("", 0)) ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    json_t *last = json_array_get(prompt, n - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    cllm_status st = render(c, prompt, strcmp(role, "user") == 0, l, "prompt", out);
    if (st || strcmp(role, "assistant") != 0) return st;
    const char *s = json_string_value(json_object_get(last, "content"));
    if (!s) {
        free(*out);
        *out = NULL;
        return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                            "\"prompt\": a final assistant message to continue needs a string content");
    }
    size_t a = 0, b = strlen(s);
    while (a < b && strchr(" \t\n\r\f\v", s[a])) a++;
    while (b > a && strchr(" \t\n\r\f\v", s[b - 1])) b--;
    /* the last occurrence of content[a, b) */
    const char *hit = NULL;
    for (const char *r = *out; b > a && *r; r++)
        if (strncmp(r, s + a, b - a) == 0) hit = r;
    if (b > a && !hit) {
        free(*out);
        *out = NULL;
        return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                            "\"prompt\": the chat template's render does not contain the final assistant message");
    }
    if (hit) (*out)[hit - *out + (b - a)] = 0;
    return CLLM_OK;
}

/* render(prompt + completion) minus the prompt's text. */
static cllm_status render_completion(const cllm_pairs_chat *c, json_t *prompt, json_t *comp, const char *ptext,
                                     const cllm_loc *l, const char *key, char **out) {
    json_t *all = slice(prompt, 0, json_array_size(prompt));
    if (!all || json_array_extend(all, comp)) {
        json_decref(all);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    char *text = NULL;
    cllm_status st = render(c, all, false, l, key, &text);
    json_decref(all);
    size_t n = strlen(ptext);
    if (!st && strncmp(text, ptext, n) != 0)
        st = cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                          "\"%s\": the chat template's render of prompt + %s does not start with its render of the "
                          "prompt",
                          key, key);
    if (!st) memmove(text, text + n, strlen(text + n) + 1);
    if (st) {
        free(text);
        text = NULL;
    }
    *out = text;
    return st;
}

bool cllm_pairs_is_chat(json_t *o, const char *kc) {
    return json_is_array(json_object_get(o, "prompt")) || json_is_array(json_object_get(o, kc));
}

cllm_status cllm_pairs_chat_render(cllm_pairs_chat *c, const char *dir, const cllm_tokenizer *tok, json_t *o,
                                   const cllm_loc *l, const char *kc, const char *kr, char *text[3]) {
    text[0] = text[1] = text[2] = NULL;
    bool has_prompt = json_object_get(o, "prompt") != NULL;
    cllm_status st = has_prompt ? check_messages(o, "prompt", l) : CLLM_OK;
    if (!st) st = check_messages(o, kc, l);
    if (!st) st = check_messages(o, kr, l);
    if (!st) st = load(c, dir, tok);
    if (st) return st;
    json_t *ch = json_object_get(o, kc), *rj = json_object_get(o, kr), *prompt, *cs, *rs;
    if (has_prompt) {
        prompt = json_incref(json_object_get(o, "prompt"));
        cs = json_incref(ch);
        rs = json_incref(rj);
    } else { /* trl's extract_prompt: the messages both start with */
        size_t k = 0, nc = json_array_size(ch), nr = json_array_size(rj);
        while (k < nc && k < nr && json_equal(json_array_get(ch, k), json_array_get(rj, k))) k++;
        prompt = slice(ch, 0, k);
        cs = slice(ch, k, nc);
        rs = slice(rj, k, nr);
    }
    if (!prompt || !cs || !rs) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    else if (json_array_size(cs) == 0 || json_array_size(rs) == 0)
        st = cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "empty %s completion: no message after the prompt",
                          json_array_size(cs) == 0 ? "chosen" : "rejected");
    if (!st) st = render_prompt(c, prompt, l, &text[0]);
    if (!st) st = render_completion(c, prompt, cs, text[0], l, kc, &text[1]);
    if (!st) st = render_completion(c, prompt, rs, text[0], l, kr, &text[2]);
    json_decref(prompt);
    json_decref(cs);
    json_decref(rs);
    if (st)
        for (int i = 0; i < 3; i++) {
            free(text[i]);
            text[i] = NULL;
        }
    return st;
}
