/*
 * cllm objective: what a training step minimises, behind one interface, so
 * the trainer's loop knows nothing of which objective runs. Language
 * modelling (the mean loss of every counted target) is the built-in one;
 * DPO and reward modelling (below) and further preference objectives are
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
 * ids already checked against the vocabulary. margin [B/2]: each pair's
 * margin (a preference record's "margin", 0 without one), or NULL: all 0;
 * read by the reward objective. */
typedef struct {
    const int32_t *tokens, *targets;
    int B, T;
    const float *margin;
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
    /* Optional (NULL: none): the same for the forward-only micro-batches
     * (evaluation), which the trainer records as "eval_" + name. */
    int (*take_eval_metrics)(cllm_objective *o, cllm_objective_metric *out, int cap);
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

/* ---- reward modelling (src/tasks/reward.c, docs/alignment.md) ----
 * trl's RewardTrainer on pairs of rows (2i chosen, 2i+1 rejected, as for
 * DPO) of a sequence-classification model (cllm_model_config.num_labels
 * 1). A row's reward r is the score head at its last non-padding token
 * (cllm_model_score_position over the row up to its last counted target,
 * i.e. the end of its completion). The loss of a pair with margin m:
 *   -logsigmoid(r_c - r_r - m) + center_rewards_coefficient * (r_c + r_r)^2
 * (the mean of which over a batch is trl's loss, centring term included);
 * run reports the sum over pairs, n_counted = pairs. One forward + backward
 * pass per micro-batch. Metrics (train and eval): accuracy (the share of
 * pairs with r_c > r_r), rewards/chosen, rewards/rejected, rewards/margins
 * (mean r_c - r_r). */
typedef struct {
    double center_rewards_coefficient; /* >= 0; 0 (trl's None): no centring term */
} cllm_reward_params;

cllm_reward_params cllm_reward_params_default(void);
/* The scored position of each row of a pair micro-batch: the end of its
 * completion (its last counted target + 1), then HF's last non-padding
 * token before it (cllm_model_score_position). A row without counted
 * targets fails naming it. */
cllm_status cllm_reward_positions(const cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                  int32_t *pos);
/* Fails on an odd row count or a row without counted targets, naming it;
 * the model must be a reward model (cllm_model_to_reward). */
cllm_status cllm_objective_reward_init(cllm_objective **out, const cllm_reward_params *p);

/* Runs o on one micro-batch (see cllm_objective_ops.run). */
cllm_status cllm_objective_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                               float grad_scale, double *loss_sum, long *n_counted);
/* The objective's metrics since the last call (see take_metrics); 0 when it
 * publishes none. */
int cllm_objective_take_metrics(cllm_objective *o, cllm_objective_metric *out, int cap);
/* The same for forward-only micro-batches (take_eval_metrics). */
int cllm_objective_take_eval_metrics(cllm_objective *o, cllm_objective_metric *out, int cap);
/* "lm", "dpo", "reward" */
const char *cllm_objective_name(const cllm_objective *o);
/* NULL is a no-op. */
void cllm_objective_free(cllm_objective *o);

#ifdef __cplusplus
}
#endif
#endif
