/*
 * Sequence classification (reward models): HF's *ForSequenceClassification
 * with one label. The score head `score.weight` [1, C] is an ordinary
 * tensor of the layout (slot G_SCORE, the last parameter group), so the
 * optimizer, ZeRO and checkpoints treat it like any other; run.c applies it
 * (cllm_token_io.score_pos). Here: HF's choice of the scored token, and the
 * conversion of a causal LM into a reward model; the value head of PPO's
 * policy (v_head.summary, applied in run.c through cllm_token_io.values).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cllm/json.h"
#include "model_impl.h"

int cllm_model_score_position(const cllm_model *m, const int32_t *row, int len) {
    const int pad = m->cfg.pad_token_id;
    if (len <= 0) return 0;
    if (pad < 0) return len - 1;
    for (int t = len - 1; t >= 0; t--)
        if (row[t] != pad) return t;
    return 0; /* HF's argmax over an all-padding row */
}

static const char *const seq_cls_names[CLLM_ARCH_COUNT] = {
    [CLLM_ARCH_GPT2] = "GPT2ForSequenceClassification",
    [CLLM_ARCH_LLAMA] = "LlamaForSequenceClassification",
    [CLLM_ARCH_BLOOM] = "BloomForSequenceClassification",
};

/* The reward model's config.json: the causal LM's, renamed, with one label. */
static json_t *reward_config(const cllm_model *m) {
    json_t *j = json_deep_copy(m->config_json);
    if (!j) return NULL;
    json_t *arch = json_array(), *id2label = json_object(), *label2id = json_object();
    int bad = !arch || !id2label || !label2id;
    bad |= json_array_append_new(arch, json_string(seq_cls_names[m->cfg.arch]));
    bad |= json_object_set_new(id2label, "0", json_string("LABEL_0"));
    bad |= json_object_set_new(label2id, "LABEL_0", json_integer(0));
    bad |= json_object_set_new(j, "architectures", arch);
    bad |= json_object_set_new(j, "id2label", id2label);
    bad |= json_object_set_new(j, "label2id", label2id);
    json_object_del(j, "num_labels");
    if (m->cfg.pad_token_id < 0 && m->cfg.eos_token_id >= 0)
        bad |= json_object_set_new(j, "pad_token_id", json_integer(m->cfg.eos_token_id));
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

cllm_status cllm_model_to_reward(cllm_model **pm, uint64_t seed) {
    cllm_model *m = *pm;
    if (m->cfg.num_labels == 1) return CLLM_OK;
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "the model holds no parameters");
    if (m->tp_size > 1) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a reward model from a tensor-parallel part");
    json_t *conf = reward_config(m);
    if (!conf) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_model *r = NULL;
    cllm_status st = model_from_config(&r, conf, "reward model config");
    json_decref(conf);
    if (st) return st;
    for (int i = 0; i < r->n_tensors; i++) {
        const cllm_tensor_info *t = &r->tensors[i];
        float *dst = r->params + t->offset;
        if (i == r->gslot[G_SCORE]) {
            double std = 0.02;
            cllm_json_get_num_opt(r->config_json, "initializer_range", &std, "config");
            cllm_rng rng;
            cllm_rng_seed(&rng, seed);
            for (size_t k = 0; k < t->numel; k++) dst[k] = (float)(std * cllm_rng_normal(&rng));
            continue;
        }
        const cllm_tensor_info *s = cllm_model_find_tensor(m, t->name);
        if (!s || s->numel != t->numel) {
            cllm_model_free(r);
            return CLLM_FAIL(CLLM_ERR_INTERNAL, "reward model: no tensor %s in the causal LM", t->name);
        }
        memcpy(dst, m->params + s->offset, t->numel * sizeof(float));
    }
    st = cllm_model_set_precision(r, cllm_model_precision(m));
    if (st) {
        cllm_model_free(r);
        return st;
    }
    cllm_model_free(m);
    *pm = r;
    return CLLM_OK;
}

cllm_status cllm_model_add_value_head(cllm_model **pm, uint64_t seed) {
    cllm_model *m = *pm;
    if (m->cfg.value_head) return CLLM_OK;
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "the model holds no parameters");
    if (m->tp_size > 1) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a value head on a tensor-parallel part");
    cllm_model *r = NULL;
    cllm_status st = model_from_config_vh(&r, m->config_json, "config", true, true);
    if (st) return st;
    /* torch's nn.Linear(C, 1) default: weight and bias uniform in +-1/sqrt(C) */
    const double bound = 1.0 / sqrt((double)m->cfg.n_embd);
    cllm_rng rng;
    cllm_rng_seed(&rng, seed);
    for (int i = 0; i < r->n_tensors && !st; i++) {
        const cllm_tensor_info *t = &r->tensors[i];
        float *dst = r->params + t->offset;
        if (i == r->gslot[G_VHEAD_W] || i == r->gslot[G_VHEAD_B]) {
            for (size_t k = 0; k < t->numel; k++) dst[k] = (float)(bound * (2.0 * cllm_rng_uniform(&rng) - 1.0));
            continue;
        }
        const cllm_tensor_info *s = cllm_model_find_tensor(m, t->name);
        if (!s || s->numel != t->numel)
            st = CLLM_FAIL(CLLM_ERR_INTERNAL, "value head: no tensor %s in the model", t->name);
        else
            memcpy(dst, m->params + s->offset, t->numel * sizeof(float));
    }
    if (!st) st = cllm_model_set_precision(r, cllm_model_precision(m));
    if (st) {
        cllm_model_free(r);
        return st;
    }
    cllm_model_free(m);
    *pm = r;
    return CLLM_OK;
}
