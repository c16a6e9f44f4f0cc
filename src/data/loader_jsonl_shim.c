/*
 * TEMPORARY stand-in for the data pipeline's loader (cllm/loader.h), so the
 * trainer can be built and tested before the real loader is merged. It
 * implements cllm_loader_* for pre-tokenized .jsonl specs only, over
 * cllm_dataset; this file is deleted when the real loader lands and nothing
 * else may depend on its internals.
 *
 * Sample g is sample perm_e[g % n] of epoch e = g / n, where perm_e is a
 * Fisher-Yates shuffle seeded by seed * 0x9e3779b97f4a7c15 + e (identity
 * without shuffle). Splits are contiguous document ranges: with weights
 * "a,b,c" the train split is the first round(n*a/(a+b+c)) samples, then valid,
 * then test.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/data.h"
#include "cllm/loader.h"

struct cllm_loader {
    cllm_dataset *d;
    size_t begin, n; /* the selected split */
    int T;
    bool shuffle;
    uint64_t seed;
    size_t *perm;
    uint64_t epoch; /* of perm; UINT64_MAX = none yet */
};

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static cllm_status pick_split(cllm_loader *l, const cllm_loader_opts *o, size_t total) {
    l->begin = 0;
    l->n = total;
    if (!o->split) return CLLM_OK;
    double w[3] = {100, 0, 0};
    if (o->splits) {
        char *end;
        const char *s = o->splits;
        for (int i = 0; i < 3; i++) {
            w[i] = strtod(s, &end);
            if (end == s || w[i] < 0) return CLLM_FAIL(CLLM_ERR_ARG, "bad splits '%s' (expected \"950,30,20\")", o->splits);
            s = end;
            if (*s == ',') s++;
            else if (*s == '\0') {
                for (int k = i + 1; k < 3; k++) w[k] = 0;
                break;
            }
        }
    }
    double sum = w[0] + w[1] + w[2];
    if (!(sum > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "splits '%s' sum to zero", o->splits);
    size_t b1 = (size_t)llround((double)total * w[0] / sum), b2 = (size_t)llround((double)total * (w[0] + w[1]) / sum);
    if (b2 > total) b2 = total;
    int which = strcmp(o->split, "train") == 0 ? 0 : strcmp(o->split, "valid") == 0 ? 1 : strcmp(o->split, "test") == 0 ? 2 : -1;
    if (which < 0) return CLLM_FAIL(CLLM_ERR_ARG, "unknown split '%s' (train, valid, test)", o->split);
    size_t b = which == 0 ? 0 : which == 1 ? b1 : b2, e = which == 0 ? b1 : which == 1 ? b2 : total;
    if (e <= b) return CLLM_FAIL(CLLM_ERR_ARG, "split '%s' of %s is empty (splits %s)", o->split, o->spec, o->splits ? o->splits : "100,0,0");
    l->begin = b;
    l->n = e - b;
    return CLLM_OK;
}

cllm_status cllm_loader_open(cllm_loader **out, const cllm_loader_opts *o) {
    *out = NULL;
    if (!o->spec || !ends_with(o->spec, ".jsonl"))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "'%s': this build reads pre-tokenized .jsonl only", o->spec ? o->spec : "(null)");
    if (o->seq_len < 2) return CLLM_FAIL(CLLM_ERR_ARG, "seq_len must be at least 2");
    cllm_loader *l = calloc(1, sizeof *l);
    if (!l) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = cllm_dataset_load_jsonl(&l->d, o->spec, o->vocab_size);
    if (!st && cllm_dataset_count(l->d) == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no samples", o->spec);
    if (!st) st = pick_split(l, o, cllm_dataset_count(l->d));
    if (!st && !(l->perm = malloc(l->n * sizeof *l->perm))) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (st) {
        cllm_loader_free(l);
        return st;
    }
    l->T = o->seq_len;
    l->shuffle = o->shuffle;
    l->seed = o->seed;
    l->epoch = UINT64_MAX;
    *out = l;
    return CLLM_OK;
}

void cllm_loader_free(cllm_loader *l) {
    if (!l) return;
    cllm_dataset_free(l->d);
    free(l->perm);
    free(l);
}

uint64_t cllm_loader_size(const cllm_loader *l) { return l->n; }

static void make_epoch(cllm_loader *l, uint64_t epoch) {
    for (size_t i = 0; i < l->n; i++) l->perm[i] = i;
    if (l->shuffle) {
        cllm_rng r;
        cllm_rng_seed(&r, l->seed * 0x9e3779b97f4a7c15ull + epoch);
        for (size_t i = l->n - 1; i > 0; i--) {
            size_t j = (size_t)cllm_rng_below(&r, i + 1);
            size_t t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->epoch = epoch;
}

cllm_status cllm_loader_get(cllm_loader *l, uint64_t g, int32_t *tokens, int32_t *labels, long *n_labels) {
    uint64_t epoch = g / l->n;
    if (epoch != l->epoch) make_epoch(l, epoch);
    cllm_dataset_fill_row(l->d, l->begin + l->perm[g % l->n], l->T, 0, tokens, labels);
    long k = 0;
    for (int t = 0; t < l->T; t++) k += labels[t] != -100;
    if (n_labels) *n_labels = k;
    return CLLM_OK;
}
