/*
 * Pipeline stages in one process: running the stages of a split one after
 * the other (forwards first, then each stage's backward from the next one's
 * input gradient) gives bit for bit the loss and gradients of the whole
 * model's forward_backward, for every family, tied and untied heads, with
 * and without activation recomputation, and for every way of cutting a
 * 3-block model into 2 and 3 stages.
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
                free(ref);
                cllm_model_free(m);
            }
    return check_summary();
}
