/*
 * Chat-template evaluator: runs the syntax tree of jinja_parse.c against
 * one render's variables, with Jinja2's scoping (a for loop and a macro
 * call open a scope, if does not; `set` inside a loop stays in the loop,
 * which is why templates use namespaces), Python's operators, and the
 * bounds of cllm/chat_template.h charged as it goes (every expression node,
 * statement and loop iteration is one step).
 *
 * Left out: recursive loops, call blocks, macro varargs / kwargs / caller,
 * Python's `%` string formatting.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_impl.h"

typedef struct {
    char *name;
    jval v;
} jvar;

struct jscope {
    jscope *parent;
    jvar *v;
    size_t n, cap;
};

static jscope *scope_push(jstate *st, jscope *parent) {
    jscope *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->parent = parent;
    (void)st;
    return s;
}

static void scope_free(jscope *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        jv_free(&s->v[i].v);
    }
    free(s->v);
    free(s);
}

/* Binds name in scope s; takes v. */
static cllm_status scope_set(jscope *s, const char *name, jval v) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].name, name)) {
            jv_free(&s->v[i].v);
            s->v[i].v = v;
            return CLLM_OK;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        jvar *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv) {
            jv_free(&v);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        s->v = nv;
        s->cap = cap;
    }
    char *c = strdup(name);
    if (!c) {
        jv_free(&v);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    s->v[s->n].name = c;
    s->v[s->n++].v = v;
    return CLLM_OK;
}

static const jval *lookup(const jstate *st, const char *name) {
    for (const jscope *s = st->cur; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->v[i].name, name)) return &s->v[i].v;
    return NULL;
}


cllm_status jinja_scope_root(jstate *st) {
    st->root = st->cur = scope_push(st, NULL);
    return st->root ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
}
void jinja_scope_end(jstate *st) {
    while (st->cur && st->cur != st->root) {
        jscope *p = st->cur->parent;
        scope_free(st->cur);
        st->cur = p;
    }
    scope_free(st->root);
    st->root = st->cur = NULL;
}
cllm_status jinja_define(jstate *st, const char *name, jval v) { return scope_set(st->root, name, v); }

static cllm_status nomem_if(jval *v) {
    if (v->k == V_JSON && !v->j) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

static cllm_status undefined_err(jstate *st, jval v) {
    if (v.name) return jinja_err(st, "'%s' is undefined", v.name);
    return jinja_err(st, "an undefined value was used");
}

/* ---- arithmetic ---- */

static cllm_status num_result(jstate *st, double f, jval *out) {
    if (!isfinite(f)) return jinja_err(st, "the result is not a finite number");
    *out = jv_float(f);
    return nomem_if(out);
}

static cllm_status repeat(jstate *st, jval seq, int64_t times, jval *out) {
    if (times < 0) times = 0;
    if (jv_is_str(seq)) {
        size_t len = json_string_length(seq.j);
        if (len && (uint64_t)times > JINJA_MAX_OUT / len) return jinja_err(st, "string repetition too long");
        cllm_status r = jinja_step(st, len * (size_t)times / 64);
        if (r) return r;
        char *b = malloc(len * (size_t)times + 1);
        if (!b) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < times; i++) memcpy(b + (size_t)i * len, json_string_value(seq.j), len);
        *out = jv_str(b, len * (size_t)times);
        free(b);
        return nomem_if(out);
    }
    size_t n = json_array_size(seq.j);
    if (n && (uint64_t)times > JINJA_MAX_RANGE / n) return jinja_err(st, "list repetition too long");
    cllm_status r;
    if ((r = jinja_step(st, n * (size_t)times))) return r;
    json_t *a = json_array();
    for (int64_t i = 0; a && i < times; i++)
        if (json_array_extend(a, seq.j)) {
            json_decref(a);
            a = NULL;
        }
    *out = jv_json(a);
    return nomem_if(out);
}

static cllm_status binop(jstate *st, int op, jval a, jval b, jval *out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.k == V_UNDEF) return undefined_err(st, a);
    if (b.k == V_UNDEF) return undefined_err(st, b);
    bool an = jv_is_num(a), bn = jv_is_num(b);
    if (an && bn) {
        bool ints = jv_is_int(a) && jv_is_int(b);
        /* Integers are read as integers: a double near 2^63 converted to
         * int64_t would be undefined. */
        int64_t x = ints ? jv_int_value(a) : 0, y = ints ? jv_int_value(b) : 0, r;
        double f = jv_num(a), g = jv_num(b);
        switch (op) {
        case OP_ADD:
            if (!ints) return num_result(st, f + g, out);
            if (__builtin_add_overflow(x, y, &r)) return jinja_err(st, "integer overflow");
            *out = jv_int(r);
            return nomem_if(out);
        case OP_SUB:
            if (!ints) return num_result(st, f - g, out);
            if (__builtin_sub_overflow(x, y, &r)) return jinja_err(st, "integer overflow");
            *out = jv_int(r);
            return nomem_if(out);
        case OP_MUL:
            if (!ints) return num_result(st, f * g, out);
            if (__builtin_mul_overflow(x, y, &r)) return jinja_err(st, "integer overflow");
            *out = jv_int(r);
            return nomem_if(out);
        case OP_DIV:
            if (g == 0) return jinja_err(st, "division by zero");
            return num_result(st, f / g, out);
        case OP_FLOORDIV:
        case OP_MOD:
            if (g == 0) return jinja_err(st, "integer division or modulo by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) return jinja_err(st, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == OP_MOD ? m : q);
                return nomem_if(out);
            } else {
                double m = fmod(f, g);
                if (m != 0 && ((m < 0) != (g < 0))) m += g;
                if (op == OP_MOD) return num_result(st, m, out);
                return num_result(st, floor(f / g), out);
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t p = 1;
                for (int64_t i = 0; i < y; i++) {
                    if (__builtin_mul_overflow(p, x, &p)) return jinja_err(st, "integer overflow");
                    if (p == 0 || p == 1) break;
                    if (p == -1 && (y - i - 1) % 2 == 0) break;
                }
                *out = jv_int(p);
                return nomem_if(out);
            }
            return num_result(st, pow(f, g), out);
        }
    }
    if (op == OP_ADD && jv_is_str(a) && jv_is_str(b)) {
        size_t la = json_string_length(a.j), lb = json_string_length(b.j);
        if (la + lb > JINJA_MAX_OUT) return jinja_err(st, "string too long");
        cllm_status r = jinja_step(st, (la + lb) / 64);
        if (r) return r;
        char *buf = malloc(la + lb + 1);
        if (!buf) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        memcpy(buf, json_string_value(a.j), la);
        memcpy(buf + la, json_string_value(b.j), lb);
        *out = jv_str(buf, la + lb);
        free(buf);
        return nomem_if(out);
    }
    if (op == OP_ADD && a.k == V_JSON && b.k == V_JSON && json_is_array(a.j) && json_is_array(b.j)) {
        cllm_status r;
        if ((r = jinja_step(st, json_array_size(a.j) + json_array_size(b.j)))) return r;
        json_t *c = json_copy(a.j);
        if (c && json_array_extend(c, b.j)) {
            json_decref(c);
            c = NULL;
        }
        *out = jv_json(c);
        return nomem_if(out);
    }
    if (op == OP_MUL && (jv_is_str(a) || (a.k == V_JSON && json_is_array(a.j))) && jv_is_int(b))
        return repeat(st, a, jv_int_value(b), out);
    if (op == OP_MUL && (jv_is_str(b) || (b.k == V_JSON && json_is_array(b.j))) && jv_is_int(a))
        return repeat(st, b, jv_int_value(a), out);
    return jinja_err(st, "unsupported operand types for %s: '%s' and '%s'", names[op], jv_type(a), jv_type(b));
}

static cllm_status contains(jstate *st, jval item, jval seq, bool *out) {
    *out = false;
    if (seq.k == V_UNDEF) return CLLM_OK;
    if (jv_is_str(seq)) {
        if (!jv_is_str(item))
            return jinja_err(st, "'in <string>' requires a string on the left, not '%s'", jv_type(item));
        size_t n = json_string_length(seq.j), m = json_string_length(item.j);
        const char *h = json_string_value(seq.j), *nd = json_string_value(item.j);
        *out = jfind(h, n, 0, nd, m) != SIZE_MAX;
        return CLLM_OK;
    }
    if (seq.k == V_JSON && json_is_array(seq.j)) {
        for (size_t i = 0; i < json_array_size(seq.j); i++)
            if (jv_equal(item, jv_json(json_array_get(seq.j, i)))) {
                *out = true;
                break;
            }
        return CLLM_OK;
    }
    if ((seq.k == V_JSON || seq.k == V_NS) && json_is_object(seq.j)) {
        if (jv_is_str(item)) *out = json_object_getn(seq.j, json_string_value(item.j), json_string_length(item.j));
        return CLLM_OK;
    }
    return jinja_err(st, "argument of type '%s' is not iterable", jv_type(seq));
}

/* ---- calls ---- */

static void free_args(jval *args, size_t n) {
    for (size_t i = 0; i < n; i++) jv_free(&args[i]);
    free(args);
}

static cllm_status eval_args(jstate *st, const jnode *e, jval **args) {
    *args = calloc(e->args.n + 1, sizeof **args);
    if (!*args) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < e->args.n; i++) {
        cllm_status r = jinja_eval(st, e->args.v[i], &(*args)[i]);
        if (r) {
            free_args(*args, e->args.n);
            *args = NULL;
            return r;
        }
    }
    return CLLM_OK;
}

/* Runs body with its output captured as a string value. */
static cllm_status capture(jstate *st, const jlist *body, jval *out) {
    char *save = st->out;
    size_t sn = st->n, sc = st->cap;
    st->out = NULL;
    st->n = st->cap = 0;
    cllm_status r = jbuf_add(st, &st->out, &st->n, &st->cap, "", 0);
    if (!r) r = jinja_exec_list(st, body);
    if (!r) {
        *out = jv_str(st->out, st->n);
        r = nomem_if(out);
    }
    free(st->out);
    st->out = save;
    st->n = sn;
    st->cap = sc;
    return r;
}

static cllm_status call_macro(jstate *st, const jnode *m, jval *args, char **kw, size_t n, jval *out) {
    if (st->macro_depth >= JINJA_MAX_DEPTH)
        return jinja_err(st, "macros nested deeper than %d calls", JINJA_MAX_DEPTH);
    size_t n_pos = 0;
    for (size_t i = 0; i < n; i++)
        if (!kw || !kw[i]) n_pos++;
    if (n_pos > m->items.n)
        return jinja_err(st, "macro '%s' takes not more than %zu argument(s)", m->s, m->items.n);
    jscope *s = scope_push(st, st->root);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    jscope *saved = st->cur;
    st->cur = s;
    cllm_status r = CLLM_OK;
    size_t pos = 0;
    for (size_t i = 0; !r && i < n; i++) {
        if (kw && kw[i]) {
            size_t p = 0;
            while (p < m->items.n && strcmp(m->items.v[p]->s, kw[i])) p++;
            if (p == m->items.n) r = jinja_err(st, "macro '%s' takes no keyword argument '%s'", m->s, kw[i]);
            else r = scope_set(s, kw[i], jv_copy(args[i]));
        } else {
            r = scope_set(s, m->items.v[pos++]->s, jv_copy(args[i]));
        }
    }
    for (size_t p = 0; !r && p < m->items.n; p++) {
        bool bound = false;
        for (size_t i = 0; i < s->n; i++)
            if (!strcmp(s->v[i].name, m->items.v[p]->s)) bound = true;
        if (bound) continue;
        jval d = jv_undef(m->items.v[p]->s);
        if (m->args.v[p]) r = jinja_eval(st, m->args.v[p], &d);
        if (!r) r = scope_set(s, m->items.v[p]->s, d);
    }
    st->macro_depth++;
    int save_ctl = st->loop_ctl;
    if (!r) r = capture(st, &m->body, out);
    st->loop_ctl = save_ctl;
    st->macro_depth--;
    st->cur = saved;
    scope_free(s);
    return r;
}

static cllm_status loop_cycle(jstate *st, jval loop, jval *args, size_t n, jval *out) {
    if (!n) return jinja_err(st, "loop.cycle needs at least one value");
    int64_t i = json_integer_value(json_object_get(loop.j, "index0"));
    *out = jv_copy(args[i % (int64_t)n]);
    return CLLM_OK;
}

static cllm_status eval_call(jstate *st, const jnode *e, jval *out) {
    jval *args = NULL;
    cllm_status r = eval_args(st, e, &args);
    if (r) return r;
    size_t n = e->args.n;
    const jnode *c = e->a;
    jval f = jv_undef(NULL);
    if (c->kind == E_ATTR) {
        jval obj;
        if (!(r = jinja_eval(st, c->a, &obj))) {
            bool found = false;
            st->line = e->line;
            if (obj.k == V_JSON && c->a->kind == E_NAME && !strcmp(c->a->s, "loop") && !strcmp(c->s, "cycle") &&
                json_is_object(obj.j) && json_object_get(obj.j, "index0")) {
                r = loop_cycle(st, obj, args, n, out);
                found = true;
            } else if (obj.k == V_JSON) {
                r = jinja_method(st, obj, c->s, args, e->kw, n, out, &found);
            }
            if (!r && !found) {
                r = jinja_getattr(st, obj, c->s, &f);
                if (!r && f.k == V_UNDEF)
                    r = jinja_err(st, "'%s' object has no method '%s'", jv_type(obj), c->s);
            }
            jv_free(&obj);
            if (r || found) goto done;
        } else {
            goto done;
        }
    } else if (c->kind == E_NAME) {
        const jval *v = lookup(st, c->s);
        if (!v) {
            st->line = e->line;
            r = jinja_global(st, c->s, args, e->kw, n, out);
            goto done;
        }
        f = jv_copy(*v);
    } else if ((r = jinja_eval(st, c, &f))) {
        goto done;
    }
    st->line = e->line;
    if (f.k == V_MACRO) r = call_macro(st, f.m, args, e->kw, n, out);
    else if (f.k == V_UNDEF) r = undefined_err(st, f);
    else r = jinja_err(st, "'%s' object is not callable", jv_type(f));
done:
    jv_free(&f);
    free_args(args, n);
    return r;
}

/* Applies the one filter of node f to `in` (borrowed). */
static cllm_status apply_one(jstate *st, const jnode *f, jval in, jval *out) {
    jval *args = NULL;
    cllm_status r = eval_args(st, f, &args);
    if (r) return r;
    st->line = f->line;
    r = jinja_filter(st, f->s, in, args, f->kw, f->args.n, out);
    free_args(args, f->args.n);
    return r;
}

/* Applies a chain of E_FILTER nodes whose innermost operand is a
 * placeholder to `in` (taken). */
static cllm_status apply_chain(jstate *st, const jnode *chain, jval in, jval *out) {
    if (!chain || chain->kind != E_FILTER) {
        *out = in;
        return CLLM_OK;
    }
    jval inner;
    cllm_status r = apply_chain(st, chain->a, in, &inner);
    if (r) return r;
    r = apply_one(st, chain, inner, out);
    jv_free(&inner);
    return r;
}

/* ---- expressions ---- */

static cllm_status eval_slice(jstate *st, const jnode *e, jval obj, jval *out) {
    jval part[3] = {jv_undef(NULL), jv_undef(NULL), jv_undef(NULL)};
    const jnode *pn[3] = {e->b, e->c, e->d};
    cllm_status r = CLLM_OK;
    int64_t v[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; !r && k < 3; k++) {
        if (!pn[k]) continue;
        if ((r = jinja_eval(st, pn[k], &part[k]))) break;
        if (part[k].k == V_JSON && json_is_null(part[k].j)) continue;
        if (!jv_is_int(part[k])) r = jinja_err(st, "slice indices must be integers or none");
        else {
            v[k] = jv_int_value(part[k]);
            given[k] = true;
        }
    }
    for (int k = 0; k < 3; k++) jv_free(&part[k]);
    if (r) return r;
    st->line = e->line;
    bool str = jv_is_str(obj);
    if (!str && !(obj.k == V_JSON && json_is_array(obj.j))) {
        if (obj.k == V_UNDEF) return undefined_err(st, obj);
        return jinja_err(st, "'%s' object is not subscriptable", jv_type(obj));
    }
    int64_t step = v[2];
    if (step == 0) return jinja_err(st, "slice step cannot be zero");
    const char *s = str ? json_string_value(obj.j) : NULL;
    size_t slen = str ? json_string_length(obj.j) : 0;
    int64_t len = str ? ju8_count(s, slen) : (int64_t)json_array_size(obj.j);
    int64_t lo, hi;
    if (step > 0) {
        lo = given[0] ? v[0] : 0;
        hi = given[1] ? v[1] : len;
        if (lo < 0) lo = lo + len < 0 ? 0 : lo + len;
        if (hi < 0) hi = hi + len < 0 ? 0 : hi + len;
        if (lo > len) lo = len;
        if (hi > len) hi = len;
    } else {
        lo = given[0] ? v[0] : len - 1;
        hi = given[1] ? v[1] : -1 - len;
        if (lo < 0) lo = lo + len < 0 ? -1 : lo + len;
        if (hi < 0) hi = hi + len < 0 ? -1 : hi + len;
        if (lo >= len) lo = len - 1;
        if (hi >= len) hi = len - 1;
    }
    if ((r = jinja_step(st, (uint64_t)len))) return r;
    if (str) {
        /* code point offsets, so slices never cut a character */
        size_t *off = malloc(((size_t)len + 1) * sizeof *off);
        char *buf = malloc(slen + 1);
        if (!off || !buf) {
            free(off);
            free(buf);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        size_t p = 0;
        for (int64_t i = 0; i <= len; i++) {
            off[i] = p;
            if (p < slen) {
                p++;
                while (p < slen && ((unsigned char)s[p] & 0xC0) == 0x80) p++;
            }
        }
        size_t o = 0;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
            memcpy(buf + o, s + off[i], off[i + 1] - off[i]);
            o += off[i + 1] - off[i];
        }
        *out = jv_str(buf, o);
        free(off);
        free(buf);
        return nomem_if(out);
    }
    json_t *a = json_array();
    for (int64_t i = lo; a && (step > 0 ? i < hi : i > hi); i += step)
        if (json_array_append(a, json_array_get(obj.j, (size_t)i))) {
            json_decref(a);
            a = NULL;
        }
    *out = jv_json(a);
    return nomem_if(out);
}

/* A value stored in a list or dict literal: JSON only. */
static json_t *to_json_item(jval *v) {
    if (v->k == V_JSON) {
        json_t *j = v->j;
        v->j = NULL;
        v->k = V_UNDEF;
        return j;
    }
    return json_null();
}

cllm_status jinja_eval(jstate *st, const jnode *e, jval *out) {
    cllm_status r;
    *out = jv_undef(NULL);
    st->line = e->line;
    if ((r = jinja_step(st, 1))) return r;
    /* nesting across macro calls too: bounds the C stack a render uses */
    if (++st->depth > 2000) {
        st->depth--;
        return jinja_err(st, "expression nested too deeply");
    }
    jval a = jv_undef(NULL), b = jv_undef(NULL);
    switch (e->kind) {
    case E_STR: *out = jv_str(e->s, e->slen); break;
    case E_INT: *out = jv_int(e->i); break;
    case E_FLOAT: r = num_result(st, e->f, out); break;
    case E_BOOL: *out = jv_bool(e->i != 0); break;
    case E_NONE: *out = jv_none(); break;
    case E_NAME: {
        const jval *v = lookup(st, e->s);
        *out = v ? jv_copy(*v) : jv_undef(e->s);
        break;
    }
    case E_LIST:
    case E_TUPLE:
    case E_DICT: {
        json_t *c = e->kind == E_DICT ? json_object() : json_array();
        if (!c) {
            r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        for (size_t i = 0; !r && i < e->items.n; i++) {
            if ((r = jinja_eval(st, e->items.v[i], &a))) break;
            if (e->kind == E_DICT) {
                if (!jv_is_str(a)) {
                    st->line = e->line;
                    r = jinja_err(st, "dict keys must be strings here, not '%s'", jv_type(a));
                    break;
                }
                if ((r = jinja_eval(st, e->items.v[++i], &b))) break;
                if (json_object_setn_new_nocheck(c, json_string_value(a.j), json_string_length(a.j),
                                                 to_json_item(&b)))
                    r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                jv_free(&b);
            } else if (json_array_append_new(c, to_json_item(&a))) {
                r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            }
            jv_free(&a);
        }
        if (r) json_decref(c);
        else *out = jv_json(c);
        break;
    }
    case E_ATTR:
        if (!(r = jinja_eval(st, e->a, &a))) {
            st->line = e->line;
            r = jinja_getattr(st, a, e->s, out);
        }
        break;
    case E_ITEM:
        if (!(r = jinja_eval(st, e->a, &a)) && !(r = jinja_eval(st, e->b, &b))) {
            st->line = e->line;
            r = jinja_getitem(st, a, b, out);
        }
        break;
    case E_SLICE:
        if (!(r = jinja_eval(st, e->a, &a))) r = eval_slice(st, e, a, out);
        break;
    case E_CALL: r = eval_call(st, e, out); break;
    case E_FILTER:
        if (!(r = jinja_eval(st, e->a, &a))) r = apply_one(st, e, a, out);
        break;
    case E_TEST: {
        jval *args = NULL;
        bool res = false;
        if (!(r = jinja_eval(st, e->a, &a)) && !(r = eval_args(st, e, &args))) {
            st->line = e->line;
            r = jinja_test(st, e->s, a, args, e->args.n, &res);
            free_args(args, e->args.n);
        }
        if (!r) *out = jv_bool(e->op ? !res : res);
        break;
    }
    case E_BIN:
        if ((r = jinja_eval(st, e->a, &a)) || (r = jinja_eval(st, e->b, &b))) break;
        st->line = e->line;
        if (e->op == OP_CONCAT) {
            jval sa, sb;
            if ((r = jv_stringify(st, a, &sa))) break;
            if (!(r = jv_stringify(st, b, &sb))) {
                r = binop(st, OP_ADD, sa, sb, out);
                jv_free(&sb);
            }
            jv_free(&sa);
        } else if (e->op == OP_EQ || e->op == OP_NE) {
            bool eq = jv_equal(a, b);
            *out = jv_bool(e->op == OP_EQ ? eq : !eq);
        } else if (e->op == OP_IN || e->op == OP_NOTIN) {
            bool in;
            if (!(r = contains(st, a, b, &in))) *out = jv_bool(e->op == OP_IN ? in : !in);
        } else if (e->op >= OP_LT && e->op <= OP_GE) {
            int c = 0;
            if (a.k == V_UNDEF) r = undefined_err(st, a);
            else if (b.k == V_UNDEF) r = undefined_err(st, b);
            else if (!(r = jv_compare(st, a, b, &c)))
                *out = jv_bool(e->op == OP_LT ? c < 0 : e->op == OP_LE ? c <= 0 : e->op == OP_GT ? c > 0 : c >= 0);
        } else {
            r = binop(st, e->op, a, b, out);
        }
        break;
    case E_AND:
    case E_OR:
        if ((r = jinja_eval(st, e->a, &a))) break;
        if (jv_truthy(a) == (e->kind == E_OR)) {
            *out = a;
            a = jv_undef(NULL);
        } else {
            r = jinja_eval(st, e->b, out);
        }
        break;
    case E_NOT:
        if (!(r = jinja_eval(st, e->a, &a))) *out = jv_bool(!jv_truthy(a));
        break;
    case E_NEG:
    case E_POS:
        if ((r = jinja_eval(st, e->a, &a))) break;
        st->line = e->line;
        if (!jv_is_num(a)) {
            r = a.k == V_UNDEF ? undefined_err(st, a)
                               : jinja_err(st, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+',
                                           jv_type(a));
        } else if (jv_is_int(a)) {
            int64_t x = json_is_integer(a.j) ? json_integer_value(a.j) : json_is_true(a.j);
            if (e->kind == E_NEG && x == INT64_MIN) r = jinja_err(st, "integer overflow");
            else *out = jv_int(e->kind == E_NEG ? -x : x);
        } else {
            *out = jv_float(e->kind == E_NEG ? -jv_num(a) : jv_num(a));
        }
        break;
    case E_COND:
        if ((r = jinja_eval(st, e->b, &a))) break;
        if (jv_truthy(a)) r = jinja_eval(st, e->a, out);
        else if (e->c) r = jinja_eval(st, e->c, out);
        break;
    default: r = jinja_err(st, "not an expression"); break;
    }
    jv_free(&a);
    jv_free(&b);
    st->depth--;
    if (!r) r = nomem_if(out);
    if (r) jv_free(out);
    return r;
}

/* ---- statements ---- */

/* Binds a for/set target (a name or a tuple of names) to v (taken). */
static cllm_status assign(jstate *st, const jnode *target, jval v) {
    if (target->kind == E_NAME) return scope_set(st->cur, target->s, v);
    size_t n = target->items.n;
    if (!(v.k == V_JSON && (json_is_array(v.j) || json_is_string(v.j)))) {
        jv_free(&v);
        return jinja_err(st, "cannot unpack a non-sequence into %zu names", n);
    }
    json_t *items = NULL;
    cllm_status r = jinja_iter_list(st, v, &items);
    jv_free(&v);
    if (r) return r;
    if (json_array_size(items) != n) {
        r = jinja_err(st, "%s values to unpack (expected %zu, got %zu)",
                      json_array_size(items) > n ? "too many" : "not enough", n, json_array_size(items));
    }
    for (size_t i = 0; !r && i < n; i++)
        r = scope_set(st->cur, target->items.v[i]->s, jv_json(json_incref(json_array_get(items, i))));
    json_decref(items);
    return r;
}

static cllm_status exec_for(jstate *st, const jnode *s) {
    jval it;
    cllm_status r = jinja_eval(st, s->b, &it);
    if (r) return r;
    json_t *items = NULL;
    st->line = s->line;
    r = jinja_iter_list(st, it, &items);
    jv_free(&it);
    if (r) return r;
    jscope *sc = scope_push(st, st->cur);
    if (!sc) {
        json_decref(items);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    st->cur = sc;
    if (s->c) { /* `for x in y if cond`: filter first, so loop.length counts what is left */
        json_t *kept = json_array();
        if (!kept) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        for (size_t i = 0; !r && i < json_array_size(items); i++) {
            json_t *x = json_array_get(items, i);
            jval c;
            if ((r = assign(st, s->a, jv_json(json_incref(x)))) || (r = jinja_eval(st, s->c, &c))) break;
            if (jv_truthy(c) && json_array_append(kept, x)) r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            jv_free(&c);
        }
        json_decref(items);
        items = kept;
    }
    size_t n = r ? 0 : json_array_size(items);
    for (size_t i = 0; !r && i < n; i++) {
        if ((r = jinja_step(st, 4))) break; /* the loop object costs about four steps */
        json_t *loop = json_object();
        if (!loop) {
            r = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        json_object_set_new(loop, "index", json_integer((json_int_t)i + 1));
        json_object_set_new(loop, "index0", json_integer((json_int_t)i));
        json_object_set_new(loop, "revindex", json_integer((json_int_t)(n - i)));
        json_object_set_new(loop, "revindex0", json_integer((json_int_t)(n - i - 1)));
        json_object_set_new(loop, "first", json_boolean(i == 0));
        json_object_set_new(loop, "last", json_boolean(i + 1 == n));
        json_object_set_new(loop, "length", json_integer((json_int_t)n));
        json_object_set_new(loop, "depth", json_integer(1));
        json_object_set_new(loop, "depth0", json_integer(0));
        if (i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
        if (i + 1 < n) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
        if ((r = scope_set(sc, "loop", jv_json(loop)))) break;
        if ((r = assign(st, s->a, jv_json(json_incref(json_array_get(items, i)))))) break;
        r = jinja_exec_list(st, &s->body);
        int ctl = st->loop_ctl;
        st->loop_ctl = 0;
        if (ctl == 1) break;
    }
    st->cur = sc->parent;
    scope_free(sc);
    json_decref(items);
    if (!r && n == 0) r = jinja_exec_list(st, &s->orelse);
    return r;
}

static cllm_status exec_set(jstate *st, const jnode *s, jval v) {
    const jnode *t = s->a;
    if (t->kind != E_ATTR) return assign(st, t, v);
    const jval *ns = lookup(st, t->a->s);
    st->line = s->line;
    if (!ns || ns->k != V_NS) {
        jv_free(&v);
        return jinja_err(st, "cannot assign attribute on non-namespace object '%s'", t->a->s);
    }
    json_t *j = v.k == V_JSON ? json_incref(v.j) : json_null();
    jv_free(&v);
    if (json_object_set_new(ns->j, t->s, j)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

static cllm_status exec(jstate *st, const jnode *s) {
    cllm_status r;
    st->line = s->line;
    if ((r = jinja_step(st, 1))) return r;
    jval v;
    switch (s->kind) {
    case N_TEXT: return jbuf_add(st, &st->out, &st->n, &st->cap, s->s, s->slen);
    case N_OUTPUT:
        if ((r = jinja_eval(st, s->a, &v))) return r;
        st->line = s->line;
        r = jv_to_str(st, v, &st->out, &st->n, &st->cap);
        jv_free(&v);
        return r;
    case N_IF:
        if ((r = jinja_eval(st, s->a, &v))) return r;
        bool t = jv_truthy(v);
        jv_free(&v);
        return jinja_exec_list(st, t ? &s->body : &s->orelse);
    case N_FOR: return exec_for(st, s);
    case N_SET:
        if ((r = jinja_eval(st, s->b, &v))) return r;
        return exec_set(st, s, v);
    case N_SET_BLOCK:
    case N_FILTER_BLOCK: {
        jval body, res;
        if ((r = capture(st, &s->body, &body))) return r;
        if ((r = apply_chain(st, s->b, body, &res))) return r;
        if (s->kind == N_SET_BLOCK) return exec_set(st, s, res);
        r = jv_to_str(st, res, &st->out, &st->n, &st->cap);
        jv_free(&res);
        return r;
    }
    case N_MACRO: return scope_set(st->cur, s->s, (jval){V_MACRO, NULL, s, NULL});
    case N_BREAK: st->loop_ctl = 1; return CLLM_OK;
    case N_CONTINUE: st->loop_ctl = 2; return CLLM_OK;
    default: return jinja_err(st, "not a statement");
    }
}

cllm_status jinja_exec_list(jstate *st, const jlist *body) {
    for (size_t i = 0; i < body->n; i++) {
        cllm_status r = exec(st, body->v[i]);
        if (r) return r;
        if (st->loop_ctl) return CLLM_OK;
    }
    return CLLM_OK;
}
