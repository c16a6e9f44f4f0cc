/*
 * Tests of cllm_model_set_inference (cllm/model.h): GPT-2's Conv1D
 * matrices held [out, in] for fp32 decode steps.
 *   - the flat buffer holds each Conv1D matrix transposed, every other
 *     tensor untouched; a second call changes nothing;
 *   - a cached forward (a 20-token prompt, past the small-batch rows, then
 *     single tokens on cllm_qmatmul's row kernel) gives the logits of the
 *     file layout (oneDNN) within 2e-5 of their scale, and the same greedy
 *     tokens;
 *   - cllm_model_save writes the file layout (reloaded bit for bit), and
 *     cllm_model_prepare with train puts it back in the flat buffer;
 *   - a LLaMA model (no Conv1D) and a model with a trainable copy are left
 *     as they are.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/generate.h"
#include "cllm/model.h"

enum { NP = 20, STEPS = 6 };
static const char *SHAPE = "{\"initializer_range\": 0.3, \"n_embd\": 72, \"n_head\": 4, \"n_inner\": 480}";

/* Logits of a 20-token prompt and of STEPS greedy steps after it:
 * out[(STEPS + 1) * V]; tokens[STEPS] the greedy choices. */
static bool run_cached(cllm_model *m, float *out, int32_t *tokens) {
    const int V = cllm_model_get_config(m)->vocab_size;
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)((i * 37 + 11) % V);
    cllm_kv_cache *kv = NULL;
    bool ok = cllm_kv_cache_init(&kv, m, 1, NP + STEPS, NP) == CLLM_OK &&
              cllm_kv_cache_forward(kv, prompt, NP, out) == CLLM_OK;
    for (int s = 0; ok && s < STEPS; s++) {
        const float *l = out + (size_t)s * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (l[v] > l[best]) best = v;
        tokens[s] = best;
        ok = cllm_kv_cache_forward(kv, &best, 1, out + (size_t)(s + 1) * V) == CLLM_OK;
    }
    CHECK(ok, "cached forward: %s", cllm_last_error());
    cllm_kv_cache_free(kv);
    return ok;
}

static bool is_conv(const cllm_tensor_info *t) {
    static const char *const names[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                        "mlp.c_proj.weight"};
    size_t n = strlen(t->name);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t l = strlen(names[k]);
        if (n >= l && strcmp(t->name + n - l, names[k]) == 0) return true;
    }
    return false;
}

/* Every Conv1D tensor of now holds the transpose of was's, the rest equal. */
static void check_layout(cllm_model *m, const float *was) {
    const float *now = cllm_model_params(m);
    int n_conv = 0, bad = 0;
    for (int i = 0; i < cllm_model_n_tensors(m); i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        const float *a = was + t->offset, *b = now + t->offset;
        if (!is_conv(t)) {
            bad += memcmp(a, b, t->numel * sizeof(float)) != 0;
            continue;
        }
        n_conv++;
        const size_t in = (size_t)t->shape[0], out = (size_t)t->shape[1];
        for (size_t r = 0; r < out; r++)
            for (size_t c = 0; c < in; c++) bad += b[r * in + c] != a[c * out + r];
    }
    CHECK(n_conv == 4 * cllm_model_get_config(m)->n_layer, "Conv1D tensors found: %d", n_conv);
    CHECK(bad == 0, "%d values not where the [out, in] layout puts them", bad);
}

static void test_gpt2(void) {
    cllm_model *m = tiny_model(CLLM_ARCH_GPT2, SHAPE, 5);
    CHECK(m != NULL, "gpt2 model");
    if (!m) return;
    const int V = cllm_model_get_config(m)->vocab_size;
    const size_t len = cllm_model_buffer_len(m);
    float *orig = malloc(len * sizeof(float));
    float *ref = malloc((size_t)(STEPS + 1) * V * sizeof(float)), *got = malloc((size_t)(STEPS + 1) * V * sizeof(float));
    int32_t ref_tok[STEPS], got_tok[STEPS];
    memcpy(orig, cllm_model_params(m), len * sizeof(float));
    if (!run_cached(m, ref, ref_tok)) goto done;

    CHECK(cllm_model_set_inference(m) == CLLM_OK, "set_inference: %s", cllm_last_error());
    check_layout(m, orig);
    CHECK(cllm_model_set_inference(m) == CLLM_OK, "second set_inference");
    check_layout(m, orig);

    if (!run_cached(m, got, got_tok)) goto done;
    double scale = 0, worst = 0;
    for (size_t i = 0; i < (size_t)(STEPS + 1) * V; i++) {
        scale = fmax(scale, fabs(ref[i]));
        worst = fmax(worst, fabs(ref[i] - got[i]));
    }
    CHECK(scale > 1.0, "logits of a real size (max |logit| %g)", scale);
    CHECK(worst <= 2e-5 * scale, "logits differ by %g (scale %g)", worst, scale);
    CHECK(memcmp(ref_tok, got_tok, sizeof ref_tok) == 0, "greedy tokens differ");

    /* the file layout on disk */
    char dir[] = "/tmp/cllm_infer_layout_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "temporary folder");
    cllm_model *back = NULL;
    CHECK(cllm_model_save(m, dir, 0) == CLLM_OK, "save: %s", cllm_last_error());
    CHECK(cllm_model_load(&back, dir) == CLLM_OK, "reload: %s", cllm_last_error());
    if (back)
        CHECK(memcmp(cllm_model_params(back), orig, len * sizeof(float)) == 0, "saved values differ from the file layout");
    cllm_model_free(back);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");

    /* training puts the file layout back */
    CHECK(cllm_model_prepare(m, 1, 8, true) == CLLM_OK, "prepare train: %s", cllm_last_error());
    CHECK(memcmp(cllm_model_params(m), orig, len * sizeof(float)) == 0, "training prepared on another layout");
    CHECK(cllm_model_set_inference(m) == CLLM_OK, "set_inference after train prepare");
    CHECK(memcmp(cllm_model_params(m), orig, len * sizeof(float)) == 0, "a model prepared for training was changed");
done:
    free(orig);
    free(ref);
    free(got);
    cllm_model_free(m);
}

/* cllm_model_set_inference leaves m's parameters as they were. */
static void check_unchanged(cllm_model *m, const char *what) {
    size_t len = cllm_model_buffer_len(m);
    float *was = malloc(len * sizeof(float));
    memcpy(was, cllm_model_params(m), len * sizeof(float));
    CHECK(cllm_model_set_inference(m) == CLLM_OK, "%s: set_inference: %s", what, cllm_last_error());
    CHECK(memcmp(was, cllm_model_params(m), len * sizeof(float)) == 0, "%s: weights changed", what);
    free(was);
}

/* Models the call leaves alone. */
static void test_no_ops(void) {
    cllm_model *m = tiny_model(CLLM_ARCH_LLAMA, "{}", 3);
    CHECK(m != NULL, "llama model");
    if (m) check_unchanged(m, "llama");
    cllm_model_free(m);
    m = tiny_model(CLLM_ARCH_GPT2, SHAPE, 6);
    CHECK(m != NULL, "gpt2 model");
    if (!m) return;
    /* a trained copy of a Conv1D matrix beside an extra tensor */
    const cllm_tensor_info *w = cllm_model_find_tensor(m, "transformer.h.0.mlp.c_fc.weight");
    CHECK(w != NULL, "c_fc tensor");
    if (w) {
        int idx = (int)(w - cllm_model_tensor(m, 0));
        cllm_trainable_spec spec[2] = {{.name = w->name, .base = idx},
                                       {.name = "extra", .base = -1, .ndim = 1, .shape = {4}}};
        CHECK(cllm_model_set_trainable(m, spec, 2) == CLLM_OK, "trainable set: %s", cllm_last_error());
        check_unchanged(m, "gpt2 with a trainable copy");
    }
    cllm_model_free(m);
}

int main(void) {
    test_gpt2();
    test_no_ops();
    return check_summary();
}
