/*
 * One model's weights shared by threads: several KV caches over ONE model
 * set to bf16 (and fp16) run greedy generations at the same time, one
 * pthread per request, and must produce exactly the tokens and logits of
 * the same requests run one after another on one thread. The threads start
 * while the model's low-precision weight copy is stale, so its one rebuild
 * is raced too. Run under ASan/UBSan by the sanitizer pass; the TSan
 * recipe is in docs/generate.md.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/generate.h"
#include "cllm/model.h"

enum { N_REQ = 4, PROMPT = 7, NEW = 20 };

typedef struct {
    const cllm_model *m;
    int id;
    int32_t tokens[PROMPT + NEW];
    float *logits;         /* [NEW][V]: the logits each new token was chosen from */
    cllm_status st;
    char err[256];
} request;

/* Greedy continuation of the request's prompt with a cache of its own. */
static void *run_request(void *arg) {
    request *r = arg;
    const int V = cllm_model_get_config(r->m)->vocab_size;
    cllm_kv_cache *kv = NULL;
    r->st = cllm_kv_cache_init(&kv, r->m, 1, PROMPT + NEW, 0);
    int n = PROMPT;
    for (int t = 0; !r->st && t < NEW; t++) {
        float *lg = r->logits + (size_t)t * V;
        r->st = cllm_kv_cache_forward(kv, r->tokens + n - (t ? 1 : PROMPT), t ? 1 : PROMPT, lg);
        if (r->st) break;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        r->tokens[n++] = best;
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", cllm_last_error());
    cllm_kv_cache_free(kv);
    return NULL;
}

static void fill_prompt(request *r, int V) {
    uint64_t x = 977u + 131u * (uint64_t)r->id;
    for (int i = 0; i < PROMPT; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        r->tokens[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
}

static void check_family(const char *name, cllm_arch arch, const char *extra, cllm_precision prec) {
    cllm_model *m = tiny_model(arch, extra, 7);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    CHECK(cllm_model_set_precision(m, prec) == CLLM_OK, "%s: precision: %s", name, cllm_last_error());
    const int V = cllm_model_get_config(m)->vocab_size;
    request *par = calloc(N_REQ, sizeof *par), *seq = calloc(N_REQ, sizeof *seq);
    for (int i = 0; i < N_REQ; i++) {
        par[i] = (request){.m = m, .id = i, .logits = calloc((size_t)NEW * V, sizeof(float))};
        seq[i] = (request){.m = m, .id = i, .logits = calloc((size_t)NEW * V, sizeof(float))};
        fill_prompt(&par[i], V);
        fill_prompt(&seq[i], V);
    }
    /* concurrently first, while the bf16/fp16 weight copy is still stale */
    pthread_t th[N_REQ];
    int started = 0;
    for (int i = 0; i < N_REQ; i++)
        if (pthread_create(&th[i], NULL, run_request, &par[i]) == 0) started++;
    CHECK(started == N_REQ, "%s: %d of %d threads started", name, started, N_REQ);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_REQ; i++) run_request(&seq[i]);

    int distinct = 0;
    for (int i = 0; i < N_REQ; i++) {
        CHECK(par[i].st == CLLM_OK, "%s: thread %d: %s", name, i, par[i].err);
        CHECK(seq[i].st == CLLM_OK, "%s: request %d: %s", name, i, seq[i].err);
        CHECK(!memcmp(par[i].tokens, seq[i].tokens, sizeof par[i].tokens), "%s: request %d: tokens differ", name, i);
        CHECK(!memcmp(par[i].logits, seq[i].logits, (size_t)NEW * V * sizeof(float)),
              "%s: request %d: logits differ", name, i);
        if (i && memcmp(seq[i].tokens + PROMPT, seq[0].tokens + PROMPT, NEW * sizeof(int32_t))) distinct++;
    }
    /* the requests must really differ, or a shared scratch would go unseen */
    CHECK(distinct > 0, "%s: every request generated the same tokens", name);
    for (int i = 0; i < N_REQ; i++) {
        free(par[i].logits);
        free(seq[i].logits);
    }
    free(par);
    free(seq);
    cllm_model_free(m);
}

int main(void) {
    const char *big = "{\"initializer_range\": 0.2}";
    check_family("gpt2 bf16", CLLM_ARCH_GPT2, big, CLLM_PREC_BF16);
    check_family("llama bf16", CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2, \"num_key_value_heads\": 2}",
                 CLLM_PREC_BF16);
    check_family("bloom bf16", CLLM_ARCH_BLOOM, big, CLLM_PREC_BF16);
    check_family("llama fp16", CLLM_ARCH_LLAMA, big, CLLM_PREC_FP16);
    return check_summary();
}
