/*
 * The "quantization" section of a training config: transformers'
 * BitsAndBytesConfig keys (cllm/quant.h, docs/lora.md#qlora). Every key
 * transformers writes is known; values cllm cannot honour (CPU offload,
 * trainable int8 weights, another storage type) are refused naming the
 * key, unknown keys naming them too.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/quant.h"

#define KEYFMT "%s: %s.%s"

void cllm_bnb_config_default(cllm_bnb_config *c) {
    *c = (cllm_bnb_config){.quant_type = CLLM_BNB_FP4, .int8_threshold = 6.0};
}

void cllm_bnb_config_free(cllm_bnb_config *c) {
    if (!c) return;
    for (int i = 0; i < c->n_skip_modules; i++) free(c->skip_modules[i]);
    free(c->skip_modules);
    c->skip_modules = NULL;
    c->n_skip_modules = 0;
}

static char *dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

cllm_status cllm_bnb_config_copy(cllm_bnb_config *dst, const cllm_bnb_config *src) {
    *dst = *src;
    dst->skip_modules = NULL;
    dst->n_skip_modules = 0;
    if (!src->n_skip_modules) return CLLM_OK;
    if (!(dst->skip_modules = calloc((size_t)src->n_skip_modules, sizeof *dst->skip_modules)))
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < src->n_skip_modules; i++) {
        if (!(dst->skip_modules[i] = dup(src->skip_modules[i]))) {
            cllm_bnb_config_free(dst);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        dst->n_skip_modules = i + 1;
    }
    return CLLM_OK;
}

const char *cllm_bnb_compute_name(cllm_bnb_compute c) {
    static const char *const names[] = {"float32", "bfloat16", "float16"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : NULL;
}

cllm_bnb_type cllm_bnb_config_type(const cllm_bnb_config *c) {
    if (!c->enabled) return CLLM_BNB_NONE;
    return c->load_in_8bit ? CLLM_BNB_INT8 : c->quant_type;
}

static const char *const known_keys[] = {
    "load_in_8bit", "load_in_4bit", "_load_in_8bit", "_load_in_4bit", "llm_int8_threshold", "llm_int8_skip_modules",
    "llm_int8_enable_fp32_cpu_offload", "llm_int8_has_fp16_weight", "bnb_4bit_compute_dtype", "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant", "bnb_4bit_quant_storage", "quant_method", NULL};

static cllm_status get_bool(const json_t *obj, const char *key, bool *out, const char *where, const char *path) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_boolean(v)) return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected true or false", path, where, key);
    *out = json_is_true(v);
    return CLLM_OK;
}

/* A dtype name as transformers writes it ("float32", "torch.float32"). */
static const char *dtype_name(const char *s) { return strncmp(s, "torch.", 6) ? s : s + 6; }

static cllm_status parse_values(cllm_bnb_config *c, const json_t *obj, const char *where, const char *path) {
    bool b8 = c->load_in_8bit, b4 = c->load_in_4bit;
    cllm_status st;
    if ((st = get_bool(obj, "_load_in_8bit", &b8, where, path)) || (st = get_bool(obj, "load_in_8bit", &b8, where, path)) ||
        (st = get_bool(obj, "_load_in_4bit", &b4, where, path)) || (st = get_bool(obj, "load_in_4bit", &b4, where, path)) ||
        (st = get_bool(obj, "bnb_4bit_use_double_quant", &c->double_quant, where, path)))
        return st;
    const json_t *v;
    if ((v = json_object_get(obj, "quant_method")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "bitsandbytes")))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, KEYFMT ": only \"bitsandbytes\"", path, where, "quant_method");
    if ((v = json_object_get(obj, "bnb_4bit_quant_type")) && !json_is_null(v)) {
        const char *s = json_string_value(v);
        if (s && !strcmp(s, "nf4"))
            c->quant_type = CLLM_BNB_NF4;
        else if (s && !strcmp(s, "fp4"))
            c->quant_type = CLLM_BNB_FP4;
        else
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected \"nf4\" or \"fp4\"", path, where, "bnb_4bit_quant_type");
    }
    if ((v = json_object_get(obj, "bnb_4bit_compute_dtype")) && !json_is_null(v)) {
        const char *s = json_string_value(v);
        if (!s) return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a dtype name", path, where, "bnb_4bit_compute_dtype");
        const char *n = dtype_name(s);
        if (!strcmp(n, "float32") || !strcmp(n, "float"))
            c->compute = CLLM_BNB_COMPUTE_FP32;
        else if (!strcmp(n, "bfloat16"))
            c->compute = CLLM_BNB_COMPUTE_BF16;
        else if (!strcmp(n, "float16") || !strcmp(n, "half"))
            c->compute = CLLM_BNB_COMPUTE_FP16;
        else
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": \"%s\": expected \"float32\", \"bfloat16\" or \"float16\"",
                             path, where, "bnb_4bit_compute_dtype", s);
    }
    if ((v = json_object_get(obj, "bnb_4bit_quant_storage")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(dtype_name(json_string_value(v)), "uint8")))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, KEYFMT ": only \"uint8\"", path, where, "bnb_4bit_quant_storage");
    static const char *const must_be_false[] = {"llm_int8_enable_fp32_cpu_offload", "llm_int8_has_fp16_weight"};
    for (int i = 0; i < 2; i++) {
        bool on = false;
        if ((st = get_bool(obj, must_be_false[i], &on, where, path))) return st;
        if (on)
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, KEYFMT ": not supported (only false: the quantized base is frozen "
                             "and stays in memory)", path, where, must_be_false[i]);
    }
    if ((v = json_object_get(obj, "llm_int8_threshold")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) >= 0.0))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a number >= 0", path, where, "llm_int8_threshold");
        c->int8_threshold = json_number_value(v);
    }
    if ((v = json_object_get(obj, "llm_int8_skip_modules")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a list of module names", path, where,
                             "llm_int8_skip_modules");
        cllm_bnb_config_free(c);
        size_t n = json_array_size(v);
        if (n && !(c->skip_modules = calloc(n, sizeof *c->skip_modules)))
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(v, i));
            if (!s || !*s)
                return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT "[%zu]: expected a module name", path, where,
                                 "llm_int8_skip_modules", i);
            if (!(c->skip_modules[i] = dup(s))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            c->n_skip_modules = (int)i + 1;
        }
    }
    if (b8 && b4)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: load_in_8bit and load_in_4bit are both set: choose one", path, where);
    if (!b8 && !b4)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: neither load_in_8bit nor load_in_4bit is set (set one, or drop the "
                         "section for an fp32 base)", path, where);
    c->load_in_8bit = b8;
    c->load_in_4bit = b4;
    c->enabled = true;
    return CLLM_OK;
}

cllm_status cllm_bnb_config_parse(cllm_bnb_config *c, const json_t *obj, const char *where, const char *path) {
    if (!json_is_object(obj)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: expected an object", path, where);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        bool known = false;
        for (int i = 0; known_keys[i] && !known; i++) known = !strcmp(known_keys[i], k);
        if (!known)
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: unknown key '%s' (BitsAndBytesConfig keys: load_in_8bit, "
                             "load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype, "
                             "bnb_4bit_quant_storage, llm_int8_threshold, llm_int8_skip_modules, "
                             "llm_int8_enable_fp32_cpu_offload, llm_int8_has_fp16_weight, quant_method)",
                             path, where, k);
    }
    return parse_values(c, obj, where, path);
}
