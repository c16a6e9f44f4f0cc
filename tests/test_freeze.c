/*
 * Frozen tensors by name (cllm_model_freeze, the training config's
 * "freeze"): the gradients of the tensors that train equal, bit for bit,
 * those of the same model training everything; frozen tensors get no
 * gradient view and stay bit-identical through an update while the
 * trained ones change; the trainable buffer is the size
 * cllm_model_config_freeze predicts; bad patterns are errors naming them.
 * The same for the inverse (cllm_model_freeze_except, axolotl's
 * "unfrozen_parameters": the patterns name what trains).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/model.h"

enum { B = 2, T = 8 };

static void batch(int32_t *tok, int32_t *tgt, int V) {
    uint64_t x = 4242;
    int32_t lab[B * T];
    for (int i = 0; i < B * T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = lab[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    cllm_model_make_targets(tgt, lab, B, T);
}

static void check_family(const char *name, cllm_arch arch, const char *const *pat, int n, bool except,
                         int want_frozen) {
    const char *extra = "{\"initializer_range\": 0.2}";
    cllm_model *full = tiny_model(arch, extra, 11), *fr = tiny_model(arch, extra, 11);
    CHECK(full && fr, "%s: models", name);
    if (!full || !fr) goto out;
    CHECK((except ? cllm_model_freeze_except(fr, pat, n) : cllm_model_freeze(fr, pat, n)) == CLLM_OK, "%s: freeze: %s",
          name, cllm_last_error());
    const int nt = cllm_model_n_tensors(fr), ntr = cllm_model_n_trainable(fr);
    CHECK(nt - ntr == want_frozen, "%s: %d tensors frozen, want %d", name, nt - ntr, want_frozen);
    size_t len = 0, numel = 0;
    CHECK(cllm_model_config_freeze(cllm_model_config_json(fr), pat, n, except, &len, &numel) == CLLM_OK &&
              len == cllm_model_trainable_len(fr) && numel == cllm_model_trainable_numel(fr),
          "%s: config_freeze %zu/%zu, model %zu/%zu", name, len, numel, cllm_model_trainable_len(fr),
          cllm_model_trainable_numel(fr));
    const size_t np = cllm_model_buffer_len(fr);
    float *before = malloc(np * sizeof(float));
    memcpy(before, cllm_model_params(fr), np * sizeof(float));

    const int V = cllm_model_get_config(full)->vocab_size;
    int32_t tok[B * T], tgt[B * T];
    batch(tok, tgt, V);
    double lf = 0, lz = 0;
    long cf = 0, cz = 0;
    CHECK(!cllm_model_prepare(full, B, T, true) && !cllm_model_prepare(fr, B, T, true), "%s: prepare", name);
    cllm_model_zero_grads(full);
    cllm_model_zero_grads(fr);
    CHECK(!cllm_model_forward_backward(full, tok, tgt, B, T, true, 1.0f, &lf, &cf) &&
              !cllm_model_forward_backward(fr, tok, tgt, B, T, true, 1.0f, &lz, &cz),
          "%s: passes: %s", name, cllm_last_error());
    CHECK(lf == lz && cf == cz, "%s: losses %.9g vs %.9g", name, lf, lz);
    const float *gf = cllm_model_grads(full), *gz = cllm_model_grads(fr);
    for (int i = 0; i < ntr && gf && gz; i++) {
        const cllm_tensor_info *v = cllm_model_trainable(fr, i);
        const cllm_tensor_info *t = cllm_model_tensor(fr, cllm_model_trainable_base(fr, i));
        CHECK(!memcmp(gz + v->offset, gf + t->offset, t->numel * sizeof(float)), "%s: gradient of %s differs", name,
              t->name);
    }
    /* one SGD step on the trainable buffer */
    float *tp = cllm_model_trainable_params(fr);
    for (size_t i = 0; i < cllm_model_trainable_len(fr); i++) tp[i] -= 0.5f * gz[i];
    cllm_model_params_updated(fr);
    const float *after = cllm_model_params(fr);
    int changed = 0;
    for (int t = 0; t < nt; t++) {
        const cllm_tensor_info *ti = cllm_model_tensor(fr, t);
        int view = cllm_model_find_trainable(fr, ti->name);
        bool same = !memcmp(after + ti->offset, before + ti->offset, ti->numel * sizeof(float));
        if (view < 0) {
            CHECK(same, "%s: frozen %s changed", name, ti->name);
        } else {
            CHECK(!memcmp(after + ti->offset, tp + cllm_model_trainable(fr, view)->offset, ti->numel * sizeof(float)),
                  "%s: %s is not its trained copy", name, ti->name);
            changed += !same;
        }
    }
    CHECK(changed > 0, "%s: no trained tensor changed", name);
    free(before);
out:
    cllm_model_free(full);
    cllm_model_free(fr);
}

static void check_errors(void) {
    cllm_model *m = tiny_model(CLLM_ARCH_LLAMA, "{}", 1);
    if (!m) return;
    const char *none[] = {"embed", "no_such_tensor"};
    CHECK(cllm_model_freeze(m, none, 2) == CLLM_ERR_ARG && strstr(cllm_last_error(), "'no_such_tensor'"),
          "a pattern matching nothing: %s", cllm_last_error());
    const char *bad[] = {"layers.(0"};
    CHECK(cllm_model_freeze(m, bad, 1) == CLLM_ERR_ARG && strstr(cllm_last_error(), "layers.(0"),
          "a bad regular expression: %s", cllm_last_error());
    const char *all[] = {"."};
    CHECK(cllm_model_freeze(m, all, 1) == CLLM_ERR_ARG && strstr(cllm_last_error(), "every tensor"),
          "everything frozen: %s", cllm_last_error());
    const char *inner[] = {"layers.1"}; /* unfrozen_parameters match at the start of a name */
    CHECK(cllm_model_freeze_except(m, inner, 1) == CLLM_ERR_ARG && strstr(cllm_last_error(), "'layers.1'"),
          "unfrozen_parameters matched inside a name: %s", cllm_last_error());
    const char *dot[] = {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj_weight"};
    CHECK(cllm_model_freeze_except(m, dot, 2) == CLLM_ERR_ARG && strstr(cllm_last_error(), "up_proj_weight'"),
          "unfrozen_parameters: '.' matched any character: %s", cllm_last_error());
    const char *every[] = {"model", "lm_head"};
    CHECK(cllm_model_freeze_except(m, every, 2) == CLLM_ERR_ARG && strstr(cllm_last_error(), "nothing is frozen"),
          "unfrozen_parameters naming everything: %s", cllm_last_error());
    CHECK(!cllm_model_has_trainable_set(m), "a failed freeze left a trainable set");
    cllm_model_free(m);
}

int main(void) {
    /* the embeddings and the first block (HF's usual "freeze the bottom"), searched */
    const char *gpt2[] = {"wte", "wpe", "\\.h\\.0\\."};
    check_family("gpt2", CLLM_ARCH_GPT2, gpt2, 3, false, 2 + 12);
    /* anchored: every norm weight (2 a block, 2 blocks, the final one) and the first block's attention */
    const char *llama[] = {"norm\\.weight$", "^model\\.layers\\.0\\.self_attn\\."};
    check_family("llama", CLLM_ARCH_LLAMA, llama, 2, false, 5 + 4);
    /* unfrozen_parameters (axolotl's rule): block 1 and the final norm train, matched from the start of
     * the names with "." literal; the other 21 - 10 tensors are frozen */
    const char *only[] = {"model.layers.1.", "model.norm"};
    check_family("llama except", CLLM_ARCH_LLAMA, only, 2, true, 21 - 10);
    const char *bloom[] = {"word_embeddings"};
    check_family("bloom", CLLM_ARCH_BLOOM, bloom, 1, false, 3); /* with word_embeddings_layernorm.* */
    check_errors();
    return check_summary();
}
