/*
 * Generation tests: the KV-cache forward against the training forward for
 * every family (logits of each incrementally computed position equal the
 * last-position logits of a full forward over the same prefix), the cached
 * attention kernel against a naive float64 reference, the sampler against
 * independently computed distributions, and the streaming detokenizer on
 * characters split across tokens.
 * Usage: test_generate <fixtures/hf folder>
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "cllm/generate.h"
#include "cllm/kernels.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"


/* max |a-b| / max |b| */
static double max_rel(const float *a, const float *b, size_t n) {
    double d = 0, mb = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return d / mb;
}

/* Feeds B sequences of L random tokens: the first `first` tokens in one
 * call, the rest of the prompt (up to `prompt`) in a second call, then one
 * token per call; after every call the cache's logits must match the full
 * forward over the same prefix. */
static void check_cache(const char *name, cllm_arch arch, const char *extra, int B, int first, int prompt, int L) {
    cllm_model *m = tiny_model(arch, extra, 11);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    int V = cllm_model_get_config(m)->vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * B * L), *part = malloc(sizeof(int32_t) * B * L);
    float *ref = malloc(sizeof(float) * B * V), *got = malloc(sizeof(float) * B * V);
    uint64_t x = 12345;
    for (int i = 0; i < B * L; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    cllm_kv_cache *kv = NULL;
    CHECK(cllm_model_prepare(m, B, L, false) == CLLM_OK, "%s: prepare: %s", name, cllm_last_error());
    CHECK(cllm_kv_cache_init(&kv, m, B, L, prompt) == CLLM_OK, "%s: init: %s", name, cllm_last_error());
    double worst = 0;
    int calls = 0;
    for (int pos = 0; kv && pos < L;) {
        int n = pos == 0 ? first : pos < prompt ? prompt - pos : 1;
        for (int b = 0; b < B; b++) memcpy(part + b * n, tok + b * L + pos, sizeof(int32_t) * n);
        cllm_status st = cllm_kv_cache_forward(kv, part, n, got);
        CHECK(st == CLLM_OK, "%s: forward at %d: %s", name, pos, cllm_last_error());
        if (st) break;
        pos += n;
        /* full forward over rows [B, pos] */
        for (int b = 0; b < B; b++) memcpy(part + b * pos, tok + b * L, sizeof(int32_t) * pos);
        CHECK(cllm_model_forward_logits(m, part, B, pos, ref) == CLLM_OK, "%s: full forward", name);
        double e = max_rel(got, ref, (size_t)B * V);
        worst = fmax(worst, e);
        CHECK(e <= 1e-5, "%s: logits after %d positions differ by %.3g (relative)", name, pos, e);
        calls++;
    }
    CHECK(kv && cllm_kv_cache_pos(kv) == L, "%s: position %d after %d calls", name, kv ? cllm_kv_cache_pos(kv) : -1,
          calls);
    /* Rewinding and replaying the last token gives the same logits. */
    if (kv) {
        CHECK(cllm_kv_cache_rewind(kv, L - 1) == CLLM_OK, "%s: rewind", name);
        for (int b = 0; b < B; b++) part[b] = tok[b * L + L - 1];
        CHECK(cllm_kv_cache_forward(kv, part, 1, ref) == CLLM_OK && max_rel(ref, got, (size_t)B * V) == 0,
              "%s: replay after rewind differs", name);
        CHECK(cllm_kv_cache_rewind(kv, L + 1) == CLLM_ERR_ARG, "%s: rewind past the end", name);
    }
    printf("%-28s B=%d L=%2d  max relative logit error %.2e\n", name, B, L, worst);
    fflush(stdout);
    cllm_kv_cache_free(kv);
    free(tok);
    free(part);
    free(ref);
    free(got);
    cllm_model_free(m);
}

/* The bf16 cache: a model with bf16 weights gets one by default (an fp32
 * model does not); its logits, prompt and decode steps, stay within 2% of
 * the largest logit of the same model over a forced fp32 cache (measured
 * at most 0.7%: gpt2 0.47%, llama 0.69%, bloom 0.40%), and differ from them (the values really are rounded).
 * bf16_weights false: the same with fp32 weights over a cache forced to
 * bf16 (--kv-cache-dtype bf16; measured gpt2 0.37%, llama 0.71%, bloom 0.32%). */
static void check_bf16_cache(const char *name, cllm_arch arch, const char *extra, bool bf16_weights) {
    enum { L = 14, PROMPT = 6 };
    cllm_model *m = tiny_model(arch, extra, 13);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    const int V = cllm_model_get_config(m)->vocab_size;
    cllm_kv_cache *kv32 = NULL, *kv16 = NULL, *auto32 = NULL;
    cllm_kv_cache_params p = cllm_kv_cache_params_default();
    p.max_pos = L;
    CHECK(cllm_kv_cache_init_paged(&auto32, m, &p) == CLLM_OK && !cllm_kv_cache_is_bf16(auto32) &&
              cllm_kv_cache_value_bytes(m, CLLM_KV_AUTO) == 4,
          "%s: an fp32 model's cache is fp32", name);
    cllm_kv_cache_free(auto32);
    cllm_kv_dtype d = CLLM_KV_AUTO;
    CHECK(cllm_kv_cache_value_bytes(m, CLLM_KV_BF16) == 2 && cllm_kv_cache_value_bytes(m, CLLM_KV_FP32) == 4 &&
              cllm_kv_dtype_parse("bf16", &d) == CLLM_OK && d == CLLM_KV_BF16 &&
              cllm_kv_dtype_parse("fp32", &d) == CLLM_OK && d == CLLM_KV_FP32 &&
              cllm_kv_dtype_parse("auto", &d) == CLLM_OK && d == CLLM_KV_AUTO &&
              cllm_kv_dtype_parse("fp8", &d) == CLLM_ERR_ARG && strstr(cllm_last_error(), "'fp8'") &&
              !cllm_kv_dtype_name((cllm_kv_dtype)3) && !strcmp(cllm_kv_dtype_name(CLLM_KV_BF16), "bf16") &&
              cllm_kv_cache_dtype_for(m, CLLM_KV_AUTO) == CLLM_KV_FP32 &&
              cllm_kv_cache_dtype_for(m, CLLM_KV_BF16) == CLLM_KV_BF16,
          "%s: dtype bytes, names and parsing", name);
    /* a generation asking for a dtype that does not exist is refused */
    cllm_generate_params gbad = cllm_generate_params_default();
    gbad.kv_dtype = (cllm_kv_dtype)7;
    cllm_generation *gen = NULL;
    CHECK(cllm_generate_init(&gen, m, NULL, &gbad) == CLLM_ERR_ARG && !gen && strstr(cllm_last_error(), "kv_dtype 7"),
          "%s: generation with kv_dtype 7: %s", name, cllm_last_error());
    if (bf16_weights) {
        CHECK(cllm_model_set_weights(m, CLLM_WFMT_BF16) == CLLM_OK, "%s: bf16 weights: %s", name, cllm_last_error());
        CHECK(cllm_kv_cache_init_paged(&kv16, m, &p) == CLLM_OK && cllm_kv_cache_is_bf16(kv16) &&
                  cllm_kv_cache_value_bytes(m, CLLM_KV_AUTO) == 2,
              "%s: a bf16 model's cache is bf16 by default", name);
    } else {
        p.kv_dtype = CLLM_KV_BF16;
        CHECK(cllm_kv_cache_init_paged(&kv16, m, &p) == CLLM_OK && cllm_kv_cache_is_bf16(kv16),
              "%s: a bf16 cache forced over fp32 weights", name);
    }
    p.kv_dtype = CLLM_KV_FP32;
    CHECK(cllm_kv_cache_init_paged(&kv32, m, &p) == CLLM_OK && !cllm_kv_cache_is_bf16(kv32), "%s: forced fp32", name);
    p.kv_dtype = (cllm_kv_dtype)7;
    cllm_kv_cache *bad = NULL;
    CHECK(cllm_kv_cache_init_paged(&bad, m, &p) == CLLM_ERR_ARG && !bad, "%s: bad kv_dtype refused", name);
    int32_t tok[L];
    for (int i = 0; i < L; i++) tok[i] = (int32_t)((i * 7919 + 3) % V);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    double worst = 0;
    for (int pos = 0; kv16 && kv32 && a && b && pos < L;) {
        int n = pos == 0 ? PROMPT : 1;
        CHECK(cllm_kv_cache_forward(kv16, tok + pos, n, a) == CLLM_OK &&
                  cllm_kv_cache_forward(kv32, tok + pos, n, b) == CLLM_OK,
              "%s: forward at %d: %s", name, pos, cllm_last_error());
        worst = fmax(worst, max_rel(a, b, (size_t)V));
        pos += n;
    }
    CHECK(worst <= 0.02 && worst > 0, "%s: bf16 cache logits differ from the fp32 cache's by %.3g (relative)", name,
          worst);
    printf("%-28s %s weights, bf16 cache vs fp32 cache: max relative logit difference %.2e\n", name,
           bf16_weights ? "bf16" : "fp32", worst);
    free(a);
    free(b);
    cllm_kv_cache_free(kv16);
    cllm_kv_cache_free(kv32);
    cllm_model_free(m);
}

/* Ragged batches on a paged cache: three sequences at different positions,
 * adding different numbers of tokens per call (some sitting calls out),
 * one of them reset and restarted with another text mid-way, over a pool of
 * small blocks. After every call the logits of each sequence that added
 * tokens must equal the last-position logits of a full forward over that
 * sequence's own prefix, and the pool must account for every block. */
static void check_ragged(const char *name, cllm_arch arch, const char *extra) {
    enum { NSEQ = 3, L = 16, BS = 4, CALLS = 6 };
    cllm_model *m = tiny_model(arch, extra, 13);
    CHECK(m != NULL, "%s: model", name);
    if (!m) return;
    const int V = cllm_model_get_config(m)->vocab_size;
    /* tokens added per call; call 4 restarts sequence 1 */
    const int sched[CALLS][NSEQ] = {{5, 0, 2}, {1, 7, 3}, {1, 1, 0}, {1, 1, 1}, {2, 4, 1}, {0, 1, 1}};
    int32_t text[NSEQ + 1][L], call_tok[NSEQ * L];
    uint64_t x = 777;
    for (int i = 0; i < NSEQ + 1; i++)
        for (int t = 0; t < L; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            text[i][t] = (int32_t)((x >> 33) % (uint64_t)V);
        }
    float *got = malloc(sizeof(float) * NSEQ * V), *ref = malloc(sizeof(float) * V);
    cllm_kv_cache_params p = cllm_kv_cache_params_default();
    p.max_seqs = NSEQ;
    p.max_pos = L;
    p.max_rows = 12;
    p.block_size = BS;
    p.n_blocks = 8;
    cllm_kv_cache *kv = NULL;
    CHECK(cllm_model_prepare(m, 1, L, false) == CLLM_OK, "%s: prepare", name);
    CHECK(cllm_kv_cache_init_paged(&kv, m, &p) == CLLM_OK, "%s: init: %s", name, cllm_last_error());
    int pos[NSEQ] = {0}, which[NSEQ] = {0, 1, 2};
    double worst = 0;
    for (int c = 0; kv && c < CALLS; c++) {
        if (c == 4) { /* sequence 1 finishes; its slot starts another text */
            CHECK(cllm_kv_cache_seq_rewind(kv, 1, 0) == CLLM_OK, "%s: reset", name);
            pos[1] = 0;
            which[1] = 3;
        }
        int n = 0;
        for (int i = 0; i < NSEQ; i++)
            for (int t = 0; t < sched[c][i]; t++) call_tok[n++] = text[which[i]][pos[i] + t];
        for (int i = 0; i < NSEQ * V; i++) got[i] = NAN;
        cllm_status st = cllm_kv_cache_forward_ragged(kv, call_tok, sched[c], got);
        CHECK(st == CLLM_OK, "%s: call %d: %s", name, c, cllm_last_error());
        if (st) break;
        int used = 0;
        for (int i = 0; i < NSEQ; i++) {
            pos[i] += sched[c][i];
            used += (pos[i] + BS - 1) / BS;
            CHECK(cllm_kv_cache_seq_pos(kv, i) == pos[i], "%s: call %d: sequence %d at %d, expected %d", name, c, i,
                  cllm_kv_cache_seq_pos(kv, i), pos[i]);
            if (!sched[c][i]) {
                CHECK(isnan(got[(size_t)i * V]), "%s: call %d: logits of idle sequence %d written", name, c, i);
                continue;
            }
            CHECK(cllm_model_forward_logits(m, text[which[i]], 1, pos[i], ref) == CLLM_OK, "%s: full forward", name);
            double e = max_rel(got + (size_t)i * V, ref, (size_t)V);
            worst = fmax(worst, e);
            CHECK(e <= 1e-5, "%s: call %d: sequence %d (%d positions) differs by %.3g", name, c, i, pos[i], e);
        }
        CHECK(cllm_kv_cache_blocks_free(kv) == p.n_blocks - used, "%s: call %d: %d blocks free, expected %d", name, c,
              cllm_kv_cache_blocks_free(kv), p.n_blocks - used);
    }
    /* the pool is nearly full: a call needing more blocks than are free
     * fails with a message and changes nothing */
    if (kv) {
        int before[NSEQ], free_before = cllm_kv_cache_blocks_free(kv), add[NSEQ] = {0, 0, 8};
        for (int i = 0; i < NSEQ; i++) before[i] = cllm_kv_cache_seq_pos(kv, i);
        for (int t = 0; t < 8; t++) call_tok[t] = 1;
        CHECK(cllm_kv_cache_forward_ragged(kv, call_tok, add, got) == CLLM_ERR_NOMEM &&
                  strstr(cllm_last_error(), "blocks"),
              "%s: pool exhausted: %s", name, cllm_last_error());
        CHECK(cllm_kv_cache_blocks_free(kv) == free_before, "%s: failed call kept blocks", name);
        for (int i = 0; i < NSEQ; i++) CHECK(cllm_kv_cache_seq_pos(kv, i) == before[i], "%s: failed call moved", name);
        int bad[NSEQ] = {1, -1, 0};
        CHECK(cllm_kv_cache_forward_ragged(kv, call_tok, bad, got) == CLLM_ERR_ARG, "%s: negative count", name);
        int one[NSEQ] = {0, 1, 0};
        call_tok[0] = V;
        CHECK(cllm_kv_cache_forward_ragged(kv, call_tok, one, got) == CLLM_ERR_ARG &&
                  strstr(cllm_last_error(), "sequence 1"),
              "%s: bad id names its sequence: %s", name, cllm_last_error());
        CHECK(cllm_kv_cache_seq_rewind(kv, 3, 0) == CLLM_ERR_ARG, "%s: no sequence 3", name);
        for (int i = 0; i < NSEQ; i++) CHECK(cllm_kv_cache_seq_rewind(kv, i, 0) == CLLM_OK, "%s: reset %d", name, i);
        CHECK(cllm_kv_cache_blocks_free(kv) == p.n_blocks, "%s: all blocks back after resets", name);
    }
    printf("%-28s ragged/paged  max relative logit error %.2e\n", name, worst);
    fflush(stdout);
    cllm_kv_cache_free(kv);
    free(got);
    free(ref);
    cllm_model_free(m);
}

static void test_cache_errors(void) {
    cllm_model *m = tiny_model(CLLM_ARCH_GPT2, "{\"n_positions\": 16}", 3);
    CHECK(m != NULL, "gpt2 model");
    if (!m) return;
    cllm_kv_cache *kv = NULL;
    CHECK(cllm_kv_cache_init(&kv, m, 1, 17, 0) == CLLM_ERR_ARG && strstr(cllm_last_error(), "16") && !kv,
          "cache beyond n_positions: %s", cllm_last_error());
    CHECK(cllm_kv_cache_init(&kv, m, 1, 0, 4) == CLLM_OK && cllm_kv_cache_capacity(kv) == 16, "default capacity");
    int32_t ids[16] = {0};
    float *logits = malloc(sizeof(float) * 2 * 512); /* [B = 2, V] for the bloom cache below */
    CHECK(cllm_kv_cache_forward(kv, ids, 5, logits) == CLLM_ERR_ARG, "chunk larger than max_chunk");
    CHECK(cllm_kv_cache_forward(kv, ids, 0, logits) == CLLM_ERR_ARG, "empty chunk");
    ids[2] = 512;
    CHECK(cllm_kv_cache_forward(kv, ids, 3, logits) == CLLM_ERR_ARG && strstr(cllm_last_error(), "512"),
          "id outside the vocabulary: %s", cllm_last_error());
    ids[2] = -1;
    CHECK(cllm_kv_cache_forward(kv, ids, 3, logits) == CLLM_ERR_ARG, "negative id");
    CHECK(cllm_kv_cache_pos(kv) == 0, "failed calls do not advance");
    ids[2] = 0;
    for (int i = 0; i < 4; i++) CHECK(cllm_kv_cache_forward(kv, ids, 4, logits) == CLLM_OK, "fill %d", i);
    CHECK(cllm_kv_cache_forward(kv, ids, 1, logits) == CLLM_ERR_ARG && strstr(cllm_last_error(), "16") &&
              strstr(cllm_last_error(), "n_positions"),
          "beyond the model limit: %s", cllm_last_error());
    cllm_kv_cache_free(kv);
    kv = NULL;
    /* BLOOM has no limit: a cache can be sized freely, and its own size is
     * the limit then. */
    cllm_model *bl = tiny_model(CLLM_ARCH_BLOOM, "{}", 3);
    CHECK(bl && cllm_kv_cache_init(&kv, bl, 2, 3, 0) == CLLM_OK, "bloom cache");
    if (kv) {
        CHECK(cllm_kv_cache_forward(kv, ids, 3, logits) == CLLM_OK, "bloom fill");
        CHECK(cllm_kv_cache_forward(kv, ids, 1, logits) == CLLM_ERR_ARG && strstr(cllm_last_error(), "cache"),
              "beyond the cache: %s", cllm_last_error());
    }
    cllm_kv_cache_free(kv);
    cllm_kv_cache_free(NULL);
    cllm_model_free(bl);
    free(logits);
    cllm_model_free(m);
}

/* cllm_attention_forward_paged against a float64 loop over each sequence's
 * keys in logical order: three sequences at different positions adding
 * different numbers of rows (ragged), their positions scattered over a
 * pool of blocks in shuffled order, with block sizes that do and do not
 * divide the lengths, including one block holding a whole sequence (the
 * contiguous layout); with and without ALiBi and a sliding window. Two
 * shapes: head size 12 (the plain loops) and 64 with prompts of up to 40
 * rows (on AVX-512 the tiles of 8 rows and 16-key groups, crossing block
 * and group edges). */
static void attention_case(int NH, int NKV, int HS, const int past[3], const int n_new[3]) {
    enum { NSEQ = 3 };
    int32_t rows[NSEQ + 1] = {0}, pastv[NSEQ];
    int SMAX = 0;
    for (int i = 0; i < NSEQ; i++) {
        rows[i + 1] = rows[i] + n_new[i], pastv[i] = past[i];
        if (past[i] + n_new[i] > SMAX) SMAX = past[i] + n_new[i];
    }
    /* blocks of up to BMAX positions (the largest of block_sizes below) */
    const int N = rows[NSEQ], NBLK = NSEQ * SMAX, BMAX = SMAX > 16 ? SMAX : 16;
    const size_t kvn = (size_t)NSEQ * NKV * SMAX * HS, pooln = (size_t)NBLK * NKV * BMAX * HS;
    float *q = malloc((size_t)N * NH * HS * 4), *out = malloc((size_t)N * NH * HS * 4), *keys = malloc(kvn * 4),
          *vals = malloc(kvn * 4), *kpool = malloc(pooln * 4), *vpool = malloc(pooln * 4), *slopes = malloc((size_t)NH * 4);
    uint16_t *kpool16 = malloc(pooln * 2), *vpool16 = malloc(pooln * 2);
    int32_t *table = malloc((size_t)NSEQ * SMAX * 4);
    int *perm = malloc((size_t)NBLK * sizeof *perm);
    double *sc = malloc((size_t)SMAX * sizeof *sc);
    CHECK(q && out && keys && vals && kpool && vpool && slopes && kpool16 && vpool16 && table && perm && sc, "alloc");
    if (!(q && out && keys && vals && kpool && vpool && slopes && kpool16 && vpool16 && table && perm && sc)) goto done;
#define KEY(i, g, t) (keys + ((((size_t)(i) * NKV + (g)) * SMAX + (t)) * HS))
#define VAL(i, g, t) (vals + ((((size_t)(i) * NKV + (g)) * SMAX + (t)) * HS))
    cllm_rng r;
    cllm_rng_seed(&r, 5);
    for (int i = 0; i < N * NH * HS; i++) q[i] = cllm_rng_normal(&r);
    for (size_t i = 0; i < kvn; i++) { /* values bf16 holds exactly, so both pools hold the same */
        keys[i] = cllm_bf16_to_f32(cllm_f32_to_bf16(cllm_rng_normal(&r)));
        vals[i] = cllm_bf16_to_f32(cllm_f32_to_bf16(cllm_rng_normal(&r)));
    }
    cllm_alibi_slopes(slopes, NH);
    const float scale = 1.0f / sqrtf((float)HS);
    const int block_sizes[] = {4, 3, 16, SMAX}; /* 16: whole 16-key groups per block, as every cllm cache */
    for (size_t bsi = 0; bsi < sizeof block_sizes / sizeof *block_sizes; bsi++) {
        const int BS = block_sizes[bsi], MB = (SMAX + BS - 1) / BS;
        /* block ids handed out in a shuffled order */
        for (int i = 0; i < NBLK; i++) perm[i] = i;
        for (int i = NBLK - 1; i > 0; i--) {
            int j = (int)(cllm_rng_u64(&r) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        int used = 0;
        for (int i = 0; i < NSEQ; i++)
            for (int b = 0; b < MB; b++) table[i * MB + b] = b * BS < past[i] + n_new[i] ? perm[used++] : -1;
        CHECK(used <= NBLK, "test pool too small");
        for (int i = 0; i < NSEQ; i++)
            for (int pos = 0; pos < past[i] + n_new[i]; pos++)
                for (int g = 0; g < NKV; g++) {
                    size_t at = (((size_t)table[i * MB + pos / BS] * NKV + g) * BS + (size_t)(pos % BS)) * HS;
                    memcpy(kpool + at, KEY(i, g, pos), sizeof(float) * HS);
                    memcpy(vpool + at, VAL(i, g, pos), sizeof(float) * HS);
                    for (int d = 0; d < HS; d++)
                        kpool16[at + d] = cllm_f32_to_bf16(KEY(i, g, pos)[d]),
                        vpool16[at + d] = cllm_f32_to_bf16(VAL(i, g, pos)[d]);
                }
        for (int run = 0; run < 8; run++) {
            const int use_alibi = run & 1, bf16 = (run >> 1) & 1, window = run & 4 ? 7 : 0;
            memset(out, 0, (size_t)N * NH * HS * 4);
            if (bf16)
                cllm_attention_forward_paged_bf16((cllm_view){out, NH * HS, HS}, (cllm_cview){q, NH * HS, HS}, kpool16,
                                                  vpool16, table, MB, BS, rows, pastv, use_alibi ? slopes : NULL, NSEQ,
                                                  NH, NKV, HS, scale, window);
            else
                cllm_attention_forward_paged_window((cllm_view){out, NH * HS, HS}, (cllm_cview){q, NH * HS, HS}, kpool,
                                                    vpool, table, MB, BS, rows, pastv, use_alibi ? slopes : NULL, NSEQ,
                                                    NH, NKV, HS, scale, window);
            double worst = 0;
            for (int i = 0; i < NSEQ; i++)
                for (int t = 0; t < n_new[i]; t++)
                    for (int h = 0; h < NH; h++) {
                        int g = h / (NH / NKV), p = past[i] + t, row = rows[i] + t;
                        int first = window && p - window + 1 > 0 ? p - window + 1 : 0;
                        const float *qr = q + ((size_t)row * NH + h) * HS;
                        double mx = -INFINITY, sum = 0;
                        for (int s2 = first; s2 <= p; s2++) {
                            double d = 0;
                            for (int k = 0; k < HS; k++) d += (double)qr[k] * KEY(i, g, s2)[k];
                            sc[s2] = d * scale + (use_alibi ? (double)slopes[h] * (s2 - p) : 0);
                            mx = fmax(mx, sc[s2]);
                        }
                        for (int s2 = first; s2 <= p; s2++) sum += sc[s2] = exp(sc[s2] - mx);
                        for (int k = 0; k < HS; k++) {
                            double o = 0;
                            for (int s2 = first; s2 <= p; s2++) o += sc[s2] / sum * VAL(i, g, s2)[k];
                            worst = fmax(worst, fabs(o - out[((size_t)row * NH + h) * HS + k]));
                        }
                    }
            CHECK(worst < 1e-5, "paged attention (head size %d, %s cache, block %d, alibi %d, window %d) differs "
                  "from the float64 reference by %g", HS, bf16 ? "bf16" : "fp32", BS, use_alibi, window, worst);
        }
    }
#undef KEY
#undef VAL
done:
    free(q), free(out), free(keys), free(vals), free(kpool), free(vpool), free(slopes), free(kpool16), free(vpool16);
    free(table), free(perm), free(sc);
}

/* A row's output does not depend on the rows beside it: each row of a
 * 40-row prompt equals the same row computed alone (one row of one
 * sequence, its keys already cached), bit for bit. */
static void attention_rows_alone(void) {
    enum { NH = 6, NKV = 2, HS = 64, T = 40, BS = 16, MB = (T + BS - 1) / BS };
    static float q[T * NH * HS], out[T * NH * HS], one[NH * HS], kpool[MB * NKV * BS * HS], vpool[MB * NKV * BS * HS];
    int32_t table[MB];
    cllm_rng r;
    cllm_rng_seed(&r, 9);
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = cllm_rng_normal(&r);
    for (size_t i = 0; i < sizeof kpool / sizeof *kpool; i++) kpool[i] = cllm_rng_normal(&r), vpool[i] = cllm_rng_normal(&r);
    for (int b = 0; b < MB; b++) table[b] = MB - 1 - b;
    const int32_t rows[2] = {0, T}, past[1] = {0};
    cllm_attention_forward_paged_window((cllm_view){out, NH * HS, HS}, (cllm_cview){q, NH * HS, HS}, kpool, vpool, table,
                                        MB, BS, rows, past, NULL, 1, NH, NKV, HS, 0.125f, 0);
    int bad = -1;
    for (int t = 0; t < T && bad < 0; t++) {
        const int32_t rows1[2] = {0, 1}, past1[1] = {t};
        cllm_attention_forward_paged_window((cllm_view){one, NH * HS, HS}, (cllm_cview){q + (size_t)t * NH * HS, NH * HS, HS},
                                            kpool, vpool, table, MB, BS, rows1, past1, NULL, 1, NH, NKV, HS, 0.125f, 0);
        if (memcmp(one, out + (size_t)t * NH * HS, sizeof one)) bad = t;
    }
    CHECK(bad < 0, "paged attention: row %d of a prompt differs from the same row alone", bad);
}

static void test_attention_kernel(void) {
    attention_case(6, 2, 12, (const int[3]){5, 0, 9}, (const int[3]){3, 1, 2});
    attention_case(4, 2, 64, (const int[3]){20, 0, 3}, (const int[3]){11, 40, 1});
    /* head groups of 3 (llama-100M's) and of 9, more than one AVX-512 tile holds */
    attention_case(6, 2, 64, (const int[3]){37, 0, 5}, (const int[3]){1, 21, 1});
    attention_case(9, 1, 16, (const int[3]){16, 2, 0}, (const int[3]){1, 3, 17});
    attention_rows_alone();
}

/* ---------------------------------------------------------------- sampling */

static void softmax_d(double *p, const double *l, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < n; i++) s += p[i] = isinf(l[i]) ? 0 : exp(l[i] - mx);
    for (int i = 0; i < n; i++) p[i] /= s;
}

static void expect_probs(const char *what, cllm_sample_params sp, const float *logits, int V, const int32_t *hist,
                         size_t nh, const double *want) {
    cllm_sampler *s = NULL;
    float got[16];
    CHECK(cllm_sampler_init(&s, V, sp, 1) == CLLM_OK, "%s: init: %s", what, cllm_last_error());
    if (!s) return;
    CHECK(cllm_sampler_probs(s, got, logits, hist, nh) == CLLM_OK, "%s: probs", what);
    for (int i = 0; i < V; i++)
        CHECK(fabs(got[i] - want[i]) < 1e-6, "%s: p[%d] = %.7f, expected %.7f", what, i, got[i], want[i]);
    cllm_sampler_free(s);
}

static void test_sampler_probs(void) {
    const float l6[6] = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 2.0f};
    double ld[6], want[6];
    cllm_sample_params sp = cllm_sample_params_default();
    for (int i = 0; i < 6; i++) ld[i] = l6[i];
    softmax_d(want, ld, 6);
    expect_probs("plain softmax", sp, l6, 6, NULL, 0, want);

    sp.temperature = 0.5f;
    for (int i = 0; i < 6; i++) ld[i] = l6[i] / 0.5;
    softmax_d(want, ld, 6);
    expect_probs("temperature 0.5", sp, l6, 6, NULL, 0, want);

    /* top-k 3: the third largest is 2.0, and both 2.0s stay (ties kept). */
    sp = cllm_sample_params_default();
    sp.top_k = 3;
    for (int i = 0; i < 6; i++) ld[i] = l6[i] >= 2.0f ? l6[i] : -INFINITY;
    softmax_d(want, ld, 6);
    expect_probs("top-k 3 with ties", sp, l6, 6, NULL, 0, want);
    sp.top_k = 1;
    for (int i = 0; i < 6; i++) ld[i] = l6[i] >= 3.0f ? l6[i] : -INFINITY;
    softmax_d(want, ld, 6);
    expect_probs("top-k 1 with a tie", sp, l6, 6, NULL, 0, want);

    /* top-p over probabilities 0.5, 0.3, 0.15, 0.05 (ids shuffled). */
    const double pr[4] = {0.15, 0.5, 0.05, 0.3};
    float lp[4];
    for (int i = 0; i < 4; i++) lp[i] = (float)log(pr[i]);
    const struct {
        float p;
        double want[4];
    } cases[] = {
        {0.75f, {0, 0.5 / 0.8, 0, 0.3 / 0.8}},
        {0.85f, {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95}},
        {0.1f, {0, 1, 0, 0}},
        {0.5f, {0, 1, 0, 0}},
        {0.99f, {0.15, 0.5, 0.05, 0.3}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char what[32];
        snprintf(what, sizeof what, "top-p %.2f", (double)cases[c].p);
        sp = cllm_sample_params_default();
        sp.top_p = cases[c].p;
        expect_probs(what, sp, lp, 4, NULL, 0, cases[c].want);
    }

    /* Repetition penalty 2: seen positive logits halve, negative double,
     * each distinct id once however often it was seen. */
    const float lr[4] = {2.0f, -1.0f, 0.5f, 1.5f};
    const int32_t hist[3] = {0, 1, 1};
    sp = cllm_sample_params_default();
    sp.repetition_penalty = 2.0f;
    double lrd[4] = {1.0, -2.0, 0.5, 1.5};
    softmax_d(want, lrd, 4);
    expect_probs("repetition penalty", sp, lr, 4, hist, 3, want);
    sp.greedy = true;
    const double onehot[4] = {0, 0, 0, 1};
    expect_probs("greedy after the penalty", sp, lr, 4, hist, 3, onehot);
    sp = cllm_sample_params_default();
    sp.temperature = 0.0f;
    const double first[6] = {0, 1, 0, 0, 0, 0};
    expect_probs("temperature 0 = greedy, lowest id on ties", sp, l6, 6, NULL, 0, first);
}

/* Empirical frequencies of many draws against the distribution computed
 * here from scratch: temperature 0.7, then top-k 4, then top-p 0.8. */
static void test_sampler_draws(void) {
    enum { V = 8, DRAWS = 100000 };
    const float l[V] = {0.2f, 1.5f, -0.3f, 1.1f, 0.9f, 2.0f, 0.0f, 1.4f};
    double t[V], p[V];
    for (int i = 0; i < V; i++) t[i] = l[i] / (double)0.7f;
    /* top-4 keeps ids 5 (2.0), 1 (1.5), 7 (1.4), 3 (1.1) */
    for (int i = 0; i < V; i++)
        if (i != 5 && i != 1 && i != 7 && i != 3) t[i] = -INFINITY;
    softmax_d(p, t, V);
    /* top-p 0.8 in descending order 5, 1, 7, 3 (p = .457 .224 .194 .126) */
    const int ord[4] = {5, 1, 7, 3};
    double cum = 0;
    int keep = 0;
    while (keep < 4) {
        cum += p[ord[keep++]];
        if (cum >= (double)0.8f) break;
    }
    for (int i = keep; i < 4; i++) p[ord[i]] = 0;
    for (int i = 0; i < V; i++) p[i] /= cum;
    CHECK(keep == 3, "test setup: top-p should keep 3 tokens, keeps %d", keep);

    cllm_sample_params sp = {.greedy = false, .temperature = 0.7f, .top_k = 4, .top_p = 0.8f,
                             .repetition_penalty = 1.0f};
    cllm_sampler *s = NULL, *s2 = NULL, *s3 = NULL;
    CHECK(cllm_sampler_init(&s, V, sp, 42) == CLLM_OK, "init");
    CHECK(cllm_sampler_init(&s2, V, sp, 42) == CLLM_OK, "init");
    CHECK(cllm_sampler_init(&s3, V, sp, 43) == CLLM_OK, "init");
    if (!s || !s2 || !s3) return;
    long count[V] = {0};
    int same = 1, differ = 0;
    for (int i = 0; i < DRAWS; i++) {
        int32_t a = -1, b = -1, c = -1;
        cllm_sampler_sample(s, &a, l, NULL, 0);
        if (i < 1000) {
            cllm_sampler_sample(s2, &b, l, NULL, 0);
            cllm_sampler_sample(s3, &c, l, NULL, 0);
            same &= a == b;
            differ |= a != c;
        }
        if (a >= 0 && a < V) count[a]++;
    }
    CHECK(same, "same seed, same draws");
    CHECK(differ, "different seeds, different draws");
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / DRAWS;
        /* 0.01 is more than 6 standard errors at 1e5 draws */
        CHECK(fabs(f - p[i]) < 0.01, "token %d drawn with frequency %.4f, expected %.4f", i, f, p[i]);
        if (p[i] == 0) CHECK(count[i] == 0, "removed token %d was drawn %ld times", i, count[i]);
    }
    cllm_sampler_free(s);
    cllm_sampler_free(s2);
    cllm_sampler_free(s3);

    /* greedy is deterministic and draws nothing */
    cllm_sample_params g = cllm_sample_params_default();
    g.greedy = true;
    CHECK(cllm_sampler_init(&s, V, g, 1) == CLLM_OK, "greedy init");
    for (int i = 0; s && i < 10; i++) {
        int32_t a = -1;
        CHECK(cllm_sampler_sample(s, &a, l, NULL, 0) == CLLM_OK && a == 5, "greedy picks 5, got %d", a);
    }
    const int32_t bad[1] = {V};
    int32_t a;
    CHECK(s && cllm_sampler_sample(s, &a, l, bad, 1) == CLLM_ERR_ARG, "history id outside the vocabulary");
    cllm_sampler_free(s);
    cllm_sampler_free(NULL);

#define SP(t, k, p, r) {.greedy = false, .temperature = t, .top_k = k, .top_p = p, .repetition_penalty = r}
    const cllm_sample_params invalid[] = {
        SP(-1.0f, 0, 1.0f, 1.0f), SP(1.0f, -2, 1.0f, 1.0f), SP(1.0f, 0, 0.0f, 1.0f),
        SP(1.0f, 0, 1.5f, 1.0f),  SP(1.0f, 0, 1.0f, 0.0f),  SP(NAN, 0, 1.0f, 1.0f),
    };
#undef SP
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        s = NULL;
        CHECK(cllm_sampler_init(&s, V, invalid[i], 1) == CLLM_ERR_ARG && !s, "invalid params %zu accepted", i);
    }
}

/* ------------------------------------------------------------- streaming */

static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int need = u[i] < 0x80 ? 0 : (u[i] >> 5) == 6 ? 1 : (u[i] >> 4) == 14 ? 2 : (u[i] >> 3) == 30 ? 3 : -1;
        if (need < 0 || i + (size_t)need >= n) return false;
        for (int k = 1; k <= need; k++)
            if ((u[i + k] & 0xC0) != 0x80) return false;
        i += (size_t)need + 1;
    }
    return true;
}

static void check_stream(const char *dir, const char *context, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    cllm_tokenizer *tok = NULL;
    if (cllm_tokenizer_load(&tok, path)) {
        CHECK(0, "load %s: %s", path, cllm_last_error());
        return;
    }
    cllm_token_buf ctx = {0}, gen = {0};
    cllm_tokenizer_encode(tok, context, strlen(context), false, &ctx);
    /* the continuation as the model would produce it: the ids of
     * context+text after the context's */
    char both[512];
    snprintf(both, sizeof both, "%s%s", context, text);
    cllm_tokenizer_encode(tok, both, strlen(both), false, &gen);
    CHECK(gen.n > ctx.n && memcmp(gen.ids, ctx.ids, ctx.n * sizeof(int32_t)) == 0, "%s: context is a prefix", dir);
    cllm_text_stream *ts = NULL;
    CHECK(cllm_text_stream_init(&ts, tok, ctx.ids, ctx.n) == CLLM_OK, "stream init");
    char out[1024];
    size_t olen = 0;
    int held = 0;
    for (size_t i = ctx.n; ts && i < gen.n; i++) {
        const char *s;
        size_t n;
        CHECK(cllm_text_stream_push(ts, gen.ids[i], &s, &n) == CLLM_OK, "push");
        CHECK(valid_utf8(s, n), "%s: chunk %zu is not whole UTF-8 characters", dir, i);
        held += n == 0;
        if (olen + n < sizeof out) memcpy(out + olen, s, n), olen += n;
    }
    const char *s = "";
    size_t n = 0;
    CHECK(ts && cllm_text_stream_finish(ts, &s, &n) == CLLM_OK && n == 0, "%s: nothing left at the end", dir);
    CHECK(olen == strlen(text) && memcmp(out, text, olen) == 0, "%s: streamed '%.*s', expected '%s'", dir, (int)olen,
          out, text);
    CHECK(held > 0, "%s: no token was held back (the test text should split a character)", dir);
    /* an id the tokenizer does not know */
    CHECK(ts && cllm_text_stream_push(ts, 1 << 30, &s, &n) == CLLM_ERR_ARG, "bad id");
    cllm_text_stream_free(ts);
    cllm_token_buf_free(&ctx);
    cllm_token_buf_free(&gen);
    cllm_tokenizer_free(tok);
}

static void test_stream_partial_end(const char *dir) {
    cllm_tokenizer *tok = NULL;
    if (cllm_tokenizer_load(&tok, dir)) return;
    cllm_token_buf ids = {0};
    const char *emoji = "\xF0\x9F\x99\x82"; /* U+1F642, more than one byte-level token */
    cllm_tokenizer_encode(tok, emoji, 4, false, &ids);
    cllm_text_stream *ts = NULL;
    cllm_text_stream_init(&ts, tok, NULL, 0);
    const char *s;
    size_t n = 0;
    CHECK(ids.n >= 2, "emoji splits into %zu tokens", ids.n);
    if (ts && ids.n >= 2) {
        cllm_text_stream_push(ts, ids.ids[0], &s, &n);
        CHECK(n == 0, "first fragment held back");
        CHECK(cllm_text_stream_finish(ts, &s, &n) == CLLM_OK && n == 3 && memcmp(s, "\xEF\xBF\xBD", 3) == 0,
              "unfinished character flushed as U+FFFD (%zu bytes)", n);
    }
    cllm_text_stream_free(ts);
    cllm_token_buf_free(&ids);
    cllm_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    check_cache("gpt2", CLLM_ARCH_GPT2, "{\"initializer_range\": 0.2}", 2, 3, 5, 12);
    check_cache("gpt2 B=1 single prefill", CLLM_ARCH_GPT2, "{\"initializer_range\": 0.2}", 1, 4, 4, 9);
    check_cache("llama GQA 4/2", CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2}", 2, 3, 5, 12);
    check_cache("llama MQA 6/1 hs 12 bias", CLLM_ARCH_LLAMA,
                "{\"initializer_range\": 0.2, \"hidden_size\": 72, \"num_attention_heads\": 6, "
                "\"num_key_value_heads\": 1, \"attention_bias\": true, \"rope_theta\": 500.0}",
                1, 2, 6, 11);
    check_cache("bloom", CLLM_ARCH_BLOOM, "{\"initializer_range\": 0.2}", 2, 3, 5, 12);
    check_cache("bloom 6 heads (ALiBi non-pow2)", CLLM_ARCH_BLOOM,
                "{\"initializer_range\": 0.2, \"hidden_size\": 48, \"n_head\": 6}", 2, 1, 4, 10);
    check_ragged("gpt2", CLLM_ARCH_GPT2, "{\"initializer_range\": 0.2}");
    check_ragged("llama GQA 4/2", CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2}");
    check_ragged("bloom", CLLM_ARCH_BLOOM, "{\"initializer_range\": 0.2}");
    test_cache_errors();
    check_bf16_cache("gpt2", CLLM_ARCH_GPT2, "{\"initializer_range\": 0.2}", true);
    check_bf16_cache("gpt2", CLLM_ARCH_GPT2, "{\"initializer_range\": 0.2}", false);
    check_bf16_cache("llama GQA 4/2", CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2}", true);
    check_bf16_cache("llama GQA 4/2", CLLM_ARCH_LLAMA, "{\"initializer_range\": 0.2}", false);
    check_bf16_cache("bloom", CLLM_ARCH_BLOOM, "{\"initializer_range\": 0.2}", true);
    check_bf16_cache("bloom", CLLM_ARCH_BLOOM, "{\"initializer_range\": 0.2}", false);
    test_attention_kernel();
    test_sampler_probs();
    test_sampler_draws();
    if (argc > 1) {
        char gpt2[4096], llama[4096];
        snprintf(gpt2, sizeof gpt2, "%s/gpt2", argv[1]);
        snprintf(llama, sizeof llama, "%s/tinyllama-1.1b-chat-v1.0", argv[1]);
        check_stream(gpt2, "Hello", " wörld — 日本語 \xF0\x9F\x99\x82 ok \xF0\x9F\x98\x80\xF0\x9F\x8E\x89!");
        check_stream(llama, "Hello", " world 日本語 \xF0\x9F\x99\x82 \xE1\xBC\x80 ok");
        test_stream_partial_end(gpt2);
    } else {
        fprintf(stderr, "no fixtures folder given: streaming tests skipped\n");
    }
    return check_summary();
}
