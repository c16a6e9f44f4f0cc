/*
 * Resolving a parsed training config: the batch-size triple against the
 * data-parallel size (DeepSpeed's rules), the run length, "auto" values
 * (cfg->auto_keys: the one place that gives them a value), and the resolved
 * config written back as JSON from the typed fields (--print-config) and
 * hashed (checkpoints record which config produced them).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/train.h"

static cllm_status resolve_batch(cllm_train_config *c) {
    long tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu, ga = c->gradient_accumulation_steps;
    long W = c->dp_size;
    if (W < 1) return CLLM_FAIL(CLLM_ERR_ARG, "data-parallel size must be at least 1");
    if (tb && mb && ga) {
        if (tb != mb * ga * W)
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "inconsistent batch sizes: train_batch_size (%ld) must equal "
                             "train_micro_batch_size_per_gpu (%ld) * gradient_accumulation_steps (%ld) * "
                             "data-parallel size (%ld) = %ld; set only two of the three",
                             tb, mb, ga, W, mb * ga * W);
    } else if (tb && mb) {
        if (tb % (mb * W))
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "inconsistent batch sizes: train_batch_size (%ld) is not divisible by "
                             "train_micro_batch_size_per_gpu (%ld) * data-parallel size (%ld) = %ld",
                             tb, mb, W, mb * W);
        ga = tb / (mb * W);
    } else if (tb && ga) {
        if (tb % (ga * W))
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "inconsistent batch sizes: train_batch_size (%ld) is not divisible by "
                             "gradient_accumulation_steps (%ld) * data-parallel size (%ld) = %ld",
                             tb, ga, W, ga * W);
        mb = tb / (ga * W);
    } else if (mb && ga) {
        tb = mb * ga * W;
    } else if (tb) {
        if (tb % W)
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "inconsistent batch sizes: train_batch_size (%ld) is not divisible by the "
                             "data-parallel size (%ld)",
                             tb, W);
        ga = 1;
        mb = tb / W;
    } else if (mb) {
        ga = 1;
        tb = mb * W;
    } else {
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "no batch size: set train_batch_size or train_micro_batch_size_per_gpu (or --batch-size)");
    }
    c->train_batch_size = tb;
    c->train_micro_batch_size_per_gpu = mb;
    c->gradient_accumulation_steps = ga;
    return CLLM_OK;
}

cllm_status cllm_train_config_resolve(cllm_train_config *c, uint64_t n_samples) {
    cllm_status st = resolve_batch(c);
    if (st) return st;
    if (c->train_iters <= 0) {
        if (c->epochs > 0 && n_samples > 0) {
            double steps = ceil(c->epochs * (double)n_samples / (double)c->train_batch_size);
            if (!(steps <= 9.2e18)) /* beyond a long (also catches inf) */
                return CLLM_FAIL(CLLM_ERR_ARG,
                                 "epochs = %g over %llu samples at batch %ld is %g steps: too many (lower epochs)",
                                 c->epochs, (unsigned long long)n_samples, c->train_batch_size, steps);
            c->train_iters = steps < 1 ? 1 : (long)steps;
        } else if (c->epochs > 0) {
            /* the length is known once the data is open (the engine resolves
             * again then) */
            return CLLM_OK;
        } else {
            return CLLM_FAIL(CLLM_ERR_ARG, "no run length: set train_iters (or --steps) or epochs");
        }
    }
    cllm_sched_params *s = &c->sched;
    if (s->total_num_steps <= 0) s->total_num_steps = c->train_iters;
    /* "auto" values (c->auto_keys). An "auto" schedule peak needs nothing
     * here: it is the optimizer's lr (sched.peak_is_base_lr). The batch
     * sizes count as absent (resolve_batch), total_num_steps as absent (the
     * run's steps, above), the zero_optimization sizes keep DeepSpeed's
     * defaults, which the parser stored. */
    if (c->auto_keys & CLLM_AUTO_WARMUP_NUM_STEPS) s->warmup_num_steps = 0;
    if ((st = cllm_sched_check(s))) return cllm_fail_context(st, "scheduler");
    if (c->seq_len < 2) return CLLM_FAIL(CLLM_ERR_ARG, "seq_len must be at least 2 (got %d)", c->seq_len);
    return CLLM_OK;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static const char *optim_ds_name(const cllm_train_config *c) {
    switch (c->optim.type) {
    case CLLM_OPT_SGD: return "SGD";
    case CLLM_OPT_LION: return "Lion";
    case CLLM_OPT_ADAM: return "Adam";
    default: return "AdamW";
    }
}

static json_t *offload_to_json(const cllm_offload_config *o) {
    static const char *const devices[] = {"none", "cpu", "nvme"};
    json_t *j = json_pack("{sssIsI}", "device", devices[o->device], "buffer_count", (json_int_t)o->buffer_count,
                          "buffer_size", (json_int_t)o->buffer_size);
    if (o->nvme_path) json_object_set_new(j, "nvme_path", json_string(o->nvme_path));
    return j;
}

static json_t *zero_to_json(const cllm_zero_config *z) {
    json_t *j = json_object();
    json_object_set_new(j, "stage", json_integer(z->stage));
    json_object_set_new(j, "reduce_bucket_size", json_integer((json_int_t)z->reduce_bucket_size));
    json_object_set_new(j, "allgather_bucket_size", json_integer((json_int_t)z->allgather_bucket_size));
    json_object_set_new(j, "overlap_comm", json_boolean(z->overlap_comm));
    json_object_set_new(j, "stage3_param_persistence_threshold", json_real(z->stage3_param_persistence_threshold));
    json_object_set_new(j, "stage3_prefetch_bucket_size", json_real(z->stage3_prefetch_bucket_size));
    json_object_set_new(j, "stage3_max_live_parameters", json_real(z->stage3_max_live_parameters));
    json_object_set_new(j, "offload_optimizer", offload_to_json(&z->offload_optimizer));
    json_object_set_new(j, "offload_param", offload_to_json(&z->offload_param));
    return j;
}

static json_t *topo_to_json(const cllm_model_topo *t) {
    json_t *j = json_object();
    if (t->layout.n_axes > 0) {
        json_t *axis = json_array(), *dims = json_array();
        for (int i = 0; i < t->layout.n_axes; i++) {
            json_array_append_new(axis, json_string(cllm_axis_name(t->layout.axis[i])));
            json_array_append_new(dims, t->layout.dims[i] ? json_integer(t->layout.dims[i]) : json_string("auto"));
        }
        json_object_set_new(j, "process_topology", json_pack("{soso}", "axis", axis, "dims", dims));
    }
    if (t->parts.mode == CLLM_PARTS_COUNTS) {
        json_t *parts = json_array();
        for (int i = 0; i < t->parts.n_counts; i++) json_array_append_new(parts, json_integer(t->parts.counts[i]));
        json_object_set_new(j, "parts", parts);
    } else {
        json_object_set_new(j, "parts", json_string(t->parts.mode == CLLM_PARTS_UNIFORM ? "uniform" : "parameters"));
    }
    json_object_set_new(j, "schedule", json_string(cllm_pipe_schedule_name(t->schedule)));
    return j;
}

static json_t *model_init_to_json(const cllm_model_init_spec *m) {
    json_t *j = json_pack("{ssss}", "arch", cllm_arch_name(m->arch), "preset", m->preset);
    if (m->set) json_object_set_new(j, "set", json_deep_copy(m->set));
    if (m->has_seed) json_object_set_new(j, "seed", json_integer((json_int_t)m->seed));
    return j;
}

json_t *cllm_train_config_to_json(const cllm_train_config *c) {
    json_t *j = json_object();
    json_object_set_new(j, "train_batch_size", json_integer(c->train_batch_size));
    json_object_set_new(j, "train_micro_batch_size_per_gpu", json_integer(c->train_micro_batch_size_per_gpu));
    json_object_set_new(j, "gradient_accumulation_steps", json_integer(c->gradient_accumulation_steps));
    json_object_set_new(j, "gradient_clipping", json_real(c->gradient_clipping));
    json_t *op = json_object(), *opp = json_object();
    json_object_set_new(op, "type", json_string(optim_ds_name(c)));
    json_object_set_new(opp, "lr", json_real(c->optim.lr));
    json_object_set_new(opp, "weight_decay", json_real(c->optim.weight_decay));
    if (c->optim.type == CLLM_OPT_SGD) {
        json_object_set_new(opp, "momentum", json_real(c->optim.momentum));
        json_object_set_new(opp, "dampening", json_real(c->optim.dampening));
        json_object_set_new(opp, "nesterov", json_boolean(c->optim.nesterov));
    } else {
        json_object_set_new(opp, "betas", json_pack("[ff]", c->optim.beta1, c->optim.beta2));
        if (c->optim.type != CLLM_OPT_LION) {
            json_object_set_new(opp, "eps", json_real(c->optim.eps));
            json_object_set_new(opp, "adam_w_mode", json_boolean(c->optim.type == CLLM_OPT_ADAMW));
        }
    }
    json_object_set_new(op, "params", opp);
    json_object_set_new(j, "optimizer", op);
    const cllm_sched_params *s = &c->sched;
    json_t *sc = json_object(), *sp = json_object();
    json_object_set_new(sc, "type", json_string(cllm_sched_name(s->type)));
    switch (s->type) {
    case CLLM_SCHED_WARMUP_LR:
    case CLLM_SCHED_WARMUP_DECAY_LR:
        json_object_set_new(sp, "warmup_min_lr", json_real(s->warmup_min_lr));
        json_object_set_new(sp, "warmup_max_lr", json_real(s->peak_is_base_lr ? c->optim.lr : s->warmup_max_lr));
        json_object_set_new(sp, "warmup_num_steps", json_integer(s->warmup_num_steps));
        json_object_set_new(sp, "warmup_type", json_string(s->warmup_linear ? "linear" : "log"));
        if (s->type == CLLM_SCHED_WARMUP_DECAY_LR)
            json_object_set_new(sp, "total_num_steps", json_integer(s->total_num_steps));
        break;
    case CLLM_SCHED_WARMUP_COSINE_LR:
        json_object_set_new(sp, "total_num_steps", json_integer(s->total_num_steps));
        json_object_set_new(sp, "warmup_min_ratio", json_real(s->warmup_min_ratio));
        json_object_set_new(sp, "cos_min_ratio", json_real(s->cos_min_ratio));
        json_object_set_new(sp, "warmup_num_steps", json_integer(s->warmup_num_steps));
        json_object_set_new(sp, "warmup_type", json_string(s->warmup_linear ? "linear" : "log"));
        break;
    case CLLM_SCHED_ONE_CYCLE:
        json_object_set_new(sp, "cycle_min_lr", json_real(s->cycle_min_lr));
        json_object_set_new(sp, "cycle_max_lr", json_real(s->peak_is_base_lr ? c->optim.lr : s->cycle_max_lr));
        json_object_set_new(sp, "decay_lr_rate", json_real(s->decay_lr_rate));
        json_object_set_new(sp, "cycle_first_step_size", json_integer(s->cycle_first_step_size));
        json_object_set_new(sp, "cycle_second_step_size",
                            json_integer(s->cycle_second_step_size < 0 ? s->cycle_first_step_size
                                                                       : s->cycle_second_step_size));
        json_object_set_new(sp, "cycle_first_stair_count", json_integer(s->cycle_first_stair_count));
        json_object_set_new(sp, "cycle_second_stair_count",
                            json_integer(s->cycle_second_stair_count < 0 ? s->cycle_first_stair_count
                                                                         : s->cycle_second_stair_count));
        json_object_set_new(sp, "decay_step_size", json_integer(s->decay_step_size));
        json_object_set_new(sp, "cycle_momentum", json_boolean(s->cycle_momentum));
        json_object_set_new(sp, "cycle_min_mom", json_real(s->cycle_min_mom));
        json_object_set_new(sp, "cycle_max_mom", json_real(s->cycle_max_mom));
        json_object_set_new(sp, "decay_mom_rate", json_real(s->decay_mom_rate));
        break;
    case CLLM_SCHED_LINEAR:
    case CLLM_SCHED_COSINE:
        json_object_set_new(sp, "warmup_num_steps", json_integer(s->warmup_num_steps));
        json_object_set_new(sp, "total_num_steps", json_integer(s->total_num_steps));
        break;
    default: break;
    }
    json_object_set_new(sc, "params", sp);
    json_object_set_new(j, "scheduler", sc);
    json_t *fp16 = json_object();
    json_object_set_new(fp16, "enabled", json_boolean(c->fp16_enabled));
    json_object_set_new(fp16, "loss_scale", json_real(c->fp16_loss_scale));
    json_object_set_new(fp16, "initial_scale_power", json_integer(c->fp16_initial_scale_power));
    json_object_set_new(fp16, "loss_scale_window", json_integer(c->fp16_loss_scale_window));
    json_object_set_new(fp16, "hysteresis", json_integer(c->fp16_hysteresis));
    json_object_set_new(fp16, "min_loss_scale", json_real(c->fp16_min_loss_scale));
    json_object_set_new(fp16, "consecutive_hysteresis", json_boolean(c->fp16_consecutive_hysteresis));
    json_object_set_new(j, "fp16", fp16);
    json_object_set_new(j, "bf16", json_pack("{sb}", "enabled", c->bf16_enabled));
    json_object_set_new(j, "communication_data_type",
                        json_string(c->comm_dtype == CLLM_BF16 ? "bf16" : c->comm_dtype == CLLM_F16 ? "fp16" : "fp32"));
    json_object_set_new(j, "zero_optimization", zero_to_json(&c->zero));
    json_object_set_new(j, "steps_per_print", json_integer(c->steps_per_print));
    json_object_set_new(j, "wall_clock_breakdown", json_boolean(c->wall_clock_breakdown));
    json_object_set_new(j, "use_grad_ckpt", json_boolean(c->use_grad_ckpt));
    if (c->sequence_parallel) json_object_set_new(j, "sequence_parallel", json_true());
    if (c->model_topo.given) json_object_set_new(j, "model_topo", topo_to_json(&c->model_topo));
    if (c->save_expert_layout == CLLM_EXPERTS_FUSED) json_object_set_new(j, "save_expert_layout", json_string("fused"));
    if (c->moe.given)
        json_object_set_new(j, "moe", json_pack("{sisfsfsisb}", "expert_parallel_size", c->moe.expert_parallel_size,
                                                "capacity_factor", c->moe.capacity_factor, "eval_capacity_factor",
                                                c->moe.eval_capacity_factor, "min_capacity", c->moe.min_capacity,
                                                "drop_tokens", c->moe.drop_tokens));
    json_object_set_new(j, "model", c->has_model_init ? model_init_to_json(&c->model_init) : str_or_null(c->model_dir));
    json_t *d = json_object();
    json_object_set_new(d, "train", str_or_null(c->data_train));
    json_object_set_new(d, "eval", str_or_null(c->data_eval));
    json_object_set_new(d, "tokenizer", str_or_null(c->tokenizer));
    json_object_set_new(d, "seq_len", json_integer(c->seq_len));
    json_object_set_new(d, "splits", str_or_null(c->splits));
    json_object_set_new(d, "skip_bad", json_integer(c->skip_bad));
    json_object_set_new(j, "data", d);
    json_object_set_new(j, "train_iters", json_integer(c->train_iters));
    json_object_set_new(j, "epochs", json_real(c->epochs));
    json_object_set_new(j, "eval_interval", json_integer(c->eval_interval));
    json_object_set_new(j, "eval_iters", json_integer(c->eval_iters));
    json_object_set_new(j, "save_interval", json_integer(c->save_interval));
    json_object_set_new(j, "save_total_limit", json_integer(c->save_total_limit));
    json_object_set_new(j, "output_dir", str_or_null(c->output_dir));
    json_object_set_new(j, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(j, "shuffle", json_boolean(c->shuffle));
    static const char *const modes[] = {"auto", "progress", "plain", "quiet"};
    json_object_set_new(j, "log", json_string(modes[c->log]));
    json_t *wds = json_array();
    if (c->decay_skip_bias) json_array_append_new(wds, json_string("bias"));
    if (c->decay_skip_norm) json_array_append_new(wds, json_string("norm"));
    json_object_set_new(j, "weight_decay_skip", wds);
    json_object_set_new(j, "max_consecutive_skips", json_integer(c->max_consecutive_skips));
    json_object_set_new(j, "peak_gflops", json_real(c->peak_gflops));
    json_object_set_new(j, "max_shard_size", json_integer((json_int_t)c->max_shard_bytes));
    json_object_set_new(j, "async_save", json_boolean(c->async_save));
    json_object_set_new(j, "save_final_checkpoint", json_boolean(c->save_final_checkpoint));
    json_object_set_new(j, "heartbeat_timeout", json_real(c->heartbeat_timeout));
    json_object_set_new(j, "dp_size", json_integer(c->dp_size));
    json_object_set_new(j, "task", json_string(c->task ? c->task : "lm"));
    if (c->task && strcmp(c->task, "dpo") == 0)
        json_object_set_new(j, "dpo", json_pack("{sfsssfsbss?sb}", "beta", c->dpo.beta, "loss_type",
                                                cllm_dpo_loss_name(c->dpo.loss_type), "label_smoothing",
                                                c->dpo.label_smoothing, "reference_free", c->dpo.reference_free,
                                                "ref_model", c->ref_model_dir, "precompute_ref_log_probs",
                                                c->dpo.precompute_ref_log_probs));
    if (c->lora.enabled) json_object_set_new(j, "lora", cllm_lora_config_to_json(&c->lora));
    if (c->adapter_dir) json_object_set_new(j, "adapter", json_string(c->adapter_dir));
    if (c->n_freeze) {
        json_t *f = json_array();
        for (int i = 0; i < c->n_freeze; i++) json_array_append_new(f, json_string(c->freeze[i]));
        json_object_set_new(j, c->freeze_except ? "unfrozen_parameters" : "freeze", f);
    }
    if (c->quant.enabled) {
        json_t *q = json_pack("{sbsbsssbsssf}", "load_in_8bit", c->quant.load_in_8bit, "load_in_4bit",
                              c->quant.load_in_4bit, "bnb_4bit_quant_type", cllm_bnb_type_name(c->quant.quant_type),
                              "bnb_4bit_use_double_quant", c->quant.double_quant, "bnb_4bit_compute_dtype",
                              cllm_bnb_compute_name(c->quant.compute), "llm_int8_threshold", c->quant.int8_threshold);
        json_t *skip = c->quant.n_skip_modules ? json_array() : json_null();
        for (int i = 0; i < c->quant.n_skip_modules; i++)
            json_array_append_new(skip, json_string(c->quant.skip_modules[i]));
        json_object_set_new(q, "llm_int8_skip_modules", skip);
        json_object_set_new(j, "quantization", q);
    }
    if (c->task && strcmp(c->task, "reward") == 0)
        json_object_set_new(j, "reward", json_pack("{sf}", "center_rewards_coefficient",
                                                   c->reward.center_rewards_coefficient));
    if (c->task && strcmp(c->task, "ppo") == 0) {
        const cllm_ppo_params *p = &c->ppo;
        json_t *g = json_pack("{sisfsisf}", "max_new_tokens", p->max_new_tokens, "temperature", p->temperature,
                              "top_k", p->top_k, "top_p", p->top_p);
        json_object_set_new(j, "ppo", json_pack("{sfsbsfsfsfsfsfsfsfsisisbsfss?ss?ss?so}", "init_kl_coef",
                                                p->init_kl_coef, "adap_kl_ctrl", p->adap_kl_ctrl, "target", p->target,
                                                "horizon", p->horizon, "gamma", p->gamma, "lam", p->lam, "cliprange",
                                                p->cliprange, "cliprange_value", p->cliprange_value, "vf_coef",
                                                p->vf_coef, "ppo_epochs", p->ppo_epochs, "batch_size", p->batch_size,
                                                "whiten_rewards", p->whiten_rewards, "ratio_threshold",
                                                p->ratio_threshold, "reward_model", c->reward_model_dir, "ref_model",
                                                c->ref_model_dir, "rollouts", c->ppo_rollouts, "generation_kwargs", g));
        static const char *const pens[] = {"kl", "abs", "mse", "full"};
        json_t *o = json_object_get(j, "ppo");
        json_object_set_new(o, "kl_penalty", json_string(pens[p->kl_penalty]));
        json_object_set_new(o, "use_score_scaling", json_boolean(p->use_score_scaling));
        json_object_set_new(o, "use_score_norm", json_boolean(p->use_score_norm));
        json_object_set_new(o, "score_clip", p->score_clip > 0 ? json_real(p->score_clip) : json_null());
    }
    return j;
}

static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* h extended by a config section's name and its sorted compact JSON; an
 * absent section leaves h as it is (hashes of runs without it unchanged). */
static uint64_t hash_section(uint64_t h, const char *name, const json_t *v) {
    if (!v) return h;
    char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    h = fnv1a(fnv1a(h, name), s ? s : "");
    free(s);
    return h;
}

/* hash_section of v less its keys `drop` (NULL-terminated). */
static uint64_t hash_section_without(uint64_t h, const char *name, const json_t *v, const char *const *drop) {
    if (!v) return h;
    json_t *m = json_deep_copy(v);
    for (int i = 0; m && drop[i]; i++) json_object_del(m, drop[i]);
    h = hash_section(h, name, m);
    json_decref(m);
    return h;
}

uint64_t cllm_train_config_hash(const cllm_train_config *c) {
    /* Only what changes the math of a step; run length, intervals, logging
     * and paths may change between a run and its resumption. */
    json_t *j = cllm_train_config_to_json(c);
    static const char *const keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps", "gradient_clipping", "optimizer",
                                       "scheduler", "seed", "shuffle", "weight_decay_skip", NULL};
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; keys[i]; i++) {
        char *s = json_dumps(json_object_get(j, keys[i]), JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        h = fnv1a(fnv1a(h, keys[i]), s ? s : "");
        free(s);
    }
    json_t *d = json_object_get(j, "data");
    char *s = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
    h = fnv1a(h, s ? s : "");
    free(s);
    /* the objective, when not language modelling (older hashes unchanged) */
    h = hash_section(h, "dpo", json_object_get(j, "dpo"));
    /* adapters (their dropout changes the math; the rest the buffer) */
    h = hash_section(h, "lora", json_object_get(j, "lora"));
    /* frozen tensors (the trainable buffer a checkpoint holds) */
    h = hash_section(h, "freeze", json_object_get(j, "freeze"));
    h = hash_section(h, "unfrozen_parameters", json_object_get(j, "unfrozen_parameters"));
    /* mixture of experts: the capacity changes the math, the expert-parallel
     * size does not (a checkpoint resumes on another without a warning) */
    static const char *const moe_sizes[] = {"expert_parallel_size", NULL};
    h = hash_section_without(h, "moe", json_object_get(j, "moe"), moe_sizes);
    /* a quantized base (its format changes every forward) */
    h = hash_section(h, "quantization", json_object_get(j, "quantization"));
    h = hash_section(h, "reward", json_object_get(j, "reward"));
    /* PPO's settings; its models' and rollouts' paths may move */
    static const char *const ppo_paths[] = {"reward_model", "ref_model", "rollouts", NULL};
    h = hash_section_without(h, "ppo", json_object_get(j, "ppo"), ppo_paths);
    json_decref(j);
    return h;
}
