/*
 * Direct preference optimisation (cllm/objective.h, docs/alignment.md):
 * trl's DPOTrainer losses over pairs of rows, from the model's per-token
 * log-probabilities and per-token gradient scales.
 *
 * Per micro-batch of P pairs (B = 2P rows, chosen then rejected):
 *   1. reference: a forward pass of the frozen model, token losses summed
 *      per row (skipped with reference_free);
 *   2. policy: a forward pass for its token losses, the same sums;
 *   3. per pair, the loss and dloss/dpi for each row; every counted token
 *      of a row gets token_scale = -grad_scale * dloss/dpi (/ its count for
 *      "ipo", whose logps are means), since token_loss = -log p;
 *   4. policy forward + backward with those scales.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/lora.h"
#include "cllm/objective.h"
#include "pair_metrics.h"

enum { M_RC, M_RR, M_ACC, M_MARGIN, M_LC, M_LR, M_COUNT };
static const char *const metric_names[M_COUNT] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                                  "rewards/margins", "logps/chosen", "logps/rejected"};

typedef struct {
    cllm_objective base;
    cllm_dpo_params p;
    cllm_model *ref;
    float *tl, *scale; /* [B*T] token losses, token scales */
    double *lp_pol, *lp_ref; /* [B] */
    long *n_tok;             /* [B] */
    size_t cap_tok, cap_rows;
    pair_metrics train, eval; /* training and forward-only (evaluation) micro-batches */
    /* precompute_ref_log_probs: reference log-probabilities by row content
     * (open addressing on a 64-bit hash; key 0 = empty) */
    uint64_t *keys;
    double *vals;
    size_t cap_map, n_map;
    bool precomputed;
} dpo;

cllm_dpo_params cllm_dpo_params_default(void) {
    cllm_dpo_params p = {0.1, CLLM_DPO_SIGMOID, 0.0, false, false};
    return p;
}

static const char *const loss_names[] = {"sigmoid", "ipo", "hinge", "robust"};

cllm_status cllm_dpo_loss_parse(const char *name, cllm_dpo_loss *out) {
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, loss_names[i]) == 0) {
            *out = (cllm_dpo_loss)i;
            return CLLM_OK;
        }
    return CLLM_FAIL(CLLM_ERR_ARG, "unknown DPO loss_type \"%s\" (sigmoid, ipo, hinge or robust)", name ? name : "");
}

const char *cllm_dpo_loss_name(cllm_dpo_loss l) { return (unsigned)l < 4 ? loss_names[l] : "?"; }

/* log(sigmoid(x)) without overflow */
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

/* The loss of one pair with h = (pi_c - pi_r) - (ref_c - ref_r), and its
 * derivative dloss/dh in *dh. */
static double pair_loss(const cllm_dpo_params *p, double h, double *dh) {
    double b = p->beta, ls = p->label_smoothing, z = b * h;
    switch (p->loss_type) {
    case CLLM_DPO_IPO: {
        double d = h - 1.0 / (2.0 * b);
        *dh = 2.0 * d;
        return d * d;
    }
    case CLLM_DPO_HINGE:
        *dh = 1.0 - z > 0 ? -b : 0.0;
        return 1.0 - z > 0 ? 1.0 - z : 0.0;
    case CLLM_DPO_ROBUST:
        *dh = b * (-(1.0 - ls) * sigmoid(-z) - ls * sigmoid(z)) / (1.0 - 2.0 * ls);
        return (-(1.0 - ls) * log_sigmoid(z) + ls * log_sigmoid(-z)) / (1.0 - 2.0 * ls);
    case CLLM_DPO_SIGMOID:
    default:
        *dh = b * (-(1.0 - ls) * sigmoid(-z) + ls * sigmoid(z));
        return -(1.0 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
    }
}

static cllm_status grow(dpo *d, int B, int T) {
    size_t nt = (size_t)B * (size_t)T;
    if (nt > d->cap_tok) {
        float *a = realloc(d->tl, nt * sizeof *a), *s = a ? realloc(d->scale, nt * sizeof *s) : NULL;
        if (a) d->tl = a;
        if (s) d->scale = s;
        if (!a || !s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for %zu token losses", nt);
        d->cap_tok = nt;
    }
    if ((size_t)B > d->cap_rows) {
        double *a = realloc(d->lp_pol, (size_t)B * sizeof *a);
        if (a) d->lp_pol = a;
        double *r = a ? realloc(d->lp_ref, (size_t)B * sizeof *r) : NULL;
        if (r) d->lp_ref = r;
        long *n = r ? realloc(d->n_tok, (size_t)B * sizeof *n) : NULL;
        if (n) d->n_tok = n;
        if (!a || !r || !n) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        d->cap_rows = (size_t)B;
    }
    return CLLM_OK;
}

/* Row log-probabilities of m: lp[b] = -sum of its token losses (the mean
 * for ipo); counts in d->n_tok. base: m with its adapters disabled. */
static cllm_status row_logps_of(dpo *d, cllm_model *m, const cllm_objective_batch *bt, bool train, double *lp,
                                bool base) {
    const int B = bt->B, T = bt->T;
    cllm_status st = cllm_model_prepare(m, B, T, train);
    if (st) return st;
    if (base && !cllm_lora_attached(m))
        return CLLM_FAIL(CLLM_ERR_ARG, "DPO: no reference model and no LoRA adapters to disable");
    cllm_token_io io;
    memset(&io, 0, sizeof io);
    io.token_loss = d->tl;
    double sum = 0;
    long k = 0;
    if (base) cllm_lora_set_enabled(m, false);
    st = cllm_model_forward_backward_ex(m, bt->tokens, bt->targets, B, T, false, 0.0f, &io, &sum, &k);
    if (base) cllm_lora_set_enabled(m, true);
    if (st) return st;
    for (int b = 0; b < B; b++) {
        double s = 0;
        long n = 0;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * (size_t)T + (size_t)t;
            if (bt->targets[i] == -100) continue;
            s += d->tl[i];
            n++;
        }
        if (n == 0)
            return CLLM_FAIL(CLLM_ERR_FORMAT, "DPO: row %d (the %s completion of pair %d of the micro-batch) has no "
                             "counted tokens; is the prompt longer than seq_len?", b, b % 2 ? "rejected" : "chosen",
                             b / 2);
        d->n_tok[b] = n;
        lp[b] = d->p.loss_type == CLLM_DPO_IPO ? -s / (double)n : -s;
    }
    return CLLM_OK;
}

static cllm_status row_logps(dpo *d, cllm_model *m, const cllm_objective_batch *bt, bool train, double *lp) {
    return row_logps_of(d, m, bt, train, lp, false);
}

/* The content key of row b: FNV-1a over its tokens and targets (never 0). */
static uint64_t row_key(const int32_t *tokens, const int32_t *targets, int T) {
    uint64_t h = 1469598103934665603ULL;
    for (int t = 0; t < T; t++) {
        h = (h ^ (uint32_t)tokens[t]) * 1099511628211ULL;
        h = (h ^ (uint32_t)targets[t]) * 1099511628211ULL;
    }
    return h ? h : 1;
}

static size_t map_slot(const dpo *d, uint64_t key) {
    size_t i = (size_t)(key * 0x9e3779b97f4a7c15ULL) & (d->cap_map - 1);
    while (d->keys[i] && d->keys[i] != key) i = (i + 1) & (d->cap_map - 1);
    return i;
}

static cllm_status map_put(dpo *d, uint64_t key, double v) {
    if (2 * (d->n_map + 1) > d->cap_map) {
        size_t nc = d->cap_map ? 2 * d->cap_map : 1024;
        uint64_t *ok = d->keys;
        double *ov = d->vals;
        size_t oc = d->cap_map;
        d->keys = calloc(nc, sizeof *d->keys);
        d->vals = calloc(nc, sizeof *d->vals);
        if (!d->keys || !d->vals) {
            free(d->keys);
            free(d->vals);
            d->keys = ok;
            d->vals = ov;
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for precomputed reference log-probabilities");
        }
        d->cap_map = nc;
        for (size_t i = 0; i < oc; i++)
            if (ok[i]) {
                size_t j = map_slot(d, ok[i]);
                d->keys[j] = ok[i];
                d->vals[j] = ov[i];
            }
        free(ok);
        free(ov);
    }
    size_t j = map_slot(d, key);
    if (!d->keys[j]) d->n_map++;
    d->keys[j] = key;
    d->vals[j] = v;
    return CLLM_OK;
}

cllm_status cllm_dpo_precompute(cllm_objective *o, cllm_model *policy, const int32_t *tokens, const int32_t *targets,
                                int B, int T) {
    dpo *d = (dpo *)o;
    if (d->p.reference_free) return CLLM_OK;
    cllm_status st = grow(d, B, T);
    if (st) return st;
    cllm_objective_batch bt = {tokens, targets, B, T, NULL};
    if ((st = row_logps_of(d, d->ref ? d->ref : policy, &bt, false, d->lp_ref, !d->ref)))
        return cllm_fail_context(st, "reference model");
    for (int b = 0; b < B && !st; b++)
        st = map_put(d, row_key(tokens + (size_t)b * T, targets + (size_t)b * T, T), d->lp_ref[b]);
    d->precomputed = true;
    return st;
}

void cllm_dpo_drop_reference(cllm_objective *o) {
    dpo *d = (dpo *)o;
    cllm_model_free(d->ref);
    d->ref = NULL;
}

/* The reference's row log-probabilities: precomputed, the reference
 * model's, or the policy's with its adapters disabled. */
static cllm_status ref_logps(dpo *d, cllm_model *m, const cllm_objective_batch *bt) {
    if (!d->precomputed) return row_logps_of(d, d->ref ? d->ref : m, bt, false, d->lp_ref, !d->ref);
    for (int b = 0; b < bt->B; b++) {
        size_t j = map_slot(d, row_key(bt->tokens + (size_t)b * bt->T, bt->targets + (size_t)b * bt->T, bt->T));
        if (!d->keys[j])
            return CLLM_FAIL(CLLM_ERR_ARG, "DPO: row %d of the micro-batch has no precomputed reference "
                             "log-probability (precompute_ref_log_probs)", b);
        d->lp_ref[b] = d->vals[j];
    }
    return CLLM_OK;
}

static cllm_status dpo_run(cllm_objective *o, cllm_model *m, const cllm_objective_batch *bt, bool backward,
                           float grad_scale, double *loss_sum, long *n_counted) {
    dpo *d = (dpo *)o;
    const int B = bt->B, T = bt->T, P = B / 2;
    *loss_sum = 0;
    *n_counted = 0;
    if (B % 2) return CLLM_FAIL(CLLM_ERR_ARG, "DPO: a micro-batch of %d rows is not whole pairs", B);
    cllm_status st = grow(d, B, T);
    if (st) return st;
    if (d->p.reference_free) {
        for (int b = 0; b < B; b++) d->lp_ref[b] = 0;
    } else if ((st = ref_logps(d, m, bt))) {
        return cllm_fail_context(st, "reference model");
    }
    if ((st = row_logps(d, m, bt, backward, d->lp_pol))) return st;
    double total = 0;
    pair_metrics *acc = backward ? &d->train : &d->eval;
    if (backward) memset(d->scale, 0, (size_t)B * (size_t)T * sizeof *d->scale);
    for (int i = 0; i < P; i++) {
        int c = 2 * i, r = c + 1;
        double pc = d->lp_pol[c], pr = d->lp_pol[r], rc = d->lp_ref[c], rr = d->lp_ref[r];
        double dh = 0, l = pair_loss(&d->p, (pc - pr) - (rc - rr), &dh);
        double rew_c = d->p.beta * (pc - rc), rew_r = d->p.beta * (pr - rr);
        total += l;
        acc->sums[M_RC] += rew_c;
        acc->sums[M_RR] += rew_r;
        acc->sums[M_ACC] += rew_c > rew_r ? 1.0 : 0.0;
        acc->sums[M_MARGIN] += rew_c - rew_r;
        acc->sums[M_LC] += pc;
        acc->sums[M_LR] += pr;
        acc->n_pairs++;
        if (backward) {
            /* dpi_c = +dh, dpi_r = -dh; dpi/dtoken_loss = -1 (or -1/n) */
            for (int q = 0; q < 2; q++) {
                int row = q ? r : c;
                double g = (q ? dh : -dh) * (double)grad_scale;
                if (d->p.loss_type == CLLM_DPO_IPO) g /= (double)d->n_tok[row];
                for (int t = 0; t < T; t++) {
                    size_t k = (size_t)row * (size_t)T + (size_t)t;
                    if (bt->targets[k] != -100) d->scale[k] = (float)g;
                }
            }
        }
    }
    if (backward) {
        cllm_token_io io;
        memset(&io, 0, sizeof io);
        io.token_scale = d->scale;
        double s = 0;
        long k = 0;
        if ((st = cllm_model_forward_backward_ex(m, bt->tokens, bt->targets, B, T, true, grad_scale, &io, &s, &k)))
            return st;
    }
    *loss_sum = total;
    *n_counted = P;
    return CLLM_OK;
}

static int dpo_take_metrics(cllm_objective *o, cllm_objective_metric *out, int cap) {
    return pair_metrics_take(&((dpo *)o)->train, metric_names, M_COUNT, out, cap);
}

static int dpo_take_eval_metrics(cllm_objective *o, cllm_objective_metric *out, int cap) {
    return pair_metrics_take(&((dpo *)o)->eval, metric_names, M_COUNT, out, cap);
}

static void dpo_free(cllm_objective *o) {
    dpo *d = (dpo *)o;
    cllm_model_free(d->ref);
    free(d->tl);
    free(d->scale);
    free(d->lp_pol);
    free(d->lp_ref);
    free(d->n_tok);
    free(d->keys);
    free(d->vals);
    free(d);
}

static const cllm_objective_ops dpo_ops = {"dpo", dpo_run, dpo_free, dpo_take_metrics, dpo_take_eval_metrics,
                                           NULL, NULL, NULL};

cllm_status cllm_objective_dpo_init(cllm_objective **out, const cllm_dpo_params *p, cllm_model *ref) {
    *out = NULL;
    cllm_status st = CLLM_OK;
    if (!(p->beta > 0) || !isfinite(p->beta))
        st = CLLM_FAIL(CLLM_ERR_ARG, "DPO: beta must be positive (got %g)", p->beta);
    else if (!(p->label_smoothing >= 0 && p->label_smoothing < 0.5))
        st = CLLM_FAIL(CLLM_ERR_ARG, "DPO: label_smoothing must be in [0, 0.5) (got %g)", p->label_smoothing);
    else if ((unsigned)p->loss_type > CLLM_DPO_ROBUST)
        st = CLLM_FAIL(CLLM_ERR_ARG, "DPO: unknown loss type %d", (int)p->loss_type);
    dpo *d = st ? NULL : calloc(1, sizeof *d);
    if (!st && !d) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (st) {
        cllm_model_free(ref);
        return st;
    }
    d->base.ops = &dpo_ops;
    d->p = *p;
    d->ref = ref;
    *out = &d->base;
    return CLLM_OK;
}
