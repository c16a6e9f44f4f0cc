/*
 * The loader (include/cllm/loader.h): one or more sources behind one
 * endless, seeded sample stream.
 *
 * A source is either an indexed dataset (mmap of PREFIX.bin/.idx/.mask) or
 * a raw file tokenized into memory when opened. Rows come from one sequence
 * (truncated / padded to T) or, for packed datasets, from a window of T
 * tokens over the split's token stream; consecutive windows share one token
 * so that every token after the first is a target exactly once (T tokens
 * give T-1 next-token targets).
 *
 * Order: sample g of a source is permutation_e[g % n] with e = g / n; the
 * permutation of epoch e is a Fisher-Yates shuffle seeded by (seed, e) (the
 * same shuffle `cllm train` used before the loader existed). The two most
 * recent epochs' permutations are cached, so get() is O(1) apart from one
 * O(n) shuffle per epoch. Blends route g through blend.c first.
 * Not done here: reading records (records.c) and parsing them (sample.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cllm/loader.h"
#include "cllm/tokenizer.h"
#include "data/blend_impl.h"
#include "data/data_impl.h"

typedef struct {
    char *name;
    bool indexed, packed, pairs;
    cllm_indexed idx;
    cllm_store mem;
    cllm_pair_extra extra; /* pairs: per-row margins and single-record flags */
    int32_t pad;
    uint64_t seq_begin, seq_end; /* selected split, in sequences */
    uint64_t tok_begin, tok_end; /* packed: token range of the split */
    uint64_t n;                  /* samples per epoch */
    uint64_t seed;
    uint32_t *perm[2];
    int64_t perm_epoch[2];
    int perm_next; /* slot to replace */
} source;

struct cllm_loader {
    int T, vocab;
    bool shuffle;
    int n_src;
    source *src;
    cllm_blend blend;
    uint64_t size;
};

static void source_free(source *s) {
    free(s->name);
    cllm_indexed_close(&s->idx);
    cllm_store_free(&s->mem);
    free(s->extra.margin);
    free(s->extra.single);
    free(s->perm[0]);
    free(s->perm[1]);
}

void cllm_loader_free(cllm_loader *l) {
    if (!l) return;
    for (int i = 0; i < l->n_src; i++) source_free(&l->src[i]);
    free(l->src);
    cllm_blend_free(&l->blend);
    free(l);
}

uint64_t cllm_loader_size(const cllm_loader *l) { return l->size; }

static bool file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* ----------------------------------------------------------- raw files */

static void log_bad(const char *what, long n_bad, long limit) {
    if (n_bad <= 5)
        cllm_log(CLLM_LOG_WARN, "skipping bad record (%ld of at most %ld): %s", n_bad, limit, what);
}

/* Tokenizes every record of a raw file into s->mem. */
static cllm_status open_raw(source *s, const char *path, const cllm_loader_opts *o) {
    cllm_record_reader *rd = NULL;
    cllm_tokenizer *tok = NULL;
    cllm_template tmpl = {0};
    cllm_sample smp = {0};
    cllm_token_buf ids = {0}, labels = {0};
    long n_bad = 0;
    cllm_status st = cllm_template_load(&tmpl, NULL);
    if (!st) st = cllm_records_open(&rd, path);
    while (!st) {
        cllm_record rec;
        bool got;
        if ((st = cllm_records_next(rd, &rec, &got)) || !got) break;
        if (rec.kind == CLLM_REC_TEXT)
            st = cllm_sample_from_text(&smp, rec.text, rec.len, &tmpl);
        else
            st = cllm_sample_parse(&smp, rec.text, rec.len, &rec.loc, &tmpl, o->vocab_size);
        if (!st && smp.type != CLLM_SAMPLE_TOKENS && !tok) {
            /* The tokenizer is loaded on the first text record only, so
             * pre-tokenized data needs none. */
            if (!o->tokenizer)
                st = cllm_fail_at(CLLM_ERR_ARG, rec.loc.file, rec.loc.line, rec.loc.col,
                                  "a %s record needs a tokenizer (--tokenizer DIR)", cllm_sample_type_name(smp.type));
            else if ((st = cllm_tokenizer_load(&tok, o->tokenizer)))
                break;
        }
        ids.n = labels.n = 0;
        if (!st) st = cllm_sample_encode(&smp, tok, &tmpl, o->vocab_size, &rec.loc, &ids, &labels);
        if (st == CLLM_ERR_FORMAT) {
            if (n_bad < o->skip_bad) {
                log_bad(cllm_last_error(), ++n_bad, o->skip_bad);
                st = CLLM_OK;
                continue;
            }
            if (o->skip_bad > 0)
                cllm_fail_context(st, "more than %d bad records (--skip-bad)", o->skip_bad);
            break;
        }
        if (!st) st = cllm_store_append(&s->mem, ids.ids, labels.ids, ids.n);
    }
    if (!st && n_bad) cllm_log(CLLM_LOG_WARN, "%s: skipped %ld bad records", path, n_bad);
    if (!st && s->mem.n == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no samples", path);
    s->pad = 0;
    if (tok) {
        int32_t p = cllm_tokenizer_pad_id(tok), e = cllm_tokenizer_eos_id(tok);
        s->pad = p >= 0 ? p : e >= 0 ? e : 0;
    }
    cllm_tokenizer_free(tok);
    cllm_records_close(rd);
    cllm_template_free(&tmpl);
    cllm_sample_free(&smp);
    cllm_token_buf_free(&ids);
    cllm_token_buf_free(&labels);
    return st;
}

/* ---------------------------------------------------------- one source */

/* A prepared dataset and the loader's mode must agree on pairs; a
 * prepared preference dataset keeps its margins per row as the JSONL
 * reader does. */
static cllm_status indexed_pairs(source *s, const cllm_loader_opts *o) {
    bool pairs = (s->idx.flags & CLLM_MASK_FLAG_PAIRS) != 0;
    if (pairs && !o->pairs)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s is a preference dataset (prepared with --pairs): train on it with task "
                         "\"dpo\" or \"reward\"", s->name);
    if (!pairs && o->pairs)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s is not a preference dataset: prepare the pairs with cllm data prepare "
                         "--pairs, or give the .jsonl file", s->name);
    if (!pairs) return CLLM_OK;
    s->pairs = true;
    if (!s->idx.margins) return CLLM_OK;
    s->extra.margin = malloc((size_t)s->idx.n_seq * sizeof *s->extra.margin);
    if (!s->extra.margin) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (uint64_t q = 0; q < s->idx.n_seq; q++) s->extra.margin[q] = cllm_indexed_margin(&s->idx, q / 2);
    return CLLM_OK;
}

static cllm_status open_source(source *s, const char *spec, const cllm_loader_opts *o, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->perm_epoch[0] = s->perm_epoch[1] = -1;
    s->seed = seed;
    size_t sl = strlen(spec);
    s->name = malloc(sl + 1);
    if (!s->name) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(s->name, spec, sl + 1);
    if ((ends_with(s->name, ".idx") || ends_with(s->name, ".bin")) && file_exists(spec)) s->name[sl - 4] = '\0';
    char *idx = malloc(strlen(s->name) + 5);
    if (!idx) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    sprintf(idx, "%s.idx", s->name);
    bool is_idx = file_exists(idx);
    free(idx);
    cllm_status st;
    uint64_t n_doc;
    const double *stored = NULL;
    if (is_idx) {
        s->indexed = true;
        if ((st = cllm_indexed_open(&s->idx, s->name))) return st;
        s->packed = (s->idx.flags & CLLM_MASK_FLAG_PACKED) != 0;
        s->pad = s->idx.pad_id >= 0 ? s->idx.pad_id : 0;
        n_doc = s->idx.n_doc;
        if (s->idx.split[0] + s->idx.split[1] + s->idx.split[2] > 0) stored = s->idx.split;
        if ((st = indexed_pairs(s, o))) return st;
    } else if (o->pairs) {
        if (!ends_with(spec, ".json") && !ends_with(spec, ".jsonl"))
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: preference data must be a .json or .jsonl file of {\"prompt\", "
                             "\"chosen\", \"rejected\"} records", spec);
        s->pairs = true;
        if ((st = cllm_pairs_load(&s->mem, &s->pad, &s->extra, o->singles, spec, o->tokenizer, o->vocab_size,
                                  o->seq_len)))
            return st;
        n_doc = s->mem.n;
    } else if (ends_with(spec, ".json") || ends_with(spec, ".jsonl") || ends_with(spec, ".txt")) {
        if ((st = open_raw(s, spec, o))) return st;
        n_doc = s->mem.n;
    } else {
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "%s: no such dataset (expected a prepared PREFIX with PREFIX.idx and PREFIX.bin, a .json, "
                         ".jsonl or .txt file, or a blend \"W1 SPEC1 W2 SPEC2 ...\")",
                         spec);
    }
    /* The padding id fills every row shorter than T: a stored one (the
     * .mask header, or the tokenizer's) must be a token of the model. */
    if (o->vocab_size > 0 && (s->pad < 0 || s->pad >= o->vocab_size))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: padding id %d (from %s) is outside the vocabulary [0, %d); was it "
                         "prepared with another tokenizer?", s->name, (int)s->pad,
                         s->indexed ? "its .mask file" : "the tokenizer", o->vocab_size);
    /* Split: a range of documents, Megatron's rule. */
    uint64_t db = 0, de = n_doc;
    if (o->split) {
        int k = cllm_split_index(o->split);
        if (k < 0) return CLLM_FAIL(CLLM_ERR_ARG, "unknown split \"%s\" (train, valid or test)", o->split);
        double w[3] = {1, 0, 0};
        if (o->splits) {
            if ((st = cllm_split_parse(o->splits, w))) return st;
        } else if (stored) {
            memcpy(w, stored, sizeof w);
        }
        uint64_t b[4];
        /* pairs split whole: documents of a prepared dataset are pairs already */
        const bool rows = s->pairs && !s->indexed;
        cllm_split_bounds(w, rows ? n_doc / 2 : n_doc, b);
        db = rows ? 2 * b[k] : b[k];
        de = rows ? 2 * b[k + 1] : b[k + 1];
    }
    s->seq_begin = s->indexed ? (uint64_t)s->idx.docs[db] : db;
    s->seq_end = s->indexed ? (uint64_t)s->idx.docs[de] : de;
    if (s->packed) {
        s->tok_begin = s->seq_begin < s->idx.n_seq ? (uint64_t)s->idx.pointers[s->seq_begin] / s->idx.item
                                                   : s->idx.n_tokens;
        s->tok_end = s->seq_end < s->idx.n_seq ? (uint64_t)s->idx.pointers[s->seq_end] / s->idx.item
                                               : s->idx.n_tokens;
        uint64_t nt = s->tok_end - s->tok_begin, stride = (uint64_t)o->seq_len - 1;
        s->n = nt == 0 ? 0 : nt <= 1 ? 1 : (nt - 1 + stride - 1) / stride;
    } else {
        s->n = s->seq_end - s->seq_begin;
    }
    if (s->n == 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s%s%s holds no samples (%llu documents in all)", spec,
                         o->split ? "the split \"" : "the dataset", o->split ? o->split : "", o->split ? "\"" : "",
                         (unsigned long long)n_doc);
    if (s->n > UINT32_MAX)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: more than 2^32 samples per epoch", spec);
    return CLLM_OK;
}

/* Entry i of epoch e's permutation of n units (a Fisher-Yates shuffle
 * seeded by (seed, e); the two most recent epochs cached). */
static cllm_status source_pick_unit(source *s, uint64_t epoch, uint64_t i, uint64_t n, uint64_t *out) {
    int64_t e = (int64_t)epoch;
    int slot = s->perm_epoch[0] == e ? 0 : s->perm_epoch[1] == e ? 1 : -1;
    if (slot < 0) {
        slot = s->perm_next;
        s->perm_next ^= 1;
        if (!s->perm[slot] && !(s->perm[slot] = malloc(n * sizeof(uint32_t))))
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for a %llu-sample permutation", (unsigned long long)n);
        uint32_t *p = s->perm[slot];
        for (uint64_t u = 0; u < n; u++) p[u] = (uint32_t)u;
        cllm_rng r;
        cllm_rng_seed(&r, s->seed * 0x9e3779b97f4a7c15ull + (uint64_t)e);
        for (uint64_t u = n - 1; u > 0; u--) {
            uint64_t j = cllm_rng_below(&r, u + 1);
            uint32_t t = p[u];
            p[u] = p[j];
            p[j] = t;
        }
        s->perm_epoch[slot] = e;
    }
    *out = s->perm[slot][i];
    return CLLM_OK;
}

/* Sample index within the source for its stream position k; preference
 * pairs shuffle as units (k's pair, then its row). */
static cllm_status source_pick(source *s, bool shuffle, uint64_t k, uint64_t *out) {
    if (!shuffle) {
        *out = k % s->n;
        return CLLM_OK;
    }
    if (s->pairs) {
        uint64_t e = k / s->n, np = s->n / 2, q = 0;
        cllm_status st = source_pick_unit(s, e, (k % s->n) / 2, np, &q);
        *out = 2 * q + k % 2;
        return st;
    }
    return source_pick_unit(s, k / s->n, k % s->n, s->n, out);
}

static cllm_status fill_row(const source *s, uint64_t i, int T, int vocab, int32_t *tokens, int32_t *labels,
                            long *n_labels) {
    uint64_t a, len;
    if (s->packed) {
        a = s->tok_begin + i * (uint64_t)(T - 1);
        len = s->tok_end - a < (uint64_t)T ? s->tok_end - a : (uint64_t)T;
    } else {
        uint64_t q = s->seq_begin + i;
        a = s->indexed ? (uint64_t)s->idx.pointers[q] / s->idx.item : s->mem.offsets[q];
        len = s->indexed ? (uint64_t)s->idx.lengths[q] : s->mem.offsets[q + 1] - a;
        if (len > (uint64_t)T) len = (uint64_t)T;
    }
    long n = 0;
    for (uint64_t t = 0; t < (uint64_t)T; t++) {
        int32_t x = s->pad, y = -100;
        if (t < len) {
            if (s->indexed) {
                x = cllm_indexed_token(&s->idx, a + t);
                y = cllm_indexed_loss(&s->idx, a + t) ? x : -100;
            } else {
                x = s->mem.tokens[a + t];
                y = s->mem.labels[a + t];
            }
            if (x < 0 || (vocab > 0 && x >= vocab))
                return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: token id %d (token %llu of the data) is outside the "
                                 "vocabulary [0, %d); was it prepared with another tokenizer?",
                                 s->name, x, (unsigned long long)(a + t), vocab);
        }
        tokens[t] = x;
        labels[t] = y;
        n += y != -100;
    }
    if (n_labels) *n_labels = n;
    return CLLM_OK;
}

/* ----------------------------------------------------------- the loader */

/* Splits a blend spec into weights and specs; *n = 0 when spec is not a
 * blend. The returned strings point into *buf. */
static cllm_status parse_blend(const char *spec, char **buf, char ***specs, double **w, int *n) {
    *n = 0;
    *buf = NULL;
    *specs = NULL;
    *w = NULL;
    if (!strpbrk(spec, " \t\n") || file_exists(spec)) return CLLM_OK;
    size_t len = strlen(spec);
    char *b = malloc(len + 1);
    char **sp = malloc((len / 2 + 2) * sizeof *sp);
    double *ww = malloc((len / 2 + 2) * sizeof *ww);
    if (!b || !sp || !ww) {
        free(b);
        free(sp);
        free(ww);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    memcpy(b, spec, len + 1);
    int k = 0, words = 0;
    cllm_status st = CLLM_OK;
    for (char *save = NULL, *t = strtok_r(b, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save), words++) {
        if (words % 2 == 0) {
            if (!cllm_parse_f64(t, &ww[k]) || !(ww[k] > 0) || !isfinite(ww[k])) {
                st = CLLM_FAIL(CLLM_ERR_ARG, "blend \"%s\": \"%s\" is not a positive weight (expected \"W1 SPEC1 "
                               "W2 SPEC2 ...\")", spec, t);
                break;
            }
        } else {
            sp[k++] = t;
        }
    }
    if (!st && (words % 2 != 0 || k == 0))
        st = CLLM_FAIL(CLLM_ERR_ARG, "blend \"%s\": expected pairs of weight and dataset (\"W1 SPEC1 W2 SPEC2 ...\")",
                       spec);
    if (st) {
        free(b);
        free(sp);
        free(ww);
        return st;
    }
    *buf = b;
    *specs = sp;
    *w = ww;
    *n = k;
    return CLLM_OK;
}

cllm_status cllm_loader_open(cllm_loader **out, const cllm_loader_opts *o) {
    *out = NULL;
    if (!o || !o->spec || !*o->spec) return CLLM_FAIL(CLLM_ERR_ARG, "no data spec");
    if (o->seq_len < 2) return CLLM_FAIL(CLLM_ERR_ARG, "seq_len must be at least 2 (got %d)", o->seq_len);
    cllm_loader *l = calloc(1, sizeof *l);
    char *buf = NULL, **specs = NULL;
    double *w = NULL;
    int n = 0;
    cllm_status st = l ? parse_blend(o->spec, &buf, &specs, &w, &n) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (st) goto done;
    l->T = o->seq_len;
    l->vocab = o->vocab_size;
    l->shuffle = o->shuffle;
    l->n_src = 0;
    l->src = calloc(n ? (size_t)n : 1, sizeof *l->src);
    if (!l->src) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (n > 0 && o->pairs) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "\"%s\": preference data cannot be a blend (give one .jsonl file)", o->spec);
        goto done;
    }
    if (n == 0) {
        l->n_src = 1;
        st = open_source(&l->src[0], o->spec, o, o->seed);
        if (!st) l->size = l->src[0].n;
        goto done;
    }
    for (int j = 0; j < n && !st; j++) {
        /* Each dataset of a blend shuffles with its own seed. */
        l->n_src = j + 1;
        st = open_source(&l->src[j], specs[j], o, o->seed + (uint64_t)j * 0x632be59bd9b4e019ull);
        if (st) cllm_fail_context(st, "blend dataset %d (%s)", j + 1, specs[j]);
        else l->size += l->src[j].n;
    }
    if (!st) st = cllm_blend_init(&l->blend, w, n);
done:
    free(buf);
    free(specs);
    free(w);
    if (st) {
        cllm_loader_free(l);
        return st;
    }
    *out = l;
    return CLLM_OK;
}

cllm_status cllm_loader_get(cllm_loader *l, uint64_t g, int32_t *tokens, int32_t *labels, long *n_labels) {
    int j = 0;
    uint64_t k = g, i = 0;
    cllm_status st;
    if (l->blend.n > 0 && (st = cllm_blend_get(&l->blend, g, &j, &k))) return st;
    source *s = &l->src[j];
    if ((st = source_pick(s, l->shuffle, k, &i))) return st;
    return fill_row(s, i, l->T, l->vocab, tokens, labels, n_labels);
}

cllm_status cllm_loader_pair_info(cllm_loader *l, uint64_t g, float *margin, bool *single) {
    *margin = 0;
    if (single) *single = false;
    int j = 0;
    uint64_t k = g, i = 0;
    cllm_status st;
    if (l->blend.n > 0 && (st = cllm_blend_get(&l->blend, g, &j, &k))) return st;
    source *s = &l->src[j];
    if (!s->extra.margin && !s->extra.single) return CLLM_OK;
    if ((st = source_pick(s, l->shuffle, k, &i))) return st;
    if (s->extra.margin) *margin = s->extra.margin[s->seq_begin + i];
    if (s->extra.single && single) *single = s->extra.single[s->seq_begin + i] != 0;
    return CLLM_OK;
}
