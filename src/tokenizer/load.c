/*
 * Loading a tokenizer: reads tokenizer.json (and tokenizer_config.json when
 * present) with jansson and builds the vocabulary tables, the merge table,
 * the added-token tries and the component trees. Also the small accessors.
 *
 * What is checked here, so that encode never has to: ids are in
 * [0, TK_MAX_ID], every component type is one we implement (otherwise
 * CLLM_ERR_UNSUPPORTED naming it), regexes compile, a ByteLevel
 * pre-tokenizer is the last step of a Sequence. Merges whose parts or
 * result are not in the vocabulary are ignored (they can never apply).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "tokenizer/tok_impl.h"

#define TK_MAX_ID (1 << 24) /* 16.7 M tokens: far above any real vocabulary */
#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct {
    const char *file; /* for messages */
    cllm_tokenizer *tok;
} ctx;

#define NOMEM() CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory loading %s", c->file)

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Optional string member: NULL if absent or null; error if another type. */
static cllm_status opt_str(const ctx *c, const json_t *o, const char *key, const char *where, const char **out,
                           size_t *len) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (len) *len = 0;
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_string(v)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s.%s must be a string", c->file, where, key);
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    return CLLM_OK;
}

static cllm_status opt_bool(const ctx *c, const json_t *o, const char *key, const char *where, bool *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_boolean(v)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s.%s must be true or false", c->file, where, key);
    *out = json_is_true(v);
    return CLLM_OK;
}

static cllm_status get_id(const ctx *c, const json_t *v, const char *what, int32_t *out) {
    double d;
    if (json_is_integer(v)) d = (double)json_integer_value(v);
    else if (json_is_real(v)) d = json_real_value(v);
    else return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s must be an integer id", c->file, what);
    if (!(d >= 0 && d <= TK_MAX_ID) || d != floor(d))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s = %g is not an id in [0, %d]", c->file, what, d, TK_MAX_ID);
    *out = (int32_t)d;
    return CLLM_OK;
}

static const char *type_of(const json_t *o) {
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* Reads {"String": s} or {"Regex": r} into a compiled regex. */
static cllm_status parse_pattern(const ctx *c, const json_t *o, const char *where, tk_regex *re, char **lit,
                                 size_t *lit_len) {
    json_t *p = json_object_get(o, "pattern");
    json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL;
    json_t *r = json_is_object(p) ? json_object_get(p, "Regex") : NULL;
    char what[160];
    snprintf(what, sizeof what, "%s: %s pattern", c->file, where);
    if (json_is_string(s)) {
        if (lit) {
            *lit = dup_n(json_string_value(s), json_string_length(s));
            if (!*lit) return NOMEM();
            *lit_len = json_string_length(s);
            return CLLM_OK;
        }
        return tk_regex_compile(re, json_string_value(s), json_string_length(s), true, what);
    }
    if (json_is_string(r)) return tk_regex_compile(re, json_string_value(r), json_string_length(r), false, what);
    return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s needs \"pattern\": {\"String\": ...} or {\"Regex\": ...}", c->file, where);
}

/* ---- normalizer ---- */

static cllm_status parse_norm(const ctx *c, const json_t *o, tk_norm *n) {
    memset(n, 0, sizeof *n);
    const char *t = type_of(o);
    if (!json_is_object(o) || !t) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: normalizer without a \"type\"", c->file);
    cllm_status st;
    if (strcmp(t, "Sequence") == 0) {
        n->kind = NORM_SEQ;
        json_t *a = json_object_get(o, "normalizers");
        if (!json_is_array(a)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: normalizer Sequence needs \"normalizers\"", c->file);
        n->kids = calloc(json_array_size(a) + 1, sizeof *n->kids);
        if (!n->kids) return NOMEM();
        for (size_t i = 0; i < json_array_size(a); i++) {
            st = parse_norm(c, json_array_get(a, i), &n->kids[i]);
            n->n_kids = i + 1;
            if (st) return st;
        }
        return CLLM_OK;
    }
    if (strcmp(t, "Prepend") == 0) {
        const char *s;
        size_t len;
        n->kind = NORM_PREPEND;
        if ((st = opt_str(c, o, "prepend", "normalizer Prepend", &s, &len))) return st;
        n->a = dup_n(s ? s : "", len);
        n->a_len = len;
        return n->a ? CLLM_OK : NOMEM();
    }
    if (strcmp(t, "Replace") == 0) {
        const char *s;
        size_t len;
        n->kind = NORM_REPLACE;
        if ((st = opt_str(c, o, "content", "normalizer Replace", &s, &len))) return st;
        n->b = dup_n(s ? s : "", len);
        n->b_len = len;
        if (!n->b) return NOMEM();
        json_t *p = json_object_get(o, "pattern");
        n->use_re = json_is_object(p) && json_object_get(p, "Regex");
        return parse_pattern(c, o, "normalizer Replace", &n->re, n->use_re ? NULL : &n->a, &n->a_len);
    }
    if (strcmp(t, "Strip") == 0) {
        n->kind = NORM_STRIP;
        n->strip_left = n->strip_right = true;
        if ((st = opt_bool(c, o, "strip_left", "normalizer Strip", &n->strip_left))) return st;
        return opt_bool(c, o, "strip_right", "normalizer Strip", &n->strip_right);
    }
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int f = 0; f < 4; f++)
        if (strcmp(t, forms[f]) == 0) {
            n->kind = NORM_UNICODE;
            n->form = (tk_norm_form)f;
            return CLLM_OK;
        }
    if (strcmp(t, "Lowercase") == 0) {
        n->kind = NORM_LOWERCASE;
        return CLLM_OK;
    }
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                     "%s: normalizer type '%s' is not supported (supported: Sequence, Prepend, Replace, Strip, NFC, "
                     "NFD, NFKC, NFKD, Lowercase)",
                     c->file, t);
}

/* ---- pre-tokenizer ---- */

static cllm_status parse_pretok(const ctx *c, const json_t *o, tk_pretok *p) {
    memset(p, 0, sizeof *p);
    const char *t = type_of(o);
    if (!json_is_object(o) || !t) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: pre_tokenizer without a \"type\"", c->file);
    cllm_status st;
    p->kind = PT_SPLIT;
    if (strcmp(t, "Sequence") == 0) {
        p->kind = PT_SEQ;
        json_t *a = json_object_get(o, "pretokenizers");
        if (!json_is_array(a))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: pre_tokenizer Sequence needs \"pretokenizers\"", c->file);
        p->kids = calloc(json_array_size(a) + 1, sizeof *p->kids);
        if (!p->kids) return NOMEM();
        for (size_t i = 0; i < json_array_size(a); i++) {
            st = parse_pretok(c, json_array_get(a, i), &p->kids[i]);
            p->n_kids = i + 1;
            if (st) return st;
            if (p->kids[i].kind == PT_BYTELEVEL && i + 1 < json_array_size(a))
                return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                                 "%s: a ByteLevel pre-tokenizer must be the last step of its Sequence", c->file);
        }
        return CLLM_OK;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        p->kind = PT_BYTELEVEL;
        p->add_prefix_space = true;
        p->use_regex = true;
        if ((st = opt_bool(c, o, "add_prefix_space", "pre_tokenizer ByteLevel", &p->add_prefix_space))) return st;
        if ((st = opt_bool(c, o, "use_regex", "pre_tokenizer ByteLevel", &p->use_regex))) return st;
        c->tok->byte_level = true;
        if (!p->use_regex) return CLLM_OK;
        return tk_regex_compile(&p->re, GPT2_PATTERN, strlen(GPT2_PATTERN), false, "ByteLevel");
    }
    if (strcmp(t, "Split") == 0) {
        const char *b;
        if ((st = opt_str(c, o, "behavior", "pre_tokenizer Split", &b, NULL))) return st;
        if ((st = opt_bool(c, o, "invert", "pre_tokenizer Split", &p->invert))) return st;
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        size_t k = 0;
        while (b && k < 5 && strcmp(b, names[k]) != 0) k++;
        if (!b || k == 5)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: pre_tokenizer Split has unknown behavior '%s'", c->file,
                             b ? b : "(missing)");
        p->behavior = (tk_split_behavior)k;
        return parse_pattern(c, o, "pre_tokenizer Split", &p->re, NULL, NULL);
    }
    if (strcmp(t, "Metaspace") == 0) {
        const char *r, *scheme;
        size_t rl;
        p->kind = PT_METASPACE;
        if ((st = opt_str(c, o, "replacement", "pre_tokenizer Metaspace", &r, &rl))) return st;
        if (!r) r = "\xE2\x96\x81", rl = 3;
        if (rl == 0 || rl >= sizeof p->rep)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: Metaspace replacement must be one character", c->file);
        memcpy(p->rep, r, rl);
        p->rep_len = rl;
        p->split = true;
        if ((st = opt_bool(c, o, "split", "pre_tokenizer Metaspace", &p->split))) return st;
        if ((st = opt_str(c, o, "prepend_scheme", "pre_tokenizer Metaspace", &scheme, NULL))) return st;
        p->scheme = PREPEND_ALWAYS;
        if (scheme) {
            if (strcmp(scheme, "always") == 0) p->scheme = PREPEND_ALWAYS;
            else if (strcmp(scheme, "first") == 0) p->scheme = PREPEND_FIRST;
            else if (strcmp(scheme, "never") == 0) p->scheme = PREPEND_NEVER;
            else return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: unknown Metaspace prepend_scheme '%s'", c->file, scheme);
        } else {
            bool add = true;
            if ((st = opt_bool(c, o, "add_prefix_space", "pre_tokenizer Metaspace", &add))) return st;
            p->scheme = add ? PREPEND_ALWAYS : PREPEND_NEVER;
        }
        return CLLM_OK;
    }
    if (strcmp(t, "Digits") == 0) {
        bool individual = false;
        if ((st = opt_bool(c, o, "individual_digits", "pre_tokenizer Digits", &individual))) return st;
        p->behavior = individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        return tk_regex_compile(&p->re, "\\p{N}", 5, false, "Digits");
    }
    if (strcmp(t, "Whitespace") == 0) {
        p->behavior = SPLIT_REMOVED;
        p->invert = true;
        return tk_regex_compile(&p->re, "\\w+|[^\\w\\s]+", 13, false, "Whitespace");
    }
    if (strcmp(t, "WhitespaceSplit") == 0) {
        p->behavior = SPLIT_REMOVED;
        return tk_regex_compile(&p->re, "\\s+", 3, false, "WhitespaceSplit");
    }
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                     "%s: pre_tokenizer type '%s' is not supported (supported: ByteLevel, Split, Metaspace, Digits, "
                     "Whitespace, WhitespaceSplit, Sequence)",
                     c->file, t);
}

/* ---- decoder ---- */

static cllm_status parse_dec(const ctx *c, const json_t *o, tk_dec *d) {
    memset(d, 0, sizeof *d);
    const char *t = type_of(o);
    if (!json_is_object(o) || !t) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: decoder without a \"type\"", c->file);
    cllm_status st;
    if (strcmp(t, "Sequence") == 0) {
        d->kind = DEC_SEQ;
        json_t *a = json_object_get(o, "decoders");
        if (!json_is_array(a)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: decoder Sequence needs \"decoders\"", c->file);
        d->kids = calloc(json_array_size(a) + 1, sizeof *d->kids);
        if (!d->kids) return NOMEM();
        for (size_t i = 0; i < json_array_size(a); i++) {
            st = parse_dec(c, json_array_get(a, i), &d->kids[i]);
            d->n_kids = i + 1;
            if (st) return st;
        }
        return CLLM_OK;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        d->kind = DEC_BYTELEVEL;
        return CLLM_OK;
    }
    if (strcmp(t, "ByteFallback") == 0) {
        d->kind = DEC_BYTEFALLBACK;
        return CLLM_OK;
    }
    if (strcmp(t, "Fuse") == 0) {
        d->kind = DEC_FUSE;
        return CLLM_OK;
    }
    if (strcmp(t, "Replace") == 0) {
        const char *s;
        size_t len;
        d->kind = DEC_REPLACE;
        json_t *p = json_object_get(o, "pattern");
        if (!json_is_object(p) || !json_is_string(json_object_get(p, "String")))
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: decoder Replace supports only {\"String\": ...} patterns",
                             c->file);
        if ((st = opt_str(c, o, "content", "decoder Replace", &s, &len))) return st;
        d->b = dup_n(s ? s : "", len);
        d->b_len = len;
        if (!d->b) return NOMEM();
        return parse_pattern(c, o, "decoder Replace", NULL, &d->a, &d->a_len);
    }
    if (strcmp(t, "Strip") == 0) {
        const char *s;
        size_t len;
        d->kind = DEC_STRIP;
        if ((st = opt_str(c, o, "content", "decoder Strip", &s, &len))) return st;
        d->a = dup_n(s ? s : " ", s ? len : 1);
        d->a_len = s ? len : 1;
        if (!d->a) return NOMEM();
        json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        json_int_t sa = json_is_integer(a) ? json_integer_value(a) : 0, sb = json_is_integer(b) ? json_integer_value(b) : 0;
        if (sa < 0 || sb < 0 || sa > 1000000 || sb > 1000000)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: decoder Strip start/stop out of range", c->file);
        d->start = (size_t)sa;
        d->stop = (size_t)sb;
        return CLLM_OK;
    }
    if (strcmp(t, "Metaspace") == 0) {
        const char *r, *scheme;
        size_t rl;
        d->kind = DEC_METASPACE;
        if ((st = opt_str(c, o, "replacement", "decoder Metaspace", &r, &rl))) return st;
        if (!r) r = "\xE2\x96\x81", rl = 3;
        if (rl == 0 || rl >= sizeof d->rep)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: Metaspace replacement must be one character", c->file);
        memcpy(d->rep, r, rl);
        d->rep_len = rl;
        if ((st = opt_str(c, o, "prepend_scheme", "decoder Metaspace", &scheme, NULL))) return st;
        d->strip_first = true;
        if (scheme) {
            d->strip_first = strcmp(scheme, "never") != 0;
        } else {
            bool add = true;
            if ((st = opt_bool(c, o, "add_prefix_space", "decoder Metaspace", &add))) return st;
            d->strip_first = add;
        }
        return CLLM_OK;
    }
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                     "%s: decoder type '%s' is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, "
                     "Strip, Metaspace, Sequence)",
                     c->file, t);
}

/* ---- post-processor: resolved to ids before and after the sequence ---- */

static bool ids_append(int32_t **v, size_t *n, int32_t id) {
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p) return false;
    p[(*n)++] = id;
    *v = p;
    return true;
}

static cllm_status parse_post(const ctx *c, const json_t *o, int32_t **pre, size_t *n_pre, int32_t **post,
                              size_t *n_post) {
    cllm_tokenizer *tok = c->tok;
    const char *t = type_of(o);
    if (!json_is_object(o) || !t) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: post_processor without a \"type\"", c->file);
    if (strcmp(t, "ByteLevel") == 0) return CLLM_OK;
    if (strcmp(t, "Sequence") == 0) {
        json_t *a = json_object_get(o, "processors");
        if (!json_is_array(a))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: post_processor Sequence needs \"processors\"", c->file);
        for (size_t i = 0; i < json_array_size(a); i++) {
            /* a later processor wraps the result of the earlier ones */
            int32_t *p2 = NULL, *q2 = NULL;
            size_t np = 0, nq = 0;
            cllm_status st = parse_post(c, json_array_get(a, i), &p2, &np, &q2, &nq);
            for (size_t k = 0; st == CLLM_OK && k < *n_pre; k++)
                if (!ids_append(&p2, &np, (*pre)[k])) st = NOMEM();
            for (size_t k = 0; st == CLLM_OK && k < nq; k++)
                if (!ids_append(post, n_post, q2[k])) st = NOMEM();
            free(*pre);
            *pre = p2;
            *n_pre = np;
            free(q2);
            if (st) return st;
        }
        return CLLM_OK;
    }
    if (strcmp(t, "BertProcessing") == 0 || strcmp(t, "RobertaProcessing") == 0) {
        json_t *cls = json_object_get(o, "cls"), *sep = json_object_get(o, "sep");
        int32_t a, b;
        if (!json_is_array(cls) || !json_is_array(sep))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: %s needs cls and sep", c->file, t);
        cllm_status st = get_id(c, json_array_get(cls, 1), "post_processor cls", &a);
        if (!st) st = get_id(c, json_array_get(sep, 1), "post_processor sep", &b);
        if (st) return st;
        return ids_append(pre, n_pre, a) && ids_append(post, n_post, b) ? CLLM_OK : NOMEM();
    }
    if (strcmp(t, "TemplateProcessing") == 0) {
        json_t *single = json_object_get(o, "single"), *sp = json_object_get(o, "special_tokens");
        if (!json_is_array(single))
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: TemplateProcessing needs a \"single\" template", c->file);
        bool seen_a = false;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i), *s;
            if (json_is_object(s = json_object_get(it, "Sequence"))) {
                if (seen_a)
                    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: TemplateProcessing single template repeats $A",
                                     c->file);
                seen_a = true;
                continue;
            }
            s = json_object_get(it, "SpecialToken");
            json_t *name = json_object_get(s, "id");
            if (!json_is_string(name))
                return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: TemplateProcessing item %zu is neither Sequence nor SpecialToken",
                                 c->file, i);
            json_t *ids = json_object_get(json_object_get(sp, json_string_value(name)), "ids");
            int32_t **dst = seen_a ? post : pre;
            size_t *ndst = seen_a ? n_post : n_pre;
            if (json_is_array(ids)) {
                for (size_t k = 0; k < json_array_size(ids); k++) {
                    int32_t id;
                    cllm_status st = get_id(c, json_array_get(ids, k), "TemplateProcessing special token id", &id);
                    if (st) return st;
                    if (!ids_append(dst, ndst, id)) return NOMEM();
                }
            } else {
                int32_t id = tk_strmap_get(&tok->vocab, json_string_value(name), json_string_length(name));
                if (id < 0)
                    return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: TemplateProcessing special token '%s' is not in the vocabulary",
                                     c->file, json_string_value(name));
                if (!ids_append(dst, ndst, id)) return NOMEM();
            }
        }
        return CLLM_OK;
    }
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                     "%s: post_processor type '%s' is not supported (supported: TemplateProcessing, ByteLevel, "
                     "BertProcessing, RobertaProcessing, Sequence)",
                     c->file, t);
}

/* ---- model ---- */

static cllm_status set_token(const ctx *c, int32_t id, const char *s, size_t n) {
    cllm_tokenizer *tok = c->tok;
    if (tok->tok_arena.n > UINT32_MAX - n - 1) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: vocabulary too large", c->file);
    tok->tok_off[id] = (uint32_t)tok->tok_arena.n;
    tok->tok_len[id] = (uint32_t)n;
    if (!tk_str_put(&tok->tok_arena, s, n) || !tk_str_put(&tok->tok_arena, "", 1)) return NOMEM();
    return CLLM_OK;
}

static cllm_status parse_model(const ctx *c, const json_t *root) {
    cllm_tokenizer *tok = c->tok;
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: missing \"model\" object", c->file);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    const char *t = type_of(m);
    if (!t) t = merges ? "BPE" : json_is_array(vocab) ? "Unigram" : "WordPiece";
    if (strcmp(t, "BPE") != 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", c->file, t);
    if (!json_is_object(vocab)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: model.vocab must be an object", c->file);
    if (!json_is_array(merges)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: model.merges must be an array", c->file);
    if (json_object_size(vocab) == 0)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: model.vocab is empty: this tokenizer cannot encode any text",
                         c->file);
    cllm_status st;
    const char *s;
    size_t sl;
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        if ((st = opt_str(c, m, affixes[k], "model", &s, &sl))) return st;
        if (s && sl) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: model.%s '%s' is not supported", c->file, affixes[k], s);
    }
    json_t *dropout = json_object_get(m, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", c->file);
    if ((st = opt_bool(c, m, "fuse_unk", "model", &tok->fuse_unk)) ||
        (st = opt_bool(c, m, "byte_fallback", "model", &tok->byte_fallback)) ||
        (st = opt_bool(c, m, "ignore_merges", "model", &tok->ignore_merges)))
        return st;

    /* vocabulary, plus the ids of added tokens for the table size */
    int32_t max_id = -1;
    const char *key;
    json_t *val;
    if (!tk_strmap_init(&tok->vocab, json_object_size(vocab) + 1024)) return NOMEM();
    json_object_foreach(vocab, key, val) {
        int32_t id;
        if ((st = get_id(c, val, "model.vocab entry", &id)))
            return cllm_fail_context(st, "token \"%.40s\"", key);
        if (!tk_strmap_put(&tok->vocab, key, strlen(key), id)) return NOMEM();
        if (id > max_id) max_id = id;
    }
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        int32_t id;
        if ((st = get_id(c, json_object_get(json_array_get(added, i), "id"), "added_tokens[].id", &id))) return st;
        if (id > max_id) max_id = id;
    }
    tok->n_ids = max_id + 1;
    size_t nid = (size_t)tok->n_ids + 1;
    tok->tok_off = malloc(nid * sizeof *tok->tok_off);
    tok->tok_len = calloc(nid, sizeof *tok->tok_len);
    tok->tok_flags = calloc(nid, 1);
    tok->cp_id = malloc(0x10000 * sizeof *tok->cp_id);
    if (!tok->tok_off || !tok->tok_len || !tok->tok_flags || !tok->cp_id) return NOMEM();
    memset(tok->tok_off, 0xFF, nid * sizeof *tok->tok_off);
    memset(tok->cp_id, 0xFF, 0x10000 * sizeof *tok->cp_id);
    for (size_t i = 0; i < tok->vocab.n; i++) {
        const tk_ent *e = &tok->vocab.ents[i];
        const char *k = tok->vocab.keys.p + e->off;
        if ((st = set_token(c, e->val, k, e->len))) return st;
        uint32_t cp;
        if (e->len && tk_utf8_next(k, e->len, &cp) == e->len && cp < 0x10000) tok->cp_id[cp] = e->val;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_fb[b] = tk_strmap_get(&tok->vocab, name, 6);
        size_t k = tk_utf8_put(name, tk_byte_to_cp((uint8_t)b));
        tok->byte_id[b] = tk_strmap_get(&tok->vocab, name, k);
    }
    /* may SentencePiece-style words be cut before U+2581? Only if no token
     * has it right after another character (then no merge crosses a cut) */
    if (tk_strmap_get(&tok->vocab, "\xE2\x96\x81", 3) >= 0) {
        bool safe = true;
        for (size_t i = 0; i < tok->vocab.n && safe; i++) {
            const tk_ent *e = &tok->vocab.ents[i];
            const char *k = tok->vocab.keys.p + e->off;
            for (size_t j = 1; j + 3 <= e->len && safe; j++)
                if (memcmp(k + j, "\xE2\x96\x81", 3) == 0 && !(j >= 3 && memcmp(k + j - 3, "\xE2\x96\x81", 3) == 0))
                    safe = false;
        }
        if (safe) {
            memcpy(tok->cut, "\xE2\x96\x81", 3);
            tok->cut_len = 3;
        }
    }
    if ((st = opt_str(c, m, "unk_token", "model", &s, &sl))) return st;
    tok->model_unk = s ? tk_strmap_get(&tok->vocab, s, sl) : -1;

    /* merges: "a b" strings or ["a", "b"] pairs; rank = position */
    size_t nm = json_array_size(merges);
    if (!tk_pairmap_init(&tok->merges, nm + 1)) return NOMEM();
    tk_str both = {0};
    for (size_t r = 0; r < nm; r++) {
        json_t *e = json_array_get(merges, r);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp) {
                tk_str_free(&both);
                return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: model.merges[%zu] \"%s\" is not \"a b\"", c->file, r, a);
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = json_string_length(e) - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            tk_str_free(&both);
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", c->file, r);
        }
        int32_t ia = tk_strmap_get(&tok->vocab, a, al), ib = tk_strmap_get(&tok->vocab, b, bl);
        both.n = 0;
        if (!tk_str_put(&both, a, al) || !tk_str_put(&both, b, bl)) {
            tk_str_free(&both);
            return NOMEM();
        }
        int32_t im = tk_strmap_get(&tok->vocab, both.p, both.n);
        if (ia >= 0 && ib >= 0 && im >= 0) tk_pairmap_put(&tok->merges, ia, ib, (uint32_t)r, im);
    }
    tk_str_free(&both);
    return CLLM_OK;
}

static cllm_status parse_added(const ctx *c, const json_t *root) {
    cllm_tokenizer *tok = c->tok;
    json_t *added = json_object_get(root, "added_tokens");
    if (!added || json_is_null(added)) return CLLM_OK;
    if (!json_is_array(added)) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: added_tokens must be an array", c->file);
    size_t n = json_array_size(added);
    tok->added = calloc(n + 1, sizeof *tok->added);
    if (!tok->added) return NOMEM();
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(added, i);
        tk_added *a = &tok->added[i];
        const char *s;
        size_t sl;
        cllm_status st;
        tok->n_added = i + 1;
        if ((st = get_id(c, json_object_get(o, "id"), "added_tokens[].id", &a->id))) return st;
        if ((st = opt_str(c, o, "content", "added_tokens[]", &s, &sl))) return st;
        if (!s) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: added_tokens[%zu] has no content", c->file, i);
        if (!(a->content = dup_n(s, sl))) return NOMEM();
        a->len = sl;
        if ((st = opt_bool(c, o, "special", "added_tokens[]", &a->special))) return st;
        a->normalized = !a->special;
        if ((st = opt_bool(c, o, "lstrip", "added_tokens[]", &a->lstrip)) ||
            (st = opt_bool(c, o, "rstrip", "added_tokens[]", &a->rstrip)) ||
            (st = opt_bool(c, o, "single_word", "added_tokens[]", &a->single_word)) ||
            (st = opt_bool(c, o, "normalized", "added_tokens[]", &a->normalized)))
            return st;
        if (!tk_strmap_put(&tok->vocab, s, sl, a->id)) return NOMEM();
        if ((st = set_token(c, a->id, s, sl))) return st;
        tok->tok_flags[a->id] |= TK_F_ADDED | (a->special ? TK_F_SPECIAL : 0);
        bool norm = a->normalized && tok->norm;
        tok->has_norm_added |= norm;
        if (!tk_trie_add(norm ? &tok->trie_norm : &tok->trie_raw, s, sl, (int32_t)i)) return NOMEM();
    }
    return CLLM_OK;
}

/* ---- tokenizer_config.json ---- */

/* bos_token etc.: a string, {"content": ...} or null. Returns the id or -1. */
static int32_t config_token(const cllm_tokenizer *tok, const json_t *cfg, const char *key, bool *present) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    *present = v != NULL;
    if (!json_is_string(v)) return -1;
    return tk_strmap_get(&tok->vocab, json_string_value(v), json_string_length(v));
}

cllm_status tk_json_load(json_t **out, const char *file, size_t flags, bool optional) {
    FILE *f = fopen(file, "rb");
    *out = NULL;
    if (!f) {
        if (optional && errno == ENOENT) return CLLM_OK;
        return CLLM_FAIL(CLLM_ERR_IO, "%s: %s", file, strerror(errno));
    }
    /* read the whole file, then parse from memory: jansson's FILE reader
     * goes through getc and is several times slower */
    tk_str buf = {0};
    char chunk[1 << 16];
    size_t got;
    bool ok = true;
    while (ok && (got = fread(chunk, 1, sizeof chunk, f)) > 0) ok = tk_str_put(&buf, chunk, got);
    bool rerr = ferror(f);
    fclose(f);
    if (!ok) {
        tk_str_free(&buf);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory", file);
    }
    if (rerr) {
        tk_str_free(&buf);
        return CLLM_FAIL(CLLM_ERR_IO, "%s: read error", file);
    }
    json_error_t err;
    *out = json_loadb(buf.p ? buf.p : "", buf.n, flags | JSON_ALLOW_NUL, &err);
    tk_str_free(&buf);
    if (!*out) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d:%d: %s", file, err.line, err.column, err.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: the top level must be a JSON object", file);
    }
    return CLLM_OK;
}

static cllm_status parse_config(const ctx *c, const json_t *cfg) {
    cllm_tokenizer *tok = c->tok;
    bool present, bos_p, eos_p;
    tok->bos = config_token(tok, cfg, "bos_token", &bos_p);
    tok->eos = config_token(tok, cfg, "eos_token", &eos_p);
    tok->pad = config_token(tok, cfg, "pad_token", &present);
    tok->unk = config_token(tok, cfg, "unk_token", &present);
    if (!present) tok->unk = tok->model_unk;
    if (!bos_p && !eos_p) {
        int32_t eot = tk_strmap_get(&tok->vocab, "<|endoftext|>", 13);
        if (eot >= 0 && (tok->tok_flags[eot] & TK_F_SPECIAL)) tok->bos = tok->eos = eot;
    }
    json_t *ml = json_object_get(cfg, "model_max_length");
    tok->max_len = -1;
    if (json_is_number(ml)) {
        double d = json_number_value(ml);
        /* compare before converting: casting a double >= 2^63 is undefined */
        tok->max_len = d >= 9223372036854775807.0 ? INT64_MAX : d <= 0 ? 0 : (int64_t)d;
    }
    json_t *extra = json_object_get(cfg, "additional_special_tokens");
    for (size_t i = 0; json_is_array(extra) && i < json_array_size(extra); i++) {
        json_t *v = json_array_get(extra, i);
        if (json_is_object(v)) v = json_object_get(v, "content");
        int32_t id = json_is_string(v) ? tk_strmap_get(&tok->vocab, json_string_value(v), json_string_length(v)) : -1;
        if (id >= 0) tok->tok_flags[id] |= TK_F_SPECIAL;
    }
    json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    if (json_is_boolean(ab) || json_is_boolean(ae)) {
        bool add_bos = json_is_boolean(ab) ? json_is_true(ab) : true;
        bool add_eos = json_is_boolean(ae) ? json_is_true(ae) : false;
        tok->n_pre = tok->n_post = 0;
        if (add_bos && tok->bos >= 0 && !ids_append(&tok->pre_ids, &tok->n_pre, tok->bos)) return NOMEM();
        if (add_eos && tok->eos >= 0 && !ids_append(&tok->post_ids, &tok->n_post, tok->eos)) return NOMEM();
    }
    return CLLM_OK;
}

static cllm_status parse_all(const ctx *c, const json_t *root, const json_t *cfg) {
    cllm_tokenizer *tok = c->tok;
    cllm_status st;
    json_t *v;
    if ((st = parse_model(c, root))) return st;
    v = json_object_get(root, "normalizer");
    if (v && !json_is_null(v)) {
        if (!(tok->norm = calloc(1, sizeof *tok->norm))) return NOMEM();
        if ((st = parse_norm(c, v, tok->norm))) return st;
    }
    if ((st = parse_added(c, root))) return st;
    v = json_object_get(root, "pre_tokenizer");
    if (v && !json_is_null(v)) {
        if (!(tok->pretok = calloc(1, sizeof *tok->pretok))) return NOMEM();
        if ((st = parse_pretok(c, v, tok->pretok))) return st;
    }
    v = json_object_get(root, "post_processor");
    if (v && !json_is_null(v) && (st = parse_post(c, v, &tok->pre_ids, &tok->n_pre, &tok->post_ids, &tok->n_post)))
        return st;
    v = json_object_get(root, "decoder");
    if (v && !json_is_null(v)) {
        if (!(tok->dec = calloc(1, sizeof *tok->dec))) return NOMEM();
        if ((st = parse_dec(c, v, tok->dec))) return st;
    }
    for (size_t i = 0; i < tok->n_pre; i++)
        if (tok->pre_ids[i] >= tok->n_ids)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: post_processor id %d is outside the vocabulary", c->file, tok->pre_ids[i]);
    for (size_t i = 0; i < tok->n_post; i++)
        if (tok->post_ids[i] >= tok->n_ids)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: post_processor id %d is outside the vocabulary", c->file, tok->post_ids[i]);
    return parse_config(c, cfg);
}

cllm_status cllm_tokenizer_load(cllm_tokenizer **out, const char *path) {
    if (!out || !path) return CLLM_FAIL(CLLM_ERR_ARG, "out and path must not be NULL");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return CLLM_FAIL(CLLM_ERR_IO, "%s: %s", path, strerror(errno));
    size_t pl = strlen(path);
    char *file = malloc(pl + 32), *cfgfile = malloc(pl + 32);
    if (!file || !cfgfile) {
        free(file);
        free(cfgfile);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, pl + 32, "%s/tokenizer.json", path);
        snprintf(cfgfile, pl + 32, "%s/tokenizer_config.json", path);
    } else {
        memcpy(file, path, pl + 1);
        const char *slash = strrchr(path, '/');
        size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
        memcpy(cfgfile, path, dl);
        memcpy(cfgfile + dl, "tokenizer_config.json", 22);
    }
    json_t *root = NULL, *cfg = NULL;
    cllm_status st = tk_json_load(&root, file, 0, false);
    if (st) goto done;
    st = tk_json_load(&cfg, cfgfile, JSON_DECODE_INT_AS_REAL, true);
    if (st) goto done;
    st = tk_load_from_json(out, root, cfg, file);
done:
    json_decref(root);
    json_decref(cfg);
    free(file);
    free(cfgfile);
    return st;
}

cllm_status tk_load_from_json(cllm_tokenizer **out, const json_t *root, const json_t *cfg, const char *name) {
    *out = NULL;
    cllm_status st;
    cllm_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->pool = calloc(1, sizeof *tok->pool)) || !(tok->path = dup_n(name, strlen(name)))) {
        cllm_tokenizer_free(tok);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < TK_POOL; i++) atomic_flag_clear(&tok->pool->busy[i]);
    ctx c = {tok->path, tok};
    json_t *empty = cfg ? NULL : json_object();
    st = parse_all(&c, root, cfg ? cfg : empty);
    json_decref(empty);
    if (st) {
        cllm_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return CLLM_OK;
}

void cllm_tokenizer_free(cllm_tokenizer *tok) {
    if (!tok) return;
    if (tok->pool)
        for (int i = 0; i < TK_POOL; i++) tk_work_free(tok->pool->w[i]);
    free(tok->pool);
    tk_strmap_free(&tok->vocab);
    tk_str_free(&tok->tok_arena);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->tok_flags);
    free(tok->cp_id);
    tk_pairmap_free(&tok->merges);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    tk_trie_free(&tok->trie_raw);
    tk_trie_free(&tok->trie_norm);
    tk_norm_free(tok->norm);
    free(tok->norm);
    tk_pretok_free(tok->pretok);
    free(tok->pretok);
    tk_dec_free(tok->dec);
    free(tok->dec);
    free(tok->pre_ids);
    free(tok->post_ids);
    free(tok->path);
    free(tok);
}

/* ---- accessors ---- */

int32_t cllm_tokenizer_vocab_size(const cllm_tokenizer *tok) { return tok->n_ids; }
int32_t cllm_tokenizer_bos_id(const cllm_tokenizer *tok) { return tok->bos; }
int32_t cllm_tokenizer_eos_id(const cllm_tokenizer *tok) { return tok->eos; }
int32_t cllm_tokenizer_pad_id(const cllm_tokenizer *tok) { return tok->pad; }
int32_t cllm_tokenizer_unk_id(const cllm_tokenizer *tok) { return tok->unk; }
int64_t cllm_tokenizer_model_max_length(const cllm_tokenizer *tok) { return tok->max_len; }

const char *cllm_tokenizer_id_to_token(const cllm_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_ids || tok->tok_off[id] == UINT32_MAX) return NULL;
    if (len) *len = tok->tok_len[id];
    return tok->tok_arena.p + tok->tok_off[id];
}

int32_t cllm_tokenizer_token_to_id(const cllm_tokenizer *tok, const char *token, size_t len) {
    return tk_strmap_get(&tok->vocab, token, len);
}

bool cllm_tokenizer_is_special(const cllm_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->tok_flags[id] & TK_F_SPECIAL);
}
