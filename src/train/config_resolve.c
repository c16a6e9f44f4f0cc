/*
 * Resolving a parsed training config: the batch-size triple against the
 * data-parallel size (DeepSpeed's rules), the run length, "auto" scheduler
 * values, and the resolved config written back as JSON (--print-config) and
 * hashed (checkpoints record which config produced them).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/train.h"

static bool sched_is_auto(const cllm_train_config *c, const char *key) {
    json_t *s = json_object_get(c->json, "scheduler");
    json_t *p = s ? json_object_get(s, "params") : NULL;
    json_t *v = p ? json_object_get(p, key) : NULL;
    return v && json_is_string(v) && strcmp(json_string_value(v), "auto") == 0;
}

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
    if (sched_is_auto(c, "warmup_max_lr")) s->warmup_max_lr = c->optim.lr;
    if (sched_is_auto(c, "cycle_max_lr")) s->cycle_max_lr = c->optim.lr;
    if (sched_is_auto(c, "warmup_num_steps")) s->warmup_num_steps = 0;
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
        json_object_set_new(sp, "warmup_max_lr", json_real(s->warmup_max_lr));
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
        json_object_set_new(sp, "cycle_max_lr", json_real(s->cycle_max_lr));
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
    json_t *z = c->zero_optimization ? json_deep_copy(c->zero_optimization) : json_object();
    json_object_set_new(z, "stage", json_integer(c->zero_stage));
    json_object_set_new(j, "zero_optimization", z);
    json_object_set_new(j, "steps_per_print", json_integer(c->steps_per_print));
    json_object_set_new(j, "wall_clock_breakdown", json_boolean(c->wall_clock_breakdown));
    json_object_set_new(j, "use_grad_ckpt", json_boolean(c->use_grad_ckpt));
    if (c->model_topo) json_object_set_new(j, "model_topo", json_deep_copy(c->model_topo));
    json_object_set_new(j, "model", c->model_init ? json_deep_copy(c->model_init) : str_or_null(c->model_dir));
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
    json_object_set_new(j, "dp_size", json_integer(c->dp_size));
    return j;
}

static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
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
    json_decref(j);
    return h;
}
