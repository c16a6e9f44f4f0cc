/*
 * BPE training, step one: counting words. The corpus is read file by file,
 * cut into ~1 MiB chunks at places where a cut cannot change the
 * pre-tokenization, and the chunks are pre-tokenized in parallel with the
 * tokenizer's own pipeline (added tokens, normalizer, pre-tokenizer), each
 * thread counting into its own table; the tables are summed at the end.
 * Also the small containers of the trainer (word table, vocabulary).
 * Not here: the merge learner (train_bpe.c), file output (train.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cllm/io.h"
#include "tokenizer/train_impl.h"

#define NOMEM() CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory")
#define CHUNK (1u << 20)

/* ---- word table ---- */

static bool wordmap_grow(tt_wordmap *m) {
    size_t slots = m->mask ? (m->mask + 1) * 2 : 1024;
    uint32_t *s = calloc(slots, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = m->v[i].hash & (slots - 1);
        while (s[j]) j = (j + 1) & (slots - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(m->slots);
    m->slots = s;
    m->mask = slots - 1;
    return true;
}

bool tt_wordmap_add(tt_wordmap *m, const char *k, size_t n, uint64_t hash, int64_t count) {
    if (n > UINT32_MAX || m->n >= UINT32_MAX - 1) return false;
    if ((m->n + 1) * 2 > m->mask + 1 && !wordmap_grow(m)) return false;
    size_t j = hash & m->mask;
    for (;;) {
        uint32_t s = m->slots[j];
        if (!s) break;
        tt_word *e = &m->v[s - 1];
        if (e->hash == hash && e->len == n && memcmp(m->keys.p + e->off, k, n) == 0) {
            e->count += count;
            return true;
        }
        j = (j + 1) & m->mask;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        tt_word *v = realloc(m->v, cap * sizeof *v);
        if (!v) return false;
        m->v = v;
        m->cap = cap;
    }
    uint64_t off = m->keys.n;
    if (!tk_str_put(&m->keys, k, n)) return false;
    m->v[m->n] = (tt_word){off, hash, (uint32_t)n, count};
    m->slots[j] = (uint32_t)++m->n;
    return true;
}

void tt_wordmap_free(tt_wordmap *m) {
    tk_str_free(&m->keys);
    free(m->v);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- vocabulary ---- */

bool tt_vocab_init(tt_vocab *v, size_t expect) {
    memset(v, 0, sizeof *v);
    return tk_strmap_init(&v->map, expect);
}

bool tt_vocab_set(tt_vocab *v, int32_t id, const char *s, size_t n) {
    if (id < 0 || n > UINT32_MAX) return false;
    if (id >= v->cap) {
        int32_t cap = v->cap ? v->cap : 1024;
        while (cap <= id) cap *= 2;
        uint64_t *off = realloc(v->off, (size_t)cap * sizeof *off);
        if (off) v->off = off;
        uint32_t *len = realloc(v->len, (size_t)cap * sizeof *len);
        if (len) v->len = len;
        uint8_t *res = realloc(v->reserved, (size_t)cap);
        if (res) v->reserved = res;
        if (!off || !len || !res) return false;
        v->cap = cap;
    }
    for (int32_t i = v->n; i <= id; i++) {
        v->off[i] = UINT64_MAX;
        v->len[i] = 0;
        v->reserved[i] = 0;
    }
    if (id >= v->n) v->n = id + 1;
    v->off[id] = v->arena.n;
    v->len[id] = (uint32_t)n;
    return tk_str_put(&v->arena, s, n) && tk_strmap_put(&v->map, s, n, id);
}

void tt_vocab_free(tt_vocab *v) {
    tk_str_free(&v->arena);
    free(v->off);
    free(v->len);
    free(v->reserved);
    tk_strmap_free(&v->map);
    memset(v, 0, sizeof *v);
}

void tt_corpus_free(tt_corpus *c) {
    free(c->sym);
    free(c->off);
    free(c->len);
    free(c->count);
    memset(c, 0, sizeof *c);
}

/* ---- chunking ---- */

static bool ascii_word_byte(unsigned char c) {
    return c < 0x80 && c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f';
}

/* End of the chunk that starts at `from`. Line mode: after a '\n'. Text mode
 * (byte-level): right after a "\n" that has an ASCII non-space byte on both
 * sides, where the GPT-2 pattern always ends a pre-token (the '\n' is a
 * whitespace run of its own and the next byte starts a new one); else after
 * any '\n'; else at a UTF-8 character boundary. */
static size_t chunk_end(const char *s, size_t n, size_t from, bool lines) {
    if (n - from <= CHUNK) return n;
    size_t i = from + CHUNK, lim = n - i > CHUNK / 4 ? i + CHUNK / 4 : n;
    if (!lines)
        for (size_t k = i; k < lim; k++)
            if (s[k - 1] == '\n' && ascii_word_byte((unsigned char)s[k - 2]) && ascii_word_byte((unsigned char)s[k]))
                return k;
    const char *nl = memchr(s + i, '\n', n - i);
    if (nl && (lines || (size_t)(nl - s) < lim)) return (size_t)(nl - s) + 1;
    if (lines) return n;
    while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    return i;
}

/* ---- counting ---- */

typedef struct {
    const cllm_tokenizer *tok;
    tk_work *w;
    tt_wordmap map;
    tk_str clean;
    bool cut; /* split pieces before U+2581 that follows another character */
} counter;

static bool add_word(counter *c, const char *s, size_t n) {
    return n == 0 || tt_wordmap_add(&c->map, s, n, tk_hash(s, n), 1);
}

static bool add_piece(counter *c, const char *s, size_t n) {
    if (!c->cut) return add_word(c, s, n);
    static const char cut[] = "\xE2\x96\x81";
    size_t a = 0;
    for (size_t i = 1; i + 3 <= n;) {
        const char *p = memchr(s + i, 0xE2, n - i);
        if (!p) break;
        size_t k = (size_t)(p - s);
        if (k + 3 > n) break;
        if (memcmp(p, cut, 3) != 0) {
            i = k + 1;
            continue;
        }
        if (k > a && !(k >= 3 && memcmp(s + k - 3, cut, 3) == 0)) {
            if (!add_word(c, s + a, k - a)) return false;
            a = k;
        }
        i = k + 3;
    }
    return add_word(c, s + a, n - a);
}

static cllm_status count_pretok(counter *c, const char *s, size_t n, bool at_start) {
    if (n == 0) return CLLM_OK;
    int r;
    cllm_status st = tk_pretok_run(c->tok->pretok, c->w, s, n, at_start, &r);
    if (st) return st;
    const tk_pieces *pl = &c->w->pieces[r];
    for (size_t i = 0; i < pl->n; i++)
        if (!add_piece(c, pl->buf.p + pl->v[i].off, pl->v[i].len)) return NOMEM();
    return CLLM_OK;
}

/* The encoder's pipeline (encode.c) up to the model, with added tokens
 * dropped: they are never part of a learned token. */
static cllm_status count_text(counter *c, const char *s, size_t n) {
    const cllm_tokenizer *tok = c->tok;
    tk_work *w = c->w;
    if (tk_utf8_valid_prefix(s, n) != n) {
        c->clean.n = 0;
        if (!tk_utf8_lossy(&c->clean, s, n)) return NOMEM();
        s = c->clean.p;
        n = c->clean.n;
    }
    size_t nseg;
    cllm_status st = tk_added_split(tok, &tok->trie_raw, w, 0, s, n, &nseg);
    if (st) return st;
    for (size_t k = 0; k < nseg; k++) {
        tk_seg seg = w->segs[0][k];
        if (seg.id >= 0) continue;
        const char *t = s + seg.off;
        size_t tn = seg.len;
        bool at_start = seg.off == 0;
        if (tok->norm) {
            if ((st = tk_norm_apply(tok->norm, w, t, tn, &w->norm))) return st;
            t = w->norm.p;
            tn = w->norm.n;
        }
        if (!tok->has_norm_added) {
            if ((st = count_pretok(c, t, tn, at_start))) return st;
            continue;
        }
        size_t nsub;
        if ((st = tk_added_split(tok, &tok->trie_norm, w, 1, t, tn, &nsub))) return st;
        for (size_t j = 0; j < nsub; j++) {
            tk_seg sub = w->segs[1][j];
            if (sub.id < 0 && (st = count_pretok(c, t + sub.off, sub.len, at_start && sub.off == 0))) return st;
        }
    }
    return CLLM_OK;
}

static cllm_status count_chunk(counter *c, const char *s, size_t n, bool lines) {
    if (!lines) return count_text(c, s, n);
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - s) : n;
        cllm_status st = count_text(c, s + i, e - i);
        if (st) return st;
        i = e + 1;
    }
    return CLLM_OK;
}

static bool map_merge(tt_wordmap *dst, const tt_wordmap *src) {
    for (size_t i = 0; i < src->n; i++) {
        const tt_word *e = &src->v[i];
        if (!tt_wordmap_add(dst, src->keys.p + e->off, e->len, e->hash, e->count)) return false;
    }
    return true;
}

static cllm_status count_buffer(const cllm_tokenizer *tok, const char *s, size_t n, int n_workers,
                                tt_wordmap *out) {
    bool lines = !tok->byte_level;
    size_t *cuts = NULL, nc = 0, cap = 0;
    for (size_t a = 0; a < n;) {
        if (nc == cap) {
            cap = cap ? cap * 2 : 64;
            size_t *t = realloc(cuts, cap * sizeof *t);
            if (!t) {
                free(cuts);
                return NOMEM();
            }
            cuts = t;
        }
        cuts[nc++] = a;
        a = chunk_end(s, n, a, lines);
    }
    cllm_status st = CLLM_OK;
    char msg[512] = "";
    int nt = n_workers > 0 ? n_workers : 0;
    if (nt == 0) {
#ifdef _OPENMP
        nt = omp_get_max_threads();
#else
        nt = 1;
#endif
    }
    if ((size_t)nt > nc) nt = nc ? (int)nc : 1;
    bool cut = !tok->byte_level && tok->cut_len == 3 && memcmp(tok->cut, "\xE2\x96\x81", 3) == 0;
#pragma omp parallel num_threads(nt)
    {
        counter c = {tok, NULL, {{0}, NULL, 0, 0, NULL, 0}, {NULL, 0, 0}, cut};
        int slot = -1;
        cllm_status my = CLLM_OK;
        c.w = tk_work_acquire(tok, &slot);
        if (!c.w) my = NOMEM();
#pragma omp for schedule(dynamic, 1)
        for (long k = 0; k < (long)nc; k++) {
            if (my) continue;
            size_t a = cuts[k], b = (size_t)k + 1 < nc ? cuts[k + 1] : n;
            my = count_chunk(&c, s + a, b - a, lines);
        }
#pragma omp critical(tt_count_merge)
        {
            if (!my && !st && !map_merge(out, &c.map)) my = NOMEM();
            if (my && !st) {
                st = my;
                snprintf(msg, sizeof msg, "%s", cllm_last_error());
            }
        }
        if (c.w) tk_work_release(tok, c.w, slot);
        tt_wordmap_free(&c.map);
        tk_str_free(&c.clean);
    }
    free(cuts);
    if (st) return CLLM_FAIL(st, "%s", msg);
    return CLLM_OK;
}

cllm_status tt_count_words(const cllm_tokenizer *tok, const char *const *files, int n_files, int n_workers,
                           tt_wordmap *out, size_t *n_bytes) {
    *n_bytes = 0;
    for (int i = 0; i < n_files; i++) {
        char *data = NULL;
        size_t len = 0;
        cllm_status st = cllm_read_file(files[i], &data, &len);
        if (st) return st;
        st = count_buffer(tok, data, len, n_workers, out);
        free(data);
        if (st) return cllm_fail_context(st, "%s", files[i]);
        *n_bytes += len;
    }
    return CLLM_OK;
}
