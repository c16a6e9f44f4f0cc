/*
 * Pipeline stages in one process: running the stages of a split one after
 * the other (forwards first, then each stage's backward from the next one's
 * input gradient) gives bit for bit the loss and gradients of the whole
 * model's forward_backward, for every family, tied and untied heads, with
 * and without activation recomputation, and for every way of cutting a
 * 3-block model into 2 and 3 stages. With the layer hooks (the per-layer
 * ZeRO seam) the stage passes hand each of their groups over once, with the
 * same gradients.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/model.h"

enum { B = 2, T = 16, L = 3 };

static cllm_model *tiny(cllm_arch a, int tie) { /* gpt2 and bloom heads are always tied */
    json_t *j = NULL;
    cllm_model *m = NULL;
    if (cllm_model_preset(&j, a, "tiny")) return NULL;
    json_object_set_new(j, a == CLLM_ARCH_LLAMA ? "num_hidden_layers" : "n_layer", json_integer(L));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(tie));
    CHECK(cllm_model_init_random(&m, j, 11) == CLLM_OK, "init: %s", cllm_last_error());
    json_decref(j);
    return m;
}

/* Runs the stages cut at bounds[0..k] (bounds[0] = 0, bounds[k] = L + 2). */
static void run_stages(cllm_model *m, const int *bounds, int k, const int32_t *tok, const int32_t *tgt, double *loss,
                       long *count) {
    const int C = cllm_model_get_config(m)->n_embd;
    size_t NC = (size_t)B * T * C;
    float *x = calloc((size_t)(k + 1) * NC, sizeof(float)), *dx = calloc((size_t)(k + 1) * NC, sizeof(float));
    double s;
    long n;
    for (int i = 0; i < k; i++) { /* forwards; x[i] is stage i's input */
        cllm_model_stage_io io = {bounds[i], bounds[i + 1], tok, tgt, x + i * NC, NULL, x + (i + 1) * NC, NULL, false, 0};
        CHECK(cllm_model_stage_run(m, &io, B, T, &s, &n) == CLLM_OK, "forward stage %d: %s", i, cllm_last_error());
    }
    *loss = 0;
    *count = 0;
    for (int i = k - 1; i >= 0; i--) { /* backwards; dx[i + 1] is stage i's output gradient */
        cllm_model_stage_io io = {bounds[i], bounds[i + 1], tok, tgt, x + i * NC, dx + (i + 1) * NC, x + (i + 1) * NC,
                                  dx + i * NC, true, 1.0f / 30};
        CHECK(cllm_model_stage_run(m, &io, B, T, &s, &n) == CLLM_OK, "backward stage %d: %s", i, cllm_last_error());
        *loss += s;
        *count += n;
    }
    free(x);
    free(dx);
}

/* Layer hooks that hand out the model's own parameters and a scratch
 * gradient per group, adding it into acc when the group is ready (what the
 * per-layer ZeRO reductions do, without the ranks). */
typedef struct {
    cllm_model *m;
    float *scratch, *acc;
    int fetched[L + 2], ready[L + 2], open;
} hook_log;

static cllm_status h_fetch(void *ctx, int g, int next, float **p) {
    (void)next;
    hook_log *h = ctx;
    size_t b, e;
    cllm_model_group_range(h->m, g, &b, &e);
    h->fetched[g]++;
    h->open++;
    *p = cllm_model_params(h->m) + b;
    return CLLM_OK;
}
static cllm_status h_release(void *ctx, int g) {
    (void)g;
    ((hook_log *)ctx)->open--;
    return CLLM_OK;
}
static cllm_status h_fetch_grads(void *ctx, int g, float **p) {
    hook_log *h = ctx;
    size_t b, e;
    cllm_model_group_range(h->m, g, &b, &e);
    memset(h->scratch + b, 0, (e - b) * sizeof(float));
    *p = h->scratch + b;
    return CLLM_OK;
}
static cllm_status h_ready(void *ctx, int g) {
    hook_log *h = ctx;
    size_t b, e;
    cllm_model_group_range(h->m, g, &b, &e);
    for (size_t i = b; i < e; i++) h->acc[i] += h->scratch[i];
    h->ready[g]++;
    return CLLM_OK;
}

/* The stage passes run the layer hooks around their own groups: a 3-stage
 * split of an untied LLaMA with hooks gives the reference gradients bit for
 * bit, each group's gradient handed over once, every fetch released; a tied
 * head's stage with hooks is refused. */
static void stage_hooks(const int32_t *tok, const int32_t *tgt, const float *ref, double ref_loss) {
    cllm_model *m = tiny(CLLM_ARCH_LLAMA, 0);
    hook_log h = {m, NULL, NULL, {0}, {0}, 0};
    cllm_model_hooks hk = {.ctx = &h, .fetch_params = h_fetch, .release_params = h_release,
                           .fetch_grads = h_fetch_grads, .grads_ready = h_ready};
    cllm_model_set_hooks(m, &hk);
    CHECK(cllm_model_prepare(m, B, T, true) == CLLM_OK, "prepare with hooks");
    size_t n = cllm_model_buffer_len(m);
    h.scratch = calloc(n, sizeof(float));
    h.acc = calloc(n, sizeof(float));
    int bounds[4] = {0, 2, 4, L + 2};
    double loss;
    long count;
    run_stages(m, bounds, 3, tok, tgt, &loss, &count);
    CHECK(loss == ref_loss, "hooked stages: loss %.9g vs %.9g", loss, ref_loss);
    CHECK(memcmp(ref, h.acc, n * sizeof(float)) == 0, "hooked stages: gradients differ");
    CHECK(h.open == 0, "hooked stages: %d fetches not released", h.open);
    for (int g = 0; g < L + 2; g++) {
        CHECK(h.ready[g] == 1, "group %d handed over %d times", g, h.ready[g]);
        CHECK(h.fetched[g] >= 2, "group %d fetched %d times (forward and backward)", g, h.fetched[g]);
    }
    free(h.scratch);
    free(h.acc);
    cllm_model_free(m);
    cllm_model *t = tiny(CLLM_ARCH_GPT2, 1);
    cllm_model_set_hooks(t, &hk);
    h.m = t;
    CHECK(cllm_model_prepare(t, B, T, true) == CLLM_OK, "prepare tied with hooks");
    cllm_model_stage_io last = {L + 1, L + 2, tok, tgt, NULL, NULL, NULL, NULL, false, 0};
    float *x = calloc((size_t)B * T * cllm_model_get_config(t)->n_embd, sizeof(float));
    last.x_in = x;
    /* a tied head's own stage: the hooks hand it the embedding too, and its
     * loss is the hook-less stage's (same weights, same input) */
    h.open = 0;
    memset(h.fetched, 0, sizeof h.fetched);
    CHECK(cllm_model_stage_run(t, &last, B, T, &loss, &count) == CLLM_OK, "tied head's stage with hooks: %s",
          cllm_last_error());
    CHECK(h.open == 0 && h.fetched[0] == 1, "tied head's stage: embedding fetched %d times, %d not released",
          h.fetched[0], h.open);
    cllm_model *u = tiny(CLLM_ARCH_GPT2, 1);
    double plain_loss = -1;
    long plain_count = -1;
    CHECK(cllm_model_prepare(u, B, T, true) == CLLM_OK, "prepare tied");
    CHECK(cllm_model_stage_run(u, &last, B, T, &plain_loss, &plain_count) == CLLM_OK, "tied head's stage: %s",
          cllm_last_error());
    CHECK(plain_loss == loss && plain_count == count, "tied head's stage: loss %.9g (%ld) with hooks, %.9g (%ld) without",
          loss, count, plain_loss, plain_count);
    cllm_model_free(u);
    /* one stage holding both ends of a tied model cannot hand group 0 over twice */
    cllm_model_stage_io all = {0, L + 2, tok, tgt, NULL, NULL, NULL, NULL, false, 0};
    CHECK(cllm_model_stage_run(t, &all, B, T, &loss, &count) == CLLM_ERR_UNSUPPORTED,
          "one stage of every unit with a tied head and hooks refused");
    free(x);
    cllm_model_free(t);
}

int main(void) {
    int32_t tok[B * T], lab[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = lab[i] = (i * 37 + 5) % 500;
    lab[3] = -100;
    cllm_model_make_targets(tgt, lab, B, T);
    for (int a = 0; a < CLLM_ARCH_COUNT; a++)
        for (int tie = a == CLLM_ARCH_LLAMA ? 0 : 1; tie < 2; tie++)
            for (int rc = 0; rc < 2; rc++) {
                cllm_model *m = tiny((cllm_arch)a, tie);
                if (!m) continue;
                cllm_model_set_recompute(m, rc);
                CHECK(cllm_model_prepare(m, B, T, true) == CLLM_OK, "prepare");
                size_t n = cllm_model_buffer_len(m);
                cllm_model_zero_grads(m);
                double ref_loss;
                long ref_count;
                CHECK(cllm_model_forward_backward(m, tok, tgt, B, T, true, 1.0f / 30, &ref_loss, &ref_count) == CLLM_OK,
                      "reference");
                float *ref = malloc(n * sizeof(float));
                memcpy(ref, cllm_model_grads(m), n * sizeof(float));
                /* every cut into 2 and 3 stages of the 5 units */
                for (int c1 = 1; c1 < L + 2; c1++)
                    for (int c2 = c1; c2 < L + 3; c2++) {
                        int three = c2 < L + 2;
                        int bounds[4] = {0, c1, three ? c2 : L + 2, L + 2};
                        int k = three ? 3 : 2;
                        if (!three && c2 != L + 2) continue;
                        if (three && c2 == c1) continue;
                        cllm_model_zero_grads(m);
                        double loss;
                        long count;
                        run_stages(m, bounds, k, tok, tgt, &loss, &count);
                        CHECK(loss == ref_loss && count == ref_count, "%s tie %d rc %d cut %d,%d: loss %.9g vs %.9g",
                              cllm_arch_name((cllm_arch)a), tie, rc, c1, c2, loss, ref_loss);
                        CHECK(memcmp(ref, cllm_model_grads(m), n * sizeof(float)) == 0,
                              "%s tie %d rc %d cut %d,%d: gradients differ", cllm_arch_name((cllm_arch)a), tie, rc, c1,
                              c2);
                    }
                cllm_model_stage_io bad = {2, 1, tok, tgt, NULL, NULL, NULL, NULL, false, 0};
                double s;
                long cnt;
                CHECK(cllm_model_stage_run(m, &bad, B, T, &s, &cnt) != CLLM_OK, "empty range refused");
                if (a == CLLM_ARCH_LLAMA && !tie && !rc) stage_hooks(tok, tgt, ref, ref_loss);
                free(ref);
                cllm_model_free(m);
            }
    return check_summary();
}
