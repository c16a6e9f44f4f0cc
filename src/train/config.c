/*
 * Parsing a training config: DeepSpeed's keys with DeepSpeed's defaults and
 * cllm's own keys (see cllm/train.h and docs/training.md). Every key is
 * looked up by name in a table per object level, so an unknown key is
 * reported by its dotted path ("optimizer.params.lrr"). DeepSpeed keys that
 * have no meaning for a CPU fp32 run are accepted and listed at info level.
 * This is the one place that reads the config's JSON: every key becomes a
 * typed field of cllm_train_config (model_topo's two blocks through the
 * topology module's readers, cllm/topo.h), and a wrong type or value fails
 * with "FILE: full.key.path: what was expected, got VALUE".
 * The string "auto" (HF Trainer's placeholder) counts as "not given" for
 * every key; keys where it means more are recorded in cfg->auto_keys (or
 * sched.peak_is_base_lr) and given their value by cllm_train_config_resolve.
 * Not here: batch-size resolution and JSON output (config_resolve.c).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/pipe.h"
#include "cllm/train.h"

/* ---------------------------------------------------------------- keys */

static const char *const top_keys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "fp16", "bf16", "zero_optimization", "steps_per_print", "wall_clock_breakdown",
    "model_topo", "use_grad_ckpt", "activation_checkpointing", "communication_data_type", "sequence_parallel",
    /* cllm */
    "model", "data", "train_iters", "epochs", "eval_interval", "eval_iters", "save_interval", "save_total_limit",
    "output_dir", "seed", "log", "weight_decay_skip", "max_consecutive_skips", "shuffle", "peak_gflops",
    "max_shard_size", "async_save", "save_final_checkpoint", "task", "dpo", "reward", "ppo", "heartbeat_timeout", "lora",
    "adapter", "moe", "save_expert_layout", "quantization", "freeze", "unfrozen_parameters", NULL};

/* DeepSpeed keys accepted without effect on a single-process CPU fp32 run. */
static const char *const top_ignored[] = {
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "amp",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "elasticity", "aio",
    "checkpoint", "data_types", "pipeline", "dump_state", "memory_breakdown", "compression_training",
    "data_efficiency", "curriculum_learning", "autotuning", "sparse_attention", "disable_allgather",
    "seq_parallel_communication_data_type", "torch_autocast", NULL};

static bool in_list(const char *const *list, const char *k) {
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], k) == 0) return true;
    return false;
}

/* Reports keys of obj that are in neither list. */
static cllm_status check_keys(const json_t *obj, const char *const *known, const char *const *ignored,
                              const char *where, const char *path, bool strict) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (in_list(known, k)) continue;
        if (in_list(ignored, k)) {
            cllm_log(CLLM_LOG_INFO, "%s: %s%s%s: accepted, no effect in cllm", path, where, *where ? "." : "", k);
            continue;
        }
        if (strict)
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: unknown key '%s%s%s' (remove it, or drop --strict to only warn)", path,
                             where, *where ? "." : "", k);
        cllm_log(CLLM_LOG_WARN, "%s: unknown key '%s%s%s' ignored", path, where, *where ? "." : "", k);
    }
    return CLLM_OK;
}

/* ------------------------------------------------------------- getters */

static bool is_auto(const json_t *v) { return json_is_string(v) && strcmp(json_string_value(v), "auto") == 0; }

/* The value as JSON text for a message ("got 5", "got \"disk\""), cut at
 * 40 characters. */
typedef struct {
    char s[48];
} shown;

static shown show(const json_t *v) {
    shown r = {{0}};
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return r;
    if (strlen(s) > 40) {
        memcpy(r.s, s, 37);
        memcpy(r.s + 37, "...", 4);
    } else {
        strcpy(r.s, s);
    }
    free(s);
    return r;
}

/* Values are looked up as obj[key]; `where` is the dotted path of obj ("" at
 * the top) and `path` the config file: messages read "PATH: WHERE.KEY: ...". */
#define KEYFMT "%s: %s%s%s"
#define KEYARGS(path, where, key) path, where, *where ? "." : "", key

static cllm_status get_long(const json_t *obj, const char *key, long *out, long min, const char *where,
                            const char *path) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || is_auto(v)) return CLLM_OK;
    double x;
    if (json_is_integer(v)) {
        x = (double)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        x = json_real_value(v); /* 1024.0 or 1e3; the range is checked before any conversion */
    } else {
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected an integer, got %s", KEYARGS(path, where, key), show(v).s);
    }
    if (x < (double)min || x > 9.2e18)
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": %.0f is out of range (minimum %ld)", KEYARGS(path, where, key), x, min);
    *out = (long)x;
    return CLLM_OK;
}

static cllm_status get_int(const json_t *obj, const char *key, int *out, long min, const char *where,
                           const char *path) {
    long x = *out;
    cllm_status st = get_long(obj, key, &x, min, where, path);
    if (st) return st;
    if (x > 2147483647L) return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": %ld is too large", KEYARGS(path, where, key), x);
    *out = (int)x;
    return CLLM_OK;
}

static cllm_status get_num(const json_t *obj, const char *key, double *out, double min, const char *where,
                           const char *path) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || is_auto(v)) return CLLM_OK;
    if (!json_is_number(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a number, got %s", KEYARGS(path, where, key), show(v).s);
    double x = json_number_value(v);
    if (!(x >= min))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": %g is out of range (minimum %g)", KEYARGS(path, where, key), x, min);
    *out = x;
    return CLLM_OK;
}

static cllm_status get_bool(const json_t *obj, const char *key, bool *out, const char *where, const char *path) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || is_auto(v)) return CLLM_OK;
    if (!json_is_boolean(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected true or false, got %s", KEYARGS(path, where, key), show(v).s);
    *out = json_is_true(v);
    return CLLM_OK;
}

static cllm_status get_str(const json_t *obj, const char *key, const char **out, const char *where,
                           const char *path) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_string(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a string, got %s", KEYARGS(path, where, key), show(v).s);
    *out = json_string_value(v);
    return CLLM_OK;
}

/* Sets `bit` in c->auto_keys when obj[key] is "auto". */
static void note_auto(cllm_train_config *c, const json_t *obj, const char *key, unsigned bit) {
    if (obj && is_auto(json_object_get(obj, key))) c->auto_keys |= bit;
}

static cllm_status get_obj(const json_t *obj, const char *key, json_t **out, const char *where, const char *path) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return CLLM_OK;
    if (!json_is_object(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected an object, got %s", KEYARGS(path, where, key), show(v).s);
    *out = v;
    return CLLM_OK;
}

#define TRY(x)                        \
    do {                              \
        cllm_status try_st_ = (x);    \
        if (try_st_) return try_st_;  \
    } while (0)

/* ----------------------------------------------------------- optimizer */

static cllm_status parse_optimizer(cllm_train_config *c, const json_t *o, const char *path, bool strict) {
    static const char *const keys[] = {"type", "params", NULL};
    TRY(check_keys(o, keys, NULL, "optimizer", path, strict));
    const char *type = NULL;
    TRY(get_str(o, "type", &type, "optimizer", path));
    if (!type) return CLLM_FAIL(CLLM_ERR_ARG, "%s: optimizer.type: missing (Adam, AdamW, Lion or SGD)", path);
    cllm_opt_type t = cllm_opt_from_name(type);
    if (t == CLLM_OPT_COUNT)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: optimizer.type: unknown optimizer '%s' (Adam, AdamW, Lion or SGD)", path,
                         type);
    c->optimizer_name = type;
    /* DeepSpeed's defaults (FusedAdam/CPUAdam, FusedLion, torch SGD): weight
     * decay 0 for all; Lion betas (0.9, 0.999). */
    cllm_optim_params p = cllm_optim_defaults(t);
    p.weight_decay = 0.0;
    if (t == CLLM_OPT_LION) {
        p.lr = 1e-3;
        p.beta2 = 0.999;
    }
    c->adam_w_mode = true;
    json_t *params = NULL;
    TRY(get_obj(o, "params", &params, "optimizer", path));
    if (params) {
        static const char *const adam_keys[] = {"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                                                "bias_correction", "amsgrad", NULL};
        static const char *const adam_ign[] = {"torch_adam", "fused", "foreach", "capturable", "maximize",
                                               "set_grad_none", NULL};
        static const char *const lion_keys[] = {"lr", "betas", "weight_decay", NULL};
        static const char *const lion_ign[] = {"use_triton", "set_grad_none", NULL};
        static const char *const sgd_keys[] = {"lr", "momentum", "dampening", "weight_decay", "nesterov", NULL};
        static const char *const sgd_ign[] = {"maximize", "foreach", "differentiable", NULL};
        const char *const *known = t == CLLM_OPT_SGD ? sgd_keys : t == CLLM_OPT_LION ? lion_keys : adam_keys;
        const char *const *ign = t == CLLM_OPT_SGD ? sgd_ign : t == CLLM_OPT_LION ? lion_ign : adam_ign;
        TRY(check_keys(params, known, ign, "optimizer.params", path, strict));
        const char *w = "optimizer.params";
        TRY(get_num(params, "lr", &p.lr, 0.0, w, path));
        TRY(get_num(params, "weight_decay", &p.weight_decay, 0.0, w, path));
        if (t != CLLM_OPT_SGD) {
            json_t *b = json_object_get(params, "betas");
            if (b && !is_auto(b)) {
                if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) ||
                    !json_is_number(json_array_get(b, 1)))
                    return CLLM_FAIL(CLLM_ERR_ARG, "%s: optimizer.params.betas: expected [beta1, beta2]", path);
                p.beta1 = json_number_value(json_array_get(b, 0));
                p.beta2 = json_number_value(json_array_get(b, 1));
                if (!(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1))
                    return CLLM_FAIL(CLLM_ERR_ARG, "%s: optimizer.params.betas: each must be in [0, 1)", path);
            }
        }
        if (t == CLLM_OPT_ADAM || t == CLLM_OPT_ADAMW) {
            TRY(get_num(params, "eps", &p.eps, 0.0, w, path));
            if (t == CLLM_OPT_ADAM) TRY(get_bool(params, "adam_w_mode", &c->adam_w_mode, w, path));
            bool bias_correction = true, amsgrad = false;
            TRY(get_bool(params, "bias_correction", &bias_correction, w, path));
            TRY(get_bool(params, "amsgrad", &amsgrad, w, path));
            if (!bias_correction || amsgrad)
                return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                                 "%s: optimizer.params: bias_correction=false and amsgrad=true are not supported", path);
        }
        if (t == CLLM_OPT_SGD) {
            TRY(get_num(params, "momentum", &p.momentum, 0.0, w, path));
            TRY(get_num(params, "dampening", &p.dampening, 0.0, w, path));
            TRY(get_bool(params, "nesterov", &p.nesterov, w, path));
            if (p.nesterov && (p.momentum <= 0 || p.dampening != 0))
                return CLLM_FAIL(CLLM_ERR_ARG, "%s: optimizer.params: nesterov needs momentum > 0 and dampening 0", path);
        }
    }
    /* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false. */
    if (t == CLLM_OPT_ADAM && c->adam_w_mode) t = CLLM_OPT_ADAMW;
    if (t == CLLM_OPT_ADAMW && !c->adam_w_mode) t = CLLM_OPT_ADAM;
    p.type = t;
    c->optim = p;
    return CLLM_OK;
}

/* ----------------------------------------------------------- scheduler */

static cllm_status parse_scheduler(cllm_train_config *c, const json_t *o, const char *path, bool strict) {
    static const char *const keys[] = {"type", "params", NULL};
    TRY(check_keys(o, keys, NULL, "scheduler", path, strict));
    const char *type = NULL;
    TRY(get_str(o, "type", &type, "scheduler", path));
    cllm_sched_type t = type ? cllm_sched_from_name(type) : CLLM_SCHED_CONSTANT;
    if (t == CLLM_SCHED_COUNT)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "%s: scheduler.type: unknown scheduler '%s' (WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                         "OneCycle, constant, linear, cosine)",
                         path, type);
    cllm_sched_params s = cllm_sched_defaults(t);
    json_t *p = NULL;
    TRY(get_obj(o, "params", &p, "scheduler", path));
    if (p) {
        static const char *const warm_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                                "total_num_steps", NULL};
        static const char *const cos_keys[] = {"total_num_steps", "warmup_min_ratio", "cos_min_ratio",
                                               "warmup_num_steps", "warmup_type", NULL};
        static const char *const cyc_keys[] = {
            "cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
            "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
            "cycle_min_mom", "cycle_max_mom", "decay_mom_rate", NULL};
        static const char *const hf_keys[] = {"warmup_num_steps", "total_num_steps", NULL};
        static const char *const common_ign[] = {"last_batch_iteration", NULL};
        const char *const *known = t == CLLM_SCHED_WARMUP_COSINE_LR ? cos_keys
                                   : t == CLLM_SCHED_ONE_CYCLE      ? cyc_keys
                                   : t == CLLM_SCHED_WARMUP_LR || t == CLLM_SCHED_WARMUP_DECAY_LR ? warm_keys
                                                                                                 : hf_keys;
        TRY(check_keys(p, known, common_ign, "scheduler.params", path, strict));
        if (t == CLLM_SCHED_WARMUP_LR && json_object_get(p, "total_num_steps"))
            cllm_log(CLLM_LOG_WARN, "%s: scheduler.params.total_num_steps has no effect for WarmupLR", path);
        const char *w = "scheduler.params";
        TRY(get_num(p, "warmup_min_lr", &s.warmup_min_lr, 0.0, w, path));
        TRY(get_num(p, "warmup_max_lr", &s.warmup_max_lr, 0.0, w, path));
        TRY(get_long(p, "warmup_num_steps", &s.warmup_num_steps, 0, w, path));
        TRY(get_long(p, "total_num_steps", &s.total_num_steps, 0, w, path));
        const char *wt = NULL;
        TRY(get_str(p, "warmup_type", &wt, w, path));
        if (wt) {
            if (strcmp(wt, "linear") == 0)
                s.warmup_linear = true;
            else if (strcmp(wt, "log") == 0)
                s.warmup_linear = false;
            else
                return CLLM_FAIL(CLLM_ERR_ARG, "%s: scheduler.params.warmup_type: '%s' (expected \"log\" or \"linear\")",
                                 path, wt);
        }
        TRY(get_num(p, "warmup_min_ratio", &s.warmup_min_ratio, 0.0, w, path));
        TRY(get_num(p, "cos_min_ratio", &s.cos_min_ratio, 0.0, w, path));
        TRY(get_num(p, "cycle_min_lr", &s.cycle_min_lr, 0.0, w, path));
        TRY(get_num(p, "cycle_max_lr", &s.cycle_max_lr, 0.0, w, path));
        TRY(get_num(p, "decay_lr_rate", &s.decay_lr_rate, 0.0, w, path));
        TRY(get_long(p, "cycle_first_step_size", &s.cycle_first_step_size, 1, w, path));
        TRY(get_long(p, "cycle_second_step_size", &s.cycle_second_step_size, 1, w, path));
        TRY(get_long(p, "cycle_first_stair_count", &s.cycle_first_stair_count, 0, w, path));
        TRY(get_long(p, "cycle_second_stair_count", &s.cycle_second_stair_count, 0, w, path));
        TRY(get_long(p, "decay_step_size", &s.decay_step_size, 0, w, path));
        TRY(get_bool(p, "cycle_momentum", &s.cycle_momentum, w, path));
        TRY(get_num(p, "cycle_min_mom", &s.cycle_min_mom, 0.0, w, path));
        TRY(get_num(p, "cycle_max_mom", &s.cycle_max_mom, 0.0, w, path));
        TRY(get_num(p, "decay_mom_rate", &s.decay_mom_rate, 0.0, w, path));
        /* an "auto" peak is the optimizer's lr itself, not a copy of it */
        const char *peak = t == CLLM_SCHED_ONE_CYCLE ? "cycle_max_lr" : "warmup_max_lr";
        s.peak_is_base_lr = (t == CLLM_SCHED_WARMUP_LR || t == CLLM_SCHED_WARMUP_DECAY_LR || t == CLLM_SCHED_ONE_CYCLE) &&
                            is_auto(json_object_get(p, peak));
        note_auto(c, p, "warmup_num_steps", CLLM_AUTO_WARMUP_NUM_STEPS);
        note_auto(c, p, "total_num_steps", CLLM_AUTO_TOTAL_NUM_STEPS);
    }
    c->sched = s;
    return CLLM_OK;
}

/* ------------------------------------------------- precision and ZeRO */

static cllm_status parse_precision(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *fp16 = NULL, *bf16 = NULL;
    TRY(get_obj(j, "fp16", &fp16, "", path));
    TRY(get_obj(j, "bf16", &bf16, "", path));
    if (fp16) {
        static const char *const k[] = {"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                                        "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                        "min_loss_scale", "fp16_master_weights_and_grads", NULL};
        TRY(check_keys(fp16, k, NULL, "fp16", path, strict));
        TRY(get_bool(fp16, "enabled", &c->fp16_enabled, "fp16", path));
        TRY(get_num(fp16, "loss_scale", &c->fp16_loss_scale, 0.0, "fp16", path));
        TRY(get_int(fp16, "initial_scale_power", &c->fp16_initial_scale_power, 0, "fp16", path));
        TRY(get_int(fp16, "loss_scale_window", &c->fp16_loss_scale_window, 1, "fp16", path));
        TRY(get_int(fp16, "hysteresis", &c->fp16_hysteresis, 1, "fp16", path));
        TRY(get_num(fp16, "min_loss_scale", &c->fp16_min_loss_scale, 0.0, "fp16", path));
        TRY(get_bool(fp16, "consecutive_hysteresis", &c->fp16_consecutive_hysteresis, "fp16", path));
    }
    if (bf16) {
        static const char *const k[] = {"enabled", "immediate_grad_update", "check_grad_overflow", NULL};
        TRY(check_keys(bf16, k, NULL, "bf16", path, strict));
        TRY(get_bool(bf16, "enabled", &c->bf16_enabled, "bf16", path));
    }
    if (c->fp16_enabled && c->bf16_enabled)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: fp16.enabled and bf16.enabled cannot both be true", path);
    const char *cdt = NULL;
    TRY(get_str(j, "communication_data_type", &cdt, "", path));
    if (cdt) {
        if (!strcmp(cdt, "fp32") || !strcmp(cdt, "float32"))
            c->comm_dtype = CLLM_F32;
        else if (!strcmp(cdt, "bf16") || !strcmp(cdt, "bfloat16"))
            c->comm_dtype = CLLM_BF16;
        else if (!strcmp(cdt, "fp16") || !strcmp(cdt, "float16"))
            c->comm_dtype = CLLM_F16;
        else
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: communication_data_type: '%s' is not one of fp32, bf16, fp16", path,
                             cdt);
    }
    return CLLM_OK;
}

/* A whole number of elements >= 0 (DeepSpeed writes them as integers or as
 * floats such as 5e8), at most 1e15. */
static cllm_status get_count(const json_t *obj, const char *key, double *out, double min, const char *where,
                             const char *path) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || is_auto(v)) return CLLM_OK;
    if (!json_is_number(v))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": expected a number of elements, got %s", KEYARGS(path, where, key),
                         show(v).s);
    double d = json_number_value(v);
    if (!(d >= min) || d > 1e15 || d != floor(d))
        return CLLM_FAIL(CLLM_ERR_ARG, KEYFMT ": %g (expected a whole number of elements, %g to 1e15)",
                         KEYARGS(path, where, key), d, min);
    *out = d;
    return CLLM_OK;
}

static cllm_status parse_offload(const json_t *z, const char *key, cllm_offload_config *oc, const char *path,
                                 bool strict) {
    oc->device = CLLM_OFFLOAD_NONE;
    oc->nvme_path = NULL;
    oc->buffer_count = 4;
    oc->buffer_size = 1L << 20;
    json_t *o = NULL;
    TRY(get_obj(z, key, &o, "zero_optimization", path));
    if (!o) return CLLM_OK;
    static const char *const k[] = {"device", "pin_memory", "nvme_path", "buffer_count", "buffer_size",
                                    "max_in_cpu", "pipeline_read", "pipeline_write", "fast_init", "ratio", NULL};
    char where[64];
    snprintf(where, sizeof where, "zero_optimization.%s", key);
    TRY(check_keys(o, k, NULL, where, path, strict));
    json_t *dev = json_object_get(o, "device");
    if (dev && !json_is_null(dev)) {
        const char *d = json_string_value(dev);
        if (d && strcmp(d, "none") == 0)
            oc->device = CLLM_OFFLOAD_NONE;
        else if (d && strcmp(d, "cpu") == 0)
            oc->device = CLLM_OFFLOAD_CPU;
        else if (d && strcmp(d, "nvme") == 0)
            oc->device = CLLM_OFFLOAD_NVME;
        else
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.device: expected \"cpu\", \"nvme\" or \"none\", got %s", path,
                             where, show(dev).s);
    }
    TRY(get_str(o, "nvme_path", &oc->nvme_path, where, path));
    TRY(get_long(o, "buffer_count", &oc->buffer_count, 1, where, path));
    TRY(get_long(o, "buffer_size", &oc->buffer_size, 1, where, path));
    if (oc->device != CLLM_OFFLOAD_NVME) return CLLM_OK;
    if (!oc->nvme_path || !*oc->nvme_path)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.nvme_path: required with device \"nvme\" (a folder for the %s)", path,
                         where, strcmp(key, "offload_param") == 0 ? "parameters" : "optimizer state");
    if (strcmp(key, "offload_optimizer") == 0 && (oc->buffer_count < 3 || oc->buffer_count > 64))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s.buffer_count: %ld (expected 3 to 64 with device \"nvme\")", path, where,
                         oc->buffer_count);
    return CLLM_OK;
}

static cllm_status parse_zero(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    cllm_zero_config *zc = &c->zero;
    /* DeepSpeed's defaults */
    double reduce = 5e8, gather = 5e8, persist = 1e5, prefetch = 5e7, live = 1e9;
    json_t *z = NULL;
    TRY(get_obj(j, "zero_optimization", &z, "", path));
    if (z) {
        static const char *const k[] = {
            "stage", "offload_param", "offload_optimizer", "contiguous_gradients", "overlap_comm", "reduce_scatter",
            "reduce_bucket_size", "allgather_partitions", "allgather_bucket_size", "round_robin_gradients",
            "sub_group_size", "elastic_checkpoint", "load_from_fp32_weights", "cpu_offload", "cpu_offload_params",
            "cpu_offload_use_pin_memory", "stage3_max_live_parameters", "stage3_max_reuse_distance",
            "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
            "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
            "ignore_unused_parameters", "legacy_stage1", "zero_hpz_partition_size", "zero_quantized_weights",
            "zero_quantized_gradients", "mics_shard_size", "memory_efficient_linear",
            "use_multi_rank_bucket_allreduce", "model_persistence_threshold", "max_live_parameters",
            "max_reuse_distance", "prefetch_bucket_size", "param_persistence_threshold", NULL};
        TRY(check_keys(z, k, NULL, "zero_optimization", path, strict));
    }
    const char *w = "zero_optimization";
    long stage = 0;
    TRY(get_long(z, "stage", &stage, 0, w, path));
    if (stage > 3) return CLLM_FAIL(CLLM_ERR_ARG, "%s: zero_optimization.stage: %ld (expected 0, 1, 2 or 3)", path, stage);
    zc->stage = (int)stage;
    TRY(get_count(z, "reduce_bucket_size", &reduce, 1, w, path));
    TRY(get_count(z, "allgather_bucket_size", &gather, 1, w, path));
    TRY(get_bool(z, "overlap_comm", &zc->overlap_comm, w, path));
    TRY(get_count(z, "stage3_param_persistence_threshold", &persist, 0, w, path));
    TRY(get_count(z, "stage3_prefetch_bucket_size", &prefetch, 0, w, path));
    TRY(get_count(z, "stage3_max_live_parameters", &live, 0, w, path));
    zc->reduce_bucket_size = (size_t)reduce;
    zc->allgather_bucket_size = (size_t)gather;
    zc->stage3_param_persistence_threshold = persist;
    zc->stage3_prefetch_bucket_size = prefetch;
    zc->stage3_max_live_parameters = live;
    note_auto(c, z, "reduce_bucket_size", CLLM_AUTO_REDUCE_BUCKET_SIZE);
    note_auto(c, z, "stage3_prefetch_bucket_size", CLLM_AUTO_PREFETCH_BUCKET_SIZE);
    note_auto(c, z, "stage3_param_persistence_threshold", CLLM_AUTO_PERSISTENCE_THRESHOLD);
    TRY(get_bool(z, "zero_quantized_weights", &zc->quantized_weights, w, path));
    TRY(get_bool(z, "zero_quantized_gradients", &zc->quantized_gradients, w, path));
    zc->hpz_partition_size = 1;
    TRY(get_long(z, "zero_hpz_partition_size", &zc->hpz_partition_size, 1, w, path));
    TRY(parse_offload(z, "offload_optimizer", &zc->offload_optimizer, path, strict));
    TRY(parse_offload(z, "offload_param", &zc->offload_param, path, strict));
    if (zc->offload_param.device == CLLM_OFFLOAD_NVME && zc->stage < 3)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "%s: zero_optimization.offload_param: offloading parameters requires ZeRO stage 3 "
                         "(zero_optimization.stage is %d); use offload_optimizer to offload the optimizer state",
                         path, zc->stage);
    return CLLM_OK;
}

/* DeepSpeed's activation_checkpointing block configures checkpointing that
 * the model code turns on; here a block that enables anything (a true
 * flag, or number_checkpoints > 0) turns recomputation on, as
 * use_grad_ckpt does. An empty block, or one with every flag false, does
 * not. The flags' own meanings (partitioning across model-parallel ranks,
 * CPU copies, contiguous buffers) have no counterpart in one process. */
static cllm_status parse_act_ckpt(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *a = NULL;
    TRY(get_obj(j, "activation_checkpointing", &a, "", path));
    if (!a) return CLLM_OK;
    static const char *const k[] = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                                    "number_checkpoints", "synchronize_checkpoint_boundary", "profile", NULL};
    TRY(check_keys(a, k, NULL, "activation_checkpointing", path, strict));
    const char *v;
    json_t *x;
    json_object_foreach(a, v, x) {
        if (strcmp(v, "number_checkpoints") == 0) {
            if (!json_is_null(x) && !json_is_integer(x))
                return CLLM_FAIL(CLLM_ERR_ARG,
                                 "%s: activation_checkpointing.number_checkpoints: expected an integer or null, got %s",
                                 path, show(x).s);
            if (json_is_integer(x) && json_integer_value(x) > 0) c->use_grad_ckpt = true;
        } else if (!json_is_boolean(x)) {
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: activation_checkpointing.%s: expected true or false, got %s", path, v,
                             show(x).s);
        } else if (json_is_true(x) && strcmp(v, "profile") != 0) {
            c->use_grad_ckpt = true;
        }
    }
    return CLLM_OK;
}

/* model_topo (seed-003 pipeline configs): {"process_topology": {"axis":
 * [...], "dims": [...]}, "parts": [...], "schedule": "1f1b"}. The topology
 * module reads its two blocks (cllm/topo.h); the sizes are checked against
 * the world and the model when training starts. */
static cllm_status parse_topo(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    cllm_model_topo *mt = &c->model_topo;
    json_t *t = NULL;
    TRY(get_obj(j, "model_topo", &t, "", path));
    mt->given = t != NULL;
    mt->schedule = CLLM_PIPE_1F1B;
    static const char *const k[] = {"process_topology", "parts", "schedule", NULL};
    if (t) TRY(check_keys(t, k, NULL, "model_topo", path, strict));
    TRY(cllm_topo_layout_parse(&mt->layout, json_object_get(t, "process_topology"), path));
    TRY(cllm_topo_parts_parse(&mt->parts, json_object_get(t, "parts"), path));
    json_t *sched = json_object_get(t, "schedule");
    if (sched && !json_is_null(sched) &&
        (!json_is_string(sched) || cllm_pipe_schedule_parse(json_string_value(sched), &mt->schedule) != CLLM_OK))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: model_topo.schedule: expected \"gpipe\" or \"1f1b\", got %s", path,
                         show(sched).s);
    return CLLM_OK;
}

/* "moe": DeepSpeed-MoE's keys, Megatron's names as aliases (one name per
 * setting: both present is an error naming them). */
static cllm_status moe_alias(const json_t *m, const char *ds, const char *mg, const char **key, const char *path) {
    *key = json_object_get(m, mg) ? mg : ds;
    if (json_object_get(m, ds) && json_object_get(m, mg))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: moe.%s and moe.%s name the same setting: give one", path, ds, mg);
    return CLLM_OK;
}

static cllm_status parse_moe(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *m = NULL;
    TRY(get_obj(j, "moe", &m, "", path));
    c->moe.expert_parallel_size = 1;
    c->moe.capacity_factor = c->moe.eval_capacity_factor = 1.0;
    c->moe.min_capacity = 4;
    c->moe.drop_tokens = true;
    c->moe.given = m != NULL;
    if (!m) return CLLM_OK;
    static const char *const k[] = {"expert_parallel_size", "expert_model_parallel_size", "capacity_factor",
                                    "moe_expert_capacity_factor", "eval_capacity_factor", "min_capacity",
                                    "drop_tokens", NULL};
    /* DeepSpeed's per-layer MoE arguments that have a fixed meaning here */
    static const char *const ignored[] = {"use_residual", "noisy_gate_policy", "use_rts", "enable_expert_tensor_parallelism", NULL};
    TRY(check_keys(m, k, ignored, "moe", path, strict));
    const char *key;
    TRY(moe_alias(m, "expert_parallel_size", "expert_model_parallel_size", &key, path));
    TRY(get_int(m, key, &c->moe.expert_parallel_size, 1, "moe", path));
    TRY(moe_alias(m, "capacity_factor", "moe_expert_capacity_factor", &key, path));
    TRY(get_num(m, key, &c->moe.capacity_factor, 0.0, "moe", path));
    TRY(get_num(m, "eval_capacity_factor", &c->moe.eval_capacity_factor, 0.0, "moe", path));
    TRY(get_int(m, "min_capacity", &c->moe.min_capacity, 0, "moe", path));
    TRY(get_bool(m, "drop_tokens", &c->moe.drop_tokens, "moe", path));
    return CLLM_OK;
}

/* save_expert_layout: the expert tensors' layout of the saved model */
static cllm_status parse_expert_layout(cllm_train_config *c, const json_t *j, const char *path) {
    const char *s = NULL;
    TRY(get_str(j, "save_expert_layout", &s, "", path));
    if (s && !cllm_expert_layout_from_name(s, &c->save_expert_layout))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: save_expert_layout: '%s' (expected per-expert or fused)", path, s);
    return CLLM_OK;
}

/* --------------------------------------------------------- cllm keys */

static cllm_status parse_model(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *m = json_object_get(j, "model");
    if (!m || json_is_null(m)) return CLLM_OK;
    if (json_is_string(m)) {
        c->model_dir = json_string_value(m);
        return CLLM_OK;
    }
    if (!json_is_object(m))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: model: expected an HF folder path or {\"arch\", \"preset\", \"set\", \"seed\"}",
                         path);
    static const char *const k[] = {"arch", "preset", "set", "seed", NULL};
    TRY(check_keys(m, k, NULL, "model", path, strict));
    cllm_model_init_spec *mi = &c->model_init;
    const char *arch = NULL;
    TRY(get_str(m, "arch", &arch, "model", path));
    TRY(get_str(m, "preset", &mi->preset, "model", path));
    if (!arch || !mi->preset)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: model: an init spec needs \"arch\" and \"preset\"", path);
    mi->arch = cllm_arch_from_name(arch);
    if (mi->arch == CLLM_ARCH_COUNT)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: model.arch: unknown architecture '%s' (gpt2, llama, bloom)", path, arch);
    TRY(get_obj(m, "set", &mi->set, "model", path));
    long seed = -1;
    TRY(get_long(m, "seed", &seed, 0, "model", path));
    mi->has_seed = seed >= 0;
    mi->seed = mi->has_seed ? (uint64_t)seed : 0;
    c->has_model_init = true;
    return CLLM_OK;
}

static cllm_status parse_data(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *d = json_object_get(j, "data");
    if (!d || json_is_null(d)) return CLLM_OK;
    if (json_is_string(d)) {
        c->data_train = json_string_value(d);
        return CLLM_OK;
    }
    if (!json_is_object(d)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: data: expected a spec string or an object", path);
    static const char *const k[] = {"train", "eval", "tokenizer", "seq_len", "splits", "skip_bad", NULL};
    TRY(check_keys(d, k, NULL, "data", path, strict));
    TRY(get_str(d, "train", &c->data_train, "data", path));
    TRY(get_str(d, "eval", &c->data_eval, "data", path));
    TRY(get_str(d, "tokenizer", &c->tokenizer, "data", path));
    TRY(get_str(d, "splits", &c->splits, "data", path));
    TRY(get_int(d, "seq_len", &c->seq_len, 2, "data", path));
    TRY(get_int(d, "skip_bad", &c->skip_bad, 0, "data", path));
    return CLLM_OK;
}

/* The "reward" section (trl's RewardConfig name). */
static cllm_status parse_reward(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *d = NULL;
    TRY(get_obj(j, "reward", &d, "", path));
    if (!d) return CLLM_OK;
    if (strcmp(c->task, "reward") != 0)
        cllm_log(CLLM_LOG_WARN, "%s: the \"reward\" section is ignored with task \"%s\"", path, c->task);
    static const char *const k[] = {"center_rewards_coefficient", NULL};
    TRY(check_keys(d, k, NULL, "reward", path, strict));
    /* null (trl's default None) or 0: no centring term */
    TRY(get_num(d, "center_rewards_coefficient", &c->reward.center_rewards_coefficient, 0.0, "reward", path));
    return CLLM_OK;
}

/* The "ppo" section (trl's classic PPOConfig names; kl_coef is the newer
 * name of init_kl_coef, generation settings under generation_kwargs). */
static cllm_status parse_ppo(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    json_t *d = NULL;
    TRY(get_obj(j, "ppo", &d, "", path));
    if (!d) return CLLM_OK;
    if (strcmp(c->task, "ppo") != 0)
        cllm_log(CLLM_LOG_WARN, "%s: the \"ppo\" section is ignored with task \"%s\"", path, c->task);
    static const char *const k[] = {"kl_coef", "init_kl_coef", "adap_kl_ctrl", "target", "horizon", "gamma", "lam",
                                    "cliprange", "cliprange_value", "vf_coef", "ppo_epochs", "batch_size",
                                    "mini_batch_size", "whiten_rewards", "ratio_threshold", "reward_model",
                                    "ref_model", "rollouts", "generation_kwargs", "kl_penalty", "use_score_scaling",
                                    "use_score_norm", "score_clip", NULL};
    TRY(check_keys(d, k, NULL, "ppo", path, strict));
    cllm_ppo_params *p = &c->ppo;
    const char *pen = NULL;
    TRY(get_str(d, "kl_penalty", &pen, "ppo", path));
    static const char *const pens[] = {"kl", "abs", "mse", "full"};
    for (int i = 0; pen && i < 4; i++)
        if (strcmp(pen, pens[i]) == 0) {
            p->kl_penalty = (cllm_ppo_kl_penalty)i;
            pen = NULL;
        }
    if (pen)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.kl_penalty: expected \"kl\", \"abs\", \"mse\" or \"full\", got \"%s\"",
                         path, pen);
    TRY(get_bool(d, "use_score_scaling", &p->use_score_scaling, "ppo", path));
    TRY(get_bool(d, "use_score_norm", &p->use_score_norm, "ppo", path));
    TRY(get_num(d, "score_clip", &p->score_clip, 0.0, "ppo", path));
    if (json_is_number(json_object_get(d, "score_clip")) && !(p->score_clip > 0))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.score_clip: must be positive (or null: no clipping), got 0", path);
    if (json_object_get(d, "kl_coef") && json_object_get(d, "init_kl_coef"))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo: kl_coef and init_kl_coef name the same setting: give one", path);
    TRY(get_num(d, "kl_coef", &p->init_kl_coef, 0.0, "ppo", path));
    TRY(get_num(d, "init_kl_coef", &p->init_kl_coef, 0.0, "ppo", path));
    TRY(get_bool(d, "adap_kl_ctrl", &p->adap_kl_ctrl, "ppo", path));
    TRY(get_num(d, "target", &p->target, 0.0, "ppo", path));
    TRY(get_num(d, "horizon", &p->horizon, 0.0, "ppo", path));
    TRY(get_num(d, "gamma", &p->gamma, 0.0, "ppo", path));
    TRY(get_num(d, "lam", &p->lam, 0.0, "ppo", path));
    TRY(get_num(d, "cliprange", &p->cliprange, 0.0, "ppo", path));
    TRY(get_num(d, "cliprange_value", &p->cliprange_value, 0.0, "ppo", path));
    TRY(get_num(d, "vf_coef", &p->vf_coef, 0.0, "ppo", path));
    TRY(get_num(d, "ratio_threshold", &p->ratio_threshold, 0.0, "ppo", path));
    TRY(get_int(d, "ppo_epochs", &p->ppo_epochs, 1, "ppo", path));
    TRY(get_int(d, "batch_size", &p->batch_size, 1, "ppo", path));
    TRY(get_int(d, "mini_batch_size", &c->ppo_mini_batch_size, 1, "ppo", path));
    TRY(get_bool(d, "whiten_rewards", &p->whiten_rewards, "ppo", path));
    TRY(get_str(d, "reward_model", &c->reward_model_dir, "ppo", path));
    TRY(get_str(d, "ref_model", &c->ref_model_dir, "ppo", path));
    TRY(get_str(d, "rollouts", &c->ppo_rollouts, "ppo", path));
    static const char *const ck[] = {"max_new_tokens", "temperature", "top_k", "top_p", "do_sample", NULL};
    json_t *g = NULL;
    TRY(get_obj(d, "generation_kwargs", &g, "ppo", path));
    if (g) {
        TRY(check_keys(g, ck, NULL, "ppo.generation_kwargs", path, strict));
        TRY(get_int(g, "max_new_tokens", &p->max_new_tokens, 1, "ppo.generation_kwargs", path));
        TRY(get_num(g, "temperature", &p->temperature, 0.0, "ppo.generation_kwargs", path));
        TRY(get_int(g, "top_k", &p->top_k, 0, "ppo.generation_kwargs", path));
        TRY(get_num(g, "top_p", &p->top_p, 0.0, "ppo.generation_kwargs", path));
        bool sample = true;
        TRY(get_bool(g, "do_sample", &sample, "ppo.generation_kwargs", path));
        if (!sample)
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.generation_kwargs.do_sample: PPO samples its rollouts "
                             "(false is not supported)", path);
    }
    if (!(p->temperature > 0))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.generation_kwargs.temperature: must be positive, got 0", path);
    if (!(p->top_p > 0) || p->top_p > 1)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.generation_kwargs.top_p: must be in (0, 1], got %g", path, p->top_p);
    if (p->gamma > 1 || p->lam > 1)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.%s: must be in [0, 1], got %g", path, p->gamma > 1 ? "gamma" : "lam",
                         p->gamma > 1 ? p->gamma : p->lam);
    const char *pos[] = {"target", "horizon", "cliprange", "cliprange_value", "ratio_threshold"};
    const double val[] = {p->target, p->horizon, p->cliprange, p->cliprange_value, p->ratio_threshold};
    for (int i = 0; i < 5; i++)
        if (!(val[i] > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: ppo.%s: must be positive, got 0", path, pos[i]);
    return CLLM_OK;
}

/* "task" and its "dpo" section (trl's DPOConfig names). */
static cllm_status parse_task(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    TRY(get_str(j, "task", &c->task, "", path));
    if (strcmp(c->task, "lm") != 0 && strcmp(c->task, "dpo") != 0 && strcmp(c->task, "reward") != 0 &&
        strcmp(c->task, "ppo") != 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: task: expected \"lm\", \"dpo\", \"reward\" or \"ppo\", got \"%s\"",
                         path, c->task);
    TRY(parse_reward(c, j, path, strict));
    TRY(parse_ppo(c, j, path, strict));
    json_t *d = NULL;
    TRY(get_obj(j, "dpo", &d, "", path));
    if (!d) return CLLM_OK;
    if (strcmp(c->task, "dpo") != 0)
        cllm_log(CLLM_LOG_WARN, "%s: the \"dpo\" section is ignored with task \"%s\"", path, c->task);
    static const char *const k[] = {"beta", "loss_type", "label_smoothing", "reference_free", "ref_model",
                                    "precompute_ref_log_probs", NULL};
    TRY(check_keys(d, k, NULL, "dpo", path, strict));
    TRY(get_num(d, "beta", &c->dpo.beta, 0.0, "dpo", path));
    if (!(c->dpo.beta > 0)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: dpo.beta: must be positive, got 0", path);
    TRY(get_num(d, "label_smoothing", &c->dpo.label_smoothing, 0.0, "dpo", path));
    if (c->dpo.label_smoothing >= 0.5)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: dpo.label_smoothing: %g is out of range [0, 0.5)", path,
                         c->dpo.label_smoothing);
    TRY(get_bool(d, "reference_free", &c->dpo.reference_free, "dpo", path));
    TRY(get_bool(d, "precompute_ref_log_probs", &c->dpo.precompute_ref_log_probs, "dpo", path));
    TRY(get_str(d, "ref_model", &c->ref_model_dir, "dpo", path));
    const char *lt = NULL;
    TRY(get_str(d, "loss_type", &lt, "dpo", path));
    if (lt && cllm_dpo_loss_parse(lt, &c->dpo.loss_type))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: dpo.loss_type: expected \"sigmoid\", \"ipo\", \"hinge\" or \"robust\", "
                         "got \"%s\"", path, lt);
    return CLLM_OK;
}

/* "lora" (PEFT's LoraConfig keys, read by the LoRA module's one reader;
 * unknown keys are always errors there) and "adapter". */
static cllm_status parse_lora(cllm_train_config *c, const json_t *j, const char *path) {
    TRY(get_str(j, "adapter", &c->adapter_dir, "", path));
    json_t *l = NULL;
    TRY(get_obj(j, "lora", &l, "", path));
    if (!l) return CLLM_OK;
    if (c->adapter_dir)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: lora: not with \"adapter\" (--adapter): a saved adapter brings its own "
                         "adapter_config.json", path);
    return cllm_lora_config_parse(&c->lora, l, "lora", path, false);
}

/* "freeze" or "unfrozen_parameters": a regular expression or a list of
 * them (cllm_model_freeze, cllm_model_freeze_except); the strings stay the
 * config's. */
static cllm_status parse_freeze(cllm_train_config *c, const json_t *j, const char *path) {
    const json_t *f = json_object_get(j, "freeze"), *u = json_object_get(j, "unfrozen_parameters");
    if (f && u) return CLLM_FAIL(CLLM_ERR_ARG, "%s: \"freeze\" and \"unfrozen_parameters\": give one of them", path);
    const char *key = u ? "unfrozen_parameters" : "freeze";
    if (u) f = u;
    if (!f) return CLLM_OK;
    size_t n = json_is_array(f) ? json_array_size(f) : 1;
    if (!json_is_string(f) && (!json_is_array(f) || n == 0))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: expected a regular expression or a non-empty list of them", path, key);
    c->freeze = calloc(n, sizeof *c->freeze);
    if (!c->freeze) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    c->freeze_except = u != NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(f) ? json_array_get(f, i) : f;
        if (!json_is_string(e) || !*json_string_value(e))
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s[%zu]: expected a non-empty string", path, key, i);
        c->freeze[c->n_freeze++] = json_string_value(e);
    }
    if (c->lora.enabled || c->adapter_dir)
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %s: not with LoRA (\"lora\", \"adapter\"): the adapters' base is "
                         "frozen whole", path, key);
    return CLLM_OK;
}

/* "quantization" (BitsAndBytesConfig keys, read by cllm/quant.h's reader). */
static cllm_status parse_quant(cllm_train_config *c, const json_t *j, const char *path) {
    json_t *q = NULL;
    TRY(get_obj(j, "quantization", &q, "", path));
    return q ? cllm_bnb_config_parse(&c->quant, q, "quantization", path) : CLLM_OK;
}

static cllm_status parse_ours(cllm_train_config *c, const json_t *j, const char *path, bool strict) {
    TRY(parse_task(c, j, path, strict));
    TRY(parse_lora(c, j, path));
    TRY(parse_freeze(c, j, path));
    TRY(parse_quant(c, j, path));
    TRY(parse_model(c, j, path, strict));
    TRY(parse_data(c, j, path, strict));
    TRY(get_long(j, "train_iters", &c->train_iters, 0, "", path));
    TRY(get_num(j, "epochs", &c->epochs, 0.0, "", path));
    TRY(get_long(j, "eval_interval", &c->eval_interval, 0, "", path));
    TRY(get_long(j, "eval_iters", &c->eval_iters, 0, "", path));
    TRY(get_long(j, "save_interval", &c->save_interval, 0, "", path));
    TRY(get_long(j, "save_total_limit", &c->save_total_limit, 0, "", path));
    TRY(get_str(j, "output_dir", &c->output_dir, "", path));
    long seed = (long)c->seed;
    TRY(get_long(j, "seed", &seed, 0, "", path));
    c->seed = (uint64_t)seed;
    TRY(get_bool(j, "shuffle", &c->shuffle, "", path));
    TRY(get_int(j, "max_consecutive_skips", &c->max_consecutive_skips, 1, "", path));
    TRY(get_num(j, "peak_gflops", &c->peak_gflops, 0.0, "", path));
    TRY(get_bool(j, "async_save", &c->async_save, "", path));
    TRY(get_bool(j, "save_final_checkpoint", &c->save_final_checkpoint, "", path));
    TRY(get_num(j, "heartbeat_timeout", &c->heartbeat_timeout, 0.0, "", path));
    const char *log = NULL;
    TRY(get_str(j, "log", &log, "", path));
    if (log) {
        static const char *const modes[] = {"auto", "progress", "plain", "quiet"};
        int i = 0;
        while (i < 4 && strcmp(log, modes[i]) != 0) i++;
        if (i == 4) return CLLM_FAIL(CLLM_ERR_ARG, "%s: log: '%s' (expected auto, progress, plain or quiet)", path, log);
        c->log = (cllm_log_mode)i;
    }
    json_t *ms = json_object_get(j, "max_shard_size");
    if (ms && !json_is_null(ms)) {
        if (json_is_integer(ms) && json_integer_value(ms) >= 0) {
            c->max_shard_bytes = (size_t)json_integer_value(ms);
        } else if (!json_is_string(ms) || cllm_parse_size(json_string_value(ms), &c->max_shard_bytes)) {
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: max_shard_size: expected a size such as \"2GB\" or 0", path);
        }
    }
    json_t *wds = json_object_get(j, "weight_decay_skip");
    if (wds && !json_is_null(wds)) {
        if (json_is_boolean(wds)) {
            c->decay_skip_bias = c->decay_skip_norm = json_is_true(wds);
        } else if (json_is_array(wds)) {
            c->decay_skip_bias = c->decay_skip_norm = false;
            size_t i;
            json_t *v;
            json_array_foreach(wds, i, v) {
                const char *s = json_is_string(v) ? json_string_value(v) : "";
                if (strcmp(s, "bias") == 0)
                    c->decay_skip_bias = true;
                else if (strcmp(s, "norm") == 0)
                    c->decay_skip_norm = true;
                else
                    return CLLM_FAIL(CLLM_ERR_ARG, "%s: weight_decay_skip[%zu]: expected \"bias\" or \"norm\"", path, i);
            }
        } else {
            return CLLM_FAIL(CLLM_ERR_ARG, "%s: weight_decay_skip: expected a boolean or a list of \"bias\", \"norm\"",
                             path);
        }
    }
    return CLLM_OK;
}

static void set_defaults(cllm_train_config *c) {
    memset(c, 0, sizeof *c);
    c->optim = cllm_optim_defaults(CLLM_OPT_ADAMW);
    c->optim.weight_decay = 0.0;
    c->optimizer_name = "AdamW";
    c->adam_w_mode = true;
    c->sched = cllm_sched_defaults(CLLM_SCHED_CONSTANT);
    c->fp16_initial_scale_power = 16;
    c->fp16_loss_scale_window = 1000;
    c->fp16_hysteresis = 2;
    c->fp16_min_loss_scale = 1.0;
    c->steps_per_print = 10;
    c->seq_len = 128;
    c->eval_iters = 0;
    c->seed = 42;
    c->shuffle = true;
    c->decay_skip_bias = c->decay_skip_norm = true;
    c->max_consecutive_skips = 10;
    c->async_save = true;
    c->save_final_checkpoint = true;
    c->heartbeat_timeout = 30;
    c->dp_size = 1;
    c->task = "lm";
    c->dpo = cllm_dpo_params_default();
    cllm_lora_config_default(&c->lora);
    cllm_bnb_config_default(&c->quant);
    c->reward = cllm_reward_params_default();
    c->ppo = cllm_ppo_params_default();
}

cllm_status cllm_train_config_parse(cllm_train_config *cfg, json_t *j, const char *path, bool strict) {
    set_defaults(cfg);
    cfg->json = j;
    if (!json_is_object(j)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: expected a JSON object at the top level", path);
    TRY(check_keys(j, top_keys, top_ignored, "", path, strict));
    TRY(get_long(j, "train_batch_size", &cfg->train_batch_size, 1, "", path));
    TRY(get_long(j, "train_micro_batch_size_per_gpu", &cfg->train_micro_batch_size_per_gpu, 1, "", path));
    TRY(get_long(j, "gradient_accumulation_steps", &cfg->gradient_accumulation_steps, 1, "", path));
    note_auto(cfg, j, "train_batch_size", CLLM_AUTO_TRAIN_BATCH_SIZE);
    note_auto(cfg, j, "train_micro_batch_size_per_gpu", CLLM_AUTO_MICRO_BATCH_SIZE);
    note_auto(cfg, j, "gradient_accumulation_steps", CLLM_AUTO_GRADIENT_ACCUMULATION);
    TRY(get_num(j, "gradient_clipping", &cfg->gradient_clipping, 0.0, "", path));
    TRY(get_long(j, "steps_per_print", &cfg->steps_per_print, 1, "", path));
    TRY(get_bool(j, "wall_clock_breakdown", &cfg->wall_clock_breakdown, "", path));
    TRY(get_bool(j, "use_grad_ckpt", &cfg->use_grad_ckpt, "", path));
    TRY(get_bool(j, "sequence_parallel", &cfg->sequence_parallel, "", path));
    json_t *o = NULL;
    TRY(get_obj(j, "optimizer", &o, "", path));
    if (o) TRY(parse_optimizer(cfg, o, path, strict));
    TRY(get_obj(j, "scheduler", &o, "", path));
    if (o) TRY(parse_scheduler(cfg, o, path, strict));
    TRY(parse_precision(cfg, j, path, strict));
    TRY(parse_zero(cfg, j, path, strict));
    TRY(parse_topo(cfg, j, path, strict));
    TRY(parse_act_ckpt(cfg, j, path, strict));
    TRY(parse_moe(cfg, j, path, strict));
    TRY(parse_expert_layout(cfg, j, path));
    TRY(parse_ours(cfg, j, path, strict));
    return CLLM_OK;
}

void cllm_train_config_free(cllm_train_config *cfg) {
    if (!cfg) return;
    cllm_lora_config_free(&cfg->lora);
    cllm_bnb_config_free(&cfg->quant);
    free(cfg->freeze);
    cfg->freeze = NULL;
    cfg->n_freeze = 0;
    json_decref(cfg->json);
    cfg->json = NULL;
}
