/*
 * Weights apart from run state (cllm/weights.h): two runs over one
 * cllm_weights, each on its own thread, compute the same loss, logits and
 * (LoRA) gradients bit for bit as one model that owns the same weights,
 * the weights' bytes stay unchanged (checksum before and after), and the
 * runs add no copy of them (one parameter buffer, cllm_weights_bytes, the
 * process's resident memory). Weights loaded from a folder in int8 and q4
 * give a run the logits of a model loaded alike. Calls that would write
 * shared weights are refused, and the weights outlive their handle while
 * runs use them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/weights.h"

enum { B = 2, T = 9, PASSES = 3 };

/* What one pass computes: the loss sum, the last position's logits and,
 * with LoRA, the adapters' gradients. */
typedef struct {
    double loss[PASSES];
    float *logits; /* [PASSES][B][V] */
    float *grads;  /* [PASSES][trainable_len] or NULL */
} result;

typedef struct {
    cllm_model *m;
    bool lora;
    int seed;
    result r;
    cllm_status st;
    char err[256];
} job;

static void make_batch(int32_t *tok, int32_t *tgt, int V, int seed, int pass) {
    uint64_t x = 1234567u + 7919u * (uint64_t)seed + 104729u * (uint64_t)pass;
    int32_t lab[B * T];
    for (int i = 0; i < B * T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = lab[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    cllm_model_make_targets(tgt, lab, B, T);
}

static uint64_t checksum(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void *run_job(void *arg) {
    job *j = arg;
    cllm_model *m = j->m;
    const int V = cllm_model_get_config(m)->vocab_size;
    cllm_status st = CLLM_OK;
    if (j->lora) {
        cllm_lora_config lc;
        cllm_lora_config_default(&lc);
        st = cllm_lora_attach(m, &lc, 99);
        cllm_lora_config_free(&lc);
        if (!st) {
            /* B starts at zero: give it values so A's gradients are not all zero */
            float *tp = cllm_model_trainable_params(m);
            for (size_t i = 0; i < cllm_model_trainable_len(m); i++) tp[i] = 0.01f * (float)((int)(i % 13) - 6);
            cllm_model_params_updated(m);
        }
    }
    size_t glen = j->lora && !st ? cllm_model_trainable_len(m) : 0;
    j->r.logits = calloc((size_t)PASSES * B * V, sizeof(float));
    if (glen) j->r.grads = calloc((size_t)PASSES * glen, sizeof(float));
    if (!st) st = cllm_model_prepare(m, B, T, j->lora);
    for (int p = 0; p < PASSES && !st; p++) {
        int32_t tok[B * T], tgt[B * T];
        make_batch(tok, tgt, V, j->seed, p);
        long n = 0;
        if (j->lora) cllm_model_zero_grads(m);
        st = cllm_model_forward_backward(m, tok, tgt, B, T, j->lora, 1.0f, &j->r.loss[p], &n);
        if (!st && glen) memcpy(j->r.grads + (size_t)p * glen, cllm_model_grads(m), glen * sizeof(float));
        if (!st) st = cllm_model_forward_logits(m, tok, B, T, j->r.logits + (size_t)p * B * V);
    }
    j->st = st;
    if (st) snprintf(j->err, sizeof j->err, "%s", cllm_last_error());
    return NULL;
}

static void same(const char *name, const job *a, const job *b, int V) {
    CHECK(a->st == CLLM_OK && b->st == CLLM_OK, "%s: passes failed: %s | %s", name, a->err, b->err);
    if (a->st || b->st) return;
    CHECK(!memcmp(a->r.loss, b->r.loss, sizeof a->r.loss), "%s: losses differ (%.9g vs %.9g)", name, a->r.loss[0],
          b->r.loss[0]);
    CHECK(!memcmp(a->r.logits, b->r.logits, (size_t)PASSES * B * V * sizeof(float)), "%s: logits differ", name);
    if (a->r.grads) {
        size_t glen = cllm_model_trainable_len(a->m);
        CHECK(glen == cllm_model_trainable_len(b->m) &&
                  !memcmp(a->r.grads, b->r.grads, (size_t)PASSES * glen * sizeof(float)),
              "%s: adapter gradients differ", name);
        double s = 0;
        for (size_t i = 0; i < glen; i++) s += a->r.grads[i] * (double)a->r.grads[i];
        CHECK(s > 0, "%s: adapter gradients are all zero", name);
    }
}

static void free_result(result *r) {
    free(r->logits);
    free(r->grads);
}

/* The family's model twice from one seed: one owns its weights (the
 * reference), the other becomes the shared weights of two runs on two
 * threads; each run (and the reference) does the same passes. */
static void check_family(const char *name, cllm_arch arch, const char *extra, cllm_precision prec, bool lora) {
    cllm_model *ref = tiny_model(arch, extra, 5), *own = tiny_model(arch, extra, 5);
    CHECK(ref && own, "%s: models", name);
    if (!ref || !own) {
        cllm_model_free(ref);
        cllm_model_free(own);
        return;
    }
    CHECK(!cllm_model_set_precision(ref, prec) && !cllm_model_set_precision(own, prec), "%s: precision", name);
    const int V = cllm_model_get_config(ref)->vocab_size;
    const size_t np = cllm_model_buffer_len(own);
    cllm_weights *w = NULL;
    CHECK(cllm_weights_from_model(&w, &own) == CLLM_OK && own == NULL, "%s: weights: %s", name, cllm_last_error());
    if (!w) {
        cllm_model_free(ref);
        cllm_model_free(own);
        return;
    }
    const cllm_model *wm = cllm_weights_model(w);
    size_t lp = np * cllm_precision_copy_bytes(prec);
    CHECK(cllm_weights_bytes(w) == np * sizeof(float) + lp, "%s: weight bytes %zu, want %zu", name,
          cllm_weights_bytes(w), np * sizeof(float) + lp);
    float *wp = cllm_model_params((cllm_model *)(uintptr_t)wm); /* read only: for the checksum */
    uint64_t sum0 = checksum(wp, np * sizeof(float));

    job jr = {.m = ref, .lora = lora, .seed = 0}, jobs[2];
    run_job(&jr);
    for (int i = 0; i < 2; i++) {
        jobs[i] = (job){.lora = lora, .seed = 0};
        CHECK(cllm_model_from_weights(&jobs[i].m, w) == CLLM_OK, "%s: run %d: %s", name, i, cllm_last_error());
    }
    CHECK(cllm_weights_n_runs(w) == 2, "%s: %d runs", name, cllm_weights_n_runs(w));
    if (jobs[0].m && jobs[1].m) {
        CHECK(cllm_model_params(jobs[0].m) == wp && cllm_model_params(jobs[1].m) == wp,
              "%s: a run holds its own parameter buffer", name);
        CHECK(cllm_model_shared_weights(jobs[0].m) == w && !cllm_model_shared_weights(ref), "%s: shared_weights", name);
        /* the handle goes first: the runs keep the weights alive */
        cllm_weights_free(w);
        pthread_t th[2];
        int started = 0;
        for (int i = 0; i < 2; i++) started += pthread_create(&th[i], NULL, run_job, &jobs[i]) == 0;
        CHECK(started == 2, "%s: threads", name);
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        same(name, &jr, &jobs[0], V);
        same(name, &jr, &jobs[1], V);
        CHECK(checksum(wp, np * sizeof(float)) == sum0, "%s: the shared weights changed", name);
        CHECK(cllm_model_precision(jobs[0].m) == prec, "%s: precision of a run", name);
    } else {
        cllm_weights_free(w);
    }
    for (int i = 0; i < 2; i++) {
        free_result(&jobs[i].r);
        cllm_model_free(jobs[i].m);
    }
    free_result(&jr.r);
    cllm_model_free(ref);
}

/* Calls that would write shared weights are refused; extra tensors train. */
static void check_refusals(void) {
    cllm_model *own = tiny_model(CLLM_ARCH_GPT2, "{}", 3), *run = NULL;
    cllm_weights *w = NULL;
    CHECK(own && cllm_weights_from_model(&w, &own) == CLLM_OK, "refusals: weights");
    if (!w) {
        cllm_model_free(own);
        return;
    }
    CHECK(cllm_model_from_weights(&run, w) == CLLM_OK, "refusals: run");
    cllm_weights_free(w);
    if (!run) return;
    CHECK(cllm_model_prepare(run, 1, 4, true) == CLLM_ERR_UNSUPPORTED, "prepare(train) over shared weights accepted");
    CHECK(strstr(cllm_last_error(), "shared weights") != NULL, "message: %s", cllm_last_error());
    CHECK(cllm_model_set_precision(run, CLLM_PREC_BF16) == CLLM_ERR_UNSUPPORTED, "set_precision accepted");
    CHECK(cllm_model_set_weights(run, CLLM_WFMT_INT8) == CLLM_ERR_UNSUPPORTED, "set_weights accepted");
    cllm_trainable_spec copy = {.name = "h.0.attn.c_attn.bias", .base = 3};
    CHECK(cllm_model_set_trainable(run, &copy, 1) == CLLM_ERR_UNSUPPORTED, "a trained copy accepted");
    cllm_trainable_spec head = {.name = "new_head", .base = -1, .ndim = 2, .shape = {4, 8}};
    CHECK(cllm_model_set_trainable(run, &head, 1) == CLLM_OK, "an extra tensor refused: %s", cllm_last_error());
    CHECK(cllm_model_prepare(run, 1, 4, true) == CLLM_OK, "prepare(train) of extras refused: %s", cllm_last_error());
    cllm_model *again = run;
    CHECK(cllm_weights_from_model(&w, &again) == CLLM_ERR_ARG && again == run, "weights from a run accepted");
    cllm_model_free(run); /* the last reference: frees the weights (ASan checks) */
}

/* Weights loaded in a quantized format (int8, q4) from a folder: runs over
 * them give the logits of a model loaded the same way, and hold no copy. */
static void check_loaded(const char *fmt) {
    cllm_model *src = tiny_model(CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2}", 9), *own = NULL, *run = NULL;
    char dir[] = "/tmp/cllm-shared-XXXXXX";
    CHECK(src && mkdtemp(dir), "%s: model and folder", fmt);
    if (!src || cllm_model_save(src, dir, 0)) {
        cllm_model_free(src);
        return;
    }
    cllm_weights *w = NULL;
    CHECK(cllm_weights_load(&w, dir, fmt) == CLLM_OK, "%s: load: %s", fmt, cllm_last_error());
    CHECK(cllm_model_load_weights(&own, dir, fmt) == CLLM_OK, "%s: own load: %s", fmt, cllm_last_error());
    if (w && own) {
        CHECK(cllm_model_weights(cllm_weights_model(w)) == cllm_model_weights(own) &&
                  cllm_model_weights(own) != CLLM_WFMT_FP32, "%s: weight format", fmt);
        CHECK(cllm_weights_bytes(w) < cllm_model_buffer_len(own) * sizeof(float), "%s: %zu bytes of weights", fmt,
              cllm_weights_bytes(w));
        job a = {.m = own}, b = {.seed = 0};
        CHECK(cllm_model_from_weights(&b.m, w) == CLLM_OK, "%s: run", fmt);
        if (b.m) {
            run_job(&a);
            run_job(&b);
            same(fmt, &a, &b, cllm_model_get_config(own)->vocab_size);
            run = b.m;
        }
        free_result(&a.r);
        free_result(&b.r);
    }
    cllm_model_free(run);
    cllm_weights_free(w);
    cllm_model_free(own);
    cllm_model_free(src);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "%s: cleanup", fmt);
}

static size_t resident_bytes(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

/* Eight runs over ~13 MB of weights add less than one copy of them. */
static void check_memory(void) {
    cllm_model *own = tiny_model(CLLM_ARCH_LLAMA, "{\"hidden_size\": 256, \"intermediate_size\": 512, "
                                 "\"num_hidden_layers\": 4, \"vocab_size\": 2048}", 1);
    cllm_weights *w = NULL;
    CHECK(own && cllm_weights_from_model(&w, &own) == CLLM_OK, "memory: weights");
    if (!w) {
        cllm_model_free(own);
        return;
    }
    size_t wb = cllm_weights_bytes(w), before = resident_bytes();
    cllm_model *runs[8] = {0};
    for (int i = 0; i < 8; i++) CHECK(cllm_model_from_weights(&runs[i], w) == CLLM_OK, "memory: run %d", i);
    size_t after = resident_bytes();
    CHECK(wb > 10u << 20, "memory: weights of %zu bytes", wb);
    if (before && after)
        CHECK(after - before < wb / 4, "memory: 8 runs added %zu bytes over %zu bytes of weights", after - before, wb);
    for (int i = 0; i < 8; i++) cllm_model_free(runs[i]);
    cllm_weights_free(w);
}

int main(void) {
    const char *big = "{\"initializer_range\": 0.2}";
    check_family("gpt2 fp32", CLLM_ARCH_GPT2, big, CLLM_PREC_FP32, false);
    check_family("llama bf16", CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2, \"num_key_value_heads\": 2}",
                 CLLM_PREC_BF16, false);
    check_family("bloom fp16", CLLM_ARCH_BLOOM, big, CLLM_PREC_FP16, false);
    check_family("llama lora", CLLM_ARCH_LLAMA, big, CLLM_PREC_FP32, true);
    check_family("gpt2 bf16 lora", CLLM_ARCH_GPT2, big, CLLM_PREC_BF16, true);
    check_loaded("int8");
    check_loaded("q4");
    check_refusals();
    check_memory();
    return check_summary();
}
