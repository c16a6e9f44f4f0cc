/*
 * Chat-template parser: tokens -> syntax tree, with Jinja2's grammar and
 * operator precedence (loosest first): `a if c else b`, or, and, not,
 * comparisons (== != < <= > >= in, not in; chains as in Python), + -, ~,
 * * / // %, **, unary - +, then primaries with postfix . [] () and the
 * filter (|) and test (is) suffixes.
 *
 * Node fields by kind (see jnode in jinja_impl.h):
 *   N_TEXT s            N_OUTPUT a            N_IF a=cond body orelse
 *   N_FOR a=target b=iterable c=filter condition (or NULL) body orelse
 *   N_SET a=target b=value        N_SET_BLOCK a=target body
 *   N_MACRO s=name items=parameters (E_NAME) args=defaults (NULL: none) body
 *   N_FILTER_BLOCK b=E_FILTER chain (innermost operand an E_NONE placeholder) body;
 *   N_SET_BLOCK b=the same chain for `set x | f %}` or NULL
 *   E_ATTR a.s   E_ITEM a[b]   E_SLICE a[b:c:d]   E_CALL a(args, kw)
 *   E_FILTER a|s(args, kw)   E_TEST a is [not: op] s(args)
 *   E_BIN a op b   E_AND/E_OR a b   E_NOT/E_NEG/E_POS a   E_COND a if b else c
 * `generation` blocks are flattened into their parent body. Left out:
 * call blocks, raw blocks, include/extends/import, *args and **kwargs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_impl.h"

typedef struct {
    const jtoks *t;
    size_t i;
    const char *what;
    int depth;
} parser;

static const jtok *cur(const parser *P) { return &P->t->v[P->i]; }
static const jtok *peek(const parser *P, size_t k) {
    size_t j = P->i + k;
    return &P->t->v[j < P->t->n ? j : P->t->n - 1];
}

static const char *tok_desc(const jtok *t, char *buf, size_t n) {
    switch (t->type) {
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: snprintf(buf, n, "'%.40s'", t->s); return buf;
    case T_STRING: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    case T_OP: snprintf(buf, n, "'%s'", t->op); return buf;
    case T_EOF: return "end of template";
    }
    return "?";
}

static cllm_status perr(const parser *P, const jtok *t, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cllm_fail(CLLM_ERR_FORMAT, "cllm_chat_template_init", "%s:%d:%d: %s", P->what, t->line, t->col, msg);
}

static cllm_status unexpected(const parser *P, const char *expected) {
    char b[64];
    return perr(P, cur(P), "unexpected %s, expected %s", tok_desc(cur(P), b, sizeof b), expected);
}

static bool is_op(const parser *P, const char *op) { return cur(P)->type == T_OP && strcmp(cur(P)->op, op) == 0; }
static bool is_name(const parser *P, const char *name) {
    return cur(P)->type == T_NAME && strcmp(cur(P)->s, name) == 0;
}
static bool skip_op(parser *P, const char *op) {
    if (!is_op(P, op)) return false;
    P->i++;
    return true;
}
static bool skip_name(parser *P, const char *name) {
    if (!is_name(P, name)) return false;
    P->i++;
    return true;
}
static cllm_status expect_op(parser *P, const char *op) {
    if (skip_op(P, op)) return CLLM_OK;
    char e[16];
    snprintf(e, sizeof e, "'%s'", op);
    return unexpected(P, e);
}
static cllm_status expect_end(parser *P) {
    if (cur(P)->type == T_BLOCK_END) {
        P->i++;
        return CLLM_OK;
    }
    return unexpected(P, "'%}'");
}

static jnode *node_new(jnode_kind kind, int line) {
    jnode *n = calloc(1, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = line;
    }
    return n;
}

static cllm_status list_push(jlist *l, jnode *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jnode **v = realloc(l->v, cap * sizeof *v);
        if (!v) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return CLLM_OK;
}

void jinja_list_free(jlist *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) jinja_node_free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

void jinja_node_free(jnode *n) {
    if (!n) return;
    free(n->s);
    jinja_node_free(n->a);
    jinja_node_free(n->b);
    jinja_node_free(n->c);
    jinja_node_free(n->d);
    if (n->kw)
        for (size_t i = 0; i < n->args.n; i++) free(n->kw[i]);
    free(n->kw);
    jinja_list_free(&n->args);
    jinja_list_free(&n->items);
    jinja_list_free(&n->body);
    jinja_list_free(&n->orelse);
    free(n);
}

static cllm_status set_str(jnode *n, const char *s, size_t len) {
    n->s = malloc(len + 1);
    if (!n->s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(n->s, s, len);
    n->s[len] = 0;
    n->slen = len;
    return CLLM_OK;
}

#define NEW(var, kind, line)                                                                                       \
    do {                                                                                                           \
        (var) = node_new((kind), (line));                                                                          \
        if (!(var)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");                                           \
    } while (0)

static cllm_status parse_expr(parser *P, jnode **out, bool condexpr);
static cllm_status parse_tuple(parser *P, jnode **out, bool condexpr, bool explicit_paren, const char *end_name);
static cllm_status parse_unary(parser *P, jnode **out, bool with_filter);

/* (args) of a call, filter or test; the '(' is current. */
static cllm_status parse_args(parser *P, jnode *n) {
    cllm_status st;
    if ((st = expect_op(P, "("))) return st;
    while (!is_op(P, ")")) {
        if (n->args.n && (st = expect_op(P, ","))) return st;
        if (is_op(P, ")")) break;
        char *kw = NULL;
        if (cur(P)->type == T_NAME && peek(P, 1)->type == T_OP && strcmp(peek(P, 1)->op, "=") == 0) {
            kw = strdup(cur(P)->s);
            if (!kw) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            P->i += 2;
        } else if (is_op(P, "*") || is_op(P, "**")) {
            return perr(P, cur(P), "*args and **kwargs are not supported");
        }
        jnode *a = NULL;
        if ((st = parse_expr(P, &a, true)) || (st = list_push(&n->args, a))) {
            free(kw);
            jinja_node_free(a);
            return st;
        }
        char **k = realloc(n->kw, n->args.cap * sizeof *k);
        if (!k) {
            free(kw);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        n->kw = k;
        n->kw[n->args.n - 1] = kw;
    }
    P->i++;
    return CLLM_OK;
}

static cllm_status parse_primary(parser *P, jnode **out) {
    const jtok *t = cur(P);
    jnode *n = NULL;
    cllm_status st = CLLM_OK;
    if (t->type == T_NAME) {
        const char *s = t->s;
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "false") || !strcmp(s, "False")) {
            NEW(n, E_BOOL, t->line);
            n->i = s[0] == 't' || s[0] == 'T';
        } else if (!strcmp(s, "none") || !strcmp(s, "None")) {
            NEW(n, E_NONE, t->line);
        } else {
            NEW(n, E_NAME, t->line);
            st = set_str(n, s, t->len);
        }
        P->i++;
    } else if (t->type == T_STRING) {
        NEW(n, E_STR, t->line);
        size_t len = 0;
        for (size_t j = P->i; P->t->v[j].type == T_STRING; j++) len += P->t->v[j].len;
        n->s = malloc(len + 1);
        if (!n->s) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        else {
            n->slen = len;
            size_t o = 0;
            for (; cur(P)->type == T_STRING; P->i++) {
                memcpy(n->s + o, cur(P)->s, cur(P)->len);
                o += cur(P)->len;
            }
            n->s[o] = 0;
        }
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        NEW(n, t->type == T_INT ? E_INT : E_FLOAT, t->line);
        n->i = t->i;
        n->f = t->f;
        P->i++;
    } else if (is_op(P, "(")) {
        P->i++;
        if ((st = parse_tuple(P, &n, true, true, NULL)) || (st = expect_op(P, ")"))) {
            jinja_node_free(n);
            return st;
        }
    } else if (is_op(P, "[") || is_op(P, "{")) {
        bool dict = is_op(P, "{");
        const char *close = dict ? "}" : "]";
        NEW(n, dict ? E_DICT : E_LIST, t->line);
        P->i++;
        while (!st && !is_op(P, close)) {
            if (n->items.n && (st = expect_op(P, ","))) break;
            if (is_op(P, close)) break;
            jnode *k = NULL, *v = NULL;
            if ((st = parse_expr(P, &k, true)) || (st = list_push(&n->items, k))) {
                jinja_node_free(k);
                break;
            }
            if (dict && ((st = expect_op(P, ":")) || (st = parse_expr(P, &v, true)) || (st = list_push(&n->items, v)))) {
                jinja_node_free(v);
                break;
            }
        }
        if (!st) P->i++;
    } else {
        return unexpected(P, "an expression");
    }
    if (st) {
        jinja_node_free(n);
        return st;
    }
    *out = n;
    return CLLM_OK;
}

/* [b], [b:c], [b:c:d] after an expression; the '[' is current. */
static cllm_status parse_subscript(parser *P, jnode **node) {
    int line = cur(P)->line;
    P->i++;
    jnode *part[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    cllm_status st = CLLM_OK;
    for (;;) {
        if (is_op(P, ":")) {
            slice = true;
            if (++k > 2) {
                st = unexpected(P, "']'");
                break;
            }
            P->i++;
            continue;
        }
        if (is_op(P, "]")) break;
        if (part[k]) {
            st = unexpected(P, "']'");
            break;
        }
        if ((st = parse_expr(P, &part[k], true))) break;
    }
    if (!st && !slice && !part[0]) st = unexpected(P, "an expression");
    jnode *n = NULL;
    if (!st && !(n = node_new(slice ? E_SLICE : E_ITEM, line))) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (st) {
        for (int j = 0; j < 3; j++) jinja_node_free(part[j]);
        return st;
    }
    P->i++;
    n->a = *node;
    n->b = part[0];
    n->c = part[1];
    n->d = part[2];
    *node = n;
    return CLLM_OK;
}

static cllm_status parse_postfix(parser *P, jnode **node) {
    cllm_status st;
    for (;;) {
        if (is_op(P, ".")) {
            P->i++;
            const jtok *t = cur(P);
            jnode *n;
            if (t->type == T_NAME) {
                NEW(n, E_ATTR, t->line);
                if ((st = set_str(n, t->s, t->len))) {
                    free(n);
                    return st;
                }
            } else if (t->type == T_INT) {
                NEW(n, E_ITEM, t->line);
                if (!(n->b = node_new(E_INT, t->line))) {
                    free(n);
                    return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                }
                n->b->i = t->i;
            } else {
                return unexpected(P, "an attribute name");
            }
            P->i++;
            n->a = *node;
            *node = n;
        } else if (is_op(P, "[")) {
            if ((st = parse_subscript(P, node))) return st;
        } else if (is_op(P, "(")) {
            jnode *n;
            NEW(n, E_CALL, cur(P)->line);
            n->a = *node;
            *node = n;
            if ((st = parse_args(P, n))) return st;
        } else {
            return CLLM_OK;
        }
    }
}

/* A filter or test name, possibly dotted. */
static cllm_status parse_dotted(parser *P, jnode *n) {
    if (cur(P)->type != T_NAME) return unexpected(P, "a name");
    char buf[128];
    size_t len = 0;
    for (;;) {
        size_t l = cur(P)->len;
        if (len + l + 1 >= sizeof buf) return perr(P, cur(P), "name too long");
        memcpy(buf + len, cur(P)->s, l);
        len += l;
        P->i++;
        if (!(is_op(P, ".") && peek(P, 1)->type == T_NAME)) break;
        buf[len++] = '.';
        P->i++;
    }
    return set_str(n, buf, len);
}

static cllm_status parse_filter_expr(parser *P, jnode **node) {
    cllm_status st;
    for (;;) {
        if (is_op(P, "|")) {
            jnode *n;
            NEW(n, E_FILTER, cur(P)->line);
            n->a = *node;
            *node = n;
            P->i++;
            if ((st = parse_dotted(P, n))) return st;
            if (is_op(P, "(") && (st = parse_args(P, n))) return st;
        } else if (is_name(P, "is")) {
            jnode *n;
            NEW(n, E_TEST, cur(P)->line);
            n->a = *node;
            *node = n;
            P->i++;
            n->op = skip_name(P, "not");
            if ((st = parse_dotted(P, n))) return st;
            const jtok *t = cur(P);
            if (is_op(P, "(")) {
                if ((st = parse_args(P, n))) return st;
            } else if ((t->type == T_NAME || t->type == T_STRING || t->type == T_INT || t->type == T_FLOAT ||
                        is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                if (is_name(P, "is")) return perr(P, t, "you cannot chain multiple tests with 'is'");
                jnode *a = NULL;
                if ((st = parse_primary(P, &a)) || (st = parse_postfix(P, &a)) || (st = list_push(&n->args, a))) {
                    jinja_node_free(a);
                    return st;
                }
                if (!(n->kw = calloc(1, sizeof *n->kw))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            }
        } else if (is_op(P, "(")) {
            jnode *n;
            NEW(n, E_CALL, cur(P)->line);
            n->a = *node;
            *node = n;
            if ((st = parse_args(P, n))) return st;
        } else {
            return CLLM_OK;
        }
    }
}

static cllm_status parse_unary(parser *P, jnode **out, bool with_filter) {
    cllm_status st;
    jnode *n = NULL;
    if (++P->depth > 200) return perr(P, cur(P), "expression nested too deeply");
    if (is_op(P, "-") || is_op(P, "+")) {
        NEW(n, is_op(P, "-") ? E_NEG : E_POS, cur(P)->line);
        P->i++;
        st = parse_unary(P, &n->a, false);
    } else {
        st = parse_primary(P, &n);
    }
    if (!st) st = parse_postfix(P, &n);
    if (!st && with_filter) st = parse_filter_expr(P, &n);
    P->depth--;
    if (st) {
        jinja_node_free(n);
        return st;
    }
    *out = n;
    return CLLM_OK;
}

/* Binary levels, tightest last. */
typedef cllm_status (*level_fn)(parser *P, jnode **out);

static cllm_status bin_level(parser *P, jnode **out, level_fn next, const char *const *ops, const int *codes,
                             int n_ops) {
    cllm_status st;
    jnode *left = NULL;
    if ((st = next(P, &left))) return st;
    for (;;) {
        int k = 0;
        for (; k < n_ops; k++)
            if (is_op(P, ops[k])) break;
        if (k == n_ops) break;
        jnode *n = node_new(E_BIN, cur(P)->line);
        if (!n) {
            jinja_node_free(left);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        n->op = codes[k];
        n->a = left;
        left = n;
        P->i++;
        if ((st = next(P, &n->b))) {
            jinja_node_free(left);
            return st;
        }
    }
    *out = left;
    return CLLM_OK;
}

static cllm_status parse_unary_f(parser *P, jnode **out) { return parse_unary(P, out, true); }
static cllm_status parse_pow(parser *P, jnode **out) {
    static const char *const ops[] = {"**"};
    static const int codes[] = {OP_POW};
    return bin_level(P, out, parse_unary_f, ops, codes, 1);
}
static cllm_status parse_math2(parser *P, jnode **out) {
    static const char *const ops[] = {"*", "/", "//", "%"};
    static const int codes[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return bin_level(P, out, parse_pow, ops, codes, 4);
}
static cllm_status parse_concat(parser *P, jnode **out) {
    static const char *const ops[] = {"~"};
    static const int codes[] = {OP_CONCAT};
    return bin_level(P, out, parse_math2, ops, codes, 1);
}
static cllm_status parse_math1(parser *P, jnode **out) {
    static const char *const ops[] = {"+", "-"};
    static const int codes[] = {OP_ADD, OP_SUB};
    return bin_level(P, out, parse_concat, ops, codes, 2);
}

static jnode *clone_expr(const jnode *n); /* for chained comparisons */

static cllm_status parse_compare(parser *P, jnode **out) {
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    static const int codes[] = {OP_EQ, OP_NE, OP_LE, OP_GE, OP_LT, OP_GT};
    cllm_status st;
    jnode *left = NULL, *result = NULL;
    if ((st = parse_math1(P, &left))) return st;
    for (;;) {
        int code = -1, line = cur(P)->line;
        for (int k = 0; k < 6; k++)
            if (is_op(P, ops[k])) code = codes[k];
        if (code >= 0) P->i++;
        else if (skip_name(P, "in")) code = OP_IN;
        else if (is_name(P, "not") && peek(P, 1)->type == T_NAME && !strcmp(peek(P, 1)->s, "in")) {
            P->i += 2;
            code = OP_NOTIN;
        } else break;
        jnode *n = node_new(E_BIN, line), *right = NULL;
        if (!n || (st = parse_math1(P, &right))) {
            jinja_node_free(n);
            jinja_node_free(left);
            jinja_node_free(result);
            return n ? st : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        n->op = code;
        n->a = left;
        n->b = right;
        left = clone_expr(right); /* `a < b < c` is `a < b and b < c` */
        if (!left) {
            jinja_node_free(n);
            jinja_node_free(result);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        if (result) {
            jnode *a = node_new(E_AND, line);
            if (!a) {
                jinja_node_free(n);
                jinja_node_free(left);
                jinja_node_free(result);
                return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            }
            a->a = result;
            a->b = n;
            result = a;
        } else {
            result = n;
        }
    }
    if (result) {
        jinja_node_free(left);
        *out = result;
    } else {
        *out = left;
    }
    return CLLM_OK;
}

static jnode *clone_expr(const jnode *n) {
    if (!n) return NULL;
    jnode *c = node_new(n->kind, n->line);
    if (!c) return NULL;
    c->op = n->op;
    c->i = n->i;
    c->f = n->f;
    bool ok = true;
    if (n->s && set_str(c, n->s, n->slen)) ok = false;
    if ((n->a && !(c->a = clone_expr(n->a))) || (n->b && !(c->b = clone_expr(n->b))) ||
        (n->c && !(c->c = clone_expr(n->c))) || (n->d && !(c->d = clone_expr(n->d))))
        ok = false;
    for (size_t i = 0; ok && i < n->items.n; i++) {
        jnode *x = clone_expr(n->items.v[i]);
        if (!x || list_push(&c->items, x)) {
            jinja_node_free(x);
            ok = false;
        }
    }
    for (size_t i = 0; ok && i < n->args.n; i++) {
        jnode *x = clone_expr(n->args.v[i]);
        if (!x || list_push(&c->args, x)) {
            jinja_node_free(x);
            ok = false;
            break;
        }
        char **k = realloc(c->kw, c->args.cap * sizeof *k);
        if (!k) {
            ok = false;
            c->kw = c->kw; /* keep the old array */
            break;
        }
        c->kw = k;
        c->kw[i] = n->kw && n->kw[i] ? strdup(n->kw[i]) : NULL;
        if (n->kw && n->kw[i] && !c->kw[i]) ok = false;
    }
    if (!ok) {
        if (c->kw && c->args.n)
            for (size_t i = 0; i < c->args.n; i++)
                if (i >= n->args.n) c->kw[i] = NULL;
        jinja_node_free(c);
        return NULL;
    }
    return c;
}

static cllm_status parse_not(parser *P, jnode **out) {
    if (is_name(P, "not") && !(peek(P, 1)->type == T_NAME && !strcmp(peek(P, 1)->s, "in"))) {
        if (++P->depth > 200) return perr(P, cur(P), "expression nested too deeply");
        jnode *n;
        NEW(n, E_NOT, cur(P)->line);
        P->i++;
        cllm_status st = parse_not(P, &n->a);
        P->depth--;
        if (st) jinja_node_free(n);
        else *out = n;
        return st;
    }
    return parse_compare(P, out);
}

static cllm_status parse_logic(parser *P, jnode **out, const char *word, jnode_kind kind, level_fn next) {
    cllm_status st;
    jnode *left = NULL;
    if ((st = next(P, &left))) return st;
    while (is_name(P, word)) {
        jnode *n = node_new(kind, cur(P)->line);
        if (!n) {
            jinja_node_free(left);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        n->a = left;
        left = n;
        P->i++;
        if ((st = next(P, &n->b))) {
            jinja_node_free(left);
            return st;
        }
    }
    *out = left;
    return CLLM_OK;
}
static cllm_status parse_and(parser *P, jnode **out) { return parse_logic(P, out, "and", E_AND, parse_not); }
static cllm_status parse_or(parser *P, jnode **out) { return parse_logic(P, out, "or", E_OR, parse_and); }

static cllm_status parse_expr(parser *P, jnode **out, bool condexpr) {
    cllm_status st;
    jnode *e = NULL;
    if (++P->depth > 200) return perr(P, cur(P), "expression nested too deeply");
    if ((st = parse_or(P, &e))) goto done;
    while (condexpr && is_name(P, "if")) {
        jnode *n = node_new(E_COND, cur(P)->line);
        if (!n) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        n->a = e;
        e = n;
        P->i++;
        if ((st = parse_or(P, &n->b))) break;
        if (skip_name(P, "else") && (st = parse_expr(P, &n->c, true))) break;
    }
done:
    P->depth--;
    if (st) jinja_node_free(e);
    else *out = e;
    return st;
}

static bool tuple_end(const parser *P, const char *end_name) {
    const jtok *t = cur(P);
    return t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF ||
           (t->type == T_OP && !strcmp(t->op, ")")) || (end_name && t->type == T_NAME && !strcmp(t->s, end_name));
}

/* An expression, or a tuple of them separated by commas. */
static cllm_status parse_tuple(parser *P, jnode **out, bool condexpr, bool explicit_paren, const char *end_name) {
    int line = cur(P)->line;
    jnode *tup = node_new(E_TUPLE, line);
    if (!tup) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    bool is_tuple = false;
    cllm_status st = CLLM_OK;
    for (;;) {
        if (tup->items.n && (st = expect_op(P, ","))) break;
        if (tuple_end(P, end_name)) break;
        jnode *e = NULL;
        if ((st = parse_expr(P, &e, condexpr)) || (st = list_push(&tup->items, e))) {
            jinja_node_free(e);
            break;
        }
        if (is_op(P, ",")) is_tuple = true;
        else break;
    }
    if (!st && !is_tuple) {
        if (tup->items.n == 1) {
            *out = tup->items.v[0];
            tup->items.n = 0;
            jinja_node_free(tup);
            return CLLM_OK;
        }
        if (!explicit_paren) st = unexpected(P, "an expression");
    }
    if (st) {
        jinja_node_free(tup);
        return st;
    }
    *out = tup;
    return CLLM_OK;
}

/* for/set targets: a name, ns.attr (set only), or names separated by commas. */
static cllm_status parse_target(parser *P, jnode **out, bool allow_attr) {
    int line = cur(P)->line;
    bool paren = skip_op(P, "(");
    jnode *tup = node_new(E_TUPLE, line);
    if (!tup) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = CLLM_OK;
    for (;;) {
        if (cur(P)->type != T_NAME) {
            st = unexpected(P, "a variable name");
            break;
        }
        jnode *n = node_new(E_NAME, cur(P)->line);
        if (!n || (st = set_str(n, cur(P)->s, cur(P)->len)) || (st = list_push(&tup->items, n))) {
            jinja_node_free(n);
            if (!st) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            break;
        }
        P->i++;
        if (allow_attr && !paren && tup->items.n == 1 && is_op(P, ".")) {
            P->i++;
            if (cur(P)->type != T_NAME) {
                st = unexpected(P, "an attribute name");
                break;
            }
            jnode *a = node_new(E_ATTR, cur(P)->line);
            if (!a || (st = set_str(a, cur(P)->s, cur(P)->len))) {
                jinja_node_free(a);
                if (!st) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                break;
            }
            P->i++;
            a->a = n;
            tup->items.n = 0;
            jinja_node_free(tup);
            *out = a;
            return CLLM_OK;
        }
        if (!skip_op(P, ",")) break;
    }
    if (!st && paren) st = expect_op(P, ")");
    if (st) {
        jinja_node_free(tup);
        return st;
    }
    if (tup->items.n == 1 && !paren) {
        *out = tup->items.v[0];
        tup->items.n = 0;
        jinja_node_free(tup);
    } else {
        *out = tup;
    }
    return CLLM_OK;
}

static cllm_status parse_body(parser *P, jlist *body, const char *const *ends, int n_ends, const char **found);

/* The statement after "{%" (the keyword is current). */
static cllm_status parse_stmt(parser *P, jlist *body) {
    const jtok *kw = cur(P);
    char b[64];
    if (kw->type != T_NAME) return perr(P, kw, "unexpected %s, expected a tag name", tok_desc(kw, b, sizeof b));
    const char *k = kw->s;
    int line = kw->line;
    cllm_status st;
    jnode *n = NULL;
    P->i++;
    if (!strcmp(k, "if")) {
        NEW(n, N_IF, line);
        jnode *at = n;
        static const char *const ends[] = {"elif", "else", "endif"};
        for (;;) {
            const char *found = NULL;
            if ((st = parse_expr(P, &at->a, true)) || (st = expect_end(P)) ||
                (st = parse_body(P, &at->body, ends, 3, &found)))
                goto fail;
            P->i++; /* the elif / else / endif name */
            if (!strcmp(found, "elif")) {
                jnode *e = node_new(N_IF, cur(P)->line);
                if (!e || (st = list_push(&at->orelse, e))) {
                    free(e);
                    st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                    goto fail;
                }
                at = e;
                continue;
            }
            if (!strcmp(found, "else")) {
                static const char *const end[] = {"endif"};
                if ((st = expect_end(P)) || (st = parse_body(P, &at->orelse, end, 1, &found))) goto fail;
                P->i++;
            }
            break;
        }
    } else if (!strcmp(k, "for")) {
        NEW(n, N_FOR, line);
        static const char *const ends[] = {"else", "endfor"};
        const char *found = NULL;
        if ((st = parse_target(P, &n->a, false))) goto fail;
        if (!skip_name(P, "in")) {
            st = unexpected(P, "'in'");
            goto fail;
        }
        if ((st = parse_tuple(P, &n->b, false, false, "recursive"))) goto fail;
        if (skip_name(P, "if") && (st = parse_expr(P, &n->c, true))) goto fail;
        if (is_name(P, "recursive")) {
            st = perr(P, cur(P), "recursive loops are not supported");
            goto fail;
        }
        if ((st = expect_end(P)) || (st = parse_body(P, &n->body, ends, 2, &found))) goto fail;
        P->i++;
        if (!strcmp(found, "else")) {
            static const char *const end[] = {"endfor"};
            if ((st = expect_end(P)) || (st = parse_body(P, &n->orelse, end, 1, &found))) goto fail;
            P->i++;
        }
    } else if (!strcmp(k, "set")) {
        NEW(n, N_SET, line);
        if ((st = parse_target(P, &n->a, true))) goto fail;
        if (skip_op(P, "=")) {
            if ((st = parse_tuple(P, &n->b, true, false, NULL))) goto fail;
        } else {
            static const char *const end[] = {"endset"};
            const char *found;
            n->kind = N_SET_BLOCK;
            if (n->a->kind != E_NAME) {
                st = perr(P, cur(P), "a block set assigns one name");
                goto fail;
            }
            if (is_op(P, "|")) {
                jnode *f = NULL;
                NEW(f, E_NONE, line); /* placeholder operand, replaced by the body */
                jnode *chain = f;
                if ((st = parse_filter_expr(P, &chain))) {
                    jinja_node_free(chain);
                    goto fail;
                }
                n->b = chain;
            }
            if ((st = expect_end(P)) || (st = parse_body(P, &n->body, end, 1, &found))) goto fail;
            P->i++;
        }
    } else if (!strcmp(k, "macro")) {
        NEW(n, N_MACRO, line);
        static const char *const end[] = {"endmacro"};
        const char *found;
        if (cur(P)->type != T_NAME) {
            st = unexpected(P, "a macro name");
            goto fail;
        }
        if ((st = set_str(n, cur(P)->s, cur(P)->len))) goto fail;
        P->i++;
        if ((st = expect_op(P, "("))) goto fail;
        while (!is_op(P, ")")) {
            if (n->items.n && (st = expect_op(P, ","))) goto fail;
            if (is_op(P, ")")) break;
            if (cur(P)->type != T_NAME) {
                st = unexpected(P, "a parameter name");
                goto fail;
            }
            jnode *pn = node_new(E_NAME, cur(P)->line), *def = NULL;
            if (!pn || (st = set_str(pn, cur(P)->s, cur(P)->len)) || (st = list_push(&n->items, pn))) {
                jinja_node_free(pn);
                if (!st) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                goto fail;
            }
            P->i++;
            if (skip_op(P, "=") && (st = parse_expr(P, &def, true))) goto fail;
            if ((st = list_push(&n->args, def))) {
                jinja_node_free(def);
                goto fail;
            }
        }
        P->i++;
        if ((st = expect_end(P)) || (st = parse_body(P, &n->body, end, 1, &found))) goto fail;
        P->i++;
        if (cur(P)->type == T_NAME) P->i++; /* {% endmacro name %} */
    } else if (!strcmp(k, "filter")) {
        NEW(n, N_FILTER_BLOCK, line);
        static const char *const end[] = {"endfilter"};
        const char *found;
        jnode *f = NULL;
        NEW(f, E_NONE, line);
        jnode *chain = f;
        /* `{% filter upper | trim %}`: the first filter has no '|' */
        jnode *first = node_new(E_FILTER, line);
        if (!first) {
            jinja_node_free(f);
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            goto fail;
        }
        first->a = chain;
        chain = first;
        if ((st = parse_dotted(P, first)) || (is_op(P, "(") && (st = parse_args(P, first))) ||
            (st = parse_filter_expr(P, &chain))) {
            jinja_node_free(chain);
            goto fail;
        }
        n->b = chain;
        if ((st = expect_end(P)) || (st = parse_body(P, &n->body, end, 1, &found))) goto fail;
        P->i++;
    } else if (!strcmp(k, "generation")) {
        static const char *const end[] = {"endgeneration"};
        const char *found;
        if ((st = expect_end(P)) || (st = parse_body(P, body, end, 1, &found))) return st;
        P->i++;
        return expect_end(P);
    } else if (!strcmp(k, "break") || !strcmp(k, "continue")) {
        NEW(n, k[0] == 'b' ? N_BREAK : N_CONTINUE, line);
    } else {
        return perr(P, kw, "unknown or unsupported tag '%.40s'", k);
    }
    if ((st = expect_end(P))) goto fail;
    if ((st = list_push(body, n))) goto fail;
    return CLLM_OK;
fail:
    jinja_node_free(n);
    return st;
}

/* Statements until one of `ends` (its name left current, *found set) or,
 * with no ends, the end of the template. */
static cllm_status parse_body(parser *P, jlist *body, const char *const *ends, int n_ends, const char **found) {
    cllm_status st;
    if (++P->depth > 200) return perr(P, cur(P), "blocks nested too deeply");
    for (;;) {
        const jtok *t = cur(P);
        if (t->type == T_EOF) {
            P->depth--;
            if (!n_ends) return CLLM_OK;
            char want[96] = "";
            for (int k = 0; k < n_ends; k++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", k ? " or " : "", ends[k]);
            return perr(P, t, "unexpected end of template, expected %s", want);
        }
        if (t->type == T_TEXT) {
            jnode *n;
            NEW(n, N_TEXT, t->line);
            if ((st = set_str(n, t->s, t->len)) || (st = list_push(body, n))) {
                jinja_node_free(n);
                return st;
            }
            P->i++;
        } else if (t->type == T_VAR_BEGIN) {
            jnode *n;
            NEW(n, N_OUTPUT, t->line);
            P->i++;
            if ((st = parse_tuple(P, &n->a, true, false, NULL)) || (cur(P)->type != T_VAR_END &&
                                                                     (st = unexpected(P, "'}}'"))) ||
                (st = list_push(body, n))) {
                jinja_node_free(n);
                return st;
            }
            P->i++;
        } else if (t->type == T_BLOCK_BEGIN) {
            P->i++;
            if (cur(P)->type == T_NAME)
                for (int k = 0; k < n_ends; k++)
                    if (!strcmp(cur(P)->s, ends[k])) {
                        *found = ends[k];
                        P->depth--;
                        return CLLM_OK;
                    }
            if (cur(P)->type == T_NAME && !strncmp(cur(P)->s, "end", 3) && strlen(cur(P)->s) > 3) {
                if (n_ends)
                    return perr(P, cur(P), "unexpected '%.40s', expected '%s'", cur(P)->s, ends[n_ends - 1]);
                return perr(P, cur(P), "unexpected '%.40s' with no open block", cur(P)->s);
            }
            if (cur(P)->type == T_NAME && (!strcmp(cur(P)->s, "else") || !strcmp(cur(P)->s, "elif")))
                return perr(P, cur(P), "unexpected '%s' outside 'if' or 'for'", cur(P)->s);
            if ((st = parse_stmt(P, body))) return st;
        } else {
            char b[64];
            return perr(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
        }
    }
}

cllm_status jinja_parse(jlist *body, const jtoks *toks, const char *what) {
    memset(body, 0, sizeof *body);
    parser P = {toks, 0, what, 0};
    const char *found = NULL;
    cllm_status st = parse_body(&P, body, NULL, 0, &found);
    if (st) jinja_list_free(body);
    return st;
}
