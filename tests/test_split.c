/*
 * Tensor-parallel cuts and stage-layout folders: every tensor of every
 * family cut into tp parts and put back is the original bit for bit; the
 * parts have the shapes Megatron's scheme gives; a layout written and read
 * back is the model; damaged layouts are refused with the file named. (The
 * cuts themselves are compared with an independent PyTorch slicing in
 * tests/split_test.py.) A tensor rank's model part has exactly the cut
 * shapes, and a part of one (tp 1) runs the single-process pass bit for bit;
 * the multi-rank passes are checked under mpirun by tests/tp_test.py.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cllm/io.h"
#include "cllm/model.h"
#include "cllm/quant.h"
#include "cllm/split.h"

static cllm_model *tiny(cllm_arch a, int tie) {
    json_t *j = NULL;
    cllm_model *m = NULL;
    if (cllm_model_preset(&j, a, "tiny")) return NULL;
    json_object_set_new(j, a == CLLM_ARCH_LLAMA ? "num_hidden_layers" : "n_layer", json_integer(3));
    if (a == CLLM_ARCH_LLAMA) json_object_set_new(j, "tie_word_embeddings", json_boolean(tie));
    if (a == CLLM_ARCH_LLAMA) json_object_set_new(j, "attention_bias", json_true());
    CHECK(cllm_model_init_random(&m, j, 7) == CLLM_OK, "init: %s", cllm_last_error());
    json_decref(j);
    return m;
}

static void test_cuts(cllm_model *m, int tp) {
    for (int i = 0; i < cllm_model_n_tensors(m); i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        cllm_tp_rule rule = cllm_tp_rule_of(m, i);
        const float *full = cllm_model_params(m) + t->offset;
        float *back = calloc(t->numel, sizeof(float)), *part = calloc(t->numel, sizeof(float));
        int64_t shape[2];
        cllm_tp_shape(t, rule, tp, shape);
        size_t pn = (size_t)shape[0] * (size_t)(t->ndim > 1 ? shape[1] : 1);
        /* an unsegmented row cut (the vocabulary) may be padded up to a multiple of tp rows */
        size_t rows_pad = rule.cut == CLLM_TP_ROWS && rule.segments == 1 ? (size_t)(tp - 1) * (t->numel / (size_t)t->shape[0]) : 0;
        CHECK(rule.cut == CLLM_TP_REPLICATE ? pn == t->numel
                                            : pn * (size_t)tp >= t->numel && pn * (size_t)tp <= t->numel + rows_pad,
              "%s: part of %zu", t->name, pn);
        for (int r = 0; r < tp; r++) {
            cllm_tp_slice(t, rule, tp, r, full, part);
            cllm_tp_unslice(t, rule, tp, r, part, back);
        }
        CHECK(memcmp(back, full, t->numel * sizeof(float)) == 0, "%s: tp %d round trip", t->name, tp);
        free(back);
        free(part);
    }
}

static void expect_rule(cllm_model *m, const char *name, cllm_tp_cut cut, int segments, int unit) {
    const cllm_tensor_info *t = cllm_model_find_tensor(m, name);
    CHECK(t != NULL, "no tensor %s", name);
    if (!t) return;
    cllm_tp_rule r = cllm_tp_rule_of(m, (int)(t - cllm_model_tensor(m, 0)));
    CHECK(r.cut == cut && r.segments == segments && r.unit == unit, "%s: cut %d segments %d unit %d", name, r.cut,
          r.segments, r.unit);
}

static int same_params(cllm_model *a, cllm_model *b) {
    return cllm_model_buffer_len(a) == cllm_model_buffer_len(b) &&
           memcmp(cllm_model_params(a), cllm_model_params(b), cllm_model_buffer_len(a) * sizeof(float)) == 0;
}

/* Model parts: cut shapes for tp 2; for tp 1 the same forward, backward and
 * gathered parameters as the whole model, bit for bit. */
static void test_parts(cllm_model *m) {
    const char *arch = cllm_arch_name(cllm_model_get_config(m)->arch);
    for (int r = 0; r < 2; r++) {
        cllm_model *p = NULL;
        CHECK(cllm_tp_model_part(&p, m, 2, r) == CLLM_OK, "%s part %d: %s", arch, r, cllm_last_error());
        if (!p) continue;
        CHECK(cllm_model_get_config(p)->vocab_size * 2 == cllm_model_get_config(m)->vocab_size, "part vocabulary");
        for (int i = 0; i < cllm_model_n_tensors(m); i++) {
            const cllm_tensor_info *t = cllm_model_tensor(m, i), *q = cllm_model_tensor(p, i);
            int64_t shape[2];
            cllm_tp_shape(t, cllm_tp_rule_of(m, i), 2, shape);
            float *want = malloc(q->numel * sizeof(float));
            cllm_tp_slice(t, cllm_tp_rule_of(m, i), 2, r, cllm_model_params(m) + t->offset, want);
            CHECK(strcmp(t->name, q->name) == 0 && shape[0] == q->shape[0] && (q->ndim == 1 || shape[1] == q->shape[1]),
                  "%s part %d: %s has [%lld, %lld]", arch, r, q->name, (long long)q->shape[0], (long long)q->shape[1]);
            CHECK(memcmp(want, cllm_model_params(p) + q->offset, q->numel * sizeof(float)) == 0, "%s part %d: %s values",
                  arch, r, q->name);
            free(want);
        }
        CHECK(cllm_model_set_tensor_parallel(p, NULL, r, 2) != CLLM_OK && strstr(cllm_last_error(), "tensor group of 1"),
              "a 2-way part on one rank: %s", cllm_last_error());
        cllm_model_free(p);
    }
    cllm_model *p = NULL;
    CHECK(cllm_tp_model_part(&p, m, 1, 0) == CLLM_OK && same_params(m, p), "%s: part of 1", arch);
    if (!p) return;
    CHECK(cllm_model_set_tensor_parallel(p, NULL, 0, 1) == CLLM_OK, "tp 1: %s", cllm_last_error());
    enum { B = 2, T = 8 };
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 37 + 5) % 200), tgt[i] = i % 5 == 4 ? -100 : (i * 11) % 200;
    double l1 = 0, l2 = 0;
    long k1 = 0, k2 = 0;
    CHECK(cllm_model_prepare(m, B, T, true) == CLLM_OK && cllm_model_prepare(p, B, T, true) == CLLM_OK, "prepare");
    cllm_model_zero_grads(m);
    cllm_model_zero_grads(p);
    CHECK(cllm_model_forward_backward(m, tok, tgt, B, T, true, 0.1f, &l1, &k1) == CLLM_OK, "whole pass");
    CHECK(cllm_model_forward_backward(p, tok, tgt, B, T, true, 0.1f, &l2, &k2) == CLLM_OK, "part pass");
    CHECK(l1 == l2 && k1 == k2 && l1 > 0, "%s tp 1: loss %.9g vs %.9g", arch, l2, l1);
    CHECK(memcmp(cllm_model_grads(m), cllm_model_grads(p), cllm_model_buffer_len(m) * sizeof(float)) == 0,
          "%s tp 1: gradients differ", arch);
    cllm_model_params(p)[0] += 1.0f;
    CHECK(cllm_tp_model_gather(m, p, NULL, NULL) == CLLM_OK && same_params(m, p), "%s tp 1: gather", arch);
    cllm_model_free(p);
}

/* A vocabulary of 511 over 2 ranks: 256 rows each, the last row of rank 1
 * zero; the parts read straight from an HF folder (cllm_tp_model_load)
 * equal those cut from the loaded model bit for bit; stage layouts round
 * trip. */
static void test_odd_vocab(const char *dir) {
    for (int a = 0; a < CLLM_ARCH_COUNT; a++) {
        json_t *j = NULL;
        cllm_model *m = NULL;
        if (cllm_model_preset(&j, (cllm_arch)a, "tiny")) continue;
        json_object_set_new(j, "vocab_size", json_integer(511));
        CHECK(cllm_model_init_random(&m, j, 9) == CLLM_OK, "init: %s", cllm_last_error());
        json_decref(j);
        if (!m) continue;
        const char *arch = cllm_arch_name((cllm_arch)a);
        char hf[4200], lay[4200];
        snprintf(hf, sizeof hf, "%s/odd_%s", dir, arch);
        snprintf(lay, sizeof lay, "%s/odd_%s_layout", dir, arch);
        CHECK(cllm_model_save(m, hf, 0) == CLLM_OK, "save %s: %s", arch, cllm_last_error());
        test_cuts(m, 2);
        for (int r = 0; r < 2; r++) {
            cllm_model *cut = NULL, *read = NULL;
            CHECK(cllm_tp_model_part(&cut, m, 2, r) == CLLM_OK, "%s part %d: %s", arch, r, cllm_last_error());
            CHECK(cllm_tp_model_load(&read, hf, 2, r) == CLLM_OK, "%s load %d: %s", arch, r, cllm_last_error());
            CHECK(cut && read && same_params(cut, read), "%s rank %d: the loaded part differs from the cut", arch, r);
            CHECK(cut && cllm_model_get_config(cut)->vocab_size == 256 && cllm_model_vocab(cut) == 511 &&
                      cllm_model_tensor_size(cut) == 2 && cllm_model_tensor_rank(cut) == r,
                  "%s part %d: vocabulary %d of %d", arch, r, cut ? cllm_model_get_config(cut)->vocab_size : -1,
                  cut ? cllm_model_vocab(cut) : -1);
            if (cut && r == 1) { /* the token embedding's last row is padding */
                const cllm_tensor_info *t = cllm_model_tensor(cut, 0);
                const float *row = cllm_model_params(cut) + t->offset + (size_t)(t->shape[0] - 1) * (size_t)t->shape[1];
                int zero = 1;
                for (int64_t k = 0; k < t->shape[1]; k++) zero &= row[k] == 0.0f;
                CHECK(t->shape[0] == 256 && zero, "%s: %s padding row", arch, t->name);
            }
            cllm_model_free(cut);
            cllm_model_free(read);
        }
        cllm_model *b = NULL;
        CHECK(cllm_split_save(m, 2, NULL, NULL, lay) == CLLM_OK && cllm_split_load(&b, lay) == CLLM_OK,
              "%s odd layout: %s", arch, cllm_last_error());
        CHECK(b && same_params(m, b), "%s: odd vocabulary layout round trip", arch);
        cllm_model_free(b);
        cllm_model_free(m);
    }
}

/* Whether dir_a/model.safetensors and dir_b/model.safetensors hold the same bytes. */
static int same_file(const char *dir_a, const char *dir_b) {
    char pa[4300], pb[4300], *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    snprintf(pa, sizeof pa, "%s/model.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", dir_b);
    int same = cllm_read_file(pa, &a, &na) == CLLM_OK && cllm_read_file(pb, &b, &nb) == CLLM_OK && na == nb &&
               memcmp(a, b, na) == 0;
    free(a);
    free(b);
    return same;
}

/* Parts in bf16 / int8 / q4 (cllm_tp_model_load_weights), vocabulary 511
 * over 2 ranks: a part cut from fp32 files and quantized equals, bit for
 * bit, the part whose blocks are cut as bytes from the whole model's
 * quantized folder (so every slice holds exactly the whole model's blocks);
 * each rank holds about half the whole model's bytes. A row-parallel cut
 * inside a 32-value block (LLaMA's FFN of 172: 86 inputs a rank) is
 * refused naming the tensor. */
static void test_quantized_parts(const char *dir) {
    for (int a = 0; a < CLLM_ARCH_COUNT; a++) {
        json_t *j = NULL;
        cllm_model *m = NULL, *whole = NULL;
        if (cllm_model_preset(&j, (cllm_arch)a, "tiny")) continue;
        json_object_set_new(j, "vocab_size", json_integer(511));
        if (a == CLLM_ARCH_LLAMA) json_object_set_new(j, "intermediate_size", json_integer(192));
        CHECK(cllm_model_init_random(&m, j, 5) == CLLM_OK, "init: %s", cllm_last_error());
        json_decref(j);
        if (!m) continue;
        const char *arch = cllm_arch_name((cllm_arch)a);
        char hf[4200], qdir[4200], da[4200], db[4200];
        snprintf(hf, sizeof hf, "%s/q_%s", dir, arch);
        CHECK(cllm_model_save(m, hf, 0) == CLLM_OK, "save %s: %s", arch, cllm_last_error());
        for (int f = CLLM_WFMT_BF16; f < CLLM_WFMT_COUNT; f++) {
            const char *fn = cllm_wfmt_name((cllm_wfmt)f);
            snprintf(qdir, sizeof qdir, "%s/q_%s_%s", dir, arch, fn);
            CHECK(cllm_model_load_weights(&whole, hf, fn) == CLLM_OK &&
                      cllm_model_save_weights(whole, qdir, 0) == CLLM_OK,
                  "%s %s whole: %s", arch, fn, cllm_last_error());
            size_t held = 0;
            for (int r = 0; r < 2; r++) {
                cllm_model *pa = NULL, *pb = NULL;
                snprintf(da, sizeof da, "%s/q_%s_%s_a%d", dir, arch, fn, r);
                snprintf(db, sizeof db, "%s/q_%s_%s_b%d", dir, arch, fn, r);
                CHECK(cllm_tp_model_load_weights(&pa, hf, 2, r, fn) == CLLM_OK &&
                          cllm_tp_model_load_weights(&pb, qdir, 2, r, NULL) == CLLM_OK,
                      "%s %s part %d: %s", arch, fn, r, cllm_last_error());
                CHECK(pa && pb && cllm_model_weights(pa) == (cllm_wfmt)f && cllm_model_weights(pb) == (cllm_wfmt)f,
                      "%s %s part %d: format", arch, fn, r);
                CHECK(pa && pb && cllm_model_save_weights(pa, da, 0) == CLLM_OK &&
                          cllm_model_save_weights(pb, db, 0) == CLLM_OK && same_file(da, db),
                      "%s %s part %d: cut-then-quantized and quantized-then-cut differ", arch, fn, r);
                held += pa ? cllm_model_held_bytes(pa) : 0;
                cllm_model_free(pa);
                cllm_model_free(pb);
            }
            /* the two halves: the whole's bytes, plus a second copy of the
             * replicated tensors (norms, biases, GPT-2's positions) */
            size_t whole_held = whole ? cllm_model_held_bytes(whole) : 0;
            CHECK(held > whole_held && held < 2 * whole_held, "%s %s: ranks hold %zu bytes, whole %zu", arch, fn, held,
                  whole_held);
            cllm_model_free(whole);
            whole = NULL;
        }
        cllm_model_free(m);
    }
    json_t *j = NULL;
    cllm_model *m = NULL, *p = NULL;
    char hf[4200];
    snprintf(hf, sizeof hf, "%s/q_llama172", dir);
    CHECK(cllm_model_preset(&j, CLLM_ARCH_LLAMA, "tiny") == CLLM_OK && cllm_model_init_random(&m, j, 5) == CLLM_OK &&
              cllm_model_save(m, hf, 0) == CLLM_OK, "llama 172: %s", cllm_last_error());
    CHECK(cllm_tp_model_load_weights(&p, hf, 2, 1, "int8") == CLLM_ERR_UNSUPPORTED && !p &&
              strstr(cllm_last_error(), "model.layers.0.mlp.down_proj.weight is cut along its 172 inputs"),
          "a cut inside a block: %s", cllm_last_error());
    CHECK(cllm_tp_model_load_weights(&p, hf, 2, 1, "bf16") == CLLM_OK, "bf16 cuts anywhere: %s", cllm_last_error());
    cllm_model_free(p);
    /* an int8 folder of it: as stored (int8) refused, as bf16 widened and cut */
    cllm_model *w = NULL;
    char q8[4200];
    snprintf(q8, sizeof q8, "%s/q_llama172_int8", dir);
    CHECK(cllm_model_load_weights(&w, hf, "int8") == CLLM_OK && cllm_model_save_weights(w, q8, 0) == CLLM_OK,
          "llama 172 int8: %s", cllm_last_error());
    cllm_model_free(w);
    p = NULL;
    CHECK(cllm_tp_model_load_weights(&p, q8, 2, 0, NULL) == CLLM_ERR_UNSUPPORTED && !p,
          "int8 folder cut inside a block: %s", cllm_last_error());
    CHECK(cllm_tp_model_load_weights(&p, q8, 2, 0, "bf16") == CLLM_OK && p && cllm_model_weights(p) == CLLM_WFMT_BF16,
          "int8 folder as bf16 slices: %s", cllm_last_error());
    cllm_model_free(p);
    cllm_model_free(m);
    json_decref(j);
}

int main(void) {
    char dir[] = "/tmp/cllm_split_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char out[4200], path[4300];
    snprintf(out, sizeof out, "%s/layout", dir);
    for (int a = 0; a < CLLM_ARCH_COUNT; a++)
        for (int tie = 0; tie < (a == CLLM_ARCH_LLAMA ? 2 : 1); tie++) {
            cllm_model *m = tiny((cllm_arch)a, tie);
            if (!m) continue;
            test_parts(m);
            for (int tp = 1; tp <= 4; tp *= 2) {
                test_cuts(m, tp);
                CHECK(cllm_split_save(m, tp, NULL, NULL, out) == CLLM_OK, "save tp %d: %s", tp, cllm_last_error());
                CHECK(cllm_split_is_layout(out), "is a layout");
                cllm_model *b = NULL;
                CHECK(cllm_split_load(&b, out) == CLLM_OK, "load: %s", cllm_last_error());
                CHECK(b && same_params(m, b), "%s tp %d: layout round trip", cllm_arch_name((cllm_arch)a), tp);
                cllm_model_free(b);
            }
            cllm_model_free(m);
        }
    test_odd_vocab(dir);
    test_quantized_parts(dir);
    cllm_model *g = tiny(CLLM_ARCH_GPT2, 1), *l = tiny(CLLM_ARCH_LLAMA, 0), *bl = tiny(CLLM_ARCH_BLOOM, 1);
    expect_rule(g, "transformer.h.1.attn.c_attn.weight", CLLM_TP_COLS, 3, 2);
    expect_rule(g, "transformer.h.1.attn.c_attn.bias", CLLM_TP_ROWS, 3, 2);
    expect_rule(g, "transformer.h.1.attn.c_proj.weight", CLLM_TP_ROWS, 1, 2);
    expect_rule(g, "transformer.h.1.attn.c_proj.bias", CLLM_TP_REPLICATE, 1, 2);
    expect_rule(g, "transformer.h.0.mlp.c_fc.weight", CLLM_TP_COLS, 1, 1);
    expect_rule(g, "transformer.h.0.mlp.c_proj.weight", CLLM_TP_ROWS, 1, 1);
    expect_rule(g, "transformer.wte.weight", CLLM_TP_ROWS, 1, 0);
    expect_rule(g, "transformer.wpe.weight", CLLM_TP_REPLICATE, 1, 0);
    expect_rule(g, "transformer.ln_f.weight", CLLM_TP_REPLICATE, 1, 4);
    expect_rule(l, "model.layers.2.self_attn.k_proj.weight", CLLM_TP_ROWS, 1, 3);
    expect_rule(l, "model.layers.2.self_attn.o_proj.weight", CLLM_TP_COLS, 1, 3);
    expect_rule(l, "model.layers.2.self_attn.o_proj.bias", CLLM_TP_REPLICATE, 1, 3);
    expect_rule(l, "model.layers.0.mlp.down_proj.weight", CLLM_TP_COLS, 1, 1);
    expect_rule(l, "model.layers.0.mlp.up_proj.weight", CLLM_TP_ROWS, 1, 1);
    expect_rule(l, "lm_head.weight", CLLM_TP_ROWS, 1, 4);
    expect_rule(bl, "transformer.h.0.self_attention.query_key_value.weight", CLLM_TP_ROWS, 1, 1);
    expect_rule(bl, "transformer.h.0.self_attention.dense.weight", CLLM_TP_COLS, 1, 1);
    expect_rule(bl, "transformer.word_embeddings_layernorm.weight", CLLM_TP_REPLICATE, 1, 0);

    /* damage: a missing unit file, a foreign folder */
    CHECK(cllm_split_save(l, 2, NULL, NULL, out) == CLLM_OK, "save");
    snprintf(path, sizeof path, "%s/unit_002-tp_01.safetensors", out);
    CHECK(unlink(path) == 0, "remove a unit file");
    cllm_model *x = NULL;
    CHECK(cllm_split_load(&x, out) != CLLM_OK && strstr(cllm_last_error(), "unit_002-tp_01"),
          "missing file named: %s", cllm_last_error());
    CHECK(x == NULL, "no model on failure");
    snprintf(path, sizeof path, "%s/plain", dir);
    CHECK(cllm_model_save(l, path, 0) == CLLM_OK, "save hf");
    CHECK(cllm_split_save(l, 2, NULL, NULL, path) != CLLM_OK && strstr(cllm_last_error(), "not a stage layout"),
          "refuses to replace an HF folder: %s", cllm_last_error());
    CHECK(cllm_split_save(l, 3, NULL, NULL, out) != CLLM_OK && strstr(cllm_last_error(), "cannot be cut into 3"),
          "tp 3: %s", cllm_last_error());
    cllm_model_free(g);
    cllm_model_free(l);
    cllm_model_free(bl);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
