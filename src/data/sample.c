/*
 * Records -> rendered samples: detects the format of a JSON record, checks
 * its fields (messages point at FILE:LINE:COL of the field), and renders it
 * with a template into text / BOS / EOS segments that carry the loss flag.
 * Tokenizing the segments is encode.c's job; reading records from files is
 * records.c's.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/sample.h"
#include "data/data_impl.h"

const char *cllm_sample_type_name(cllm_sample_type t) {
    switch (t) {
    case CLLM_SAMPLE_PRETRAIN: return "pretrain";
    case CLLM_SAMPLE_INSTRUCT: return "instruct";
    case CLLM_SAMPLE_CONVERSATION: return "conversation";
    case CLLM_SAMPLE_REF_QA: return "ref_qa";
    case CLLM_SAMPLE_TOKENS: return "tokens";
    case CLLM_SAMPLE_TYPE_COUNT: break;
    }
    return "unknown";
}

void cllm_sample_free(cllm_sample *s) {
    if (!s) return;
    free(s->text);
    free(s->seg);
    free(s->ids);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------- locations */

/* Location of byte `off` of a record that starts at `w`. */
static cllm_loc loc_at(const cllm_loc *w, const char *text, size_t off) {
    cllm_loc l = *w;
    for (size_t i = 0; i < off; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            l.line++;
            l.col = 1;
        } else if ((c & 0xC0) != 0x80) {
            l.col++;
        }
    }
    return l;
}

/* Byte offset of `"key"` at nesting depth 1 of a JSON object text, or of
 * the record start when the key does not occur. Only used for messages. */
static size_t key_offset(const char *text, size_t len, const char *key) {
    size_t klen = key ? strlen(key) : 0;
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '"') {
            size_t start = i++;
            while (i < len && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
            if (key && depth == 1 && i - start - 1 == klen && memcmp(text + start + 1, key, klen) == 0) {
                size_t j = i + 1;
                while (j < len && (text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r')) j++;
                if (j < len && text[j] == ':') return start;
            }
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) i++;
    return i;
}

typedef struct {
    const char *text;
    size_t len;
    const cllm_loc *where;
} rec_ctx;

static cllm_status bad(const rec_ctx *r, const char *key, const char *fmt, const char *a, const char *b)
    __attribute__((format(printf, 3, 0)));
/* Fails with "FILE:LINE:COL: <fmt with a, b>" pointing at key (or the record). */
static cllm_status bad(const rec_ctx *r, const char *key, const char *fmt, const char *a, const char *b) {
    cllm_loc l = loc_at(r->where, r->text, key_offset(r->text, r->len, key));
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, a, b);
    return cllm_fail_at(CLLM_ERR_FORMAT, l.file, l.line, l.col, "%s", msg);
}

/* ---------------------------------------------------------- rendering */

static cllm_status push_seg(cllm_sample *s, cllm_segment_kind kind, bool loss, const char *text, size_t len) {
    if (kind == CLLM_SEG_TEXT && len == 0) return CLLM_OK;
    /* Adjacent prompt text merges into one segment: it is tokenized as one
     * piece, as the rendered prompt would be. */
    bool merge = kind == CLLM_SEG_TEXT && !loss && s->n_seg > 0 && s->seg[s->n_seg - 1].kind == CLLM_SEG_TEXT &&
                 !s->seg[s->n_seg - 1].loss;
    if (s->text_len + len + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + len + 1) cap *= 2;
        char *p = realloc(s->text, cap);
        if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory rendering a sample");
        s->text = p;
        s->text_cap = cap;
    }
    if (!merge && s->n_seg == s->seg_cap) {
        size_t cap = s->seg_cap ? s->seg_cap * 2 : 16;
        cllm_segment *p = realloc(s->seg, cap * sizeof *p);
        if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory rendering a sample");
        s->seg = p;
        s->seg_cap = cap;
    }
    if (len) memcpy(s->text + s->text_len, text, len);
    if (merge) {
        s->seg[s->n_seg - 1].len += len;
    } else {
        s->seg[s->n_seg++] = (cllm_segment){kind, loss, s->text_len, len};
    }
    s->text_len += len;
    s->text[s->text_len] = '\0';
    return CLLM_OK;
}

static cllm_status push_str(cllm_sample *s, bool loss, const char *str) {
    return push_seg(s, CLLM_SEG_TEXT, loss, str, strlen(str));
}

/* Prompt text: tmpl with {instruct} and {input} replaced. */
static cllm_status push_instruct_prompt(cllm_sample *s, const char *tmpl, const char *ins, size_t ins_len,
                                        const char *inp, size_t inp_len) {
    cllm_status st = CLLM_OK;
    const char *p = tmpl;
    while (*p && !st) {
        const char *a = strstr(p, "{instruct}"), *b = strstr(p, "{input}");
        const char *next = a && (!b || a < b) ? a : b;
        if (!next) {
            st = push_str(s, false, p);
            break;
        }
        st = push_seg(s, CLLM_SEG_TEXT, false, p, (size_t)(next - p));
        if (st) break;
        if (next == a) {
            st = push_seg(s, CLLM_SEG_TEXT, false, ins, ins_len);
            p = next + strlen("{instruct}");
        } else {
            st = push_seg(s, CLLM_SEG_TEXT, false, inp, inp_len);
            p = next + strlen("{input}");
        }
    }
    return st;
}

static void reset(cllm_sample *s) {
    s->text_len = 0;
    s->n_seg = 0;
    s->n_ids = 0;
    if (s->text) s->text[0] = '\0';
}

static cllm_status begin(cllm_sample *s, const cllm_template *t) {
    /* BOS is a segment whose presence encode() resolves against the
     * tokenizer (automatic mode); it is never trained on except in pretrain,
     * where it is the first position and so never a target anyway. */
    (void)t;
    return push_seg(s, CLLM_SEG_BOS, s->type == CLLM_SAMPLE_PRETRAIN, NULL, 0);
}

static cllm_status answer(cllm_sample *s, const cllm_template *t, const char *text, size_t len) {
    cllm_status st = push_str(s, false, t->ans_prefix);
    if (!st) st = push_seg(s, CLLM_SEG_TEXT, true, text, len);
    if (!st && t->eos) st = push_seg(s, CLLM_SEG_EOS, true, NULL, 0);
    return st;
}

/* --------------------------------------------------------------- fields */

/* A required, non-empty string field. */
static cllm_status get_text(const rec_ctx *r, const json_t *o, const char *key, const char **out, size_t *len) {
    const json_t *v = json_object_get(o, key);
    if (!v) return bad(r, NULL, "missing field \"%s\"%s", key, "");
    if (!json_is_string(v)) return bad(r, key, "field \"%s\" must be a string%s", key, "");
    *out = json_string_value(v);
    *len = json_string_length(v);
    if (*len == 0) return bad(r, key, "empty text in field \"%s\"%s", key, "");
    return CLLM_OK;
}

static int role_of(const char *s) {
    if (!strcmp(s, "ask") || !strcmp(s, "user") || !strcmp(s, "human")) return 0;
    if (!strcmp(s, "ans") || !strcmp(s, "assistant") || !strcmp(s, "gpt")) return 1;
    return -1;
}

static cllm_status render_rounds(cllm_sample *s, const rec_ctx *r, const json_t *o, const cllm_template *t) {
    const json_t *rounds = json_object_get(o, "rounds");
    if (!rounds) return bad(r, NULL, "missing field \"rounds\"%s%s", "", "");
    if (!json_is_array(rounds) || json_array_size(rounds) == 0)
        return bad(r, "rounds", "field \"rounds\" must be a non-empty array of [\"ask\"|\"ans\", text] pairs%s%s", "",
                   "");
    size_t n = json_array_size(rounds), n_ans = 0;
    cllm_status st = CLLM_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const json_t *p = json_array_get(rounds, i);
        char idx[32];
        snprintf(idx, sizeof idx, "%zu", i);
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_string(json_array_get(p, 0)) ||
            !json_is_string(json_array_get(p, 1)))
            return bad(r, "rounds", "rounds[%s] must be a pair [\"ask\"|\"ans\", text]%s", idx, "");
        int role = role_of(json_string_value(json_array_get(p, 0)));
        if (role < 0)
            return bad(r, "rounds", "rounds[%s]: unknown role \"%s\" (expected \"ask\" or \"ans\")", idx,
                       json_string_value(json_array_get(p, 0)));
        const json_t *tx = json_array_get(p, 1);
        if (json_string_length(tx) == 0) return bad(r, "rounds", "rounds[%s]: empty text%s", idx, "");
        if (i > 0) {
            /* The separator after an answer belongs to the next turn's prompt. */
            int prev = role_of(json_string_value(json_array_get(json_array_get(rounds, i - 1), 0)));
            if (prev == 1) st = push_str(s, false, t->ans_suffix);
        }
        if (st) break;
        if (role == 0) {
            st = push_str(s, false, t->ask_prefix);
            if (!st) st = push_seg(s, CLLM_SEG_TEXT, false, json_string_value(tx), json_string_length(tx));
            if (!st) st = push_str(s, false, t->ask_suffix);
        } else {
            n_ans++;
            st = answer(s, t, json_string_value(tx), json_string_length(tx));
        }
    }
    if (!st && n_ans == 0) return bad(r, "rounds", "no \"ans\" round: nothing to train on%s%s", "", "");
    return st;
}

static cllm_status parse_tokens(cllm_sample *s, const rec_ctx *r, const json_t *o, int vocab) {
    const json_t *ids = json_object_get(o, "input_ids"), *labels = json_object_get(o, "labels");
    if (!json_is_array(ids) || json_array_size(ids) == 0)
        return bad(r, "input_ids", "\"input_ids\" must be a non-empty array of token ids%s%s", "", "");
    size_t n = json_array_size(ids);
    if (labels && json_is_null(labels)) labels = NULL;
    if (labels && (!json_is_array(labels) || json_array_size(labels) != n)) {
        char nb[32];
        snprintf(nb, sizeof nb, "%zu", n);
        return bad(r, "labels", "\"labels\" must be an array as long as \"input_ids\" (%s)%s", nb, "");
    }
    if (n > s->ids_cap) {
        int32_t *a = realloc(s->ids, n * sizeof *a), *b = a ? realloc(s->labels, n * sizeof *b) : NULL;
        if (a) s->ids = a;
        if (b) s->labels = b;
        if (!a || !b) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory reading token ids");
        s->ids_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(ids, i);
        char m[96];
        if (!json_is_integer(v)) {
            snprintf(m, sizeof m, "input_ids[%zu] is not an integer", i);
            return bad(r, "input_ids", "%s%s", m, "");
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || (vocab > 0 && id >= vocab) || id > INT32_MAX) {
            snprintf(m, sizeof m, "token id %lld at input_ids[%zu] is outside the vocabulary [0, %d)", (long long)id,
                     i, vocab);
            return bad(r, "input_ids", "%s%s", m, "");
        }
        s->ids[i] = (int32_t)id;
        s->labels[i] = (int32_t)id;
        if (labels) {
            const json_t *lv = json_array_get(labels, i);
            json_int_t l = json_is_integer(lv) ? json_integer_value(lv) : -2;
            if (l != -100 && (l < 0 || (vocab > 0 && l >= vocab) || l > INT32_MAX)) {
                snprintf(m, sizeof m, "labels[%zu] must be -100 or a token id in [0, %d)", i, vocab);
                return bad(r, "labels", "%s%s", m, "");
            }
            s->labels[i] = (int32_t)l;
        }
    }
    s->n_ids = n;
    return CLLM_OK;
}

static const char *const TYPE_KEYS[] = {"pretrain", "instruct", "conversation", "ref_qa"};

cllm_status cllm_sample_parse(cllm_sample *s, const char *json, size_t len, const cllm_loc *where,
                              const cllm_template *t, int vocab_size) {
    reset(s);
    cllm_loc w0 = {"<record>", 1, 1};
    rec_ctx r = {json, len, where ? where : &w0};
    json_error_t err;
    json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!o) {
        cllm_loc l = *r.where;
        if (err.line <= 1) {
            l.col += err.column > 0 ? (uint64_t)err.column - 1 : 0;
        } else {
            l.line += (uint64_t)err.line - 1;
            l.col = err.column > 0 ? (uint64_t)err.column : 1;
        }
        return cllm_fail_at(CLLM_ERR_FORMAT, l.file, l.line, l.col, "malformed JSON: %s", err.text);
    }
    cllm_status st = CLLM_OK;
    if (!json_is_object(o)) {
        st = bad(&r, NULL, "a record must be a JSON object%s%s", "", "");
        goto done;
    }
    const json_t *type = json_object_get(o, "type");
    int ty = -1;
    if (type) {
        if (!json_is_string(type)) {
            st = bad(&r, "type", "field \"type\" must be a string%s%s", "", "");
            goto done;
        }
        for (int i = 0; i < 4; i++)
            if (!strcmp(json_string_value(type), TYPE_KEYS[i])) ty = i;
        if (ty < 0) {
            st = bad(&r, "type", "unknown type \"%s\" (expected pretrain, instruct, conversation or ref_qa)%s",
                     json_string_value(type), "");
            goto done;
        }
    } else if (json_object_get(o, "input_ids")) {
        ty = CLLM_SAMPLE_TOKENS;
    } else if (json_object_get(o, "rounds")) {
        ty = json_object_get(o, "reference") ? CLLM_SAMPLE_REF_QA : CLLM_SAMPLE_CONVERSATION;
    } else if (json_object_get(o, "instruct") || json_object_get(o, "instruction")) {
        ty = CLLM_SAMPLE_INSTRUCT;
    } else if (json_object_get(o, "text")) {
        ty = CLLM_SAMPLE_PRETRAIN;
    } else {
        st = bad(&r, NULL,
                 "cannot tell the record's format: expected \"type\" or one of the fields text, instruct/instruction, "
                 "rounds, input_ids%s%s",
                 "", "");
        goto done;
    }
    s->type = (cllm_sample_type)ty;
    const char *a, *b;
    size_t la, lb;
    switch (s->type) {
    case CLLM_SAMPLE_TOKENS: st = parse_tokens(s, &r, o, vocab_size); break;
    case CLLM_SAMPLE_PRETRAIN:
        if ((st = get_text(&r, o, "text", &a, &la))) break;
        st = cllm_sample_from_text(s, a, la, t);
        break;
    case CLLM_SAMPLE_INSTRUCT: {
        const char *ikey = json_object_get(o, "instruct") ? "instruct" : "instruction";
        if ((st = get_text(&r, o, ikey, &a, &la))) break;
        const json_t *in = json_object_get(o, "input");
        if (in && !json_is_null(in) && !json_is_string(in)) {
            st = bad(&r, "input", "field \"input\" must be a string%s%s", "", "");
            break;
        }
        const char *inp = in && json_is_string(in) ? json_string_value(in) : "";
        size_t inp_len = in && json_is_string(in) ? json_string_length(in) : 0;
        if ((st = get_text(&r, o, "output", &b, &lb))) break;
        if ((st = begin(s, t))) break;
        if (!st) st = push_str(s, false, t->system);
        if (!st)
            st = push_instruct_prompt(s, inp_len ? t->instruct_input : t->instruct, a, la, inp, inp_len);
        if (!st) st = push_seg(s, CLLM_SEG_TEXT, true, b, lb);
        if (!st && t->eos) st = push_seg(s, CLLM_SEG_EOS, true, NULL, 0);
        break;
    }
    case CLLM_SAMPLE_REF_QA:
        if ((st = get_text(&r, o, "reference", &a, &la))) break;
        if ((st = begin(s, t))) break;
        st = push_str(s, false, t->system);
        if (!st) st = push_str(s, false, t->reference_prefix);
        if (!st) st = push_seg(s, CLLM_SEG_TEXT, false, a, la);
        if (!st) st = push_str(s, false, t->reference_suffix);
        if (!st) st = render_rounds(s, &r, o, t);
        break;
    case CLLM_SAMPLE_CONVERSATION:
        if ((st = begin(s, t))) break;
        st = push_str(s, false, t->system);
        if (!st) st = render_rounds(s, &r, o, t);
        break;
    case CLLM_SAMPLE_TYPE_COUNT: st = CLLM_FAIL(CLLM_ERR_INTERNAL, "bad sample type"); break;
    }
done:
    json_decref(o);
    return st;
}

cllm_status cllm_sample_from_text(cllm_sample *s, const char *text, size_t len, const cllm_template *t) {
    reset(s);
    s->type = CLLM_SAMPLE_PRETRAIN;
    if (len == 0) return CLLM_FAIL(CLLM_ERR_FORMAT, "empty text");
    cllm_status st = begin(s, t);
    if (!st) st = push_seg(s, CLLM_SEG_TEXT, true, text, len);
    if (!st && t->eos) st = push_seg(s, CLLM_SEG_EOS, true, NULL, 0);
    return st;
}
