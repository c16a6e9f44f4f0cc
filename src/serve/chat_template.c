/*
 * Chat templates (cllm/chat_template.h): compile = lex + parse
 * (jinja_lex.c, jinja_parse.c); render = bind transformers' variables in a
 * fresh scope and run the tree (jinja_eval.c); load_dir = find the
 * template and the bos / eos tokens of an HF folder.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cllm/chat_template.h"
#include "cllm/io.h"
#include "serve/jinja_impl.h"

cllm_status cllm_chat_template_init(cllm_chat_template **out, const char *source, const char *what) {
    if (!out) return CLLM_FAIL(CLLM_ERR_ARG, "out is NULL");
    *out = NULL;
    if (!source) return CLLM_FAIL(CLLM_ERR_ARG, "source is NULL");
    cllm_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->what = strdup(what ? what : "template"))) {
        free(t);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    jtoks toks;
    cllm_status st = jinja_lex(&toks, source, t->what);
    if (!st) {
        st = jinja_parse(&t->body, &toks, t->what);
        jinja_toks_free(&toks);
    }
    if (st) {
        cllm_chat_template_free(t);
        return st;
    }
    *out = t;
    return CLLM_OK;
}

void cllm_chat_template_free(cllm_chat_template *t) {
    if (!t) return;
    jinja_list_free(&t->body);
    free(t->what);
    free(t);
}

static cllm_status define_str(jstate *st, const char *name, const char *s) {
    if (!s) return CLLM_OK;
    jval v = jv_str(s, strlen(s));
    if (!v.j) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return jinja_define(st, name, v);
}

cllm_status cllm_chat_template_render(const cllm_chat_template *t, const json_t *messages, bool add_generation_prompt,
                                      const char *bos_token, const char *eos_token, const json_t *extra, char **out) {
    if (!out) return CLLM_FAIL(CLLM_ERR_ARG, "out is NULL");
    *out = NULL;
    if (!t) return CLLM_FAIL(CLLM_ERR_ARG, "template is NULL");
    if (messages && !json_is_array(messages))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: messages must be a JSON array", t->what);
    if (extra && !json_is_object(extra)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: extra must be a JSON object", t->what);
    jstate st;
    memset(&st, 0, sizeof st);
    st.t = t;
    cllm_status r = jinja_scope_root(&st);
    jval msgs = jv_json(messages ? json_incref((json_t *)messages) : json_array());
    if (!r && !msgs.j) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!r) {
        r = jinja_define(&st, "messages", msgs);
        msgs = jv_undef(NULL);
    }
    jv_free(&msgs);
    if (!r) r = jinja_define(&st, "add_generation_prompt", jv_bool(add_generation_prompt));
    if (!r) r = jinja_define(&st, "tools", jv_none());
    if (!r) r = jinja_define(&st, "documents", jv_none());
    if (!r) r = define_str(&st, "bos_token", bos_token);
    if (!r) r = define_str(&st, "eos_token", eos_token);
    if (!r && extra) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)extra, k, v) {
            if ((r = jinja_define(&st, k, jv_json(json_incref(v))))) break;
        }
    }
    if (!r) r = jbuf_add(&st, &st.out, &st.n, &st.cap, "", 0);
    if (!r) r = jinja_exec_list(&st, &t->body);
    jinja_scope_end(&st);
    if (r) {
        free(st.out);
        return r;
    }
    *out = st.out;
    return CLLM_OK;
}

/* A special token: a string, an AddedToken object's "content", or null. */
static cllm_status token_of(const json_t *cfg, const char *key, const char *path, char **out) {
    if (!out) return CLLM_OK;
    *out = NULL;
    const json_t *v = json_object_get(cfg, key);
    if (v && json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_string(v))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key '%s' must be a string or an object with a string \"content\"",
                         path, key);
    if (!(*out = strdup(json_string_value(v)))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

cllm_status cllm_chat_template_load_dir(cllm_chat_template **out, char **bos_token, char **eos_token, const char *dir) {
    if (bos_token) *bos_token = NULL;
    if (eos_token) *eos_token = NULL;
    if (!out) return CLLM_FAIL(CLLM_ERR_ARG, "out is NULL");
    *out = NULL;
    if (!dir) return CLLM_FAIL(CLLM_ERR_ARG, "dir is NULL");
    size_t dl = strlen(dir);
    char *path = malloc(dl + 64), *what = malloc(dl + 96), *src = NULL;
    json_t *cfg = NULL;
    cllm_status r = CLLM_OK;
    if (!path || !what) {
        r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    snprintf(path, dl + 64, "%s/tokenizer_config.json", dir);
    const char *source = NULL;
    if (file_exists(path)) {
        /* integers as reals: HF configs hold model_max_length values past 64 bits */
        json_error_t je;
        char *text = NULL;
        size_t len;
        if ((r = cllm_read_file(path, &text, &len))) goto done;
        cfg = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
        free(text);
        if (!cfg) {
            r = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
            goto done;
        }
        if (!json_is_object(cfg)) {
            r = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected a JSON object", path);
            goto done;
        }
        if ((r = token_of(cfg, "bos_token", path, bos_token)) || (r = token_of(cfg, "eos_token", path, eos_token)))
            goto done;
        const json_t *ct = json_object_get(cfg, "chat_template");
        snprintf(what, dl + 96, "%s chat_template", path);
        if (ct && json_is_string(ct)) {
            source = json_string_value(ct);
        } else if (ct && json_is_array(ct)) {
            size_t i;
            const json_t *e;
            json_array_foreach(ct, i, e) {
                const json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
                if (!json_is_object(e) || !json_is_string(nm) || !json_is_string(tp)) {
                    r = CLLM_FAIL(CLLM_ERR_FORMAT,
                                  "%s: chat_template[%zu] must be an object with string \"name\" and \"template\"",
                                  path, i);
                    goto done;
                }
                if (!strcmp(json_string_value(nm), "default")) {
                    source = json_string_value(tp);
                    snprintf(what, dl + 96, "%s chat_template[%zu]", path, i);
                }
            }
            if (!source) {
                r = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: chat_template lists no template named \"default\"", path);
                goto done;
            }
        } else if (ct && !json_is_null(ct)) {
            r = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: key 'chat_template' must be a string or a list of {name, template}",
                          path);
            goto done;
        }
    }
    if (!source) {
        snprintf(path, dl + 64, "%s/chat_template.jinja", dir);
        if (!file_exists(path)) goto done; /* no template: *out stays NULL */
        size_t len;
        if ((r = cllm_read_file(path, &src, &len))) goto done;
        if (strlen(src) != len) {
            r = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: contains a NUL byte", path);
            goto done;
        }
        snprintf(what, dl + 96, "%s", path);
        source = src;
    }
    r = cllm_chat_template_init(out, source, what);
done:
    if (r) {
        if (bos_token) {
            free(*bos_token);
            *bos_token = NULL;
        }
        if (eos_token) {
            free(*eos_token);
            *eos_token = NULL;
        }
    }
    json_decref(cfg);
    free(src);
    free(path);
    free(what);
    return r;
}
