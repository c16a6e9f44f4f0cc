/*
 * LoraConfig: the "lora" section of a training config and PEFT's
 * adapter_config.json, parsed by one reader into cllm_lora_config, plus
 * module matching (target lists, regular expressions through PCRE2, the
 * rank and alpha patterns) shared by attaching and counting.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/lora.h"
#include "lora_impl.h"

#define TRY(x)                          \
    do {                                \
        cllm_status st_ = (x);          \
        if (st_ != CLLM_OK) return st_; \
    } while (0)

void cllm_lora_config_default(cllm_lora_config *c) {
    memset(c, 0, sizeof *c);
    c->r = 8;
    c->lora_alpha = 8;
}

static void free_strs(char **s, int n) {
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

static void free_patterns(cllm_lora_pattern *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].pattern);
    free(p);
}

void cllm_lora_config_free(cllm_lora_config *c) {
    if (!c) return;
    free_strs(c->targets, c->n_targets);
    free(c->target_regex);
    free_strs(c->modules_to_save, c->n_modules_to_save);
    free(c->layers_to_transform);
    free_strs(c->layers_pattern, c->n_layers_pattern);
    free_patterns(c->rank_pattern, c->n_rank_pattern);
    free_patterns(c->alpha_pattern, c->n_alpha_pattern);
    free(c->base_model_name_or_path);
    bool en = c->enabled;
    cllm_lora_config_default(c);
    c->enabled = en;
}

static char *dup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char **dup_strs(char *const *s, int n, bool *ok) {
    if (!n) return NULL;
    char **d = calloc((size_t)n, sizeof *d);
    if (!d) return *ok = false, NULL;
    for (int i = 0; i < n; i++)
        if (!(d[i] = dup(s[i]))) *ok = false;
    return d;
}

static cllm_lora_pattern *dup_patterns(const cllm_lora_pattern *p, int n, bool *ok) {
    if (!n) return NULL;
    cllm_lora_pattern *d = calloc((size_t)n, sizeof *d);
    if (!d) return *ok = false, NULL;
    for (int i = 0; i < n; i++) {
        d[i].value = p[i].value;
        if (!(d[i].pattern = dup(p[i].pattern))) *ok = false;
    }
    return d;
}

cllm_status cllm_lora_config_copy(cllm_lora_config *dst, const cllm_lora_config *src) {
    bool ok = true;
    *dst = *src;
    dst->targets = dup_strs(src->targets, src->n_targets, &ok);
    dst->target_regex = dup(src->target_regex);
    dst->modules_to_save = dup_strs(src->modules_to_save, src->n_modules_to_save, &ok);
    dst->layers_pattern = dup_strs(src->layers_pattern, src->n_layers_pattern, &ok);
    dst->rank_pattern = dup_patterns(src->rank_pattern, src->n_rank_pattern, &ok);
    dst->alpha_pattern = dup_patterns(src->alpha_pattern, src->n_alpha_pattern, &ok);
    dst->base_model_name_or_path = dup(src->base_model_name_or_path);
    dst->layers_to_transform = NULL;
    if (src->n_layers_to_transform) {
        dst->layers_to_transform = malloc((size_t)src->n_layers_to_transform * sizeof(int));
        if (dst->layers_to_transform)
            memcpy(dst->layers_to_transform, src->layers_to_transform, (size_t)src->n_layers_to_transform * sizeof(int));
        else
            ok = false;
    }
    if ((src->target_regex && !dst->target_regex) ||
        (src->base_model_name_or_path && !dst->base_model_name_or_path))
        ok = false;
    if (!ok) {
        cllm_lora_config_free(dst);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    return CLLM_OK;
}

cllm_status lora_config_add_saved(cllm_lora_config *c, const char *name) {
    for (int i = 0; i < c->n_modules_to_save; i++)
        if (!strcmp(c->modules_to_save[i], name)) return CLLM_OK;
    char **d = realloc(c->modules_to_save, (size_t)(c->n_modules_to_save + 1) * sizeof *d);
    if (!d) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    c->modules_to_save = d;
    if (!(d[c->n_modules_to_save] = dup(name))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    c->n_modules_to_save++;
    return CLLM_OK;
}

/* ------------------------------------------------------------- parsing */

#define KEYFMT "%s: %s.%s"

/* A list of strings or one string (PEFT accepts both for modules_to_save
 * and layers_pattern). */
static cllm_status get_strs(const json_t *v, char ***out, int *n, const char *where, const char *key,
                            const char *path) {
    free_strs(*out, *n);
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return CLLM_OK;
    size_t cnt = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a string or a list of strings", path, where, key);
    if (!cnt) return CLLM_OK;
    char **s = calloc(cnt, sizeof *s);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    *out = s;
    for (size_t i = 0; i < cnt; i++) {
        const json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(e) || !*json_string_value(e))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT "[%zu]: expected a non-empty string", path, where, key, i);
        if (!(s[i] = dup(json_string_value(e)))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        *n = (int)i + 1;
    }
    return CLLM_OK;
}

static cllm_status get_patterns(const json_t *v, cllm_lora_pattern **out, int *n, bool integer, const char *where,
                                const char *key, const char *path) {
    free_patterns(*out, *n);
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_object(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected an object {\"pattern\": value}", path, where, key);
    size_t cnt = json_object_size(v);
    if (!cnt) return CLLM_OK;
    cllm_lora_pattern *p = calloc(cnt, sizeof *p);
    if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    *out = p;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (!json_is_number(x) || !(json_number_value(x) > 0) ||
            (integer && json_number_value(x) != floor(json_number_value(x))))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ".%s: expected a positive %s", path, where, key, k,
                             integer ? "integer" : "number");
        if (!(p[*n].pattern = dup(k))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        p[*n].value = json_number_value(x);
        (*n)++;
    }
    return CLLM_OK;
}

/* Keys of LoraConfig that cllm reads. */
static const char *const known_keys[] = {
    "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "modules_to_save", "use_rslora", "fan_in_fan_out",
    "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern", "init_lora_weights", "task_type",
    "peft_type", "base_model_name_or_path", "inference_mode", NULL};
/* Keys PEFT writes into adapter_config.json that change nothing while they
 * hold their default (null, false, empty); anything else is refused. */
static const char *const peft_default_keys[] = {
    "use_dora", "layer_replication", "lora_bias", "exclude_modules", "trainable_token_indices", "target_parameters",
    "megatron_config", "loftq_config", "eva_config", "corda_config", "use_qalora", "runtime_config", "alora_invocation_tokens",
    "arrow_config", NULL};
/* Keys that describe the run, not the adapter: accepted with any value. */
static const char *const peft_info_keys[] = {"revision", "auto_mapping", "megatron_core", "ensure_weight_tying", "peft_version",
                                             NULL};

static bool in_list(const char *const *l, const char *k) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], k)) return true;
    return false;
}

static bool is_default_value(const json_t *v) {
    return json_is_null(v) || json_is_false(v) || (json_is_object(v) && !json_object_size(v)) ||
           (json_is_array(v) && !json_array_size(v)) || (json_is_string(v) && !*json_string_value(v));
}

static cllm_status check_keys(const json_t *obj, const char *where, const char *path, bool peft_file) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (in_list(known_keys, k)) continue;
        if (in_list(peft_info_keys, k)) continue; /* also in a printed config (cllm train --print-config) */
        if (peft_file && !strcmp(k, "qalora_group_size")) continue; /* a size, used only with use_qalora */
        if (in_list(peft_default_keys, k) || peft_file) {
            if (is_default_value(v)) continue;
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: %s.%s: not supported by cllm's LoRA (only its default: null, "
                             "false or empty)", path, where, k);
        }
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: unknown key '%s' (LoraConfig keys: r, lora_alpha, lora_dropout, "
                         "target_modules, bias, modules_to_save, use_rslora, fan_in_fan_out, layers_to_transform, "
                         "layers_pattern, rank_pattern, alpha_pattern, init_lora_weights)", path, where, k);
    }
    return CLLM_OK;
}

static bool regex_chars(const char *s) { return strpbrk(s, ".*+?[]()|^$\\{}") != NULL; }

cllm_status cllm_lora_config_set_targets(cllm_lora_config *c, const char *flag) {
    free_strs(c->targets, c->n_targets);
    free(c->target_regex);
    c->targets = NULL;
    c->n_targets = 0;
    c->target_regex = NULL;
    if (!flag || !*flag) return CLLM_FAIL(CLLM_ERR_ARG, "--lora-target: empty");
    if (!strcmp(flag, "all-linear")) {
        c->target_kind = CLLM_LORA_TARGET_ALL_LINEAR;
        return CLLM_OK;
    }
    if (regex_chars(flag)) {
        c->target_kind = CLLM_LORA_TARGET_REGEX;
        return (c->target_regex = dup(flag)) ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    int n = 1;
    for (const char *p = flag; *p; p++) n += *p == ',';
    c->targets = calloc((size_t)n, sizeof *c->targets);
    if (!c->targets) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    c->target_kind = CLLM_LORA_TARGET_LIST;
    const char *s = flag;
    for (int i = 0; i < n; i++) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (!len) return CLLM_FAIL(CLLM_ERR_ARG, "--lora-target '%s': an empty name", flag);
        if (!(c->targets[i] = malloc(len + 1))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        memcpy(c->targets[i], s, len);
        c->targets[i][len] = 0;
        c->n_targets = i + 1;
        s = e ? e + 1 : s + len;
    }
    return CLLM_OK;
}

static cllm_status parse_targets(cllm_lora_config *c, const json_t *v, const char *where, const char *path) {
    if (!v || json_is_null(v)) {
        c->target_kind = CLLM_LORA_TARGET_DEFAULT;
        return CLLM_OK;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!*s) return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": empty", path, where, "target_modules");
        free(c->target_regex);
        c->target_regex = NULL;
        if (!strcmp(s, "all-linear")) {
            c->target_kind = CLLM_LORA_TARGET_ALL_LINEAR;
            return CLLM_OK;
        }
        c->target_kind = CLLM_LORA_TARGET_REGEX; /* PEFT: a string is a regular expression */
        return (c->target_regex = dup(s)) ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    if (!json_is_array(v) || !json_array_size(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a non-empty list of module names, a regular expression or "
                         "\"all-linear\"", path, where, "target_modules");
    c->target_kind = CLLM_LORA_TARGET_LIST;
    return get_strs(v, &c->targets, &c->n_targets, where, "target_modules", path);
}

cllm_status cllm_lora_config_parse(cllm_lora_config *c, const json_t *obj, const char *where, const char *path,
                                   bool peft_file) {
    if (!json_is_object(obj)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: expected an object", path, where);
    TRY(check_keys(obj, where, path, peft_file));
    c->enabled = true;
    json_t *v;
    if ((v = json_object_get(obj, "peft_type")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "LORA")))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, KEYFMT ": expected \"LORA\" (the only PEFT method cllm trains)", path,
                         where, "peft_type");
    if ((v = json_object_get(obj, "task_type")) && !json_is_null(v)) {
        const char *tt = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(tt, "CAUSAL_LM") && strcmp(tt, "SEQ_CLS"))
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, KEYFMT ": expected \"CAUSAL_LM\" or \"SEQ_CLS\" (a reward model)",
                             path, where, "task_type");
        c->seq_cls = !strcmp(tt, "SEQ_CLS");
    }
    if ((v = json_object_get(obj, "inference_mode")) && !json_is_null(v) && !json_is_boolean(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected true or false", path, where, "inference_mode");
    if ((v = json_object_get(obj, "r")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a positive integer", path, where, "r");
        c->r = (int)json_integer_value(v);
    }
    if ((v = json_object_get(obj, "lora_alpha")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a positive number", path, where, "lora_alpha");
        c->lora_alpha = json_number_value(v);
    }
    if ((v = json_object_get(obj, "lora_dropout")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) < 1))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a number in [0, 1)", path, where, "lora_dropout");
        c->lora_dropout = json_number_value(v);
    }
    if (json_object_get(obj, "target_modules")) TRY(parse_targets(c, json_object_get(obj, "target_modules"), where, path));
    if ((v = json_object_get(obj, "bias")) && !json_is_null(v)) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (!strcmp(s, "none")) c->bias = CLLM_LORA_BIAS_NONE;
        else if (!strcmp(s, "all")) c->bias = CLLM_LORA_BIAS_ALL;
        else if (!strcmp(s, "lora_only")) c->bias = CLLM_LORA_BIAS_LORA_ONLY;
        else return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected \"none\", \"all\" or \"lora_only\"", path, where, "bias");
    }
    TRY(get_strs(json_object_get(obj, "modules_to_save"), &c->modules_to_save, &c->n_modules_to_save, where,
                 "modules_to_save", path));
    TRY(get_strs(json_object_get(obj, "layers_pattern"), &c->layers_pattern, &c->n_layers_pattern, where,
                 "layers_pattern", path));
    const char *bools[] = {"use_rslora", "fan_in_fan_out"};
    bool *bdst[] = {&c->use_rslora, &c->fan_in_fan_out};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(obj, bools[i])) && !json_is_null(v)) {
            if (!json_is_boolean(v)) return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected true or false", path, where, bools[i]);
            *bdst[i] = json_is_true(v);
        }
    if ((v = json_object_get(obj, "layers_to_transform")) && !json_is_null(v)) {
        size_t n = json_is_integer(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
        if (!json_is_integer(v) && !json_is_array(v))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a layer index or a list of them", path, where,
                             "layers_to_transform");
        free(c->layers_to_transform);
        c->layers_to_transform = n ? calloc(n, sizeof(int)) : NULL;
        c->n_layers_to_transform = 0;
        if (n && !c->layers_to_transform) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_is_integer(v) ? v : json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 1000000)
                return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT "[%zu]: expected a layer index >= 0", path, where,
                                 "layers_to_transform", i);
            c->layers_to_transform[c->n_layers_to_transform++] = (int)json_integer_value(e);
        }
    }
    TRY(get_patterns(json_object_get(obj, "rank_pattern"), &c->rank_pattern, &c->n_rank_pattern, true, where,
                     "rank_pattern", path));
    TRY(get_patterns(json_object_get(obj, "alpha_pattern"), &c->alpha_pattern, &c->n_alpha_pattern, false, where,
                     "alpha_pattern", path));
    if ((v = json_object_get(obj, "init_lora_weights")) && !json_is_null(v)) {
        if (json_is_true(v)) c->init = CLLM_LORA_INIT_DEFAULT;
        else if (json_is_false(v)) c->init = CLLM_LORA_INIT_RANDOM;
        else if (json_is_string(v) && !strcmp(json_string_value(v), "gaussian")) c->init = CLLM_LORA_INIT_GAUSSIAN;
        else
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, KEYFMT ": expected true, false or \"gaussian\" (PEFT's other "
                             "initialisations (pissa, olora, loftq...) are not supported)", path, where,
                             "init_lora_weights");
    }
    if ((v = json_object_get(obj, "base_model_name_or_path")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a string", path, where, "base_model_name_or_path");
        free(c->base_model_name_or_path);
        if (!(c->base_model_name_or_path = dup(json_string_value(v)))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    /* a regular expression is checked here, not at the first match */
    if (c->target_kind == CLLM_LORA_TARGET_REGEX) {
        lora_regex re;
        cllm_status st = lora_regex_compile(&re, c->target_regex, false);
        if (st) return cllm_fail_context(st, "%s: %s.target_modules", path, where);
        lora_regex_free(&re);
    }
    return CLLM_OK;
}

/* PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the three families. */
static const char *const gpt2_targets[] = {"c_attn", NULL};
static const char *const llama_targets[] = {"q_proj", "v_proj", NULL};
static const char *const bloom_targets[] = {"query_key_value", NULL};

const char *const *cllm_lora_default_targets(cllm_arch arch) {
    switch (arch) {
    case CLLM_ARCH_GPT2: return gpt2_targets;
    case CLLM_ARCH_LLAMA: return llama_targets;
    case CLLM_ARCH_BLOOM: return bloom_targets;
    default: return NULL;
    }
}

/* ------------------------------------------------------------ matching */

cllm_status lora_regex_compile(lora_regex *re, const char *pattern, bool suffix) {
    int err;
    PCRE2_SIZE erroff;
    re->code = NULL;
    re->md = NULL;
    /* a whole-path match (re.fullmatch), or PEFT's pattern rule for
     * rank/alpha_pattern: the path ends with the pattern, at a "." or at
     * its start */
    size_t n = strlen(pattern) + 32;
    char *full = malloc(n);
    if (!full) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    snprintf(full, n, suffix ? "^(?:.*\\.)?(?:%s)$" : "^(?:%s)$", pattern);
    re->code = pcre2_compile((PCRE2_SPTR)full, PCRE2_ZERO_TERMINATED, 0, &err, &erroff, NULL);
    free(full);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return CLLM_FAIL(CLLM_ERR_ARG, "regular expression '%s': %s", pattern, (const char *)msg);
    }
    re->md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!re->md) {
        lora_regex_free(re);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    return CLLM_OK;
}

bool lora_regex_match(const lora_regex *re, const char *s) {
    return pcre2_match(re->code, (PCRE2_SPTR)s, PCRE2_ZERO_TERMINATED, 0, 0, re->md, NULL) >= 0;
}

void lora_regex_free(lora_regex *re) {
    if (re->md) pcre2_match_data_free(re->md);
    if (re->code) pcre2_code_free(re->code);
    re->md = NULL;
    re->code = NULL;
}

bool lora_name_matches(const char *module, const char *name) {
    size_t lm = strlen(module), ln = strlen(name);
    if (lm == ln) return !strcmp(module, name);
    return lm > ln && module[lm - ln - 1] == '.' && !strcmp(module + lm - ln, name);
}

/* PEFT's get_pattern_key: the first pattern (in the object's order) that
 * matches the end of the path. */
static bool pattern_value(const cllm_lora_pattern *p, int n, const char *module, double *out) {
    for (int i = 0; i < n; i++) {
        lora_regex re;
        if (lora_regex_compile(&re, p[i].pattern, true)) continue; /* checked when the adapters are made */
        bool hit = lora_regex_match(&re, module);
        lora_regex_free(&re);
        if (hit) {
            *out = p[i].value;
            return true;
        }
    }
    return false;
}

void lora_module_rank(const cllm_lora_config *c, const char *module, int *r, double *alpha, float *scale) {
    double rv = c->r, av = c->lora_alpha;
    pattern_value(c->rank_pattern, c->n_rank_pattern, module, &rv);
    pattern_value(c->alpha_pattern, c->n_alpha_pattern, module, &av);
    *r = (int)rv;
    *alpha = av;
    *scale = (float)(c->use_rslora ? av / sqrt(rv) : av / rv);
}

/* The layer index of a block module ("...<pattern>.<index>.") for
 * layers_to_transform; -1 outside the blocks. */
int lora_module_layer(const cllm_lora_config *c, const char *module) {
    static const char *const defaults[] = {"layers", "h", NULL};
    for (int i = 0; c->n_layers_pattern ? i < c->n_layers_pattern : defaults[i] != NULL; i++) {
        const char *pat = c->n_layers_pattern ? c->layers_pattern[i] : defaults[i];
        size_t lp = strlen(pat);
        for (const char *s = module; (s = strstr(s, pat)); s++) {
            if ((s != module && s[-1] != '.') || s[lp] != '.') continue;
            char *end;
            long l = strtol(s + lp + 1, &end, 10);
            if (end != s + lp + 1 && *end == '.') return (int)l;
        }
    }
    return -1;
}
