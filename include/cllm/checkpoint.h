/*
 * cllm checkpoint: training checkpoints written atomically and verified on
 * load.
 *
 * Layout of OUTPUT_DIR (docs/training.md has the full file table):
 *   checkpoint-STEP/config.json, model.safetensors (or shards + index)
 *                              the model as an HF folder (loadable by itself)
 *   checkpoint-STEP/optimizer.safetensors   optimizer moments, flat F32 [n]
 *   checkpoint-STEP/trainer_state.json      steps, scheduler position, data
 *                                           position, RNG, config hash...
 *   checkpoint-STEP/manifest.json           size and CRC-32 of every file
 *   latest                                  "checkpoint-STEP\n", written last
 *
 * A checkpoint is assembled in OUTPUT_DIR/.checkpoint-STEP.tmp (every file
 * fsynced), renamed into place, and only then is `latest` replaced, so a
 * crash at any point leaves the previous checkpoint and pointer intact.
 */
#ifndef CLLM_CHECKPOINT_H
#define CLLM_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's crc32):
 * pass crc = 0 to start, the previous value to continue. */
uint32_t cllm_crc32(uint32_t crc, const void *data, size_t n);
/* CRC-32 and size of a whole file. */
cllm_status cllm_crc32_file(const char *path, uint32_t *crc, uint64_t *size);

/* Everything besides tensors that a resumed run needs. */
typedef struct {
    long global_step;        /* optimizer steps taken (including skipped ones) */
    long optim_step;         /* the optimizer's own step count */
    long sched_iter;         /* scheduler position (applied updates) */
    uint64_t next_sample;    /* data position g of the next step */
    cllm_rng rng;            /* trainer RNG */
    uint64_t data_seed;
    long skipped_steps, consecutive_skips;
    double tokens_seen;      /* counted targets so far */
    double train_seconds;    /* wall time of the steps so far */
    double loss_scale;       /* fp16: the current loss scale (1.0 without fp16) */
    bool has_loss_scaler;    /* fp16: the scaler counters below are saved ("loss_scaler") */
    long loss_scaler_iter, loss_scaler_last_overflow; /* cllm_loss_scaler's iter, last_overflow_iter */
    int loss_scaler_hysteresis;                       /* and cur_hysteresis */
    uint64_t config_hash;
    char optimizer[16];      /* "adamw", "adam", "lion", "sgd" */
    long train_batch_size;
    int dp_size;
    int n_objective;         /* the objective's own state ("objective_state"; PPO's KL coefficient, ...) */
    double objective[16];
} cllm_ckpt_state;

/* The tensors of a checkpoint: parameters in the model's flat layout and
 * the optimizer's state buffers (either may be NULL), each n floats. */
typedef struct {
    const float *params, *state0, *state1;
    size_t n;
} cllm_ckpt_tensors;

/* Writes OUTPUT_DIR/checkpoint-STEP (STEP = st->global_step) atomically,
 * then the `latest` pointer, then removes the oldest checkpoint-* folders
 * beyond keep_limit (0 = keep all; the new one is never removed). The model
 * supplies tensor names, shapes and config.json; its parameters are not read
 * (t->params is). Thread-compatible: may run on a background thread while
 * the caller keeps training, as long as `m` is not freed. */
cllm_status cllm_ckpt_write(const char *output_dir, const cllm_model *m, const cllm_ckpt_tensors *t,
                            const cllm_ckpt_state *st, size_t max_shard_bytes, long keep_limit);

/* Removes what an interrupted save left in output_dir: checkpoint folders
 * still being assembled (.checkpoint-STEP.tmp) and atomic-write
 * temporaries (NAME.tmp.PID, e.g. latest.tmp.PID) whose process no longer
 * exists. Finished checkpoints, `latest` and other files are untouched.
 * *n_removed (may be NULL) counts the entries removed. Call before a run
 * writes into output_dir (rank 0 only). A missing folder is CLLM_OK. */
cllm_status cllm_ckpt_clean_stale(const char *output_dir, int *n_removed);

/* Finds the checkpoint folder to resume from: `resume` "auto" means the one
 * OUTPUT_DIR/latest names (*dir = NULL and CLLM_OK when there is none yet);
 * anything else is a checkpoint folder path. *dir is malloc'd. */
cllm_status cllm_ckpt_find(const char *output_dir, const char *resume, char **dir);

/* Checks every file in dir/manifest.json (size and CRC-32). A mismatch is
 * CLLM_ERR_FORMAT naming the file. */
cllm_status cllm_ckpt_verify(const char *dir);

/* Reads dir/trainer_state.json. */
cllm_status cllm_ckpt_read_state(const char *dir, cllm_ckpt_state *st);

/* Reads the optimizer state buffers (n floats each; NULL = the optimizer has
 * no such buffer, and the file must not have it either). */
cllm_status cllm_ckpt_read_optim(const char *dir, float *state0, float *state1, size_t n);

/* ---------------------------------------------- sharded checkpoints
 *
 * When the optimizer state is partitioned (ZeRO stage >= 1 on several
 * ranks) every rank writes its own slice [begin, end) of the flat buffers:
 *   checkpoint-STEP/params-RRRRR-of-NNNNN.safetensors  "params" F32 [end-begin]
 *   checkpoint-STEP/optim-RRRRR-of-NNNNN.safetensors   "state0", "state1" (those
 *                                                      the optimizer has)
 *   checkpoint-STEP/layout.json    n, the slices of every shard file, the
 *                                  tensors (name, shape, flat offset)
 *   checkpoint-STEP/config.json, trainer_state.json, manifest.json
 * docs/training.md has the file table. The flat layout does not depend on
 * the world size, so any world size or stage reads any checkpoint: a reader
 * maps only the shard files that overlap the range it asks for. */

/* One rank's part of the state, as slices of the flat buffer of n floats.
 * params points at the slice itself (params[0] is flat element `begin`), so
 * a rank that holds only its slice (ZeRO-3) passes that. state0/state1 are
 * the optimizer buffers of the same slice, or NULL. */
typedef struct {
    const float *params, *state0, *state1;
    size_t begin, end, n;
} cllm_ckpt_slice;

/* Collective: every rank calls it with its slice (the slices of all ranks,
 * in rank order, must tile [0, n)). Each rank writes and fsyncs its two
 * files into OUTPUT_DIR/.checkpoint-STEP.tmp and checksums them; rank 0 then
 * writes config.json, trainer_state.json, layout.json and manifest.json,
 * renames the folder into place and moves `latest` (as cllm_ckpt_write).
 * Every rank returns the same status. Not thread-safe (MPI collectives). */
cllm_status cllm_ckpt_write_sharded(const char *output_dir, const cllm_model *m, const cllm_ckpt_slice *s,
                                    const cllm_ckpt_state *st, long keep_limit);

/* True when dir holds a sharded checkpoint (dir/layout.json exists). */
bool cllm_ckpt_is_sharded(const char *dir);

/* Checks the manifest entries a reader of [begin, end) needs: every file
 * that is not a shard, the params shards when `all_params` (else those that
 * overlap [begin, end)), and the optim shards that overlap [begin, end).
 * For a checkpoint that is not sharded this is cllm_ckpt_verify. */
cllm_status cllm_ckpt_verify_range(const char *dir, bool all_params, size_t begin, size_t end);

/* The model of any checkpoint (or an HF folder): its config.json and all
 * of its parameters. A sharded checkpoint's layout must match the model its
 * config.json describes. */
cllm_status cllm_ckpt_load_model(cllm_model **out, const char *dir);
/* cllm_ckpt_load_model with the matrices in weight format `weights`
 * (cllm_model_load_weights; NULL: the stored format, fp32 for a sharded
 * checkpoint, which is converted after loading). */
cllm_status cllm_ckpt_load_model_weights(cllm_model **out, const char *dir, const char *weights);

/* Which flat buffer cllm_ckpt_read_range reads. */
typedef enum { CLLM_CKPT_PARAMS, CLLM_CKPT_STATE0, CLLM_CKPT_STATE1 } cllm_ckpt_buffer;

/* dst[0 .. end-begin) <- elements [begin, end) of a flat buffer of either
 * checkpoint format; `m` supplies the tensor layout (names, offsets) and n.
 * Only the files overlapping the range are opened (mmap). Missing files or
 * tensors, and a layout of another model, fail naming the file. */
cllm_status cllm_ckpt_read_range(const char *dir, const cllm_model *m, cllm_ckpt_buffer which, size_t begin,
                                 size_t end, float *dst);

/* The optimizer state of the slice [begin, end) from either format (state0,
 * state1: end-begin floats, or NULL when the optimizer has no such buffer;
 * the checkpoint must agree). Verifies the sharded files it reads first. */
cllm_status cllm_ckpt_read_optim_range(const char *dir, const cllm_model *m, float *state0, float *state1,
                                       size_t begin, size_t end);

#ifdef __cplusplus
}
#endif
#endif
