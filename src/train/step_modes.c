/*
 * The parts of a training step that differ by parallel layout, as two
 * strategy objects the loop (engine.c) calls without knowing which it has:
 *
 *   execution:  how the step's micro-batches run
 *     local      each micro-batch through the objective on this rank
 *                (with overlap_comm, the last one's backward starts the
 *                per-layer all-reduces)
 *     pipeline   the stage schedule of pipe_train.c (GPipe or 1F1B), tied
 *                embeddings kept in step across stages
 *   state:      where gradients and optimizer state live and how they are
 *               reduced, unscaled, clipped and applied
 *     replicated ZeRO 0-1 (zero.c): full gradients reduced after the
 *                backward (or during it, overlap_comm), the optimizer on
 *                this rank's slice, parameters gathered
 *     sharded    ZeRO 2-3 (zero3.c): per-layer reduce-scatters during the
 *                backward, this rank's slices only
 *
 * train_modes_pick() chooses both from the trainer's set-up.
 */
#include <math.h>

#include "cllm/lora.h"
#include "engine_impl.h"

/* ------------------------------------------------------------ execution */

static void local_zero_grads(trainer *tr) { cllm_model_zero_grads(tr->m); }

static cllm_status local_run(trainer *tr, float scale, double *loss_sum) {
    cllm_train_config *c = tr->cfg;
    const int T = c->seq_len, mb = (int)c->train_micro_batch_size_per_gpu;
    tr->moe_aux_sum = 0;
    tr->moe_aux_count = 0;
    cllm_status st = train_moe_step_begin(tr); /* expert parallelism on, counters reset */
    if (st) return st;
    for (long j = 0; j < c->gradient_accumulation_steps; j++) {
        size_t off = (size_t)j * (size_t)mb * (size_t)T;
        if (tr->overlap) train_overlap_arm(tr->overlap, j + 1 == c->gradient_accumulation_steps);
        double s = 0;
        long k = 0;
        cllm_objective_batch b = {tr->tokens + off, tr->targets + off, mb, T,
                                  tr->margins ? tr->margins + (size_t)j * (size_t)mb / 2 : NULL};
        /* LoRA dropout masks: a function of the seed, step, micro-batch and rank (the same after a resume) */
        cllm_lora_set_dropout_key(tr->m, (c->seed * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)tr->state.global_step << 24) ^
                                             ((uint64_t)j << 8) ^ (uint64_t)c->dp_rank);
        if ((st = cllm_objective_run(tr->obj, tr->m, &b, true, scale, &s, &k))) return st;
        *loss_sum += s;
        tr->moe_aux_sum += cllm_model_aux_loss(tr->m) * (double)k;
        tr->moe_aux_count += k;
    }
    return train_moe_step_end(tr);
}

static cllm_status no_sync(trainer *tr, float *buf) {
    (void)tr;
    (void)buf;
    return CLLM_OK;
}

static void pipe_zero_grads(trainer *tr) {
    train_pipe_zero_grads(tr->pipe, cllm_model_grads(tr->m)); /* this stage's parts only */
}

static cllm_status pipe_run(trainer *tr, float scale, double *loss_sum) {
    return train_pipe_run(tr->pipe, tr->m, tr->tokens, tr->targets, scale, loss_sum);
}

/* (at ZeRO-3 the shard sums the tied embedding's gradients and both
 * stages update their copies: zero3.c) */
static cllm_status pipe_sync_grads(trainer *tr, float *grads) {
    return tr->shard ? CLLM_OK : train_pipe_sync_tied_grads(tr->pipe, grads);
}

static cllm_status pipe_sync_params(trainer *tr, float *params) {
    return tr->shard ? CLLM_OK : train_pipe_sync_tied_params(tr->pipe, params);
}

static const train_exec_mode exec_local = {"local", local_zero_grads, local_run, no_sync, no_sync};
static const train_exec_mode exec_pipeline = {"pipeline", pipe_zero_grads, pipe_run, pipe_sync_grads,
                                              pipe_sync_params};

/* ---------------------------------------------------------------- state */

/* ZeRO 0-1: the flat gradient; with a pipeline this rank's partition
 * covers its stage's range, from tr->base. */
static float *rep_grads(trainer *tr, float **full) {
    float *g = cllm_model_grads(tr->m);
    *full = g;
    return g ? g + tr->base : g;
}

static void rep_zero_grads(trainer *tr) { (void)tr; }

static cllm_status rep_reduce(trainer *tr, float *g) {
    if (tr->overlap) return train_overlap_finish(tr->overlap); /* started during the backward pass */
    double t0 = cllm_time_sec();
    cllm_status st = train_zero_reduce_grads(&tr->zero, g);
    tr->comm_seconds += cllm_time_sec() - t0;
    return st;
}

static cllm_status rep_unscale(trainer *tr, float *g, double scale, bool *overflow) {
    return train_fp16_unscale(&tr->zero, g, scale, overflow);
}

static cllm_status rep_clip(trainer *tr, float *g, double max_norm, double *norm) {
    return train_zero_clip(&tr->zero, g, max_norm, norm);
}

static cllm_status rep_update(trainer *tr, float *g, double lr) {
    double t0 = cllm_time_sec();
    cllm_status st = train_zero_step(&tr->zero, tr->opt, cllm_model_trainable_params(tr->m) + tr->base, g, lr);
    tr->comm_seconds += cllm_time_sec() - t0; /* the update is small next to the gather */
    return st;
}

static double rep_comm(const trainer *tr) { return tr->comm_seconds + train_overlap_comm_seconds(tr->overlap); }
static double rep_wait(const trainer *tr) { return tr->comm_seconds + train_overlap_wait_seconds(tr->overlap); }

/* ZeRO 2-3: the shard's own gradient slice. */
static float *shard_grads(trainer *tr, float **full) {
    float *g = train_shard_grads(tr->shard);
    *full = g;
    return g;
}

static void shard_zero_grads(trainer *tr) { train_shard_zero_grads(tr->shard); }

static cllm_status shard_reduce(trainer *tr, float *g) {
    (void)tr;
    (void)g;
    return CLLM_OK; /* reduced layer by layer during the backward pass */
}

static cllm_status shard_unscale(trainer *tr, float *g, double scale, bool *overflow) {
    (void)g;
    return train_shard_unscale(tr->shard, scale, overflow);
}

static cllm_status shard_clip(trainer *tr, float *g, double max_norm, double *norm) {
    (void)g;
    return train_shard_clip(tr->shard, max_norm, norm);
}

static cllm_status shard_update(trainer *tr, float *g, double lr) {
    (void)g;
    return train_shard_step(tr->shard, tr->opt, lr);
}

static double shard_comm(const trainer *tr) { return train_shard_comm_seconds(tr->shard); }
static double shard_wait(const trainer *tr) { return train_shard_wait_seconds(tr->shard); }

static const train_state_mode state_replicated = {"replicated", rep_zero_grads, rep_grads, rep_reduce, rep_unscale,
                                                  rep_clip, rep_update, rep_comm, rep_wait};
static const train_state_mode state_sharded = {"sharded", shard_zero_grads, shard_grads, shard_reduce,
                                               shard_unscale, shard_clip, shard_update, shard_comm, shard_wait};

void train_modes_pick(trainer *tr) {
    tr->exec = tr->pipe ? &exec_pipeline : &exec_local;
    tr->smode = tr->shard ? &state_sharded : &state_replicated;
}
