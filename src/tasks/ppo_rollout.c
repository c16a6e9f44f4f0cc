/*
 * PPO rollout sources (cllm/objective.h): fixed rollouts read from a JSONL
 * file, or rollouts generated from prompts with the policy's key/value
 * cache and scored by a reward model.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/generate.h"
#include "cllm/loader.h"
#include "ppo_impl.h"

typedef struct {
    int32_t *query, *response;
    int nq, nr;
    float score;
    float *lp, *v, *ref; /* [nr] or NULL */
    long line;
} rollout;

struct cllm_ppo_source {
    /* file */
    char *path;
    rollout *recs;
    size_t n_recs;
    /* generation */
    cllm_loader *prompts;
    int32_t *ptok, *plab; /* [T] a prompt row */
    int cap_T;
    cllm_model *reward;
    uint64_t seed;
    int32_t *pos; /* [R] scored positions */
    size_t cap_pos;
    cllm_status (*lend)(void *ctx, bool on); /* the policy's whole parameters, when partitioned */
    void *lend_ctx;
};

void cllm_ppo_source_set_lender(cllm_ppo_source *s, cllm_status (*lend)(void *ctx, bool on), void *ctx) {
    s->lend = lend;
    s->lend_ctx = ctx;
}

cllm_status ppo_source_lend(cllm_ppo_source *s, bool on) { return s->lend ? s->lend(s->lend_ctx, on) : CLLM_OK; }

/* ------------------------------------------------------------- batch */

cllm_status ppo_batch_reserve(ppo_batch *b, int R, int T) {
    b->R = R;
    b->T = T;
    if (R <= b->cap_R && T <= b->cap_T && (size_t)R * T <= (size_t)b->cap_R * b->cap_T) return CLLM_OK;
    ppo_batch nb = {.R = R, .T = T, .cap_R = R, .cap_T = T};
    size_t n = (size_t)R * (size_t)T;
    nb.tokens = malloc(n * sizeof(int32_t));
    nb.labels = malloc(n * sizeof(int32_t));
    nb.q_len = malloc((size_t)R * sizeof(int));
    nb.r_len = malloc((size_t)R * sizeof(int));
    nb.score = malloc((size_t)R * sizeof(float));
    nb.old_lp = calloc(n, sizeof(float));
    nb.old_v = calloc(n, sizeof(float));
    nb.ref_lp = calloc(n, sizeof(float));
    if (!nb.tokens || !nb.labels || !nb.q_len || !nb.r_len || !nb.score || !nb.old_lp || !nb.old_v || !nb.ref_lp) {
        ppo_batch_free(&nb);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for a PPO batch of %d rows", R);
    }
    ppo_batch_free(b);
    *b = nb;
    return CLLM_OK;
}

void ppo_batch_free(ppo_batch *b) {
    free(b->tokens);
    free(b->labels);
    free(b->q_len);
    free(b->r_len);
    free(b->score);
    free(b->old_lp);
    free(b->old_v);
    free(b->ref_lp);
    memset(b, 0, sizeof *b);
}

/* Row r = query + response, labels -100 on the query and the padding. */
static cllm_status put_row(ppo_batch *b, int r, const int32_t *q, int nq, const int32_t *resp, int nr, int32_t pad,
                           const char *where) {
    const int T = b->T;
    if (nq < 1 || nr < 1 || nq + nr > T)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a rollout of %d query and %d response tokens does not fit seq_len %d "
                         "(each needs at least one token)", where, nq, nr, T);
    int32_t *tok = b->tokens + (size_t)r * T, *lab = b->labels + (size_t)r * T;
    for (int t = 0; t < T; t++) {
        tok[t] = t < nq ? q[t] : t < nq + nr ? resp[t - nq] : pad;
        lab[t] = t >= nq && t < nq + nr ? tok[t] : -100;
    }
    b->q_len[r] = nq;
    b->r_len[r] = nr;
    return CLLM_OK;
}

/* -------------------------------------------------------------- file */

static cllm_status get_ids(const json_t *o, const char *key, int V, bool need, int32_t **out, int *n,
                           const char *path, long line) {
    *out = NULL;
    *n = 0;
    const json_t *a = json_object_get(o, key);
    if (!a) return need ? CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: missing key \"%s\"", path, line, key) : CLLM_OK;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > (1u << 24))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: \"%s\": expected a non-empty array of token ids", path, line, key);
    size_t k = json_array_size(a);
    int32_t *v = malloc(k * sizeof *v);
    if (!v) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < k; i++) {
        const json_t *x = json_array_get(a, i);
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (!json_is_integer(x) || id < 0 || id >= V) {
            free(v);
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: \"%s\"[%zu]: expected a token id in [0, %d)", path, line, key,
                             i, V);
        }
        v[i] = (int32_t)id;
    }
    *out = v;
    *n = (int)k;
    return CLLM_OK;
}

static cllm_status get_floats(const json_t *o, const char *key, int n, float **out, const char *path, long line) {
    *out = NULL;
    const json_t *a = json_object_get(o, key);
    if (!a || json_is_null(a)) return CLLM_OK;
    if (!json_is_array(a) || json_array_size(a) != (size_t)n)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: \"%s\": expected an array of %d numbers (one per response token)",
                         path, line, key, n);
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_number(x) || !isfinite(json_number_value(x))) {
            free(v);
            return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: \"%s\"[%d]: expected a finite number", path, line, key, i);
        }
        v[i] = (float)json_number_value(x);
    }
    *out = v;
    return CLLM_OK;
}

static void rollout_free(rollout *r) {
    free(r->query);
    free(r->response);
    free(r->lp);
    free(r->v);
    free(r->ref);
}

static cllm_status parse_line(rollout *r, const char *text, const char *path, long line, int V) {
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    cllm_status st = CLLM_OK;
    if (!o) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld:%d: %s", path, line, err.column, err.text);
    memset(r, 0, sizeof *r);
    r->line = line;
    const json_t *sc = json_object_get(o, "score");
    if (!json_is_object(o))
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: expected a JSON object", path, line);
    else if (!(st = get_ids(o, "query", V, true, &r->query, &r->nq, path, line)) &&
             !(st = get_ids(o, "response", V, true, &r->response, &r->nr, path, line))) {
        if (!sc || !json_is_number(sc) || !isfinite(json_number_value(sc)))
            st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s:%ld: \"score\": expected a finite number", path, line);
        else
            r->score = (float)json_number_value(sc);
    }
    if (!st) st = get_floats(o, "logprobs", r->nr, &r->lp, path, line);
    if (!st) st = get_floats(o, "values", r->nr, &r->v, path, line);
    if (!st) st = get_floats(o, "ref_logprobs", r->nr, &r->ref, path, line);
    json_decref(o);
    if (st) rollout_free(r);
    return st;
}

cllm_status cllm_ppo_source_file(cllm_ppo_source **out, const char *path, int vocab_size) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return CLLM_FAIL(CLLM_ERR_IO, "%s: cannot open the rollouts file", path);
    cllm_ppo_source *s = calloc(1, sizeof *s);
    cllm_status st = s ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (s) s->path = strdup(path);
    if (s && !s->path) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    char *buf = NULL;
    size_t cap = 0, cap_recs = 0;
    long line = 0;
    ssize_t len;
    while (!st && (len = getline(&buf, &cap, f)) >= 0) {
        line++;
        size_t k = 0;
        while (k < (size_t)len && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r' || buf[k] == '\n')) k++;
        if (k == (size_t)len) continue;
        if (s->n_recs == cap_recs) {
            size_t nc = cap_recs ? 2 * cap_recs : 64;
            rollout *nr = realloc(s->recs, nc * sizeof *nr);
            if (!nr) {
                st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                break;
            }
            s->recs = nr;
            cap_recs = nc;
        }
        if (!(st = parse_line(&s->recs[s->n_recs], buf, path, line, vocab_size))) s->n_recs++;
    }
    free(buf);
    fclose(f);
    if (!st && s->n_recs == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no rollouts", path);
    if (st) {
        cllm_ppo_source_free(s);
        return st;
    }
    *out = s;
    return CLLM_OK;
}

static cllm_status fill_from_file(cllm_ppo_source *s, uint64_t first, ppo_batch *b, int32_t pad) {
    b->have_lp = b->have_v = b->have_ref = true;
    for (int r = 0; r < b->R; r++) {
        const rollout *x = &s->recs[(first + (uint64_t)r) % s->n_recs];
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", s->path, x->line);
        cllm_status st = put_row(b, r, x->query, x->nq, x->response, x->nr, pad, where);
        if (st) return st;
        b->score[r] = x->score;
        b->have_lp &= x->lp != NULL;
        b->have_v &= x->v != NULL;
        b->have_ref &= x->ref != NULL;
        for (int j = 0; j < x->nr; j++) {
            size_t n = (size_t)r * b->T + (size_t)(x->nq - 1 + j);
            if (x->lp) b->old_lp[n] = x->lp[j];
            if (x->v) b->old_v[n] = x->v[j];
            if (x->ref) b->ref_lp[n] = x->ref[j];
        }
    }
    return CLLM_OK;
}

/* -------------------------------------------------------- generation */

cllm_status cllm_ppo_source_generate(cllm_ppo_source **out, cllm_loader *prompts, cllm_model *reward,
                                     uint64_t seed) {
    *out = NULL;
    if (!reward || cllm_model_get_config(reward)->num_labels != 1) {
        cllm_model_free(reward);
        return CLLM_FAIL(CLLM_ERR_ARG, "PPO: the reward model must be a sequence-classification model with one label "
                         "(a folder `cllm train --task reward` writes)");
    }
    cllm_ppo_source *s = calloc(1, sizeof *s);
    if (!s) {
        cllm_model_free(reward);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    s->prompts = prompts;
    s->reward = reward;
    s->seed = seed;
    *out = s;
    return CLLM_OK;
}

/* Prompt i of the stream: the tokens before the first counted label, else
 * every token with a label. */
static cllm_status get_prompt(cllm_ppo_source *s, uint64_t i, int T, int32_t *ids, int *n) {
    if (T > s->cap_T) {
        int32_t *a = realloc(s->ptok, (size_t)T * sizeof *a);
        if (a) s->ptok = a;
        int32_t *b = a ? realloc(s->plab, (size_t)T * sizeof *b) : NULL;
        if (b) s->plab = b;
        if (!b) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        s->cap_T = T;
    }
    cllm_status st = cllm_loader_get(s->prompts, i, s->ptok, s->plab, NULL);
    if (st) return st;
    int lead = 0, k = 0;
    while (lead < T && s->plab[lead] == -100) lead++;
    bool prompt_part = lead > 0 && lead < T;
    for (int t = 0; t < T; t++)
        if (prompt_part ? t < lead : s->plab[t] != -100) ids[k++] = s->ptok[t];
    if (k == 0) return CLLM_FAIL(CLLM_ERR_FORMAT, "PPO: prompt %llu of the data is empty", (unsigned long long)i);
    *n = k;
    return CLLM_OK;
}

static bool is_eos(const cllm_model_config *c, int32_t tok) {
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] == tok) return true;
    return false;
}

/* One response to query q[nq] from the policy: at most max_new tokens,
 * ending at an EOS id (kept). */
static cllm_status sample_response(cllm_kv_cache *kv, cllm_sampler *smp, const cllm_model_config *c, float *logits,
                                   int32_t *seq, int nq, int max_new, int *nr) {
    cllm_status st = cllm_kv_cache_rewind(kv, 0);
    if (!st) st = cllm_kv_cache_forward(kv, seq, nq, logits);
    int n = 0;
    while (!st && n < max_new) {
        int32_t tok;
        if ((st = cllm_sampler_sample(smp, &tok, logits, seq, nq + n))) break;
        seq[nq + n++] = tok;
        if (is_eos(c, tok) || n == max_new) break;
        st = cllm_kv_cache_forward(kv, &tok, 1, logits);
    }
    *nr = n;
    return st;
}

static cllm_status fill_generated(cllm_ppo_source *s, cllm_model *policy, const cllm_ppo_params *p, uint64_t first,
                                  ppo_batch *b, int32_t pad) {
    const cllm_model_config *c = cllm_model_get_config(policy);
    const int T = b->T, V = c->vocab_size;
    b->have_lp = b->have_v = b->have_ref = false;
    int32_t *seq = malloc((size_t)T * sizeof *seq);
    float *logits = malloc((size_t)V * sizeof *logits);
    cllm_kv_cache *kv = NULL;
    cllm_status st = seq && logits ? CLLM_OK : CLLM_ERR_NOMEM;
    bool lent = false; /* partitioned parameters gathered for the sampling */
    if (!st && s->lend && !(st = s->lend(s->lend_ctx, true))) lent = true;
    if (!st) st = cllm_kv_cache_init(&kv, policy, 1, T, 0);
    if (!st && (size_t)b->R > s->cap_pos) {
        int32_t *np = realloc(s->pos, (size_t)b->R * sizeof *np);
        if (!np) st = CLLM_ERR_NOMEM;
        else {
            s->pos = np;
            s->cap_pos = (size_t)b->R;
        }
    }
    cllm_sample_params sp = cllm_sample_params_default();
    sp.temperature = (float)p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = (float)p->top_p;
    for (int r = 0; r < b->R && !st; r++) {
        int nq = 0, nr = 0;
        const int max_new = p->max_new_tokens < T - 1 ? p->max_new_tokens : T - 1;
        if ((st = get_prompt(s, first + (uint64_t)r, T, seq, &nq))) break;
        if (nq + max_new > T) { /* keep the end of a long prompt */
            int drop = nq + max_new - T;
            memmove(seq, seq + drop, (size_t)(nq - drop) * sizeof *seq);
            nq -= drop;
        }
        cllm_sampler *smp = NULL;
        uint64_t key = s->seed * 0x9e3779b97f4a7c15ULL ^ (first + (uint64_t)r + 1) * 0xbf58476d1ce4e5b9ULL;
        if ((st = cllm_sampler_init(&smp, V, sp, key))) break;
        st = sample_response(kv, smp, c, logits, seq, nq, max_new, &nr);
        cllm_sampler_free(smp);
        if (!st) st = put_row(b, r, seq, nq, seq + nq, nr, pad, "PPO rollout");
        if (!st) s->pos[r] = cllm_model_score_position(s->reward, b->tokens + (size_t)r * T, nq + nr);
    }
    cllm_kv_cache_free(kv);
    if (lent) {
        cllm_status stl = s->lend(s->lend_ctx, false);
        if (!st) st = stl;
    }
    free(seq);
    free(logits);
    if (st == CLLM_ERR_NOMEM) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory generating rollouts");
    if (st) return cllm_fail_context(st, "PPO rollouts");
    /* the reward model's score of every row */
    if ((st = cllm_model_prepare(s->reward, b->R, T, false))) return st;
    cllm_token_io io;
    memset(&io, 0, sizeof io);
    io.score_pos = s->pos;
    io.scores = b->score;
    double sum = 0;
    long k = 0;
    st = cllm_model_forward_backward_ex(s->reward, b->tokens, NULL, b->R, T, false, 0.0f, &io, &sum, &k);
    return st ? cllm_fail_context(st, "reward model") : CLLM_OK;
}

cllm_status ppo_source_fill(cllm_ppo_source *s, cllm_model *policy, const cllm_ppo_params *p, uint64_t first,
                            ppo_batch *b, int32_t pad) {
    return s->recs ? fill_from_file(s, first, b, pad) : fill_generated(s, policy, p, first, b, pad);
}

void cllm_ppo_source_free(cllm_ppo_source *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_recs; i++) rollout_free(&s->recs[i]);
    free(s->recs);
    free(s->path);
    cllm_model_free(s->reward);
    free(s->pos);
    free(s->ptok);
    free(s->plab);
    free(s);
}
