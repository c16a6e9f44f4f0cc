/*
 * Continuous batching (cllm/engine.h) against each request run alone:
 * requests with prompts of different lengths, some greedy and some sampled
 * from their own seeds, submitted at different times into an engine with
 * fewer slots than requests, a pool too small to admit everyone at once and
 * a token budget that splits long prompts over several steps. Every
 * request's tokens and log-probabilities must equal those of
 * cllm_generate_run on the same prompt and parameters; a request cancelled
 * from the callback stops where it was cancelled; every block returns to
 * the pool; bad requests are refused with a message. One request asks for
 * top-n alternatives with OpenAI penalties and a logit bias: its events
 * carry the same alternatives as when it runs alone. The same again for
 * fp32 models over a bf16 pool, and a request naming a cache dtype other
 * than the pool's is refused.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/engine.h"
#include "cllm/generate.h"
#include "cllm/model.h"

enum { NREQ = 7, MAXTOK = 64 };


typedef struct {
    uint64_t id;
    int32_t tok[MAXTOK];
    float lp[MAXTOK];
    int n;
    int ntop[MAXTOK];       /* n_top of each event */
    int32_t top[MAXTOK][4]; /* the first 4 alternatives */
    cllm_finish_reason finish;
    int cancel_after; /* cancel from the callback after this many tokens (0: never) */
} result;

typedef struct {
    result *r;
    int n;
} results;

static int on_event(const cllm_engine_event *ev, void *user) {
    results *rs = user;
    for (int i = 0; i < rs->n; i++) {
        result *r = &rs->r[i];
        if (r->id != ev->id) continue;
        if (ev->ev.token >= 0 && r->n < MAXTOK) {
            r->ntop[r->n] = ev->ev.n_top;
            for (int k = 0; k < ev->ev.n_top && k < 4; k++) r->top[r->n][k] = ev->ev.top_ids[k];
            r->tok[r->n] = ev->ev.token;
            r->lp[r->n++] = ev->ev.logprob;
        }
        r->finish = ev->ev.finish;
        return r->cancel_after && r->n == r->cancel_after;
    }
    CHECK(0, "event for unknown request %llu", (unsigned long long)ev->id);
    return 0;
}

/* The tokens and log-probabilities of request `gp` on `prompt` run alone. */
static void run_alone(const char *name, cllm_model *m, const int32_t *prompt, int plen, const cllm_generate_params *gp,
                      result *want) {
    cllm_generation *g = NULL;
    CHECK(cllm_generate_init(&g, m, NULL, gp) == CLLM_OK, "%s: init", name);
    CHECK(g && cllm_generate_prefill(g, prompt, (size_t)plen) == CLLM_OK, "%s: prefill: %s", name, cllm_last_error());
    for (;;) {
        cllm_generate_event ev;
        if (!g) break;
        if (cllm_generate_step(g, &ev) != CLLM_OK) {
            CHECK(0, "%s: step: %s", name, cllm_last_error());
            break;
        }
        if (ev.token >= 0) {
            want->ntop[want->n] = ev.n_top;
            for (int k = 0; k < ev.n_top && k < 4; k++) want->top[want->n][k] = ev.top_ids[k];
            want->tok[want->n] = ev.token;
            want->lp[want->n++] = ev.logprob;
        }
        if (ev.finish) {
            want->finish = ev.finish;
            break;
        }
    }
    cllm_generate_free(g);
}

/* kvd: the engine's pool and every request alone keep keys and values in
 * this dtype (CLLM_KV_BF16: an fp32 model over a bf16 cache). */
static void check_engine(const char *name, cllm_arch arch, const char *extra, cllm_kv_dtype kvd) {
    cllm_model *m = tiny_model(arch, extra, 31);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    const int V = cllm_model_get_config(m)->vocab_size;
    const int plen[NREQ] = {3, 11, 1, 20, 6, 9, 2}, max_new[NREQ] = {6, 3, 9, 5, 0, 8, 7};
    int32_t prompt[NREQ][32];
    cllm_generate_params gp[NREQ];
    int32_t bias_id[1];
    const float bias_val[1] = {3.0f};
    uint64_t x = 5;
    for (int i = 0; i < NREQ; i++) {
        for (int t = 0; t < plen[i]; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i][t] = (int32_t)((x >> 33) % (uint64_t)V);
        }
        gp[i] = cllm_generate_params_default();
        gp[i].max_new_tokens = max_new[i];
        gp[i].ignore_eos = true;
        gp[i].seed = 100 + (uint64_t)i;
        gp[i].kv_dtype = kvd;
        if (i % 2) { /* sampled: each request draws from its own seeded sampler */
            gp[i].sample.temperature = 0.8f;
            gp[i].sample.top_k = 20;
        } else {
            gp[i].sample.greedy = true;
        }
    }
    /* one request with top-n alternatives, OpenAI penalties and a logit bias */
    bias_id[0] = prompt[3][0];
    gp[3].top_n = 4;
    gp[3].sample.frequency_penalty = 0.5f;
    gp[3].sample.presence_penalty = 0.3f;
    gp[3].sample.bias_ids = bias_id;
    gp[3].sample.bias_values = bias_val;
    gp[3].sample.n_bias = 1;
    /* each request alone */
    result want[NREQ];
    memset(want, 0, sizeof want);
    for (int i = 0; i < NREQ; i++) run_alone(name, m, prompt[i], plen[i], &gp[i], &want[i]);
    /* batched: 3 slots, a pool of 6 blocks of 8 positions, 10 tokens per step */
    cllm_engine_params ep = {.max_seqs = 3, .max_pos = 32, .block_size = 8, .n_blocks = 6, .max_batch_tokens = 10,
                             .kv_dtype = kvd};
    cllm_engine *e = NULL;
    CHECK(cllm_engine_init(&e, m, NULL, &ep) == CLLM_OK, "%s: engine: %s", name, cllm_last_error());
    result got[NREQ];
    memset(got, 0, sizeof got);
    got[5].cancel_after = 3; /* cancelled from the callback after 3 tokens */
    results rs = {got, NREQ};
    int submitted = 0, steps = 0, max_running = 0;
    cllm_engine_stats s;
    while (e && steps < 200) {
        /* requests arrive over time: two now, one more every other step */
        while (submitted < NREQ && submitted < 2 + steps / 2) {
            CHECK(cllm_engine_submit(e, prompt[submitted], (size_t)plen[submitted], &gp[submitted],
                                     &got[submitted].id) == CLLM_OK,
                  "%s: submit %d: %s", name, submitted, cllm_last_error());
            submitted++;
        }
        CHECK(cllm_engine_step(e, on_event, &rs, NULL) == CLLM_OK, "%s: step: %s", name, cllm_last_error());
        steps++;
        cllm_engine_get_stats(e, &s);
        if (s.running > max_running) max_running = s.running;
        CHECK(s.running <= 3, "%s: %d running in 3 slots", name, s.running);
        if (submitted == NREQ && s.running == 0 && s.queued == 0) break;
    }
    for (int i = 0; i < NREQ; i++) {
        int n = i == 5 ? 3 : want[i].n;
        bool same = got[i].n == n;
        for (int t = 0; same && t < n; t++) {
            same = got[i].tok[t] == want[i].tok[t] && fabsf(got[i].lp[t] - want[i].lp[t]) <= 1e-4f;
            CHECK(got[i].ntop[t] == (i == 3 ? 4 : 0), "%s: request %d token %d: %d alternatives", name, i, t,
                  got[i].ntop[t]);
            for (int k = 0; k < got[i].ntop[t] && k < 4; k++) same &= got[i].top[t][k] == want[i].top[t][k];
        }
        CHECK(same, "%s: request %d (%s, prompt %d): %d tokens batched, %d alone, or different ids/log-probs", name, i,
              i % 2 ? "sampled" : "greedy", plen[i], got[i].n, n);
        if (i != 5) CHECK(got[i].finish == want[i].finish, "%s: request %d finish %d, alone %d", name, i, got[i].finish,
                          want[i].finish);
    }
    if (e) {
        cllm_engine_get_stats(e, &s);
        CHECK(s.blocks_free == s.blocks_total && s.blocks_total == 6, "%s: %d of %d blocks back in the pool", name,
              s.blocks_free, s.blocks_total);
        CHECK(max_running == 3, "%s: at most %d ran together (slots 3)", name, max_running);
        /* bad requests */
        uint64_t id = 99;
        int32_t bad = V;
        CHECK(cllm_engine_submit(e, &bad, 1, &gp[0], &id) == CLLM_ERR_ARG && id == 0, "%s: id outside the vocab", name);
        int32_t long_prompt[40] = {0};
        CHECK(cllm_engine_submit(e, long_prompt, 40, &gp[0], &id) == CLLM_ERR_ARG &&
                  strstr(cllm_last_error(), "32 positions"),
              "%s: prompt over max_pos: %s", name, cllm_last_error());
        CHECK(cllm_engine_submit(e, prompt[0], 0, &gp[0], &id) == CLLM_ERR_ARG, "%s: empty prompt", name);
        /* a request that names the other cache dtype than the pool's */
        cllm_generate_params other = gp[1]; /* sampled: its log-probabilities are not all 0 */
        other.kv_dtype = kvd == CLLM_KV_BF16 ? CLLM_KV_FP32 : CLLM_KV_BF16;
        CHECK(cllm_engine_submit(e, prompt[0], 3, &other, &id) == CLLM_ERR_ARG && id == 0 &&
                  strstr(cllm_last_error(), kvd == CLLM_KV_BF16 ? "pool is bf16" : "pool is fp32"),
              "%s: request for a %s cache: %s", name, cllm_kv_dtype_name(other.kv_dtype), cllm_last_error());
        if (kvd == CLLM_KV_BF16) {
            /* the bf16 cache took effect: the fp32 cache gives other log-probabilities */
            result f32;
            memset(&f32, 0, sizeof f32);
            run_alone(name, m, prompt[1], plen[1], &other, &f32);
            bool differ = false;
            for (int t = 0; t < f32.n && t < want[1].n; t++) differ |= f32.lp[t] != want[1].lp[t];
            CHECK(f32.n == want[1].n && differ, "%s: the bf16 cache gives the fp32 cache's log-probabilities", name);
        }
        /* cancelling a queued request: no event, nothing left */
        CHECK(cllm_engine_submit(e, prompt[1], 4, &gp[1], &id) == CLLM_OK && cllm_engine_cancel(e, id) &&
                  !cllm_engine_cancel(e, id),
              "%s: cancel queued", name);
        int ne = -1;
        CHECK(cllm_engine_step(e, on_event, &rs, &ne) == CLLM_OK && ne == 0, "%s: idle step", name);
    }
    /* a pool smaller than one request's reservation, and a token budget
     * below the slot count, are refused with messages */
    if (e) {
        cllm_engine *small = NULL;
        cllm_engine_params sp = {.max_seqs = 2, .max_pos = 32, .block_size = 8, .n_blocks = 2, .max_batch_tokens = 8,
                                 .kv_dtype = kvd};
        CHECK(cllm_engine_init(&small, m, NULL, &sp) == CLLM_OK, "%s: small engine: %s", name, cllm_last_error());
        uint64_t id = 7;
        int32_t p20[20] = {0};
        CHECK(small && cllm_engine_submit(small, p20, 20, &gp[0], &id) == CLLM_ERR_ARG && id == 0 &&
                  strstr(cllm_last_error(), "needs 4 cache blocks") /* 20 + 6 - 1 positions */ && strstr(cllm_last_error(), "the pool has 2"),
              "%s: request larger than the pool: %s", name, cllm_last_error());
        cllm_engine_free(small);
        small = NULL;
        sp.max_batch_tokens = 1;
        CHECK(cllm_engine_init(&small, m, NULL, &sp) == CLLM_ERR_ARG && !small &&
                  strstr(cllm_last_error(), "max_batch_tokens 1 is below max_seqs 2"),
              "%s: token budget below the slots: %s", name, cllm_last_error());
    }
    printf("%-6s %s cache: %d requests in %d steps, %llu rows\n", name, cllm_kv_dtype_name(kvd), NREQ, steps, (unsigned long long)s.forward_rows);
    cllm_engine_free(e);
    cllm_engine_free(NULL);
    cllm_model_free(m);
}

int main(void) {
    const char *plain = "{\"initializer_range\": 0.2}";
    check_engine("gpt2", CLLM_ARCH_GPT2, plain, CLLM_KV_AUTO);
    check_engine("llama", CLLM_ARCH_LLAMA, plain, CLLM_KV_AUTO);
    check_engine("bloom", CLLM_ARCH_BLOOM, plain, CLLM_KV_AUTO);
    /* fp32 models over a bf16 pool (cllm serve --kv-cache-dtype bf16) */
    check_engine("gpt2", CLLM_ARCH_GPT2, plain, CLLM_KV_BF16);
    check_engine("llama", CLLM_ARCH_LLAMA, plain, CLLM_KV_BF16);
    /* Mixtral: routed rows of several requests in one forward, and a window */
    check_engine("mixtral", CLLM_ARCH_LLAMA,
                 "{\"initializer_range\": 0.2, \"model_type\": \"mixtral\", \"num_local_experts\": 4, "
                 "\"num_experts_per_tok\": 2, \"sliding_window\": 7}", CLLM_KV_AUTO);
    return check_summary();
}
