/*
 * Chat-template filters and tests, with Jinja2 3.1's arguments, defaults
 * and results (tojson is transformers' version). An unknown filter or test
 * is a render error naming it, as in Jinja2 (where it is caught when the
 * template is compiled).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_impl.h"

static cllm_status nomem(jval *v) {
    if (v->k == V_JSON && !v->j) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

static bool is_none(const jval *a) { return !a || (a->k == V_JSON && json_is_null(a->j)); }
static int64_t as_int(jval v) { return json_is_integer(v.j) ? json_integer_value(v.j) : json_is_true(v.j); }

/* Dotted attribute path lookup ("a.b" or "0") for selectattr / map / sort.
 * *out is a value to free even when the lookup fails (then undefined). */
static cllm_status attr_path(jstate *st, jval item, const char *path, jval *out) {
    *out = jv_undef(NULL);
    jval cur = jv_copy(item);
    char part[128];
    const char *p = path;
    while (*p) {
        size_t n = strcspn(p, ".");
        if (n >= sizeof part) n = sizeof part - 1;
        memcpy(part, p, n);
        part[n] = 0;
        jval next;
        cllm_status r;
        int64_t idx;
        if (cllm_parse_i64(part, &idx) && cur.k == V_JSON && json_is_array(cur.j)) {
            jval key = jv_int(idx);
            r = jinja_getitem(st, cur, key, &next);
            jv_free(&key);
        } else {
            r = jinja_getattr(st, cur, part, &next);
            if (!r && next.k == V_UNDEF) next.name = NULL; /* part is this frame's buffer */
        }
        jv_free(&cur);
        if (r) return r;
        cur = next;
        p += n;
        if (*p == '.') p++;
    }
    *out = cur;
    return CLLM_OK;
}

/* For sort / unique: lower-cased strings unless case_sensitive. */
static cllm_status sort_key(jstate *st, jval item, const char *attr, bool case_sensitive, jval *out) {
    jval v;
    cllm_status r = attr ? attr_path(st, item, attr, &v) : (v = jv_copy(item), CLLM_OK);
    if (r) return r;
    if (!case_sensitive && jv_is_str(v)) {
        r = jinja_recase(st, v, 'l', out);
        jv_free(&v);
        return r;
    }
    *out = v;
    return CLLM_OK;
}

static cllm_status do_sort(jstate *st, json_t *items, const char *attr, bool cs, bool reverse, jval *out) {
    size_t n = json_array_size(items);
    jval *keys = calloc(n + 1, sizeof *keys);
    size_t *idx = malloc((n + 1) * sizeof *idx), *tmp = malloc((n + 1) * sizeof *tmp);
    cllm_status r = (!keys || !idx || !tmp) ? CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory") : CLLM_OK;
    for (size_t i = 0; !r && i < n; i++) {
        idx[i] = i;
        r = sort_key(st, jv_json(json_array_get(items, i)), attr, cs, &keys[i]);
    }
    /* bottom-up merge sort: stable, as Python's sort */
    for (size_t w = 1; !r && w < n; w *= 2) {
        for (size_t lo = 0; !r && lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, a = lo, b = mid, o = lo;
            while (!r && (a < mid || b < hi)) {
                bool take_b = false;
                if (a < mid && b < hi) {
                    int c = 0;
                    r = jv_compare(st, keys[idx[b]], keys[idx[a]], &c);
                    take_b = reverse ? c > 0 : c < 0;
                } else {
                    take_b = a >= mid;
                }
                tmp[o++] = take_b ? idx[b++] : idx[a++];
            }
            if (!r) memcpy(idx + lo, tmp + lo, (hi - lo) * sizeof *idx);
        }
        if (!r) r = jinja_step(st, n);
    }
    json_t *res = r ? NULL : json_array();
    for (size_t i = 0; res && i < n; i++)
        if (json_array_append(res, json_array_get(items, idx[i]))) {
            json_decref(res);
            res = NULL;
        }
    if (!r && !res) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!r) *out = jv_json(res);
    for (size_t i = 0; keys && i < n; i++) jv_free(&keys[i]);
    free(keys);
    free(idx);
    free(tmp);
    return r;
}

/* Python's int(str) / float(str) for the int and float filters. */
static bool parse_pyint(const char *s, size_t n, int64_t *out) {
    char buf[64];
    size_t o = 0, k;
    while (n && ju8_space(s, n, &k)) s += k, n -= k;
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13))) n--;
    for (size_t i = 0; i < n; i++) {
        if (o + 1 >= sizeof buf) return false;
        if (s[i] == '_' && i > 0 && i + 1 < n && s[i - 1] >= '0' && s[i - 1] <= '9' && s[i + 1] >= '0' &&
            s[i + 1] <= '9')
            continue;
        if (!((s[i] >= '0' && s[i] <= '9') || (i == 0 && (s[i] == '-' || s[i] == '+')))) return false;
        buf[o++] = s[i];
    }
    buf[o] = 0;
    return o > 0 && cllm_parse_i64(buf, out);
}

static bool parse_pyfloat(const char *s, size_t n, double *out) {
    char buf[128];
    size_t k;
    while (n && ju8_space(s, n, &k)) s += k, n -= k;
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13))) n--;
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P') return false; /* no hex floats */
    return cllm_parse_f64(buf, out);
}

static cllm_status indent(jstate *st, jval v, jval *width, bool first, bool blank, jval *out) {
    char pad[256];
    size_t pl;
    if (width && jv_is_str(*width)) {
        pl = json_string_length(width->j) < sizeof pad ? json_string_length(width->j) : sizeof pad - 1;
        memcpy(pad, json_string_value(width->j), pl);
    } else {
        int64_t w = width && jv_is_int(*width) ? as_int(*width) : 4;
        if (w < 0) w = 0;
        if (w > 255) return jinja_err(st, "indent width above 255");
        pl = (size_t)w;
        memset(pad, ' ', pl);
    }
    /* Jinja2 splits s + "\n" into lines, so a trailing line break survives */
    size_t n = json_string_length(v.j) + 1, bn = 0, cap = 0;
    char *s = malloc(n + 1), *buf = NULL;
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(s, json_string_value(v.j), n - 1);
    s[n - 1] = '\n';
    s[n] = 0;
    cllm_status r = jbuf_add(st, &buf, &bn, &cap, "", 0);
    if (!r && first) r = jbuf_add(st, &buf, &bn, &cap, pad, pl);
    /* lines as str.splitlines() of s + "\n" */
    size_t p = 0;
    bool line0 = true;
    while (!r && p < n) {
        size_t q = p, brk = 0;
        while (q < n) {
            unsigned char c = (unsigned char)s[q];
            if (c == '\r') brk = q + 1 < n && s[q + 1] == '\n' ? 2 : 1;
            else if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) brk = 1;
            else if (c == 0xC2 && q + 1 < n && (unsigned char)s[q + 1] == 0x85) brk = 2;
            else if (c == 0xE2 && q + 2 < n && (unsigned char)s[q + 1] == 0x80 &&
                     ((unsigned char)s[q + 2] == 0xA8 || (unsigned char)s[q + 2] == 0xA9))
                brk = 3;
            if (brk) break;
            q++;
        }
        if (!line0) {
            r = jbuf_add(st, &buf, &bn, &cap, "\n", 1);
            if (!r && (blank || q > p)) r = jbuf_add(st, &buf, &bn, &cap, pad, pl);
        }
        if (!r) r = jbuf_add(st, &buf, &bn, &cap, s + p, q - p);
        line0 = false;
        p = q + brk;
    }
    if (!r) {
        *out = jv_str(buf, bn);
        r = nomem(out);
    }
    free(buf);
    free(s);
    return r;
}

/* select / reject / selectattr / rejectattr */
static cllm_status select_items(jstate *st, jval v, jval *args, size_t n, bool attr, bool keep, jval *out) {
    json_t *items = NULL;
    cllm_status r = jinja_iter_list(st, v, &items);
    if (r) return r;
    size_t k = 0;
    const char *path = NULL, *test = NULL;
    if (attr) {
        if (k >= n || !jv_is_str(args[k])) r = jinja_err(st, "selectattr/rejectattr need an attribute name");
        else path = json_string_value(args[k++].j);
    }
    if (!r && k < n) {
        if (!jv_is_str(args[k])) r = jinja_err(st, "the test name must be a string");
        else test = json_string_value(args[k++].j);
    }
    json_t *res = json_array();
    for (size_t i = 0; !r && res && i < json_array_size(items); i++) {
        jval item = jv_json(json_array_get(items, i)), x;
        if (path) {
            if ((r = attr_path(st, item, path, &x))) break;
        } else {
            x = jv_copy(item);
        }
        bool ok = false;
        if (test) r = jinja_test(st, test, x, args + k, n - k, &ok);
        else ok = jv_truthy(x);
        jv_free(&x);
        if (!r && ok == keep && json_array_append(res, item.j)) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    json_decref(items);
    if (!r && !res) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (r) json_decref(res);
    else *out = jv_json(res);
    return r;
}

static cllm_status do_map(jstate *st, jval v, jval *args, char **kw, size_t n, jval *out) {
    json_t *items = NULL;
    cllm_status r = jinja_iter_list(st, v, &items);
    if (r) return r;
    jval *attr = jinja_arg(args, kw, n, (size_t)-1, "attribute"), *def = jinja_arg(args, kw, n, (size_t)-1, "default");
    const char *filter = NULL;
    if (!attr) {
        if (n == 0 || (kw && kw[0]) || !jv_is_str(args[0])) r = jinja_err(st, "map() needs a filter name or attribute=");
        else filter = json_string_value(args[0].j);
    } else if (!jv_is_str(*attr)) {
        r = jinja_err(st, "map(attribute=) must be a string");
    }
    json_t *res = json_array();
    for (size_t i = 0; !r && res && i < json_array_size(items); i++) {
        jval item = jv_json(json_array_get(items, i)), x;
        if (filter) r = jinja_filter(st, filter, item, args + 1, kw ? kw + 1 : NULL, n - 1, &x);
        else {
            r = attr_path(st, item, json_string_value(attr->j), &x);
            if (!r && x.k == V_UNDEF && def) {
                jv_free(&x);
                x = jv_copy(*def);
            }
        }
        if (r) break;
        if (json_array_append_new(res, x.k == V_JSON ? json_incref(x.j) : json_null()))
            r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        jv_free(&x);
    }
    json_decref(items);
    if (!r && !res) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (r) json_decref(res);
    else *out = jv_json(res);
    return r;
}

static cllm_status need_str(jstate *st, const char *name, jval v, jval *s) {
    (void)name;
    return jv_stringify(st, v, s);
}

cllm_status jinja_filter(jstate *st, const char *name, jval v, jval *args, char **kw, size_t n, jval *out) {
    cllm_status r = CLLM_OK;
    jval s = jv_undef(NULL);
    jval *a0 = jinja_arg(args, kw, n, 0, NULL), *a1 = jinja_arg(args, kw, n, 1, NULL);
    *out = jv_undef(NULL);
    if (jv_is_str(v) && (r = jinja_step(st, json_string_length(v.j) / 64))) return r;
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jval *dv = jinja_arg(args, kw, n, 0, "default_value");
        bool boolean = jinja_arg(args, kw, n, 1, "boolean") && jv_truthy(*jinja_arg(args, kw, n, 1, "boolean"));
        if (v.k == V_UNDEF || (boolean && !jv_truthy(v))) *out = dv ? jv_copy(*dv) : jv_str("", 0);
        else *out = jv_copy(v);
        return nomem(out);
    }
    if (!strcmp(name, "safe") || !strcmp(name, "string") || !strcmp(name, "e") || !strcmp(name, "escape")) {
        if (name[0] == 's' && name[1] == 'a') {
            *out = jv_copy(v);
            return CLLM_OK;
        }
        if ((r = jv_stringify(st, v, &s))) return r;
        if (name[0] == 's') {
            *out = s;
            return CLLM_OK;
        }
        static const char *const from[] = {"&", "<", ">", "\"", "'"};
        static const char *const to[] = {"&amp;", "&lt;", "&gt;", "&#34;", "&#39;"};
        for (int i = 0; !r && i < 5; i++) {
            jval f = jv_str(from[i], 1), t = jv_str(to[i], strlen(to[i])), x;
            if (!(r = jinja_replace(st, s, &f, &t, NULL, &x))) {
                jv_free(&s);
                s = x;
            }
            jv_free(&f);
            jv_free(&t);
        }
        if (r) jv_free(&s);
        else *out = s;
        return r;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        int64_t len = jv_len(v);
        if (len < 0) return jinja_err(st, "object of type '%s' has no len()", jv_type(v));
        *out = jv_int(len);
        return nomem(out);
    }
    if (!strcmp(name, "tojson")) {
        jval *ind = jinja_arg(args, kw, n, 0, "indent");
        if (ind && !is_none(ind) && !jv_is_int(*ind)) return jinja_err(st, "tojson(indent=) must be an integer");
        int64_t in = is_none(ind) ? -1 : as_int(*ind);
        if (in > 64) return jinja_err(st, "tojson(indent=) above 64");
        return jv_tojson(st, v, in < 0 && !is_none(ind) ? 0 : (int)in, out);
    }
    if (!strcmp(name, "trim") || !strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize") ||
        !strcmp(name, "title") || !strcmp(name, "replace") || !strcmp(name, "indent")) {
        if ((r = need_str(st, name, v, &s))) return r;
        if (name[0] == 't' && name[1] == 'r') r = jinja_strip(st, s, jinja_arg(args, kw, n, 0, "chars"), 3, out);
        else if (name[0] == 'u') r = jinja_recase(st, s, 'u', out);
        else if (name[0] == 'l') r = jinja_recase(st, s, 'l', out);
        else if (name[0] == 'c') r = jinja_recase(st, s, 'c', out);
        else if (name[0] == 't') r = jinja_recase(st, s, 't', out);
        else if (name[0] == 'r') r = jinja_replace(st, s, a0, a1, jinja_arg(args, kw, n, 2, "count"), out);
        else {
            jval *f = jinja_arg(args, kw, n, 1, "first"), *b = jinja_arg(args, kw, n, 2, "blank");
            r = indent(st, s, jinja_arg(args, kw, n, 0, "width"), f && jv_truthy(*f), b && jv_truthy(*b), out);
        }
        jv_free(&s);
        return r;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last") || !strcmp(name, "list") || !strcmp(name, "reverse") ||
        !strcmp(name, "unique") || !strcmp(name, "sort") || !strcmp(name, "join") || !strcmp(name, "sum")) {
        json_t *items = NULL;
        if ((r = jinja_iter_list(st, v, &items))) return r;
        size_t len = json_array_size(items);
        if (name[0] == 'f' || name[0] == 'l') {
            if (name[0] == 'l' && name[1] == 'i') *out = jv_json(json_incref(items));
            else if (len) *out = jv_json(json_incref(json_array_get(items, name[0] == 'f' ? 0 : len - 1)));
        } else if (!strcmp(name, "reverse")) {
            if (jv_is_str(v)) {
                jval all = jv_str("", 0);
                for (size_t i = len; !r && i-- > 0;) {
                    jval c = jv_json(json_incref(json_array_get(items, i))), x;
                    char *dummy = NULL;
                    (void)dummy;
                    size_t an = json_string_length(all.j), cn = json_string_length(c.j);
                    char *b = malloc(an + cn + 1);
                    if (!b) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                    else {
                        memcpy(b, json_string_value(all.j), an);
                        memcpy(b + an, json_string_value(c.j), cn);
                        x = jv_str(b, an + cn);
                        free(b);
                        jv_free(&all);
                        all = x;
                    }
                    jv_free(&c);
                }
                *out = all;
            } else {
                json_t *a = json_array();
                for (size_t i = len; a && i-- > 0;)
                    if (json_array_append(a, json_array_get(items, i))) {
                        json_decref(a);
                        a = NULL;
                    }
                *out = jv_json(a);
            }
        } else if (!strcmp(name, "unique") || !strcmp(name, "sort")) {
            jval *cs = jinja_arg(args, kw, n, name[0] == 'u' ? 0 : 1, "case_sensitive");
            jval *at = jinja_arg(args, kw, n, name[0] == 'u' ? 1 : 2, "attribute");
            const char *attr = at && jv_is_str(*at) ? json_string_value(at->j) : NULL;
            if (name[0] == 's') {
                jval *rev = jinja_arg(args, kw, n, 0, "reverse");
                r = do_sort(st, items, attr, cs && jv_truthy(*cs), rev && jv_truthy(*rev), out);
            } else {
                json_t *res = json_array(), *seen = json_array();
                for (size_t i = 0; !r && i < len; i++) {
                    jval key;
                    if ((r = sort_key(st, jv_json(json_array_get(items, i)), attr, cs && jv_truthy(*cs), &key)))
                        break;
                    bool dup = false;
                    for (size_t j = 0; !dup && j < json_array_size(seen); j++)
                        dup = jv_equal(key, jv_json(json_array_get(seen, j)));
                    if ((r = jinja_step(st, json_array_size(seen)))) {
                        jv_free(&key);
                        break;
                    }
                    if (!dup) {
                        json_array_append(res, json_array_get(items, i));
                        json_array_append_new(seen, key.k == V_JSON ? json_incref(key.j) : json_null());
                    }
                    jv_free(&key);
                }
                json_decref(seen);
                if (r) json_decref(res);
                else *out = jv_json(res);
            }
        } else if (!strcmp(name, "join")) {
            jval *sep = jinja_arg(args, kw, n, 0, "d"), *at = jinja_arg(args, kw, n, 1, "attribute");
            char *buf = NULL;
            size_t bn = 0, cap = 0;
            jval sp = jv_undef(NULL);
            if (sep) r = jv_stringify(st, *sep, &sp);
            if (!r) r = jbuf_add(st, &buf, &bn, &cap, "", 0);
            for (size_t i = 0; !r && i < len; i++) {
                jval item = jv_json(json_array_get(items, i)), x;
                if (at && jv_is_str(*at)) r = attr_path(st, item, json_string_value(at->j), &x);
                else x = jv_copy(item);
                if (!r && i && sp.j) r = jbuf_add(st, &buf, &bn, &cap, json_string_value(sp.j), json_string_length(sp.j));
                if (!r) r = jv_to_str(st, x, &buf, &bn, &cap);
                jv_free(&x);
            }
            if (!r) *out = jv_str(buf, bn);
            free(buf);
            jv_free(&sp);
        } else { /* sum */
            jval *at = jinja_arg(args, kw, n, 0, "attribute"), *start = jinja_arg(args, kw, n, 1, "start");
            jval acc = start ? jv_copy(*start) : jv_int(0);
            for (size_t i = 0; !r && i < len; i++) {
                jval item = jv_json(json_array_get(items, i)), x, y;
                if (at && jv_is_str(*at)) r = attr_path(st, item, json_string_value(at->j), &x);
                else x = jv_copy(item);
                if (r) break;
                if (!jv_is_num(acc) || !jv_is_num(x)) r = jinja_err(st, "sum() of non-numbers");
                else if (jv_is_int(acc) && jv_is_int(x)) {
                    int64_t t;
                    if (__builtin_add_overflow(as_int(acc), as_int(x), &t)) r = jinja_err(st, "integer overflow");
                    else y = jv_int(t);
                } else {
                    y = jv_float(jv_num(acc) + jv_num(x));
                }
                jv_free(&x);
                if (!r) {
                    jv_free(&acc);
                    acc = y;
                }
            }
            if (r) jv_free(&acc);
            else *out = acc;
        }
        json_decref(items);
        if (!r) r = nomem(out);
        return r;
    }
    if (!strcmp(name, "items")) {
        if (v.k == V_UNDEF) {
            *out = jv_json(json_array());
            return nomem(out);
        }
        if (!(v.k == V_JSON && json_is_object(v.j))) return jinja_err(st, "can only get item pairs from a mapping");
        bool found;
        return jinja_method(st, v, "items", NULL, NULL, 0, out, &found);
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        jval *def = jinja_arg(args, kw, n, 0, "default");
        bool isint = name[0] == 'i';
        int64_t i = 0;
        double f = 0;
        bool ok = false;
        if (jv_is_num(v)) {
            f = jv_num(v);
            if (jv_is_int(v)) i = as_int(v);
            else if (f > -9.2e18 && f < 9.2e18) i = (int64_t)f;
            else if (isint) return jinja_err(st, "int() of %g is out of range", f);
            ok = true;
        } else if (jv_is_str(v)) {
            const char *str = json_string_value(v.j);
            size_t sn = json_string_length(v.j);
            if (isint && parse_pyint(str, sn, &i)) ok = true, f = (double)i;
            else if (parse_pyfloat(str, sn, &f) && isfinite(f)) {
                ok = !isint || (f > -9.2e18 && f < 9.2e18);
                i = ok ? (int64_t)f : 0;
            }
        }
        if (!ok) *out = def ? jv_copy(*def) : isint ? jv_int(0) : jv_float(0.0);
        else *out = isint ? jv_int(i) : jv_float(f);
        return nomem(out);
    }
    if (!strcmp(name, "abs")) {
        if (!jv_is_num(v)) return jinja_err(st, "bad operand type for abs(): '%s'", jv_type(v));
        if (jv_is_int(v)) {
            if (as_int(v) == INT64_MIN) return jinja_err(st, "integer overflow");
            *out = jv_int(as_int(v) < 0 ? -as_int(v) : as_int(v));
        } else {
            *out = jv_float(fabs(jv_num(v)));
        }
        return nomem(out);
    }
    if (!strcmp(name, "round")) {
        jval *pr = jinja_arg(args, kw, n, 0, "precision"), *me = jinja_arg(args, kw, n, 1, "method");
        int64_t p = pr && jv_is_int(*pr) ? as_int(*pr) : 0;
        const char *m = me && jv_is_str(*me) ? json_string_value(me->j) : "common";
        if (!jv_is_num(v)) return jinja_err(st, "round() of a '%s'", jv_type(v));
        if (p < 0 || p > 15) return jinja_err(st, "round() precision must be 0..15");
        double x = jv_num(v), res;
        if (!strcmp(m, "common")) {
            if (jv_is_int(v) && !pr) {
                *out = jv_int(as_int(v));
                return nomem(out);
            }
            char buf[512];
            snprintf(buf, sizeof buf, "%.*f", (int)p, x); /* exact binary value, ties to even: Python's round */
            res = strtod(buf, NULL);
        } else if (!strcmp(m, "ceil") || !strcmp(m, "floor")) {
            double sc = pow(10, (double)p);
            res = (m[0] == 'c' ? ceil(x * sc) : floor(x * sc)) / sc;
        } else {
            return jinja_err(st, "round() method must be 'common', 'ceil' or 'floor'");
        }
        *out = jv_float(res);
        return nomem(out);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_items(st, v, args, n, true, name[0] == 's', out);
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return select_items(st, v, args, n, false, name[0] == 's' && name[2] == 'l', out);
    if (!strcmp(name, "map")) return do_map(st, v, args, kw, n, out);
    if (!strcmp(name, "attr")) {
        if (!a0 || !jv_is_str(*a0)) return jinja_err(st, "attr() needs a name");
        r = jinja_getattr(st, v, json_string_value(a0->j), out);
        if (!r && out->k == V_UNDEF) out->name = NULL; /* the name is the caller's argument, freed after the call */
        return r;
    }
    if (!strcmp(name, "wordcount")) {
        if ((r = jv_stringify(st, v, &s))) return r;
        jval parts;
        if (!(r = jinja_method(st, s, "split", NULL, NULL, 0, &parts, &(bool){false}))) {
            *out = jv_int((int64_t)json_array_size(parts.j));
            jv_free(&parts);
        }
        jv_free(&s);
        return r ? r : nomem(out);
    }
    return jinja_err(st, "no filter named '%s'", name);
}

cllm_status jinja_test(jstate *st, const char *name, jval v, jval *args, size_t n, bool *out) {
    jval *a = n ? &args[0] : NULL;
    bool isj = v.k == V_JSON;
    *out = false;
    if (!strcmp(name, "defined")) *out = v.k != V_UNDEF;
    else if (!strcmp(name, "undefined")) *out = v.k == V_UNDEF;
    else if (!strcmp(name, "none")) *out = isj && json_is_null(v.j);
    else if (!strcmp(name, "string")) *out = jv_is_str(v);
    else if (!strcmp(name, "number")) *out = jv_is_num(v);
    else if (!strcmp(name, "integer")) *out = isj && json_is_integer(v.j);
    else if (!strcmp(name, "float")) *out = isj && json_is_real(v.j);
    else if (!strcmp(name, "boolean")) *out = isj && json_is_boolean(v.j);
    else if (!strcmp(name, "true")) *out = isj && json_is_true(v.j);
    else if (!strcmp(name, "false")) *out = isj && json_is_false(v.j);
    else if (!strcmp(name, "mapping")) *out = isj && json_is_object(v.j);
    else if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        *out = v.k == V_UNDEF || (isj && (json_is_string(v.j) || json_is_array(v.j) || json_is_object(v.j)));
    else if (!strcmp(name, "callable")) *out = v.k == V_MACRO;
    else if (!strcmp(name, "escaped")) *out = false;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (jv_is_str(v)) {
            jval c;
            cllm_status r = jinja_recase(st, v, name[0] == 'l' ? 'l' : 'u', &c);
            if (r) return r;
            *out = jv_equal(c, v);
            jv_free(&c);
        }
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        int64_t d = name[0] == 'd' ? (a && jv_is_int(*a) ? as_int(*a) : 0) : 2;
        if (!jv_is_int(v)) return jinja_err(st, "the '%s' test needs an integer, not '%s'", name, jv_type(v));
        if (d == 0) return jinja_err(st, "divisibleby(0)");
        int64_t m = d == -1 ? 0 : as_int(v) % d;
        *out = name[0] == 'o' ? m != 0 : m == 0;
    } else if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==") || !strcmp(name, "sameas")) {
        if (!a) return jinja_err(st, "the '%s' test needs a value", name);
        *out = jv_equal(v, *a);
        if (name[0] == 's' && isj && a->k == V_JSON && json_typeof(v.j) != json_typeof(a->j)) *out = false;
    } else if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        if (!a) return jinja_err(st, "the '%s' test needs a value", name);
        *out = !jv_equal(v, *a);
    } else if (!strcmp(name, "lt") || !strcmp(name, "le") || !strcmp(name, "gt") || !strcmp(name, "ge") ||
               !strcmp(name, "lessthan") || !strcmp(name, "greaterthan") || !strcmp(name, "<") ||
               !strcmp(name, "<=") || !strcmp(name, ">") || !strcmp(name, ">=")) {
        if (!a) return jinja_err(st, "the '%s' test needs a value", name);
        int c;
        cllm_status r = jv_compare(st, v, *a, &c);
        if (r) return r;
        bool lt = name[0] == 'l' || name[0] == '<', eq = name[1] == 'e' || name[1] == '=';
        *out = lt ? (eq ? c <= 0 : c < 0) : (eq ? c >= 0 : c > 0);
    } else if (!strcmp(name, "in")) {
        if (!a) return jinja_err(st, "the 'in' test needs a container");
        if (a->k == V_UNDEF) return CLLM_OK;
        if (jv_is_str(*a)) {
            if (!jv_is_str(v)) return jinja_err(st, "'in <string>' requires a string on the left");
            size_t hn = json_string_length(a->j), nn = json_string_length(v.j);
            *out = jfind(json_string_value(a->j), hn, 0, json_string_value(v.j), nn) != SIZE_MAX;
        } else if (a->k == V_JSON && json_is_array(a->j)) {
            for (size_t i = 0; !*out && i < json_array_size(a->j); i++)
                *out = jv_equal(v, jv_json(json_array_get(a->j, i)));
        } else if (a->k == V_JSON && json_is_object(a->j)) {
            *out = jv_is_str(v) && json_object_getn(a->j, json_string_value(v.j), json_string_length(v.j));
        } else {
            return jinja_err(st, "argument of type '%s' is not iterable", jv_type(*a));
        }
    } else {
        return jinja_err(st, "no test named '%s'", name);
    }
    return CLLM_OK;
}
