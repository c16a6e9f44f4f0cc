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
    /* Optional (NULL: the trainer's data loader supplies the rows): the
     * objective supplies each training step's rows itself (an RL objective
     * generating rollouts). Called once per step, on every rank (it may be
     * collective over the ranks), before the step's micro-batches, with the
     * 1-based step and this rank's n rows of T tokens to fill: tokens and
     * labels (-100 where not counted), as the loader would; the
     * micro-batches then run on exactly those rows in order. */
    cllm_status (*rows)(cllm_objective *o, cllm_model *m, long step, int n, int T, int32_t *tokens,
                        int32_t *labels);
    /* Optional (NULL: stateless): numbers a checkpoint keeps so that a run
     * resumed before 1-based step `next_step` continues as the straight run
     * would (PPO's KL coefficient and score moments); at most cap (16) of
     * them, the same on every rank. set_state gives them back after a
     * resume, before the first step. */
    int (*get_state)(const cllm_objective *o, long next_step, double *out, int cap);
    cllm_status (*set_state)(cllm_objective *o, const double *v, int n);
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
    bool precompute_ref_log_probs; /* the reference's log-probabilities of every row computed once
                                      before training (cllm_dpo_precompute), then the model freed */
} cllm_dpo_params;

/* trl's defaults: beta 0.1, sigmoid, no smoothing, with a reference. */
cllm_dpo_params cllm_dpo_params_default(void);
/* "sigmoid", "ipo", "hinge", "robust" -> *out; CLLM_ERR_ARG otherwise. */
cllm_status cllm_dpo_loss_parse(const char *name, cllm_dpo_loss *out);
const char *cllm_dpo_loss_name(cllm_dpo_loss l);

/* The DPO objective. `ref` (taken over, freed with the objective) is the
 * frozen reference model, run forward only; NULL with reference_free, or
 * for the policy with its LoRA adapters disabled (the frozen base: a
 * policy without adapters is then an error at the first micro-batch).
 * The policy runs two passes per training micro-batch: a forward for its
 * log-probabilities, then forward + backward with per-token scales
 * dloss/dtoken_loss. Metrics (trl's names): rewards/chosen
 * (beta (pi_c - ref_c)), rewards/rejected, rewards/accuracies,
 * rewards/margins, logps/chosen, logps/rejected; the same means over the
 * forward-only (evaluation) micro-batches as its eval metrics (recorded
 * "eval_rewards/accuracies", ...). A micro-batch with an odd
 * row count or a row without counted targets fails naming the row. */
cllm_status cllm_objective_dpo_init(cllm_objective **out, const cllm_dpo_params *p, cllm_model *ref);
/* precompute_ref_log_probs: the reference's log-probabilities of rows
 * [B, T] (pairs as for run), kept by the rows' contents (tokens and
 * targets); policy is the model trained (the reference when it is the base
 * without adapters). Then cllm_dpo_drop_reference frees the reference
 * model; a later row that was not precomputed is an error naming it. */
cllm_status cllm_dpo_precompute(cllm_objective *o, cllm_model *policy, const int32_t *tokens, const int32_t *targets,
                                int B, int T);
void cllm_dpo_drop_reference(cllm_objective *o);

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

/* ---- PPO (src/tasks/ppo.c, src/tasks/ppo_rollout.c, docs/alignment.md) ----
 * trl's classic PPOTrainer with a value head on the policy
 * (cllm_model_config.value_head). The objective supplies its own rows
 * (cllm_objective_ops.rows): every PPO batch of `batch_size` rollouts per
 * rank (query + response, a reward-model score each) is prepared once:
 * the old log-probabilities and values of the policy, the reference's
 * log-probabilities, per-token rewards
 *   r_t = -kl_coef (logp_t - ref_logp_t)  (+ score at the last response token),
 * optionally whitened (without shifting the mean), GAE with gamma and lam,
 * returns = advantages + values, and advantages whitened over the batch.
 * Then ppo_epochs passes over it in minibatches (one trainer step each, a
 * seeded permutation per epoch). For each response token of a minibatch,
 * with ratio = exp(logp - old_logp) and A the advantage:
 *   policy  max(-A ratio, -A clip(ratio, 1 - cliprange, 1 + cliprange))
 *   value   0.5 max((v - R)^2, (clip(v, v_old -+ cliprange_value) - R)^2)
 *   loss    policy + vf_coef * value
 * run reports the sum over the micro-batch's response tokens, n_counted =
 * those tokens (so the step's loss is trl's masked mean). The KL
 * coefficient adapts after every batch (adap_kl_ctrl: the proportional
 * error of the batch's mean KL against `target`, clipped to +-0.2, times
 * batch_size * ranks / horizon). */
typedef enum { CLLM_PPO_KL, CLLM_PPO_KL_ABS, CLLM_PPO_KL_MSE, CLLM_PPO_KL_FULL } cllm_ppo_kl_penalty;

typedef struct {
    double init_kl_coef;    /* kl_coef: 0.2 */
    bool adap_kl_ctrl;      /* true */
    double target, horizon; /* 6, 10000 */
    double gamma, lam;      /* 1, 0.95 */
    double cliprange, cliprange_value; /* 0.2, 0.2 */
    double vf_coef;         /* 0.1 */
    int ppo_epochs;         /* 4 */
    int batch_size;         /* rollouts per PPO batch per rank; 0: one minibatch */
    bool whiten_rewards;    /* false */
    double ratio_threshold; /* 10: a micro-batch whose mean ratio exceeds it trains nothing */
    /* reward shaping (trl's names): the per-token penalty k_t of
     * r_t = -kl_coef * k_t, with d = logp - ref_logp: "kl" d, "abs" |d|,
     * "mse" d^2 / 2, "full" the KL of the whole next-token distributions
     * sum_v p(v) (log p(v) - log ref(v)); objective/kl sums k_t */
    cllm_ppo_kl_penalty kl_penalty; /* CLLM_PPO_KL */
    /* scores divided by the running std of all scores so far (+ float
     * epsilon), after subtracting the running mean with use_score_norm
     * (trl's RunningMoments over every rank's scores); then clipped to
     * +-score_clip (0: no clip) */
    bool use_score_scaling, use_score_norm; /* false, false */
    double score_clip;                      /* 0 */
    /* rollouts generated from the data's prompts */
    int max_new_tokens;     /* 32 */
    double temperature, top_p; /* 1, 1 */
    int top_k;              /* 0: off */
} cllm_ppo_params;

cllm_ppo_params cllm_ppo_params_default(void);

/* Where a PPO batch's rollouts come from. */
typedef struct cllm_ppo_source cllm_ppo_source;

/* Fixed rollouts from a JSON-lines file, one object a line:
 *   {"query": [ids], "response": [ids], "score": x}
 * and optionally "logprobs", "values", "ref_logprobs": one number per
 * response token (else computed from the policy at the batch's start and
 * the reference). Rank r's PPO batch k is records
 * (k * ranks + r) * batch_size ..., wrapping around the file. Bad lines
 * are CLLM_ERR_FORMAT naming FILE:LINE and the key. */
cllm_status cllm_ppo_source_file(cllm_ppo_source **out, const char *path, int vocab_size);
/* Rollouts generated from the prompts of a data loader (borrowed; rows of
 * seq_len tokens): rank r's PPO batch k takes samples
 * (k * ranks + r) * batch_size ... of its stream. A sample's query is its
 * prompt (the tokens before its first counted label: an instruct record's
 * prompt), else its whole text (every token with a label). Responses are
 * sampled from the policy with the key/value cache (max_new_tokens,
 * temperature, top_k, top_p; a response ends at an EOS id of the policy's
 * config, kept; a query longer than seq_len - max_new_tokens keeps its
 * end) and scored by `reward` (a sequence-classification model with one
 * label, taken over) at the last non-padding token of query + response. */
struct cllm_loader;
cllm_status cllm_ppo_source_generate(cllm_ppo_source **out, struct cllm_loader *prompts, cllm_model *reward,
                                     uint64_t seed);
void cllm_ppo_source_free(cllm_ppo_source *s); /* NULL is a no-op */
/* For a policy whose parameters are partitioned (ZeRO-3): generation calls
 * lend(ctx, true) before sampling a batch's responses (and the PPO
 * objective before kl_penalty "full"'s key/value-cache pass), which must
 * give the policy its whole parameters (cllm_model_params), and
 * lend(ctx, false) after, which takes them back. Every rank calls both at the same point. */
void cllm_ppo_source_set_lender(cllm_ppo_source *s, cllm_status (*lend)(void *ctx, bool on), void *ctx);

/* The PPO objective. `src` and `ref` are taken over (ref NULL: the policy
 * with its LoRA adapters disabled, which needs adapters); the policy must
 * have a value head. micro_batch is the trainer's micro-batch rows, mini
 * its rows per step on this rank (a divisor of batch_size); seed drives
 * the minibatch permutations and the sampling. Metrics (trl's names):
 * per step ppo/loss/policy, ppo/loss/value, ppo/loss/total,
 * ppo/policy/clipfrac, ppo/policy/approxkl, ppo/policy/policykl,
 * ppo/val/clipfrac, ppo/val/vpred, ppo/val/error; per batch
 * objective/kl, objective/kl_coef, objective/entropy, env/reward_mean,
 * env/reward_std, ppo/mean_non_score_reward, ppo/returns/mean. */
cllm_status cllm_objective_ppo_init(cllm_objective **out, const cllm_ppo_params *p, cllm_ppo_source *src,
                                    cllm_model *ref, int micro_batch, int mini, uint64_t seed);

/* Runs o on one micro-batch (see cllm_objective_ops.run). */
cllm_status cllm_objective_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *b, bool backward,
                               float grad_scale, double *loss_sum, long *n_counted);
/* The objective's metrics since the last call (see take_metrics); 0 when it
 * publishes none. */
int cllm_objective_take_metrics(cllm_objective *o, cllm_objective_metric *out, int cap);
/* The same for forward-only micro-batches (take_eval_metrics). */
int cllm_objective_take_eval_metrics(cllm_objective *o, cllm_objective_metric *out, int cap);
/* Whether o supplies its own rows (cllm_objective_ops.rows), and the call. */
bool cllm_objective_has_rows(const cllm_objective *o);
/* The objective's checkpoint state (see cllm_objective_ops.get_state); 0
 * when it keeps none. */
int cllm_objective_get_state(const cllm_objective *o, long next_step, double *out, int cap);
cllm_status cllm_objective_set_state(cllm_objective *o, const double *v, int n);
cllm_status cllm_objective_rows(cllm_objective *o, cllm_model *m, long step, int n, int T, int32_t *tokens,
                                int32_t *labels);
/* "lm", "dpo", "reward", "ppo" */
const char *cllm_objective_name(const cllm_objective *o);
/* NULL is a no-op. */
void cllm_objective_free(cllm_objective *o);

#ifdef __cplusplus
}
#endif
#endif
