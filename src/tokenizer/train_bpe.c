/*
 * BPE training, step two: learning merges on counted words.
 *
 * The usual incremental algorithm: every adjacent symbol pair has a count
 * (summed over the words holding it, weighted by word count) and a list of
 * the words that hold it; a binary max-heap orders pairs by count with lazy
 * deletion (an entry whose count is out of date is re-pushed with the
 * current count when it reaches the top). Merging the best pair rewrites
 * only the words in its list, and each rewritten occurrence changes the
 * counts of just its neighbours' pairs, so a merge costs time proportional
 * to the text it touches, not to the corpus.
 *
 * Word lists may hold stale entries (a word that lost the pair) and
 * repeats; a per-word mark skips them. Only pairs that contain the new
 * token can gain count, so they are the only ones pushed after a merge.
 * Also here: applying an existing merge table to the words (extension).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/train_impl.h"

#define NOMEM() CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory while learning merges")

typedef struct {
    int32_t a, b;
    int64_t count;
    uint32_t *w;     /* words holding the pair */
    uint32_t nw, cw;
    uint32_t last;   /* last word appended + 1 */
    uint32_t touched; /* merge step that last pushed it to the touched list */
    bool blocked;     /* its result would spell a reserved token: never merged */
} pair_t;

typedef struct {
    int64_t count;
    uint32_t pair;
} hent;

typedef struct {
    tt_corpus *c;
    tt_vocab *v;
    pair_t *p;
    size_t np, capp;
    uint32_t *slots; /* pair index + 1 */
    size_t mask;
    hent *h;
    size_t nh, caph;
    uint32_t *touched;
    size_t nt, capt;
    uint32_t *mark; /* per word: last merge step that rewrote it */
    uint32_t step;
    bool oom;
} learner;

/* ---- pair table ---- */

static size_t pair_slot(int32_t a, int32_t b, size_t mask) { return tk_pair_slot(tk_pair_key(a, b), mask); }

static bool pairs_grow(learner *L) {
    size_t slots = L->mask ? (L->mask + 1) * 2 : 4096;
    uint32_t *s = calloc(slots, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < L->np; i++) {
        size_t j = pair_slot(L->p[i].a, L->p[i].b, slots - 1);
        while (s[j]) j = (j + 1) & (slots - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(L->slots);
    L->slots = s;
    L->mask = slots - 1;
    return true;
}

/* Index of pair (a, b), created with count 0 if new; UINT32_MAX when out of memory. */
static uint32_t pair_get(learner *L, int32_t a, int32_t b) {
    if ((L->np + 1) * 2 > L->mask + 1 && !pairs_grow(L)) return UINT32_MAX;
    size_t j = pair_slot(a, b, L->mask);
    for (;;) {
        uint32_t s = L->slots[j];
        if (!s) break;
        if (L->p[s - 1].a == a && L->p[s - 1].b == b) return s - 1;
        j = (j + 1) & L->mask;
    }
    if (L->np >= UINT32_MAX - 1) return UINT32_MAX;
    if (L->np == L->capp) {
        size_t cap = L->capp ? L->capp * 2 : 4096;
        pair_t *p = realloc(L->p, cap * sizeof *p);
        if (!p) return UINT32_MAX;
        L->p = p;
        L->capp = cap;
    }
    L->p[L->np] = (pair_t){a, b, 0, NULL, 0, 0, 0, 0, false};
    L->slots[j] = (uint32_t)++L->np;
    return (uint32_t)(L->np - 1);
}

static bool pair_add_word(pair_t *p, uint32_t w) {
    if (p->last == w + 1) return true;
    if (p->nw == p->cw) {
        uint32_t cap = p->cw ? p->cw * 2 : 2;
        if (cap < p->cw) return false;
        uint32_t *v = realloc(p->w, (size_t)cap * sizeof *v);
        if (!v) return false;
        p->w = v;
        p->cw = cap;
    }
    p->w[p->nw++] = w;
    p->last = w + 1;
    return true;
}

/* ---- heap: best pair on top ---- */

/* Compares x1||x2 with y1||y2 as byte strings. */
static int cmp_concat(const unsigned char *x1, size_t lx1, const unsigned char *x2, size_t lx2,
                      const unsigned char *y1, size_t ly1, const unsigned char *y2, size_t ly2) {
    size_t lx = lx1 + lx2, ly = ly1 + ly2, n = lx < ly ? lx : ly;
    for (size_t i = 0; i < n; i++) {
        unsigned cx = i < lx1 ? x1[i] : x2[i - lx1], cy = i < ly1 ? y1[i] : y2[i - ly1];
        if (cx != cy) return cx < cy ? -1 : 1;
    }
    return lx < ly ? -1 : lx > ly;
}

/* True if x should be merged before y. */
static bool better(const learner *L, hent x, hent y) {
    if (x.count != y.count) return x.count > y.count;
    if (x.pair == y.pair) return false;
    const pair_t *px = &L->p[x.pair], *py = &L->p[y.pair];
    const tt_vocab *v = L->v;
    int c = cmp_concat((const unsigned char *)tt_vocab_str(v, px->a), v->len[px->a],
                       (const unsigned char *)tt_vocab_str(v, px->b), v->len[px->b],
                       (const unsigned char *)tt_vocab_str(v, py->a), v->len[py->a],
                       (const unsigned char *)tt_vocab_str(v, py->b), v->len[py->b]);
    if (c) return c < 0;
    return v->len[px->a] < v->len[py->a];
}

static void sift_down(learner *L, size_t i) {
    hent e = L->h[i];
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        hent be = e;
        if (l < L->nh && better(L, L->h[l], be)) {
            best = l;
            be = L->h[l];
        }
        if (l + 1 < L->nh && better(L, L->h[l + 1], be)) best = l + 1;
        if (best == i) break;
        L->h[i] = L->h[best];
        i = best;
    }
    L->h[i] = e;
}

static bool heap_push(learner *L, hent e) {
    if (L->nh == L->caph) {
        size_t cap = L->caph ? L->caph * 2 : 4096;
        hent *h = realloc(L->h, cap * sizeof *h);
        if (!h) return false;
        L->h = h;
        L->caph = cap;
    }
    size_t i = L->nh++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!better(L, e, L->h[p])) break;
        L->h[i] = L->h[p];
        i = p;
    }
    L->h[i] = e;
    return true;
}

static hent heap_pop(learner *L) {
    hent top = L->h[0];
    L->h[0] = L->h[--L->nh];
    if (L->nh) sift_down(L, 0);
    return top;
}

/* ---- merging ---- */

/* Adds d occurrences (times the word's count) of pair (x, y) held by word w. */
static void delta(learner *L, int32_t x, int32_t y, int d, uint32_t w) {
    if (x < 0 || y < 0 || L->oom) return;
    uint32_t i = pair_get(L, x, y);
    if (i == UINT32_MAX) {
        L->oom = true;
        return;
    }
    pair_t *p = &L->p[i];
    p->count += d * L->c->count[w];
    if (d <= 0) return;
    if (!pair_add_word(p, w)) {
        L->oom = true;
        return;
    }
    if (p->touched == L->step) return;
    p->touched = L->step;
    if (L->nt == L->capt) {
        size_t cap = L->capt ? L->capt * 2 : 1024;
        uint32_t *t = realloc(L->touched, cap * sizeof *t);
        if (!t) {
            L->oom = true;
            return;
        }
        L->touched = t;
        L->capt = cap;
    }
    L->touched[L->nt++] = i;
}

/* Replaces each (a, b) in word w by m, left to right, updating the counts
 * of the neighbouring pairs. The merged pair's own count is reset by the
 * caller. */
static void merge_word(learner *L, uint32_t w, int32_t a, int32_t b, int32_t m) {
    int32_t *s = L->c->sym + L->c->off[w];
    uint32_t n = L->c->len[w], j = 0;
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            if (j > 0) {
                delta(L, s[j - 1], a, -1, w);
                delta(L, s[j - 1], m, 1, w);
            }
            if (i + 2 < n) {
                delta(L, b, s[i + 2], -1, w);
                delta(L, m, s[i + 2], 1, w);
            }
            s[j++] = m;
            i += 2;
        } else {
            s[j++] = s[i++];
        }
    }
    L->c->len[w] = j;
}

static void learner_free(learner *L) {
    for (size_t i = 0; i < L->np; i++) free(L->p[i].w);
    free(L->p);
    free(L->slots);
    free(L->h);
    free(L->touched);
    free(L->mark);
}

/* The string of a ++ b as a new or existing token; -1 when out of memory,
 * -2 when it spells a reserved token (e.g. "<0x41>" from '<', '0', ...). */
static int32_t merged_token(tt_vocab *v, int32_t a, int32_t b, tk_str *tmp, bool *created) {
    tmp->n = 0;
    if (!tk_str_put(tmp, tt_vocab_str(v, a), v->len[a]) || !tk_str_put(tmp, tt_vocab_str(v, b), v->len[b])) return -1;
    int32_t id = tk_strmap_get(&v->map, tmp->p, tmp->n);
    *created = id < 0;
    if (id >= 0) return v->reserved[id] ? -2 : id;
    id = v->n;
    return tt_vocab_set(v, id, tmp->p, tmp->n) ? id : -1;
}

cllm_status tt_learn(tt_corpus *c, tt_vocab *v, int32_t n_new, int64_t min_freq, tt_merge **merges,
                     size_t *n_merges, int32_t *n_made) {
    *merges = NULL;
    *n_merges = 0;
    *n_made = 0;
    if (min_freq < 1) min_freq = 1;
    learner L = {0};
    L.c = c;
    L.v = v;
    tt_merge *out = NULL;
    size_t nout = 0, capout = 0;
    tk_str tmp = {0};
    cllm_status st = CLLM_OK;
    if (c->n_words >= UINT32_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "too many distinct words (%zu)", c->n_words);
    L.mark = calloc(c->n_words + 1, sizeof *L.mark);
    if (!L.mark) {
        st = NOMEM();
        goto done;
    }
    for (size_t w = 0; w < c->n_words; w++) {
        const int32_t *s = c->sym + c->off[w];
        for (uint32_t i = 0; i + 1 < c->len[w]; i++) delta(&L, s[i], s[i + 1], 1, (uint32_t)w);
    }
    if (L.oom) {
        st = NOMEM();
        goto done;
    }
    for (size_t i = 0; i < L.np; i++)
        if (L.p[i].count >= min_freq && !heap_push(&L, (hent){L.p[i].count, (uint32_t)i})) {
            st = NOMEM();
            goto done;
        }
    while (*n_made < n_new && L.nh > 0) {
        hent top = heap_pop(&L);
        pair_t *p = &L.p[top.pair];
        if (p->blocked) continue;
        if (p->count != top.count) {
            if (p->count >= min_freq && !heap_push(&L, (hent){p->count, top.pair})) {
                st = NOMEM();
                goto done;
            }
            continue;
        }
        int32_t a = p->a, b = p->b;
        bool created;
        int32_t m = merged_token(v, a, b, &tmp, &created);
        if (m == -2) {
            p->blocked = true;
            continue;
        }
        if (m < 0) {
            st = NOMEM();
            goto done;
        }
        if (nout == capout) {
            capout = capout ? capout * 2 : 1024;
            tt_merge *t = realloc(out, capout * sizeof *t);
            if (!t) {
                st = NOMEM();
                goto done;
            }
            out = t;
        }
        out[nout++] = (tt_merge){a, b, m};
        *n_made += created;
        L.step++;
        L.nt = 0;
        uint32_t *wl = p->w, nwl = p->nw;
        p->w = NULL;
        p->nw = p->cw = 0;
        p->last = 0;
        for (uint32_t k = 0; k < nwl; k++) {
            uint32_t w = wl[k];
            if (L.mark[w] == L.step) continue;
            L.mark[w] = L.step;
            merge_word(&L, w, a, b, m);
        }
        free(wl);
        L.p[top.pair].count = 0;
        if (L.oom) {
            st = NOMEM();
            goto done;
        }
        for (size_t k = 0; k < L.nt; k++) {
            const pair_t *q = &L.p[L.touched[k]];
            if (q->count >= min_freq && !heap_push(&L, (hent){q->count, L.touched[k]})) {
                st = NOMEM();
                goto done;
            }
        }
    }
done:
    learner_free(&L);
    tk_str_free(&tmp);
    if (st) {
        free(out);
        *n_made = 0;
        return st;
    }
    *merges = out;
    *n_merges = nout;
    return CLLM_OK;
}

/* ---- applying an existing merge table ---- */

typedef struct {
    int32_t *prev, *next;
    uint64_t *heap; /* rank << 32 | left position: lowest first */
    size_t cap, nh;
} apply_ws;

static void ah_push(apply_ws *a, uint64_t k) {
    size_t i = a->nh++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (a->heap[p] <= k) break;
        a->heap[i] = a->heap[p];
        i = p;
    }
    a->heap[i] = k;
}

static uint64_t ah_pop(apply_ws *a) {
    uint64_t top = a->heap[0], e = a->heap[--a->nh];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, s = i;
        uint64_t se = e;
        if (l < a->nh && a->heap[l] < se) {
            s = l;
            se = a->heap[l];
        }
        if (l + 1 < a->nh && a->heap[l + 1] < se) s = l + 1;
        if (s == i) break;
        a->heap[i] = a->heap[s];
        i = s;
    }
    if (a->nh) a->heap[i] = e;
    return top;
}

static void try_pair(apply_ws *a, const tk_pairmap *mp, const int32_t *s, int32_t l) {
    if (l < 0 || a->next[l] < 0) return;
    int32_t x = s[l], y = s[a->next[l]];
    uint32_t rank;
    int32_t merged;
    if (x >= 0 && y >= 0 && tk_pairmap_get(mp, x, y, &rank, &merged)) ah_push(a, (uint64_t)rank << 32 | (uint32_t)l);
}

#define DEAD INT32_MIN

static void apply_word(apply_ws *a, const tk_pairmap *mp, int32_t *s, uint32_t *len) {
    int32_t n = (int32_t)*len;
    a->nh = 0;
    for (int32_t i = 0; i < n; i++) {
        a->prev[i] = i - 1;
        a->next[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int32_t i = 0; i + 1 < n; i++) try_pair(a, mp, s, i);
    while (a->nh) {
        uint64_t k = ah_pop(a);
        int32_t l = (int32_t)(uint32_t)k, r = a->next[l];
        uint32_t rank;
        int32_t merged;
        if (s[l] == DEAD || r < 0 || s[l] < 0 || s[r] < 0 || !tk_pairmap_get(mp, s[l], s[r], &rank, &merged) ||
            rank != (uint32_t)(k >> 32))
            continue; /* stale */
        s[l] = merged;
        s[r] = DEAD;
        a->next[l] = a->next[r];
        if (a->next[r] >= 0) a->prev[a->next[r]] = l;
        try_pair(a, mp, s, a->prev[l]);
        try_pair(a, mp, s, l);
    }
    uint32_t j = 0;
    for (int32_t i = 0; i < n; i++)
        if (s[i] != DEAD) s[j++] = s[i];
    *len = j;
}

cllm_status tt_apply_merges(tt_corpus *c, const tk_pairmap *merges) {
    if (merges->n == 0) return CLLM_OK;
    apply_ws a = {0};
    uint32_t maxlen = 0;
    for (size_t w = 0; w < c->n_words; w++)
        if (c->len[w] > maxlen) maxlen = c->len[w];
    if (maxlen > INT32_MAX / 2) return CLLM_FAIL(CLLM_ERR_ARG, "a word of %u symbols is too long", maxlen);
    a.cap = (size_t)maxlen + 1;
    a.prev = malloc(a.cap * sizeof *a.prev);
    a.next = malloc(a.cap * sizeof *a.next);
    a.heap = malloc(a.cap * 3 * sizeof *a.heap); /* n - 1 pairs + 2 per merge */
    cllm_status st = CLLM_OK;
    if (!a.prev || !a.next || !a.heap)
        st = NOMEM();
    else
        for (size_t w = 0; w < c->n_words; w++) apply_word(&a, merges, c->sym + c->off[w], &c->len[w]);
    free(a.prev);
    free(a.next);
    free(a.heap);
    return st;
}
