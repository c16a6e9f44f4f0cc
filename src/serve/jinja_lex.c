/*
 * Chat-template lexer: template text -> tokens, as Jinja2's lexer with the
 * settings transformers uses (trim_blocks, lstrip_blocks, newlines
 * normalised to "\n", one trailing newline dropped).
 *
 * Whitespace control is applied here, to the text tokens:
 *   "{%-" / "{{-" / "{#-"  strip all whitespace before the tag;
 *   "-%}" / "-}}" / "-#}"  strip all whitespace after it;
 *   lstrip_blocks          spaces and tabs from the start of a line up to a
 *                          "{%" or "{#" are dropped ("{%+" keeps them);
 *   trim_blocks            the first newline after "%}" or "#}" is dropped
 *                          ("+%}" keeps it).
 * Inside a tag the end marker only counts where brackets are balanced, as
 * in Jinja2, so `{{ {'a': {'b': 1}} }}` lexes. Left out: line statements,
 * raw blocks, custom delimiters.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/jinja_impl.h"

typedef struct {
    const char *s; /* normalised source */
    size_t n;
    const char *what;
    jtoks *out;
    size_t c_off, c_ls; /* the last position computed: offset, start of its line */
    int c_line;
} lexer;

/* Line and column of an offset; positions mostly grow, so each call
 * continues from the previous one. */
static void pos_of(lexer *L, size_t off, int *line, int *col) {
    if (off < L->c_off) {
        L->c_off = 0;
        L->c_ls = 0;
        L->c_line = 1;
    }
    for (size_t i = L->c_off; i < off && i < L->n; i++)
        if (L->s[i] == '\n') {
            L->c_line++;
            L->c_ls = i + 1;
        }
    L->c_off = off;
    *line = L->c_line;
    *col = (int)(off - L->c_ls) + 1;
}

static cllm_status lex_fail(lexer *L, size_t off, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    pos_of(L, off, &line, &col);
    return cllm_fail(CLLM_ERR_FORMAT, "cllm_chat_template_init", "%s:%d:%d: %s", L->what, line, col, msg);
}

static jtok *push(lexer *L, jtok_type type, size_t off) {
    if (L->out->n == L->out->cap) {
        size_t cap = L->out->cap ? L->out->cap * 2 : 64;
        jtok *v = realloc(L->out->v, cap * sizeof *v);
        if (!v) return NULL;
        L->out->v = v;
        L->out->cap = cap;
    }
    jtok *t = &L->out->v[L->out->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    pos_of(L, off, &t->line, &t->col);
    return t;
}

static cllm_status push_text(lexer *L, jtok_type type, size_t off, const char *s, size_t len) {
    jtok *t = push(L, type, off);
    char *c = malloc(len + 1);
    if (!t || !c) {
        free(c);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    memcpy(c, s, len);
    c[len] = 0;
    t->s = c;
    t->len = len;
    return CLLM_OK;
}

/* Length of the run of whitespace (Python's str.isspace) ending at end. */
static size_t rspace(const char *s, size_t start, size_t end) {
    size_t e = end;
    while (e > start) {
        size_t b = e - 1;
        while (b > start && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
        size_t k;
        if (!ju8_space(s + b, e - b, &k) || b + k != e) break;
        e = b;
    }
    return end - e;
}

static size_t lspace(const char *s, size_t start, size_t end) {
    size_t p = start, k;
    while (p < end && ju8_space(s + p, end - p, &k)) p += k;
    return p - start;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal at p (its quote); Python's unicode-escape rules. */
static cllm_status lex_string(lexer *L, size_t *pp) {
    size_t p = *pp, start = p;
    char q = L->s[p++];
    char *buf = malloc(L->n - p + 1); /* an unescaped string never grows */
    if (!buf) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (;;) {
        if (p >= L->n) {
            free(buf);
            return lex_fail(L, start, "unterminated string");
        }
        char c = L->s[p];
        if (c == q) {
            p++;
            break;
        }
        if (c != '\\') {
            buf[o++] = c;
            p++;
            continue;
        }
        if (p + 1 >= L->n) {
            p++;
            continue;
        }
        char e = L->s[p + 1];
        p += 2;
        int nhex = 0;
        switch (e) {
        case '\n': break;
        case '\\': buf[o++] = '\\'; break;
        case '\'': buf[o++] = '\''; break;
        case '"': buf[o++] = '"'; break;
        case 'n': buf[o++] = '\n'; break;
        case 't': buf[o++] = '\t'; break;
        case 'r': buf[o++] = '\r'; break;
        case 'a': buf[o++] = '\a'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'v': buf[o++] = '\v'; break;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && p < L->n && L->s[p] >= '0' && L->s[p] <= '7'; k++)
                    v = v * 8 + (uint32_t)(L->s[p++] - '0');
                o += put_utf8(buf + o, v);
            } else {
                buf[o++] = '\\';
                buf[o++] = e;
            }
        }
        if (nhex) {
            uint32_t v = 0;
            for (int k = 0; k < nhex; k++) {
                int h = p < L->n ? hexval(L->s[p]) : -1;
                if (h < 0) {
                    free(buf);
                    return lex_fail(L, p, "truncated \\%c escape in string", e);
                }
                v = v * 16 + (uint32_t)h;
                p++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) {
                free(buf);
                return lex_fail(L, p, "escape \\%c names no Unicode character", e);
            }
            o += put_utf8(buf + o, v);
        }
    }
    jtok *t = push(L, T_STRING, start);
    if (!t) {
        free(buf);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    buf[o] = 0;
    t->s = buf;
    t->len = o;
    *pp = p;
    return CLLM_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* digits with single underscores between them, copied without them */
static size_t digits(const char *s, size_t p, size_t n, char *o, size_t *on) {
    size_t q = p;
    while (q < n && (is_digit(s[q]) || (s[q] == '_' && q > p && q + 1 < n && is_digit(s[q + 1])))) {
        if (s[q] != '_' && *on < 60) o[(*on)++] = s[q];
        q++;
    }
    return q;
}

static cllm_status lex_number(lexer *L, size_t *pp) {
    const char *s = L->s;
    size_t p = *pp, q;
    char num[64];
    size_t on = 0;
    q = digits(s, p, L->n, num, &on);
    bool isf = false;
    bool after_dot = p > 0 && s[p - 1] == '.';
    if (!after_dot && q + 1 < L->n && s[q] == '.' && is_digit(s[q + 1])) {
        num[on++] = '.';
        q = digits(s, q + 1, L->n, num, &on);
        isf = true;
    }
    if (!after_dot && q < L->n && (s[q] == 'e' || s[q] == 'E')) {
        size_t r = q + 1;
        if (r < L->n && (s[r] == '+' || s[r] == '-')) r++;
        if (r < L->n && is_digit(s[r])) {
            num[on++] = 'e';
            if (s[q + 1] == '-') num[on++] = '-';
            q = digits(s, r, L->n, num, &on);
            isf = true;
        }
    }
    num[on] = 0;
    jtok *t = push(L, isf ? T_FLOAT : T_INT, p);
    if (!t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (isf) {
        t->f = strtod(num, NULL);
    } else if (!cllm_parse_i64(num, &t->i)) {
        return lex_fail(L, p, "integer %s out of range", num);
    }
    *pp = q;
    return CLLM_OK;
}

static const char *const OPS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};

/* Tokens of one tag from p (after the opener) to its end marker; *pp is
 * set past the marker and the whitespace it consumes. */
static cllm_status lex_tag(lexer *L, size_t *pp, bool block, bool *line_starting) {
    const char *s = L->s;
    size_t p = *pp, open = p;
    int depth = 0;
    cllm_status st;
    for (;;) {
        while (p < L->n && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r' || s[p] == '\f' ||
                            s[p] == '\v'))
            p++;
        if (p >= L->n) return lex_fail(L, open, "unexpected end of template, expected '%s'", block ? "%}" : "}}");
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t consumed = 0, mark = 0;
            if (s[p] == '-' && p + 2 < L->n + 0 && strncmp(s + p + 1, end, 2) == 0) {
                mark = 3;
                consumed = lspace(s, p + 3, L->n);
            } else if (block && s[p] == '+' && strncmp(s + p + 1, end, 2) == 0) {
                mark = 3;
            } else if (strncmp(s + p, end, 2) == 0) {
                mark = 2;
                if (block && p + 2 < L->n && s[p + 2] == '\n') consumed = 1;
            }
            if (mark) {
                if (!push(L, block ? T_BLOCK_END : T_VAR_END, p)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                size_t e = p + mark + consumed;
                *line_starting = s[e - 1] == '\n';
                *pp = e;
                return CLLM_OK;
            }
        }
        char c = s[p];
        if (c == '\'' || c == '"') {
            if ((st = lex_string(L, &p))) return st;
        } else if (is_digit(c)) {
            if ((st = lex_number(L, &p))) return st;
        } else if (is_name0(c)) {
            size_t q = p;
            while (q < L->n && (is_name0(s[q]) || is_digit(s[q]))) q++;
            if ((st = push_text(L, T_NAME, p, s + p, q - p))) return st;
            p = q;
        } else {
            size_t k = 0, ol = 0;
            for (; k < sizeof OPS / sizeof *OPS; k++) {
                ol = strlen(OPS[k]);
                if (p + ol <= L->n && strncmp(s + p, OPS[k], ol) == 0) break;
            }
            if (k == sizeof OPS / sizeof *OPS) {
                if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7F)
                    return lex_fail(L, p, "unexpected character '%c'", c);
                return lex_fail(L, p, "unexpected character 0x%02x", (unsigned char)c);
            }
            if (c == '(' || c == '[' || c == '{') {
                if (++depth > 200) return lex_fail(L, p, "brackets nested too deeply");
            } else if (c == ')' || c == ']' || c == '}') {
                if (depth == 0) return lex_fail(L, p, "unexpected '%c'", c);
                depth--;
            }
            jtok *t = push(L, T_OP, p);
            if (!t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            memcpy(t->op, OPS[k], ol);
            p += ol;
        }
    }
}

static cllm_status lex_all(lexer *L) {
    const char *s = L->s;
    size_t pos = 0;
    bool line_starting = true;
    cllm_status st;
    for (;;) {
        size_t p = pos;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        for (; p + 1 < L->n; p++) {
            if (s[p] != '{') continue;
            if (s[p + 1] == '{') kind = 1;
            else if (s[p + 1] == '%') kind = 2;
            else if (s[p + 1] == '#') kind = 3;
            if (kind) break;
        }
        if (!kind) p = L->n;
        size_t tend = p; /* end of the text before the tag */
        char sign = kind && p + 2 < L->n ? s[p + 2] : 0;
        if (kind && sign == '-') {
            tend -= rspace(s, pos, tend);
        } else if (kind >= 2 && sign != '+') {
            size_t l = tend;
            while (l > pos && s[l - 1] != '\n') l--;
            if ((l > pos || line_starting) && l < tend && lspace(s, l, tend) == tend - l) tend = l;
        }
        if (tend > pos && (st = push_text(L, T_TEXT, pos, s + pos, tend - pos))) return st;
        if (!kind) break;
        size_t q = p + 2 + (sign == '-' || sign == '+');
        if (kind == 3) {
            const char *e = NULL;
            for (size_t k = q; k + 1 < L->n; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    e = s + k;
                    break;
                }
            if (!e) return lex_fail(L, p, "missing end of comment tag '#}'");
            size_t ep = (size_t)(e - s), after = ep + 2;
            if (ep > q && s[ep - 1] == '-') after += lspace(s, after, L->n);
            else if (!(ep > q && s[ep - 1] == '+') && after < L->n && s[after] == '\n') after++;
            line_starting = s[after - 1] == '\n';
            pos = after;
            continue;
        }
        if (!push(L, kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN, p)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        pos = q;
        if ((st = lex_tag(L, &pos, kind == 2, &line_starting))) return st;
    }
    if (!push(L, T_EOF, L->n)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

cllm_status jinja_lex(jtoks *out, const char *src, const char *what) {
    memset(out, 0, sizeof *out);
    size_t n = strlen(src);
    char *norm = malloc(n + 1);
    if (!norm) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            norm[o++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            norm[o++] = src[i];
        }
    }
    if (o > 0 && norm[o - 1] == '\n') o--;
    norm[o] = 0;
    lexer L = {norm, o, what, out, 0, 0, 1};
    cllm_status st = lex_all(&L);
    free(norm);
    if (st) jinja_toks_free(out);
    return st;
}

void jinja_toks_free(jtoks *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->v[i].s);
    free(t->v);
    memset(t, 0, sizeof *t);
}
