/*
 * Token sampling with HF generate() semantics.
 *
 * Order of the processors, as in transformers and TGI: the logits
 * processors (applied in greedy mode too) logit bias, repetition penalty,
 * frequency/presence penalties; then the warpers temperature, top-k, top-p,
 * typical-p; then a softmax and one draw.
 *   bias:        l[id] += b for each (id, b) of the logit bias
 *   penalty:     for each distinct id in the history, l = l > 0 ? l / r : l * r
 *   freq/pres:   for each distinct id among the generated tokens, counted c
 *                times, l -= c * f + p (OpenAI)
 *   temperature: l = l / T
 *   top-k:       drop every logit strictly below the k-th largest
 *   top-p:       sort the survivors by probability (descending, lower id first
 *                on ties), keep the shortest prefix whose probabilities sum
 *                to >= p, and always the first token
 *   typical-p:   H = -sum p ln p over the survivors; sort them by
 *                |-ln p - H| (ascending, lower id first on ties), find the
 *                first position whose cumulative probability reaches the
 *                mass, keep every token whose score is <= that position's
 *                (HF's TypicalLogitsWarper, ties included)
 *   draw:        u = uniform[0,1) * (sum of kept probabilities), walk the kept
 *                tokens in id order to the first cumulative sum > u
 * Sums are in double so the kept set and the draw do not depend on how many
 * tokens are in the vocabulary beyond rounding of each probability.
 *
 * Also here: the top-n alternatives of the raw distribution
 * (cllm_sampler_top_logprobs), by one pass with a small sorted list, their
 * log-probabilities x - logsumexp(x) with cllm_logsumexp's normaliser.
 * Greedy draws read the logits in place (no copy, no distribution written)
 * unless a logits processor is on.
 *
 * Left out: min-p and epsilon sampling, beam search.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/generate.h"
#include "cllm/kernels.h"

typedef struct {
    double p;
    int32_t id;
} cand;

struct cllm_sampler {
    int V;
    cllm_sample_params p;
    cllm_rng rng;
    float *work;      /* [V] processed logits */
    double *prob;     /* [V] probabilities; 0 = removed */
    int32_t *order;   /* [V] candidate ids */
    cand *sorted;     /* [V] candidates by probability (top-p) or typicality */
    unsigned char *seen; /* [V] repetition-penalty marks, all zero between calls */
    uint32_t *count;  /* [V] generated-token counts, all zero between calls */
    int32_t *bias_ids; /* [n_bias] copied logit bias */
    float *bias_values;
};

cllm_sample_params cllm_sample_params_default(void) {
    return (cllm_sample_params){.greedy = false, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                                .repetition_penalty = 1.0f, .typical_p = 0.0f};
}

/* The checks of the fields that follow repetition_penalty. */
static cllm_status check_extra(const cllm_sample_params *p) {
    if (!(p->typical_p >= 0.0f && p->typical_p <= 1.0f))
        return CLLM_FAIL(CLLM_ERR_ARG, "typical_p %g must be in [0, 1] (0 or 1 = off)", (double)p->typical_p);
    if (!(fabsf(p->frequency_penalty) <= CLLM_MAX_PENALTY))
        return CLLM_FAIL(CLLM_ERR_ARG, "frequency_penalty %g must be in [-2, 2] (0 = off)",
                         (double)p->frequency_penalty);
    if (!(fabsf(p->presence_penalty) <= CLLM_MAX_PENALTY))
        return CLLM_FAIL(CLLM_ERR_ARG, "presence_penalty %g must be in [-2, 2] (0 = off)",
                         (double)p->presence_penalty);
    if (p->n_bias && (!p->bias_ids || !p->bias_values))
        return CLLM_FAIL(CLLM_ERR_ARG, "n_bias is %zu but bias_ids or bias_values is NULL", p->n_bias);
    return CLLM_OK;
}

/* Copies the logit bias after checking each entry (seen[] is zero before
 * and after). */
static cllm_status copy_bias(cllm_sampler *s, const cllm_sample_params *p) {
    if (!p->n_bias) return CLLM_OK;
    if (p->n_bias > (size_t)s->V) /* also keeps the sizes below from overflowing */
        return CLLM_FAIL(CLLM_ERR_ARG, "logit bias: n_bias %zu exceeds the vocabulary of %d (each id at most once)",
                         p->n_bias, s->V);
    s->bias_ids = malloc(p->n_bias * sizeof *s->bias_ids);
    s->bias_values = malloc(p->n_bias * sizeof *s->bias_values);
    if (!s->bias_ids || !s->bias_values) return CLLM_FAIL(CLLM_ERR_NOMEM, "logit bias: out of memory");
    cllm_status st = CLLM_OK;
    size_t i = 0;
    for (; i < p->n_bias && !st; i++) {
        int32_t id = p->bias_ids[i];
        float v = p->bias_values[i];
        if (id < 0 || id >= s->V)
            st = CLLM_FAIL(CLLM_ERR_ARG, "logit bias: bias_ids[%zu] = %d is outside the vocabulary [0, %d)", i, id,
                           s->V);
        else if (!(fabsf(v) <= CLLM_MAX_LOGIT_BIAS))
            st = CLLM_FAIL(CLLM_ERR_ARG, "logit bias: bias_values[%zu] = %g (token %d) must be in [-100, 100]", i,
                           (double)v, id);
        else if (s->seen[id])
            st = CLLM_FAIL(CLLM_ERR_ARG, "logit bias: token %d is listed twice (bias_ids[%zu]); give each id once",
                           id, i);
        else
            s->seen[id] = 1;
        s->bias_ids[i] = id;
        s->bias_values[i] = v;
    }
    for (size_t j = 0; j < i; j++)
        if (s->bias_ids[j] >= 0 && s->bias_ids[j] < s->V) s->seen[s->bias_ids[j]] = 0;
    return st;
}

cllm_status cllm_sampler_init(cllm_sampler **out, int V, cllm_sample_params p, uint64_t seed) {
    *out = NULL;
    if (V < 1) return CLLM_FAIL(CLLM_ERR_ARG, "vocabulary size %d must be positive", V);
    if (!(p.temperature >= 0.0f) || !isfinite(p.temperature))
        return CLLM_FAIL(CLLM_ERR_ARG, "temperature %g must be >= 0 (0 = greedy)", (double)p.temperature);
    if (p.top_k < 0) return CLLM_FAIL(CLLM_ERR_ARG, "top_k %d must be >= 0 (0 = off)", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return CLLM_FAIL(CLLM_ERR_ARG, "top_p %g must be in (0, 1] (1 = off)", (double)p.top_p);
    if (!(p.repetition_penalty > 0.0f) || !isfinite(p.repetition_penalty))
        return CLLM_FAIL(CLLM_ERR_ARG, "repetition_penalty %g must be > 0 (1 = off)", (double)p.repetition_penalty);
    cllm_status st = check_extra(&p);
    if (st) return st;
    cllm_sampler *s = calloc(1, sizeof *s);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    s->V = V;
    s->p = p;
    if (p.temperature == 0.0f) s->p.greedy = true;
    cllm_rng_seed(&s->rng, seed);
    s->work = malloc((size_t)V * sizeof *s->work);
    s->prob = malloc((size_t)V * sizeof *s->prob);
    s->order = malloc((size_t)V * sizeof *s->order);
    s->sorted = malloc((size_t)V * sizeof *s->sorted);
    s->seen = calloc((size_t)V, 1);
    s->count = calloc((size_t)V, sizeof *s->count);
    if (!s->work || !s->prob || !s->order || !s->sorted || !s->seen || !s->count) {
        cllm_sampler_free(s);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "sampler for %d tokens: out of memory", V);
    }
    s->p.bias_ids = NULL;
    s->p.bias_values = NULL;
    s->p.n_bias = 0;
    if ((st = copy_bias(s, &p))) {
        cllm_sampler_free(s);
        return st;
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias_values = s->bias_values;
    s->p.n_bias = p.n_bias;
    *out = s;
    return CLLM_OK;
}

void cllm_sampler_free(cllm_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->prob);
    free(s->order);
    free(s->sorted);
    free(s->seen);
    free(s->count);
    free(s->bias_ids);
    free(s->bias_values);
    free(s);
}

/* Descending probability, then ascending id: a total order, so the kept
 * set does not depend on qsort's algorithm. */
static int by_prob_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* k-th largest of x[order[0..n)] by quickselect (order is permuted). */
static float kth_largest(const float *x, int32_t *order, int n, int k) {
    int lo = 0, hi = n - 1, target = k - 1;
    while (lo < hi) {
        float pivot = x[order[(lo + hi) / 2]];
        int i = lo, j = hi;
        while (i <= j) {
            while (x[order[i]] > pivot) i++;
            while (x[order[j]] < pivot) j--;
            if (i <= j) {
                int32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
                i++;
                j--;
            }
        }
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            break;
    }
    return x[order[target]];
}

/* Ascending score (kept in cand.p), then ascending id. */
static int by_score_asc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The logits processors on w (in place): bias, repetition penalty over the
 * whole history, frequency/presence penalties over hist[n_prompt ..). */
static void apply_processors(cllm_sampler *s, float *w, const int32_t *hist, size_t n_hist, size_t n_prompt) {
    const cllm_sample_params *p = &s->p;
    for (size_t i = 0; i < p->n_bias; i++) w[p->bias_ids[i]] += p->bias_values[i];
    if (p->repetition_penalty != 1.0f) {
        const float r = p->repetition_penalty;
        for (size_t i = 0; i < n_hist; i++) {
            int32_t id = hist[i];
            if (s->seen[id]) continue;
            s->seen[id] = 1;
            w[id] = w[id] > 0.0f ? w[id] / r : w[id] * r;
        }
        for (size_t i = 0; i < n_hist; i++) s->seen[hist[i]] = 0;
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        for (size_t i = n_prompt; i < n_hist; i++) s->count[hist[i]]++;
        for (size_t i = n_prompt; i < n_hist; i++) {
            int32_t id = hist[i];
            if (!s->count[id]) continue;
            w[id] = (float)((double)w[id] - (double)s->count[id] * p->frequency_penalty - p->presence_penalty);
            s->count[id] = 0;
        }
    }
}

/* Typical-p on the n candidates ids[] of the normalised s->prob. */
static void typical_filter(cllm_sampler *s, const int32_t *ids, int n, double mass) {
    cand *c = s->sorted;
    double H = 0.0;
    for (int i = 0; i < n; i++) H -= s->prob[ids[i]] * log(s->prob[ids[i]]);
    for (int i = 0; i < n; i++) c[i] = (cand){fabs(-log(s->prob[ids[i]]) - H), ids[i]};
    qsort(c, (size_t)n, sizeof *c, by_score_asc);
    double cum = 0.0;
    int last = n - 1;
    for (int i = 0; i < n; i++) {
        cum += s->prob[c[i].id];
        if (cum >= mass) {
            last = i;
            break;
        }
    }
    int keep = last + 1;
    while (keep < n && c[keep].p <= c[last].p) keep++;
    double kept = 0.0;
    for (int i = 0; i < keep; i++) kept += s->prob[c[i].id];
    for (int i = keep; i < n; i++) s->prob[c[i].id] = 0.0;
    for (int i = 0; i < keep; i++) s->prob[c[i].id] /= kept;
}

/* The first index of the largest value, NaNs never winning (x[0] when it
 * is NaN, as a scan that replaces the best only by a larger value gives):
 * the max by a vectorisable pass, then its first position. */
static int32_t argmax_first(const float *x, int V) {
    if (x[0] != x[0]) return 0;
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < V; i++)
        if (x[i] == m) return i;
    return 0;
}

/* Fills s->prob with the final distribution (normalised to sum 1 over the
 * kept tokens). Returns the argmax id when greedy, else -1. */
static cllm_status process(cllm_sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                           size_t n_prompt, int32_t *argmax, bool want_prob) {
    const int V = s->V;
    const cllm_sample_params *p = &s->p;
    if (n_prompt > n_hist)
        return CLLM_FAIL(CLLM_ERR_ARG, "n_prompt %zu exceeds the history's %zu tokens", n_prompt, n_hist);
    for (size_t i = 0; i < n_hist; i++)
        if (hist[i] < 0 || hist[i] >= V)
            return CLLM_FAIL(CLLM_ERR_ARG, "history id %d at position %zu is outside the vocabulary [0, %d)", hist[i],
                             i, V);
    float *w = s->work;
    *argmax = -1;
    if (p->greedy) {
        /* the argmax of the processed logits: without processors, of the
         * logits themselves (no copy); the one-hot distribution is written
         * only when asked for (cllm_sampler_probs) */
        const bool procs = p->n_bias || p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                           p->presence_penalty != 0.0f;
        const float *x = logits;
        if (procs) {
            memcpy(w, logits, (size_t)V * sizeof *w);
            apply_processors(s, w, hist, n_hist, n_prompt);
            x = w;
        }
        const int32_t best = argmax_first(x, V);
        if (want_prob) {
            memset(s->prob, 0, (size_t)V * sizeof *s->prob);
            s->prob[best] = 1.0;
        }
        *argmax = best;
        return CLLM_OK;
    }
    memcpy(w, logits, (size_t)V * sizeof *w);
    apply_processors(s, w, hist, n_hist, n_prompt);
    if (p->temperature != 1.0f)
        for (int i = 0; i < V; i++) w[i] /= p->temperature;
    float cut = -INFINITY;
    if (p->top_k > 0 && p->top_k < V) {
        for (int i = 0; i < V; i++) s->order[i] = i;
        cut = kth_largest(w, s->order, V, p->top_k);
    }
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (w[i] >= cut && w[i] > mx) mx = w[i];
    double sum = 0.0;
    int n = 0;
    for (int i = 0; i < V; i++) {
        double e = (w[i] >= cut && w[i] > -INFINITY) ? exp((double)w[i] - (double)mx) : 0.0;
        s->prob[i] = e;
        sum += e;
        if (e > 0.0) s->order[n++] = i;
    }
    if (!(sum > 0.0) || !isfinite(sum)) return CLLM_FAIL(CLLM_ERR_ARG, "logits are not finite; cannot sample");
    for (int i = 0; i < n; i++) s->prob[s->order[i]] /= sum;
    if (p->top_p < 1.0f) {
        cand *c = s->sorted;
        for (int i = 0; i < n; i++) c[i] = (cand){s->prob[s->order[i]], s->order[i]};
        qsort(c, (size_t)n, sizeof *c, by_prob_desc);
        double cum = 0.0;
        int keep = 0;
        while (keep < n) {
            cum += c[keep++].p;
            if (cum >= (double)p->top_p) break;
        }
        for (int i = keep; i < n; i++) s->prob[c[i].id] = 0.0;
        for (int i = 0; i < keep; i++) s->prob[c[i].id] /= cum;
    }
    if (p->typical_p > 0.0f && p->typical_p < 1.0f) {
        int m = 0; /* the survivors, in id order, packed into s->order */
        for (int i = 0; i < n; i++)
            if (s->prob[s->order[i]] > 0.0) s->order[m++] = s->order[i];
        typical_filter(s, s->order, m, (double)p->typical_p);
    }
    return CLLM_OK;
}

cllm_status cllm_sampler_probs_ex(cllm_sampler *s, float *probs, const float *logits, const int32_t *history,
                                  size_t n_history, size_t n_prompt) {
    int32_t am;
    cllm_status st = process(s, logits, history, n_history, n_prompt, &am, true);
    if (st) return st;
    for (int i = 0; i < s->V; i++) probs[i] = (float)s->prob[i];
    return CLLM_OK;
}

cllm_status cllm_sampler_probs(cllm_sampler *s, float *probs, const float *logits, const int32_t *history,
                               size_t n_history) {
    return cllm_sampler_probs_ex(s, probs, logits, history, n_history, 0);
}

cllm_status cllm_sampler_sample(cllm_sampler *s, int32_t *token, const float *logits, const int32_t *history,
                                size_t n_history) {
    return cllm_sampler_sample_ex(s, token, NULL, logits, history, n_history, 0);
}

cllm_status cllm_sampler_sample_logprob(cllm_sampler *s, int32_t *token, double *logprob, const float *logits,
                                        const int32_t *history, size_t n_history) {
    return cllm_sampler_sample_ex(s, token, logprob, logits, history, n_history, 0);
}

/* The drawn token's probability is read from s->prob (normalised over the
 * kept tokens), so it is the one cllm_sampler_probs reports, in double. */
cllm_status cllm_sampler_sample_ex(cllm_sampler *s, int32_t *token, double *logprob, const float *logits,
                                   const int32_t *history, size_t n_history, size_t n_prompt) {
    int32_t am;
    double lp_unused;
    if (!logprob) logprob = &lp_unused;
    cllm_status st = process(s, logits, history, n_history, n_prompt, &am, false);
    if (st) return st;
    if (am >= 0) {
        *token = am;
        *logprob = 0.0;
        return CLLM_OK;
    }
    double total = 0.0;
    int32_t last = -1;
    for (int i = 0; i < s->V; i++)
        if (s->prob[i] > 0.0) {
            total += s->prob[i];
            last = i;
        }
    double u = cllm_rng_uniform(&s->rng) * total, cum = 0.0;
    for (int i = 0; i < s->V; i++) {
        if (s->prob[i] <= 0.0) continue;
        cum += s->prob[i];
        if (cum > u) {
            *token = i;
            *logprob = log(s->prob[i]);
            return CLLM_OK;
        }
    }
    *token = last; /* u rounded up to the total */
    *logprob = log(s->prob[last]);
    return CLLM_OK;
}

/* One pass over the vocabulary keeping the best n so far in ids[0..k)
 * (sorted, highest first, lower id first on ties): a new entry is inserted
 * only when it beats the current last, so the cost is V plus n per
 * insertion. */
cllm_status cllm_sampler_top_logprobs(int32_t *ids, float *logprobs, int n, const float *logits, int V) {
    if (V < 1 || n < 0 || n > V)
        return CLLM_FAIL(CLLM_ERR_ARG, "top-n: n = %d must be in [0, V = %d]", n, V);
    if (n == 0) return CLLM_OK;
    for (int i = 0; i < V; i++)
        if (!isfinite(logits[i])) return CLLM_FAIL(CLLM_ERR_ARG, "top-n: logit %d is not finite", i);
    const double lse = cllm_logsumexp(logits, V);
    int k = 0;
    for (int i = 0; i < V; i++) {
        float lp = cllm_sampler_raw_logprob(logits[i], lse);
        if (k == n && !(lp > logprobs[k - 1])) continue; /* ids ascend: a tie loses to the earlier id */
        int j = k < n ? k++ : n - 1;
        while (j > 0 && lp > logprobs[j - 1]) {
            ids[j] = ids[j - 1];
            logprobs[j] = logprobs[j - 1];
            j--;
        }
        ids[j] = i;
        logprobs[j] = lp;
    }
    return CLLM_OK;
}

float cllm_sampler_raw_logprob(float logit, double lse) { return (float)((double)logit - lse); }
