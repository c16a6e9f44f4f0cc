/*
 * Activation checkpointing at the C level: for tiny gpt2, llama (GQA) and
 * bloom models with 3 blocks, the loss and every gradient with
 * recomputation are bit-for-bit those without (two micro-batches
 * accumulated, so stale shared buffers would show); a forward-only pass
 * agrees too; the allocation equals cllm_model_activation_bytes and shrinks
 * by (n_layer - 1) block sets; cllm_memory_estimate shards per ZeRO stage.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cllm/memory.h"
#include "cllm/model.h"

enum { B = 2, T = 24, NL = 3 };

static cllm_model *make(cllm_arch arch) {
    static const char *const layer_key[] = {"n_layer", "num_hidden_layers", "n_layer"};
    json_t *cfg = NULL;
    cllm_model *m = NULL;
    if (cllm_model_preset(&cfg, arch, "tiny")) return NULL;
    json_object_set_new(cfg, layer_key[arch], json_integer(NL));
    cllm_model_init_random(&m, cfg, 11);
    json_decref(cfg);
    return m;
}

/* Two accumulated micro-batches; returns the gradients (caller frees). */
static float *run(cllm_model *m, bool recompute, const int32_t *tok, const int32_t *tgt, double *loss) {
    cllm_model_set_recompute(m, recompute);
    if (cllm_model_prepare(m, B, T, true)) return NULL;
    cllm_model_zero_grads(m);
    *loss = 0;
    for (int k = 0; k < 2; k++) {
        double s;
        long n;
        if (cllm_model_forward_backward(m, tok + k * B * T, tgt + k * B * T, B, T, true, 0.01f, &s, &n)) return NULL;
        *loss += s;
    }
    size_t len = cllm_model_buffer_len(m);
    float *g = malloc(len * sizeof *g);
    if (g) memcpy(g, cllm_model_grads(m), len * sizeof *g);
    return g;
}

static void test_arch(cllm_arch arch) {
    const char *name = cllm_arch_name(arch);
    cllm_model *m = make(arch);
    CHECK(m != NULL, "%s: init: %s", name, cllm_last_error());
    if (!m) return;
    const cllm_model_config *c = cllm_model_get_config(m);
    int32_t tok[2 * B * T], lab[2 * B * T], tgt[2 * B * T];
    for (int i = 0; i < 2 * B * T; i++) tok[i] = lab[i] = (int32_t)((i * 37 + 5) % c->vocab_size);
    for (int k = 0; k < 2 * B; k++) cllm_model_make_targets(tgt + k * T, lab + k * T, 1, T);
    double l0, l1;
    float *g0 = run(m, false, tok, tgt, &l0);
    size_t plain = cllm_model_activation_alloc(m);
    CHECK(!cllm_model_recomputes(m), "%s: plain run reports recomputation", name);
    float *g1 = run(m, true, tok, tgt, &l1);
    size_t ckpt = cllm_model_activation_alloc(m);
    CHECK(cllm_model_recomputes(m), "%s: recomputation not in effect after prepare", name);
    CHECK(g0 && g1, "%s: forward/backward: %s", name, cllm_last_error());
    if (g0 && g1) {
        CHECK(l0 == l1, "%s: loss %.9g with recomputation, %.9g without", name, l1, l0);
        CHECK(memcmp(g0, g1, cllm_model_buffer_len(m) * sizeof(float)) == 0, "%s: gradients differ", name);
    }
    double f0, f1;
    long n0, n1;
    cllm_model_set_recompute(m, false);
    CHECK(cllm_model_prepare(m, B, T, false) == CLLM_OK, "%s: prepare", name);
    cllm_model_forward_backward(m, tok, tgt, B, T, false, 0, &f0, &n0);
    cllm_model_set_recompute(m, true);
    CHECK(cllm_model_prepare(m, B, T, false) == CLLM_OK, "%s: prepare", name);
    cllm_model_forward_backward(m, tok, tgt, B, T, false, 0, &f1, &n1);
    CHECK(f0 == f1 && n0 == n1, "%s: forward-only loss differs with recomputation", name);

    cllm_act_bytes a0, a1;
    cllm_model_activation_bytes(c, B, T, true, false, &a0);
    cllm_model_activation_bytes(c, B, T, true, true, &a1);
    CHECK(a0.total == plain && a1.total == ckpt, "%s: allocated %zu/%zu, sized %zu/%zu", name, plain, ckpt, a0.total,
          a1.total);
    CHECK(a0.block_saved == NL * a0.block_set && a1.block_saved == a1.block_set, "%s: block parts", name);
    CHECK(plain - ckpt == (NL - 1) * a0.block_set, "%s: shrink %zu, expected %d sets of %zu", name, plain - ckpt,
          NL - 1, a0.block_set);

    cllm_mem_setup s = {.micro_batch = B, .grad_accum = 1, .seq_len = T, .optimizer = CLLM_OPT_ADAMW, .dp = 4};
    cllm_mem_estimate e[4];
    for (int z = 0; z < 4; z++) {
        s.zero_stage = z;
        CHECK(cllm_memory_estimate(c, &s, &e[z]) == CLLM_OK, "%s: estimate: %s", name, cllm_last_error());
    }
    size_t full = cllm_model_buffer_len(m) * sizeof(float), part = (cllm_model_buffer_len(m) + 3) / 4 * sizeof(float);
    CHECK(e[0].params == full && e[0].grads == full && e[0].optim == 2 * full, "%s: stage 0", name);
    CHECK(e[1].params == full && e[1].grads == full && e[1].optim == 2 * part, "%s: stage 1", name);
    CHECK(e[2].params == full && e[2].grads == part && e[2].optim == 2 * part, "%s: stage 2", name);
    CHECK(e[3].params == part && e[3].grads == part && e[3].optim == 2 * part, "%s: stage 3", name);
    CHECK(e[0].activations + e[0].logits == plain, "%s: estimate activations", name);
    /* MPI's reduction temporaries: half the all-reduced buffer at stages 0-1,
     * 1.5 x the largest group at 2-3, capped by the bucket; none on one rank */
    size_t g_first, g_last, g_block;
    CHECK(cllm_model_config_groups(c, &g_first, &g_last, &g_block) == CLLM_OK, "%s: groups", name);
    size_t g_max = g_first > g_last ? g_first : g_last;
    if (g_block > g_max) g_max = g_block;
    const size_t n_buf = cllm_model_buffer_len(m);
    CHECK(e[0].mpi_buffers == n_buf / 2 * sizeof(float) && e[1].mpi_buffers == e[0].mpi_buffers,
          "%s: all-reduce temporaries %zu", name, e[0].mpi_buffers);
    CHECK(e[2].mpi_buffers == 3 * g_max / 2 * sizeof(float) && e[3].mpi_buffers == e[2].mpi_buffers,
          "%s: reduce-scatter temporaries %zu (largest group %zu floats)", name, e[2].mpi_buffers, g_max);
    CHECK(e[3].total - e[3].mpi_buffers == e[3].params + e[3].grads + e[3].optim + e[3].work + e[3].activations +
                                               e[3].logits + e[3].other + e[3].precision + e[3].gemm_work,
          "%s: the temporaries are part of the total", name);
    cllm_mem_estimate eb;
    s.reduce_bucket = 1000;
    CHECK(cllm_memory_estimate(c, &s, &eb) == CLLM_OK && eb.mpi_buffers == 1500 * sizeof(float),
          "%s: a 1000-float bucket: %zu bytes", name, eb.mpi_buffers);
    s.dp = 1;
    s.reduce_bucket = 0;
    CHECK(cllm_memory_estimate(c, &s, &eb) == CLLM_OK && eb.mpi_buffers == 0, "%s: one rank: none", name);
    CHECK(e[0].n_params == cllm_model_n_params(m), "%s: estimate parameters", name);
    free(g0);
    free(g1);
    cllm_model_free(m);
}

static void test_suggest(void) {
    json_t *cfg = NULL;
    cllm_model_config c;
    CHECK(cllm_model_preset(&cfg, CLLM_ARCH_GPT2, "gpt2-124M") == CLLM_OK, "preset");
    CHECK(cllm_model_config_from_json(&c, cfg, "preset") == CLLM_OK, "config");
    json_decref(cfg);
    cllm_mem_setup s = {.micro_batch = 1, .grad_accum = 8, .seq_len = 1024, .optimizer = CLLM_OPT_ADAMW, .dp = 1},
                   best;
    cllm_mem_estimate e0, e1, eb;
    CHECK(cllm_memory_estimate(&c, &s, &e0) == CLLM_OK, "estimate");
    s.grad_ckpt = true;
    CHECK(cllm_memory_estimate(&c, &s, &e1) == CLLM_OK, "estimate");
    s.grad_ckpt = false;
    /* a budget between the two at micro-batch 1: checkpointing is the way */
    CHECK(cllm_memory_suggest(&c, &s, (e0.total + e1.total) / 2, &best, &eb), "suggest");
    CHECK(best.grad_ckpt && best.micro_batch == 1 && best.zero_stage == 0, "suggested ckpt %d mb %d zero %d",
          best.grad_ckpt, best.micro_batch, best.zero_stage);
    CHECK(!cllm_memory_suggest(&c, &s, 1000, &best, &eb), "1000 bytes cannot fit");
    /* from micro-batch 8, halving it (x1.05) is preferred over recomputation (x4/3) */
    s.micro_batch = 8;
    s.grad_accum = 1;
    CHECK(cllm_memory_estimate(&c, &s, &e0) == CLLM_OK, "estimate");
    CHECK(cllm_memory_suggest(&c, &s, e0.total - 1, &best, &eb), "suggest");
    CHECK(!best.grad_ckpt && best.micro_batch == 4 && best.grad_accum == 2, "suggested ckpt %d mb %d accum %d",
          best.grad_ckpt, best.micro_batch, best.grad_accum);
    s.zero_stage = 4;
    CHECK(cllm_memory_estimate(&c, &s, &e0) == CLLM_ERR_ARG, "stage 4 rejected");
}

int main(void) {
    test_arch(CLLM_ARCH_GPT2);
    test_arch(CLLM_ARCH_LLAMA);
    test_arch(CLLM_ARCH_BLOOM);
    test_suggest();
    return check_summary();
}
