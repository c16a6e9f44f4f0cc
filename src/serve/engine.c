/*
 * Continuous batching (see cllm/engine.h): request slots over one paged KV
 * cache, a FIFO queue, and a step that runs one ragged forward for every
 * running sequence and hands each sequence's logits to its cllm_generation.
 *
 * Each slot is one sequence of the cache. A slot's request reads its prompt
 * in chunks (fed < n_prompt) and then decodes: each step feeds the token
 * drawn in the previous step. Blocks are reserved at admission for the
 * longest the sequence can grow (prompt + max_new_tokens - 1 positions, at
 * most max_pos), so the cache never runs out mid-sequence.
 *
 * Left out: priorities and fairness beyond FIFO, preemption, prefix
 * sharing between requests, speculative decoding.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/engine.h"
#include "cllm/lora.h"
#include "cllm/quant.h"

typedef struct request {
    uint64_t id;
    cllm_generation *g;
    int32_t *prompt;
    size_t n_prompt, fed; /* prompt tokens, those already through the model */
    int reserve;          /* blocks reserved */
    int adapter;          /* LoRA adapter of the engine's set, -1: none */
    struct request *next; /* queue */
} request;

struct cllm_engine {
    const cllm_model *m;
    const cllm_tokenizer *tok;
    const struct cllm_lora_set *adapters;
    cllm_kv_cache *kv;
    int max_seqs, max_pos, block_size, n_blocks, max_rows, V;
    request **slot;       /* [max_seqs] running requests or NULL */
    request *head, *tail; /* queue */
    int queued, committed; /* queued requests; blocks reserved by running ones */
    uint64_t next_id, steps, rows;
    int32_t *tokens;      /* [max_rows] the step's packed new tokens */
    int *n_new;           /* [max_seqs] */
    float *logits;        /* [max_seqs, V] */
    int *ready;           /* [max_seqs] slots whose step draws a token, in slot order */
    cllm_engine_event *ev; /* [max_seqs] their events */
    cllm_status *st;      /* [max_seqs] their steps' statuses */
    char (*err)[256];     /* [max_seqs] a failed step's message (it was set on another thread) */
};

static void request_free(request *r) {
    if (!r) return;
    cllm_generate_free(r->g);
    free(r->prompt);
    free(r);
}

cllm_status cllm_engine_init(cllm_engine **out, const cllm_model *m, const cllm_tokenizer *tok,
                             const cllm_engine_params *p) {
    *out = NULL;
    if (!m || !p) return CLLM_FAIL(CLLM_ERR_ARG, "the model and the parameters are required");
    if (p->max_seqs < 0 || p->max_pos < 0 || p->block_size < 0 || p->n_blocks < 0 || p->max_batch_tokens < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "engine sizes must be >= 0 (0 = default)");
    cllm_engine *e = calloc(1, sizeof *e);
    if (!e) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    e->m = m;
    e->tok = tok;
    e->V = cllm_model_vocab(m);
    e->max_seqs = p->max_seqs ? p->max_seqs : 8;
    e->max_rows = p->max_batch_tokens ? p->max_batch_tokens : (e->max_seqs > 512 ? e->max_seqs : 512);
    e->next_id = 1;
    cllm_kv_cache_params kp = cllm_kv_cache_params_default();
    kp.max_seqs = e->max_seqs;
    kp.max_pos = p->max_pos;
    kp.max_rows = e->max_rows;
    if (p->block_size) kp.block_size = p->block_size;
    kp.n_blocks = p->n_blocks;
    kp.kv_dtype = p->kv_dtype;
    kp.prefault = true; /* the pool resident at start-up: no page faults in a step */
    cllm_status st = e->max_rows < e->max_seqs
                         ? CLLM_FAIL(CLLM_ERR_ARG, "max_batch_tokens %d is below max_seqs %d: every running "
                                     "sequence needs a row per step", e->max_rows, e->max_seqs)
                         : cllm_kv_cache_init_paged(&e->kv, m, &kp);
    e->adapters = p->adapters;
    if (!st && p->adapters) st = cllm_kv_cache_set_adapters(e->kv, p->adapters);
    if (!st) {
        e->max_pos = cllm_kv_cache_capacity(e->kv);
        e->block_size = cllm_kv_cache_block_size(e->kv);
        e->n_blocks = cllm_kv_cache_blocks_free(e->kv);
        e->slot = calloc((size_t)e->max_seqs, sizeof *e->slot);
        e->tokens = malloc((size_t)e->max_rows * sizeof *e->tokens);
        e->n_new = calloc((size_t)e->max_seqs, sizeof *e->n_new);
        e->logits = malloc((size_t)e->max_seqs * (size_t)e->V * sizeof *e->logits);
        e->ready = malloc((size_t)e->max_seqs * sizeof *e->ready);
        e->ev = malloc((size_t)e->max_seqs * sizeof *e->ev);
        e->st = malloc((size_t)e->max_seqs * sizeof *e->st);
        e->err = malloc((size_t)e->max_seqs * sizeof *e->err);
        if (!e->slot || !e->tokens || !e->n_new || !e->logits || !e->ready || !e->ev || !e->st || !e->err)
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    if (st) {
        cllm_engine_free(e);
        return st;
    }
    *out = e;
    return CLLM_OK;
}

void cllm_engine_free(cllm_engine *e) {
    if (!e) return;
    for (int i = 0; e->slot && i < e->max_seqs; i++) request_free(e->slot[i]);
    for (request *r = e->head, *n; r; r = n) {
        n = r->next;
        request_free(r);
    }
    cllm_kv_cache_free(e->kv);
    free(e->slot);
    free(e->tokens);
    free(e->n_new);
    free(e->logits);
    free(e->ready);
    free(e->ev);
    free(e->st);
    free(e->err);
    free(e);
}

/* Positions a request can fill: its prompt, then one per generated token
 * but the last (which is never fed back). */
static int positions(const cllm_engine *e, size_t n, int max_new) {
    long long want = (long long)n + (max_new > 0 ? max_new - 1 : 0);
    return want > e->max_pos ? e->max_pos : (int)want;
}

cllm_status cllm_engine_submit(cllm_engine *e, const int32_t *ids, size_t n, const cllm_generate_params *p,
                               uint64_t *id) {
    return cllm_engine_submit_adapter(e, ids, n, p, -1, id);
}

cllm_status cllm_engine_submit_adapter(cllm_engine *e, const int32_t *ids, size_t n, const cllm_generate_params *p,
                                       int adapter, uint64_t *id) {
    if (id) *id = 0;
    if (!p) return CLLM_FAIL(CLLM_ERR_ARG, "no generation parameters");
    if (adapter < -1 || adapter >= cllm_lora_set_count(e->adapters))
        return CLLM_FAIL(CLLM_ERR_ARG, "adapter %d: the engine has %d", adapter, cllm_lora_set_count(e->adapters));
    if (n > (size_t)e->max_pos)
        return CLLM_FAIL(CLLM_ERR_ARG, "the prompt has %zu tokens; a sequence holds at most %d positions", n,
                         e->max_pos);
    const cllm_kv_dtype pool = cllm_kv_cache_is_bf16(e->kv) ? CLLM_KV_BF16 : CLLM_KV_FP32;
    if (p->kv_dtype != CLLM_KV_AUTO && p->kv_dtype != pool)
        return CLLM_FAIL(CLLM_ERR_ARG, "the request asks for a %s key/value cache; the engine's pool is %s",
                         cllm_kv_dtype_name(p->kv_dtype) ? cllm_kv_dtype_name(p->kv_dtype) : "(invalid)",
                         cllm_kv_dtype_name(pool));
    request *r = calloc(1, sizeof *r);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int pos = positions(e, n, p->max_new_tokens);
    r->reserve = (pos + e->block_size - 1) / e->block_size;
    cllm_status st = r->reserve > e->n_blocks
                         ? CLLM_FAIL(CLLM_ERR_ARG, "the request needs %d cache blocks of %d positions; the pool has %d",
                                     r->reserve, e->block_size, e->n_blocks)
                         : cllm_generate_init(&r->g, e->m, e->tok, p);
    if (!st) st = cllm_generate_prefill_external(r->g, ids, n, e->max_pos);
    if (!st) {
        r->prompt = malloc(n * sizeof *r->prompt);
        if (!r->prompt) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        else memcpy(r->prompt, ids, n * sizeof *ids);
    }
    if (st) {
        request_free(r);
        return st;
    }
    r->n_prompt = n;
    r->adapter = adapter;
    r->id = e->next_id++;
    if (e->tail) e->tail->next = r;
    else e->head = r;
    e->tail = r;
    e->queued++;
    if (id) *id = r->id;
    return CLLM_OK;
}

/* Frees slot i and its blocks. */
static void retire(cllm_engine *e, int i) {
    request *r = e->slot[i];
    e->committed -= r->reserve;
    cllm_kv_cache_seq_rewind(e->kv, i, 0);
    request_free(r);
    e->slot[i] = NULL;
}

bool cllm_engine_cancel(cllm_engine *e, uint64_t id) {
    for (int i = 0; i < e->max_seqs; i++)
        if (e->slot[i] && e->slot[i]->id == id) {
            retire(e, i);
            return true;
        }
    for (request **pp = &e->head; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            request *r = *pp;
            *pp = r->next;
            if (e->tail == r) {
                e->tail = NULL;
                for (request *q = e->head; q; q = q->next) e->tail = q;
            }
            e->queued--;
            request_free(r);
            return true;
        }
    return false;
}

/* Moves queued requests into free slots while their blocks can be
 * reserved, in arrival order (a request that does not fit yet blocks the
 * ones behind it: first come, first served). */
static void admit(cllm_engine *e) {
    for (int i = 0; i < e->max_seqs && e->head; i++) {
        if (e->slot[i]) continue;
        request *r = e->head;
        if (e->committed + r->reserve > e->n_blocks) break;
        e->head = r->next;
        if (!e->head) e->tail = NULL;
        r->next = NULL;
        e->queued--;
        e->committed += r->reserve;
        e->slot[i] = r;
        if (e->adapters) cllm_kv_cache_seq_adapter(e->kv, i, r->adapter); /* in range: checked at submit */
    }
}

/* The draw of the k-th ready sequence of a step. */
static void draw_one(void *ctx, int k) {
    cllm_engine *e = ctx;
    const int i = e->ready[k];
    e->ev[k] = (cllm_engine_event){e->slot[i]->id, {0}};
    e->st[k] = cllm_generate_step_logits(e->slot[i]->g, e->logits + (size_t)i * (size_t)e->V, &e->ev[k].ev);
    if (e->st[k]) snprintf(e->err[k], sizeof e->err[k], "%s", cllm_last_error());
}

cllm_status cllm_engine_step(cllm_engine *e, cllm_engine_callback cb, void *user, int *n_events) {
    if (n_events) *n_events = 0;
    admit(e);
    /* rows: one per decoding sequence, then prompt chunks in slot order */
    int budget = e->max_rows, active = 0;
    for (int i = 0; i < e->max_seqs; i++) {
        request *r = e->slot[i];
        e->n_new[i] = r && r->fed == r->n_prompt ? 1 : 0;
        budget -= e->n_new[i];
        active += r != NULL;
    }
    if (!active) return CLLM_OK;
    for (int i = 0; i < e->max_seqs; i++) {
        request *r = e->slot[i];
        if (!r || r->fed == r->n_prompt) continue;
        size_t left = r->n_prompt - r->fed;
        int take = budget > 0 ? (left < (size_t)budget ? (int)left : budget) : 0;
        e->n_new[i] = take;
        budget -= take;
    }
    int n = 0;
    for (int i = 0; i < e->max_seqs; i++) {
        request *r = e->slot[i];
        if (!e->n_new[i]) continue;
        if (r->fed == r->n_prompt)
            e->tokens[n++] = cllm_generate_next_input(r->g);
        else
            for (int t = 0; t < e->n_new[i]; t++) e->tokens[n++] = r->prompt[r->fed + (size_t)t];
    }
    cllm_status st = cllm_kv_cache_forward_ragged(e->kv, e->tokens, e->n_new, e->logits);
    if (st) return cllm_fail_context(st, "engine step");
    e->steps++;
    e->rows += (uint64_t)n;
    int n_ready = 0;
    for (int i = 0; i < e->max_seqs; i++) {
        request *r = e->slot[i];
        if (!r || !e->n_new[i]) continue;
        if (r->fed < r->n_prompt) {
            r->fed += (size_t)e->n_new[i];
            if (r->fed < r->n_prompt) continue; /* the prompt goes on next step */
        }
        e->ready[n_ready++] = i;
    }
    /* Sampling, log-probabilities and text of every sequence at once (each
     * generation is its own object, the tokenizer is safe to share), on the
     * threads of the forward's matmuls (cllm_quant_parallel); the events
     * then go out in slot order on this thread. */
    cllm_quant_parallel(draw_one, e, n_ready);
    cllm_status first = CLLM_OK;
    for (int k = 0; k < n_ready; k++) {
        const int i = e->ready[k];
        if (e->st[k]) { /* this request cannot go on: end it, keep the others */
            cllm_generate_end(e->slot[i]->g, CLLM_FINISH_CANCELLED);
            retire(e, i);
            if (!first)
                first = cllm_fail(e->st[k], "engine step", "request %llu: %s", (unsigned long long)e->ev[k].id,
                                  e->err[k]);
            continue;
        }
        if (n_events) (*n_events)++;
        int stop = cb ? cb(&e->ev[k], user) : 0;
        if (e->ev[k].ev.finish || stop) retire(e, i);
    }
    return first;
}

void cllm_engine_get_stats(const cllm_engine *e, cllm_engine_stats *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < e->max_seqs; i++) s->running += e->slot[i] != NULL;
    s->queued = e->queued;
    s->blocks_free = cllm_kv_cache_blocks_free(e->kv);
    s->blocks_total = e->n_blocks;
    s->steps = e->steps;
    s->forward_rows = e->rows;
}
