/*
 * Tests of the library decode loop (cllm_generation in cllm/generate.h):
 *   - greedy tokens equal the argmax of logits computed here with a plain
 *     cllm_kv_cache loop, and the raw log-probabilities equal a float64
 *     log_softmax of those logits (gpt2, llama, bloom);
 *   - sampled tokens (temperature + top-k) have log-probabilities equal to a
 *     log_softmax over the kept tokens computed here;
 *   - with logit bias and OpenAI frequency/presence penalties, the same
 *     against a distribution computed here that counts only the generated
 *     tokens; the top_n alternatives of each step against a float64
 *     log_softmax sorted here;
 *   - stop rules: EOS ids (a caller's list and a config list), ignore_eos,
 *     max_new_tokens (0 included), the model's position limit, cancelling
 *     from the callback and with cllm_generate_cancel;
 *   - text with real tokenizers (fixtures) from a "chain" model whose greedy
 *     continuation is a chosen text: stream pieces concatenate to the final
 *     text, stop strings cut it (one spanning token boundaries, one inside
 *     a multi-byte character split across tokens), text that could still
 *     become a stop string is held back and released when it cannot;
 *   - bad arguments give a status and a message.
 * Usage: test_decode <fixtures/hf folder>
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/generate.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"


static void random_ids(int32_t *ids, int n, int V, uint64_t x) {
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
}

/* float64 log-sum-exp of l[i] / T over the ids with keep[i] (all if NULL). */
static double lse(const float *l, int V, double T, const unsigned char *keep) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        if (!keep || keep[i]) mx = fmax(mx, l[i] / T);
    for (int i = 0; i < V; i++)
        if (!keep || keep[i]) s += exp(l[i] / T - mx);
    return mx + log(s);
}

/* ------------------------------------------------ against a plain cache loop */

/* Runs the library loop (greedy, or temperature 0.7 + top-k 5) and, next to
 * it, a loop of our own over cllm_kv_cache_forward; compares tokens and
 * log-probabilities step by step. */
static void check_reference(const char *name, cllm_arch arch, bool greedy, uint64_t seed) {
    enum { NP = 5, NEW = 12, TOPK = 5 };
    const double T = 0.7;
    cllm_model *m = tiny_model(arch, "{\"initializer_range\": 0.3}", seed);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    int V = cllm_model_get_config(m)->vocab_size;
    int32_t prompt[NP], hist[NP + NEW];
    random_ids(prompt, NP, V, 77);
    memcpy(hist, prompt, sizeof prompt);
    cllm_generate_params p = cllm_generate_params_default();
    p.max_new_tokens = NEW;
    p.ignore_eos = true;
    p.seed = 9;
    if (greedy) {
        p.sample.greedy = true;
    } else {
        p.sample.temperature = (float)T;
        p.sample.top_k = TOPK;
    }
    cllm_generation *g = NULL;
    cllm_kv_cache *kv = NULL;
    cllm_sampler *ref_s = NULL;
    float *logits = malloc(sizeof(float) * V);
    unsigned char *keep = malloc((size_t)V);
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK, "%s: init: %s", name, cllm_last_error());
    CHECK(cllm_kv_cache_init(&kv, m, 1, 0, 0) == CLLM_OK, "%s: cache", name);
    CHECK(cllm_sampler_init(&ref_s, V, p.sample, p.seed) == CLLM_OK, "%s: sampler", name);
    if (!g || !kv || !ref_s) goto done;
    CHECK(cllm_generate_prefill(g, prompt, NP) == CLLM_OK, "%s: prefill: %s", name, cllm_last_error());
    CHECK(cllm_kv_cache_forward(kv, prompt, NP, logits) == CLLM_OK, "%s: reference prefill", name);
    double worst_raw = 0, worst_lp = 0;
    int distinct = 0;
    for (int i = 0; i < NEW; i++) {
        cllm_generate_event ev;
        cllm_status st = cllm_generate_step(g, &ev);
        CHECK(st == CLLM_OK, "%s: step %d: %s", name, i, cllm_last_error());
        if (st) break;
        int32_t want = 0;
        if (greedy) {
            for (int v = 1; v < V; v++)
                if (logits[v] > logits[want]) want = v;
        } else {
            cllm_sampler_sample(ref_s, &want, logits, hist, (size_t)(NP + i));
        }
        CHECK(ev.token == want, "%s: step %d: token %d, the reference loop gives %d", name, i, ev.token, want);
        distinct += i == 0 || ev.token != hist[NP + i - 1];
        double raw = (double)logits[want] - lse(logits, V, 1.0, NULL);
        worst_raw = fmax(worst_raw, fabs(ev.raw_logprob - raw));
        if (greedy) {
            CHECK(ev.logprob == 0.0f, "%s: greedy log-prob %g", name, ev.logprob);
        } else {
            /* top-k keeps every logit >= the k-th largest */
            float *sorted = malloc(sizeof(float) * V);
            memcpy(sorted, logits, sizeof(float) * V);
            for (int a = 0; a < TOPK; a++)
                for (int b = a + 1; b < V; b++)
                    if (sorted[b] > sorted[a]) {
                        float t = sorted[a];
                        sorted[a] = sorted[b];
                        sorted[b] = t;
                    }
            for (int v = 0; v < V; v++) keep[v] = logits[v] >= sorted[TOPK - 1];
            free(sorted);
            CHECK(keep[want], "%s: step %d: token %d is outside the top %d", name, i, want, TOPK);
            double lp = logits[want] / T - lse(logits, V, T, keep);
            worst_lp = fmax(worst_lp, fabs(ev.logprob - lp));
        }
        CHECK(ev.finish == (i == NEW - 1 ? CLLM_FINISH_LENGTH : CLLM_FINISH_NONE), "%s: step %d finish %s", name, i,
              cllm_finish_reason_name(ev.finish));
        CHECK(ev.text_len == 0, "%s: text without a tokenizer", name);
        hist[NP + i] = want;
        if (i < NEW - 1) cllm_kv_cache_forward(kv, &want, 1, logits);
    }
    CHECK(worst_raw < 1e-4, "%s: raw log-prob differs by %g", name, worst_raw);
    CHECK(worst_lp < 1e-4, "%s: sampling log-prob differs by %g", name, worst_lp);
    CHECK(distinct > 2, "%s: the continuation should not be one repeated token", name);
    size_t n = 0;
    const int32_t *toks = cllm_generate_tokens(g, &n);
    CHECK(n == NEW && memcmp(toks, hist + NP, sizeof(int32_t) * NEW) == 0, "%s: token list", name);
    cllm_generate_stats s = cllm_generate_get_stats(g);
    CHECK(s.n_prompt == NP && s.n_generated == NEW && s.n_decode_forwards == NEW - 1,
          "%s: stats prompt %zu generated %zu forwards %zu", name, s.n_prompt, s.n_generated, s.n_decode_forwards);
    CHECK(s.prefill_seconds > 0 && s.decode_seconds > 0, "%s: timings", name);
    cllm_generate_event ev;
    CHECK(cllm_generate_step(g, &ev) == CLLM_ERR_ARG && strstr(cllm_last_error(), "length"),
          "%s: step after the end: %s", name, cllm_last_error());
    printf("%-22s %s: raw log-prob error %.2e, sampling log-prob error %.2e\n", name, greedy ? "greedy " : "sampled",
           worst_raw, worst_lp);
done:
    free(logits);
    free(keep);
    cllm_sampler_free(ref_s);
    cllm_kv_cache_free(kv);
    cllm_generate_free(g);
    cllm_model_free(m);
}

/* The OpenAI processors in the loop: logit bias, frequency and presence
 * penalties counted over the generated tokens only (not the prompt), with
 * temperature; and top_n alternatives of the raw distribution. Each step's
 * log-probability is checked against a float64 distribution computed here
 * from the plain cache loop's logits, and the alternatives against a
 * float64 log_softmax sorted here. */
static void check_openai_params(const char *name, cllm_arch arch, uint64_t seed) {
    enum { NP = 6, NEW = 14, TOPN = 7 };
    const double T = 0.9, F = 0.8, PR = 1.5;
    cllm_model *m = tiny_model(arch, "{\"initializer_range\": 0.3}", seed);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    int V = cllm_model_get_config(m)->vocab_size;
    int32_t prompt[NP], hist[NP + NEW];
    random_ids(prompt, NP, V, 91);
    memcpy(hist, prompt, sizeof prompt);
    int32_t bias_ids[3] = {prompt[0], (prompt[1] + 1) % V, (prompt[2] + 7) % V};
    float bias_vals[3] = {4.0f, -100.0f, 2.5f};
    cllm_generate_params p = cllm_generate_params_default();
    p.max_new_tokens = NEW;
    p.ignore_eos = true;
    p.seed = 5;
    p.top_n = TOPN;
    p.sample.temperature = (float)T;
    p.sample.frequency_penalty = (float)F;
    p.sample.presence_penalty = (float)PR;
    p.sample.bias_ids = bias_ids;
    p.sample.bias_values = bias_vals;
    p.sample.n_bias = 3;
    cllm_generation *g = NULL;
    cllm_kv_cache *kv = NULL;
    float *logits = malloc(sizeof(float) * V);
    double *l = malloc(sizeof(double) * V), *lall = malloc(sizeof(double) * V);
    int *cnt = calloc((size_t)V, sizeof *cnt), *cnt_all = calloc((size_t)V, sizeof *cnt_all);
    int *order = malloc(sizeof(int) * V);
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK, "%s: init: %s", name, cllm_last_error());
    bias_ids[0] = -1; /* copied by init */
    CHECK(cllm_kv_cache_init(&kv, m, 1, 0, 0) == CLLM_OK, "%s: cache", name);
    if (!g || !kv || !logits || !l || !lall || !cnt || !cnt_all || !order) goto done;
    CHECK(cllm_generate_prefill(g, prompt, NP) == CLLM_OK, "%s: prefill: %s", name, cllm_last_error());
    CHECK(cllm_kv_cache_forward(kv, prompt, NP, logits) == CLLM_OK, "%s: reference prefill", name);
    for (int i = 0; i < NP; i++) cnt_all[prompt[i]]++;
    double worst_lp = 0, worst_top = 0, prompt_effect = 0;
    for (int i = 0; i < NEW; i++) {
        cllm_generate_event ev;
        cllm_status st = cllm_generate_step(g, &ev);
        CHECK(st == CLLM_OK, "%s: step %d: %s", name, i, cllm_last_error());
        if (st || ev.token < 0 || ev.token >= V) break;
        int32_t tok = ev.token;
        CHECK(tok != bias_ids[1], "%s: step %d drew the token biased by -100", name, i);
        /* the distribution from the definitions: bias, then l -= c f + (c > 0) p, then / T */
        for (int v = 0; v < V; v++) l[v] = logits[v];
        l[prompt[0]] += 4.0;
        l[bias_ids[1]] -= 100.0;
        l[bias_ids[2]] += 2.5;
        for (int v = 0; v < V; v++) {
            lall[v] = (l[v] - cnt_all[v] * F - (cnt_all[v] > 0) * PR) / T; /* if the prompt counted */
            l[v] = (l[v] - cnt[v] * F - (cnt[v] > 0) * PR) / T;
        }
        double mx = -INFINITY, sum = 0, mxa = -INFINITY, suma = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, l[v]), mxa = fmax(mxa, lall[v]);
        for (int v = 0; v < V; v++) sum += exp(l[v] - mx), suma += exp(lall[v] - mxa);
        double lp = l[tok] - mx - log(sum), lpa = lall[tok] - mxa - log(suma);
        worst_lp = fmax(worst_lp, fabs(ev.logprob - lp));
        prompt_effect = fmax(prompt_effect, fabs(lp - lpa));
        /* top-n: float64 log_softmax of the raw logits, sorted here */
        CHECK(ev.n_top == TOPN && ev.top_ids && ev.top_logprobs, "%s: step %d: n_top %d", name, i, ev.n_top);
        if (ev.n_top == TOPN && ev.top_ids && ev.top_logprobs) {
            double rmx = -INFINITY, rs = 0;
            for (int v = 0; v < V; v++) rmx = fmax(rmx, logits[v]);
            for (int v = 0; v < V; v++) rs += exp(logits[v] - rmx);
            for (int v = 0; v < V; v++) order[v] = v;
            for (int a = 0; a < TOPN; a++)
                for (int b = a + 1; b < V; b++)
                    if (logits[order[b]] > logits[order[a]] ||
                        (logits[order[b]] == logits[order[a]] && order[b] < order[a])) {
                        int t = order[a];
                        order[a] = order[b];
                        order[b] = t;
                    }
            for (int k = 0; k < TOPN; k++) {
                CHECK(ev.top_ids[k] == order[k], "%s: step %d: top %d is %d, expected %d", name, i, k, ev.top_ids[k],
                      order[k]);
                worst_top = fmax(worst_top, fabs(ev.top_logprobs[k] - (logits[order[k]] - rmx - log(rs))));
                if (ev.top_ids[k] == tok)
                    CHECK(ev.top_logprobs[k] == ev.raw_logprob, "%s: step %d: the drawn token's two raw log-probs",
                          name, i);
            }
        }
        hist[NP + i] = tok;
        cnt[tok]++;
        cnt_all[tok]++;
        if (i < NEW - 1) cllm_kv_cache_forward(kv, &tok, 1, logits);
    }
    CHECK(worst_lp < 1e-4, "%s: sampling log-prob differs by %g", name, worst_lp);
    CHECK(worst_top < 1e-5, "%s: top-n log-probs differ by %g", name, worst_top);
    CHECK(prompt_effect > 1e-2, "%s: test setup: counting the prompt should change the log-probs (%g)", name,
          prompt_effect);
    printf("%-22s openai: sampling log-prob error %.2e, top-%d error %.2e\n", name, worst_lp, (int)TOPN, worst_top);
done:
    free(logits);
    free(l);
    free(lall);
    free(cnt);
    free(cnt_all);
    free(order);
    cllm_kv_cache_free(kv);
    cllm_generate_free(g);
    cllm_model_free(m);
}

/* Greedy continuation of `prompt` (ignoring EOS) into out[n]. */
static void greedy_run(cllm_model *m, const int32_t *prompt, size_t np, int32_t *out, int n) {
    cllm_generate_params p = cllm_generate_params_default();
    p.sample.greedy = true;
    p.ignore_eos = true;
    p.max_new_tokens = n;
    cllm_generation *g = NULL;
    size_t got = 0;
    if (!cllm_generate_init(&g, m, NULL, &p) && !cllm_generate_run(g, prompt, np, NULL, NULL))
        memcpy(out, cllm_generate_tokens(g, &got), sizeof(int32_t) * (size_t)n);
    CHECK(got == (size_t)n, "greedy run: %zu tokens: %s", got, cllm_last_error());
    cllm_generate_free(g);
}

static int count_cb(const cllm_generate_event *ev, void *user) {
    int *k = user;
    (void)ev;
    return ++k[0] == k[1];
}

static void test_stop_rules(void) {
    enum { N = 10 };
    const int32_t prompt[4] = {3, 1, 4, 1};
    cllm_model *m = tiny_model(CLLM_ARCH_GPT2, "{\"initializer_range\": 0.3}", 5);
    CHECK(m != NULL, "model");
    if (!m) return;
    int32_t gen[N] = {0};
    greedy_run(m, prompt, 4, gen, N);
    int k = -1;
    for (int i = 1; i < N && k < 0; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= gen[j] == gen[i];
        if (!seen) k = i;
    }
    int32_t unused = 0; /* an id the greedy run never produces */
    for (bool used = true; used; unused += used) {
        used = false;
        for (int i = 0; i < N; i++) used |= gen[i] == unused;
    }
    CHECK(k > 0, "a token that appears first at some step > 0");
    if (k <= 0) goto done;

    /* EOS from the caller's list: the sequence ends with the EOS token. */
    cllm_generate_params p = cllm_generate_params_default();
    p.sample.greedy = true;
    p.max_new_tokens = N;
    int32_t eos[2] = {unused, gen[k]};
    p.eos_ids = eos;
    p.n_eos = 2;
    cllm_generation *g = NULL;
    size_t n = 0;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_run(g, prompt, 4, NULL, NULL) == CLLM_OK,
          "eos run: %s", cllm_last_error());
    const int32_t *t = g ? cllm_generate_tokens(g, &n) : NULL;
    CHECK(g && cllm_generate_finish_reason(g) == CLLM_FINISH_EOS && n == (size_t)k + 1 &&
              memcmp(t, gen, sizeof(int32_t) * n) == 0,
          "eos list: %zu tokens, expected %d ending with %d", n, k + 1, gen[k]);
    cllm_generate_free(g);
    g = NULL;
    /* ignore_eos overrides the list */
    p.ignore_eos = true;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_run(g, prompt, 4, NULL, NULL) == CLLM_OK &&
              cllm_generate_finish_reason(g) == CLLM_FINISH_LENGTH,
          "ignore_eos");
    cllm_generate_free(g);
    g = NULL;

    /* EOS from a config.json list (same weights: same shapes and seed). */
    char extra[128];
    snprintf(extra, sizeof extra, "{\"initializer_range\": 0.3, \"eos_token_id\": [%d, %d]}", unused, gen[k]);
    cllm_model *m2 = tiny_model(CLLM_ARCH_GPT2, extra, 5);
    CHECK(m2 && cllm_model_get_config(m2)->n_eos_token_ids == 2 && cllm_model_get_config(m2)->eos_token_id == unused,
          "config eos list parsed");
    p = cllm_generate_params_default();
    p.sample.greedy = true;
    p.max_new_tokens = N;
    CHECK(m2 && cllm_generate_init(&g, m2, NULL, &p) == CLLM_OK &&
              cllm_generate_run(g, prompt, 4, NULL, NULL) == CLLM_OK,
          "config eos run");
    if (g) cllm_generate_tokens(g, &n);
    CHECK(g && cllm_generate_finish_reason(g) == CLLM_FINISH_EOS && n == (size_t)k + 1, "config eos list: %zu tokens",
          n);
    cllm_generate_free(g);
    g = NULL;
    cllm_model_free(m2);

    /* Cancel from the callback on the third step. */
    int cb[2] = {0, 3};
    p = cllm_generate_params_default();
    p.max_new_tokens = N;
    p.ignore_eos = true;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_run(g, prompt, 4, count_cb, cb) == CLLM_OK,
          "cancel run");
    if (g) cllm_generate_tokens(g, &n);
    CHECK(g && cb[0] == 3 && n == 3 && cllm_generate_finish_reason(g) == CLLM_FINISH_CANCELLED,
          "cancelled after %d callbacks with %zu tokens (%s)", cb[0], n,
          g ? cllm_finish_reason_name(cllm_generate_finish_reason(g)) : "");
    cllm_generate_free(g);
    g = NULL;
    /* A non-zero return on the last step does not change the reason. */
    int cb2[2] = {0, N};
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_run(g, prompt, 4, count_cb, cb2) == CLLM_OK &&
              cllm_generate_finish_reason(g) == CLLM_FINISH_LENGTH && cb2[0] == N,
          "callback on the last step");
    cllm_generate_free(g);
    g = NULL;
    /* cllm_generate_cancel between steps */
    cllm_generate_event ev;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_prefill(g, prompt, 4) == CLLM_OK &&
              cllm_generate_step(g, &ev) == CLLM_OK,
          "cancel setup");
    if (g) {
        cllm_generate_cancel(g);
        CHECK(cllm_generate_finish_reason(g) == CLLM_FINISH_CANCELLED, "cancel");
        CHECK(cllm_generate_step(g, &ev) == CLLM_ERR_ARG && strstr(cllm_last_error(), "cancelled"),
              "step after cancel: %s", cllm_last_error());
        cllm_generate_cancel(g); /* no-op */
    }
    cllm_generate_free(g);
    g = NULL;

    /* max_new_tokens 0: the first step ends the sequence without a token. */
    p.max_new_tokens = 0;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_prefill(g, prompt, 4) == CLLM_OK &&
              cllm_generate_step(g, &ev) == CLLM_OK && ev.token == -1 && ev.finish == CLLM_FINISH_LENGTH,
          "zero new tokens");
    cllm_generate_free(g);
done:
    cllm_model_free(m);
}

/* The model's position limit (n_positions 16): a 10-token prompt leaves
 * room for 6 forwards, so 7 tokens; a 17-token prompt is refused. */
static void test_context_limit(void) {
    cllm_model *m = tiny_model(CLLM_ARCH_GPT2, "{\"n_positions\": 16}", 3);
    CHECK(m != NULL, "model");
    if (!m) return;
    int32_t ids[17];
    random_ids(ids, 17, 512, 3);
    cllm_generate_params p = cllm_generate_params_default();
    p.max_new_tokens = 20;
    p.ignore_eos = true;
    cllm_generation *g = NULL;
    size_t n = 0;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK && cllm_generate_run(g, ids, 10, NULL, NULL) == CLLM_OK,
          "run: %s", cllm_last_error());
    if (g) cllm_generate_tokens(g, &n);
    CHECK(g && n == 7 && cllm_generate_finish_reason(g) == CLLM_FINISH_CONTEXT, "context limit after %zu tokens", n);
    cllm_generate_free(g);
    g = NULL;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK, "init");
    CHECK(g && cllm_generate_prefill(g, ids, 17) == CLLM_ERR_ARG && strstr(cllm_last_error(), "16"),
          "prompt over the limit: %s", cllm_last_error());
    /* the failed prefill changed nothing: a valid prompt still works */
    CHECK(g && cllm_generate_prefill(g, ids, 16) == CLLM_OK, "prefill after a refused one");
    cllm_generate_event ev;
    CHECK(g && cllm_generate_step(g, &ev) == CLLM_OK && ev.token >= 0 && ev.finish == CLLM_FINISH_CONTEXT,
          "a full prompt leaves one token");
    cllm_generate_free(g);
    cllm_model_free(m);
}

static void test_errors(void) {
    cllm_model *m = tiny_model(CLLM_ARCH_GPT2, "{}", 3);
    CHECK(m != NULL, "model");
    if (!m) return;
    cllm_generation *g = (cllm_generation *)&g; /* init must reset it */
    cllm_generate_params p = cllm_generate_params_default();
    p.max_new_tokens = -1;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && !g && strstr(cllm_last_error(), "max_new_tokens"),
          "negative max_new_tokens: %s", cllm_last_error());
    p = cllm_generate_params_default();
    p.sample.top_p = 0;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && !g, "top_p 0");
    p = cllm_generate_params_default();
    const char *stops[2] = {"x", ""};
    p.stop = stops;
    p.n_stop = 1;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && strstr(cllm_last_error(), "tokenizer"),
          "stop strings without a tokenizer: %s", cllm_last_error());
    p = cllm_generate_params_default();
    int32_t bad_eos[1] = {512};
    p.eos_ids = bad_eos;
    p.n_eos = 1;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && strstr(cllm_last_error(), "512"),
          "eos id outside the vocabulary: %s", cllm_last_error());
    p.eos_ids = NULL;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG, "n_eos with a NULL list");
    const int bad_top[2] = {-1, CLLM_MAX_TOP_N + 1};
    for (int i = 0; i < 2; i++) {
        p = cllm_generate_params_default();
        p.top_n = bad_top[i];
        CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && !g && strstr(cllm_last_error(), "top_n"),
              "top_n %d: %s", bad_top[i], cllm_last_error());
    }
    p = cllm_generate_params_default();
    p.sample.typical_p = 2.0f;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && !g && strstr(cllm_last_error(), "typical_p"),
          "typical_p 2: %s", cllm_last_error());
    p = cllm_generate_params_default();
    int32_t bias_bad[1] = {512};
    float bias_v[1] = {1.0f};
    p.sample.bias_ids = bias_bad;
    p.sample.bias_values = bias_v;
    p.sample.n_bias = 1;
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_ERR_ARG && !g && strstr(cllm_last_error(), "512"),
          "logit bias id outside the vocabulary: %s", cllm_last_error());
    p = cllm_generate_params_default();
    CHECK(cllm_generate_init(&g, m, NULL, &p) == CLLM_OK, "init");
    if (g) {
        cllm_generate_event ev;
        CHECK(cllm_generate_step(g, &ev) == CLLM_ERR_ARG && strstr(cllm_last_error(), "prefill"),
              "step before prefill: %s", cllm_last_error());
        int32_t ids[3] = {1, 512, 2};
        CHECK(cllm_generate_prefill(g, ids, 0) == CLLM_ERR_ARG && strstr(cllm_last_error(), "empty"),
              "empty prompt: %s", cllm_last_error());
        CHECK(cllm_generate_prefill(g, ids, 3) == CLLM_ERR_ARG && strstr(cllm_last_error(), "512") &&
                  strstr(cllm_last_error(), "position 1"),
              "id outside the vocabulary: %s", cllm_last_error());
        ids[1] = -1;
        CHECK(cllm_generate_prefill(g, ids, 3) == CLLM_ERR_ARG && strstr(cllm_last_error(), "-1"), "negative id");
        ids[1] = 7;
        CHECK(cllm_generate_prefill(g, ids, 3) == CLLM_OK, "prefill");
        CHECK(cllm_generate_prefill(g, ids, 3) == CLLM_ERR_ARG, "second prefill");
        size_t len = 99;
        CHECK(strcmp(cllm_generate_text(g, &len), "") == 0 && len == 0, "no text without a tokenizer");
    }
    cllm_generate_free(g);
    cllm_generate_free(NULL);
    CHECK(strcmp(cllm_finish_reason_name(CLLM_FINISH_STOP_SEQUENCE), "stop_sequence") == 0 &&
              cllm_finish_reason_name((cllm_finish_reason)99) == NULL,
          "reason names");
    cllm_model_free(m);
}

/* ------------------------------------------------------------------ text */

/* A llama model whose greedy continuation of chain[0] is chain[1],
 * chain[2], ...: every weight is zero but the embedding row of each chain
 * token (a unit vector of its own), the final norm weight (1) and one head
 * entry per link. The blocks then add nothing (their output projections
 * are zero), the final RMSNorm maps e_j to sqrt(C) e_j, and the logit of
 * the successor is 8 sqrt(C) while all others are 0. A token that occurs
 * twice must have the same successor both times. */
static cllm_model *chain_model(int V, const int32_t *chain, size_t n) {
    enum { C = 128 };
    char extra[256];
    snprintf(extra, sizeof extra,
             "{\"vocab_size\": %d, \"hidden_size\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"tie_word_embeddings\": false}",
             V, C);
    cllm_model *m = tiny_model(CLLM_ARCH_LLAMA, extra, 1);
    if (!m) return NULL;
    float *w = cllm_model_params(m);
    memset(w, 0, cllm_model_buffer_len(m) * sizeof(float));
    const cllm_tensor_info *emb = cllm_model_find_tensor(m, "model.embed_tokens.weight"),
                           *head = cllm_model_find_tensor(m, "lm_head.weight"),
                           *norm = cllm_model_find_tensor(m, "model.norm.weight");
    bool ok = emb && head && norm;
    int32_t slot_of[C];
    int n_slot = 0;
    for (int c = 0; ok && c < C; c++) w[norm->offset + (size_t)c] = 1.0f;
    for (size_t i = 0; ok && i + 1 < n; i++) {
        int s = -1;
        for (int k = 0; k < n_slot; k++)
            if (slot_of[k] == chain[i]) s = k;
        if (s < 0) {
            ok = n_slot < C;
            if (!ok) break;
            s = n_slot;
            slot_of[n_slot++] = chain[i];
            w[emb->offset + (size_t)chain[i] * C + (size_t)s] = 1.0f;
        }
        /* the successor's head row has 8 at slot s; another successor of
         * the same token would tie with it */
        for (int32_t v = 0; v < V && ok; v++)
            if (v != chain[i + 1] && w[head->offset + (size_t)v * C + (size_t)s] != 0) ok = false;
        w[head->offset + (size_t)chain[i + 1] * C + (size_t)s] = 8.0f;
    }
    cllm_model_params_updated(m);
    CHECK(ok, "chain model: tensors found, at most %d distinct tokens, one successor each", C);
    if (!ok) {
        cllm_model_free(m);
        return NULL;
    }
    return m;
}

typedef struct {
    cllm_tokenizer *tok;
    cllm_model *m;
    cllm_token_buf prompt, all; /* all: prompt + continuation (+ final id) */
    int32_t *gen;               /* continuation ids (into all) */
    size_t ng;
} chain_setup;

static bool buf_push(cllm_token_buf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) return false;
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return true;
}

static void chain_free(chain_setup *cs) {
    cllm_model_free(cs->m);
    cllm_tokenizer_free(cs->tok);
    cllm_token_buf_free(&cs->prompt);
    cllm_token_buf_free(&cs->all);
    memset(cs, 0, sizeof *cs);
}

/* Loads the tokenizer in dir and builds a chain model whose greedy
 * continuation of `prompt` is the tokens of `text` (as the tokenizer splits
 * prompt + text), then `final` if >= 0. */
static bool chain_init(chain_setup *cs, const char *dir, const char *prompt, const char *text, int32_t final) {
    memset(cs, 0, sizeof *cs);
    if (cllm_tokenizer_load(&cs->tok, dir)) {
        CHECK(0, "load %s: %s", dir, cllm_last_error());
        return false;
    }
    char both[512];
    snprintf(both, sizeof both, "%s%s", prompt, text);
    bool ok = !cllm_tokenizer_encode(cs->tok, prompt, strlen(prompt), false, &cs->prompt) &&
              !cllm_tokenizer_encode(cs->tok, both, strlen(both), false, &cs->all) && cs->prompt.n > 0 &&
              cs->all.n > cs->prompt.n && memcmp(cs->all.ids, cs->prompt.ids, cs->prompt.n * sizeof(int32_t)) == 0;
    CHECK(ok, "%s: the prompt's tokens are a prefix of prompt + text", dir);
    if (ok && final >= 0) ok = buf_push(&cs->all, final);
    if (!ok) return false;
    cs->gen = cs->all.ids + cs->prompt.n;
    cs->ng = cs->all.n - cs->prompt.n;
    cs->m = chain_model(cllm_tokenizer_vocab_size(cs->tok), cs->all.ids + cs->prompt.n - 1, cs->ng + 1);
    return cs->m != NULL;
}

static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int need = u[i] < 0x80 ? 0 : (u[i] >> 5) == 6 ? 1 : (u[i] >> 4) == 14 ? 2 : (u[i] >> 3) == 30 ? 3 : -1;
        if (need < 0 || i + (size_t)need >= n) return false;
        for (int k = 1; k <= need; k++)
            if ((u[i + k] & 0xC0) != 0x80) return false;
        i += (size_t)need + 1;
    }
    return true;
}

enum { MAX_STEPS = 64 };

typedef struct {
    char out[1024];            /* the streamed pieces, concatenated */
    size_t olen;
    size_t emitted[MAX_STEPS]; /* olen after each step */
    int steps;
    cllm_finish_reason finish;
} text_run;

/* Steps a greedy generation over the chain model and checks, after every
 * step, that the piece is whole UTF-8 characters and that everything
 * streamed so far is a prefix of `expect` (so no byte of a cut stop string
 * ever reaches the client); at the end, that the stream equals `expect` and
 * cllm_generate_text (after the prompt's text, if included). */
static void run_text(const char *what, chain_setup *cs, const char *const *stops, size_t n_stop, int max_new,
                     bool include_prompt, const char *expect, text_run *r) {
    memset(r, 0, sizeof *r);
    cllm_generate_params p = cllm_generate_params_default();
    p.sample.greedy = true;
    p.max_new_tokens = max_new;
    p.stop = stops;
    p.n_stop = n_stop;
    p.include_prompt = include_prompt;
    cllm_generation *g = NULL;
    CHECK(cllm_generate_init(&g, cs->m, cs->tok, &p) == CLLM_OK, "%s: init: %s", what, cllm_last_error());
    CHECK(g && cllm_generate_prefill(g, cs->prompt.ids, cs->prompt.n) == CLLM_OK, "%s: prefill: %s", what,
          cllm_last_error());
    size_t elen = strlen(expect);
    bool utf8 = true, prefix = true;
    while (g && r->steps < MAX_STEPS) {
        cllm_generate_event ev;
        cllm_status st = cllm_generate_step(g, &ev);
        CHECK(st == CLLM_OK, "%s: step: %s", what, cllm_last_error());
        if (st) break;
        utf8 &= valid_utf8(ev.text, ev.text_len);
        if (r->olen + ev.text_len < sizeof r->out) {
            memcpy(r->out + r->olen, ev.text, ev.text_len);
            r->olen += ev.text_len;
        }
        prefix &= r->olen <= elen && memcmp(r->out, expect, r->olen) == 0;
        r->emitted[r->steps++] = r->olen;
        if (ev.finish) {
            r->finish = ev.finish;
            break;
        }
    }
    r->out[r->olen] = 0;
    CHECK(utf8, "%s: a piece is not whole UTF-8 characters", what);
    CHECK(prefix, "%s: streamed text left the expected text: '%s'", what, r->out);
    CHECK(r->olen == elen && memcmp(r->out, expect, elen) == 0, "%s: streamed '%s', expected '%s'", what, r->out,
          expect);
    if (g) {
        size_t len = 0, plen = 0;
        const char *t = cllm_generate_text(g, &len);
        char *pt = NULL;
        if (include_prompt) cllm_tokenizer_decode(cs->tok, cs->prompt.ids, cs->prompt.n, true, &pt, &plen);
        CHECK(len == plen + elen && (!pt || memcmp(t, pt, plen) == 0) && memcmp(t + plen, expect, elen) == 0 &&
                  t[len] == 0,
              "%s: cllm_generate_text '%s'", what, t);
        free(pt);
    }
    cllm_generate_free(g);
}

/* True when some step before the last streamed less than the run without
 * stop strings had by then: text was held back. */
static bool held_back(const text_run *r, const text_run *plain) {
    for (int i = 0; i + 1 < r->steps && i < plain->steps; i++)
        if (r->emitted[i] < plain->emitted[i]) return true;
    return false;
}

static void test_text_gpt2(const char *dir) {
    const char *text = " w\xC3\xB6rld \xE2\x80\x94 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82 ok!";
    chain_setup cs;
    if (!chain_init(&cs, dir, "Hello", text, -1)) {
        chain_free(&cs);
        return;
    }
    int ng = (int)cs.ng;
    CHECK(ng + 2 < MAX_STEPS, "test text too long");
    text_run plain, r;
    run_text("gpt2 no stop", &cs, NULL, 0, ng, false, text, &plain);
    CHECK(plain.finish == CLLM_FINISH_LENGTH && plain.steps == ng, "no stop: %s after %d steps",
          cllm_finish_reason_name(plain.finish), plain.steps);
    /* a step that streamed nothing: a character split across tokens */
    int split = -1;
    for (int i = 1; i < plain.steps && split < 0; i++)
        if (plain.emitted[i] == plain.emitted[i - 1]) split = i;
    CHECK(split > 0, "the text should split a character across tokens");

    /* a stop string across token boundaries, ending inside a split character */
    const char *s1[] = {"\xE2\x80\x94 \xE6\x97\xA5"};
    run_text("gpt2 stop across tokens", &cs, s1, 1, ng, false, " w\xC3\xB6rld ", &r);
    CHECK(r.finish == CLLM_FINISH_STOP_SEQUENCE && r.steps < ng, "stop across tokens: %s after %d steps",
          cllm_finish_reason_name(r.finish), r.steps);
    CHECK(held_back(&r, &plain), "stop across tokens: nothing was held back");
    /* a stop string that is one multi-byte character split across tokens */
    const char *s2[] = {"\xE6\x9C\xAC"};
    run_text("gpt2 stop inside a character", &cs, s2, 1, ng, false,
             " w\xC3\xB6rld \xE2\x80\x94 \xE6\x97\xA5", &r);
    CHECK(r.finish == CLLM_FINISH_STOP_SEQUENCE, "stop character: %s", cllm_finish_reason_name(r.finish));
    /* two stop strings: the one that occurs first wins */
    const char *s3[] = {"\xE6\x97\xA5\xE6\x9C\xAC", "rld"};
    run_text("gpt2 two stops", &cs, s3, 2, ng, false, " w\xC3\xB6", &r);
    CHECK(r.finish == CLLM_FINISH_STOP_SEQUENCE, "two stops: %s", cllm_finish_reason_name(r.finish));
    /* a prefix that does not complete is held back, then released */
    const char *s4[] = {"ok?"};
    run_text("gpt2 prefix released", &cs, s4, 1, ng, false, text, &r);
    CHECK(r.finish == CLLM_FINISH_LENGTH && held_back(&r, &plain), "'ok' held back then released (%s)",
          cllm_finish_reason_name(r.finish));
    /* held back up to the end: released by the length stop */
    const char *s5[] = {"ok!!"};
    run_text("gpt2 released at the end", &cs, s5, 1, ng, false, text, &r);
    CHECK(r.finish == CLLM_FINISH_LENGTH && held_back(&r, &plain) && r.steps >= 2 &&
              r.emitted[r.steps - 2] < strlen(text) - 2,
          "'ok!' held back until the end");
    /* a stop string in the prompt does not count; include_prompt */
    const char *s6[] = {"Hell"};
    run_text("gpt2 include prompt", &cs, s6, 1, ng, true, text, &r);
    /* cut in the middle of a split character: U+FFFD at the end */
    char partial[256];
    snprintf(partial, sizeof partial, "%.*s\xEF\xBF\xBD", (int)plain.emitted[split], text);
    if (split > 0) run_text("gpt2 unfinished character", &cs, NULL, 0, split + 1, false, partial, &r);
    chain_free(&cs);

    /* EOS (the tokenizer's <|endoftext|>) after the text: the held-back tail
     * comes out with the EOS step. */
    if (!chain_init(&cs, dir, "Hello", text, 50256)) {
        chain_free(&cs);
        return;
    }
    run_text("gpt2 eos", &cs, s5, 1, ng + 5, false, text, &r);
    CHECK(r.finish == CLLM_FINISH_EOS && r.steps == ng + 1, "eos: %s after %d steps",
          cllm_finish_reason_name(r.finish), r.steps);
    chain_free(&cs);
}

static void test_text_llama(const char *dir) {
    /* distinct tokens; the emoji is four byte-fallback tokens */
    const char *text = " world \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xF0\x9F\x99\x82 ok";
    chain_setup cs;
    if (!chain_init(&cs, dir, "Hello", text, -1)) {
        chain_free(&cs);
        return;
    }
    int ng = (int)cs.ng;
    text_run plain, r;
    run_text("llama no stop", &cs, NULL, 0, ng, false, text, &plain);
    const char *s1[] = {"\xF0\x9F\x99\x82 o"};
    run_text("llama stop across tokens", &cs, s1, 1, ng, false, " world \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", &r);
    CHECK(r.finish == CLLM_FINISH_STOP_SEQUENCE && held_back(&r, &plain), "llama stop: %s",
          cllm_finish_reason_name(r.finish));
    chain_free(&cs);
}

static void test_text(const char *fixtures) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/gpt2", fixtures);
    test_text_gpt2(dir);
    snprintf(dir, sizeof dir, "%s/tinyllama-1.1b-chat-v1.0", fixtures);
    test_text_llama(dir);
}

int main(int argc, char **argv) {
    check_reference("gpt2", CLLM_ARCH_GPT2, true, 21);
    check_reference("llama GQA", CLLM_ARCH_LLAMA, true, 21);
    check_reference("bloom", CLLM_ARCH_BLOOM, true, 22);
    check_reference("gpt2", CLLM_ARCH_GPT2, false, 21);
    check_reference("llama GQA", CLLM_ARCH_LLAMA, false, 21);
    check_openai_params("gpt2", CLLM_ARCH_GPT2, 23);
    check_openai_params("bloom", CLLM_ARCH_BLOOM, 24);
    test_stop_rules();
    test_context_limit();
    test_errors();
    if (argc > 1) {
        test_text(argv[1]);
    } else {
        fprintf(stderr, "no fixtures folder given: text tests skipped\n");
    }
    return check_summary();
}
