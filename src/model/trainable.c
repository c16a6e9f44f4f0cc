/*
 * The trainable set: which parameters train, and the one flat buffer that
 * holds them, their gradients and (in the optimizer) their state.
 *
 * By default every tensor trains and the trainable buffer is the flat
 * parameter buffer itself: the same pointer, length and offsets, so full
 * training is untouched by this file. cllm_model_set_trainable declares a
 * subset (the rest frozen): the trainable buffer becomes a compact
 * allocation of its own, laid out as the list of views it was given
 * (64-byte aligned, back to back). A view either copies a model tensor
 * (a trained bias, a head kept trainable beside adapters: its values are
 * copied in at declaration and back into the flat parameters after every
 * update, cllm_model_params_updated, so the forward pass reads them where
 * it reads every weight) or is an extra tensor that exists only there
 * (LoRA's A and B, a new score head). A set that lists every model tensor
 * first, in model order, keeps them in place instead: the flat parameter
 * buffer grows by the extra tensors and is the trainable buffer (full
 * training plus a new head costs no copy). Frozen tensors get no gradient: the
 * backward pass finds no gradient view for them (model_grad returns NULL)
 * and computes only what flows through them to earlier layers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

void model_trainable_free(cllm_model *m) {
    if (!m->tshared) cllm_free(m->tparams); /* else it is m->params */
    free(m->ttab);
    free(m->tbase);
    free(m->goff);
    m->tparams = NULL;
    m->ttab = NULL;
    m->tbase = NULL;
    m->goff = NULL;
    m->n_ttab = 0;
    m->tlen = 0;
    m->frozen = false;
    m->tcopies = false;
    m->tshared = false;
}

cllm_status cllm_model_set_trainable(cllm_model *m, const cllm_trainable_spec *spec, int n) {
    if (n < 0 || (n > 0 && !spec)) return CLLM_FAIL(CLLM_ERR_ARG, "trainable set: %d views", n);
    if (m->hooks.fetch_grads || m->hooks.fetch_params)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a frozen subset of a model with layer hooks (ZeRO-3 or per-layer "
                         "reduction): use zero_optimization.stage 0-2");
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "trainable set of a model without its parameters");
    if (m->lora) return CLLM_FAIL(CLLM_ERR_ARG, "the model carries LoRA adapters: their views are its trainable set");
    for (int i = 0; i < n && m->shared; i++)
        if (spec[i].base >= 0) return model_shared_refuse("training a model tensor (only extra tensors train over them)");
    cllm_tensor_info *tab = calloc(n > 0 ? (size_t)n : 1, sizeof *tab);
    int *base = calloc(n > 0 ? (size_t)n : 1, sizeof *base);
    size_t *goff = malloc((size_t)m->n_tensors * sizeof *goff);
    float *tp = NULL;
    cllm_status st = tab && base && goff ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    /* every model tensor first, in order: in place (offsets of the flat buffer, extras after it) */
    bool whole = n >= m->n_tensors;
    for (int i = 0; i < m->n_tensors && whole; i++) whole = spec[i].base == i;
    size_t off = 0;
    bool copies = false;
    for (int t = 0; t < m->n_tensors && !st; t++) goff[t] = SIZE_MAX;
    for (int i = 0; i < n && !st; i++) {
        const cllm_trainable_spec *s = &spec[i];
        cllm_tensor_info *ti = &tab[i];
        base[i] = s->base;
        if (s->base >= m->n_tensors || s->base < -1) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "trainable view %d: model tensor %d of %d", i, s->base, m->n_tensors);
            break;
        }
        if (!s->name || strlen(s->name) >= sizeof ti->name) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "trainable view %d: name missing or longer than %zu characters", i,
                           sizeof ti->name - 1);
            break;
        }
        snprintf(ti->name, sizeof ti->name, "%s", s->name);
        if (s->base >= 0 && model_qbase_get(m, s->base)) {
            st = CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s is held quantized (a QLoRA base) and cannot train: adapt it "
                           "with LoRA, or keep it in fp32 with quantization.llm_int8_skip_modules",
                           m->tensors[s->base].name);
            break;
        }
        if (s->base >= 0) {
            const cllm_tensor_info *b = &m->tensors[s->base];
            ti->ndim = b->ndim;
            ti->shape[0] = b->shape[0];
            ti->shape[1] = b->shape[1];
            ti->numel = b->numel;
            ti->no_decay = b->no_decay;
            if (goff[s->base] != SIZE_MAX) {
                st = CLLM_FAIL(CLLM_ERR_ARG, "trainable set: %s listed twice", b->name);
                break;
            }
            if (whole) off = b->offset;
            goff[s->base] = off;
            copies = !whole;
        } else {
            if (s->ndim < 1 || s->ndim > 2 || s->shape[0] <= 0 || (s->ndim == 2 && s->shape[1] <= 0)) {
                st = CLLM_FAIL(CLLM_ERR_ARG, "trainable view %s: bad shape", s->name);
                break;
            }
            ti->ndim = s->ndim;
            ti->shape[0] = s->shape[0];
            ti->shape[1] = s->ndim == 2 ? s->shape[1] : 0;
            ti->numel = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
            ti->no_decay = s->no_decay;
        }
        for (int j = 0; j < i && !st; j++)
            if (!strcmp(tab[j].name, ti->name)) st = CLLM_FAIL(CLLM_ERR_ARG, "trainable set: %s listed twice", ti->name);
        ti->offset = off;
        off += (ti->numel + 15) & ~(size_t)15;
        if (whole && i + 1 == m->n_tensors) off = m->n_params; /* the flat buffer's gaps and end */
    }
    if (!st && !(tp = cllm_calloc(off ? off : 16, sizeof(float), "trainable parameters"))) st = CLLM_ERR_NOMEM;
    if (st) {
        free(tab);
        free(base);
        free(goff);
        return st;
    }
    if (whole) {
        memcpy(tp, m->params, m->n_params * sizeof(float));
    } else {
        for (int i = 0; i < n; i++)
            if (base[i] >= 0) memcpy(tp + tab[i].offset, m->params + m->tensors[base[i]].offset, tab[i].numel * sizeof(float));
    }
    if (m->tshared) { /* the old set's buffer is the parameters: keep them, as a buffer of their own */
        float *p = cllm_alloc(m->n_params * sizeof(float), "model parameters");
        if (!p) {
            cllm_free(tp);
            free(tab);
            free(base);
            free(goff);
            return CLLM_ERR_NOMEM;
        }
        memcpy(p, m->params, m->n_params * sizeof(float));
        m->params = p;
    }
    model_trainable_free(m);
    if (whole) {
        cllm_free(m->params);
        m->params = tp;
        atomic_store(&m->lp_stale, true);
    }
    cllm_free(m->grads); /* the next prepare allocates gradients of the new length */
    m->grads = NULL;
    m->frozen = true;
    m->tparams = tp;
    m->tlen = off;
    m->ttab = tab;
    m->tbase = base;
    m->n_ttab = n;
    m->goff = goff;
    m->tcopies = copies;
    m->tshared = whole;
    return CLLM_OK;
}

void cllm_model_train_all(cllm_model *m) {
    if (!m->frozen) return;
    model_lora_free(m); /* adapters live in the trainable buffer: they go with it */
    model_trainable_free(m); /* an in-place set leaves params as they are (extras unused at its end) */
    cllm_free(m->grads);
    m->grads = NULL;
}

bool cllm_model_has_trainable_set(const cllm_model *m) { return m->frozen; }

int cllm_model_n_trainable(const cllm_model *m) { return m->frozen ? m->n_ttab : m->n_tensors; }

const cllm_tensor_info *cllm_model_trainable(const cllm_model *m, int i) {
    if (i < 0 || i >= cllm_model_n_trainable(m)) return NULL;
    return m->frozen ? &m->ttab[i] : &m->tensors[i];
}

int cllm_model_trainable_base(const cllm_model *m, int i) {
    if (i < 0 || i >= cllm_model_n_trainable(m)) return -1;
    return m->frozen ? m->tbase[i] : i;
}

int cllm_model_find_trainable(const cllm_model *m, const char *name) {
    for (int i = 0; i < cllm_model_n_trainable(m); i++)
        if (!strcmp(cllm_model_trainable(m, i)->name, name)) return i;
    return -1;
}

size_t cllm_model_trainable_len(const cllm_model *m) { return m->frozen ? m->tlen : m->n_params; }

size_t cllm_model_trainable_numel(const cllm_model *m) {
    if (!m->frozen) return cllm_model_n_params(m);
    size_t n = 0;
    for (int i = 0; i < m->n_ttab; i++) n += m->ttab[i].numel;
    return n;
}

float *cllm_model_trainable_params(cllm_model *m) { return m->frozen ? m->tparams : cllm_model_params(m); }

/* After an update: the trained copies of model tensors go back to where
 * the forward pass reads them. Only they can have changed among the
 * model's own parameters, so the low-precision copy is stale only then. */
void model_trainable_sync(cllm_model *m) {
    if (!m->frozen || !m->tcopies || !m->params) return; /* in place: nothing to copy */
    for (int i = 0; i < m->n_ttab; i++)
        if (m->tbase[i] >= 0)
            memcpy(m->params + m->tensors[m->tbase[i]].offset, m->tparams + m->ttab[i].offset,
                   m->ttab[i].numel * sizeof(float));
}
