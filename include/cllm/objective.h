/*
 * cllm objective: what a training step minimises, behind one interface, so
 * the trainer's loop knows nothing of which objective runs. Language
 * modelling (the mean loss of every counted target) is the built-in one;
 * preference objectives (reward models, DPO, PPO) are further
 * implementations of the same interface in src/tasks/, one file each.
 *
 * An objective receives a micro-batch and the model, runs the forward pass
 * (and, when asked, the backward pass, ACCUMULATING gradients scaled by
 * grad_scale into the model's gradient buffer) and reports the micro-batch's
 * loss as a sum over `n_counted` units, so that the trainer can average
 * over accumulation steps and ranks the same way for every objective. The
 * model's per-token hooks it may use are in cllm/model.h
 * (cllm_model_forward_backward_ex: each target's log-probability out, a
 * gradient scale per token in).
 *
 * Objectives are not thread-safe; one per trainer.
 */
#ifndef CLLM_OBJECTIVE_H
#define CLLM_OBJECTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One micro-batch: tokens and shifted targets [B,T] (-100 = not counted),
 * ids already checked against the vocabulary. */
typedef struct {
    const int32_t *tokens, *targets;
    int B, T;
} cllm_objective_batch;

typedef struct cllm_objective cllm_objective;

/* The interface an objective implements. `run` returns the micro-batch's
 * loss sum and the count it is a sum over (tokens for language modelling;
 * pairs for a preference loss); with `backward` it accumulates grad_scale
 * times the gradient of that sum. `free` releases the object (NULL-safe
 * through cllm_objective_free). */
typedef struct {
    const char *name;
    cllm_status (*run)(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                       float grad_scale, double *loss_sum, long *n_counted);
    void (*free)(cllm_objective *o);
} cllm_objective_ops;

struct cllm_objective {
    const cllm_objective_ops *ops;
};

/* The causal language-modelling objective: the sum of -log p(target) over
 * counted targets (HF's causal-LM loss before the mean). */
cllm_status cllm_objective_lm_init(cllm_objective **out);

/* Runs o on one micro-batch (see cllm_objective_ops.run). */
cllm_status cllm_objective_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                               float grad_scale, double *loss_sum, long *n_counted);
/* "lm", ... */
const char *cllm_objective_name(const cllm_objective *o);
/* NULL is a no-op. */
void cllm_objective_free(cllm_objective *o);

#ifdef __cplusplus
}
#endif
#endif
