/*
 * JSON helpers over jansson: loading with "path:line:col" errors, typed
 * getters whose messages name the file and key, and atomic pretty-printed
 * saving. Duplicate keys are rejected on load: in a config or an index a
 * repeated key is almost always a mistake, and silently keeping the last one
 * hides it. Deliberately no schema layer; callers check what they need.
 */
#include "cllm/json.h"

#include "cllm/io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cllm_status cllm_json_parse(json_t **out, const char *text, size_t len, const char *what) {
    if (!out || (!text && len > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    if (!what) what = "<json>";
    json_error_t err;
    json_t *j = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &err);
    if (!j) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%d:%d: %s", what, err.line, err.column, err.text);
    *out = j;
    return CLLM_OK;
}

cllm_status cllm_json_load_file(json_t **out, const char *path) {
    if (!out || !path) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    char *text;
    size_t len;
    cllm_status st = cllm_read_file(path, &text, &len);
    if (st != CLLM_OK) return st;
    st = cllm_json_parse(out, text, len, path);
    free(text);
    return st;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* Looks key up; *v is NULL when missing. Fails when obj is not an object. */
static cllm_status lookup(const json_t *obj, const char *key, const char *path, json_t **v,
                          const char *func) {
    if (!path) path = "<json>";
    if (!obj || !key) return cllm_fail(CLLM_ERR_ARG, func, "%s: NULL object or key", path);
    if (!json_is_object(obj))
        return cllm_fail(CLLM_ERR_FORMAT, func, "%s: expected an object holding '%s', got %s", path,
                         key, type_name(obj));
    *v = json_object_get(obj, key);
    return CLLM_OK;
}

static cllm_status missing(const char *key, const char *path, const char *func) {
    return cllm_fail(CLLM_ERR_FORMAT, func, "%s: missing key '%s'", path ? path : "<json>", key);
}

static cllm_status wrong(const char *key, const char *path, const char *want, const json_t *v,
                         const char *func) {
    return cllm_fail(CLLM_ERR_FORMAT, func, "%s: key '%s' must be %s, got %s", path ? path : "<json>",
                     key, want, type_name(v));
}

static cllm_status get_int(const json_t *obj, const char *key, int64_t *out, const char *path,
                           bool required, const char *func) {
    json_t *v;
    cllm_status st = lookup(obj, key, path, &v, func);
    if (st != CLLM_OK) return st;
    if (!v) return required ? missing(key, path, func) : CLLM_OK;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return CLLM_OK;
    }
    if (json_is_real(v)) {
        /* 1e5 or 4096.0 written by a Python script mean the integer; 0.5 does
         * not. The range test keeps the cast defined. */
        double d = json_real_value(v);
        if (d == floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
            *out = (int64_t)d;
            return CLLM_OK;
        }
        return cllm_fail(CLLM_ERR_FORMAT, func, "%s: key '%s' must be an integer, got %g",
                         path ? path : "<json>", key, d);
    }
    return wrong(key, path, "an integer", v, func);
}

cllm_status cllm_json_get_int(const json_t *obj, const char *key, int64_t *out, const char *path) {
    return get_int(obj, key, out, path, true, __func__);
}

cllm_status cllm_json_get_int_opt(const json_t *obj, const char *key, int64_t *out, const char *path) {
    return get_int(obj, key, out, path, false, __func__);
}

static cllm_status get_num(const json_t *obj, const char *key, double *out, const char *path,
                           bool required, const char *func) {
    json_t *v;
    cllm_status st = lookup(obj, key, path, &v, func);
    if (st != CLLM_OK) return st;
    if (!v) return required ? missing(key, path, func) : CLLM_OK;
    if (!json_is_number(v)) return wrong(key, path, "a number", v, func);
    *out = json_number_value(v);
    return CLLM_OK;
}

cllm_status cllm_json_get_num(const json_t *obj, const char *key, double *out, const char *path) {
    return get_num(obj, key, out, path, true, __func__);
}

cllm_status cllm_json_get_num_opt(const json_t *obj, const char *key, double *out, const char *path) {
    return get_num(obj, key, out, path, false, __func__);
}

cllm_status cllm_json_get_bool_opt(const json_t *obj, const char *key, bool *out, const char *path) {
    json_t *v;
    cllm_status st = lookup(obj, key, path, &v, __func__);
    if (st != CLLM_OK || !v) return st;
    if (!json_is_boolean(v)) return wrong(key, path, "true or false", v, __func__);
    *out = json_is_true(v);
    return CLLM_OK;
}

static cllm_status get_str(const json_t *obj, const char *key, const char **out, const char *path,
                           bool required, const char *func) {
    json_t *v;
    cllm_status st = lookup(obj, key, path, &v, func);
    if (st != CLLM_OK) return st;
    if (!v) return required ? missing(key, path, func) : CLLM_OK;
    if (!json_is_string(v)) return wrong(key, path, "a string", v, func);
    *out = json_string_value(v);
    return CLLM_OK;
}

cllm_status cllm_json_get_str(const json_t *obj, const char *key, const char **out, const char *path) {
    return get_str(obj, key, out, path, true, __func__);
}

cllm_status cllm_json_get_str_opt(const json_t *obj, const char *key, const char **out,
                                  const char *path) {
    return get_str(obj, key, out, path, false, __func__);
}

/* True if every real in j prints exactly with 15 significant digits, so the
 * file can show 1e-06 instead of 9.9999999999999995e-07 without changing a
 * value; otherwise the writer keeps 17 digits. */
static bool reals_fit_15(const json_t *j) {
    if (json_is_real(j)) {
        char buf[64];
        double v = json_real_value(j);
        snprintf(buf, sizeof buf, "%.15g", v);
        return strtod(buf, NULL) == v;
    }
    if (json_is_object(j)) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)j, k, v) if (!reals_fit_15(v)) return false;
    }
    if (json_is_array(j))
        for (size_t i = 0; i < json_array_size(j); i++)
            if (!reals_fit_15(json_array_get(j, i))) return false;
    return true;
}

cllm_status cllm_json_save_file(const json_t *j, const char *path) {
    if (!j || !path) return CLLM_FAIL(CLLM_ERR_ARG, "NULL argument");
    /* JSON_PRESERVE_ORDER is the default since jansson 2.8 but costs nothing
     * to state; older versions would otherwise write keys in hash order. */
    size_t prec = reals_fit_15(j) ? 15 : 17;
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(prec));
    if (!text) return CLLM_FAIL(CLLM_ERR_NOMEM, "cannot serialise JSON for '%s'", path);
    size_t n = strlen(text);
    cllm_status st;
    char *withnl = realloc(text, n + 2);
    if (!withnl) {
        free(text);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory writing '%s'", path);
    }
    withnl[n] = '\n';
    withnl[n + 1] = '\0';
    st = cllm_write_file_atomic(path, withnl, n + 1);
    free(withnl);
    return st;
}
