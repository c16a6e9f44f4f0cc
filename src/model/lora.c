/*
 * LoRA adapters on the linear layers of a model (cllm/lora.h): choosing the
 * layers, the trainable set they make, and their part of the forward and
 * backward passes, which model_linear_forward / _backward (precision.c)
 * call for any linear layer that carries one.
 *
 * With x the layer's input [N, in], d = drop(x) (x itself without dropout),
 * h = d A^T [N, r] and s the scale:
 *   forward   y += s h B^T
 *   backward  dB += s dy^T h        dA += (s dy B)^T d
 *             dx += drop'(s dy B A)
 * h is recomputed in the backward pass rather than kept (N x r floats per
 * layer saved, one small GEMM more), so activation checkpointing needs
 * nothing of its own. Dropout keeps an element with probability 1 - p and
 * scales it by 1 / (1 - p); its mask is a hash of the trainer's key, the
 * layer and the element, the same in the forward pass, its recomputation
 * and the backward pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lora/lora_impl.h"
#include "cllm/kernels.h"
#include "model_impl.h"

struct model_adapter {
    int tensor;          /* the base weight */
    int in, out, r;
    float scale;
    size_t a_off, b_off; /* A [r, in], B [out, r] in the trainable buffer */
    int a_view;          /* trainable view of A (B is a_view + 1) */
};

struct model_lora {
    cllm_lora_config cfg;
    struct model_adapter *ad;
    int n_ad;
    int *of_tensor;      /* [n_tensors] adapter index or -1 */
    uint64_t key;        /* dropout masks */
    bool training;       /* dropout on (set by the training passes) */
    bool disabled;       /* cllm_lora_set_enabled(m, false): the base alone */
};

/* ------------------------------------------------------------ modules */

/* Whether model tensor t is the weight of a linear layer; *lm_head for the
 * output layer. */
static bool linear_weight(const cllm_model *m, int t, bool *lm_head) {
    *lm_head = t == m->gslot[G_HEAD] && t >= 0;
    if (*lm_head) return true;
    static const int slots[] = {L_QKV_W, L_Q_W, L_K_W, L_V_W, L_O_W, L_FC_W, L_UP_W, L_DOWN_W};
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
            if (m->lslot[l][slots[i]] == t) return true;
    return false;
}

/* The module path of tensor t: its name without ".weight" / ".bias". */
static void module_of(const cllm_model *m, int t, char *out, size_t cap) {
    const char *n = m->tensors[t].name, *dot = strrchr(n, '.');
    size_t len = dot ? (size_t)(dot - n) : strlen(n);
    if (len >= cap) len = cap - 1;
    memcpy(out, n, len);
    out[len] = 0;
}

static int find_tensor(const cllm_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return i;
    return -1;
}

/* Which linear weights get adapters; targets that match nothing fail. */
static cllm_status choose(const cllm_model *m, const cllm_lora_config *c, bool *pick) {
    const char *const *names = NULL;
    int n_names = 0;
    if (c->target_kind == CLLM_LORA_TARGET_DEFAULT) {
        names = cllm_lora_default_targets(m->cfg.arch);
        while (names && names[n_names]) n_names++;
    } else if (c->target_kind == CLLM_LORA_TARGET_LIST) {
        names = (const char *const *)c->targets;
        n_names = c->n_targets;
    }
    lora_regex re = {0};
    if (c->target_kind == CLLM_LORA_TARGET_REGEX) {
        cllm_status st = lora_regex_compile(&re, c->target_regex, false);
        if (st) return cllm_fail_context(st, "lora.target_modules");
    }
    bool *hit = calloc((size_t)n_names + 1, sizeof *hit);
    if (!hit) {
        lora_regex_free(&re);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    cllm_status st = CLLM_OK;
    int n_pick = 0;
    char mod[128];
    for (int t = 0; t < m->n_tensors && !st; t++) {
        pick[t] = false;
        size_t ln = strlen(m->tensors[t].name);
        if (ln < 7 || strcmp(m->tensors[t].name + ln - 7, ".weight")) continue;
        module_of(m, t, mod, sizeof mod);
        bool head, lin = linear_weight(m, t, &head), match = false;
        switch (c->target_kind) {
        case CLLM_LORA_TARGET_ALL_LINEAR: match = lin && !head; break;
        case CLLM_LORA_TARGET_REGEX: match = lora_regex_match(&re, mod); break;
        default:
            for (int i = 0; i < n_names; i++)
                if (lora_name_matches(mod, names[i])) {
                    match = true;
                    hit[i] = true;
                }
        }
        if (!match) continue;
        if (c->n_layers_to_transform) {
            int l = lora_module_layer(c, mod);
            bool keep = false;
            for (int i = 0; i < c->n_layers_to_transform && l >= 0; i++) keep |= c->layers_to_transform[i] == l;
            if (!keep) continue;
        }
        if (!lin) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "lora.target_modules: module %s is not a linear layer (LoRA applies to "
                           "linear layers only)", mod);
            break;
        }
        pick[t] = true;
        n_pick++;
    }
    for (int i = 0; i < n_names && !st; i++)
        if (!hit[i])
            st = CLLM_FAIL(CLLM_ERR_ARG, "lora.target_modules: '%s' matches no module of this %s model", names[i],
                           cllm_arch_name(m->cfg.arch));
    if (!st && !n_pick)
        st = CLLM_FAIL(CLLM_ERR_ARG, "lora.target_modules: %s%s%s matches no linear layer of this %s model%s",
                       c->target_kind == CLLM_LORA_TARGET_REGEX ? "the expression '" : "",
                       c->target_kind == CLLM_LORA_TARGET_REGEX ? c->target_regex : "the targets",
                       c->target_kind == CLLM_LORA_TARGET_REGEX ? "'" : "", cllm_arch_name(m->cfg.arch),
                       c->n_layers_to_transform ? " in lora.layers_to_transform" : "");
    free(hit);
    lora_regex_free(&re);
    return st;
}

/* modules_to_save: every tensor of a matching module; each name must match.
 * A reward model's score head trains in full (PEFT's SEQ_CLS adds
 * "classifier" and "score" to modules_to_save; "classifier" matches nothing
 * here). */
static cllm_status choose_saved(const cllm_model *m, const cllm_lora_config *c, bool *save) {
    char mod[128];
    const bool reward = m->cfg.num_labels == 1 && m->gslot[G_SCORE] >= 0;
    if (reward) save[m->gslot[G_SCORE]] = true;
    for (int i = 0; i < c->n_modules_to_save; i++) {
        bool any = false;
        for (int t = 0; t < m->n_tensors; t++) {
            module_of(m, t, mod, sizeof mod);
            if (lora_name_matches(mod, c->modules_to_save[i])) save[t] = any = true;
        }
        if (!any && reward && !strcmp(c->modules_to_save[i], "classifier")) continue;
        if (!any)
            return CLLM_FAIL(CLLM_ERR_ARG, "lora.modules_to_save: '%s' matches no module of this %s model%s",
                             c->modules_to_save[i], cllm_arch_name(m->cfg.arch),
                             m->cfg.tie_embeddings && !strcmp(c->modules_to_save[i], "lm_head")
                                 ? " (its head is tied to the embedding: save the embedding instead)" : "");
    }
    return CLLM_OK;
}

/* ------------------------------------------------------------ attach */

/* A [r, in] uniform(-1/sqrt(in), 1/sqrt(in)): kaiming_uniform(a = sqrt(5))
 * on a fan-in of `in`, nn.Linear's default and PEFT's for lora_A. */
static void init_uniform(float *w, size_t n, int fan_in, cllm_rng *rng) {
    float bound = 1.0f / sqrtf((float)fan_in);
    for (size_t i = 0; i < n; i++) w[i] = (float)(2.0 * cllm_rng_uniform(rng) - 1.0) * bound;
}

void model_lora_free(cllm_model *m) {
    struct model_lora *L = m->lora;
    if (!L) return;
    cllm_lora_config_free(&L->cfg);
    free(L->ad);
    free(L->of_tensor);
    free(L);
    m->lora = NULL;
}

bool cllm_lora_attached(const cllm_model *m) { return m->lora != NULL; }
const cllm_lora_config *cllm_lora_config_of(const cllm_model *m) { return m->lora ? &m->lora->cfg : NULL; }

void cllm_lora_set_dropout_key(cllm_model *m, uint64_t key) {
    if (m->lora) m->lora->key = key;
}

void cllm_lora_set_enabled(cllm_model *m, bool on) {
    if (m->lora) m->lora->disabled = !on;
}

void model_lora_set_training(cllm_model *m, bool on) {
    if (m->lora) m->lora->training = on;
}

cllm_status cllm_lora_attach(cllm_model *m, const cllm_lora_config *c, uint64_t seed) {
    if (m->lora) return CLLM_FAIL(CLLM_ERR_ARG, "the model already carries LoRA adapters");
    if (m->tp_size > 1) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "LoRA on a tensor-parallel part: not supported");
    const bool reward = m->cfg.num_labels == 1;
    if (c->seq_cls && !reward)
        return CLLM_FAIL(CLLM_ERR_ARG, "LoRA task_type \"SEQ_CLS\" (a reward model's adapters) on a causal LM: "
                         "load them onto the reward model (cllm score --adapter, cllm lora merge, cllm train --task "
                         "reward)");
    int nt = m->n_tensors;
    bool *pick = calloc((size_t)nt, sizeof *pick), *save = calloc((size_t)nt, sizeof *save);
    struct model_lora *L = calloc(1, sizeof *L);
    cllm_trainable_spec *spec = calloc(3 * (size_t)nt, sizeof *spec);
    char (*names)[192] = calloc(3 * (size_t)nt, sizeof *names);
    cllm_status st = pick && save && L && spec && names ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) st = cllm_lora_config_copy(&L->cfg, c);
    if (!st && reward) { /* PEFT's SEQ_CLS: the files name the task and the trained score head */
        L->cfg.seq_cls = true;
        st = lora_config_add_saved(&L->cfg, LORA_SCORE_MODULE);
    }
    if (!st) st = choose(m, c, pick);
    if (!st) st = choose_saved(m, c, save);
    /* PPO's value head trains beside the adapters (trl keeps it outside the
     * PEFT model, trainable) */
    if (!st && m->cfg.value_head) save[m->gslot[G_VHEAD_W]] = save[m->gslot[G_VHEAD_B]] = true;
    for (int i = 0; i < c->n_rank_pattern + c->n_alpha_pattern && !st; i++) { /* bad expressions fail here */
        lora_regex re;
        const char *p = i < c->n_rank_pattern ? c->rank_pattern[i].pattern : c->alpha_pattern[i - c->n_rank_pattern].pattern;
        st = lora_regex_compile(&re, p, true);
        if (st) st = cllm_fail_context(st, "lora.%s_pattern", i < c->n_rank_pattern ? "rank" : "alpha");
        else lora_regex_free(&re);
    }
    int n_ad = 0;
    for (int t = 0; t < nt && !st; t++) n_ad += pick[t];
    if (!st && (!(L->ad = calloc((size_t)n_ad, sizeof *L->ad)) || !(L->of_tensor = malloc((size_t)nt * sizeof(int)))))
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int nv = 0;
    char mod[128];
    for (int t = 0; t < nt && !st; t++) {
        L->of_tensor[t] = -1;
        const cllm_tensor_info *ti = &m->tensors[t];
        /* trained copies: modules_to_save, and biases by the bias option */
        bool bias = ti->ndim == 1 && strlen(ti->name) > 5 && !strcmp(ti->name + strlen(ti->name) - 5, ".bias");
        bool copy = save[t] || (bias && c->bias == CLLM_LORA_BIAS_ALL);
        if (bias && c->bias == CLLM_LORA_BIAS_LORA_ONLY) {
            char w[160];
            module_of(m, t, mod, sizeof mod);
            snprintf(w, sizeof w, "%s.weight", mod);
            int wt = find_tensor(m, w);
            copy |= wt >= 0 && pick[wt];
        }
        if (copy) {
            snprintf(names[nv], sizeof names[nv], LORA_PREFIX "%s", ti->name);
            spec[nv] = (cllm_trainable_spec){.name = names[nv], .base = t};
            nv++;
        }
        if (!pick[t]) continue;
        bool conv = m->cfg.arch == CLLM_ARCH_GPT2 && t != m->gslot[G_HEAD]; /* Conv1D: [in, out] */
        struct model_adapter *ad = &L->ad[L->n_ad];
        ad->tensor = t;
        ad->in = (int)(conv ? ti->shape[0] : ti->shape[1]);
        ad->out = (int)(conv ? ti->shape[1] : ti->shape[0]);
        module_of(m, t, mod, sizeof mod);
        double alpha;
        lora_module_rank(c, mod, &ad->r, &alpha, &ad->scale);
        ad->a_view = nv;
        snprintf(names[nv], sizeof names[nv], LORA_PREFIX "%s.lora_A.weight", mod);
        spec[nv] = (cllm_trainable_spec){.name = names[nv], .base = -1, .ndim = 2, .shape = {ad->r, ad->in}};
        nv++;
        snprintf(names[nv], sizeof names[nv], LORA_PREFIX "%s.lora_B.weight", mod);
        spec[nv] = (cllm_trainable_spec){.name = names[nv], .base = -1, .ndim = 2, .shape = {ad->out, ad->r}};
        nv++;
        L->of_tensor[t] = L->n_ad++;
    }
    if (!st) st = cllm_model_set_trainable(m, spec, nv);
    if (!st) {
        cllm_rng rng;
        cllm_rng_seed(&rng, seed);
        for (int i = 0; i < L->n_ad; i++) {
            struct model_adapter *ad = &L->ad[i];
            ad->a_off = m->ttab[ad->a_view].offset;
            ad->b_off = m->ttab[ad->a_view + 1].offset;
            float *A = m->tparams + ad->a_off, *B = m->tparams + ad->b_off;
            size_t na = (size_t)ad->r * ad->in, nb = (size_t)ad->out * ad->r;
            if (c->init == CLLM_LORA_INIT_GAUSSIAN)
                for (size_t k = 0; k < na; k++) A[k] = cllm_rng_normal(&rng) / (float)ad->r;
            else
                init_uniform(A, na, ad->in, &rng);
            if (c->init == CLLM_LORA_INIT_RANDOM) init_uniform(B, nb, ad->r, &rng);
        }
        m->lora = L;
        L = NULL;
    }
    if (L) {
        cllm_lora_config_free(&L->cfg);
        free(L->ad);
        free(L->of_tensor);
        free(L);
    }
    free(pick);
    free(save);
    free(spec);
    free(names);
    return st;
}

cllm_status cllm_lora_count(const cllm_model_config *mc, const cllm_lora_config *c, int *n_adapters,
                            size_t *n_trainable, size_t *buffer_len) {
    cllm_model tmp = {0};
    tmp.cfg = *mc;
    cllm_status st = model_build_layout(&tmp);
    int nt = tmp.n_tensors;
    bool *pick = st ? NULL : calloc((size_t)nt, sizeof *pick), *save = pick ? calloc((size_t)nt, sizeof *save) : NULL;
    if (!st && !save) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) st = choose(&tmp, c, pick);
    if (!st) st = choose_saved(&tmp, c, save);
    size_t n = 0, len = 0;
    int k = 0;
    char mod[128];
#define VIEW(x) (n += (x), len += ((x) + 15) & ~(size_t)15)
    for (int t = 0; t < nt && !st; t++) {
        const cllm_tensor_info *ti = &tmp.tensors[t];
        bool bias = ti->ndim == 1 && strlen(ti->name) > 5 && !strcmp(ti->name + strlen(ti->name) - 5, ".bias");
        if (save[t] || (bias && c->bias == CLLM_LORA_BIAS_ALL)) VIEW(ti->numel);
        if (!pick[t]) continue;
        k++;
        int r;
        double alpha;
        float scale;
        module_of(&tmp, t, mod, sizeof mod);
        lora_module_rank(c, mod, &r, &alpha, &scale);
        VIEW((size_t)r * (size_t)ti->shape[0]);
        VIEW((size_t)r * (size_t)ti->shape[1]);
        if (c->bias == CLLM_LORA_BIAS_LORA_ONLY) {
            char b[160];
            snprintf(b, sizeof b, "%s.bias", mod);
            int bt = find_tensor(&tmp, b);
            if (bt >= 0 && !save[bt]) VIEW(tmp.tensors[bt].numel);
        }
    }
#undef VIEW
    free(pick);
    free(save);
    free(tmp.tensors);
    free(tmp.lslot);
    free(tmp.tgroup);
    free(tmp.groups);
    if (st) return st;
    *n_adapters = k;
    *n_trainable = n;
    if (buffer_len) *buffer_len = len;
    return CLLM_OK;
}

/* ------------------------------------------------------------ passes */

const struct model_adapter *model_lora_find(const cllm_model *m, const float *w) {
    const struct model_lora *L = m->lora;
    int t = L && !L->disabled ? model_tensor_at(m, w) : -1; /* disabled: the base alone (a reference) */
    return t >= 0 && L->of_tensor[t] >= 0 ? &L->ad[L->of_tensor[t]] : NULL;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The dropout mask: element i of the adapter's input is dropped when the
 * hash of (key, layer, i) falls below p * 2^64. */
typedef struct {
    uint64_t seed, thresh;
    float keep;
} drop_mask;

static drop_mask mask_of(const cllm_model *m, const struct model_adapter *ad) {
    double p = m->lora->cfg.lora_dropout;
    return (drop_mask){mix(m->lora->key ^ mix((uint64_t)ad->tensor + 1)), (uint64_t)(p * 18446744073709551616.0),
                       (float)(1.0 / (1.0 - p))};
}

static inline bool dropped_at(const drop_mask *k, size_t i) { return mix(k->seed + i) < k->thresh; }

/* d = drop(x) [N, in], or NULL when no dropout applies (d is x). */
static float *dropped(const cllm_model *m, const struct model_adapter *ad, const float *x, int N) {
    const struct model_lora *L = m->lora;
    if (!(L->cfg.lora_dropout > 0) || !L->training) return NULL;
    size_t n = (size_t)N * ad->in;
    float *d = cllm_alloc(n * sizeof(float), "LoRA dropout");
    if (!d) return NULL;
    const drop_mask k = mask_of(m, ad);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) d[i] = dropped_at(&k, i) ? 0.0f : x[i] * k.keep;
    return d;
}

static bool wants_dropout(const cllm_model *m) { return m->lora->cfg.lora_dropout > 0 && m->lora->training; }

cllm_status model_lora_forward(const cllm_model *m, const struct model_adapter *ad, float *out, const float *inp,
                               int N) {
    const float *A = m->tparams + ad->a_off, *B = m->tparams + ad->b_off;
    float *d = dropped(m, ad, inp, N);
    if (!d && wants_dropout(m)) return CLLM_ERR_NOMEM;
    float *h = cllm_alloc((size_t)N * ad->r * sizeof(float), "LoRA activations");
    cllm_status st = h ? CLLM_OK : CLLM_ERR_NOMEM;
    if (!st && !d && N <= WEIGHTS_SMALL_ROWS) { /* decode: the per-row kernel serving uses too (lora_set.c) */
        model_lora_row rows[WEIGHTS_SMALL_ROWS];
        for (int n = 0; n < N; n++) rows[n] = (model_lora_row){A, B, ad->r, ad->scale};
        model_lora_small_forward(out, inp, rows, N, ad->in, ad->out, h);
        cllm_free(h);
        return CLLM_OK;
    }
    if (!st) st = cllm_matmul(h, d ? d : inp, A, N, ad->r, ad->in, false, true, 1.0f, 0.0f);
    if (!st) st = cllm_matmul(out, h, B, N, ad->out, ad->r, false, true, ad->scale, 1.0f);
    cllm_free(h);
    cllm_free(d);
    return st;
}

cllm_status model_lora_backward(const cllm_model *m, const struct model_adapter *ad, float *dinp, const float *dout,
                                const float *inp, int N) {
    const float *A = m->tparams + ad->a_off, *B = m->tparams + ad->b_off;
    float *dA = m->grads ? m->grads + ad->a_off : NULL, *dB = m->grads ? m->grads + ad->b_off : NULL;
    float *d = dropped(m, ad, inp, N);
    if (!d && wants_dropout(m)) return CLLM_ERR_NOMEM;
    const float *x = d ? d : inp;
    size_t nr = (size_t)N * ad->r;
    float *h = cllm_alloc(2 * nr * sizeof(float), "LoRA activations"), *dh = h ? h + nr : NULL;
    cllm_status st = h ? CLLM_OK : CLLM_ERR_NOMEM;
    if (!st && dB) st = cllm_matmul(h, x, A, N, ad->r, ad->in, false, true, 1.0f, 0.0f);
    if (!st && dB) st = cllm_matmul(dB, dout, h, ad->out, ad->r, N, true, false, ad->scale, 1.0f);
    if (!st) st = cllm_matmul(dh, dout, B, N, ad->r, ad->out, false, false, ad->scale, 0.0f);
    if (!st && dA) st = cllm_matmul(dA, dh, x, ad->r, ad->in, N, true, false, 1.0f, 1.0f);
    if (!st && dinp) {
        if (!d) {
            st = cllm_matmul(dinp, dh, A, N, ad->in, ad->r, false, false, 1.0f, 1.0f);
        } else { /* through the mask: dx = dd * keep where kept, 0 where dropped */
            float *dd = cllm_alloc((size_t)N * ad->in * sizeof(float), "LoRA dropout");
            st = dd ? cllm_matmul(dd, dh, A, N, ad->in, ad->r, false, false, 1.0f, 0.0f) : CLLM_ERR_NOMEM;
            const drop_mask k = mask_of(m, ad);
            size_t n = (size_t)N * ad->in;
            if (!st) {
#pragma omp parallel for schedule(static)
                for (size_t i = 0; i < n; i++)
                    if (!dropped_at(&k, i)) dinp[i] += dd[i] * k.keep;
            }
            cllm_free(dd);
        }
    }
    cllm_free(h);
    cllm_free(d);
    return st;
}

/* ------------------------------------------------------------ merge */

cllm_status cllm_lora_merge(cllm_model *m) {
    struct model_lora *L = m->lora;
    if (!L) return CLLM_FAIL(CLLM_ERR_ARG, "merge: the model carries no LoRA adapters");
    if (m->shared) return model_shared_refuse("merging adapters into the base");
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "merge: the model's parameters are not in memory");
    cllm_status rs = model_conv_restore(m); /* the deltas are added in the file layout */
    if (rs) return rs;
    model_trainable_sync(m); /* modules_to_save and trained biases */
    for (int i = 0; i < L->n_ad; i++) {
        const struct model_adapter *ad = &L->ad[i];
        float *W = m->params + m->tensors[ad->tensor].offset;
        const float *A = m->tparams + ad->a_off, *B = m->tparams + ad->b_off;
        bool conv = m->cfg.arch == CLLM_ARCH_GPT2 && ad->tensor != m->gslot[G_HEAD];
        /* nn.Linear W[out, in] += s B A; Conv1D W[in, out] += s (B A)^T = s A^T B^T */
        cllm_status st = conv ? cllm_matmul(W, A, B, ad->in, ad->out, ad->r, true, true, ad->scale, 1.0f)
                              : cllm_matmul(W, B, A, ad->out, ad->in, ad->r, false, false, ad->scale, 1.0f);
        if (st) return cllm_fail_context(st, "merge of %s", m->tensors[ad->tensor].name);
    }
    model_lora_free(m);
    cllm_model_train_all(m);
    atomic_store(&m->lp_stale, true);
    return CLLM_OK;
}
