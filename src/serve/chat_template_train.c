/*
 * The chat template of the format cllm trains on (cllm/chat_template.h):
 * a Jinja template generated from a prompt template (cllm/sample.h) that
 * reproduces, for a message list, the text src/data/sample.c renders for the
 * same conversation record, so that a served model is prompted exactly as it
 * was trained. Also the writer that puts it, with the tokenizer files, into a
 * model folder.
 *
 * The generated template is one line without whitespace between tags, so
 * trim_blocks and lstrip_blocks never change it; the prompt strings are
 * embedded as Jinja string literals with every special character escaped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cllm/chat_template.h"
#include "cllm/io.h"
#include "cllm/json.h"

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + len + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, len);
    b->n += len;
    b->s[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* s as a double-quoted Jinja string literal */
static void literal(sbuf *b, const char *s) {
    puts_(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        char esc[8];
        switch (*p) {
        case '\\': puts_(b, "\\\\"); break;
        case '"': puts_(b, "\\\""); break;
        case '\n': puts_(b, "\\n"); break;
        case '\r': puts_(b, "\\r"); break;
        case '\t': puts_(b, "\\t"); break;
        default:
            if (*p < 0x20 || *p == 0x7F) {
                snprintf(esc, sizeof esc, "\\x%02x", *p);
                puts_(b, esc);
            } else {
                put(b, (const char *)p, 1);
            }
        }
    }
    puts_(b, "\"");
}

/* {{ "literal" }} */
static void out_lit(sbuf *b, const char *s) {
    if (!s || !*s) return;
    puts_(b, "{{ ");
    literal(b, s);
    puts_(b, " }}");
}

cllm_status cllm_chat_template_for_sample(const cllm_template *t, char **source) {
    if (!source) return CLLM_FAIL(CLLM_ERR_ARG, "source is NULL");
    *source = NULL;
    if (!t) return CLLM_FAIL(CLLM_ERR_ARG, "template is NULL");
    sbuf b = {0};
    puts_(&b, "{#- cllm conversation format (generated from the prompt template of the training run) -#}");
    puts_(&b, "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- else -%}{%- for p in c -%}"
              "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}");
    if (t->bos > 0) puts_(&b, "{%- if bos_token is defined -%}{{ bos_token }}{%- endif -%}");
    else if (t->bos < 0)
        puts_(&b, "{%- if bos_token is defined and bos_token and bos_token != eos_token -%}{{ bos_token }}"
                  "{%- endif -%}");
    puts_(&b, "{%- if messages and messages[0].role == 'system' -%}{{ text(messages[0].content) }}"
              "{%- set loop_messages = messages[1:] -%}{%- else -%}");
    out_lit(&b, t->system);
    puts_(&b, "{%- set loop_messages = messages -%}{%- endif -%}{%- set ns = namespace(prev='') -%}"
              "{%- for m in loop_messages -%}{%- if ns.prev == 'ans' -%}");
    out_lit(&b, t->ans_suffix);
    puts_(&b, "{%- endif -%}{%- if m.role in ['user', 'human', 'ask'] -%}");
    out_lit(&b, t->ask_prefix);
    puts_(&b, "{{ text(m.content) }}");
    out_lit(&b, t->ask_suffix);
    puts_(&b, "{%- set ns.prev = 'ask' -%}{%- elif m.role in ['assistant', 'gpt', 'ans'] -%}");
    out_lit(&b, t->ans_prefix);
    puts_(&b, "{{ text(m.content) }}");
    if (t->eos) puts_(&b, "{%- if eos_token is defined -%}{{ eos_token }}{%- endif -%}");
    puts_(&b, "{%- set ns.prev = 'ans' -%}{%- else -%}{{ raise_exception('this model was trained on user and "
              "assistant turns (and a leading system message); got role ' ~ m.role) }}{%- endif -%}"
              "{%- endfor -%}{%- if add_generation_prompt -%}{%- if ns.prev == 'ans' -%}");
    out_lit(&b, t->ans_suffix);
    puts_(&b, "{%- endif -%}");
    out_lit(&b, t->ans_prefix);
    puts_(&b, "{%- endif -%}");
    if (b.oom) {
        free(b.s);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    *source = b.s;
    return CLLM_OK;
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool same_dir(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

cllm_status cllm_chat_template_write_dir(const char *dir, const char *tokenizer_dir, const cllm_template *t) {
    if (!dir || !t) return CLLM_FAIL(CLLM_ERR_ARG, "dir or template is NULL");
    char *src = NULL, *data = NULL;
    json_t *cfg = NULL;
    size_t dl = strlen(dir) + (tokenizer_dir ? strlen(tokenizer_dir) : 0) + 64;
    char *from = malloc(dl), *to = malloc(dl);
    cllm_status st = from && to ? cllm_chat_template_for_sample(t, &src) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    bool copy = tokenizer_dir && !same_dir(dir, tokenizer_dir);
    static const char *const files[] = {"tokenizer.json", "tokenizer.model", "special_tokens_map.json"};
    for (size_t i = 0; !st && copy && i < sizeof files / sizeof *files; i++) {
        size_t len;
        snprintf(from, dl, "%s/%s", tokenizer_dir, files[i]);
        if (!is_file(from)) continue;
        snprintf(to, dl, "%s/%s", dir, files[i]);
        if (!(st = cllm_read_file(from, &data, &len))) st = cllm_write_file_atomic(to, data, len);
        free(data);
        data = NULL;
    }
    if (!st && tokenizer_dir) {
        snprintf(from, dl, "%s/tokenizer_config.json", tokenizer_dir);
        if (is_file(from)) {
            size_t len;
            json_error_t je;
            if (!(st = cllm_read_file(from, &data, &len))) {
                cfg = json_loadb(data, len, 0, &je);
                /* integers past 64 bits (model_max_length) only load as reals */
                if (!cfg) cfg = json_loadb(data, len, JSON_DECODE_INT_AS_REAL, &je);
                if (!cfg) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d:%d: %s", from, je.line, je.column, je.text);
                else if (!json_is_object(cfg)) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: expected a JSON object", from);
            }
        }
    }
    if (!st && !cfg && !(cfg = json_object())) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st && json_object_set_new(cfg, "chat_template", json_string(src)))
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(to, dl, "%s/tokenizer_config.json", dir);
        st = cllm_json_save_file(cfg, to);
    }
    json_decref(cfg);
    free(data);
    free(src);
    free(from);
    free(to);
    return st;
}
