/*
 * Token sampling with HF generate() semantics.
 *
 * Order of the processors, as in transformers: repetition penalty (a logits
 * processor, applied in greedy mode too), then the warpers temperature,
 * top-k, top-p, then a softmax and one draw.
 *   penalty:     for each distinct id in the history, l = l > 0 ? l / r : l * r
 *   temperature: l = l / T
 *   top-k:       drop every logit strictly below the k-th largest
 *   top-p:       sort the survivors by probability (descending, lower id first
 *                on ties), keep the shortest prefix whose probabilities sum
 *                to >= p, and always the first token
 *   draw:        u = uniform[0,1) * (sum of kept probabilities), walk the kept
 *                tokens in id order to the first cumulative sum > u
 * Sums are in double so the kept set and the draw do not depend on how many
 * tokens are in the vocabulary beyond rounding of each probability.
 *
 * Left out: min-p, typical and epsilon sampling, beam search, frequency and
 * presence penalties (OpenAI style), per-token logit biases.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/generate.h"

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
    cand *sorted;     /* [V] candidates by probability, for top-p */
    unsigned char *seen; /* [V] repetition-penalty marks, all zero between calls */
};

cllm_sample_params cllm_sample_params_default(void) {
    return (cllm_sample_params){.greedy = false, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                                .repetition_penalty = 1.0f};
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
    if (!s->work || !s->prob || !s->order || !s->sorted || !s->seen) {
        cllm_sampler_free(s);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "sampler for %d tokens: out of memory", V);
    }
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

/* Fills s->prob with the final distribution (normalised to sum 1 over the
 * kept tokens). Returns the argmax id when greedy, else -1. */
static cllm_status process(cllm_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, int32_t *argmax) {
    const int V = s->V;
    const cllm_sample_params *p = &s->p;
    for (size_t i = 0; i < n_hist; i++)
        if (hist[i] < 0 || hist[i] >= V)
            return CLLM_FAIL(CLLM_ERR_ARG, "history id %d at position %zu is outside the vocabulary [0, %d)", hist[i],
                             i, V);
    float *w = s->work;
    memcpy(w, logits, (size_t)V * sizeof *w);
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
    *argmax = -1;
    if (p->greedy) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (w[i] > w[best]) best = i;
        memset(s->prob, 0, (size_t)V * sizeof *s->prob);
        s->prob[best] = 1.0;
        *argmax = best;
        return CLLM_OK;
    }
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
    return CLLM_OK;
}

cllm_status cllm_sampler_probs(cllm_sampler *s, float *probs, const float *logits, const int32_t *history,
                               size_t n_history) {
    int32_t am;
    cllm_status st = process(s, logits, history, n_history, &am);
    if (st) return st;
    for (int i = 0; i < s->V; i++) probs[i] = (float)s->prob[i];
    return CLLM_OK;
}

cllm_status cllm_sampler_sample(cllm_sampler *s, int32_t *token, const float *logits, const int32_t *history,
                                size_t n_history) {
    double logprob;
    return cllm_sampler_sample_logprob(s, token, &logprob, logits, history, n_history);
}

/* The drawn token's probability is read from s->prob (normalised over the
 * kept tokens), so it is the one cllm_sampler_probs reports, in double. */
cllm_status cllm_sampler_sample_logprob(cllm_sampler *s, int32_t *token, double *logprob, const float *logits,
                                        const int32_t *history, size_t n_history) {
    int32_t am;
    cllm_status st = process(s, logits, history, n_history, &am);
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
