/*
 * Weights apart from run state (cllm/weights.h). A cllm_weights keeps a
 * model that owns every weight buffer and never runs; a run over it is a
 * cllm_model whose weight fields point at that model's buffers (borrowed)
 * and whose run-state fields are its own. Every pass reads a model through
 * the same fields whether it owns them or not, so a run computes exactly
 * what its weights' model would. The few calls that would write weights
 * check m->shared and refuse (model_shared_refuse).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/weights.h"
#include "model_impl.h"

struct cllm_weights {
    cllm_model *m;   /* the owner of the buffers; its run state stays empty */
    atomic_int refs; /* the caller's handle (until cllm_weights_free) plus one per run */
    atomic_int runs;
};

cllm_status model_shared_refuse(const char *what) {
    return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: this model is a run over shared weights (cllm_model_from_weights), "
                     "which are read-only; load a copy of its own to change them", what);
}

static void release(cllm_weights *w) {
    if (atomic_fetch_sub(&w->refs, 1) != 1) return;
    cllm_model_free(w->m);
    free(w);
}

void cllm_weights_free(cllm_weights *w) {
    if (w) release(w);
}

/* Frees what a model holds for running: its activations, gradients and
 * operand scratch (the weights keep no run state). */
static void drop_run_state(cllm_model *m) {
    cllm_free(m->acts);
    cllm_free(m->grads);
    free(m->layers);
    m->acts = m->grads = NULL;
    m->layers = NULL;
    m->acts_floats = 0;
    m->act_B = m->act_T = 0;
    m->has_backward = false;
    void *lp = m->lp_params; /* the weights' part of the precision state */
    m->lp_params = NULL;
    model_lp_release(m);
    m->lp_params = lp;
}

cllm_status cllm_weights_from_model(cllm_weights **out, cllm_model **pm) {
    *out = NULL;
    cllm_model *m = *pm;
    if (!m) return CLLM_FAIL(CLLM_ERR_ARG, "weights from no model");
    if (m->shared) return CLLM_FAIL(CLLM_ERR_ARG, "weights from a run over shared weights: use those weights");
    if (m->frozen || m->lora)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "weights from a model with a trainable set or LoRA adapters: merge "
                         "them first (cllm_lora_merge) or drop them (cllm_model_train_all)");
    if (m->hooks.fetch_params || m->hooks.fetch_grads || m->hooks.grads_ready)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "weights from a model with layer hooks (ZeRO-3)");
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "weights from a model whose parameters were dropped");
    /* shared weights keep the file layout: their runs do not share the
     * [out, in] inference layout's flag */
    cllm_status st = model_conv_restore(m);
    if (!st && m->prec != CLLM_PREC_FP32) st = model_lp_refresh(m);
    if (st) return st;
    cllm_weights *w = calloc(1, sizeof *w);
    if (!w) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    drop_run_state(m);
    w->m = m;
    atomic_init(&w->refs, 1);
    atomic_init(&w->runs, 0);
    *pm = NULL;
    *out = w;
    return CLLM_OK;
}

cllm_status cllm_weights_load(cllm_weights **out, const char *dir, const char *format) {
    *out = NULL;
    cllm_model *m = NULL;
    cllm_status st = cllm_model_load_weights(&m, dir, format);
    if (!st) st = cllm_weights_from_model(out, &m);
    cllm_model_free(m);
    return st;
}

const cllm_model *cllm_weights_model(const cllm_weights *w) { return w->m; }

size_t cllm_weights_bytes(const cllm_weights *w) { return cllm_model_held_bytes(w->m); }

size_t cllm_model_held_bytes(const cllm_model *m) {
    size_t params = m->n_params;
    if (m->params_lazy) /* the stored matrices' slots of the flat buffer are never written */
        for (int i = 0; i < m->n_tensors; i++)
            if (model_weights_stored(m, i)) params -= m->tensors[i].numel;
    size_t lp = m->lp_params ? m->n_params * cllm_precision_copy_bytes(m->prec) : 0;
    return params * sizeof(float) + lp + model_weights_store_bytes(m) + cllm_model_quantized_bytes(m);
}

int cllm_weights_n_runs(const cllm_weights *w) { return atomic_load(&((cllm_weights *)(uintptr_t)w)->runs); }

cllm_status cllm_model_from_weights(cllm_model **out, cllm_weights *w) {
    *out = NULL;
    const cllm_model *o = w->m;
    cllm_model *m = calloc(1, sizeof *m);
    if (!m) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    m->groups = calloc((size_t)o->cfg.n_layer + 2, sizeof *m->groups);
    if (!m->groups) {
        free(m);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    for (int g = 0; g < o->cfg.n_layer + 2; g++) {
        m->groups[g].begin = o->groups[g].begin;
        m->groups[g].end = o->groups[g].end;
    }
    /* the weights, borrowed */
    m->cfg = o->cfg;
    m->config_json = o->config_json;
    m->tensors = o->tensors;
    m->n_tensors = o->n_tensors;
    m->lslot = o->lslot;
    memcpy(m->gslot, o->gslot, sizeof m->gslot);
    m->tgroup = o->tgroup;
    m->params = o->params;
    m->n_params = o->n_params;
    m->prec = o->prec;
    m->lp_params = o->lp_params; /* up to date since cllm_weights_from_model: never stale */
    m->ws = o->ws;
    m->params_lazy = o->params_lazy;
    m->qb = o->qb;
    /* the part of a tensor- or expert-parallel model these weights are */
    m->tp_grp = o->tp_grp;
    m->tp_rank = o->tp_rank;
    m->tp_size = o->tp_size;
    m->tp_vocab = o->tp_vocab;
    m->ep_grp = o->ep_grp;
    m->ep_rank = o->ep_rank;
    m->ep_size = o->ep_size;
    m->moe_capacity_factor = o->moe_capacity_factor;
    m->moe_min_capacity = o->moe_min_capacity;
    m->shared = w;
    atomic_fetch_add(&w->refs, 1);
    atomic_fetch_add(&w->runs, 1);
    *out = m;
    return CLLM_OK;
}

const cllm_weights *cllm_model_shared_weights(const cllm_model *m) { return m->shared; }

void model_shared_detach(cllm_model *m) {
    cllm_weights *w = m->shared;
    if (!w) return;
    m->config_json = NULL;
    m->tensors = NULL;
    m->lslot = NULL;
    m->tgroup = NULL;
    m->ws = NULL;
    m->qb = NULL;
    if (!m->own_params) m->params = m->lp_params = NULL;
    m->shared = NULL;
    atomic_fetch_sub(&w->runs, 1);
    release(w);
}
