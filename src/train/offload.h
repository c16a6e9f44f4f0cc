/*
 * Optimizer-state offload to a file (zero_optimization.offload_optimizer
 * with device "nvme"; docs/memory.md). Private to the training engine.
 *
 * The state of this rank's slice (n floats per state buffer: Adam's two
 * moments, Lion's or SGD's momentum) lives in one file under nvme_path,
 * state k at byte offset k * n * 4, created unique per process and rank and
 * removed by train_offload_free. An update streams it through
 * buffer_count slots of buffer_size floats per state: while the optimizer
 * updates chunk i in one slot, an I/O thread writes chunk i-1 back and reads
 * chunk i+1 (pread/pwrite, in posting order). The update is element-wise, so
 * the result is bit-identical to the in-memory optimizer.
 */
#ifndef CLLM_TRAIN_OFFLOAD_H
#define CLLM_TRAIN_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "cllm/optim.h"
#include "cllm/train.h"

typedef struct train_offload train_offload;

/* Creates the state file (zero-filled, n floats per state of optimizer
 * params p) under oc->nvme_path (zero_optimization.offload_optimizer with
 * device "nvme", as parsed and range-checked by the config parser: a
 * nvme_path, buffer_count slots >= 3, buffer_size floats per state per
 * slot) and starts the I/O thread. Fails naming the
 * key when the folder is missing, is not a folder or is not writable. */
cllm_status train_offload_init(train_offload **out, const cllm_offload_config *oc, const cllm_optim_params *p,
                               size_t n, int rank);
/* One optimizer update of params[n] / grads[n] (this rank's slice, with
 * slice-relative ranges) through the stream; o is a streamed optimizer
 * (cllm_optim_init_streamed). */
cllm_status train_offload_step(train_offload *f, cllm_optimizer *o, float *params, const float *grads,
                               const cllm_param_range *ranges, int n_ranges, double lr);
/* Maps the state file (read-only, or writable to load a checkpoint into it)
 * and points *s0 / *s1 at the state buffers (NULL where the optimizer has
 * none). The kernel pages the file in and out as they are read or written,
 * so the whole state never has to be resident. Undo with train_offload_unmap. */
cllm_status train_offload_map(train_offload *f, bool writable, float **s0, float **s1);
void train_offload_unmap(train_offload *f);
/* Bytes of the bounded in-memory buffer. */
size_t train_offload_buffer_bytes(const train_offload *f);
/* I/O seconds of the I/O thread and seconds the update waited for it, in
 * total and since the previous call of train_offload_take_step_times. */
void train_offload_times(train_offload *f, double *io_seconds, double *wait_seconds);
void train_offload_take_step_times(train_offload *f, double *io_seconds, double *wait_seconds);
/* Stops the I/O thread, closes and removes the state file. NULL: no-op. */
void train_offload_free(train_offload *f);

#endif
