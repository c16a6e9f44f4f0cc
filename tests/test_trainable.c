/*
 * The trainable set (cllm/model.h) on tiny models of the three families:
 *   - a frozen base with two trained copies and an extra tensor: the loss
 *     and the copies' gradients are those of full training (the backward
 *     through frozen layers computes the same input gradients), the extra
 *     tensor (unused by the pass) gets zero, the buffer holds only the set;
 *   - a write through the trainable buffer reaches the forward pass after
 *     cllm_model_params_updated (the copy is synced back);
 *   - every tensor in place plus an extra one: the parameters are the
 *     trainable buffer, and the gradients are bit-identical to full
 *     training's;
 *   - cllm_model_train_all returns to the whole flat buffer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/model.h"
#include "tiny_model.h"

enum { B = 2, T = 8 };

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static double pass(cllm_model *m, const int32_t *tok, const int32_t *tgt) {
    double s = 0;
    long k = 0;
    cllm_model_zero_grads(m);
    if (cllm_model_forward_backward(m, tok, tgt, B, T, true, 0.1f, &s, &k)) return NAN;
    return s;
}

static void check_family(const char *name, cllm_arch arch) {
    cllm_model *full = tiny_model(arch, "{}", 3), *sub = tiny_model(arch, "{}", 3), *whole = tiny_model(arch, "{}", 3);
    CHECK(full && sub && whole, "%s: tiny models", name);
    if (!full || !sub || !whole) goto out;
    const cllm_model_config *c = cllm_model_get_config(full);
    int32_t tok[B * T], lab[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = lab[i] = (i * 37 + 11) % c->vocab_size;
    cllm_model_make_targets(tgt, lab, B, T);
    CHECK(cllm_model_prepare(full, B, T, true) == CLLM_OK, "%s: prepare", name);
    double loss_full = pass(full, tok, tgt);
    const float *G = cllm_model_grads(full);

    /* a frozen base: the final norm weight, block 1's first linear weight and an extra tensor train */
    int nt = cllm_model_n_tensors(sub), norm = -1, lin = -1;
    for (int i = 0; i < nt; i++) {
        const char *n = cllm_model_tensor(sub, i)->name;
        if (strstr(n, ".1.") && (strstr(n, "c_fc.weight") || strstr(n, "gate_proj.weight") ||
                                 strstr(n, "dense_h_to_4h.weight")))
            lin = i;
        if ((strstr(n, "ln_f.weight") || strstr(n, "model.norm.weight"))) norm = i;
    }
    CHECK(norm >= 0 && lin >= 0, "%s: tensors found", name);
    if (norm < 0 || lin < 0) goto out;
    cllm_trainable_spec spec[3] = {{"head_norm", norm, 0, {0, 0}, true},
                                   {"mlp_in", lin, 0, {0, 0}, false},
                                   {"score.weight", -1, 2, {1, c->n_embd}, false}};
    CHECK(cllm_model_set_trainable(sub, spec, 3) == CLLM_OK, "%s: set: %s", name, cllm_last_error());
    const cllm_tensor_info *tn = cllm_model_trainable(sub, 0), *tl = cllm_model_trainable(sub, 1),
                           *ts = cllm_model_trainable(sub, 2);
    size_t want = ((size_t)c->n_embd + 15) / 16 * 16 * 2 + (cllm_model_tensor(sub, lin)->numel + 15) / 16 * 16;
    CHECK(cllm_model_has_trainable_set(sub) && cllm_model_n_trainable(sub) == 3 && cllm_model_trainable_len(sub) == want &&
          cllm_model_trainable_base(sub, 2) == -1 && cllm_model_find_trainable(sub, "mlp_in") == 1,
          "%s: the set's views and length (%zu, want %zu)", name, cllm_model_trainable_len(sub), want);
    CHECK(cllm_model_prepare(sub, B, T, true) == CLLM_OK, "%s: prepare sub", name);
    double loss_sub = pass(sub, tok, tgt);
    const float *g = cllm_model_grads(sub);
    CHECK(loss_sub == loss_full, "%s: loss %.9g vs %.9g", name, loss_sub, loss_full);
    const cllm_tensor_info *fn = cllm_model_tensor(full, norm), *fl = cllm_model_tensor(full, lin);
    double en = rel_l2(g + tn->offset, G + fn->offset, fn->numel), el = rel_l2(g + tl->offset, G + fl->offset, fl->numel);
    CHECK(en <= 1e-6 && el <= 1e-6, "%s: copies' gradients vs full training: %.2e %.2e", name, en, el);
    bool zero = true;
    for (size_t i = 0; i < ts->numel; i++) zero &= g[ts->offset + i] == 0.0f;
    CHECK(zero, "%s: the unused extra tensor has a zero gradient", name);

    /* a write through the trainable buffer reaches the forward pass */
    float *tp = cllm_model_trainable_params(sub), *fp = cllm_model_params(full);
    for (size_t i = 0; i < tn->numel; i++) {
        tp[tn->offset + i] *= 1.5f;
        fp[fn->offset + i] *= 1.5f;
    }
    cllm_model_params_updated(sub);
    cllm_model_params_updated(full);
    loss_full = pass(full, tok, tgt);
    loss_sub = pass(sub, tok, tgt);
    CHECK(loss_sub == loss_full, "%s: after an update: loss %.9g vs %.9g", name, loss_sub, loss_full);

    /* every tensor in place and an extra one */
    cllm_trainable_spec *all = calloc((size_t)nt + 1, sizeof *all);
    for (int i = 0; i < nt && all; i++) all[i] = (cllm_trainable_spec){cllm_model_tensor(whole, i)->name, i, 0, {0, 0}, false};
    if (all) all[nt] = (cllm_trainable_spec){"score.weight", -1, 2, {1, c->n_embd}, false};
    CHECK(all && cllm_model_set_trainable(whole, all, nt + 1) == CLLM_OK, "%s: set whole: %s", name, cllm_last_error());
    size_t n = cllm_model_buffer_len(whole);
    CHECK(cllm_model_trainable_params(whole) == cllm_model_params(whole) &&
          cllm_model_trainable_len(whole) == n + ((size_t)c->n_embd + 15) / 16 * 16 &&
          cllm_model_trainable(whole, nt)->offset == n && cllm_model_trainable(whole, 3)->offset == cllm_model_tensor(whole, 3)->offset,
          "%s: in place: the parameters are the trainable buffer, the extra after them", name);
    for (size_t i = 0; i < fn->numel; i++) cllm_model_params(whole)[fn->offset + i] *= 1.5f;
    cllm_model_params_updated(whole);
    CHECK(cllm_model_prepare(whole, B, T, true) == CLLM_OK, "%s: prepare whole", name);
    double loss_whole = pass(whole, tok, tgt);
    CHECK(loss_whole == loss_full && !memcmp(cllm_model_grads(whole), cllm_model_grads(full), n * sizeof(float)),
          "%s: in place: loss and gradients bit-identical to full training", name);
    free(all);

    cllm_model_train_all(sub);
    CHECK(!cllm_model_has_trainable_set(sub) && cllm_model_trainable_len(sub) == cllm_model_buffer_len(sub) &&
          cllm_model_trainable_params(sub) == cllm_model_params(sub) && cllm_model_prepare(sub, B, T, true) == CLLM_OK,
          "%s: train_all: the whole flat buffer again", name);
    double loss_all = pass(sub, tok, tgt);
    CHECK(loss_all == loss_full && !memcmp(cllm_model_grads(sub), cllm_model_grads(full), n * sizeof(float)),
          "%s: train_all: full training's gradients", name);
out:
    cllm_model_free(full);
    cllm_model_free(sub);
    cllm_model_free(whole);
}

int main(void) {
    check_family("gpt2", CLLM_ARCH_GPT2);
    check_family("llama", CLLM_ARCH_LLAMA);
    check_family("bloom", CLLM_ARCH_BLOOM);
    return check_summary();
}
