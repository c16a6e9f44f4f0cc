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
#include "cllm/optim.h"
#include "cllm/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t;

typedef enum { CLLM_LOG_MODE_AUTO = 0, CLLM_LOG_MODE_PROGRESS, CLLM_LOG_MODE_PLAIN, CLLM_LOG_MODE_QUIET } cllm_log_mode;

typedef struct {
    /* ---- DeepSpeed keys ---- */
    long train_batch_size;               /* global samples per optimizer step */
    long train_micro_batch_size_per_gpu; /* samples per forward/backward on one rank */
    long gradient_accumulation_steps;    /* micro-batches per step on one rank */
    double gradient_clipping;            /* max global L2 norm; 0 = off */
    cllm_optim_params optim;             /* optimizer.type / optimizer.params, resolved */
    const char *optimizer_name;          /* as written ("Adam", "AdamW", "Lion", "SGD") */
    bool adam_w_mode;                    /* DeepSpeed Adam: decoupled weight decay (default true) */
    cllm_sched_params sched;
    bool fp16_enabled, bf16_enabled;     /* fp16: loss scaling (cllm/loss_scale.h) */
    double fp16_loss_scale;              /* 0 = dynamic */
    int fp16_initial_scale_power, fp16_loss_scale_window, fp16_hysteresis;
    double fp16_min_loss_scale;
    bool fp16_consecutive_hysteresis;    /* refill the hysteresis on every clean step */
    cllm_dtype comm_dtype;               /* communication_data_type: gradient sums over ranks in
                                            CLLM_F32 (default), CLLM_BF16 or CLLM_F16 */
    int zero_stage;                      /* stored for the data-parallel work */
    const char *zero_offload_optimizer, *zero_offload_param; /* device or NULL */
    long steps_per_print;
    bool wall_clock_breakdown;
    bool use_grad_ckpt;                  /* activation checkpointing (also set by an enabling
                                            activation_checkpointing block); docs/memory.md */
    struct json_t *model_topo;           /* stored as given (borrowed from `json`), or NULL */
    struct json_t *zero_optimization;    /* stored as given, or NULL */

    /* ---- cllm keys ---- */
    const char *model_dir;               /* HF folder, or NULL when model_init is used */
    struct json_t *model_init;           /* {"arch","preset","set":{...},"seed"} or NULL */
    const char *data_train, *data_eval, *tokenizer, *splits;
    int seq_len;
    int skip_bad; /* data.skip_bad: bad records of raw files tolerated */
    long train_iters;                    /* total optimizer steps of the run; 0 = from epochs */
    double epochs;                       /* used when train_iters is 0 */
    long eval_interval, eval_iters;      /* eval_iters 0 = the whole eval set */
    long save_interval, save_total_limit;/* 0 = no periodic saves / keep all */
    const char *output_dir;
    uint64_t seed;
    bool shuffle;
    cllm_log_mode log;
    bool decay_skip_bias, decay_skip_norm; /* weight_decay_skip */
    int max_consecutive_skips;           /* stop after this many non-finite steps in a row */
    double peak_gflops;                  /* 0 = measure at start-up */
    size_t max_shard_bytes;
    bool async_save;                     /* write checkpoints on a background thread */
    bool save_final_checkpoint;          /* also write checkpoint-STEP at the end */
    const char *resume;                  /* NULL, "auto" or a checkpoint folder */
    int dp_size, dp_rank;                /* data-parallel world: set by cllm_train_run from cllm_dist
                                          * (1, 0 without MPI); ranks > 0 write no files */

    struct json_t *json;                 /* the merged JSON this was parsed from (owned) */
} cllm_train_config;

/* Parses a config object (DeepSpeed + cllm keys). `j` is taken over (the
 * config keeps the reference and frees it in cllm_train_config_free); `path`
 * names the source in messages. Unknown keys are reported by name: a warning
 * each, or CLLM_ERR_ARG for the first one when `strict`. Wrong types and
 * out-of-range values fail naming the key. Does not resolve batch sizes. */
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
 * of the current step. Async-signal-safe (sets a sig_atomic_t). */
void cllm_train_request_stop(void);

/* Writes an SVG plot (training loss with eval loss points, and the learning
 * rate in a second panel) of metrics.jsonl records to svg_path. */
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
