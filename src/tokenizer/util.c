/*
 * Tokenizer utilities: growable buffers, piece lists, the two hash tables,
 * UTF-8 decoding/repair, Unicode whitespace, the byte-level alphabet and the
 * PCRE2 wrapper. No tokenizer logic lives here.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

/* ---- growable buffers ---- */

bool tk_str_reserve(tk_str *s, size_t extra) {
    size_t need;
    if (!cllm_size_add(s->n, extra, &need)) return false;
    if (need + 1 <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need + 1) {
        if (cap > SIZE_MAX / 2) return false;
        cap *= 2;
    }
    char *p = realloc(s->p, cap);
    if (!p) return false;
    s->p = p;
    s->cap = cap;
    return true;
}

bool tk_str_put(tk_str *s, const void *p, size_t n) {
    if (!tk_str_reserve(s, n)) return false;
    if (n) memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
    return true;
}

void tk_str_free(tk_str *s) {
    free(s->p);
    s->p = NULL;
    s->n = s->cap = 0;
}

bool tk_pieces_add(tk_pieces *l, const char *p, size_t n, bool at_start) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        tk_span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    size_t off = l->buf.n;
    if (!tk_str_put(&l->buf, p, n)) return false;
    l->v[l->n++] = (tk_span){off, n, at_start};
    return true;
}

void tk_pieces_clear(tk_pieces *l) {
    l->n = 0;
    l->buf.n = 0;
}

void tk_pieces_free(tk_pieces *l) {
    tk_str_free(&l->buf);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

bool tk_buf_push(cllm_token_buf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        if (cap > SIZE_MAX / sizeof(int32_t)) return false;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) return false;
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return true;
}

void cllm_token_buf_free(cllm_token_buf *b) {
    if (!b) return;
    free(b->ids);
    b->ids = NULL;
    b->n = b->cap = 0;
}

/* ---- hashing ---- */

/* A small multiply-xorshift hash over 8-byte words; good enough for vocab
 * keys and cache lookups, and fast on short strings. */
uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return h;
}

/* ---- string map ---- */

static bool strmap_grow(tk_strmap *m, size_t slots) {
    uint32_t *s = calloc(slots, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = m->ents[i].hash & (slots - 1);
        while (s[j]) j = (j + 1) & (slots - 1);
        s[j] = (uint32_t)(i + 1);
    }
    free(m->slots);
    m->slots = s;
    m->mask = slots - 1;
    return true;
}

bool tk_strmap_init(tk_strmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    size_t slots = 64;
    while (slots < expect * 2) slots *= 2;
    return strmap_grow(m, slots);
}

int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t n) {
    uint32_t h = (uint32_t)tk_hash(k, n);
    size_t j = h & m->mask;
    for (;;) {
        uint32_t e = m->slots[j];
        if (!e) return -1;
        const tk_ent *en = &m->ents[e - 1];
        if (en->hash == h && en->len == n && memcmp(m->keys.p + en->off, k, n) == 0) return en->val;
        j = (j + 1) & m->mask;
    }
}

bool tk_strmap_put(tk_strmap *m, const char *k, size_t n, int32_t val) {
    if (n > UINT32_MAX || m->keys.n > UINT32_MAX - n) return false;
    uint32_t h = (uint32_t)tk_hash(k, n);
    size_t j = h & m->mask;
    for (;;) {
        uint32_t e = m->slots[j];
        if (!e) break;
        tk_ent *en = &m->ents[e - 1];
        if (en->hash == h && en->len == n && memcmp(m->keys.p + en->off, k, n) == 0) {
            en->val = val;
            return true;
        }
        j = (j + 1) & m->mask;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        tk_ent *v = realloc(m->ents, cap * sizeof *v);
        if (!v) return false;
        m->ents = v;
        m->cap = cap;
    }
    uint32_t off = (uint32_t)m->keys.n;
    if (!tk_str_put(&m->keys, k, n)) return false;
    m->ents[m->n] = (tk_ent){off, (uint32_t)n, h, val};
    m->slots[j] = (uint32_t)(m->n + 1);
    m->n++;
    if (m->n * 2 > m->mask + 1) return strmap_grow(m, (m->mask + 1) * 2);
    return true;
}

void tk_strmap_free(tk_strmap *m) {
    tk_str_free(&m->keys);
    free(m->ents);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- pair map ---- */

bool tk_pairmap_init(tk_pairmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    size_t slots = 64;
    while (slots < expect * 2) slots *= 2;
    m->e = malloc(slots * sizeof *m->e);
    if (!m->e) return false;
    for (size_t i = 0; i < slots; i++) m->e[i].key = UINT64_MAX;
    m->mask = slots - 1;
    return true;
}

void tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t k = tk_pair_key(a, b);
    size_t i = tk_pair_slot(k, m->mask);
    while (m->e[i].key != UINT64_MAX) {
        if (m->e[i].key == k) return;
        i = (i + 1) & m->mask;
    }
    m->e[i] = (tk_pair_ent){k, rank, merged};
    m->n++;
}

void tk_pairmap_free(tk_pairmap *m) {
    free(m->e);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ---- */

size_t tk_utf8_next(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned char c = u[0];
    if (c < 0x80 || n < 2) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((uint32_t)(c & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0 || n < 4) {
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (n > 2 ? (u[2] & 0x3Fu) : 0u);
        return n < 3 ? n : 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
          (u[3] & 0x3F);
    return 4;
}

/* Length of the valid sequence starting at u[0..n), or 0 if invalid; for
 * an invalid one, *bad is the length of the maximal subpart to replace. */
static size_t utf8_seq(const unsigned char *u, size_t n, size_t *bad) {
    unsigned char c = u[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) break;
        unsigned char d = u[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) break;
    }
    if (i == need) return need;
    *bad = i;
    return 0;
}

size_t tk_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* fast path over ASCII, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, u + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, k = utf8_seq(u + i, n - i, &bad);
        if (!k) return i;
        i += k;
    }
    return n;
}

bool tk_utf8_lossy(tk_str *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t ok = tk_utf8_valid_prefix(s + i, n - i);
        if (!tk_str_put(out, s + i, ok)) return false;
        i += ok;
        if (i >= n) break;
        size_t bad = 1;
        utf8_seq(u + i, n - i, &bad);
        if (!tk_str_put(out, "\xEF\xBF\xBD", 3)) return false;
        i += bad;
    }
    return true;
}

size_t tk_utf8_put(char *b, uint32_t cp) {
    unsigned char *u = (unsigned char *)b;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (unsigned char)(0xF0 | (cp >> 18));
    u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tk_is_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t tk_space_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tk_utf8_next(s + i, n - i, &cp);
        if (!tk_is_space(cp)) break;
        i += k;
    }
    return i;
}

size_t tk_space_suffix(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        tk_utf8_next(s + st, end - st, &cp);
        if (!tk_is_space(cp)) break;
        end = st;
    }
    return n - end;
}

/* ---- byte-level alphabet (GPT-2) ----
 * Printable bytes 33..126, 161..172 and 174..255 stand for themselves; the
 * other 68 bytes, in increasing order, become U+0100, U+0101, ... */
static bool byte_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t tk_byte_to_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++)
        if (!byte_printable(i)) n++;
    return 256 + n;
}

int tk_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned n = cp - 256;
    for (unsigned i = 0; i < 256; i++)
        if (!byte_printable(i) && n-- == 0) return (int)i;
    return -1;
}

/* ---- regex ---- */

cllm_status tk_regex_compile(tk_regex *re, const char *pattern, size_t n, bool literal, const char *what) {
    int err;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
    re->jit = false;
    re->code = pcre2_compile((PCRE2_SPTR)pattern, n, opts, &err, &erroff, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: regex /%.*s/ does not compile at offset %zu: %s", what,
                         (int)(n > 200 ? 200 : n), pattern, (size_t)erroff, (const char *)msg);
    }
    /* JIT is an optimisation only: without it (unsupported CPU, or memory
     * that may not be executable) the interpreter gives the same matches. */
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return CLLM_OK;
}

void tk_regex_free(tk_regex *re) {
    pcre2_code_free(re->code);
    re->code = NULL;
}

int tk_regex_find(const tk_regex *re, tk_work *w, const char *s, size_t n, size_t start, size_t *ms, size_t *me) {
    if (start > n) return 0;
    int rc;
    if (re->jit)
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, start, 0, w->md, w->mctx);
    else
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        CLLM_FAIL(CLLM_ERR_INTERNAL, "regex match failed: %s", (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}
