/*
 * cllm weights: a model's parameters as one object of their own, apart
 * from the state of any run over them, so that many runs share one copy.
 *
 * A cllm_weights holds what a forward pass only reads: the config, the
 * tensor table (names, shapes, offsets: the named views of the flat
 * buffer), the flat fp32 parameter buffer, the low-precision copy the
 * bf16/fp16 matmuls read (cllm_model_set_precision), the matrices of an
 * inference weight format (int8, q4, bf16: cllm_model_load_weights) and a
 * quantized frozen base (cllm_model_load_quantized). It is read-only from
 * creation to free: no call writes behind it.
 *
 * A run state is a cllm_model made over weights with cllm_model_from_weights:
 * it borrows every weight buffer (no copy: the weights' memory is counted
 * once however many runs there are) and owns only what a run writes:
 * activations, backward scratch, the operand scratch of bf16/fp16 matmuls,
 * layer hooks, mixture-of-experts statistics, and a trainable set of extra
 * tensors (LoRA adapters, a new head) with their gradients. Every call of
 * cllm/model.h, cllm/generate.h, cllm/lora.h takes such a run like any
 * model. Calls that would write the shared weights are refused with
 * CLLM_ERR_UNSUPPORTED naming the weights as shared: training the model's
 * own tensors (cllm_model_prepare with train and no trainable set, or a
 * set whose views copy model tensors), cllm_lora_merge,
 * cllm_model_set_precision, cllm_model_set_weights. The pointer of
 * cllm_model_params on a run is the shared buffer: read it, never write it.
 * A model that owns its weights (cllm_model_load, _init_random...) is
 * unchanged: it is its own weights and its own run state.
 *
 * Uses: a server's workers, each with its own run; PPO's reference model
 * (and a rollout copy) over one frozen copy of the starting policy; several
 * LoRA fine-tunes over one base.
 *
 * Ownership: the weights are reference-counted. cllm_weights_free drops
 * the caller's reference and every run holds one, so the memory is freed
 * by whichever comes last: cllm_weights_free or cllm_model_free of the
 * last run over them (the weights may be freed while runs still use them).
 *
 * Thread safety: the weights may be read from any number of threads at
 * once; cllm_model_from_weights and cllm_model_free of runs over the same
 * weights may be called concurrently. One run is used by one thread at a
 * time (its run state is its own), so runs on different threads over one
 * weights compute at the same time, with the bits each would give alone.
 */
#ifndef CLLM_WEIGHTS_H
#define CLLM_WEIGHTS_H

#include <stddef.h>

#include "cllm/core.h"
#include "cllm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cllm_weights cllm_weights;

/* Loads an HF folder as weights: cllm_model_load_weights (format "fp32",
 * "bf16", "int8", "q4", or NULL for the stored one). */
cllm_status cllm_weights_load(cllm_weights **out, const char *dir, const char *format);

/* Turns the model *m into weights, taking it over (*m is set to NULL on
 * success, left alone on failure): its parameters, precision (the
 * low-precision copy is made now) and weight formats. Its run state
 * (activations, gradients) is freed. Refused for a model with a trainable
 * set or LoRA adapters (merge them first: cllm_lora_merge), with layer
 * hooks, without its parameters (cllm_model_drop_params), or that is
 * itself a run over shared weights. */
cllm_status cllm_weights_from_model(cllm_weights **out, cllm_model **m);

/* Drops the caller's reference (see Ownership above). NULL is a no-op. */
void cllm_weights_free(cllm_weights *w);

/* The weights as a const model, for the introspection calls of
 * cllm/model.h (config, tensors, cllm_model_n_params...) and for KV caches
 * (cllm_kv_cache_init takes a const model): valid while w is. */
const cllm_model *cllm_weights_model(const cllm_weights *w);

/* Bytes of the weight buffers: the flat parameters, the low-precision
 * copy, a weight format's matrices and a quantized base. */
size_t cllm_weights_bytes(const cllm_weights *w);

/* Runs (cllm_model_from_weights) currently over w. */
int cllm_weights_n_runs(const cllm_weights *w);

/* A run state over w (holds a reference until cllm_model_free). It starts
 * as a freshly loaded model does: nothing prepared, no hooks, no trainable
 * set, the weights' precision, tensor- and expert-parallel part. */
cllm_status cllm_model_from_weights(cllm_model **out, cllm_weights *w);

/* The weights a run is over, or NULL for a model that owns its weights. */
const cllm_weights *cllm_model_shared_weights(const cllm_model *m);

#ifdef __cplusplus
}
#endif
#endif
