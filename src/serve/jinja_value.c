/*
 * Chat-template values: jansson values plus Jinja's undefined, namespaces
 * and macros, with Python's semantics for what templates observe: str()
 * and repr() of every type (['a', 1], {'k': None}, 1.0, 1e+16), truthiness,
 * equality across int / float / bool, ordering, and json.dumps as HF's
 * tojson filter calls it (ensure_ascii=False, key order kept, ", " and
 * ": " separators, or "," and ": " with an indent).
 *
 * Left out: tuples (they are lists here, so str() of one prints [...]),
 * integers beyond 64 bits (an overflow is an error), non-finite floats
 * (jansson cannot hold them; producing one is an error).
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unictype.h>
#include <unistr.h>

#include "serve/jinja_impl.h"

cllm_status jinja_err(jstate *st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cllm_fail(CLLM_ERR_ARG, "cllm_chat_template_render", "%s:%d: %s", st->t->what, st->line, msg);
}

uint64_t jinja_max_steps = JINJA_MAX_STEPS;

cllm_status jinja_step(jstate *st, uint64_t n) {
    st->steps += n;
    if (st->steps > jinja_max_steps)
        return jinja_err(st, "the template ran more than %llu steps", (unsigned long long)jinja_max_steps);
    return CLLM_OK;
}

jval jv_undef(const char *name) { return (jval){V_UNDEF, NULL, NULL, name}; }
jval jv_json(json_t *j) { return (jval){V_JSON, j, NULL, NULL}; }
jval jv_copy(jval v) {
    if (v.j) json_incref(v.j);
    return v;
}
void jv_free(jval *v) {
    if (v->j) json_decref(v->j);
    *v = jv_undef(NULL);
}
jval jv_str(const char *s, size_t len) { return jv_json(json_stringn_nocheck(s, len)); }
jval jv_int(int64_t i) { return jv_json(json_integer(i)); }
jval jv_float(double f) { return jv_json(json_real(f)); }
jval jv_bool(bool b) { return jv_json(json_boolean(b)); }
jval jv_none(void) { return jv_json(json_null()); }

bool jv_is_str(jval v) { return v.k == V_JSON && json_is_string(v.j); }
bool jv_is_num(jval v) { return v.k == V_JSON && (json_is_number(v.j) || json_is_boolean(v.j)); }
bool jv_is_int(jval v) { return v.k == V_JSON && (json_is_integer(v.j) || json_is_boolean(v.j)); }
int64_t jv_int_value(jval v) {
    if (json_is_boolean(v.j)) return json_is_true(v.j);
    return json_integer_value(v.j);
}
double jv_num(jval v) {
    if (json_is_boolean(v.j)) return json_is_true(v.j);
    return json_number_value(v.j);
}

bool jv_truthy(jval v) {
    switch (v.k) {
    case V_UNDEF: return false;
    case V_NS:
    case V_MACRO: return true;
    case V_JSON: break;
    }
    switch (json_typeof(v.j)) {
    case JSON_NULL:
    case JSON_FALSE: return false;
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v.j) != 0;
    case JSON_REAL: return json_real_value(v.j) != 0;
    case JSON_STRING: return json_string_length(v.j) > 0;
    case JSON_ARRAY: return json_array_size(v.j) > 0;
    case JSON_OBJECT: return json_object_size(v.j) > 0;
    }
    return false;
}

const char *jv_type(jval v) {
    switch (v.k) {
    case V_UNDEF: return "undefined";
    case V_NS: return "namespace";
    case V_MACRO: return "macro";
    case V_JSON: break;
    }
    switch (json_typeof(v.j)) {
    case JSON_NULL: return "NoneType";
    case JSON_FALSE:
    case JSON_TRUE: return "bool";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_STRING: return "str";
    case JSON_ARRAY: return "list";
    case JSON_OBJECT: return "dict";
    }
    return "?";
}

static bool json_eq(const json_t *a, const json_t *b) {
    bool na = json_is_number(a) || json_is_boolean(a), nb = json_is_number(b) || json_is_boolean(b);
    if (na && nb) {
        if ((json_is_integer(a) || json_is_boolean(a)) && (json_is_integer(b) || json_is_boolean(b))) {
            int64_t x = json_is_boolean(a) ? json_is_true(a) : json_integer_value(a);
            int64_t y = json_is_boolean(b) ? json_is_true(b) : json_integer_value(b);
            return x == y;
        }
        double x = json_is_boolean(a) ? json_is_true(a) : json_number_value(a);
        double y = json_is_boolean(b) ? json_is_true(b) : json_number_value(b);
        return x == y;
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!json_eq(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        size_t kl;
        json_t *v;
        json_object_keylen_foreach((json_t *)a, k, kl, v) {
            json_t *w = json_object_getn(b, k, kl);
            if (!w || !json_eq(v, w)) return false;
        }
        return true;
    }
    if (json_is_string(a))
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    return true; /* null == null */
}

bool jv_equal(jval a, jval b) {
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_UNDEF: return true;
    case V_NS: return a.j == b.j;
    case V_MACRO: return a.m == b.m;
    case V_JSON: return json_eq(a.j, b.j);
    }
    return false;
}

static int cmp_json(const json_t *a, const json_t *b, bool *ok) {
    bool na = json_is_number(a) || json_is_boolean(a), nb = json_is_number(b) || json_is_boolean(b);
    if (na && nb) {
        double x = json_is_boolean(a) ? json_is_true(a) : json_number_value(a);
        double y = json_is_boolean(b) ? json_is_true(b) : json_number_value(b);
        if ((json_is_integer(a) || json_is_boolean(a)) && (json_is_integer(b) || json_is_boolean(b))) {
            int64_t p = json_is_boolean(a) ? json_is_true(a) : json_integer_value(a);
            int64_t q = json_is_boolean(b) ? json_is_true(b) : json_integer_value(b);
            return (p > q) - (p < q);
        }
        return (x > y) - (x < y);
    }
    if (json_is_string(a) && json_is_string(b)) {
        size_t la = json_string_length(a), lb = json_string_length(b);
        int c = memcmp(json_string_value(a), json_string_value(b), la < lb ? la : lb);
        if (c) return c < 0 ? -1 : 1;
        return (la > lb) - (la < lb);
    }
    if (json_is_array(a) && json_is_array(b)) {
        size_t la = json_array_size(a), lb = json_array_size(b);
        for (size_t i = 0; i < la && i < lb; i++) {
            const json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
            if (json_eq(x, y)) continue;
            return cmp_json(x, y, ok);
        }
        return (la > lb) - (la < lb);
    }
    *ok = false;
    return 0;
}

cllm_status jv_compare(jstate *st, jval a, jval b, int *cmp) {
    bool ok = a.k == V_JSON && b.k == V_JSON;
    if (ok) *cmp = cmp_json(a.j, b.j, &ok);
    if (!ok) return jinja_err(st, "cannot order values of types '%s' and '%s'", jv_type(a), jv_type(b));
    return CLLM_OK;
}

cllm_status jbuf_add(jstate *st, char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    if (len > JINJA_MAX_OUT || *n + len > JINJA_MAX_OUT)
        return jinja_err(st, "the output grew past %u bytes", JINJA_MAX_OUT);
    if (len >= 64) {
        cllm_status r = jinja_step(st, len / 64);
        if (r) return r;
    }
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *n + len + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        *buf = b;
        *cap = c;
    }
    if (len) memcpy(*buf + *n, s, len);
    *n += len;
    (*buf)[*n] = 0;
    return CLLM_OK;
}

/* Python's repr(float): the shortest digits that read back, fixed notation
 * for exponents -4..15, otherwise d.ddde+XX. */
static void fmt_float(double f, char *out, size_t size) {
    if (isnan(f)) {
        snprintf(out, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, size, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, f);
        if (strtod(e, NULL) == f) break;
    }
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    char d[24];
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') d[nd++] = *s;
    d[nd] = 0;
    int ex = atoi(s + 1);
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (ex >= -4 && ex < 16) {
        if (ex >= 0) {
            for (int i = 0; i <= ex; i++) out[o++] = (size_t)i < nd ? d[i] : '0';
            out[o++] = '.';
            if ((size_t)ex + 1 < nd)
                for (size_t i = (size_t)ex + 1; i < nd; i++) out[o++] = d[i];
            else out[o++] = '0';
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -ex - 1; i++) out[o++] = '0';
            for (size_t i = 0; i < nd; i++) out[o++] = d[i];
        }
        out[o] = 0;
    } else {
        out[o++] = d[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++) out[o++] = d[i];
        }
        snprintf(out + o, size - o, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

/* repr() of a string, with Python's choice of quotes and escapes. */
static cllm_status repr_str(jstate *st, const char *s, size_t len, char **buf, size_t *n, size_t *cap) {
    bool sq = memchr(s, '\'', len) != NULL, dq = memchr(s, '"', len) != NULL;
    char q = sq && !dq ? '"' : '\'';
    cllm_status r;
    if ((r = jbuf_add(st, buf, n, cap, &q, 1))) return r;
    size_t i = 0;
    while (i < len) {
        ucs4_t c;
        int k = u8_mbtouc(&c, (const uint8_t *)s + i, len - i);
        char esc[16];
        const char *w = s + i;
        size_t wl = (size_t)k;
        if (c == '\\') w = "\\\\", wl = 2;
        else if (c == (ucs4_t)q) w = q == '\'' ? "\\'" : "\\\"", wl = 2;
        else if (c == '\n') w = "\\n", wl = 2;
        else if (c == '\r') w = "\\r", wl = 2;
        else if (c == '\t') w = "\\t", wl = 2;
        else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)c);
            w = esc;
            wl = 4;
        } else if (c >= 0x80 && c != ' ' &&
                   uc_is_general_category(c, uc_general_category_or(
                                                 uc_general_category_or(UC_CATEGORY_Cc, UC_CATEGORY_Cf),
                                                 uc_general_category_or(
                                                     uc_general_category_or(UC_CATEGORY_Cs, UC_CATEGORY_Co),
                                                     uc_general_category_or(
                                                         uc_general_category_or(UC_CATEGORY_Cn, UC_CATEGORY_Zl),
                                                         uc_general_category_or(UC_CATEGORY_Zp,
                                                                                UC_CATEGORY_Zs)))))) {
            if (c < 0x100) snprintf(esc, sizeof esc, "\\x%02x", (unsigned)c);
            else if (c < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
            else snprintf(esc, sizeof esc, "\\U%08x", (unsigned)c);
            w = esc;
            wl = strlen(esc);
        }
        if ((r = jbuf_add(st, buf, n, cap, w, wl))) return r;
        i += (size_t)(k > 0 ? k : 1);
    }
    return jbuf_add(st, buf, n, cap, &q, 1);
}

static cllm_status to_str(jstate *st, const json_t *j, bool repr, char **buf, size_t *n, size_t *cap, int depth) {
    char num[64];
    cllm_status r;
    if (depth > JINJA_MAX_DEPTH) return jinja_err(st, "value nested too deeply to print");
    if ((r = jinja_step(st, 1))) return r;
    switch (json_typeof(j)) {
    case JSON_NULL: return jbuf_add(st, buf, n, cap, "None", 4);
    case JSON_TRUE: return jbuf_add(st, buf, n, cap, "True", 4);
    case JSON_FALSE: return jbuf_add(st, buf, n, cap, "False", 5);
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        return jbuf_add(st, buf, n, cap, num, strlen(num));
    case JSON_REAL:
        fmt_float(json_real_value(j), num, sizeof num);
        return jbuf_add(st, buf, n, cap, num, strlen(num));
    case JSON_STRING:
        if (repr) return repr_str(st, json_string_value(j), json_string_length(j), buf, n, cap);
        return jbuf_add(st, buf, n, cap, json_string_value(j), json_string_length(j));
    case JSON_ARRAY:
        if ((r = jbuf_add(st, buf, n, cap, "[", 1))) return r;
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (i && (r = jbuf_add(st, buf, n, cap, ", ", 2))) return r;
            if ((r = to_str(st, json_array_get(j, i), true, buf, n, cap, depth + 1))) return r;
        }
        return jbuf_add(st, buf, n, cap, "]", 1);
    case JSON_OBJECT: {
        if ((r = jbuf_add(st, buf, n, cap, "{", 1))) return r;
        const char *k;
        size_t kl;
        json_t *v;
        bool first = true;
        json_object_keylen_foreach((json_t *)j, k, kl, v) {
            if (!first && (r = jbuf_add(st, buf, n, cap, ", ", 2))) return r;
            first = false;
            if ((r = repr_str(st, k, kl, buf, n, cap)) || (r = jbuf_add(st, buf, n, cap, ": ", 2)) ||
                (r = to_str(st, v, true, buf, n, cap, depth + 1)))
                return r;
        }
        return jbuf_add(st, buf, n, cap, "}", 1);
    }
    }
    return CLLM_OK;
}

cllm_status jv_to_str(jstate *st, jval v, char **buf, size_t *n, size_t *cap) {
    switch (v.k) {
    case V_UNDEF: return jbuf_add(st, buf, n, cap, "", 0);
    case V_NS: {
        cllm_status r;
        if ((r = jbuf_add(st, buf, n, cap, "<Namespace ", 11)) || (r = to_str(st, v.j, true, buf, n, cap, 0)))
            return r;
        return jbuf_add(st, buf, n, cap, ">", 1);
    }
    case V_MACRO: {
        char m[128];
        snprintf(m, sizeof m, "<Macro '%.100s'>", v.m->s);
        return jbuf_add(st, buf, n, cap, m, strlen(m));
    }
    case V_JSON: break;
    }
    return to_str(st, v.j, false, buf, n, cap, 0);
}

cllm_status jv_stringify(jstate *st, jval v, jval *out) {
    if (jv_is_str(v)) {
        *out = jv_copy(v);
        return CLLM_OK;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    cllm_status r = jbuf_add(st, &buf, &n, &cap, "", 0);
    if (!r) r = jv_to_str(st, v, &buf, &n, &cap);
    if (!r) {
        *out = jv_str(buf, n);
        if (!out->j) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    free(buf);
    return r;
}

static cllm_status dump_str(jstate *st, const char *s, size_t len, char **buf, size_t *n, size_t *cap) {
    cllm_status r;
    if ((r = jbuf_add(st, buf, n, cap, "\"", 1))) return r;
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *w = NULL;
        if (c == '"') w = "\\\"";
        else if (c == '\\') w = "\\\\";
        else if (c == '\n') w = "\\n";
        else if (c == '\r') w = "\\r";
        else if (c == '\t') w = "\\t";
        else if (c == '\b') w = "\\b";
        else if (c == '\f') w = "\\f";
        else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            w = esc;
        }
        if (!w) continue;
        if ((r = jbuf_add(st, buf, n, cap, s + run, i - run)) || (r = jbuf_add(st, buf, n, cap, w, strlen(w))))
            return r;
        run = i + 1;
    }
    if ((r = jbuf_add(st, buf, n, cap, s + run, len - run))) return r;
    return jbuf_add(st, buf, n, cap, "\"", 1);
}

static cllm_status newline(jstate *st, int indent, int level, char **buf, size_t *n, size_t *cap) {
    cllm_status r = jbuf_add(st, buf, n, cap, "\n", 1);
    for (int i = 0; !r && i < indent * level; i++) r = jbuf_add(st, buf, n, cap, " ", 1);
    return r;
}

static cllm_status dump(jstate *st, const json_t *j, int indent, int level, char **buf, size_t *n, size_t *cap) {
    char num[64];
    cllm_status r;
    if (level > JINJA_MAX_DEPTH) return jinja_err(st, "value nested too deeply for tojson");
    if ((r = jinja_step(st, 1))) return r;
    const char *sep = indent >= 0 ? "," : ", ";
    switch (json_typeof(j)) {
    case JSON_NULL: return jbuf_add(st, buf, n, cap, "null", 4);
    case JSON_TRUE: return jbuf_add(st, buf, n, cap, "true", 4);
    case JSON_FALSE: return jbuf_add(st, buf, n, cap, "false", 5);
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        return jbuf_add(st, buf, n, cap, num, strlen(num));
    case JSON_REAL:
        fmt_float(json_real_value(j), num, sizeof num);
        return jbuf_add(st, buf, n, cap, num, strlen(num));
    case JSON_STRING: return dump_str(st, json_string_value(j), json_string_length(j), buf, n, cap);
    case JSON_ARRAY:
        if (json_array_size(j) == 0) return jbuf_add(st, buf, n, cap, "[]", 2);
        if ((r = jbuf_add(st, buf, n, cap, "[", 1))) return r;
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (i && (r = jbuf_add(st, buf, n, cap, sep, strlen(sep)))) return r;
            if (indent >= 0 && (r = newline(st, indent, level + 1, buf, n, cap))) return r;
            if ((r = dump(st, json_array_get(j, i), indent, level + 1, buf, n, cap))) return r;
        }
        if (indent >= 0 && (r = newline(st, indent, level, buf, n, cap))) return r;
        return jbuf_add(st, buf, n, cap, "]", 1);
    case JSON_OBJECT: {
        if (json_object_size(j) == 0) return jbuf_add(st, buf, n, cap, "{}", 2);
        if ((r = jbuf_add(st, buf, n, cap, "{", 1))) return r;
        const char *k;
        size_t kl;
        json_t *v;
        bool first = true;
        json_object_keylen_foreach((json_t *)j, k, kl, v) {
            if (!first && (r = jbuf_add(st, buf, n, cap, sep, strlen(sep)))) return r;
            first = false;
            if (indent >= 0 && (r = newline(st, indent, level + 1, buf, n, cap))) return r;
            if ((r = dump_str(st, k, kl, buf, n, cap)) || (r = jbuf_add(st, buf, n, cap, ": ", 2)) ||
                (r = dump(st, v, indent, level + 1, buf, n, cap)))
                return r;
        }
        if (indent >= 0 && (r = newline(st, indent, level, buf, n, cap))) return r;
        return jbuf_add(st, buf, n, cap, "}", 1);
    }
    }
    return CLLM_OK;
}

cllm_status jv_tojson(jstate *st, jval v, int indent, jval *out) {
    if (v.k != V_JSON) return jinja_err(st, "object of type '%s' is not JSON serializable", jv_type(v));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    cllm_status r = jbuf_add(st, &buf, &n, &cap, "", 0);
    if (!r) r = dump(st, v.j, indent, 0, &buf, &n, &cap);
    if (!r) {
        *out = jv_str(buf, n);
        if (!out->j) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    free(buf);
    return r;
}

size_t ju8_offset(const char *s, size_t len, int64_t i) {
    size_t p = 0;
    for (int64_t k = 0; k < i && p < len; k++) {
        p++;
        while (p < len && ((unsigned char)s[p] & 0xC0) == 0x80) p++;
    }
    return p;
}

int64_t ju8_count(const char *s, size_t len) {
    int64_t c = 0;
    for (size_t p = 0; p < len; p++)
        if (((unsigned char)s[p] & 0xC0) != 0x80) c++;
    return c;
}

int64_t jv_len(jval v) {
    if (v.k == V_UNDEF) return 0;
    if (v.k != V_JSON) return -1;
    if (json_is_string(v.j)) return ju8_count(json_string_value(v.j), json_string_length(v.j));
    if (json_is_array(v.j)) return (int64_t)json_array_size(v.j);
    if (json_is_object(v.j)) return (int64_t)json_object_size(v.j);
    return -1;
}

bool ju8_space(const char *s, size_t len, size_t *n) {
    if (!len) return false;
    unsigned char c = (unsigned char)s[0];
    *n = 1;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return true;
    if (c < 0x80) return false;
    ucs4_t u;
    int k = u8_mbtouc(&u, (const uint8_t *)s, len);
    *n = (size_t)(k > 0 ? k : 1);
    return u == 0x85 || u == 0xA0 || u == 0x1680 || (u >= 0x2000 && u <= 0x200A) || u == 0x2028 || u == 0x2029 ||
           u == 0x202F || u == 0x205F || u == 0x3000;
}

size_t jfind(const char *hay, size_t hn, size_t from, const char *needle, size_t nn) {
    if (from > hn) return SIZE_MAX;
    if (nn == 0) return from;
    const char *p = memmem(hay + from, hn - from, needle, nn);
    return p ? (size_t)(p - hay) : SIZE_MAX;
}
