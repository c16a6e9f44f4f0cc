/*
 * Private to the chat-template renderer (cllm/chat_template.h): tokens of
 * the lexer, the syntax tree the parser builds, the values the evaluator
 * works on, and the calls between jinja_lex.c, jinja_parse.c,
 * jinja_value.c, jinja_eval.c, jinja_builtins.c and chat_template.c.
 *
 * The tree is immutable after parsing (renders on several threads read
 * it): literals are kept as C data, and every render builds its own jansson
 * values.
 */
#ifndef CLLM_JINJA_IMPL_H
#define CLLM_JINJA_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/chat_template.h"

/* ---- lexer ---- */
typedef enum {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} jtok_type;

typedef struct {
    jtok_type type;
    int line, col;
    char *s; /* T_TEXT, T_NAME, T_STRING (owned, NUL-terminated; len may include NULs) */
    size_t len;
    int64_t i;
    double f;
    char op[4]; /* T_OP: "+", "//", "==", "(" ... */
} jtok;

typedef struct {
    jtok *v;
    size_t n, cap;
} jtoks;

/* Splits a template into tokens, applying trim_blocks, lstrip_blocks and
 * the `-`/`+` whitespace controls to the text tokens. Errors: CLLM_ERR_FORMAT
 * "WHAT:LINE:COL: message". */
cllm_status jinja_lex(jtoks *out, const char *src, const char *what);
void jinja_toks_free(jtoks *t);

/* ---- syntax tree ---- */
typedef enum {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_FILTER_BLOCK,
    N_CALL_BLOCK,
    /* expressions */
    E_STR, E_INT, E_FLOAT, E_BOOL, E_NONE, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL,
    E_FILTER, E_TEST, E_BIN, E_AND, E_OR, E_NOT, E_NEG, E_POS, E_COND
} jnode_kind;

/* Binary operators of E_BIN. */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_LE,
       OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode jnode;
typedef struct {
    jnode **v;
    size_t n, cap;
} jlist;

struct jnode {
    jnode_kind kind;
    int op;   /* E_BIN operator; E_TEST: 1 if negated (`is not`) */
    int line; /* 1-based source line */
    char *s;  /* text, string literal, name, attribute, filter/test/macro name */
    size_t slen;
    int64_t i;   /* E_INT, E_BOOL */
    double f;    /* E_FLOAT */
    jnode *a, *b, *c, *d; /* operands (see jinja_parse.c for each kind) */
    jlist args;  /* call / filter / test arguments; macro parameter defaults */
    char **kw;   /* [args.n] keyword names, NULL for positional */
    jlist items; /* list / tuple items, dict key,value pairs, macro parameters */
    jlist body, orelse;
};

struct cllm_chat_template {
    jlist body;
    char *what;
};

/* Parses tokens into `body`. Errors: CLLM_ERR_FORMAT "WHAT:LINE:COL: ...". */
cllm_status jinja_parse(jlist *body, const jtoks *toks, const char *what);
void jinja_list_free(jlist *l);
void jinja_node_free(jnode *n);

/* ---- values ---- */
typedef enum { V_UNDEF, V_JSON, V_NS, V_MACRO } jval_kind;
typedef struct {
    jval_kind k;
    json_t *j;           /* V_JSON: a reference the holder owns; V_NS: the namespace's object */
    const jnode *m;      /* V_MACRO */
    const char *name;    /* V_UNDEF: the name that was undefined (for messages), or NULL */
} jval;

/* The render state (one per call; never shared between threads). */
typedef struct jscope jscope;
typedef struct {
    const cllm_chat_template *t;
    char *out;
    size_t n, cap;
    uint64_t steps;
    int depth;       /* expression recursion */
    int macro_depth; /* nested macro calls */
    int line;  /* line of the node being evaluated (for messages) */
    jscope *root, *cur;
    int loop_ctl; /* 1 break, 2 continue, pending */
    bool raised;  /* the error is a raise_exception message */
} jstate;

#define JINJA_MAX_OUT (16u << 20)
#define JINJA_MAX_STEPS 10000000ull
/* The step budget of a render (JINJA_MAX_STEPS). The fuzz target lowers it
 * before its first render so that every input runs within its time limit;
 * nothing else writes it. Text handling is charged one step per 64 bytes. */
extern uint64_t jinja_max_steps;
#define JINJA_MAX_RANGE 1000000
#define JINJA_MAX_DEPTH 256

/* Fails the render: CLLM_ERR_ARG "WHAT:LINE: message". */
cllm_status jinja_err(jstate *st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Charges n steps; fails when the budget is spent. */
cllm_status jinja_step(jstate *st, uint64_t n);

jval jv_undef(const char *name);
jval jv_json(json_t *j); /* takes the reference; NULL (allocation failed) stays NULL */
jval jv_copy(jval v);    /* a new reference */
void jv_free(jval *v);
jval jv_str(const char *s, size_t len);
jval jv_int(int64_t i);
jval jv_float(double f);
jval jv_bool(bool b);
jval jv_none(void);

bool jv_truthy(jval v);
bool jv_is_str(jval v);
bool jv_is_num(jval v); /* int, float or bool (a Python number) */
bool jv_is_int(jval v); /* int or bool */
/* The value of an int or bool (jv_is_int) without going through a double. */
int64_t jv_int_value(jval v);
double jv_num(jval v);
bool jv_equal(jval a, jval b);
/* Orders a and b as Python would (numbers, strings, lists): -1, 0, 1; fails
 * for other types. */
cllm_status jv_compare(jstate *st, jval a, jval b, int *cmp);
/* Python's str(v) appended to *buf; repr for the items of lists and dicts. */
cllm_status jv_to_str(jstate *st, jval v, char **buf, size_t *n, size_t *cap);
/* str(v) as a new string value. */
cllm_status jv_stringify(jstate *st, jval v, jval *out);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none)). */
cllm_status jv_tojson(jstate *st, jval v, int indent, jval *out);
/* Type name for messages ("str", "int", "list", "dict", "undefined" ...). */
const char *jv_type(jval v);
/* Number of code points / items; -1 for values without a length. */
int64_t jv_len(jval v);
/* Appends to a growable buffer; fails past JINJA_MAX_OUT. */
cllm_status jbuf_add(jstate *st, char **buf, size_t *n, size_t *cap, const char *s, size_t len);

/* Offset of the first occurrence of needle in hay at or after `from`
 * (linear time), or SIZE_MAX. */
size_t jfind(const char *hay, size_t hn, size_t from, const char *needle, size_t nn);
/* UTF-8 helpers: byte offset of code point i (clamped to len). */
size_t ju8_offset(const char *s, size_t len, int64_t i);
int64_t ju8_count(const char *s, size_t len);
/* Python's str.isspace for the code point starting at s (its length in *n). */
bool ju8_space(const char *s, size_t len, size_t *n);

/* ---- evaluator and builtins ---- */
cllm_status jinja_eval(jstate *st, const jnode *e, jval *out);
cllm_status jinja_exec_list(jstate *st, const jlist *body);
/* Iterates a value as Jinja's for does: a new JSON array of the items. */
cllm_status jinja_iter_list(jstate *st, jval v, json_t **out);
cllm_status jinja_filter(jstate *st, const char *name, jval v, jval *args, char **kw, size_t n, jval *out);
cllm_status jinja_test(jstate *st, const char *name, jval v, jval *args, size_t n, bool *out);
/* Calls method `name` of v (str and dict methods); *found false if v has no such method. */
cllm_status jinja_method(jstate *st, jval v, const char *name, jval *args, char **kw, size_t n, jval *out,
                         bool *found);
/* Shared by the filters and the str methods (jinja_builtins.c): the
 * argument at position pos or named name (NULL if absent); strip (which: 1
 * left, 2 right, 3 both; chars NULL or none: whitespace); case mapping
 * (mode 'u' upper, 'l' lower, 'c' capitalize, 't' the title filter, 'T'
 * str.title); str.replace. */
jval *jinja_arg(jval *args, char **kw, size_t n, size_t pos, const char *name);
cllm_status jinja_strip(jstate *st, jval v, jval *chars, int which, jval *out);
cllm_status jinja_recase(jstate *st, jval v, int mode, jval *out);
cllm_status jinja_replace(jstate *st, jval v, jval *old, jval *new_, jval *count, jval *out);
/* Globals: range, namespace, dict, raise_exception, strftime_now. */
cllm_status jinja_global(jstate *st, const char *name, jval *args, char **kw, size_t n, jval *out);
/* Render-state setup for chat_template.c (jinja_eval.c). */
cllm_status jinja_scope_root(jstate *st);
void jinja_scope_end(jstate *st);
cllm_status jinja_define(jstate *st, const char *name, jval v); /* takes v */
/* Attribute / item lookup as Jinja's getattr / getitem. A missing attribute
 * gives an undefined value that keeps `name` for its messages, so name must
 * outlive that value (the template's own strings do); a caller passing a
 * name it builds or borrows clears out->name. */
cllm_status jinja_getattr(jstate *st, jval obj, const char *name, jval *out);
cllm_status jinja_getitem(jstate *st, jval obj, jval key, jval *out);

#endif
