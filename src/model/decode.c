/*
 * The decode loop of one sequence: prefill, then one token per step with
 * the stop rules (EOS ids, max_new_tokens, stop strings, the position
 * limit), streamed text with stop-string hold-back, log-probabilities and
 * timing. Built only on the public cllm_kv_cache_*, cllm_sampler_* and
 * cllm_text_stream_* calls, so a different cache underneath (ragged or
 * paged) changes nothing here.
 *
 * Forwards are lazy: a step first runs the previous token through the
 * model (if the sequence goes on), then samples. So the last token of a
 * sequence never costs a forward, and a failing forward leaves the object
 * untouched (the cache does not advance, nothing was drawn), so the step
 * can be retried.
 *
 * Top-n: with params.top_n > 0 each step lists the most likely tokens of
 * the raw logits (cllm_sampler_top_logprobs, the same log_softmax as
 * raw_logprob) in arrays the object owns, so the event borrows them.
 *
 * Text: the text stream yields whole UTF-8 characters; they are appended to
 * `text`, of which bytes [0, released) have been handed out. With stop
 * strings, after each append the unreleased tail is searched for the
 * earliest complete stop string (the text is cut there, and the sequence
 * finishes), else the earliest position from which the tail is a proper
 * prefix of a stop string is the new hold-back point. A match can never
 * start before `released`: text is only released up to the first position
 * that could still begin a stop string.
 *
 * Left out: beam search, batching several sequences in one forward (each
 * generation owns a one-sequence cache; a batching engine drives
 * cllm_kv_cache_forward_ragged on a shared paged cache), stop token-id
 * lists other than EOS.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/generate.h"
#include "cllm/kernels.h"

struct cllm_generation {
    const cllm_model *m;
    const cllm_tokenizer *tok;
    int V, max_new;
    int n_top;          /* min(top_n, V) */
    int32_t top_ids[CLLM_MAX_TOP_N];
    float top_lp[CLLM_MAX_TOP_N];
    bool ignore_eos, include_prompt;
    char **stop;        /* [n_stop] owned copies */
    size_t *stop_len;   /* [n_stop] */
    size_t n_stop;
    int32_t *eos;       /* [n_eos] */
    size_t n_eos;
    cllm_sampler *smp;
    cllm_kv_cache *kv;  /* from prefill on */
    cllm_kv_dtype kv_dtype; /* of kv */
    cllm_text_stream *ts;
    float *logits;      /* [V] logits for the next token (NULL: the caller's, external) */
    int32_t *hist;      /* [hist_cap] prompt, then generated ids */
    size_t n_hist, hist_cap, n_prompt;
    bool prefilled, need_forward, broken;
    bool external;      /* forwards run by the caller (a batching engine) */
    int ext_cap;        /* external: positions the caller's cache holds for the sequence */
    cllm_finish_reason finish;
    char *text;         /* NUL-terminated; [0, prompt_len) the prompt when included */
    size_t len, cap, released;
    cllm_generate_stats stats;
};

const char *cllm_finish_reason_name(cllm_finish_reason r) {
    switch (r) {
    case CLLM_FINISH_NONE: return "none";
    case CLLM_FINISH_EOS: return "eos";
    case CLLM_FINISH_LENGTH: return "length";
    case CLLM_FINISH_STOP_SEQUENCE: return "stop_sequence";
    case CLLM_FINISH_CONTEXT: return "context";
    case CLLM_FINISH_CANCELLED: return "cancelled";
    }
    return NULL;
}

cllm_generate_params cllm_generate_params_default(void) {
    cllm_generate_params p;
    memset(&p, 0, sizeof p);
    p.max_new_tokens = 64;
    p.sample = cllm_sample_params_default();
    return p;
}

static bool has_id(const int32_t *ids, size_t n, int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* The EOS list: the caller's, or the config's ids and the tokenizer's EOS
 * (ids outside the model's vocabulary can never be sampled and are left
 * out). */
static cllm_status set_eos(cllm_generation *g, const cllm_generate_params *p) {
    const cllm_model_config *c = cllm_model_get_config(g->m);
    size_t cap = p->eos_ids ? p->n_eos : (size_t)c->n_eos_token_ids + 1;
    g->eos = malloc((cap ? cap : 1) * sizeof *g->eos);
    if (!g->eos) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (p->eos_ids) {
        for (size_t i = 0; i < p->n_eos; i++) {
            if (p->eos_ids[i] < 0 || p->eos_ids[i] >= g->V)
                return CLLM_FAIL(CLLM_ERR_ARG, "eos_ids[%zu] = %d is outside the vocabulary [0, %d)", i,
                                 p->eos_ids[i], g->V);
            g->eos[g->n_eos++] = p->eos_ids[i];
        }
        return CLLM_OK;
    }
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] < g->V && !has_id(g->eos, g->n_eos, c->eos_token_ids[i]))
            g->eos[g->n_eos++] = c->eos_token_ids[i];
    int32_t te = g->tok ? cllm_tokenizer_eos_id(g->tok) : -1;
    if (te >= 0 && te < g->V && !has_id(g->eos, g->n_eos, te)) g->eos[g->n_eos++] = te;
    return CLLM_OK;
}

static cllm_status set_stops(cllm_generation *g, const cllm_generate_params *p) {
    if (!p->n_stop) return CLLM_OK;
    if (!p->stop) return CLLM_FAIL(CLLM_ERR_ARG, "n_stop is %zu but the stop list is NULL", p->n_stop);
    if (!g->tok)
        return CLLM_FAIL(CLLM_ERR_ARG, "stop strings need a tokenizer to turn the generated tokens into text");
    g->stop = calloc(p->n_stop, sizeof *g->stop);
    g->stop_len = calloc(p->n_stop, sizeof *g->stop_len);
    if (!g->stop || !g->stop_len) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0])
            return CLLM_FAIL(CLLM_ERR_ARG, "stop string %zu is %s; stop strings must be non-empty", i,
                             p->stop[i] ? "empty" : "NULL");
        size_t n = strlen(p->stop[i]);
        g->stop[i] = malloc(n + 1);
        if (!g->stop[i]) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        memcpy(g->stop[i], p->stop[i], n + 1);
        g->stop_len[i] = n;
        g->n_stop = i + 1;
    }
    return CLLM_OK;
}

cllm_status cllm_generate_init(cllm_generation **out, const cllm_model *m, const cllm_tokenizer *tok,
                               const cllm_generate_params *p) {
    *out = NULL;
    if (!m || !p) return CLLM_FAIL(CLLM_ERR_ARG, "the model and the parameters are required");
    if (p->max_new_tokens < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "max_new_tokens is %d; it must be >= 0", p->max_new_tokens);
    if (p->n_eos && !p->eos_ids) return CLLM_FAIL(CLLM_ERR_ARG, "n_eos is %zu but eos_ids is NULL", p->n_eos);
    if (p->top_n < 0 || p->top_n > CLLM_MAX_TOP_N)
        return CLLM_FAIL(CLLM_ERR_ARG, "top_n is %d; it must be in [0, %d]", p->top_n, CLLM_MAX_TOP_N);
    if (!cllm_kv_dtype_name(p->kv_dtype))
        return CLLM_FAIL(CLLM_ERR_ARG, "kv_dtype %d: expected CLLM_KV_AUTO, CLLM_KV_FP32 or CLLM_KV_BF16",
                         (int)p->kv_dtype);
    cllm_generation *g = calloc(1, sizeof *g);
    if (!g) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    g->m = m;
    g->tok = tok;
    g->V = cllm_model_vocab(m); /* a tensor part: the whole vocabulary */
    g->max_new = p->max_new_tokens;
    g->n_top = p->top_n < g->V ? p->top_n : g->V;
    g->ignore_eos = p->ignore_eos;
    g->kv_dtype = p->kv_dtype;
    g->include_prompt = p->include_prompt && tok;
    g->text = malloc(1);
    cllm_status st = g->text ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) {
        g->text[0] = 0;
        g->cap = 1;
        st = set_stops(g, p);
    }
    if (!st) st = set_eos(g, p);
    if (!st) st = cllm_sampler_init(&g->smp, g->V, p->sample, p->seed);
    if (st) {
        cllm_generate_free(g);
        return st;
    }
    *out = g;
    return CLLM_OK;
}

void cllm_generate_free(cllm_generation *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->stop_len);
    free(g->eos);
    cllm_sampler_free(g->smp);
    cllm_kv_cache_free(g->kv);
    cllm_text_stream_free(g->ts);
    free(g->logits);
    free(g->hist);
    free(g->text);
    free(g);
}

static cllm_status text_append(cllm_generation *g, const char *s, size_t n) {
    if (!n) return CLLM_OK;
    if (g->len + n + 1 > g->cap) {
        size_t cap = g->cap;
        while (cap < g->len + n + 1) cap *= 2;
        char *t = realloc(g->text, cap);
        if (!t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        g->text = t;
        g->cap = cap;
    }
    memcpy(g->text + g->len, s, n);
    g->len += n;
    g->text[g->len] = 0;
    return CLLM_OK;
}

/* Looks for stop strings in the unreleased text and moves `released`: to
 * the cut point on a match (returns true), else to the hold-back point, or
 * to the end when `final`. */
static bool scan_stops(cllm_generation *g, bool final) {
    for (size_t p = g->released; p < g->len; p++)
        for (size_t k = 0; k < g->n_stop; k++)
            if (g->len - p >= g->stop_len[k] && memcmp(g->text + p, g->stop[k], g->stop_len[k]) == 0) {
                g->len = g->released = p;
                g->text[p] = 0;
                return true;
            }
    size_t hold = g->len;
    for (size_t p = g->released; !final && p < g->len && hold == g->len; p++)
        for (size_t k = 0; k < g->n_stop; k++)
            if (g->len - p < g->stop_len[k] && memcmp(g->text + p, g->stop[k], g->len - p) == 0) {
                hold = p;
                break;
            }
    g->released = hold;
    return false;
}

/* The checks every prompt gets. */
static cllm_status prompt_check(const cllm_generation *g, const int32_t *ids, size_t n) {
    if (g->prefilled || g->finish)
        return CLLM_FAIL(CLLM_ERR_ARG, "the sequence already has its prompt; use a new object for a new prompt");
    if (!ids || n == 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "the prompt is empty; start it with the BOS token (at least one token is "
                                       "needed to predict the next)");
    if (cllm_model_check_ids(g->m, ids, NULL, n)) return cllm_fail_context(CLLM_ERR_ARG, "prompt");
    return CLLM_OK;
}

/* Back to the state before the prompt. */
static void prompt_undo(cllm_generation *g) {
    cllm_kv_cache_free(g->kv);
    cllm_text_stream_free(g->ts);
    free(g->hist);
    free(g->logits);
    g->kv = NULL;
    g->ts = NULL;
    g->hist = NULL;
    g->logits = NULL;
    g->len = g->released = 0;
    g->text[0] = 0;
    g->stats.prefill_seconds = 0;
}

/* History, logits (a sequence that runs its own forwards), text stream
 * and the prompt's text for a sequence of `cap` positions. */
static cllm_status prompt_setup(cllm_generation *g, const int32_t *ids, size_t n, int cap, bool own_logits) {
    g->hist_cap = (size_t)cap + 1; /* n + generated, and generated <= cap - n + 1 */
    g->hist = malloc(g->hist_cap * sizeof *g->hist);
    g->logits = own_logits ? malloc((size_t)g->V * sizeof *g->logits) : NULL;
    cllm_status st = g->hist && (g->logits || !own_logits) ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st && g->tok) st = cllm_text_stream_init(&g->ts, g->tok, ids, n);
    if (!st && g->include_prompt) {
        char *t = NULL;
        size_t tl = 0;
        st = cllm_tokenizer_decode(g->tok, ids, n, true, &t, &tl);
        if (!st) st = text_append(g, t, tl);
        free(t);
        g->released = g->len;
    }
    return st;
}

static void prompt_done(cllm_generation *g, const int32_t *ids, size_t n) {
    memcpy(g->hist, ids, n * sizeof *ids);
    g->n_hist = g->n_prompt = g->stats.n_prompt = n;
    g->prefilled = true;
}

cllm_status cllm_generate_prefill(cllm_generation *g, const int32_t *ids, size_t n) {
    const cllm_model_config *c = cllm_model_get_config(g->m);
    cllm_status st = prompt_check(g, ids, n);
    if (st) return st;
    if (c->n_ctx > 0 && n > (size_t)c->n_ctx)
        return CLLM_FAIL(CLLM_ERR_ARG, "the prompt has %zu tokens; the model handles at most %d positions", n,
                         c->n_ctx);
    if (n > (size_t)1 << 30) return CLLM_FAIL(CLLM_ERR_ARG, "the prompt has %zu tokens; at most 2^30 are handled", n);
    /* Positions: the prompt, then one per generated token but the last. */
    long long want = (long long)n + (g->max_new > 0 ? g->max_new - 1 : 0);
    int cap = want > (1 << 30) ? 1 << 30 : (int)want;
    if (c->n_ctx > 0 && cap > c->n_ctx) cap = c->n_ctx;

    /* one sequence of cap positions, the whole prompt in one call */
    cllm_kv_cache_params kp = cllm_kv_cache_params_default();
    kp.max_pos = cap;
    kp.max_rows = (int)n;
    kp.kv_dtype = g->kv_dtype;
    st = n > ((size_t)1 << 28) ? CLLM_FAIL(CLLM_ERR_NOMEM, "cache of 1 x %d positions is too large", cap)
                               : cllm_kv_cache_init_paged(&g->kv, g->m, &kp);
    if (!st) st = prompt_setup(g, ids, n, cap, true);
    if (!st) {
        double t0 = cllm_time_sec();
        st = cllm_kv_cache_forward(g->kv, ids, (int)n, g->logits);
        g->stats.prefill_seconds = cllm_time_sec() - t0;
    }
    if (st) {
        prompt_undo(g);
        return st;
    }
    prompt_done(g, ids, n);
    return CLLM_OK;
}

cllm_status cllm_generate_prefill_external(cllm_generation *g, const int32_t *ids, size_t n, int capacity) {
    cllm_status st = prompt_check(g, ids, n);
    if (st) return st;
    if (capacity < 1 || n > (size_t)capacity)
        return CLLM_FAIL(CLLM_ERR_ARG, "the prompt has %zu tokens; the cache holds %d positions for it", n, capacity);
    if ((st = prompt_setup(g, ids, n, capacity, false))) {
        prompt_undo(g);
        return st;
    }
    prompt_done(g, ids, n);
    g->external = true;
    g->ext_cap = capacity;
    return CLLM_OK;
}

/* Ends the sequence: releases held-back text (after the stream's last
 * bytes) unless it ended on a stop string. */
static cllm_status finish_up(cllm_generation *g, cllm_finish_reason why) {
    g->finish = why;
    if (why == CLLM_FINISH_STOP_SEQUENCE || !g->ts) return CLLM_OK;
    const char *s;
    size_t n;
    cllm_status st = cllm_text_stream_finish(g->ts, &s, &n);
    if (!st) st = text_append(g, s, n);
    if (!st) scan_stops(g, true);
    return st;
}

static cllm_status step_core(cllm_generation *g, cllm_generate_event *ev, double t0, const float *logits);

static cllm_status step_check(const cllm_generation *g, bool external) {
    if (!g->prefilled) return CLLM_FAIL(CLLM_ERR_ARG, "no prompt yet: call cllm_generate_prefill first");
    if (g->finish)
        return CLLM_FAIL(CLLM_ERR_ARG, "the sequence has finished (%s)", cllm_finish_reason_name(g->finish));
    if (g->broken) return CLLM_FAIL(CLLM_ERR_ARG, "an earlier step failed; the sequence cannot go on");
    if (g->external != external)
        return CLLM_FAIL(CLLM_ERR_ARG, external ? "this sequence runs its own forwards: use cllm_generate_step"
                                                : "this sequence's forwards are the caller's: use "
                                                  "cllm_generate_step_logits");
    return CLLM_OK;
}

cllm_status cllm_generate_step(cllm_generation *g, cllm_generate_event *ev) {
    *ev = (cllm_generate_event){.token = -1, .text = "", .finish = CLLM_FINISH_NONE};
    cllm_status st0 = step_check(g, false);
    if (st0) return st0;
    return step_core(g, ev, cllm_time_sec(), NULL);
}

cllm_status cllm_generate_step_logits(cllm_generation *g, const float *logits, cllm_generate_event *ev) {
    *ev = (cllm_generate_event){.token = -1, .text = "", .finish = CLLM_FINISH_NONE};
    cllm_status st0 = step_check(g, true);
    if (st0) return st0;
    if (!logits) return CLLM_FAIL(CLLM_ERR_ARG, "no logits");
    if (g->n_hist > g->n_prompt) g->stats.n_decode_forwards++;
    return step_core(g, ev, cllm_time_sec(), logits);
}

int32_t cllm_generate_next_input(const cllm_generation *g) {
    return g->prefilled && !g->finish && g->n_hist ? g->hist[g->n_hist - 1] : -1;
}

cllm_status cllm_generate_end(cllm_generation *g, cllm_finish_reason why) {
    if (g->finish) return CLLM_OK;
    if (why == CLLM_FINISH_NONE || why == CLLM_FINISH_CANCELLED) {
        cllm_generate_cancel(g);
        return CLLM_OK;
    }
    return finish_up(g, why);
}

/* One draw from `logits` (the caller's, read in place), or, when NULL,
 * from the sequence's own forward. */
static cllm_status step_core(cllm_generation *g, cllm_generate_event *ev, double t0, const float *logits) {
    const bool external = logits != NULL;
    size_t rel0 = g->released;
    cllm_status st = CLLM_OK;
    cllm_finish_reason why = CLLM_FINISH_NONE;
    size_t n_gen = g->n_hist - g->n_prompt;
    if (n_gen == (size_t)g->max_new) { /* max_new_tokens 0 */
        st = finish_up(g, CLLM_FINISH_LENGTH);
        goto out;
    }
    if (!external && g->need_forward) {
        st = cllm_kv_cache_forward(g->kv, &g->hist[g->n_hist - 1], 1, g->logits);
        if (st) return st; /* nothing changed: the step may be retried */
        g->need_forward = false;
        g->stats.n_decode_forwards++;
    }
    if (!external) logits = g->logits;
    int32_t id;
    double lp;
    st = cllm_sampler_sample_ex(g->smp, &id, &lp, logits, g->hist, g->n_hist, g->n_prompt);
    if (!st && g->n_top) st = cllm_sampler_top_logprobs(g->top_ids, g->top_lp, g->n_top, logits, g->V);
    if (st) goto out;
    ev->token = id;
    ev->logprob = (float)lp;
    ev->raw_logprob = cllm_sampler_raw_logprob(logits[id], cllm_logsumexp(logits, g->V));
    if (g->n_top) {
        ev->n_top = g->n_top;
        ev->top_ids = g->top_ids;
        ev->top_logprobs = g->top_lp;
    }
    g->hist[g->n_hist++] = id;
    g->stats.n_generated++;
    n_gen++;
    if (!g->ignore_eos && has_id(g->eos, g->n_eos, id)) {
        why = CLLM_FINISH_EOS;
    } else if (g->ts) {
        const char *s;
        size_t n;
        st = cllm_text_stream_push(g->ts, id, &s, &n);
        if (!st) st = text_append(g, s, n);
        if (st) goto out;
        if (scan_stops(g, false)) why = CLLM_FINISH_STOP_SEQUENCE;
    }
    if (!why && n_gen == (size_t)g->max_new) why = CLLM_FINISH_LENGTH;
    /* no position left to feed the token just drawn */
    if (!why && (external ? (long)g->n_hist - 1 >= g->ext_cap
                          : cllm_kv_cache_pos(g->kv) == cllm_kv_cache_capacity(g->kv)))
        why = CLLM_FINISH_CONTEXT;
    if (why)
        st = finish_up(g, why);
    else
        g->need_forward = true;
out:
    if (st) {
        g->broken = true;
        return st;
    }
    ev->text = g->text + rel0;
    ev->text_len = g->released - rel0;
    ev->finish = g->finish;
    g->stats.decode_seconds += cllm_time_sec() - t0;
    return CLLM_OK;
}

void cllm_generate_cancel(cllm_generation *g) {
    if (g->finish) return;
    g->finish = CLLM_FINISH_CANCELLED;
    g->len = g->released; /* drop held-back text */
    g->text[g->len] = 0;
}

cllm_status cllm_generate_run(cllm_generation *g, const int32_t *ids, size_t n, cllm_generate_callback cb,
                              void *user) {
    cllm_status st = cllm_generate_prefill(g, ids, n);
    while (!st) {
        cllm_generate_event ev;
        st = cllm_generate_step(g, &ev);
        if (st) break;
        int stop = cb ? cb(&ev, user) : 0;
        if (ev.finish) break;
        if (stop) {
            cllm_generate_cancel(g);
            break;
        }
    }
    return st;
}

cllm_finish_reason cllm_generate_finish_reason(const cllm_generation *g) { return g->finish; }

const int32_t *cllm_generate_tokens(const cllm_generation *g, size_t *n) {
    *n = g->prefilled ? g->n_hist - g->n_prompt : 0;
    return g->hist ? g->hist + g->n_prompt : NULL;
}

const char *cllm_generate_text(const cllm_generation *g, size_t *len) {
    if (len) *len = g->released;
    return g->text;
}

cllm_generate_stats cllm_generate_get_stats(const cllm_generation *g) { return g->stats; }
