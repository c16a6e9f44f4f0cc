/*
 * PPO (cllm/objective.h, docs/alignment.md): trl's classic PPOTrainer over
 * rollouts the objective supplies itself (ops.rows), with the policy's
 * value head (cllm_token_io.values).
 *
 * A PPO batch (R rollouts on this rank) is prepared when the first step of
 * it asks for rows:
 *   1. rows from the source (a rollouts file, or prompts answered by the
 *      policy through the key/value cache and scored by the reward model);
 *   2. old log-probabilities and values: one forward pass of the policy
 *      (unless the file gives them); reference log-probabilities: the
 *      reference model (or the policy with its adapters disabled);
 *   3. rewards, GAE, returns and whitened advantages (batch_stats).
 * Each step then trains on one minibatch (a seeded permutation of the
 * batch per epoch): per micro-batch, a forward pass for the current
 * log-probabilities and values, the losses and their derivatives per token
 * (token_scale for the policy's log-probabilities, dvalues for the value
 * head), and a forward + backward pass with those.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/lora.h"
#include "ppo_impl.h"

enum { S_PG, S_VF, S_TOTAL, S_PG_CLIP, S_APPROXKL, S_POLICYKL, S_VF_CLIP, S_VPRED, S_VERR, S_COUNT };
static const char *const step_names[S_COUNT] = {"ppo/loss/policy", "ppo/loss/value", "ppo/loss/total",
                                                "ppo/policy/clipfrac", "ppo/policy/approxkl",
                                                "ppo/policy/policykl", "ppo/val/clipfrac", "ppo/val/vpred",
                                                "ppo/val/error"};
enum { B_KL, B_KL_COEF, B_ENTROPY, B_REWARD, B_REWARD_STD, B_NON_SCORE, B_RETURNS, B_SCORES, B_SCORES_STD, B_COUNT };
static const char *const batch_names[B_COUNT] = {"objective/kl", "objective/kl_coef", "objective/entropy",
                                                 "env/reward_mean", "env/reward_std", "ppo/mean_non_score_reward",
                                                 "ppo/returns/mean", "ppo/mean_scores", "ppo/std_scores"};

/* A checkpoint's PPO state: the KL coefficient, whether a batch's KL is
 * known and that KL (the next batch adapts with them), the score moments. */
enum { ST_KL_COEF, ST_HAVE_KL, ST_KL, ST_MEAN, ST_VAR, ST_STD, ST_COUNT, N_STATE };

typedef struct {
    cllm_objective base;
    cllm_ppo_params p;
    cllm_ppo_source *src;
    cllm_model *ref; /* NULL: the policy without its adapters */
    int micro, mini;
    uint64_t seed;
    double kl_coef;
    /* trl's RunningMoments of the scores (use_score_scaling) */
    double run_mean, run_var, run_std, run_count;
    double pre[N_STATE]; /* that state when the held batch began (before adapting) */
    ppo_batch b;
    float *kl_full; /* [R*T]: kl_penalty "full"'s per-token KL */
    float *adv, *ret; /* [R*T] */
    int *order;       /* [R]: this epoch's permutation */
    long batch_index; /* the batch held (-1: none) */
    int epoch;        /* the epoch its permutation is for */
    /* the rows handed out for the current step and the next micro-batch's */
    int *step_rows;
    int cursor;
    /* per micro-batch */
    float *tl, *vals, *scale, *dv; /* [micro*T] */
    double sums[S_COUNT];
    long n_tok;
    double batch_stats[B_COUNT];
    bool have_stats;
} ppo;

cllm_ppo_params cllm_ppo_params_default(void) {
    cllm_ppo_params p = {.init_kl_coef = 0.2, .adap_kl_ctrl = true, .target = 6, .horizon = 10000, .gamma = 1,
                         .lam = 0.95, .cliprange = 0.2, .cliprange_value = 0.2, .vf_coef = 0.1, .ppo_epochs = 4,
                         .batch_size = 0, .whiten_rewards = false, .ratio_threshold = 10, .max_new_tokens = 32,
                         .temperature = 1, .top_p = 1, .top_k = 0};
    return p;
}

/* ---------------------------------------------------- batch statistics */

/* trl's masked_whiten over the counted positions (mask = labels of the
 * next token counted): (x - mean) / sqrt(var + 1e-8) with the unbiased
 * variance, the mean added back unless shift_mean. */
static void masked_whiten(const ppo_batch *b, float *x, bool shift_mean) {
    const size_t N = (size_t)b->R * b->T;
    double s = 0, n = 0;
    for (size_t i = 0; i < N; i++)
        if (i % b->T + 1 < (size_t)b->T && b->labels[i + 1] != -100) {
            s += x[i];
            n++;
        }
    if (n < 2) return;
    double mean = s / n, v = 0;
    for (size_t i = 0; i < N; i++)
        if (i % b->T + 1 < (size_t)b->T && b->labels[i + 1] != -100) v += (x[i] - mean) * (x[i] - mean);
    v = v / n * (n / (n - 1));
    double inv = 1.0 / sqrt(v + 1e-8);
    for (size_t i = 0; i < N; i++)
        if (i % b->T + 1 < (size_t)b->T && b->labels[i + 1] != -100)
            x[i] = (float)((x[i] - mean) * inv + (shift_mean ? 0.0 : mean));
}

/* Mean and unbiased standard deviation of x[n] into m[0], m[1]. */
static void mean_std(const double *x, int n, double *m) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += x[i];
    for (int i = 0; i < n; i++) s2 += (x[i] - s / n) * (x[i] - s / n);
    m[0] = s / n;
    m[1] = n > 1 ? sqrt(s2 / (n - 1)) : 0.0;
}

/* The batch's scores as trl's step() shapes them, into sc[R]: with
 * use_score_scaling, RunningMoments.update with every rank's scores (their
 * count, mean and population variance merged into the running ones, the
 * running std unbiased), then (s - mean) / (std + eps) (use_score_norm) or
 * s / (std + eps), eps float32's; then clipped to +-score_clip. */
static cllm_status shape_scores(ppo *o, double *sc) {
    const int R = o->b.R;
    for (int r = 0; r < R; r++) sc[r] = o->b.score[r];
    if (o->p.use_score_scaling) {
        double a[3] = {0, (double)R, 0};
        for (int r = 0; r < R; r++) a[0] += sc[r];
        cllm_status st = cllm_dist_allreduce_sum_f64(a, 2);
        if (st) return st;
        const double n = a[1], mean = a[0] / n;
        for (int r = 0; r < R; r++) a[2] += (sc[r] - mean) * (sc[r] - mean);
        if ((st = cllm_dist_allreduce_sum_f64(a + 2, 1))) return st;
        const double delta = mean - o->run_mean, tot = o->run_count + n;
        const double sum = o->run_var * o->run_count + delta * delta * o->run_count * n / tot + a[2];
        o->run_mean += delta * n / tot;
        o->run_var = sum / tot;
        o->run_std = sqrt(o->run_var * tot / (tot - 1));
        o->run_count = tot;
        for (int r = 0; r < R; r++)
            sc[r] = (o->p.use_score_norm ? sc[r] - o->run_mean : sc[r]) / (o->run_std + FLT_EPSILON);
    }
    if (o->p.score_clip > 0)
        for (int r = 0; r < R; r++) sc[r] = fmin(fmax(sc[r], -o->p.score_clip), o->p.score_clip);
    return CLLM_OK;
}

/* trl's _kl_penalty of the token at n. */
static double kl_penalty(const ppo *o, size_t n) {
    double d = (double)o->b.old_lp[n] - (double)o->b.ref_lp[n];
    switch (o->p.kl_penalty) {
    case CLLM_PPO_KL_ABS: return fabs(d);
    case CLLM_PPO_KL_MSE: return 0.5 * d * d;
    case CLLM_PPO_KL_FULL: return o->kl_full[n];
    default: return d;
    }
}

/* Rewards, GAE, returns and whitened advantages of the held batch; the
 * batch's statistics. */
static cllm_status batch_stats(ppo *o) {
    ppo_batch *b = &o->b;
    const int R = b->R, T = b->T;
    float *rew = o->ret; /* rewards first, returns afterwards */
    double kl_sum = 0, ent_sum = 0, nonscore_sum = 0;
    double *sc = malloc(2 * (size_t)R * sizeof *sc);
    if (!sc) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = shape_scores(o, sc);
    if (st) {
        free(sc);
        return st;
    }
    memset(rew, 0, (size_t)R * T * sizeof *rew);
    memset(o->adv, 0, (size_t)R * T * sizeof *o->adv);
    for (int r = 0; r < R; r++) {
        const int t0 = b->q_len[r] - 1, t1 = t0 + b->r_len[r]; /* target positions of the response */
        for (int t = t0; t < t1; t++) {
            size_t n = (size_t)r * T + (size_t)t;
            double kl = kl_penalty(o, n);
            rew[n] = (float)(-o->kl_coef * kl);
            kl_sum += kl;
            ent_sum += -(double)b->old_lp[n];
            nonscore_sum += rew[n];
        }
        rew[(size_t)r * T + (size_t)(t1 - 1)] += (float)sc[r];
        sc[R + r] = b->score[r];
    }
    if (o->p.whiten_rewards) masked_whiten(b, rew, false);
    for (int r = 0; r < R; r++) {
        const int t0 = b->q_len[r] - 1, t1 = t0 + b->r_len[r];
        double last = 0, next_v = 0;
        for (int t = t1 - 1; t >= t0; t--) {
            size_t n = (size_t)r * T + (size_t)t;
            double delta = (double)rew[n] + o->p.gamma * next_v - (double)b->old_v[n];
            last = delta + o->p.gamma * o->p.lam * last;
            o->adv[n] = (float)last;
            next_v = b->old_v[n];
        }
        for (int t = t0; t < t1; t++) {
            size_t n = (size_t)r * T + (size_t)t;
            o->ret[n] = o->adv[n] + b->old_v[n];
        }
    }
    double ret_sum = 0, n_tok = 0;
    for (int r = 0; r < R; r++)
        for (int t = b->q_len[r] - 1; t < b->q_len[r] - 1 + b->r_len[r]; t++, n_tok++)
            ret_sum += o->ret[(size_t)r * T + (size_t)t];
    masked_whiten(b, o->adv, true);
    double *s = o->batch_stats;
    s[B_KL] = kl_sum / R;
    s[B_KL_COEF] = o->kl_coef;
    s[B_ENTROPY] = ent_sum / R;
    mean_std(sc + R, R, s + B_REWARD);
    mean_std(sc, R, s + B_SCORES);
    s[B_NON_SCORE] = nonscore_sum / R;
    s[B_RETURNS] = n_tok > 0 ? ret_sum / n_tok : 0;
    o->have_stats = true;
    free(sc);
    return CLLM_OK;
}

/* trl's AdaptiveKLController.update after a batch: the proportional error
 * of the mean KL (over the ranks) against the target, clipped to +-0.2. */
static cllm_status adapt_kl(ppo *o) {
    if (!o->p.adap_kl_ctrl || !o->have_stats) return CLLM_OK;
    double kl = o->batch_stats[B_KL];
    cllm_status st = cllm_dist_allreduce_sum_f64(&kl, 1);
    if (st) return st;
    kl /= (double)cllm_dist_size();
    double err = kl / o->p.target - 1.0;
    err = err < -0.2 ? -0.2 : err > 0.2 ? 0.2 : err;
    o->kl_coef *= 1.0 + err * (double)o->b.R * (double)cllm_dist_size() / o->p.horizon;
    return CLLM_OK;
}

/* Token log-probabilities (and values) of rows [r0, r0 + n) of the batch
 * under m, into lp (and v) at the batch's positions. */
static cllm_status logps(ppo *o, cllm_model *m, int r0, int n, float *lp, float *v, bool no_adapters) {
    const int T = o->b.T;
    size_t off = (size_t)r0 * T;
    int32_t *targets = malloc((size_t)n * T * sizeof *targets);
    if (!targets) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_model_make_targets(targets, o->b.labels + off, n, T);
    cllm_status st = cllm_model_prepare(m, n, T, false);
    cllm_token_io io;
    memset(&io, 0, sizeof io);
    io.token_loss = o->tl;
    if (v && !cllm_model_get_config(m)->value_head) v = NULL;
    io.values = v ? o->vals : NULL;
    double sum = 0;
    long k = 0;
    if (!st && no_adapters) cllm_lora_set_enabled(m, false);
    if (!st) st = cllm_model_forward_backward_ex(m, o->b.tokens + off, targets, n, T, false, 0.0f, &io, &sum, &k);
    if (no_adapters) cllm_lora_set_enabled(m, true);
    for (size_t i = 0; !st && i < (size_t)n * T; i++) {
        if (targets[i] == -100) continue;
        if (lp) lp[off + i] = -o->tl[i];
        if (v) v[off + i] = o->vals[i];
    }
    free(targets);
    return st;
}

static void state_now(const ppo *o, double *v) {
    v[ST_KL_COEF] = o->kl_coef;
    v[ST_HAVE_KL] = o->have_stats;
    v[ST_KL] = o->have_stats ? o->batch_stats[B_KL] : 0.0;
    v[ST_MEAN] = o->run_mean;
    v[ST_VAR] = o->run_var;
    v[ST_STD] = o->run_std;
    v[ST_COUNT] = o->run_count;
}

/* The state the batch of step next_step starts from: the held batch's
 * beginning when that step is still in it (a resume regenerates it). */
static int ppo_get_state(const cllm_objective *ob, long next_step, double *out, int cap) {
    const ppo *o = (const ppo *)ob;
    if (cap < N_STATE) return 0;
    const long per_batch = (long)(o->p.batch_size / o->mini) * o->p.ppo_epochs;
    if (o->batch_index >= 0 && (next_step - 1) / per_batch == o->batch_index) memcpy(out, o->pre, sizeof o->pre);
    else state_now(o, out);
    return N_STATE;
}

static cllm_status ppo_set_state(cllm_objective *ob, const double *v, int n) {
    ppo *o = (ppo *)ob;
    if (n == 0) return CLLM_OK; /* a checkpoint from before PPO kept its state */
    if (n != N_STATE || !(v[ST_KL_COEF] >= 0) || !(v[ST_COUNT] > 0))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "trainer_state.json: objective_state: not a PPO state (%d numbers)", n);
    o->kl_coef = v[ST_KL_COEF];
    o->have_stats = v[ST_HAVE_KL] != 0;
    o->batch_stats[B_KL] = v[ST_KL];
    o->run_mean = v[ST_MEAN];
    o->run_var = v[ST_VAR];
    o->run_std = v[ST_STD];
    o->run_count = v[ST_COUNT];
    return CLLM_OK;
}

/* Fills and prepares PPO batch k of this rank. */
static cllm_status new_batch(ppo *o, cllm_model *m, long k) {
    state_now(o, o->pre);
    cllm_status st = adapt_kl(o);
    if (st) return st;
    const int R = o->p.batch_size;
    const cllm_model_config *c = cllm_model_get_config(m);
    int32_t pad = c->pad_token_id >= 0 ? c->pad_token_id : c->eos_token_id >= 0 ? c->eos_token_id : 0;
    uint64_t first = ((uint64_t)k * (uint64_t)cllm_dist_size() + (uint64_t)cllm_dist_rank()) * (uint64_t)R;
    if ((st = ppo_source_fill(o->src, m, &o->p, first, &o->b, pad))) return st;
    for (int r0 = 0; r0 < R && !st; r0 += o->micro) {
        int n = R - r0 < o->micro ? R - r0 : o->micro;
        if (!o->b.have_lp || !o->b.have_v)
            st = logps(o, m, r0, n, o->b.have_lp ? NULL : o->b.old_lp, o->b.have_v ? NULL : o->b.old_v, false);
        if (!st && !o->b.have_ref)
            st = o->ref ? logps(o, o->ref, r0, n, o->b.ref_lp, NULL, false) : logps(o, m, r0, n, o->b.ref_lp, NULL, true);
    }
    if (!st && o->p.kl_penalty == CLLM_PPO_KL_FULL) {
        float *kf = realloc(o->kl_full, (size_t)R * o->b.T * sizeof *kf);
        st = kf ? ppo_source_lend(o->src, true) : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        if (!st) {
            st = ppo_full_kl(&o->b, m, o->ref, (o->kl_full = kf)); /* the whole policy (ZeRO 3: gathered) */
            cllm_status sl = ppo_source_lend(o->src, false);
            if (!st) st = sl;
        }
    }
    if (!st) st = batch_stats(o);
    if (st) return cllm_fail_context(st, "PPO batch %ld", k);
    o->batch_index = k;
    o->epoch = -1;
    return CLLM_OK;
}

/* A seeded permutation of the batch for epoch e of batch k. */
static void permute(ppo *o, long k, int e) {
    const int R = o->b.R;
    cllm_rng rng;
    cllm_rng_seed(&rng, o->seed ^ ((uint64_t)k * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)e << 32) ^
                            ((uint64_t)cllm_dist_rank() << 48));
    for (int i = 0; i < R; i++) o->order[i] = i;
    for (int i = R - 1; i > 0; i--) {
        int j = (int)cllm_rng_below(&rng, (uint64_t)i + 1);
        int t = o->order[i];
        o->order[i] = o->order[j];
        o->order[j] = t;
    }
    o->epoch = e;
}

static cllm_status ppo_rows(cllm_objective *ob, cllm_model *m, long step, int n, int T, int32_t *tokens,
                            int32_t *labels) {
    ppo *o = (ppo *)ob;
    if (n != o->mini)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "PPO: a step of %d rows, the objective was set up for %d", n, o->mini);
    const long per_epoch = o->p.batch_size / o->mini, per_batch = per_epoch * o->p.ppo_epochs;
    const long s = step - 1, k = s / per_batch;
    const int e = (int)((s % per_batch) / per_epoch), j = (int)(s % per_epoch);
    cllm_status st;
    if (!o->tl) {
        size_t N = (size_t)o->micro * T;
        o->tl = malloc(N * sizeof *o->tl);
        o->vals = malloc(N * sizeof *o->vals);
        o->scale = malloc(N * sizeof *o->scale);
        o->dv = malloc(N * sizeof *o->dv);
        if (!o->tl || !o->vals || !o->scale || !o->dv) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    if (o->batch_index != k) {
        if (o->b.T && o->b.T != T) return CLLM_FAIL(CLLM_ERR_INTERNAL, "PPO: seq_len changed");
        if ((st = ppo_batch_reserve(&o->b, o->p.batch_size, T))) return st;
        size_t N = (size_t)o->p.batch_size * T;
        float *a = realloc(o->adv, N * sizeof *a);
        if (a) o->adv = a;
        float *r = a ? realloc(o->ret, N * sizeof *r) : NULL;
        if (r) o->ret = r;
        if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        if ((st = new_batch(o, m, k))) return st;
    }
    if (o->epoch != e) permute(o, k, e);
    for (int i = 0; i < n; i++) {
        int r = o->order[j * o->mini + i];
        o->step_rows[i] = r;
        memcpy(tokens + (size_t)i * T, o->b.tokens + (size_t)r * T, (size_t)T * sizeof *tokens);
        memcpy(labels + (size_t)i * T, o->b.labels + (size_t)r * T, (size_t)T * sizeof *labels);
    }
    o->cursor = 0;
    return CLLM_OK;
}

/* ------------------------------------------------------------- losses */

static cllm_status ppo_run(cllm_objective *ob, cllm_model *m, const cllm_objective_batch *bt, bool backward,
                           float grad_scale, double *loss_sum, long *n_counted) {
    ppo *o = (ppo *)ob;
    const int B = bt->B, T = bt->T;
    *loss_sum = 0;
    *n_counted = 0;
    if (!backward)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "PPO: no evaluation pass (it trains on its own rollouts); leave "
                         "eval_interval and evaluation data unset");
    if (B > o->micro || o->cursor + B > o->mini)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "PPO: micro-batch of %d rows at row %d of %d", B, o->cursor, o->mini);
    const int *rows = o->step_rows + o->cursor;
    o->cursor += B;
    cllm_status st = cllm_model_prepare(m, B, T, true);
    cllm_token_io io;
    memset(&io, 0, sizeof io);
    io.token_loss = o->tl;
    io.values = o->vals;
    double s = 0;
    long k = 0;
    if (!st) st = cllm_model_forward_backward_ex(m, bt->tokens, bt->targets, B, T, false, 0.0f, &io, &s, &k);
    if (st) return st;
    const double cr = o->p.cliprange, cv = o->p.cliprange_value;
    double sums[S_COUNT] = {0}, ratio_sum = 0;
    long ntok = 0;
    memset(o->scale, 0, (size_t)B * T * sizeof *o->scale);
    memset(o->dv, 0, (size_t)B * T * sizeof *o->dv);
    for (int i = 0; i < B; i++) {
        const size_t rb = (size_t)rows[i] * T;
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)i * T + (size_t)t;
            if (bt->targets[n] == -100) continue;
            const double lp = -(double)o->tl[n], old = o->b.old_lp[rb + t], A = o->adv[rb + t];
            const double ratio = exp(lp - old);
            const double rc = ratio < 1 - cr ? 1 - cr : ratio > 1 + cr ? 1 + cr : ratio;
            const double pg1 = -A * ratio, pg2 = -A * rc, pg = pg1 >= pg2 ? pg1 : pg2;
            /* d pg / d lp: the unclipped branch's (the clipped one is flat where it wins) */
            const double dpg = pg1 >= pg2 ? -A * ratio : 0.0;
            const double v = o->vals[n], vold = o->b.old_v[rb + t], R = o->ret[rb + t];
            const double vc = v < vold - cv ? vold - cv : v > vold + cv ? vold + cv : v;
            const double e1 = (v - R) * (v - R), e2 = (vc - R) * (vc - R);
            const double vf = 0.5 * (e1 >= e2 ? e1 : e2), dvf = e1 >= e2 ? v - R : 0.0;
            sums[S_PG] += pg;
            sums[S_VF] += vf;
            sums[S_TOTAL] += pg + o->p.vf_coef * vf;
            sums[S_PG_CLIP] += pg2 > pg1 ? 1.0 : 0.0;
            sums[S_APPROXKL] += 0.5 * (lp - old) * (lp - old);
            sums[S_POLICYKL] += old - lp;
            sums[S_VF_CLIP] += e2 > e1 ? 1.0 : 0.0;
            sums[S_VPRED] += v;
            sums[S_VERR] += (v - R) * (v - R);
            ratio_sum += ratio;
            ntok++;
            /* token_loss = -lp */
            o->scale[n] = (float)(-dpg * (double)grad_scale);
            o->dv[n] = (float)(o->p.vf_coef * dvf * (double)grad_scale);
        }
    }
    /* trl's ratio_threshold: a micro-batch whose mean ratio is too large trains nothing */
    if (ntok > 0 && ratio_sum / (double)ntok > o->p.ratio_threshold) {
        memset(o->scale, 0, (size_t)B * T * sizeof *o->scale);
        memset(o->dv, 0, (size_t)B * T * sizeof *o->dv);
        sums[S_PG] = sums[S_VF] = sums[S_TOTAL] = 0;
    }
    memset(&io, 0, sizeof io);
    io.token_scale = o->scale;
    io.dvalues = o->dv;
    if ((st = cllm_model_forward_backward_ex(m, bt->tokens, bt->targets, B, T, true, grad_scale, &io, &s, &k)))
        return st;
    for (int i = 0; i < S_COUNT; i++) o->sums[i] += sums[i];
    o->n_tok += ntok;
    *loss_sum = sums[S_TOTAL];
    *n_counted = ntok;
    return CLLM_OK;
}

static int ppo_take_metrics(cllm_objective *ob, cllm_objective_metric *out, int cap) {
    ppo *o = (ppo *)ob;
    int n = 0;
    for (int i = 0; i < S_COUNT && n < cap; i++, n++) {
        out[n].name = step_names[i];
        out[n].value = o->n_tok > 0 ? o->sums[i] / (double)o->n_tok : 0.0;
    }
    for (int i = 0; i < B_COUNT && n < cap && o->have_stats; i++, n++) {
        out[n].name = batch_names[i];
        out[n].value = o->batch_stats[i];
    }
    memset(o->sums, 0, sizeof o->sums);
    o->n_tok = 0;
    return n;
}

static void ppo_free(cllm_objective *ob) {
    ppo *o = (ppo *)ob;
    cllm_ppo_source_free(o->src);
    cllm_model_free(o->ref);
    ppo_batch_free(&o->b);
    free(o->adv);
    free(o->ret);
    free(o->kl_full);
    free(o->order);
    free(o->step_rows);
    free(o->tl);
    free(o->vals);
    free(o->scale);
    free(o->dv);
    free(o);
}

static const cllm_objective_ops ppo_ops = {"ppo", ppo_run, ppo_free, ppo_take_metrics, NULL, ppo_rows,
                                           ppo_get_state, ppo_set_state};

static cllm_status check_params(const cllm_ppo_params *p, int mini) {
#define BAD(cond, ...) if (cond) return CLLM_FAIL(CLLM_ERR_ARG, __VA_ARGS__)
    BAD(!(p->init_kl_coef >= 0) || !isfinite(p->init_kl_coef), "ppo.init_kl_coef must be >= 0 (got %g)",
        p->init_kl_coef);
    BAD(!(p->target > 0) || !isfinite(p->target), "ppo.target must be positive (got %g)", p->target);
    BAD(!(p->horizon > 0) || !isfinite(p->horizon), "ppo.horizon must be positive (got %g)", p->horizon);
    BAD(!(p->gamma >= 0 && p->gamma <= 1), "ppo.gamma must be in [0, 1] (got %g)", p->gamma);
    BAD(!(p->lam >= 0 && p->lam <= 1), "ppo.lam must be in [0, 1] (got %g)", p->lam);
    BAD(!(p->cliprange > 0) || !isfinite(p->cliprange), "ppo.cliprange must be positive (got %g)", p->cliprange);
    BAD(!(p->cliprange_value > 0) || !isfinite(p->cliprange_value), "ppo.cliprange_value must be positive (got %g)",
        p->cliprange_value);
    BAD(!(p->vf_coef >= 0) || !isfinite(p->vf_coef), "ppo.vf_coef must be >= 0 (got %g)", p->vf_coef);
    BAD(p->ppo_epochs < 1, "ppo.ppo_epochs must be >= 1 (got %d)", p->ppo_epochs);
    BAD(!(p->ratio_threshold > 0), "ppo.ratio_threshold must be positive (got %g)", p->ratio_threshold);
    BAD(p->batch_size < 1 || p->batch_size % mini, "ppo.batch_size (%d rollouts per rank) must be a positive "
        "multiple of the rollouts each rank trains on per step (%d)", p->batch_size, mini);
    BAD(p->max_new_tokens < 1, "ppo.max_new_tokens must be >= 1 (got %d)", p->max_new_tokens);
    BAD(!(p->temperature > 0) || !isfinite(p->temperature), "ppo.temperature must be positive (got %g)",
        p->temperature);
    BAD(!(p->top_p > 0 && p->top_p <= 1), "ppo.top_p must be in (0, 1] (got %g)", p->top_p);
    BAD(p->top_k < 0, "ppo.top_k must be >= 0 (got %d)", p->top_k);
    BAD(!(p->score_clip >= 0) || !isfinite(p->score_clip), "ppo.score_clip must be positive (got %g)", p->score_clip);
#undef BAD
    return CLLM_OK;
}

cllm_status cllm_objective_ppo_init(cllm_objective **out, const cllm_ppo_params *p, cllm_ppo_source *src,
                                    cllm_model *ref, int micro_batch, int mini, uint64_t seed) {
    *out = NULL;
    cllm_ppo_params q = *p;
    if (q.batch_size == 0) q.batch_size = mini;
    cllm_status st = micro_batch < 1 || mini < micro_batch ? CLLM_FAIL(CLLM_ERR_ARG, "PPO: bad batch sizes")
                                                           : check_params(&q, mini);
    ppo *o = st ? NULL : calloc(1, sizeof *o);
    if (!st && !o) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (st) {
        cllm_ppo_source_free(src);
        cllm_model_free(ref);
        return st;
    }
    o->base.ops = &ppo_ops;
    o->p = q;
    o->src = src;
    o->ref = ref;
    o->micro = micro_batch;
    o->mini = mini;
    o->seed = seed;
    o->kl_coef = q.init_kl_coef;
    o->run_var = o->run_std = 1.0; /* trl's RunningMoments start: mean 0, var 1, count 1e-24 */
    o->run_count = 1e-24;
    o->batch_index = -1;
    o->epoch = -1;
    *out = &o->base;
    o->order = calloc((size_t)q.batch_size, sizeof *o->order);
    o->step_rows = calloc((size_t)mini, sizeof *o->step_rows);
    if (!o->order || !o->step_rows) {
        cllm_objective_free(*out);
        *out = NULL;
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    return CLLM_OK;
}
