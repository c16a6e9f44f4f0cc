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

#ifdef __cplusplus
}
#endif
#endif
