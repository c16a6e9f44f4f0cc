/*
 * Reward modelling (cllm/objective.h, docs/alignment.md): trl's
 * RewardTrainer loss over pairs of rows of a sequence-classification model.
 *
 * Per micro-batch of P pairs (B = 2P rows, chosen then rejected):
 *   1. each row's scored position: HF's last non-padding token of the row
 *      up to the end of its completion (its last counted target + 1);
 *   2. one forward pass through the score head (cllm_token_io.score_pos);
 *      between forward and backward the model hands the rewards to
 *      score_grad, which computes each pair's loss and writes
 *      d(loss)/d(reward) times grad_scale;
 *   3. the backward pass of the same call takes them through the score head
 *      and the model.
 * With d = r_c - r_r - margin and k = center_rewards_coefficient:
 *   loss = -logsigmoid(d) + k (r_c + r_r)^2
 *   dloss/dr_c = -sigmoid(-d) + 2k (r_c + r_r),  dloss/dr_r = sigmoid(-d) + 2k (r_c + r_r)
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/objective.h"
#include "pair_metrics.h"

enum { M_ACC, M_RC, M_RR, M_MARGIN, M_COUNT };
static const char *const metric_names[M_COUNT] = {"accuracy", "rewards/chosen", "rewards/rejected",
                                                  "rewards/margins"};

typedef struct {
    cllm_objective base;
    cllm_reward_params p;
    int32_t *pos;                /* [B] scored positions */
    float *scores, *dscores;     /* [B] */
    size_t cap;
    /* the micro-batch being run, for score_grad */
    const float *margin;
    float grad_scale;
    double loss;
    pair_metrics train, eval;
} reward;

cllm_reward_params cllm_reward_params_default(void) {
    cllm_reward_params p = {0.0};
    return p;
}

/* log(sigmoid(x)) and sigmoid(x) without overflow */
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

/* double -> float, saturating (a diverged run's gradients stay defined) */
static float to_float(double x) { return x > FLT_MAX ? INFINITY : x < -FLT_MAX ? -INFINITY : (float)x; }

static cllm_status grow(reward *r, int B) {
    if ((size_t)B <= r->cap) return CLLM_OK;
    int32_t *p = realloc(r->pos, (size_t)B * sizeof *p);
    if (p) r->pos = p;
    float *s = p ? realloc(r->scores, (size_t)B * sizeof *s) : NULL;
    if (s) r->scores = s;
    float *d = s ? realloc(r->dscores, (size_t)B * sizeof *d) : NULL;
    if (d) r->dscores = d;
    if (!d) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    r->cap = (size_t)B;
    return CLLM_OK;
}

/* The losses of the pairs from their rewards; with dscores, their
 * gradients times grad_scale. */
static void pair_losses(reward *r, const float *scores, float *dscores, int B) {
    const double k = r->p.center_rewards_coefficient;
    double total = 0;
    for (int i = 0; i < B / 2; i++) {
        double rc = scores[2 * i], rr = scores[2 * i + 1], m = r->margin ? r->margin[i] : 0.0;
        double d = rc - rr - m, sum = rc + rr;
        total += -log_sigmoid(d) + k * sum * sum;
        if (dscores) {
            double s = sigmoid(-d), c = 2.0 * k * sum;
            dscores[2 * i] = to_float((-s + c) * (double)r->grad_scale);
            dscores[2 * i + 1] = to_float((s + c) * (double)r->grad_scale);
        }
    }
    r->loss = total;
}

static cllm_status score_grad(void *ctx, const float *scores, float *dscores, int B) {
    pair_losses((reward *)ctx, scores, dscores, B);
    return CLLM_OK;
}

cllm_status cllm_reward_positions(const cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                  int32_t *pos) {
    for (int b = 0; b < B; b++) {
        const int32_t *y = targets + (size_t)b * T;
        int last = T - 1;
        while (last >= 0 && y[last] == -100) last--;
        if (last < 0)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "reward: row %d (the %s row of pair %d of the micro-batch) has no "
                             "completion token", b, b % 2 ? "rejected" : "chosen", b / 2);
        /* the completion ends at the token that target `last` predicts */
        pos[b] = cllm_model_score_position(m, tokens + (size_t)b * T, last + 2);
    }
    return CLLM_OK;
}

static cllm_status reward_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *bt, bool backward,
                              float grad_scale, double *loss_sum, long *n_counted) {
    reward *r = (reward *)o;
    const int B = bt->B, T = bt->T;
    *loss_sum = 0;
    *n_counted = 0;
    if (B % 2) return CLLM_FAIL(CLLM_ERR_ARG, "reward: a micro-batch of %d rows is not whole pairs", B);
    cllm_status st = grow(r, B);
    if (st) return st;
    if ((st = cllm_reward_positions(m, bt->tokens, bt->targets, B, T, r->pos))) return st;
    r->margin = bt->margin;
    r->grad_scale = grad_scale;
    r->loss = 0;
    if ((st = cllm_model_prepare(m, B, T, backward))) return st;
    cllm_token_io io;
    memset(&io, 0, sizeof io);
    io.score_pos = r->pos;
    io.scores = r->scores;
    io.dscores = r->dscores;
    io.score_grad = score_grad;
    io.score_ctx = r;
    double s = 0;
    long k = 0;
    if ((st = cllm_model_forward_backward_ex(m, bt->tokens, bt->targets, B, T, backward, grad_scale, &io, &s, &k)))
        return st;
    if (!backward) pair_losses(r, r->scores, NULL, B);
    pair_metrics *acc = backward ? &r->train : &r->eval;
    for (int i = 0; i < B / 2; i++) {
        double rc = r->scores[2 * i], rr = r->scores[2 * i + 1];
        acc->sums[M_ACC] += rc > rr ? 1.0 : 0.0;
        acc->sums[M_RC] += rc;
        acc->sums[M_RR] += rr;
        acc->sums[M_MARGIN] += rc - rr;
        acc->n_pairs++;
    }
    *loss_sum = r->loss;
    *n_counted = B / 2;
    return CLLM_OK;
}

static int reward_take_metrics(cllm_objective *o, cllm_objective_metric *out, int cap) {
    return pair_metrics_take(&((reward *)o)->train, metric_names, M_COUNT, out, cap);
}

static int reward_take_eval_metrics(cllm_objective *o, cllm_objective_metric *out, int cap) {
    return pair_metrics_take(&((reward *)o)->eval, metric_names, M_COUNT, out, cap);
}

static void reward_free(cllm_objective *o) {
    reward *r = (reward *)o;
    free(r->pos);
    free(r->scores);
    free(r->dscores);
    free(r);
}

static const cllm_objective_ops reward_ops = {"reward", reward_run, reward_free, reward_take_metrics,
                                              reward_take_eval_metrics, NULL, NULL, NULL};

cllm_status cllm_objective_reward_init(cllm_objective **out, const cllm_reward_params *p) {
    *out = NULL;
    if (!(p->center_rewards_coefficient >= 0) || !isfinite(p->center_rewards_coefficient))
        return CLLM_FAIL(CLLM_ERR_ARG, "reward: center_rewards_coefficient must be >= 0 (got %g)",
                         p->center_rewards_coefficient);
    reward *r = calloc(1, sizeof *r);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    r->base.ops = &reward_ops;
    r->p = *p;
    *out = &r->base;
    return CLLM_OK;
}
