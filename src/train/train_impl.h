/*
 * Private pieces of the training engine shared by its sources: the metrics
 * file and progress display (metrics.c) and the checkpoint saver with its
 * background thread (saver.c). Not part of the public API.
 */
#ifndef CLLM_TRAIN_IMPL_H
#define CLLM_TRAIN_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cllm/checkpoint.h"
#include "cllm/loss_scale.h"
#include "cllm/dist.h"
#include "cllm/pipe.h"
#include "cllm/topo.h"
#include "cllm/model.h"
#include "cllm/optim.h"
#include "cllm/train.h"

/* ---- metrics.jsonl ---- */
typedef struct {
    FILE *f;
    char *path;
} train_metrics;

/* Opens OUTPUT_DIR/metrics.jsonl for appending. When keep_until_step >= 0
 * (a resumed run), records of later steps (left by a run that went past its
 * last checkpoint) are dropped first, so the file reads as one run. */
cllm_status train_metrics_open(train_metrics *mt, const char *output_dir, long keep_until_step);
/* Appends one record (a JSON object text without newline) and flushes. */
cllm_status train_metrics_write(train_metrics *mt, const char *record);
void train_metrics_close(train_metrics *mt);

/* A small appender for one JSON record: {"k": v, ...}. */
typedef struct {
    char buf[8192];
    size_t len;
} train_record;
void rec_begin(train_record *r);
void rec_num(train_record *r, const char *key, double v); /* null if not finite */
void rec_int(train_record *r, const char *key, long long v);
void rec_bool(train_record *r, const char *key, bool v);
void rec_ints(train_record *r, const char *key, const long long *v, int n); /* a JSON array */
const char *rec_end(train_record *r);

/* ---- checkpoint pieces shared by checkpoint.c and ckpt_shard.c ---- */
struct json_t;
/* trainer_state.json as a new JSON object (NULL when out of memory). */
struct json_t *train_ckpt_state_json(const cllm_ckpt_state *s);
/* Removes a folder of plain files; a missing folder is fine. */
cllm_status train_ckpt_remove_dir(const char *dir);
cllm_status train_ckpt_fsync_dir(const char *dir);
/* Moves the complete OUT/.checkpoint-STEP.tmp to OUT/checkpoint-STEP
 * (replacing one of the same step), syncs OUT, then rewrites OUT/latest and
 * rotates old folders beyond keep_limit (0 = keep all). */
cllm_status train_ckpt_publish(const char *out, long step, long keep_limit);

/* ---- the checkpoint saver ---- */
typedef struct train_saver train_saver;

/* n floats of params and optimizer state. async: copy and write on a thread. */
cllm_status train_saver_init(train_saver **out, size_t n, bool has0, bool has1, bool async);
/* Saves a checkpoint of the current state. With async, first waits for the
 * previous write, copies params and state, and returns; the write happens
 * in the background. *wait_seconds gets the time the caller was blocked. */
cllm_status train_saver_save(train_saver *s, const char *out, const cllm_model *m, const float *params,
                             const float *s0, const float *s1, const cllm_ckpt_state *st, size_t max_shard,
                             long keep, double *wait_seconds);
/* Waits for a pending write; returns its status. */
cllm_status train_saver_wait(train_saver *s, double *wait_seconds);
double train_saver_write_seconds(const train_saver *s); /* total background write time */
void train_saver_free(train_saver *s);

/* ---- data parallelism and ZeRO stages 0-2 (zero.c) ---- */
typedef struct {
    size_t params;        /* bytes of the parameter buffer (whole on every rank) */
    size_t grads;         /* the backward's flat gradient buffer (all stages: see docs/distributed.md) */
    size_t grads_reduced; /* of the summed gradient, what this rank holds: all, or its slice (stage 2) */
    size_t optim;         /* optimizer state: for all parameters (stage 0) or the slice */
    size_t work;          /* stages 2-3: per-group working buffers (gathered params, a group's gradient) */
} train_mem;

typedef struct {
    int rank, size, stage;       /* in the data-parallel group */
    int world;                   /* all ranks */
    const cllm_dist_group *grp;  /* the data-parallel group (NULL: the world) */
    const cllm_dist_group *norm_grp; /* stage 0 with a pipeline: the stages whose norms add up */
    size_t n_total;              /* floats of the whole flat buffer (n: the part this group reduces) */
    size_t n;                    /* floats in the flat buffers */
    size_t base;                 /* where the part starts in the model's flat buffer (a pipeline stage's) */
    size_t begin, end;           /* this rank's slice of them (all of them at stage 0) */
    size_t *counts;              /* [size] slice lengths, in rank order */
    size_t *bucket_counts;       /* [size] scratch: the slices within one bucket */
    size_t bucket, gather_bucket;/* floats per reduction / all-gather call */
    cllm_dtype comm;             /* gradient sums in fp32, bf16 or fp16 (communication_data_type) */
    cllm_param_range *ranges;    /* decay ranges within the slice, slice-relative */
    int n_ranges;
    train_mem mem;
    struct train_offload *offload; /* optimizer state streamed from a file (offload.h), or NULL */
    /* tensor parallelism: ranges (flat-buffer offsets) of replicated tensors
     * that this rank leaves out of the gradient norm (another tensor rank
     * counts them); NULL/0 otherwise */
    cllm_param_range *norm_skip;
    int n_norm_skip;
    /* stage 3 on the flat path (a frozen base's trainable buffer): between an
     * update and the next use each rank holds only its slice of the values
     * (train_zero_gather_values brings them back) */
    bool scattered;
    /* sliced experts (moe_train.c): ranges (offsets relative to base) of the
     * tensors whose gradients are summed over shared_grp (the
     * expert-parallel group) before grp's reduction; NULL/0 otherwise */
    const cllm_dist_group *shared_grp;
    const cllm_param_range *shared;
    int n_shared;
    /* stage 3 in a pipeline with a tied head (train_shard): on the first and
     * the last stage, the pair of them with this data index, and the tied
     * embedding's flat range (absolute) and weight decay; NULL elsewhere */
    const cllm_dist_group *tied_grp;
    size_t tied_at, tied_len;
    bool tied_decay;
} train_zero;

/* Partitions n floats over the world by c->zero.stage, checks the topology;
 * the bucket sizes are c->zero's (capped at 2^30 elements per call). Call
 * train_zero_free also after a failure. */
cllm_status train_zero_init(train_zero *z, const cllm_train_config *c, size_t n, const cllm_param_range *ranges,
                            int n_ranges);
/* The same over a data-parallel group (NULL: the world) for a part of n
 * floats of a flat buffer of n_total; with a pipeline, norm_grp is the pipe
 * group (gradient norms are summed over it at stage 0). The caller passes
 * pointers to the part's start to the functions below, and handles the
 * topology check. */
cllm_status train_zero_init_group(train_zero *z, const cllm_train_config *c, size_t n, size_t n_total,
                                  const cllm_param_range *ranges, int n_ranges, const cllm_dist_group *grp,
                                  const cllm_dist_group *norm_grp);
/* Fills mem.optim from the state buffers the optimizer has. */
void train_zero_count_optim(train_zero *z, cllm_optimizer *opt);
/* Gathers every rank's train_mem; rank 0 prints one line per rank when
 * `print`. Collective: every rank calls it. */
cllm_status train_zero_report(const train_zero *z, bool print);
void train_zero_free(train_zero *z);
/* Floats of the optimizer state this rank keeps. */
size_t train_zero_slice_len(const train_zero *z);
/* Fails on every rank, naming the first rank whose config hash, data size
 * or parameter count differs from rank 0's. */
cllm_status train_zero_check_world(const train_zero *z, uint64_t config_hash, uint64_t data_size);
/* Sums the gradients over ranks (all of them, or this rank's slice). */
cllm_status train_zero_reduce_grads(train_zero *z, float *grads);
/* buf holds elements [b, e) of the part's gradient: its z->shared ranges
 * summed over z->shared_grp in place (nothing without). Collective. */
cllm_status train_zero_presum(const train_zero *z, float *buf, size_t b, size_t e);
/* This rank's share of the squared gradient norm: the sum of squares of
 * slice[end - begin] (the slice's summed gradient) less the replicated
 * tensors another tensor rank counts (norm_skip); never negative. */
double train_zero_norm_sq(const train_zero *z, const float *slice);
/* clip_grad_norm_ with the global norm; *norm before clipping. */
cllm_status train_zero_clip(train_zero *z, float *grads, double max_norm, double *norm);
/* Optimizer update of this rank's slice, then the all-gather of params;
 * at stage 3 (several ranks) no gather: the pages outside the slice are
 * dropped and z->scattered is set. */
cllm_status train_zero_step(train_zero *z, cllm_optimizer *opt, float *params, const float *grads, double lr);
/* Stage 3: the all-gather the last step left out (nothing when the values
 * are whole). Collective; call before the values are read again (the next
 * forward pass, evaluation, the final save). */
cllm_status train_zero_gather_values(train_zero *z, float *params);
/* *flag <- true if it is true on any rank. */
cllm_status train_zero_agree(const train_zero *z, bool *flag);
/* All-gathers params[n] from the slices (allgather_bucket_size calls). */
cllm_status train_zero_gather_params(train_zero *z, float *params);

/* ---- stages 2 and 3: per-layer gradient reduction, partitioned parameters (zero3.c) ---- */
typedef struct train_shard train_shard;

/* Installs the model's layer hooks for z->stage 2 or 3 (call before
 * cllm_model_prepare, so that no flat gradient buffer is allocated). At
 * stage 3 it copies this rank's parameter slice and the replicated small
 * tensors (numel < zero_optimization.stage3_param_persistence_threshold,
 * default 1e5) out of the model and frees the model's flat parameters.
 * ranges are the decay ranges of the part z covers (from z->base: a
 * pipeline stage's layers; the groups and tensors outside it are another
 * stage's). Fills z->mem.
 * train_shard_free also after a failure (removes the hooks). */
cllm_status train_shard_init(train_shard **out, train_zero *z, cllm_model *m, const cllm_train_config *c,
                             const cllm_param_range *ranges, int n_ranges);
void train_shard_free(train_shard *s);
/* Stage 3 with bf16/fp16 matmuls (the model's precision p): allocates a
 * low-precision copy per working parameter buffer, handed to the model with
 * each gathered group (fetch_params_lp), and counts it in z->mem.work.
 * Nothing for fp32 or below stage 3. */
cllm_status train_shard_set_precision(train_shard *s, cllm_precision p);
/* mem.optim: the slice's state plus that of the replicated tensors. */
void train_shard_count_optim(train_shard *s, cllm_optimizer *opt);
/* Zeroes the summed gradient slice (once per optimizer step). */
void train_shard_zero_grads(train_shard *s);
/* This rank's slice of the summed gradient (NULL when the slice is empty). */
float *train_shard_grads(train_shard *s);
/* fp16: finishes the reduction, agrees over ranks whether any gradient of
 * the slice or of the replicated tensors is non-finite (*overflow), and if
 * none is, multiplies them by 1/scale. */
cllm_status train_shard_unscale(train_shard *s, double scale, bool *overflow);
/* Finishes the reduction (replicated tensors' all-reduce) and clips with
 * the global norm; *norm before clipping. */
cllm_status train_shard_clip(train_shard *s, double max_norm, double *norm);
/* Optimizer update of the slice (and the replicated tensors); stage 2 then
 * all-gathers the flat parameters, stage 3 marks gathered groups stale. */
cllm_status train_shard_step(train_shard *s, cllm_optimizer *opt, double lr);
/* Stage 3, after the last step: frees the working buffers, removes the
 * hooks and all-gathers the whole parameters back into the model (for
 * saving; every rank calls it). Nothing at stage 2. */
cllm_status train_shard_gather_model(train_shard *s);
/* Stage 3: on, gathers the whole flat parameters (exact, replicated tensors
 * included) into the model's parameter buffer for a pass outside the layer
 * hooks (PPO's generation on the key/value cache); off frees it again.
 * Collective. No-op below stage 3. */
cllm_status train_shard_lend_params(train_shard *s, bool on);
/* Seconds this object's collectives took so far, each from its start to
 * its completion, and of those the seconds the computation waited for them
 * (the same when the collectives are blocking: without overlap_comm). */
double train_shard_comm_seconds(const train_shard *s);
/* Pipeline with a tied head: whether this stage's copy of the embedding
 * differs (in any bit) from the first stage's (collective over the pair;
 * false elsewhere). */
cllm_status train_shard_tied_check(train_shard *s, bool *differ);
double train_shard_wait_seconds(const train_shard *s);
/* Stage 3 state, for checkpoints of partitioned runs: this rank's
 * parameter slice, floats [z->begin, z->end) of the flat buffer (its
 * optimizer state is the engine's optimizer, of the same length); NULL at
 * stage 2, where the model's flat buffer holds all parameters. Positions of
 * replicated tensors inside the slice are stale: the replicated tensors
 * live whole, back to back (each rounded up to 16 floats, in tensor order),
 * in the buffer train_shard_replicated returns (*n floats, NULL when none),
 * updated by their own optimizer (*opt). */
float *train_shard_param_slice(train_shard *s);
float *train_shard_replicated(train_shard *s, size_t *n, cllm_optimizer **opt);
/* Stage 3 checkpoints: writes the replicated tensors' values and optimizer
 * state (state0/state1: the slice's optimizer buffers, may be NULL) into
 * their places in the rank's slice buffers, which the main update leaves
 * alone, so that the slices are what the sharded writer stores. Nothing
 * below stage 3. */
void train_shard_ckpt_fill(train_shard *s, float *state0, float *state1);
/* Stage 3 resume: the replicated tensors' optimizer state from checkpoint
 * dir (any format), and their optimizer's step count (dir NULL: the count
 * alone, the state having come through train_shard_set_replicated_state). */
cllm_status train_shard_ckpt_load(train_shard *s, const char *dir, long optim_step);
/* Stage 3 resume of a tensor-parallel part: the replicated tensors'
 * optimizer state k (0 or 1) from flat, a state buffer laid out as the
 * model's flat buffer. Nothing below stage 3. */
void train_shard_set_replicated_state(train_shard *s, int k, const float *flat);

/* Bytes this rank received in the parameter gathers and in the gradient
 * reductions of the current step (reset by train_shard_zero_grads and by
 * this call): what the collectives must
 * deliver to it whatever MPI's algorithm (an all-gather: every other part;
 * a reduce-scatter: size - 1 copies of its own part; an all-reduce:
 * 2 (size - 1) / size of the buffer), in the bytes on the wire. */
void train_shard_take_bytes(train_shard *s, uint64_t *params, uint64_t *grads);

/* ---- ZeRO++: quantized collectives at stage 3 (zeropp.c) ---- */
typedef struct train_zpp train_zpp;
/* Which of zero_quantized_weights / _gradients apply (stage 3, > 1 rank);
 * true when any ZeRO++ part does (hpZ too: 1 < H < ranks). */
bool train_zpp_active(const cllm_train_config *c, const train_zero *z, bool *weights, bool *grads);
/* Rank 0's start-up lines: each ZeRO++ key set, active or why not. */
void train_zpp_log(const cllm_train_config *c, const train_zero *z);
/* Buffers for calls of up to max_chunk values; with hpZ the group of H ranks
 * (collective over the world) and the secondary slice. train_zpp_free also
 * after a failure. */
cllm_status train_zpp_init(train_zpp **out, const train_zero *z, const cllm_train_config *c, size_t max_chunk);
void train_zpp_free(train_zpp *q);
bool train_zpp_weights(const train_zpp *q); /* false for NULL */
bool train_zpp_grads(const train_zpp *q);
bool train_zpp_hpz(const train_zpp *q);
size_t train_zpp_hpz_bytes(const train_zpp *q); /* the secondary slice; 0 without hpZ */
/* hpZ: keeps this rank's secondary part of flat range [b, e), gathered
 * whole into buf (a parameter group after its first gather since a step). */
void train_zpp_hpz_keep(train_zpp *q, const float *buf, size_t b, size_t e);
/* hpZ: all-gathers flat range [b, e) into buf from the secondary parts of
 * this rank's group (chunk values per call; blocking). Collective over the
 * group. Adds the bytes received to *bytes. */
cllm_status train_zpp_hpz_gather(train_zpp *q, float *buf, size_t b, size_t e, size_t chunk, size_t *bytes);
/* qwZ, in place: buf[sum(counts)] holds this rank's part at its offset; on
 * return every part holds the dequantized int8 blocks of its owner's values
 * (this rank's too). Adds the bytes received to *bytes. Collective. */
cllm_status train_zpp_gather(train_zpp *q, float *buf, const size_t *counts, size_t *bytes);
/* qgZ: buf[sum(counts)] is this rank's gradient chunk; on return buf[0,
 * counts[rank]) is the sum over ranks of their quantized parts for this
 * rank. Adds the bytes received to *bytes. Collective. */
cllm_status train_zpp_reduce_scatter(train_zpp *q, float *buf, const size_t *counts, size_t *bytes);

/* ---- fp16 loss scaling in the step (fp16_step.c) ---- */
/* Sets the scaler up from the fp16 keys; `resumed` (or NULL) is a restored
 * trainer state whose scaler counters, when saved, are continued. */
cllm_status train_fp16_init(cllm_loss_scaler *s, const cllm_train_config *c, const cllm_ckpt_state *resumed);
/* Copies the scale and counters into the trainer state (checkpoints). */
void train_fp16_store(const cllm_loss_scaler *s, cllm_ckpt_state *st);
/* Checks this rank's part of the reduced gradient for non-finite values,
 * agrees over ranks (*overflow true on every rank if on any), and when
 * there is none multiplies that part by 1/scale. Collective. */
cllm_status train_fp16_unscale(const train_zero *z, float *grads, double scale, bool *overflow);

/* ---- overlap_comm at ZeRO stages 0-1 (zero_overlap.c) ---- */
typedef struct train_overlap train_overlap;
/* Installs the model's grads_ready hook (after cllm_model_prepare: the flat
 * gradient buffer must exist) and starts the progress thread when MPI
 * allows it. */
cllm_status train_overlap_init(train_overlap **out, train_zero *z, cllm_model *m);
/* Before each micro-batch's backward: only the step's last one reduces. */
void train_overlap_arm(train_overlap *o, bool last_micro_batch);
/* Waits for the step's all-reduces (the summed gradient is then whole). */
cllm_status train_overlap_finish(train_overlap *o);
double train_overlap_comm_seconds(const train_overlap *o); /* 0 for NULL */
double train_overlap_wait_seconds(const train_overlap *o);
void train_overlap_free(train_overlap *o);

/* ---- pipeline parallelism (pipe_train.c) ---- */
typedef struct train_pipe train_pipe;
/* This rank's stage from the topology and model_topo.parts /
 * model_topo.schedule ("1f1b" by default, or "gpipe"); collective over the
 * world (creates the pipe group and the tied-embedding pairs). */
cllm_status train_pipe_init(train_pipe **out, const cllm_train_config *c, cllm_model *m, const cllm_topo *topo,
                            const char *where);
void train_pipe_free(train_pipe *p);
/* The stage's range of the flat buffer. */
void train_pipe_range(const train_pipe *p, size_t *begin, size_t *end);
const cllm_stage *train_pipe_stage(const train_pipe *p);
int train_pipe_slots(const train_pipe *p);
size_t train_pipe_inflight_bytes(const train_pipe *p);
const char *train_pipe_schedule(const train_pipe *p);
/* Seconds this stage computed and waited for its neighbours, summed. */
void train_pipe_times(const train_pipe *p, double *busy, double *wait);
/* One step's forwards and backwards of gradient_accumulation_steps
 * micro-batches (tokens/targets: [M * micro, T]); accumulates the stage's
 * gradients; *loss_sum is the sum of losses on the last stage, 0 elsewhere. */
cllm_status train_pipe_run(train_pipe *p, cllm_model *m, const int32_t *tokens, const int32_t *targets,
                           float grad_scale, double *loss_sum);
/* One evaluation batch of `rows` (<= micro) rows [rows, T] through the
 * stages, forward only, each stage with its own parameters (gathered layer
 * by layer at ZeRO-3): the first stage embeds, the last computes the loss
 * (*loss_sum, *n_counted; 0 on the other stages). Collective over the
 * pipeline (and each stage's tensor group). */
cllm_status train_pipe_eval(train_pipe *p, cllm_model *m, const int32_t *tokens, const int32_t *targets, int rows,
                            double *loss_sum, long *n_counted);
/* Tied head: sums the embedding gradient of the first and last stage. */
cllm_status train_pipe_sync_tied_grads(train_pipe *p, float *grads);
/* Tied head: the first stage's updated embedding to the last stage. */
cllm_status train_pipe_sync_tied_params(train_pipe *p, float *params);
/* Every stage's range to every rank of the pipeline: the whole model. */
cllm_status train_pipe_gather_params(train_pipe *p, float *params);
/* The same, to the first stage only (the others keep their share). */
cllm_status train_pipe_gather_params_to_first(train_pipe *p, float *params);
/* The same for a buffer laid out as model m's flat parameters, m having the
 * pipeline's units (the whole model of a tensor-parallel part). */
cllm_status train_pipe_gather_layout(train_pipe *p, const cllm_model *m, float *buf);
const cllm_dist_group *train_pipe_group(const train_pipe *p);
/* Tied head, on the first and the last stage of a pipeline of 2 or more:
 * the pair's group and the embedding's flat range; NULL elsewhere. */
const cllm_dist_group *train_pipe_tied(const train_pipe *p, size_t *at, size_t *len);
/* Zeroes the parts of the gradient buffer this stage writes (its range, and
 * the tied embedding on the last stage); nothing for NULL. */
void train_pipe_zero_grads(const train_pipe *p, float *grads);
/* Gives back the memory of the rest of a flat buffer (other stages' parts):
 * a stage then holds only its share of parameters and gradients. */
void train_pipe_release(const train_pipe *p, float *buf);

/* ---- tensor parallelism (tp_train.c) ---- */
typedef struct train_tp train_tp;
/* Collective over the world: the tensor and data groups of the topology,
 * and *m (the whole model, kept for the final save) replaced by this rank's
 * part, set up to run over the tensor group. Call train_tp_free also after
 * a failure (it frees the whole model it kept). */
cllm_status train_tp_init(train_tp **out, cllm_model **m, const cllm_topo *topo);
void train_tp_free(train_tp *t);
const cllm_dist_group *train_tp_group(const train_tp *t);      /* the tensor group */
const cllm_dist_group *train_tp_data_group(const train_tp *t); /* same tensor (and pipe) coordinate */
const cllm_dist_group *train_tp_model_group(const train_tp *t); /* one model replica: same data coordinate */
bool train_tp_is_first(const train_tp *t); /* tensor rank 0 */
/* Ranges of the part's replicated tensors when this is not tensor rank 0
 * (they are counted once in the gradient norm, by rank 0); *n 0 otherwise. */
cllm_status train_tp_norm_skip(const train_tp *t, const cllm_model *part, cllm_param_range **out, int *n);
/* Collective over the tensor group: the whole model with every part's
 * current parameters (borrowed; valid until train_tp_free), and the largest
 * difference between the tensor ranks' copies of a replicated tensor. */
cllm_status train_tp_gather(train_tp *t, const cllm_model *part, cllm_model **whole, float *repl_diff);
/* The whole model (its layout; its parameters are those of the last
 * gather, or as loaded). */
const cllm_model *train_tp_whole(const train_tp *t);
/* sequence_parallel: switches it on for the part m of a run over `topo`
 * (refused, naming the key, without a tensor axis or with
 * a seq_len the tensor size does not divide) and prints the start-up line
 * on rank 0 unless quiet. Nothing when the key is off. */
cllm_status train_tp_sequence_parallel(cllm_model *m, const cllm_topo *topo, const cllm_train_config *c);

#endif
