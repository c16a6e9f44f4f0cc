/*
 * cllm objective: what a training step minimises, behind one interface, so
 * the trainer's loop knows nothing of which objective runs. Language
 * modelling (the mean loss of every counted target) is the built-in one;
 * DPO (below) and further preference objectives (reward models, PPO) are
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
/* A named value an objective publishes for the trainer's metrics.jsonl
 * ("rewards/chosen", ...): a mean over the units run since the last
 * cllm_objective_take_metrics. */
typedef struct {
    const char *name; /* static storage */
    double value;
} cllm_objective_metric;

typedef struct {
    const char *name;
    cllm_status (*run)(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                       float grad_scale, double *loss_sum, long *n_counted);
    void (*free)(cllm_objective *o);
    /* Optional (NULL: none): writes up to cap metrics of the training
     * micro-batches (backward set) run since the last call, returns how
     * many, and starts over. */
    int (*take_metrics)(cllm_objective *o, cllm_objective_metric *out, int cap);
} cllm_objective_ops;

struct cllm_objective {
    const cllm_objective_ops *ops;
};

/* The causal language-modelling objective: the sum of -log p(target) over
 * counted targets (HF's causal-LM loss before the mean). */
cllm_status cllm_objective_lm_init(cllm_objective **out);

/* ---- direct preference optimisation (src/tasks/dpo.c, docs/alignment.md) ----
 * Micro-batches hold pairs: rows 2i (chosen) and 2i+1 (rejected) share a
 * prompt, and the counted targets of a row are its completion (the loader's
 * `pairs` data). With logps pi = sum of log p(target) over a row's
 * completion (the mean per token for "ipo", as trl does), ref the same
 * under the reference model (0 with reference_free) and
 *   h = (pi_c - pi_r) - (ref_c - ref_r),  z = beta * h,
 * the loss of a pair is trl's DPOTrainer loss:
 *   sigmoid  -(1-ls) logsigmoid(z) - ls logsigmoid(-z)
 *   robust   (-(1-ls) logsigmoid(z) + ls logsigmoid(-z)) / (1 - 2 ls)
 *   hinge    relu(1 - z)
 *   ipo      (h - 1/(2 beta))^2
 * run reports the sum over the micro-batch's pairs, n_counted = pairs. */
typedef enum { CLLM_DPO_SIGMOID = 0, CLLM_DPO_IPO, CLLM_DPO_HINGE, CLLM_DPO_ROBUST } cllm_dpo_loss;

typedef struct {
    double beta;            /* > 0; trl's default 0.1 */
    cllm_dpo_loss loss_type;/* default CLLM_DPO_SIGMOID */
    double label_smoothing; /* [0, 0.5); 0 (sigmoid and robust only) */
    bool reference_free;    /* ref terms 0; no reference model */
} cllm_dpo_params;

/* trl's defaults: beta 0.1, sigmoid, no smoothing, with a reference. */
cllm_dpo_params cllm_dpo_params_default(void);
/* "sigmoid", "ipo", "hinge", "robust" -> *out; CLLM_ERR_ARG otherwise. */
cllm_status cllm_dpo_loss_parse(const char *name, cllm_dpo_loss *out);
const char *cllm_dpo_loss_name(cllm_dpo_loss l);

/* The DPO objective. `ref` (taken over, freed with the objective; NULL only
 * with reference_free) is the frozen reference model, run forward only.
 * The policy runs two passes per training micro-batch: a forward for its
 * log-probabilities, then forward + backward with per-token scales
 * dloss/dtoken_loss. Metrics (trl's names): rewards/chosen
 * (beta (pi_c - ref_c)), rewards/rejected, rewards/accuracies,
 * rewards/margins, logps/chosen, logps/rejected. A micro-batch with an odd
 * row count or a row without counted targets fails naming the row. */
cllm_status cllm_objective_dpo_init(cllm_objective **out, const cllm_dpo_params *p, cllm_model *ref);

/* Runs o on one micro-batch (see cllm_objective_ops.run). */
cllm_status cllm_objective_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                               float grad_scale, double *loss_sum, long *n_counted);
/* The objective's metrics since the last call (see take_metrics); 0 when it
 * publishes none. */
int cllm_objective_take_metrics(cllm_objective *o, cllm_objective_metric *out, int cap);
/* "lm", "dpo" */
const char *cllm_objective_name(const cllm_objective *o);
/* NULL is a no-op. */
void cllm_objective_free(cllm_objective *o);

#ifdef __cplusplus
}
#endif
#endif
