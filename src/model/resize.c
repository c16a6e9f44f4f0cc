/*
 * Vocabulary resizing: a new model with vocab_size rows in the token
 * embedding and the untied head, every other tensor copied unchanged. New
 * rows start at the mean of the old rows, the usual choice when adding
 * tokens to a trained model: a new token then begins with the logit of an
 * "average" token instead of a random direction that could dominate the
 * softmax. Not here: shrinking, or initialising new rows from the embeddings
 * of the pieces a new token replaces.
 */
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

/* Copies the V old rows of a [V, C] tensor into a [NV, C] one and fills rows
 * V..NV-1 with the mean of the old rows plus optional noise. */
static cllm_status grow_rows(float *dst, const float *src, int V, int NV, int C, float noise_std, cllm_rng *rng) {
    memcpy(dst, src, (size_t)V * C * sizeof(float));
    double *mean = calloc((size_t)C, sizeof *mean);
    if (!mean) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) mean[c] += src[(size_t)v * C + c];
    for (int c = 0; c < C; c++) mean[c] /= V;
    for (int v = V; v < NV; v++)
        for (int c = 0; c < C; c++) {
            float x = (float)mean[c];
            if (noise_std > 0) x += noise_std * cllm_rng_normal(rng);
            dst[(size_t)v * C + c] = x;
        }
    free(mean);
    return CLLM_OK;
}

cllm_status cllm_model_resize_vocab(cllm_model **pm, int new_vocab, float noise_std, uint64_t seed) {
    if (!pm || !*pm) return CLLM_FAIL(CLLM_ERR_ARG, "no model");
    cllm_model *m = *pm;
    int V = m->cfg.vocab_size, C = m->cfg.n_embd;
    if (new_vocab < V)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "cannot shrink the vocabulary from %d to %d rows: ids %d..%d may be in use "
                         "(use a tokenizer with at least %d tokens)",
                         V, new_vocab, new_vocab, V - 1, V);
    if (new_vocab > (1 << 24)) return CLLM_FAIL(CLLM_ERR_ARG, "vocabulary of %d is too large (limit %d)", new_vocab, 1 << 24);
    if (!(noise_std >= 0)) return CLLM_FAIL(CLLM_ERR_ARG, "noise_std must be >= 0");
    if (new_vocab == V) return CLLM_OK;
    json_t *cfg = json_deep_copy(m->config_json);
    if (!cfg || json_object_set_new(cfg, "vocab_size", json_integer(new_vocab)) != 0) {
        json_decref(cfg);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    cllm_model *nm = NULL;
    cllm_status st = model_from_config(&nm, cfg, "config.json");
    json_decref(cfg);
    if (st) return st;
    cllm_rng rng;
    cllm_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_tensors && !st; i++) {
        const cllm_tensor_info *t = &m->tensors[i], *u = &nm->tensors[i];
        if (strcmp(t->name, u->name) != 0) {
            st = CLLM_FAIL(CLLM_ERR_INTERNAL, "layout changed with the vocabulary: '%s' vs '%s'", t->name, u->name);
            break;
        }
        const float *src = m->params + t->offset;
        float *dst = nm->params + u->offset;
        if (i == m->gslot[G_WTE] || i == m->gslot[G_HEAD])
            st = grow_rows(dst, src, V, new_vocab, C, noise_std, &rng);
        else
            memcpy(dst, src, t->numel * sizeof(float));
    }
    if (st) {
        cllm_model_free(nm);
        return st;
    }
    nm->recompute = m->recompute; /* a setting, not a buffer: it carries over */
    if ((st = cllm_model_set_precision(nm, m->prec))) {
        cllm_model_free(nm);
        return st;
    }
    cllm_model_free(m);
    *pm = nm;
    return CLLM_OK;
}
