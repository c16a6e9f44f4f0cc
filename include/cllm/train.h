/*
 * cllm train: the training engine behind `cllm train`.
 *
 * A run is described by a cllm_train_config: DeepSpeed's config keys (batch
 * sizes, gradient_clipping, optimizer, scheduler, fp16/bf16,
 * zero_optimization, steps_per_print, wall_clock_breakdown) plus cllm's own
 * (model, data, train_iters, eval/save intervals, output_dir...). The config
 * is parsed from JSON (a file, with command-line overrides merged into the
 * same JSON object first), then resolved: "auto" values are filled in and
 * the batch sizes are made consistent with the data-parallel size.
 * docs/training.md lists every key with its default.
 *
 * One optimizer step is: read the local micro-batches (sample g of the
 * stream for row i of rank r at step s is g = s * train_batch_size +
 * r * local_batch + i), count their targets, run forward+backward on each
 * with grad_scale = 1 / (targets of the whole global batch), (reduce hook),
 * clip by the global norm, and update the parameters. Non-finite loss or
 * gradients skip the update.
 *
 * Not thread-safe: one run per process at a time (the stop flag is global).
 */
#ifndef CLLM_TRAIN_H
#define CLLM_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/objective.h"
#include "cllm/optim.h"
#include "cllm/pipe.h"
#include "cllm/schedule.h"
#include "cllm/topo.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t;

typedef enum { CLLM_LOG_MODE_AUTO = 0, CLLM_LOG_MODE_PROGRESS, CLLM_LOG_MODE_PLAIN, CLLM_LOG_MODE_QUIET } cllm_log_mode;

/* Where an offload block puts its data ("device"). */
typedef enum { CLLM_OFFLOAD_NONE = 0, CLLM_OFFLOAD_CPU, CLLM_OFFLOAD_NVME } cllm_offload_device;

/* zero_optimization.offload_optimizer and zero_optimization.offload_param.
 * The keys pin_memory, max_in_cpu, pipeline_read, pipeline_write, fast_init
 * and ratio are accepted without effect. */
typedef struct {
    cllm_offload_device device; /* "device": "none" (default) or "cpu" keep the data in RAM; "nvme"
                                   keeps it in a file under nvme_path */
    const char *nvme_path;      /* "nvme_path": a folder; required with device "nvme" (borrowed from
                                   cllm_train_config.json), else NULL */
    long buffer_count;          /* "buffer_count": slots of the offload stream, default 4; with
                                   device "nvme" 3..64 (offload_optimizer only) */
    long buffer_size;           /* "buffer_size": floats per state per slot, default 1048576, >= 1
                                   (offload_optimizer only) */
} cllm_offload_config;

/* zero_optimization. The other DeepSpeed keys of the block (contiguous_gradients,
 * reduce_scatter, round_robin_gradients, sub_group_size, ...) are accepted
 * without effect; docs/distributed.md. */
typedef struct {
    int stage;                       /* "stage": 0 (default), 1, 2 or 3 */
    size_t reduce_bucket_size;       /* "reduce_bucket_size": elements per gradient reduction,
                                        default 5e8, >= 1 (integers or whole floats such as 5e8;
                                        at most 1e15; calls larger than 2^30 are split) */
    size_t allgather_bucket_size;    /* "allgather_bucket_size": elements per parameter gather,
                                        default 5e8, same range */
    bool overlap_comm;               /* "overlap_comm": reduce during the backward pass (default false) */
    double stage3_param_persistence_threshold; /* elements: smaller tensors stay whole on every
                                                  rank at stage 3; default 1e5, >= 0 */
    double stage3_prefetch_bucket_size; /* elements, default 5e7, >= 0; stored, no effect */
    double stage3_max_live_parameters;  /* elements, default 1e9, >= 0; stored, no effect */
    cllm_offload_config offload_optimizer; /* "offload_optimizer": any stage */
    cllm_offload_config offload_param;     /* "offload_param": device "nvme" needs stage 3 */
    /* ZeRO++ (stage 3 over several ranks; the start-up log says which are active) */
    bool quantized_weights;          /* "zero_quantized_weights": int8 blocks in the parameter all-gather */
    bool quantized_gradients;        /* "zero_quantized_gradients": int8 blocks in the gradient reduce-scatter */
    long hpz_partition_size;         /* "zero_hpz_partition_size": default 1; > 1: secondary partition (hpZ) */
} cllm_zero_config;

/* The keys whose value was the string "auto" (HF Trainer's placeholder),
 * bits of cllm_train_config.auto_keys. The parser stores the default for
 * such a key; cllm_train_config_resolve is the one place that gives "auto"
 * values their meaning (see there). Keys not listed here treat "auto" as
 * "not given". */
enum {
    CLLM_AUTO_TRAIN_BATCH_SIZE = 1u << 0,
    CLLM_AUTO_MICRO_BATCH_SIZE = 1u << 1,
    CLLM_AUTO_GRADIENT_ACCUMULATION = 1u << 2,
    CLLM_AUTO_WARMUP_NUM_STEPS = 1u << 3,     /* scheduler.params.warmup_num_steps: 0 */
    CLLM_AUTO_TOTAL_NUM_STEPS = 1u << 4,      /* scheduler.params.total_num_steps: train_iters */
    CLLM_AUTO_REDUCE_BUCKET_SIZE = 1u << 5,   /* zero_optimization.*: DeepSpeed's defaults today */
    CLLM_AUTO_PREFETCH_BUCKET_SIZE = 1u << 6,
    CLLM_AUTO_PERSISTENCE_THRESHOLD = 1u << 7,
};

/* model_topo: how the ranks of a job split into pipeline stages, data-
 * parallel replicas and tensor-parallel groups (docs/distributed.md). */
typedef struct {
    bool given;                 /* model_topo present */
    cllm_topo_layout layout;    /* "process_topology": {"axis": [...], "dims": [...]}, checked against
                                   the world when training starts; absent: every rank on the data axis */
    cllm_topo_parts parts;      /* "parts": stage sizes, "uniform" or "parameters" (default) */
    cllm_pipe_schedule schedule;/* "schedule": "1f1b" (default) or "gpipe" */
} cllm_model_topo;

/* model as an init spec: {"arch", "preset", "set": {...}, "seed"}. */
typedef struct {
    cllm_arch arch;         /* "arch": "gpt2", "llama" or "bloom" */
    const char *preset;     /* "preset": a size of that architecture (cllm_model_preset) */
    struct json_t *set;     /* "set": model config.json keys over the preset (an object; they are
                               the model's keys, checked by the model config reader), or NULL */
    bool has_seed;          /* "seed" given: the initialisation seed, else the run's seed */
    uint64_t seed;
} cllm_model_init_spec;

/* A training config as parsed: each field names its key, its default and
 * the range the parser accepts (values outside it fail naming the key). */
typedef struct {
    /* ---- DeepSpeed keys ---- */
    long train_batch_size;               /* global samples per optimizer step; >= 1; 0 = not given
                                            (cllm_train_config_resolve works it out) */
    long train_micro_batch_size_per_gpu; /* samples per forward/backward on one rank; >= 1; 0 = not given */
    long gradient_accumulation_steps;    /* micro-batches per step on one rank; >= 1; 0 = not given */
    double gradient_clipping;            /* max global L2 norm; >= 0; default 0 = off */
    cllm_optim_params optim;             /* optimizer.type (default AdamW) / optimizer.params: lr
                                            (1e-3), betas ([0.9, 0.999], each in [0, 1)), eps (1e-8),
                                            weight_decay (0), momentum, dampening (0), nesterov
                                            (false); numbers >= 0. optim.lr is the run's one
                                            learning rate: the schedule scales it, and an "auto"
                                            peak of the schedule is this value */
    const char *optimizer_name;          /* optimizer.type as written ("Adam", "AdamW", "Lion", "SGD") */
    bool adam_w_mode;                    /* optimizer.params.adam_w_mode (DeepSpeed Adam): decoupled
                                            weight decay; default true */
    cllm_sched_params sched;             /* scheduler.type (default "constant") / scheduler.params,
                                            with cllm_sched_defaults (cllm/schedule.h) */
    bool fp16_enabled, bf16_enabled;     /* fp16.enabled / bf16.enabled: default false, not both;
                                            fp16 brings loss scaling (cllm/loss_scale.h) */
    double fp16_loss_scale;              /* fp16.loss_scale: >= 0; default 0 = dynamic */
    int fp16_initial_scale_power;        /* fp16.initial_scale_power: >= 0; default 16 */
    int fp16_loss_scale_window;          /* fp16.loss_scale_window: >= 1; default 1000 */
    int fp16_hysteresis;                 /* fp16.hysteresis: >= 1; default 2 */
    double fp16_min_loss_scale;          /* fp16.min_loss_scale: >= 0; default 1 */
    bool fp16_consecutive_hysteresis;    /* fp16.consecutive_hysteresis: refill the hysteresis on
                                            every clean step; default false */
    cllm_dtype comm_dtype;               /* communication_data_type: gradient sums over ranks in
                                            CLLM_F32 ("fp32", default), CLLM_BF16 ("bf16") or
                                            CLLM_F16 ("fp16") */
    cllm_zero_config zero;               /* zero_optimization */
    long steps_per_print;                /* steps_per_print: >= 1; default 10 */
    bool wall_clock_breakdown;           /* wall_clock_breakdown: default false; stored */
    bool use_grad_ckpt;                  /* use_grad_ckpt: activation checkpointing, default false
                                            (also set by an enabling activation_checkpointing
                                            block); docs/memory.md */
    bool sequence_parallel;              /* sequence_parallel: Megatron's sequence parallelism over
                                            the tensor ranks (norms, residual adds and the embedding
                                            output split along the sequence; all-gather / reduce-
                                            scatter instead of all-reduce); needs a tensor axis > 1
                                            dividing seq_len; default false; docs/distributed.md */
    cllm_model_topo model_topo;          /* model_topo */
    unsigned auto_keys;                  /* CLLM_AUTO_* bits: keys given as "auto" */

    /* ---- cllm keys ---- */
    const char *model_dir;               /* model as a string: an HF folder; NULL otherwise */
    bool has_model_init;                 /* model is an init spec (model_init) */
    cllm_model_init_spec model_init;
    const char *data_train;              /* data as a string, or data.train: the training data */
    const char *data_eval;               /* data.eval: evaluation data, or NULL */
    const char *tokenizer;               /* data.tokenizer: for raw text, or NULL (the model's) */
    const char *splits;                  /* data.splits: "950,30,20" weights, or NULL */
    int seq_len;                         /* data.seq_len: >= 2; default 128 */
    int skip_bad;                        /* data.skip_bad: bad records of raw files tolerated; >= 0;
                                            default 0 */
    long train_iters;                    /* train_iters: optimizer steps of the run; >= 0; default
                                            0 = from epochs */
    double epochs;                       /* epochs: >= 0; used when train_iters is 0 */
    long eval_interval, eval_iters;      /* eval_interval / eval_iters: >= 0; default 0 / 0
                                            (eval_iters 0 = the whole eval set) */
    long save_interval, save_total_limit;/* save_interval / save_total_limit: >= 0; default 0 =
                                            no periodic saves / keep all */
    const char *output_dir;              /* output_dir: default NULL (--out) */
    uint64_t seed;                       /* seed: >= 0; default 42 */
    bool shuffle;                        /* shuffle: default true */
    cllm_log_mode log;                   /* log: "auto" (default), "progress", "plain", "quiet" */
    bool decay_skip_bias, decay_skip_norm; /* weight_decay_skip: true / false, or a list of "bias",
                                              "norm"; default true (both skipped) */
    int max_consecutive_skips;           /* max_consecutive_skips: stop after this many non-finite
                                            steps in a row; >= 1; default 10 */
    double peak_gflops;                  /* peak_gflops: >= 0; default 0 = measure at start-up */
    size_t max_shard_bytes;              /* max_shard_size: bytes >= 0 or a size such as "2GB";
                                            default 0 = one file */
    bool async_save;                     /* async_save: write checkpoints on a background thread;
                                            default true */
    bool save_final_checkpoint;          /* save_final_checkpoint: also write checkpoint-STEP at
                                            the end; default true */
    const char *task;                    /* task: "lm" (default; language modelling), "dpo" or
                                            "reward" (preference pairs, docs/alignment.md) */
    cllm_reward_params reward;           /* reward: {"center_rewards_coefficient" (>= 0; 0 = none)}:
                                            trl's RewardConfig name */
    cllm_dpo_params dpo;                 /* dpo: {"beta" (> 0, 0.1), "loss_type" ("sigmoid", "ipo",
                                            "hinge", "robust"), "label_smoothing" ([0, 0.5), 0),
                                            "reference_free" (false)}: trl's DPOConfig names */
    const char *ref_model_dir;           /* dpo.ref_model / ppo.ref_model: the reference model's HF
                                            folder; default NULL = the starting model's folder (with
                                            LoRA, PPO's default is the base without adapters) */
    cllm_ppo_params ppo;                 /* ppo: trl's PPOConfig names (cllm/objective.h,
                                            docs/alignment.md) */
    int ppo_mini_batch_size;             /* ppo.mini_batch_size: rollouts per step per rank; 0 = unset
                                            (must equal the rows each rank trains on per step) */
    const char *reward_model_dir;        /* ppo.reward_model: the reward model's folder */
    const char *ppo_rollouts;            /* ppo.rollouts: fixed rollouts (JSONL) instead of generated ones */
    double heartbeat_timeout;            /* heartbeat_timeout: seconds without a heartbeat after
                                            which a rank counts as hung and the job ends
                                            (cllm_dist_set_heartbeat_timeout); >= 0; default 30;
                                            0 = no heartbeat. CLLM_HEARTBEAT_TIMEOUT overrides it */
    cllm_lora_config lora;               /* lora: PEFT LoraConfig keys (cllm/lora.h, docs/lora.md);
                                            lora.enabled when the section is present. The base is then
                                            frozen and only the adapters (and modules_to_save, biases)
                                            train */
    cllm_bnb_config quant;               /* quantization: transformers' BitsAndBytesConfig keys
                                            (cllm/quant.h, docs/lora.md#qlora); quant.enabled: the
                                            base's linear layers stay in 8 or 4 bits (QLoRA; with
                                            "lora" or "adapter" only) */
    const char *adapter_dir;             /* adapter: a PEFT adapter folder to continue training
                                            (its own adapter_config.json; not with a "lora" section) */
    const char **freeze;                 /* freeze: regular expressions searched in the tensor names
                                            (cllm_model_freeze); the matching tensors get no gradient
                                            or optimizer state; not with LoRA. [n_freeze], strings
                                            borrowed from json. Or unfrozen_parameters (axolotl's):
                                            the tensors that train, all others frozen
                                            (cllm_model_freeze_except; freeze_except set) */
    int n_freeze;
    bool freeze_except;
    struct {                             /* moe: mixture-of-experts training (docs/moe.md), DeepSpeed-
                                            MoE's names (Megatron's accepted as aliases) */
        bool given;                      /* the section is present */
        int expert_parallel_size;        /* (expert_model_parallel_size) ranks that split each block's
                                            experts; divides the ranks and the experts; default 1. At
                                            ZeRO 0-2 each rank holds its own experts only */
        double capacity_factor;          /* (moe_expert_capacity_factor) training capacity factor;
                                            default 1.0 with the section, no limit without */
        double eval_capacity_factor;     /* in train-time evaluation; default 1.0 */
        int min_capacity;                /* default 4 */
        bool drop_tokens;                /* false: no capacity limit at all; default true */
    } moe;
    cllm_expert_layout save_expert_layout; /* save_expert_layout: "per-expert" (default) or "fused"
                                            (transformers 5.x): a Mixtral's expert tensors in the
                                            saved model; checkpoints stay per-expert (docs/moe.md) */
    const char *resume;                  /* not a key (--resume): NULL, "auto" or a checkpoint folder */
    int dp_size, dp_rank;                /* data-parallel world: set by cllm_train_run from cllm_dist
                                          * (1, 0 without MPI); ranks > 0 write no files */

    struct json_t *json;                 /* the merged JSON this was parsed from (owned) */
} cllm_train_config;

/* Parses a config object (DeepSpeed + cllm keys). `j` is taken over (the
 * config keeps the reference and frees it in cllm_train_config_free); `path`
 * names the source in messages. Unknown keys are reported by name: a warning
 * each, or CLLM_ERR_ARG for the first one when `strict`. Wrong types and
 * out-of-range values fail with CLLM_ERR_ARG and a message naming `path`,
 * the full key path and the value ("run.json: zero_optimization.
 * offload_param.device: expected \"cpu\", \"nvme\" or \"none\", got 5").
 * Every key is read here: nothing reads `j` afterwards (strings in cfg are
 * borrowed from it). Does not resolve batch sizes. */
cllm_status cllm_train_config_parse(cllm_train_config *cfg, struct json_t *j, const char *path, bool strict);

/* Resolves the batch-size triple against cfg->dp_size (DeepSpeed's rules:
 * any two determine the third; only train_batch_size or only the micro
 * batch size means no accumulation; "auto" counts as absent), scheduler
 * total_num_steps from the run length, and checks the result. An
 * inconsistent triple fails with the arithmetic written out. n_samples is
 * the training set size (used when the run length is given in epochs; 0 if
 * unknown). */
cllm_status cllm_train_config_resolve(cllm_train_config *cfg, uint64_t n_samples);

/* The resolved config as a new JSON object (DeepSpeed key names). */
struct json_t *cllm_train_config_to_json(const cllm_train_config *cfg);

/* 64-bit FNV-1a over the keys that change the training math (optimizer,
 * schedule, batch sizes, seq_len, seed, data), stored in checkpoints. */
uint64_t cllm_train_config_hash(const cllm_train_config *cfg);

void cllm_train_config_free(cllm_train_config *cfg);

/* Hooks for tests and for the data-parallel work. All optional. */
typedef struct {
    /* Called after the backward pass of each step (1-based); returning true
     * poisons the gradients with a NaN (tests of the non-finite path). */
    bool (*poison_grads)(long step, void *ctx);
    void *ctx;
    /* Called inside each step (1-based), after the forward and backward
     * passes and before the gradient reduction; tests make one rank slow
     * there (a step longer than the heartbeat timeout). */
    void (*in_step)(long step, void *ctx);
} cllm_train_hooks;

/* What a run did, for the front end. */
typedef struct {
    long first_step, last_step; /* steps run by this process */
    long skipped;               /* non-finite steps skipped */
    bool stopped;               /* stopped by cllm_train_request_stop */
    double save_seconds;        /* time the training loop waited for checkpoints */
    double async_write_seconds; /* background write time */
    int n_saves;
} cllm_train_result;

/* Runs training as configured (cfg must be resolved against the data
 * later inside: the run opens model and data, then resolves). Writes
 * metrics.jsonl, checkpoints and the final model into cfg->output_dir.
 * Returns CLLM_OK at the end of the run or after a requested stop (a
 * checkpoint is then written first). Under MPI (cllm/dist.h, initialised by
 * the caller) every rank calls it with the same config: each reads its rows
 * of the global batch, gradients are summed over ranks, ZeRO stages 1-2
 * partition the optimizer state (and at stage 2 the summed gradient), and
 * only rank 0 writes files. docs/distributed.md. */
cllm_status cllm_train_run(cllm_train_config *cfg, const cllm_train_hooks *hooks, cllm_train_result *res);

/* Asks a running cllm_train_run to save a checkpoint and return at the end
 * of the current step. Callable from any thread, and async-signal-safe (a
 * lock-free atomic store). A program that calls it from a signal handler
 * must keep the handler off the threads that compute: oneDNN's sgemm
 * kernels run with the stack pointer inside a heap buffer, where the
 * handler's frame would be written. `cllm train` blocks SIGINT/SIGTERM in
 * every thread and takes them on a thread of its own. */
void cllm_train_request_stop(void);

/* Writes an SVG plot (training loss with eval loss points, and the learning
 * rate in a second panel; for a mixture of experts each expert's share of
 * the routed choices per step in a third) of metrics.jsonl records to
 * svg_path. */
cllm_status cllm_train_plot(const char *metrics_path, const char *svg_path);

/* Measures fp32 GEMM throughput with cllm_matmul for about `seconds`;
 * returns GFLOP/s (0 on failure). */
double cllm_train_measure_peak_gflops(double seconds);
/* The same for the bf16 GEMM (cllm_matmul_bf16, 1024^3: AMX needs larger
 * shapes than fp32 to approach its peak); the MFU base of bf16 runs. */
double cllm_train_measure_peak_gflops_bf16(double seconds);
/* "bf16 gemm fp32-widened on avx2 (AMD EPYC ...)": the GEMM path a run of
 * that precision takes and the CPU, for start-up logs. Static string. */
const char *cllm_train_gemm_summary(bool bf16);

#ifdef __cplusplus
}
#endif
#endif
