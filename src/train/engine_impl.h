/*
 * The trainer's state, shared by the training loop (engine.c) and its
 * reporting (report.c: progress line, metrics records).
 */
#ifndef CLLM_TRAIN_ENGINE_IMPL_H
#define CLLM_TRAIN_ENGINE_IMPL_H

#include "cllm/checkpoint.h"
#include "cllm/loader.h"
#include "cllm/model.h"
#include "cllm/objective.h"
#include "offload.h"
#include "train_impl.h"

typedef struct train_exec_mode train_exec_mode;
typedef struct train_state_mode train_state_mode;

typedef struct {
    cllm_train_config *cfg;
    const train_exec_mode *exec;   /* how the micro-batches run (step_modes.c) */
    const train_state_mode *smode; /* where gradients and optimizer state live (step_modes.c) */
    const cllm_train_hooks *hooks;
    cllm_model *m;
    cllm_objective *obj;    /* what a step minimises (src/tasks/); the loop does not know which */
    bool pairs;             /* task "dpo", "reward": rows come in (chosen, rejected) pairs; counts are pairs */
    float *margins;         /* [local / 2] pairs: each pair's margin (the reward objective reads them) */
    cllm_loader *train, *eval;
    cllm_optimizer *opt;
    cllm_param_range *ranges;
    int n_ranges;
    int32_t *tokens, *labels, *targets; /* [local, T] */
    long local;                         /* rows per step on this rank */
    train_saver *saver;
    train_metrics metrics;
    cllm_ckpt_state state;
    double flops_per_step, peak_gflops;
    bool profile;  /* CLLM_PROFILE=1: per-phase seconds of each step in metrics.jsonl */
    bool progress; /* \r line on a terminal */
    bool line_open;
    long last_save_step, last_eval_step;
    size_t act_bytes; /* activation buffer of the model */
    double save_wait_total, time_save_pending;
    int n_saves;
    train_zero zero;        /* data parallelism: slices, buckets, memory */
    bool fp16;              /* fp16.enabled: loss scaling (fp16_step.c) */
    cllm_loss_scaler scaler;
    train_offload *offload; /* optimizer state in a file (offload_optimizer nvme), or NULL */
    train_shard *shard;     /* ZeRO 2-3: per-layer reduction, partitioned parameters (zero3.c); else NULL */
    double comm_seconds;    /* stages 0-1: time in the gradient reduction and parameter all-gather */
    train_overlap *overlap; /* stages 0-1 with overlap_comm: reductions started during the backward */
    bool ckpt_ok;           /* this layout can write checkpoints */
    cllm_topo topo;         /* pipe x data x tensor */
    train_pipe *pipe;       /* pipeline parallelism: this rank's stage (NULL without) */
    cllm_dist_group *data_grp; /* with a pipeline: the ranks of this stage (NULL: the world) */
    train_tp *tp;           /* tensor parallelism: groups and the whole model (NULL without) */
    size_t base;            /* start of this rank's stage in the flat buffers (0 without a pipeline) */
    const char *output_dir; /* the caller's, restored at the end (ranks > 0 write nothing) */
    /* Mixtral: this rank's load-balancing loss of the step, times counted
     * targets, summed over its micro-batches (for metrics.jsonl) */
    double moe_aux_sum;
    long moe_aux_count;
    /* mixture of experts (moe_train.c): the expert-parallel group, and the
     * step's counters summed over every rank: [E] choices per expert, then
     * dropped, all choices, all-to-all bytes (all ranks), rank 0's seconds */
    cllm_dist_group *ep_grp;
    /* sliced experts (ZeRO 0-1 under expert parallelism): tr->m is this
     * rank's part (its own experts only); edp_grp the ranks holding the same
     * experts (ZeRO's group); shared the flat-buffer ranges of the tensors
     * every rank holds (non-expert), summed over ep_grp before ZeRO's sum */
    bool ep_sliced;
    cllm_dist_group *edp_grp;
    cllm_param_range *ep_shared;
    int n_ep_shared;
    double *moe_step;
    double a2a_bytes0, a2a_sec0;
} trainer;

/* step_modes.c: the parts of a step that differ by layout. */
struct train_exec_mode {
    const char *name;
    void (*zero_grads)(trainer *tr);
    /* forward + backward of the step's micro-batches; loss sum added */
    cllm_status (*run)(trainer *tr, float scale, double *loss_sum);
    cllm_status (*sync_grads)(trainer *tr, float *grads);   /* after the backward (tied embeddings) */
    cllm_status (*sync_params)(trainer *tr, float *params); /* after the update */
};
struct train_state_mode {
    const char *name;
    void (*zero_grads)(trainer *tr);
    /* the gradient buffer the step reduces, clips and applies; *full: the
     * whole buffer it lies in */
    float *(*grads)(trainer *tr, float **full);
    cllm_status (*reduce)(trainer *tr, float *g);
    cllm_status (*unscale)(trainer *tr, float *g, double scale, bool *overflow);
    cllm_status (*clip)(trainer *tr, float *g, double max_norm, double *norm);
    cllm_status (*update)(trainer *tr, float *g, double lr);
    double (*comm_seconds)(const trainer *tr); /* communication so far, start to completion */
    double (*wait_seconds)(const trainer *tr); /* the part of it the computation waited for */
};
/* lora_train.c: a LoRA run (a "lora" section or "adapter"), the layouts it
 * refuses (pipeline, tensor, ZeRO-3, optimizer offload: a message naming
 * the option), and its adapters on the base model m: a resumed
 * checkpoint's, an adapter folder's, or new ones seeded with c->seed. */
bool train_lora_run(const cllm_train_config *c);
cllm_status train_lora_check_layout(const cllm_train_config *c, bool piped, bool tensor);
/* The same for frozen tensors ("freeze"). */
cllm_status train_freeze_check_layout(const cllm_train_config *c, bool piped, bool tensor);
cllm_status train_lora_attach(cllm_model *m, const cllm_train_config *c, const char *resume_dir);
/* task "reward" with LoRA: a causal LM becomes its reward model before the
 * adapters go on (task_open.c) */
cllm_status train_lora_to_reward(trainer *tr);

/* task_open.c: the objective of task "dpo", "reward" (tr->m becomes a
 * reward model) or "ppo" with its other models, in place of tr->obj;
 * pipeline and tensor parallelism are refused by name. */
cllm_status train_open_dpo(trainer *tr, bool piped, bool tensor);
cllm_status train_open_reward(trainer *tr, bool piped, bool tensor);
cllm_status train_open_ppo(trainer *tr, bool piped, bool tensor);
/* moe_train.c: the "moe" section. setup checks it against the world and
 * the model (errors name the key), makes the expert-parallel groups
 * (consecutive ranks) and the counters; step_begin turns expert
 * parallelism and the training capacity on and resets the counters,
 * step_end (collective) turns them off (train-time evaluation runs with
 * every expert local and eval_capacity_factor; a part with sliced experts
 * stays expert-parallel, evaluating in rank 0's group) and sums the counters;
 * record adds them to the step's metrics record. */
cllm_status train_moe_setup(trainer *tr, bool piped, bool tensor);
/* Sliced experts (tr->ep_sliced): ZeRO's partition over the expert-data
 * group (norm over the expert-parallel group, the non-expert tensors left
 * out of the norm on all but its first rank); the non-expert gradients
 * summed over the expert-parallel group (before ZeRO's sum over the
 * expert-data group completes them to the sum over every rank); the
 * checkpoint and final-model state gathered into the whole model's layout
 * (collective; whole and full buffers only on rank 0) and a whole-layout
 * buffer cut to this rank's part. */
cllm_status train_moe_zero_init(trainer *tr, size_t n);
cllm_status train_moe_gather(trainer *tr, const float *part_buf, cllm_model **whole, float **full_buf);
cllm_status train_moe_step_begin(trainer *tr);
cllm_status train_moe_step_end(trainer *tr);
void train_moe_record(const trainer *tr, train_record *r);
void train_moe_free(trainer *tr);

/* engine_parts.c: checkpoints of tensor-parallel parts (tr->tp) and of
 * sliced experts (tr->ep_sliced). save gathers every rank's part of the
 * parameters and optimizer state into the whole model's layout and rank 0
 * writes a one-process checkpoint (collective over every rank);
 * read_optim cuts this rank's part of each optimizer state out of a
 * checkpoint's whole state and keeps its ZeRO slice in s0 / s1 (either may
 * be NULL). */
cllm_status train_save_tp(trainer *tr);
cllm_status train_tp_read_optim(trainer *tr, const char *dir, float *s0, float *s1);
cllm_status train_save_ep(trainer *tr);
cllm_status train_ep_read_optim(trainer *tr, const char *dir, float *s0, float *s1);

/* Sets tr->exec and tr->smode from the set-up (tr->pipe, tr->shard). */
void train_modes_pick(trainer *tr);

/* report.c */
/* Ends an open progress line (a terminal's \r line) before other output. */
void train_end_line(trainer *tr);
/* The step's progress line: every steps_per_print steps, or a \r line on a
 * terminal; nothing in quiet mode. */
void train_show_step(trainer *tr, long step, double loss, double lr, double gnorm, double tps, double mfu,
                     double avg_step);
/* What one step measured, for its metrics.jsonl record. */
typedef struct {
    long step, count;
    double loss, lr, gnorm, dt, tok, gflops, mfu;
    double t_data, t_fwdbwd, t_optim, comm, comm_wait, loss_scale;
    bool finite;
} train_step_report;
/* The share of communication time the computation did not wait for
 * (overlap_comm): 1 - wait / comm, 0 without communication. */
double train_hidden_fraction(double comm, double wait);
/* Writes the step's metrics.jsonl record (rank 0's output folder). */
cllm_status train_record_step(trainer *tr, const train_step_report *s);
/* CLLM_PROFILE=1 in the environment (1 or 0; anything else is refused by
 * name): times the model's phases (cllm_model_set_profile) for each
 * step's record. */
cllm_status train_profile_init(trainer *tr);
/* Drops what the phases summed outside a step (an evaluation pass). */
void train_profile_begin(trainer *tr);

#endif
