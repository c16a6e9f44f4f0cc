/*
 * Chat-template builtins: Jinja2's filters, tests and globals that chat
 * templates use, the str / dict methods they call, and attribute / item
 * lookup, each with Jinja2's (Python's) results. HF's additions:
 * raise_exception(msg) and strftime_now(fmt); tojson is HF's (json.dumps
 * with ensure_ascii=False, no key sorting, optional indent).
 *
 * Left out (an error naming them): list-mutating methods (the sandbox
 * transformers renders in refuses them too), format / % formatting,
 * wordwrap, truncate, dictsort, groupby, batch, slice, min, max, center,
 * urlencode, xmlattr, pprint. Filters taking a test or filter by name
 * (select, selectattr, map) accept the ones here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unicase.h>
#include <unictype.h>
#include <unistr.h>

#include "serve/jinja_impl.h"

static cllm_status nomem(jval *v) {
    if (v->k == V_JSON && !v->j) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

/* The [key, value] pair of dict.items(). Built by hand, not with
 * json_pack("[s%O]"): template strings need not be valid UTF-8, and a key
 * that json_pack refuses made it fail after taking a reference to the value,
 * which then leaked. */
static json_t *item_pair(const char *k, size_t kl, json_t *x) {
    json_t *p = json_array();
    if (p && !json_array_append_new(p, json_stringn_nocheck(k, kl)) && !json_array_append(p, x)) return p;
    json_decref(p);
    return NULL;
}

/* The argument at position pos (counting positional ones) or named name. */
jval *jinja_arg(jval *args, char **kw, size_t n, size_t pos, const char *name) {
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        if (kw && kw[i]) {
            if (name && !strcmp(kw[i], name)) return &args[i];
        } else if (p++ == pos) {
            return &args[i];
        }
    }
    return NULL;
}

static const char *sv(jval v) { return json_string_value(v.j); }
static size_t sl(jval v) { return json_string_length(v.j); }

/* ---- lookup and iteration ---- */

cllm_status jinja_getattr(jstate *st, jval obj, const char *name, jval *out) {
    if (obj.k == V_UNDEF) {
        if (obj.name) return jinja_err(st, "'%s' is undefined", obj.name);
        return jinja_err(st, "attribute '%s' of an undefined value", name);
    }
    if ((obj.k == V_JSON || obj.k == V_NS) && json_is_object(obj.j)) {
        json_t *v = json_object_get(obj.j, name);
        if (v) {
            *out = jv_json(json_incref(v));
            return CLLM_OK;
        }
    }
    *out = jv_undef(name);
    return CLLM_OK;
}

cllm_status jinja_getitem(jstate *st, jval obj, jval key, jval *out) {
    if (obj.k == V_UNDEF) {
        if (obj.name) return jinja_err(st, "'%s' is undefined", obj.name);
        return jinja_err(st, "subscript of an undefined value");
    }
    *out = jv_undef(NULL);
    if (obj.k == V_JSON && jv_is_int(key) && (json_is_array(obj.j) || json_is_string(obj.j))) {
        int64_t i = json_is_integer(key.j) ? json_integer_value(key.j) : json_is_true(key.j);
        int64_t len = jv_len(obj);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return CLLM_OK;
        if (json_is_array(obj.j)) {
            *out = jv_json(json_incref(json_array_get(obj.j, (size_t)i)));
        } else {
            size_t a = ju8_offset(sv(obj), sl(obj), i), b = ju8_offset(sv(obj), sl(obj), i + 1);
            *out = jv_str(sv(obj) + a, b - a);
        }
        return nomem(out);
    }
    if ((obj.k == V_JSON || obj.k == V_NS) && json_is_object(obj.j) && jv_is_str(key)) {
        json_t *v = json_object_getn(obj.j, sv(key), sl(key));
        if (v) *out = jv_json(json_incref(v));
        else *out = jv_undef(NULL);
    }
    return CLLM_OK;
}

cllm_status jinja_iter_list(jstate *st, jval v, json_t **out) {
    cllm_status r;
    *out = NULL;
    if (v.k == V_UNDEF) *out = json_array();
    else if (v.k == V_JSON && json_is_array(v.j)) *out = json_copy(v.j);
    else if (v.k == V_JSON && json_is_object(v.j)) {
        if ((r = jinja_step(st, json_object_size(v.j)))) return r;
        *out = json_array();
        const char *k;
        size_t kl;
        json_t *x;
        json_object_keylen_foreach(v.j, k, kl, x) {
            if (*out && json_array_append_new(*out, json_stringn_nocheck(k, kl))) {
                json_decref(*out);
                *out = NULL;
            }
        }
    } else if (jv_is_str(v)) {
        if ((r = jinja_step(st, sl(v)))) return r;
        *out = json_array();
        const char *s = sv(v);
        size_t n = sl(v), p = 0;
        while (*out && p < n) {
            size_t q = p + 1;
            while (q < n && ((unsigned char)s[q] & 0xC0) == 0x80) q++;
            if (json_array_append_new(*out, json_stringn_nocheck(s + p, q - p))) {
                json_decref(*out);
                *out = NULL;
            }
            p = q;
        }
    } else {
        return jinja_err(st, "'%s' object is not iterable", jv_type(v));
    }
    if (!*out) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if ((r = jinja_step(st, json_array_size(*out)))) {
        json_decref(*out);
        *out = NULL;
    }
    return r;
}

/* ---- strings ---- */

static bool in_chars(const char *s, size_t n, size_t *k, jval *chars) {
    if (!chars || (chars->k == V_JSON && json_is_null(chars->j))) return ju8_space(s, n, k);
    size_t q = 1;
    while (q < n && ((unsigned char)s[q] & 0xC0) == 0x80) q++;
    *k = q;
    const char *c = sv(*chars);
    size_t cl = sl(*chars);
    for (size_t i = 0; i + q <= cl; i++)
        if (!memcmp(c + i, s, q)) return true;
    return false;
}

/* strip (which: 1 left, 2 right, 3 both) */
cllm_status jinja_strip(jstate *st, jval v, jval *chars, int which, jval *out) {
    if (chars && !(jv_is_str(*chars) || (chars->k == V_JSON && json_is_null(chars->j))))
        return jinja_err(st, "strip arg must be None or str");
    const char *s = sv(v);
    size_t n = sl(v), a = 0, b = n, k;
    if (which & 1)
        while (a < b && in_chars(s + a, b - a, &k, chars)) a += k;
    if (which & 2)
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            if (!in_chars(s + p, b - p, &k, chars) || p + k != b) break;
            b = p;
        }
    *out = jv_str(s + a, b - a);
    return nomem(out);
}

typedef uint8_t *(*case_fn)(const uint8_t *, size_t, const char *, uninorm_t, uint8_t *, size_t *);

static cllm_status map_case(jstate *st, const char *s, size_t n, case_fn f, char **buf, size_t *bn, size_t *cap) {
    if (!n) return CLLM_OK;
    size_t len = 0;
    uint8_t *r = f((const uint8_t *)s, n, NULL, NULL, NULL, &len);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status x = jbuf_add(st, buf, bn, cap, (const char *)r, len);
    free(r);
    return x;
}

static size_t cp_len(const char *s, size_t n) {
    size_t q = 1;
    while (q < n && ((unsigned char)s[q] & 0xC0) == 0x80) q++;
    return q;
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' Jinja's title filter, 'T' str.title */
cllm_status jinja_recase(jstate *st, jval v, int mode, jval *out) {
    const char *s = sv(v);
    size_t n = sl(v), bn = 0, cap = 0;
    char *buf = NULL;
    cllm_status r = jbuf_add(st, &buf, &bn, &cap, "", 0);
    if (!r && mode == 'u') r = map_case(st, s, n, u8_toupper, &buf, &bn, &cap);
    else if (!r && mode == 'l') r = map_case(st, s, n, u8_tolower, &buf, &bn, &cap);
    else if (!r && mode == 'c' && n) {
        size_t q = cp_len(s, n);
        if (!(r = map_case(st, s, q, u8_totitle, &buf, &bn, &cap)))
            r = map_case(st, s + q, n - q, u8_tolower, &buf, &bn, &cap);
    } else if (!r && (mode == 't' || mode == 'T')) {
        bool start = true;
        for (size_t p = 0; !r && p < n;) {
            size_t q = cp_len(s + p, n - p), k;
            char c = s[p];
            bool sep;
            if (mode == 't') {
                sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju8_space(s + p, n - p, &k);
            } else {
                ucs4_t u;
                u8_mbtouc(&u, (const uint8_t *)s + p, n - p);
                sep = !uc_is_general_category(u, UC_CATEGORY_LC);
            }
            if (sep) r = jbuf_add(st, &buf, &bn, &cap, s + p, q);
            else r = map_case(st, s + p, q, start ? (mode == 't' ? u8_toupper : u8_totitle) : u8_tolower, &buf, &bn,
                              &cap);
            start = sep;
            p += q;
        }
    }
    if (!r) {
        *out = jv_str(buf, bn);
        r = nomem(out);
    }
    free(buf);
    return r;
}

cllm_status jinja_replace(jstate *st, jval v, jval *old, jval *new_, jval *count, jval *out) {
    if (!old || !new_ || !jv_is_str(*old) || !jv_is_str(*new_)) return jinja_err(st, "replace() needs two strings");
    int64_t cnt = count && jv_is_int(*count) ? jv_int_value(*count) : -1;
    if (count && json_is_integer(count->j)) cnt = json_integer_value(count->j);
    const char *s = sv(v), *o = sv(*old), *w = sv(*new_);
    size_t n = sl(v), on = sl(*old), wn = sl(*new_), bn = 0, cap = 0, p = 0;
    char *buf = NULL;
    cllm_status r = jbuf_add(st, &buf, &bn, &cap, "", 0);
    int64_t done = 0;
    if (on == 0) { /* Python inserts `new` between characters */
        while (!r && (cnt < 0 || done < cnt)) {
            if ((r = jbuf_add(st, &buf, &bn, &cap, w, wn))) break;
            done++;
            if (p >= n) break;
            size_t q = cp_len(s + p, n - p);
            r = jbuf_add(st, &buf, &bn, &cap, s + p, q);
            p += q;
        }
    } else {
        while (!r && p < n) {
            const char *hit = NULL;
            if (cnt < 0 || done < cnt) {
                size_t at = jfind(s, n, p, o, on);
                if (at != SIZE_MAX) hit = s + at;
            }
            if (!hit) break;
            size_t h = (size_t)(hit - s);
            if ((r = jbuf_add(st, &buf, &bn, &cap, s + p, h - p)) || (r = jbuf_add(st, &buf, &bn, &cap, w, wn)))
                break;
            p = h + on;
            done++;
        }
    }
    if (!r) r = jbuf_add(st, &buf, &bn, &cap, s + p, n - p);
    if (!r) {
        *out = jv_str(buf, bn);
        r = nomem(out);
    }
    free(buf);
    return r;
}

static cllm_status split(jstate *st, jval v, jval *sep, jval *maxsplit, jval *out) {
    int64_t max = maxsplit && jv_is_int(*maxsplit) ? jv_int_value(*maxsplit) : -1;
    if (maxsplit && json_is_integer(maxsplit->j)) max = json_integer_value(maxsplit->j);
    bool ws = !sep || (sep->k == V_JSON && json_is_null(sep->j));
    if (!ws && (!jv_is_str(*sep) || sl(*sep) == 0)) return jinja_err(st, "split() separator must be a non-empty string");
    json_t *a = json_array();
    const char *s = sv(v);
    size_t n = sl(v), p = 0, k;
    int64_t done = 0;
    while (a) {
        if (ws) {
            while (p < n && ju8_space(s + p, n - p, &k)) p += k;
            if (p >= n) break;
            size_t q = p;
            if (max >= 0 && done >= max) q = n;
            else
                while (q < n && !ju8_space(s + q, n - q, &k)) q += cp_len(s + q, n - q);
            if (max >= 0 && done >= max) {
                size_t e = n; /* Python keeps the rest as is, right-stripped */
                while (e > p) {
                    size_t b = e - 1;
                    while (b > p && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                    if (!ju8_space(s + b, e - b, &k)) break;
                    e = b;
                }
                q = e;
            }
            if (json_array_append_new(a, json_stringn_nocheck(s + p, q - p))) break;
            done++;
            p = q;
        } else {
            const char *hit = NULL;
            size_t sn = sl(*sep);
            if (max < 0 || done < max) {
                size_t at = jfind(s, n, p, sv(*sep), sn);
                if (at != SIZE_MAX) hit = s + at;
            }
            size_t e = hit ? (size_t)(hit - s) : n;
            if (json_array_append_new(a, json_stringn_nocheck(s + p, e - p))) break;
            done++;
            if (!hit) break;
            p = e + sn;
        }
        if (jinja_step(st, 1)) {
            json_decref(a);
            return jinja_err(st, "the template ran out of steps in split()");
        }
    }
    *out = jv_json(a);
    return nomem(out);
}

static cllm_status affix(jstate *st, jval v, jval *x, bool end, bool *res) {
    *res = false;
    if (!x) return jinja_err(st, "%s() needs an argument", end ? "endswith" : "startswith");
    if (x->k == V_JSON && json_is_array(x->j)) {
        for (size_t i = 0; i < json_array_size(x->j); i++) {
            cllm_status r = affix(st, v, &(jval){V_JSON, json_array_get(x->j, i), NULL, NULL}, end, res);
            if (r || *res) return r;
        }
        return CLLM_OK;
    }
    if (!jv_is_str(*x)) return jinja_err(st, "%s() takes a string or a tuple", end ? "endswith" : "startswith");
    size_t n = sl(v), m = sl(*x);
    *res = m <= n && !memcmp(sv(v) + (end ? n - m : 0), sv(*x), m);
    return CLLM_OK;
}

cllm_status jinja_method(jstate *st, jval v, const char *name, jval *args, char **kw, size_t n, jval *out,
                         bool *found) {
    *found = true;
    if (json_is_string(v.j)) {
        cllm_status r = jinja_step(st, sl(v) / 64);
        if (r) return r;
    }
    jval *a0 = jinja_arg(args, kw, n, 0, NULL), *a1 = jinja_arg(args, kw, n, 1, NULL), *a2 = jinja_arg(args, kw, n, 2, NULL);
    if (json_is_string(v.j)) {
        if (!strcmp(name, "strip")) return jinja_strip(st, v, a0, 3, out);
        if (!strcmp(name, "lstrip")) return jinja_strip(st, v, a0, 1, out);
        if (!strcmp(name, "rstrip")) return jinja_strip(st, v, a0, 2, out);
        if (!strcmp(name, "upper")) return jinja_recase(st, v, 'u', out);
        if (!strcmp(name, "lower")) return jinja_recase(st, v, 'l', out);
        if (!strcmp(name, "capitalize")) return jinja_recase(st, v, 'c', out);
        if (!strcmp(name, "title")) return jinja_recase(st, v, 'T', out);
        if (!strcmp(name, "replace")) return jinja_replace(st, v, a0, a1, a2, out);
        if (!strcmp(name, "split"))
            return split(st, v, jinja_arg(args, kw, n, 0, "sep"), jinja_arg(args, kw, n, 1, "maxsplit"), out);
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            bool res;
            cllm_status r = affix(st, v, a0, name[0] == 'e', &res);
            if (!r) *out = jv_bool(res);
            return r ? r : nomem(out);
        }
        if (!strcmp(name, "find") || !strcmp(name, "count")) {
            if (!a0 || !jv_is_str(*a0)) return jinja_err(st, "%s() needs a string", name);
            const char *s = sv(v), *x = sv(*a0);
            size_t sn = sl(v), xn = sl(*a0);
            int64_t cnt = 0, at = -1;
            if (xn == 0) { /* Python: found at 0, counted between all characters */
                at = 0;
                cnt = ju8_count(s, sn) + 1;
            }
            for (size_t i = 0; xn && (i = jfind(s, sn, i, x, xn)) != SIZE_MAX; i += xn) {
                if (at < 0) at = ju8_count(s, i);
                cnt++;
            }
            *out = jv_int(name[0] == 'f' ? at : cnt);
            return nomem(out);
        }
        if (!strcmp(name, "join")) {
            json_t *items = NULL;
            cllm_status r;
            if (!a0) return jinja_err(st, "join() needs an iterable");
            if ((r = jinja_iter_list(st, *a0, &items))) return r;
            char *buf = NULL;
            size_t bn = 0, cap = 0;
            r = jbuf_add(st, &buf, &bn, &cap, "", 0);
            for (size_t i = 0; !r && i < json_array_size(items); i++) {
                json_t *x = json_array_get(items, i);
                if (!json_is_string(x)) {
                    r = jinja_err(st, "join() expects strings, found '%s'", jv_type(jv_json(x)));
                    break;
                }
                if (i) r = jbuf_add(st, &buf, &bn, &cap, sv(v), sl(v));
                if (!r) r = jbuf_add(st, &buf, &bn, &cap, json_string_value(x), json_string_length(x));
            }
            if (!r) {
                *out = jv_str(buf, bn);
                r = nomem(out);
            }
            free(buf);
            json_decref(items);
            return r;
        }
    } else if (json_is_object(v.j)) {
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
            json_t *a = json_array();
            const char *k;
            size_t kl;
            json_t *x;
            cllm_status r = jinja_step(st, json_object_size(v.j));
            if (r) {
                json_decref(a);
                return r;
            }
            json_object_keylen_foreach(v.j, k, kl, x) {
                json_t *e = name[0] == 'k'   ? json_stringn_nocheck(k, kl)
                            : name[0] == 'v' ? json_incref(x)
                                             : item_pair(k, kl, x);
                if (a && json_array_append_new(a, e)) {
                    json_decref(a);
                    a = NULL;
                }
            }
            *out = jv_json(a);
            return nomem(out);
        }
        if (!strcmp(name, "get")) {
            if (!a0) return jinja_err(st, "get() needs a key");
            json_t *x = jv_is_str(*a0) ? json_object_getn(v.j, sv(*a0), sl(*a0)) : NULL;
            if (x) *out = jv_json(json_incref(x));
            else if (a1) *out = jv_copy(*a1);
            else *out = jv_none();
            return nomem(out);
        }
    } else if (json_is_array(v.j)) {
        if (!strcmp(name, "append") || !strcmp(name, "pop") || !strcmp(name, "insert") || !strcmp(name, "extend") ||
            !strcmp(name, "remove") || !strcmp(name, "clear") || !strcmp(name, "sort") || !strcmp(name, "reverse"))
            return jinja_err(st, "lists cannot be modified in a template (list.%s)", name);
    }
    *found = false;
    return CLLM_OK;
}

/* ---- globals ---- */

cllm_status jinja_global(jstate *st, const char *name, jval *args, char **kw, size_t n, jval *out) {
    if (!strcmp(name, "raise_exception")) {
        jval msg = jv_undef(NULL);
        cllm_status r = n ? jv_stringify(st, args[0], &msg) : CLLM_OK;
        if (r) return r;
        st->raised = true;
        r = cllm_fail(CLLM_ERR_ARG, "cllm_chat_template_render", "%s", msg.j ? json_string_value(msg.j) : "");
        jv_free(&msg);
        return r;
    }
    if (!strcmp(name, "range")) {
        int64_t v[3] = {0, 0, 1};
        size_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if ((kw && kw[i]) || np >= 3 || !jv_is_int(args[i])) return jinja_err(st, "range() takes 1 to 3 integers");
            v[np++] = json_is_integer(args[i].j) ? json_integer_value(args[i].j) : json_is_true(args[i].j);
        }
        if (np == 0) return jinja_err(st, "range() takes 1 to 3 integers");
        int64_t lo = np == 1 ? 0 : v[0], hi = np == 1 ? v[0] : v[1], step = np == 3 ? v[2] : 1;
        if (step == 0) return jinja_err(st, "range() step must not be zero");
        double cnt = step > 0 ? ceil(((double)hi - (double)lo) / (double)step) : ceil(((double)lo - (double)hi) / (double)-step);
        if (cnt > JINJA_MAX_RANGE) return jinja_err(st, "range() of more than %d items", JINJA_MAX_RANGE);
        cllm_status r = jinja_step(st, cnt > 0 ? (uint64_t)cnt : 0);
        if (r) return r;
        json_t *a = json_array();
        for (int64_t x = lo; a && (step > 0 ? x < hi : x > hi); x += step)
            if (json_array_append_new(a, json_integer(x))) {
                json_decref(a);
                a = NULL;
            }
        *out = jv_json(a);
        return nomem(out);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *o = json_object();
        for (size_t i = 0; o && i < n; i++) {
            if (kw && kw[i]) {
                json_object_set_new(o, kw[i], args[i].k == V_JSON ? json_incref(args[i].j) : json_null());
            } else if (args[i].k == V_JSON && json_is_object(args[i].j)) {
                json_object_update(o, args[i].j);
            } else {
                json_decref(o);
                return jinja_err(st, "%s() takes keyword arguments or a dict", name);
            }
        }
        if (!o) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        *out = (jval){name[0] == 'n' ? V_NS : V_JSON, o, NULL, NULL};
        return CLLM_OK;
    }
    if (!strcmp(name, "strftime_now")) {
        if (n != 1 || !jv_is_str(args[0])) return jinja_err(st, "strftime_now() takes one format string");
        time_t now = time(NULL);
        struct tm tm;
        char buf[512];
        if (!localtime_r(&now, &tm)) return jinja_err(st, "strftime_now(): no local time");
        size_t len = strftime(buf, sizeof buf, sv(args[0]), &tm);
        *out = jv_str(buf, len);
        return nomem(out);
    }
    return jinja_err(st, "'%s' is undefined", name);
}

/* jinja_filter and jinja_test live in jinja_filters.c. */
