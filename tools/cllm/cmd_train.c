/*
 * cllm train: the front end of the training engine (cllm/train.h).
 *
 * With --config FILE.json the run is described by a DeepSpeed-style config;
 * without it, the flags alone describe a run (the original minimal loop:
 * --model --data --out --steps, constant --lr, --batch-size samples per step).
 * Either way the flags are merged into one JSON object (a flag overrides the
 * file), which the engine parses, so --print-config shows exactly what would
 * run. SIGINT/SIGTERM ask the engine to save a checkpoint and stop (exit 0);
 * a second signal kills the process.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "cllm/dist.h"
#include "cllm/json.h"
#include "cllm/lora.h"
#include "cllm/optim.h"
#include "cllm/train.h"
#include "commands.h"
#include "quant_flags.h"

/* The test hooks' settings, read from the environment. */
typedef struct {
    const char *poison; /* CLLM_TRAIN_POISON_STEPS */
    int slow_rank;      /* CLLM_TEST_SLOW_STEP=RANK:SECONDS[:STEP] (-1: none) */
    double slow_seconds;
    long slow_step;     /* 0: the first step this process runs */
} test_hooks;

/* Test hook: CLLM_TRAIN_POISON_STEPS="3,4" makes the gradients of those
 * steps NaN, to exercise the non-finite path without a diverging run. */
static bool poison_from_env(long step, void *ctx) {
    const char *s = ((const test_hooks *)ctx)->poison;
    while (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) return false;
        if (v == step) return true;
        s = *end == ',' ? end + 1 : end;
    }
    return false;
}

/* Test hook: CLLM_TEST_SLOW_STEP=RANK:SECONDS[:STEP] makes rank RANK sleep
 * SECONDS inside step STEP (default: the first step it runs), between the
 * backward pass and the gradient reduction, once: a slow but live rank, which
 * the heartbeat must not take for a hung one (docs/reliability.md). */
static void slow_from_env(long step, void *ctx) {
    test_hooks *h = ctx;
    if (h->slow_rank != cllm_dist_rank() || (h->slow_step && step != h->slow_step)) return;
    h->slow_rank = -1;
    fprintf(stderr, "cllm train: rank %d: CLLM_TEST_SLOW_STEP: sleeping %g s inside step %ld\n", cllm_dist_rank(),
            h->slow_seconds, step);
    double ns = h->slow_seconds * 1e9;
    struct timespec ts = {(time_t)(ns / 1e9), (long)fmod(ns, 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Reads the test hooks; false (and a message) when one is malformed. */
static bool hooks_from_env(test_hooks *h) {
    h->poison = getenv("CLLM_TRAIN_POISON_STEPS");
    h->slow_rank = -1;
    const char *v = getenv("CLLM_TEST_SLOW_STEP");
    if (!v || !*v) return true;
    int r = -1, n = 0;
    double sec = -1;
    long step = 0;
    int got = sscanf(v, "%d:%lf%n:%ld%n", &r, &sec, &n, &step, &n);
    if (got < 2 || r < 0 || !(sec >= 0 && sec < 1e6) || step < 0 || v[n] != '\0') {
        fprintf(stderr, "cllm train: CLLM_TEST_SLOW_STEP='%s': expected RANK:SECONDS[:STEP] (a test hook)\n", v);
        return false;
    }
    h->slow_rank = r;
    h->slow_seconds = sec;
    h->slow_step = step;
    return true;
}

/* On the signal thread (tool_signals_arm): the engine stops at the end of
 * the step in progress. */
static void on_signal(int sig) {
    (void)sig;
    cllm_train_request_stop();
}

/* The object at j[key], created if absent or not an object (a "data" string
 * becomes {"train": string}). Borrowed. */
static json_t *sub_object(json_t *j, const char *key) {
    json_t *o = json_object_get(j, key);
    if (json_is_object(o)) return o;
    json_t *n = json_object();
    if (json_is_string(o) && strcmp(key, "data") == 0) json_object_set(n, "train", o);
    json_object_set_new(j, key, n);
    return n;
}

static int set_int(json_t *obj, const char *key, const char *flag, const char *v) {
    int64_t x;
    if (!cllm_parse_i64(v, &x) || x < 0) {
        fprintf(stderr, "cllm train: --%s: '%s' is not a non-negative integer\n", flag, v);
        return 2;
    }
    json_object_set_new(obj, key, json_integer((json_int_t)x));
    return 0;
}

static int set_num(json_t *obj, const char *key, const char *flag, const char *v) {
    double x;
    if (!cllm_parse_f64(v, &x) || !(x >= 0)) {
        fprintf(stderr, "cllm train: --%s: '%s' is not a non-negative number\n", flag, v);
        return 2;
    }
    json_object_set_new(obj, key, json_real(x));
    return 0;
}

typedef struct {
    const char *config, *model, *data, *eval_data, *out, *steps, *batch, *micro, *accum, *seq_len, *save_interval,
        *save_limit, *eval_interval, *eval_iters, *resume, *seed, *optimizer, *lr, *wd, *clip, *log_every, *shard,
        *log, *peak, *tokenizer, *splits, *skip_bad, *task, *ref_model, *beta, *loss_type, *smoothing, *heartbeat,
        *expert_layout, *lora_r, *lora_alpha, *lora_dropout, *lora_target, *adapter, *center, *reward_model, *rollouts, *kl_coef,
        *ppo_epochs;
    bool no_shuffle, strict, print_config, sync_save, grad_ckpt, reference_free, precompute;
    quant_flags quant;
    arg_list freeze, unfrozen;
} train_flags;

/* Sets optimizer.type from a cllm optimizer name: "adam" keeps torch Adam's
 * L2-coupled decay (adam_w_mode false), "adamw" is decoupled. */
static int set_optimizer(json_t *j, const char *name) {
    cllm_opt_type t = cllm_opt_from_name(name);
    if (t == CLLM_OPT_COUNT) {
        fprintf(stderr, "cllm train: --optimizer: unknown optimizer '%s' (sgd, adam, adamw, lion)\n", name);
        return 2;
    }
    static const char *const ds[] = {"SGD", "Adam", "AdamW", "Lion"};
    json_t *o = sub_object(j, "optimizer");
    json_t *p = sub_object(o, "params");
    const char *old = json_string_value(json_object_get(o, "type"));
    if (!old || cllm_opt_from_name(old) != t) {
        /* parameters of another optimizer would not apply */
        json_t *keep_lr = json_incref(json_object_get(p, "lr")), *keep_wd = json_incref(json_object_get(p, "weight_decay"));
        json_object_clear(p);
        if (keep_lr) json_object_set_new(p, "lr", keep_lr);
        if (keep_wd) json_object_set_new(p, "weight_decay", keep_wd);
    }
    json_object_set_new(o, "type", json_string(ds[t]));
    if (t == CLLM_OPT_ADAM) json_object_set_new(p, "adam_w_mode", json_false());
    return 0;
}

/* The blocks that flags write into must be objects where the file has
 * them ("data" may also be a string: the training data spec); anything
 * else is the file's error, not a value to replace silently. */
static int check_blocks(const json_t *j, const char *where) {
    const json_t *o = json_object_get(j, "optimizer"), *d = json_object_get(j, "data");
    const char *bad = NULL;
    if (o && !json_is_object(o)) bad = "optimizer";
    else if (o && json_object_get(o, "params") && !json_is_object(json_object_get(o, "params"))) bad = "optimizer.params";
    else if (d && !json_is_object(d) && !json_is_string(d)) bad = "data";
    if (!bad) return 0;
    const json_t *v = strcmp(bad, "optimizer.params") == 0 ? json_object_get(o, "params") : json_object_get(j, bad);
    char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    fprintf(stderr, "cllm train: %s: %s: expected an object%s, got %.60s\n", where, bad,
            strcmp(bad, "data") == 0 ? " or a data spec string" : "", got ? got : "?");
    free(got);
    return 2; /* as the library's config errors */
}

static int apply_flags(json_t *j, const train_flags *f) {
    int rc = 0;
    if (f->model) json_object_set_new(j, "model", json_string(f->model));
    if (f->data) json_object_set_new(sub_object(j, "data"), "train", json_string(f->data));
    if (f->eval_data) json_object_set_new(sub_object(j, "data"), "eval", json_string(f->eval_data));
    if (f->out) json_object_set_new(j, "output_dir", json_string(f->out));
    if (f->steps) {
        rc = rc ? rc : set_int(j, "train_iters", "steps", f->steps);
        json_object_del(j, "epochs");
    }
    if (f->batch) {
        /* --batch-size is the global batch: keep a micro batch size from the
         * file and let the accumulation steps follow */
        rc = rc ? rc : set_int(j, "train_batch_size", "batch-size", f->batch);
        if (json_object_get(j, "train_micro_batch_size_per_gpu") && !f->accum)
            json_object_del(j, "gradient_accumulation_steps");
    }
    if (f->micro) rc = rc ? rc : set_int(j, "train_micro_batch_size_per_gpu", "micro-batch-size", f->micro);
    if (f->accum) rc = rc ? rc : set_int(j, "gradient_accumulation_steps", "grad-accum", f->accum);
    if ((f->micro || f->accum) && !f->batch) json_object_del(j, "train_batch_size");
    if (f->seq_len) rc = rc ? rc : set_int(sub_object(j, "data"), "seq_len", "seq-len", f->seq_len);
    if (f->tokenizer) json_object_set_new(sub_object(j, "data"), "tokenizer", json_string(f->tokenizer));
    if (f->splits) json_object_set_new(sub_object(j, "data"), "splits", json_string(f->splits));
    if (f->skip_bad) rc = rc ? rc : set_int(sub_object(j, "data"), "skip_bad", "skip-bad", f->skip_bad);
    if (f->save_interval) rc = rc ? rc : set_int(j, "save_interval", "save-interval", f->save_interval);
    if (f->save_limit) rc = rc ? rc : set_int(j, "save_total_limit", "save-total-limit", f->save_limit);
    if (f->eval_interval) rc = rc ? rc : set_int(j, "eval_interval", "eval-interval", f->eval_interval);
    if (f->eval_iters) rc = rc ? rc : set_int(j, "eval_iters", "eval-iters", f->eval_iters);
    if (f->seed) rc = rc ? rc : set_int(j, "seed", "seed", f->seed);
    if (f->log_every) rc = rc ? rc : set_int(j, "steps_per_print", "log-every", f->log_every);
    if (f->clip) rc = rc ? rc : set_num(j, "gradient_clipping", "grad-clip", f->clip);
    if (f->peak) rc = rc ? rc : set_num(j, "peak_gflops", "peak-gflops", f->peak);
    if (f->heartbeat) rc = rc ? rc : set_num(j, "heartbeat_timeout", "heartbeat-timeout", f->heartbeat);
    if (f->optimizer) rc = rc ? rc : set_optimizer(j, f->optimizer);
    /* no optimizer anywhere: AdamW (the minimal loop's default) */
    if (!json_object_get(json_object_get(j, "optimizer"), "type")) rc = rc ? rc : set_optimizer(j, "adamw");
    if (f->lr) rc = rc ? rc : set_num(sub_object(sub_object(j, "optimizer"), "params"), "lr", "lr", f->lr);
    if (f->wd)
        rc = rc ? rc : set_num(sub_object(sub_object(j, "optimizer"), "params"), "weight_decay", "weight-decay", f->wd);
    if (f->shard) json_object_set_new(j, "max_shard_size", json_string(f->shard));
    if (f->expert_layout) json_object_set_new(j, "save_expert_layout", json_string(f->expert_layout));
    if (f->log) json_object_set_new(j, "log", json_string(f->log));
    if (f->no_shuffle) json_object_set_new(j, "shuffle", json_false());
    if (f->sync_save) json_object_set_new(j, "async_save", json_false());
    if (f->grad_ckpt) json_object_set_new(j, "use_grad_ckpt", json_true());
    if (f->task) json_object_set_new(j, "task", json_string(f->task));
    const char *task = json_string_value(json_object_get(j, "task"));
    if (task && strcmp(task, "ppo") == 0 && (f->ref_model || f->reward_model || f->rollouts || f->kl_coef ||
                                             f->ppo_epochs)) {
        json_t *d = json_object_get(j, "ppo");
        if (d && !json_is_object(d)) {
            fprintf(stderr, "cllm train: ppo: expected an object\n");
            return 2;
        }
        d = sub_object(j, "ppo");
        if (f->ref_model) json_object_set_new(d, "ref_model", json_string(f->ref_model));
        if (f->reward_model) json_object_set_new(d, "reward_model", json_string(f->reward_model));
        if (f->rollouts) json_object_set_new(d, "rollouts", json_string(f->rollouts));
        if (f->kl_coef) rc = rc ? rc : set_num(d, json_object_get(d, "kl_coef") ? "kl_coef" : "init_kl_coef",
                                               "init-kl-coef", f->kl_coef);
        if (f->ppo_epochs) rc = rc ? rc : set_int(d, "ppo_epochs", "ppo-epochs", f->ppo_epochs);
    } else if (f->reward_model || f->rollouts || f->kl_coef || f->ppo_epochs) {
        fprintf(stderr, "cllm train: --reward-model, --rollouts, --init-kl-coef and --ppo-epochs apply to --task ppo\n");
        return 2;
    } else if (f->ref_model || f->beta || f->loss_type || f->smoothing || f->reference_free || f->precompute) {
        json_t *d = json_object_get(j, "dpo");
        if (d && !json_is_object(d)) {
            fprintf(stderr, "cllm train: dpo: expected an object\n");
            return 2;
        }
        d = sub_object(j, "dpo");
        if (f->ref_model) json_object_set_new(d, "ref_model", json_string(f->ref_model));
        if (f->beta) rc = rc ? rc : set_num(d, "beta", "beta", f->beta);
        if (f->loss_type) json_object_set_new(d, "loss_type", json_string(f->loss_type));
        if (f->smoothing) rc = rc ? rc : set_num(d, "label_smoothing", "label-smoothing", f->smoothing);
        if (f->reference_free) json_object_set_new(d, "reference_free", json_true());
        if (f->precompute) json_object_set_new(d, "precompute_ref_log_probs", json_true());
    }
    if (f->freeze.n > 0 && f->unfrozen.n > 0) {
        fprintf(stderr, "cllm train: --freeze and --unfrozen-parameters (unfrozen_parameters): give one of them\n");
        return 2;
    }
    const arg_list *fl[2] = {&f->freeze, &f->unfrozen};
    for (int k = 0; k < 2; k++) {
        if (fl[k]->n <= 0) continue;
        json_t *a = json_array();
        for (int i = 0; i < fl[k]->n; i++) json_array_append_new(a, json_string(fl[k]->items[i]));
        json_object_del(j, k ? "freeze" : "unfrozen_parameters"); /* a flag replaces the file's choice */
        json_object_set_new(j, k ? "unfrozen_parameters" : "freeze", a);
    }
    if (f->adapter) json_object_set_new(j, "adapter", json_string(f->adapter));
    if (f->lora_r || f->lora_alpha || f->lora_dropout || f->lora_target) {
        json_t *l = json_object_get(j, "lora");
        if (l && !json_is_object(l)) {
            fprintf(stderr, "cllm train: lora: expected an object\n");
            return 2;
        }
        l = sub_object(j, "lora");
        if (f->lora_r) rc = rc ? rc : set_int(l, "r", "lora-r", f->lora_r);
        if (f->lora_alpha) rc = rc ? rc : set_num(l, "lora_alpha", "lora-alpha", f->lora_alpha);
        if (f->lora_dropout) rc = rc ? rc : set_num(l, "lora_dropout", "lora-dropout", f->lora_dropout);
        if (f->lora_target) {
            /* as the config key: "all-linear", a list, or a regular expression */
            cllm_lora_config t;
            cllm_lora_config_default(&t);
            if (cllm_lora_config_set_targets(&t, f->lora_target)) {
                fprintf(stderr, "cllm train: %s\n", cllm_last_error());
                rc = rc ? rc : 2;
            } else if (t.target_kind == CLLM_LORA_TARGET_LIST) {
                json_t *a = json_array();
                for (int i = 0; i < t.n_targets; i++) json_array_append_new(a, json_string(t.targets[i]));
                json_object_set_new(l, "target_modules", a);
            } else {
                json_object_set_new(l, "target_modules", json_string(f->lora_target));
            }
            cllm_lora_config_free(&t);
        }
    }
    if (quant_flags_any(&f->quant)) {
        json_t *q = json_object_get(j, "quantization");
        if (q && !json_is_object(q)) {
            fprintf(stderr, "cllm train: quantization: expected an object\n");
            return 2;
        }
        quant_flags_to_json(&f->quant, sub_object(j, "quantization"));
    }
    if (f->center) {
        json_t *d = json_object_get(j, "reward");
        if (d && !json_is_object(d)) {
            fprintf(stderr, "cllm train: reward: expected an object\n");
            return 2;
        }
        rc = rc ? rc : set_num(sub_object(j, "reward"), "center_rewards_coefficient", "center-rewards-coefficient",
                               f->center);
    }
    return rc;
}

int cmd_train(int argc, char **argv) {
    if (tool_signals_start()) return 1; /* before any thread exists */
    train_flags f;
    memset(&f, 0, sizeof f);
    arg_spec specs[] = {
        {"config", ARG_STR, &f.config, NULL, false, "DeepSpeed-style JSON config (see docs/training.md); flags override it"},
        {"model", ARG_STR, &f.model, NULL, false, "HF model folder to start from (config key: model)"},
        {"data", ARG_STR, &f.data, NULL, false,
         "training data: prepared PREFIX, .json/.jsonl/.txt file or blend \"W1 SPEC1 W2 SPEC2\" (data.train; docs/data.md)"},
        {"tokenizer", ARG_STR, &f.tokenizer, NULL, false, "tokenizer folder for raw text (data.tokenizer; default: the model folder)"},
        {"splits", ARG_STR, &f.splits, NULL, false, "train,valid,test weights such as 950,30,20 (data.splits); eval reads valid"},
        {"skip-bad", ARG_STR, &f.skip_bad, NULL, false, "skip up to N bad records of raw data files (data.skip_bad; default 0)"},
        {"eval-data", ARG_STR, &f.eval_data, NULL, false, "evaluation data spec (data.eval)"},
        {"out", ARG_STR, &f.out, NULL, false, "output folder: model, checkpoints, metrics.jsonl (output_dir)"},
        {"steps", ARG_STR, &f.steps, NULL, false, "total optimizer steps of the run; a resumed run continues up to it (train_iters)"},
        {"batch-size", ARG_STR, &f.batch, NULL, false, "samples (dpo, reward: pairs; ppo: rollouts) per optimizer step (train_batch_size; default 8 without --config)"},
        {"micro-batch-size", ARG_STR, &f.micro, NULL, false, "samples per forward/backward (train_micro_batch_size_per_gpu)"},
        {"grad-accum", ARG_STR, &f.accum, NULL, false, "micro-batches per step (gradient_accumulation_steps)"},
        {"seq-len", ARG_STR, &f.seq_len, NULL, false, "tokens per sample, longer truncated, shorter padded (data.seq_len; default 128)"},
        {"optimizer", ARG_STR, &f.optimizer, NULL, false, "sgd, adam (L2 decay), adamw or lion (default adamw)"},
        {"lr", ARG_STR, &f.lr, NULL, false, "learning rate (optimizer.params.lr; default 1e-3)"},
        {"weight-decay", ARG_STR, &f.wd, NULL, false, "weight decay, not applied to biases and norm weights (default 0)"},
        {"grad-clip", ARG_STR, &f.clip, NULL, false, "clip the global gradient L2 norm (gradient_clipping; 0 = off)"},
        {"no-shuffle", ARG_FLAG, &f.no_shuffle, NULL, false, "take samples in file order (sample g -> step g/B, row g%B)"},
        {"seed", ARG_STR, &f.seed, NULL, false, "seed for data shuffling (default 42)"},
        {"save-interval", ARG_STR, &f.save_interval, NULL, false, "write OUT/checkpoint-STEP every N steps (0 = off)"},
        {"save-total-limit", ARG_STR, &f.save_limit, NULL, false, "keep only the newest N checkpoints (0 = all)"},
        {"eval-interval", ARG_STR, &f.eval_interval, NULL, false, "evaluate every N steps (0 = off)"},
        {"eval-iters", ARG_STR, &f.eval_iters, NULL, false, "evaluation batches (0 = the whole eval set)"},
        {"resume", ARG_STR, &f.resume, NULL, false, "auto (OUT/latest, if any) or a checkpoint folder"},
        {"log-every", ARG_STR, &f.log_every, NULL, false, "print a line every N steps when not on a terminal (steps_per_print)"},
        {"log", ARG_STR, &f.log, NULL, false, "auto, progress, plain or quiet (default auto: progress line on a terminal)"},
        {"peak-gflops", ARG_STR, &f.peak, NULL, false, "matmul peak for MFU (default: env CLLM_PEAK_GFLOPS or measured)"},
        {"max-shard-size", ARG_STR, &f.shard, NULL, false, "shard saved safetensors (e.g. 2GB); 0 = one file"},
        {"save-expert-layout", ARG_STR, &f.expert_layout, NULL, false,
         "per-expert (default) or fused (transformers 5.x): a Mixtral's expert tensors in the saved model"},
        {"sync-save", ARG_FLAG, &f.sync_save, NULL, false, "write checkpoints on the training thread (async_save false)"},
        {"grad-ckpt", ARG_FLAG, &f.grad_ckpt, NULL, false,
         "activation checkpointing: recompute block activations in backward (use_grad_ckpt; docs/memory.md)"},
        {"task", ARG_STR, &f.task, NULL, false,
         "lm (language modelling, default), dpo or reward (preference pairs), ppo (docs/alignment.md)"},
        {"ref-model", ARG_STR, &f.ref_model, NULL, false,
         "dpo, ppo: reference model folder (dpo.ref_model, ppo.ref_model; default: --model, or with LoRA for ppo the base without adapters)"},
        {"beta", ARG_STR, &f.beta, NULL, false, "dpo: beta (dpo.beta; default 0.1)"},
        {"loss-type", ARG_STR, &f.loss_type, NULL, false, "dpo: sigmoid, ipo, hinge or robust (dpo.loss_type; default sigmoid)"},
        {"label-smoothing", ARG_STR, &f.smoothing, NULL, false, "dpo: label smoothing in [0, 0.5) (dpo.label_smoothing; default 0)"},
        {"reference-free", ARG_FLAG, &f.reference_free, NULL, false, "dpo: no reference model (dpo.reference_free)"},
        {"precompute-ref-log-probs", ARG_FLAG, &f.precompute, NULL, false,
         "dpo: the reference's log-probabilities of the data once before training, then the model freed "
         "(dpo.precompute_ref_log_probs)"},
        {"reward-model", ARG_STR, &f.reward_model, NULL, false,
         "ppo: reward model folder scoring the rollouts (ppo.reward_model; a `--task reward` output)"},
        {"rollouts", ARG_STR, &f.rollouts, NULL, false,
         "ppo: fixed rollouts (JSONL of query/response ids and scores) instead of generated ones (ppo.rollouts)"},
        {"init-kl-coef", ARG_STR, &f.kl_coef, NULL, false, "ppo: initial KL coefficient (ppo.init_kl_coef; default 0.2)"},
        {"ppo-epochs", ARG_STR, &f.ppo_epochs, NULL, false, "ppo: passes over each rollout batch (ppo.ppo_epochs; default 4)"},
        {"center-rewards-coefficient", ARG_STR, &f.center, NULL, false,
         "reward: weight of trl's centring term mean((r_c + r_r)^2) (reward.center_rewards_coefficient; default none)"},
        {"heartbeat-timeout", ARG_STR, &f.heartbeat, NULL, false,
         "under mpirun: seconds without a heartbeat before a rank counts as hung and the job ends "
         "(heartbeat_timeout; default 30; 0 = off; env CLLM_HEARTBEAT_TIMEOUT wins)"},
        {"lora-r", ARG_STR, &f.lora_r, NULL, false, "LoRA: train rank-r adapters on a frozen base (lora.r; default 8; docs/lora.md)"},
        {"lora-alpha", ARG_STR, &f.lora_alpha, NULL, false, "LoRA: scale numerator, scale = alpha / r (lora.lora_alpha; default 8)"},
        {"lora-dropout", ARG_STR, &f.lora_dropout, NULL, false, "LoRA: dropout on the adapters' input (lora.lora_dropout; default 0)"},
        {"lora-target", ARG_STR, &f.lora_target, NULL, false,
         "LoRA: modules such as q_proj,v_proj, a regular expression or all-linear (lora.target_modules; default: "
         "PEFT's per architecture)"},
        QUANT_FLAG_SPECS(f.quant),
        {"adapter", ARG_STR, &f.adapter, NULL, false, "LoRA: continue training this PEFT adapter folder (adapter)"},
        {"freeze", ARG_LIST, &f.freeze, NULL, false,
         "regular expressions searched in the tensor names (e.g. embed wte '^model\\.layers\\.[0-5]\\.'): those "
         "tensors stay frozen, without gradient or optimizer state (freeze; docs/training.md#freezing-tensors)"},
        {"unfrozen-parameters", ARG_LIST, &f.unfrozen, NULL, false,
         "the inverse of --freeze, axolotl's rule: patterns matched from the start of the names (\".\" literal) "
         "name the tensors that train, every other is frozen (unfrozen_parameters)"},
        {"strict", ARG_FLAG, &f.strict, NULL, false, "unknown config keys are errors instead of warnings"},
        {"print-config", ARG_FLAG, &f.print_config, NULL, false, "print the resolved config as JSON and exit"},
    };
    int rc = args_parse("train", "Trains a model (DeepSpeed-style config, checkpoints, resume, evaluation).", argc,
                        argv, specs, ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_train_config cfg;
    memset(&cfg, 0, sizeof cfg);
    json_t *j = NULL;
    const char *where = f.config ? f.config : "command line";
    if (f.config) {
        if (cllm_json_load_file(&j, f.config)) {
            rc = tool_fail("train");
            goto done;
        }
    } else {
        /* the minimal loop: flags only, with its historical defaults */
        if (!f.print_config && (!f.model || !f.data || !f.out || !f.steps)) {
            fprintf(stderr, "cllm train: without --config, --model, --data, --out and --steps are required "
                            "(see cllm train --help)\n");
            rc = 2;
            goto done;
        }
        j = json_pack("{sisisfsi}", "train_batch_size", 8, "steps_per_print", 1, "gradient_clipping", 0.0,
                      "save_interval", 0);
        json_object_set_new(sub_object(j, "data"), "seq_len", json_integer(128));
        if (!f.batch && !f.micro && !f.accum) json_object_set_new(j, "train_micro_batch_size_per_gpu", json_integer(8));
    }
    if ((rc = check_blocks(j, where)) || (rc = apply_flags(j, &f))) {
        json_decref(j);
        goto done;
    }
    cllm_status st = cllm_train_config_parse(&cfg, j, where, f.strict);
    j = NULL; /* owned by cfg now */
    if (st) {
        rc = st == CLLM_ERR_ARG ? 2 : tool_fail("train");
        if (rc == 2) fprintf(stderr, "cllm train: %s\n", cllm_last_error());
        goto done;
    }
    cfg.resume = f.resume;
    if (f.print_config) {
        if (cllm_train_config_resolve(&cfg, 0)) {
            fprintf(stderr, "cllm train: %s\n", cllm_last_error());
            rc = 2;
            goto done;
        }
        json_t *out = cllm_train_config_to_json(&cfg);
        char *s = json_dumps(out, JSON_INDENT(2));
        if (s) printf("%s\n", s);
        free(s);
        json_decref(out);
        goto done;
    }
    if (!cfg.output_dir) {
        fprintf(stderr, "cllm train: no output folder: set output_dir or --out\n");
        rc = 2;
        goto done;
    }
    /* under mpirun: one rank of the data-parallel world; ranks > 0 are quiet */
    cllm_dist_set_heartbeat_timeout(cfg.heartbeat_timeout);
    if (cllm_dist_init()) {
        rc = tool_fail("train");
        goto done;
    }
    if (cllm_dist_rank() > 0) cfg.log = CLLM_LOG_MODE_QUIET;
    tool_signals_arm(on_signal);
    cllm_train_result res;
    test_hooks th;
    if (!hooks_from_env(&th)) {
        rc = 2;
        cllm_dist_abort(rc);
        goto done;
    }
    cllm_train_hooks hooks = {.poison_grads = th.poison ? poison_from_env : NULL,
                              .ctx = &th,
                              .in_step = th.slow_rank >= 0 ? slow_from_env : NULL};
    if (cllm_train_run(&cfg, th.poison || th.slow_rank >= 0 ? &hooks : NULL, &res)) {
        if (cllm_dist_active()) fprintf(stderr, "cllm train: rank %d of %d failed\n", cllm_dist_rank(), cllm_dist_size());
        rc = tool_fail("train");
        /* the other ranks may be waiting in a collective: end them too */
        cllm_dist_abort(rc);
        goto done;
    }
    if (cfg.log != CLLM_LOG_MODE_QUIET) {
        fprintf(stderr, "cllm train: %s at step %ld (%ld skipped); %d checkpoint%s, training blocked %.3f s on saves",
                res.stopped ? "stopped" : "done", res.last_step, res.skipped, res.n_saves, res.n_saves == 1 ? "" : "s",
                res.save_seconds);
        if (cfg.async_save && res.n_saves) fprintf(stderr, " (background writes %.3f s)", res.async_write_seconds);
        fprintf(stderr, "\ncllm train: wrote %s\n", cfg.output_dir);
    }
done:
    cllm_dist_finalize();
    cllm_train_config_free(&cfg);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
