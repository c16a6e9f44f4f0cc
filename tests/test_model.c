/*
 * Model files without a reference implementation: random init -> save ->
 * load -> save is byte-identical (single file and sharded); BF16 and F16
 * files load as the rounded values; GPT-2 names without the "transformer."
 * prefix and legacy buffers load; config errors name the key.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cllm/io.h"
#include "cllm/model.h"

static char tmp[256];

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = cllm_read_file(a, &x, &nx) == CLLM_OK && cllm_read_file(b, &y, &ny) == CLLM_OK && nx == ny &&
               memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static cllm_model *make(cllm_arch arch, const char *sets) {
    json_t *cfg = NULL;
    cllm_model *m = NULL;
    if (cllm_model_preset(&cfg, arch, "tiny")) return NULL;
    if (sets) {
        json_t *extra = json_loads(sets, 0, NULL);
        json_object_update(cfg, extra);
        json_decref(extra);
    }
    cllm_model_init_random(&m, cfg, 7);
    json_decref(cfg);
    return m;
}

static void test_roundtrip(cllm_arch arch) {
    char a[512], b[512], fa[600], fb[600];
    cllm_model *m = make(arch, NULL), *m2 = NULL;
    CHECK(m != NULL, "init %s: %s", cllm_arch_name(arch), cllm_last_error());
    if (!m) return;
    snprintf(a, sizeof a, "%s/%s-a", tmp, cllm_arch_name(arch));
    snprintf(b, sizeof b, "%s/%s-b", tmp, cllm_arch_name(arch));
    CHECK(cllm_model_save(m, a, 0) == CLLM_OK, "save: %s", cllm_last_error());
    CHECK(cllm_model_load(&m2, a) == CLLM_OK, "load: %s", cllm_last_error());
    if (m2) {
        CHECK(cllm_model_save(m2, b, 0) == CLLM_OK, "save 2: %s", cllm_last_error());
        snprintf(fa, sizeof fa, "%s/model.safetensors", a);
        snprintf(fb, sizeof fb, "%s/model.safetensors", b);
        CHECK(same_file(fa, fb), "%s: safetensors differ after a load-save round trip", cllm_arch_name(arch));
        snprintf(fa, sizeof fa, "%s/config.json", a);
        snprintf(fb, sizeof fb, "%s/config.json", b);
        CHECK(same_file(fa, fb), "%s: config.json differs after a round trip", cllm_arch_name(arch));
        CHECK(memcmp(cllm_model_params(m), cllm_model_params(m2), cllm_model_buffer_len(m) * 4) == 0,
              "%s: parameters differ after load", cllm_arch_name(arch));
    }
    cllm_model_free(m2);
    m2 = NULL;
    /* sharded: small shards, load back, save sharded again -> same files */
    snprintf(a, sizeof a, "%s/%s-sa", tmp, cllm_arch_name(arch));
    snprintf(b, sizeof b, "%s/%s-sb", tmp, cllm_arch_name(arch));
    CHECK(cllm_model_save(m, a, 100000) == CLLM_OK, "sharded save: %s", cllm_last_error());
    snprintf(fa, sizeof fa, "%s/model.safetensors.index.json", a);
    CHECK(access(fa, F_OK) == 0, "no index.json in a sharded save");
    CHECK(cllm_model_load(&m2, a) == CLLM_OK, "sharded load: %s", cllm_last_error());
    if (m2) {
        CHECK(cllm_model_save(m2, b, 100000) == CLLM_OK, "sharded save 2: %s", cllm_last_error());
        snprintf(fb, sizeof fb, "%s/model.safetensors.index.json", b);
        CHECK(same_file(fa, fb), "index.json differs after a sharded round trip");
        /* every shard the index names is identical in both folders */
        json_t *idx = json_load_file(fa, 0, NULL);
        json_t *wm = json_object_get(idx, "weight_map");
        const char *key;
        json_t *v;
        int shards_ok = json_object_size(wm) > 0, n_files = 0;
        json_object_foreach(wm, key, v) {
            snprintf(fa, sizeof fa, "%s/%s", a, json_string_value(v));
            snprintf(fb, sizeof fb, "%s/%s", b, json_string_value(v));
            shards_ok &= same_file(fa, fb);
            n_files += strstr(json_string_value(v), "-of-") != NULL;
        }
        CHECK(shards_ok && n_files > 1, "sharded round trip: shards differ or were not sharded");
        json_decref(idx);
        CHECK(memcmp(cllm_model_params(m), cllm_model_params(m2), cllm_model_buffer_len(m) * 4) == 0,
              "sharded parameters differ");
    }
    cllm_model_free(m2);
    cllm_model_free(m);
}

/* Writes the model's tensors in a 16-bit dtype (and under other names) and
 * checks the loaded values are the rounded ones. */
static void test_half_and_names(cllm_dtype dt) {
    cllm_model *m = make(CLLM_ARCH_GPT2, NULL), *m2 = NULL;
    if (!m) return;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/gpt2-%s", tmp, cllm_dtype_name(dt));
    CHECK(cllm_model_save(m, dir, 0) == CLLM_OK, "save: %s", cllm_last_error());
    int n = cllm_model_n_tensors(m);
    cllm_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    uint16_t **bufs = calloc((size_t)n, sizeof *bufs);
    char (*names)[96] = calloc((size_t)n, 96);
    for (int i = 0; i < n; i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        bufs[i] = malloc(t->numel * 2);
        for (size_t k = 0; k < t->numel; k++) {
            float v = cllm_model_params(m)[t->offset + k];
            bufs[i][k] = dt == CLLM_BF16 ? cllm_f32_to_bf16(v) : cllm_f32_to_f16(v);
        }
        /* old GPT-2 exports: no "transformer." prefix */
        snprintf(names[i], 96, "%s", strncmp(t->name, "transformer.", 12) == 0 ? t->name + 12 : t->name);
        e[i] = (cllm_st_entry){.name = names[i], .dtype = dt, .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]},
                               .data = bufs[i]};
    }
    /* plus a legacy causal-mask buffer that must be ignored */
    static const float mask[4] = {1, 0, 1, 1};
    e[n] = (cllm_st_entry){.name = "h.0.attn.bias", .dtype = CLLM_F32, .ndim = 2, .shape = {2, 2}, .data = mask};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(cllm_st_save(path, e, n + 1) == CLLM_OK, "save half: %s", cllm_last_error());
    CHECK(cllm_model_load(&m2, dir) == CLLM_OK, "load %s: %s", cllm_dtype_name(dt), cllm_last_error());
    if (m2) {
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const cllm_tensor_info *t = cllm_model_tensor(m, i);
            for (size_t k = 0; k < t->numel; k++) {
                float want = dt == CLLM_BF16 ? cllm_bf16_to_f32(bufs[i][k]) : cllm_f16_to_f32(bufs[i][k]);
                bad += cllm_model_params(m2)[t->offset + k] != want;
            }
        }
        CHECK(bad == 0, "%d values differ from their %s rounding", bad, cllm_dtype_name(dt));
    }
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(names);
    free(e);
    cllm_model_free(m2);
    cllm_model_free(m);
}

static void expect_config_error(const char *json, const char *needle) {
    json_t *j = json_loads(json, 0, NULL);
    cllm_model_config c;
    cllm_status st = cllm_model_config_from_json(&c, j, "cfg.json");
    CHECK(st != CLLM_OK && strstr(cllm_last_error(), needle), "config %s: status %d, message '%s' lacks '%s'", json,
          st, cllm_last_error(), needle);
    json_decref(j);
}

static void test_config_errors(void) {
    expect_config_error("{\"model_type\":\"mamba\"}", "unknown model_type \"mamba\"");
    expect_config_error("{\"vocab_size\":10}", "model_type");
    expect_config_error("{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_positions\":8,\"n_embd\":8,\"n_layer\":1}",
                        "n_head");
    expect_config_error("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                        "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":3}",
                        "num_key_value_heads");
    expect_config_error("{\"model_type\":\"llama\",\"vocab_size\":\"x\",\"hidden_size\":8}", "vocab_size");
    expect_config_error("{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_positions\":8,\"n_embd\":9,\"n_layer\":1,"
                        "\"n_head\":2}",
                        "n_embd");
    expect_config_error("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_scaling\":{\"type\":\"linear\"}}",
                        "rope_scaling");
    expect_config_error("{\"model_type\":\"bloom\",\"vocab_size\":10,\"hidden_size\":8,\"n_layer\":1,\"n_head\":2,"
                        "\"apply_residual_connection_post_layernorm\":true}",
                        "apply_residual_connection_post_layernorm");
    /* sizes past the limits are refused before any layout arithmetic */
    expect_config_error("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                        "\"num_hidden_layers\":100000,\"num_attention_heads\":2}",
                        "layer count 100000 exceeds the supported maximum of 4096 (n_layer / num_hidden_layers)");
    expect_config_error("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                        "\"num_hidden_layers\":1000000000,\"num_attention_heads\":2}",
                        "'num_hidden_layers' must be a positive integer of at most 2^28, got 1000000000");
    expect_config_error("{\"model_type\":\"gpt2\",\"vocab_size\":100000000,\"n_positions\":8,\"n_embd\":8,"
                        "\"n_layer\":1,\"n_head\":2}",
                        "vocabulary size 100000000 exceeds");
    expect_config_error("{\"model_type\":\"bloom\",\"vocab_size\":10,\"hidden_size\":268435456,\"n_layer\":1,"
                        "\"n_head\":2}",
                        "hidden size 268435456 exceeds");
    expect_config_error("{\"model_type\":\"bloom\",\"vocab_size\":10,\"hidden_size\":1073741824,\"n_layer\":1,"
                        "\"n_head\":2}",
                        "'hidden_size' must be a positive integer of at most 2^28");
    json_t *p = NULL;
    CHECK(cllm_model_preset(&p, CLLM_ARCH_LLAMA, "huge") == CLLM_ERR_ARG && strstr(cllm_last_error(), "llama-100M"),
          "unknown preset message: %s", cllm_last_error());
}

/* Presets give the documented sizes. */
static void test_presets(void) {
    struct {
        cllm_arch a;
        const char *name;
        size_t params;
    } want[] = {{CLLM_ARCH_GPT2, "gpt2-124M", 124439808}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        json_t *cfg = NULL;
        cllm_model_config c;
        CHECK(cllm_model_preset(&cfg, want[i].a, want[i].name) == CLLM_OK, "preset %s", want[i].name);
        CHECK(cllm_model_config_from_json(&c, cfg, "preset") == CLLM_OK, "preset config: %s", cllm_last_error());
        /* GPT-2 small: 124,439,808 parameters with the tied head (HF's count) */
        size_t C = (size_t)c.n_embd, L = (size_t)c.n_layer;
        size_t n = (size_t)c.vocab_size * C + (size_t)c.n_ctx * C + L * (12 * C * C + 13 * C) + 2 * C;
        CHECK(n == want[i].params, "%s has %zu parameters", want[i].name, n);
        json_decref(cfg);
    }
}

static double loss_of(cllm_model *m, const int32_t *tok, const int32_t *tgt) {
    double sum = -1;
    long k = 0;
    if (cllm_model_forward_backward(m, tok, tgt, 2, 8, false, 0.0f, &sum, &k)) return -1;
    return sum / (double)k;
}

/* The bf16 weight copy follows the fp32 parameters: after a write and
 * cllm_model_params_updated, a model gives exactly the loss of a model
 * built with those parameters and switched to bf16 afterwards; switching
 * back to fp32 gives the fp32 loss; resize keeps the precision. */
static void test_precision_refresh(cllm_arch arch) {
    cllm_model *a = make(arch, NULL), *b = make(arch, NULL);
    CHECK(a && b, "make %s", cllm_arch_name(arch));
    if (!a || !b) goto done;
    int32_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) tok[i] = (i * 7 + 3) % cllm_model_get_config(a)->vocab_size;
    cllm_model_make_targets(tgt, tok, 2, 8);
    CHECK(cllm_model_set_precision(a, CLLM_PREC_BF16) == CLLM_OK, "%s", cllm_last_error());
    CHECK(cllm_model_set_precision(a, (cllm_precision)7) == CLLM_ERR_ARG, "bad precision accepted");
    CHECK(cllm_model_precision(a) == CLLM_PREC_BF16, "precision lost by a refused change");
    CHECK(cllm_model_prepare(a, 2, 8, false) == CLLM_OK && cllm_model_prepare(b, 2, 8, false) == CLLM_OK, "prepare");
    float *pa = cllm_model_params(a), *pb = cllm_model_params(b);
    double l32 = loss_of(b, tok, tgt), l16 = loss_of(a, tok, tgt);
    CHECK(l16 > 0 && l16 != l32 && fabs(l16 - l32) < 1e-2 * l32, "%s: bf16 %g vs fp32 %g", cllm_arch_name(arch), l16, l32);
    size_t n = cllm_model_buffer_len(a);
    for (size_t i = 0; i < n; i++) pa[i] *= 1.5f, pb[i] *= 1.5f;
    cllm_model_params_updated(a);
    double la = loss_of(a, tok, tgt);
    CHECK(cllm_model_set_precision(b, CLLM_PREC_BF16) == CLLM_OK, "%s", cllm_last_error());
    double lb = loss_of(b, tok, tgt);
    CHECK(la == lb && la != l16, "%s: refreshed %.9g vs fresh %.9g (before the change %.9g)", cllm_arch_name(arch), la,
          lb, l16);
    CHECK(cllm_model_set_precision(b, CLLM_PREC_FP32) == CLLM_OK, "%s", cllm_last_error());
    double lb32 = loss_of(b, tok, tgt);
    CHECK(cllm_model_set_precision(a, CLLM_PREC_FP16) == CLLM_OK && cllm_model_set_precision(a, CLLM_PREC_FP32) == CLLM_OK,
          "switch");
    CHECK(loss_of(a, tok, tgt) == lb32, "%s: back to fp32", cllm_arch_name(arch));
    CHECK(cllm_model_set_precision(a, CLLM_PREC_BF16) == CLLM_OK, "%s", cllm_last_error());
    CHECK(cllm_model_resize_vocab(&a, cllm_model_get_config(a)->vocab_size + 3, 0.0f, 1) == CLLM_OK, "%s",
          cllm_last_error());
    CHECK(cllm_model_precision(a) == CLLM_PREC_BF16, "resize dropped the precision");
done:
    cllm_model_free(a);
    cllm_model_free(b);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/cllm-test-model-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    for (int a = 0; a < CLLM_ARCH_COUNT; a++) test_roundtrip((cllm_arch)a);
    test_half_and_names(CLLM_BF16);
    test_half_and_names(CLLM_F16);
    test_config_errors();
    test_presets();
    for (int a = 0; a < CLLM_ARCH_COUNT; a++) test_precision_refresh((cllm_arch)a);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_summary();
}
