/*
 * The alignment tasks' set-up in a training run (docs/alignment.md): the
 * objective of task "dpo", "reward" or "ppo" (src/tasks/) with its other
 * models (reference, reward model) and data (DPO's precomputed reference
 * log-probabilities, PPO's rollout source). The loop (engine.c) then runs
 * whichever objective it was given.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/checkpoint.h"
#include "cllm/dist.h"
#include "cllm/loader.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/objective.h"
#include "engine_impl.h"

/* PPO's generation at ZeRO-3: the policy's whole parameters while it samples. */
static cllm_status lend_params(void *ctx, bool on) {
    trainer *tr = ctx;
    return tr->shard ? train_shard_lend_params(tr->shard, on) : CLLM_OK;
}

/* precompute_ref_log_probs: the reference's log-probabilities of every
 * row of the training (and evaluation) data, once, in chunks of 8 pairs. */
static cllm_status dpo_precompute(trainer *tr, cllm_objective *o, cllm_loader *l) {
    const int T = tr->cfg->seq_len, R = 16;
    uint64_t n = l ? cllm_loader_size(l) : 0;
    int32_t *tok = malloc((size_t)R * T * sizeof *tok), *lab = malloc((size_t)R * T * sizeof *lab),
            *tgt = malloc((size_t)R * T * sizeof *tgt);
    cllm_status st = tok && lab && tgt ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (uint64_t g = 0; g < n && !st; g += R) {
        int rows = n - g < (uint64_t)R ? (int)(n - g) : R;
        for (int r = 0; r < rows && !st; r++)
            st = cllm_loader_get(l, g + (uint64_t)r, tok + (size_t)r * T, lab + (size_t)r * T, NULL);
        if (st) break;
        cllm_model_make_targets(tgt, lab, rows, T);
        st = cllm_dpo_precompute(o, tr->m, tok, tgt, rows, T);
    }
    free(tok);
    free(lab);
    free(tgt);
    return st ? cllm_fail_context(st, "precompute_ref_log_probs") : CLLM_OK;
}

/* task "dpo": the DPO objective, its reference model the starting weights
 * (the model folder, not a resumed checkpoint) or dpo.ref_model, loaded
 * whole and run forward only; with LoRA and no dpo.ref_model, the base
 * without the adapters (no second model). */
cllm_status train_open_dpo(trainer *tr, bool piped, bool tensor) {
    cllm_train_config *c = tr->cfg;
    if (piped || tensor)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "task \"dpo\" with %s parallelism: not supported; use data "
                         "parallelism (any ZeRO stage)", piped ? "pipeline" : "tensor");
    const bool base = !c->ref_model_dir && cllm_lora_attached(tr->m);
    const char *dir = c->ref_model_dir ? c->ref_model_dir : c->model_dir;
    cllm_model *ref = NULL;
    if (!c->dpo.reference_free && !base) {
        if (!dir)
            return CLLM_FAIL(CLLM_ERR_ARG, "task \"dpo\": no reference model: \"model\" is not an HF folder; set "
                             "dpo.ref_model (--ref-model) or dpo.reference_free");
        cllm_status st = cllm_model_load(&ref, dir);
        if (st) return cllm_fail_context(st, "reference model %s", dir);
        const cllm_model_config *a = cllm_model_get_config(ref), *b = cllm_model_get_config(tr->m);
        if (a->vocab_size != b->vocab_size) {
            cllm_model_free(ref);
            return CLLM_FAIL(CLLM_ERR_ARG, "reference model %s: vocabulary of %d, the policy's is %d", dir,
                             (int)a->vocab_size, (int)b->vocab_size);
        }
    }
    cllm_objective *o = NULL;
    cllm_status st = cllm_objective_dpo_init(&o, &c->dpo, ref);
    if (st) return st;
    cllm_objective_free(tr->obj);
    tr->obj = o;
    if (c->dpo.precompute_ref_log_probs && !c->dpo.reference_free) {
        if ((st = dpo_precompute(tr, o, tr->train)) || (st = dpo_precompute(tr, o, tr->eval))) return st;
        cllm_dpo_drop_reference(o);
        if (cllm_dist_rank() == 0)
            fprintf(stderr, "cllm train: precompute_ref_log_probs: the reference log-probabilities of %llu rows "
                    "computed, the reference model freed\n", (unsigned long long)(cllm_loader_size(tr->train) +
                    (tr->eval ? cllm_loader_size(tr->eval) : 0)));
    }
    return CLLM_OK;
}

/* task "reward": trl's RewardTrainer objective on a sequence-classification
 * model; a causal LM (the "model" folder, or an init spec) gets a new score
 * head first, a reward model (or a resumed checkpoint of one) is used as
 * it is. */
cllm_status train_open_reward(trainer *tr, bool piped, bool tensor) {
    cllm_train_config *c = tr->cfg;
    if (piped || tensor)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "task \"reward\" with %s parallelism: not supported; use data "
                         "parallelism (any ZeRO stage)", piped ? "pipeline" : "tensor");
    /* with LoRA the model is a reward model already (train_lora_to_reward) */
    cllm_status st = cllm_model_to_reward(&tr->m, c->seed);
    if (st) return cllm_fail_context(st, "task \"reward\"");
    cllm_objective *o = NULL;
    if ((st = cllm_objective_reward_init(&o, &c->reward))) return st;
    cllm_objective_free(tr->obj);
    tr->obj = o;
    return CLLM_OK;
}

/* LoRA with task "reward": the score head goes on before the adapters
 * (open_model), as PEFT's SEQ_CLS adapters sit on
 * AutoModelForSequenceClassification of the base. A quantized base has no
 * fp32 weights to rebuild the model from: it must be a reward model
 * folder. */
cllm_status train_lora_to_reward(trainer *tr) {
    if (cllm_model_get_config(tr->m)->num_labels == 1) return CLLM_OK;
    if (tr->cfg->quant.enabled)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "task \"reward\" with a quantized base (QLoRA) from a causal LM: not "
                         "supported; start from a reward model folder (a *ForSequenceClassification, e.g. what "
                         "cllm train --task reward --steps 1 --lr 0 writes from the causal LM)");
    cllm_status st = cllm_model_to_reward(&tr->m, tr->cfg->seed);
    return st ? cllm_fail_context(st, "task \"reward\"") : CLLM_OK;
}

/* A PEFT adapter folder (adapter_config.json, no config.json) as a side
 * model: its base (base_model_name_or_path) with the adapter merged in, a
 * reward model for a SEQ_CLS adapter (trl's PPO takes a PEFT reward
 * model). */
static cllm_status load_adapter_model(cllm_model **out, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        return cllm_ckpt_load_model(out, dir);
    }
    cllm_lora_config c;
    cllm_lora_config_default(&c);
    if (cllm_lora_config_load(&c, dir) != CLLM_OK) { /* not an adapter folder: the model folder's own message */
        cllm_lora_config_free(&c);
        return cllm_ckpt_load_model(out, dir);
    }
    cllm_status st = c.base_model_name_or_path ? cllm_ckpt_load_model(out, c.base_model_name_or_path)
                     : CLLM_FAIL(CLLM_ERR_ARG, "%s/adapter_config.json: no base_model_name_or_path", dir);
    if (st && c.base_model_name_or_path) st = cllm_fail_context(st, "the adapter's base %s", c.base_model_name_or_path);
    cllm_lora_config_free(&c);
    if (!st) st = cllm_lora_load_model(out, dir, 0);
    if (!st) st = cllm_lora_merge(*out);
    if (st) {
        cllm_model_free(*out);
        *out = NULL;
    }
    return st;
}

/* A model folder (or a PEFT adapter folder: load_adapter_model) for PPO's
 * reward or reference model, checked against the policy's vocabulary. */
static cllm_status load_side_model(trainer *tr, const char *dir, const char *what, cllm_model **out) {
    cllm_status st = load_adapter_model(out, dir);
    if (st) return cllm_fail_context(st, "%s %s", what, dir);
    int v = cllm_model_get_config(*out)->vocab_size, pv = cllm_model_get_config(tr->m)->vocab_size;
    if (v != pv) {
        cllm_model_free(*out);
        *out = NULL;
        return CLLM_FAIL(CLLM_ERR_ARG, "%s %s: vocabulary of %d, the policy's is %d", what, dir, v, pv);
    }
    return CLLM_OK;
}

/* task "ppo": trl's PPOTrainer objective, rollouts from ppo.rollouts or
 * generated from the data's prompts and scored by ppo.reward_model; the
 * reference is ppo.ref_model, else the base without adapters (LoRA), else
 * the starting weights. */
cllm_status train_open_ppo(trainer *tr, bool piped, bool tensor) {
    cllm_train_config *c = tr->cfg;
    if (piped || tensor)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "task \"ppo\" with %s parallelism: not supported; use data "
                         "parallelism", piped ? "pipeline" : "tensor");
    if (c->eval_interval > 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "task \"ppo\": eval_interval: PPO has no evaluation pass; leave it unset");
    long mini = c->train_batch_size / c->dp_size;
    if (c->ppo_mini_batch_size && c->ppo_mini_batch_size != mini)
        return CLLM_FAIL(CLLM_ERR_ARG, "ppo.mini_batch_size: %d, but each rank trains on %ld rollouts per step "
                         "(train_batch_size %ld over %d ranks); set train_batch_size to mini_batch_size x ranks",
                         c->ppo_mini_batch_size, mini, c->train_batch_size, c->dp_size);
    cllm_status st = CLLM_OK;
    cllm_ppo_source *src = NULL;
    cllm_model *ref = NULL, *rm = NULL;
    if (c->ppo_rollouts) {
        st = cllm_ppo_source_file(&src, c->ppo_rollouts, cllm_model_get_config(tr->m)->vocab_size);
    } else if (!c->reward_model_dir) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "task \"ppo\": no reward model: set ppo.reward_model (--reward-model), or "
                       "ppo.rollouts (--rollouts) for fixed rollouts");
    } else if (!(st = load_side_model(tr, c->reward_model_dir, "reward model", &rm))) {
        st = cllm_ppo_source_generate(&src, tr->train, rm, c->seed);
    }
    if (st) return st;
    /* at ZeRO 3 sampling and kl_penalty "full" gather the whole policy */
    if (c->zero.stage == 3) cllm_ppo_source_set_lender(src, lend_params, tr);
    bool lora = cllm_lora_attached(tr->m);
    const char *dir = c->ref_model_dir ? c->ref_model_dir : lora ? NULL : c->model_dir;
    if (dir) st = load_side_model(tr, dir, "reference model", &ref);
    else if (!lora)
        st = CLLM_FAIL(CLLM_ERR_ARG, "task \"ppo\": no reference model: \"model\" is not an HF folder; set "
                       "ppo.ref_model (--ref-model)");
    if (st) {
        cllm_ppo_source_free(src);
        return st;
    }
    cllm_objective *o = NULL;
    if ((st = cllm_objective_ppo_init(&o, &c->ppo, src, ref, (int)c->train_micro_batch_size_per_gpu, (int)mini,
                                      c->seed)))
        return st;
    cllm_objective_free(tr->obj);
    tr->obj = o;
    return CLLM_OK;
}
