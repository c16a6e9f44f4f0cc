/*
 * Tokenizer training, extension and vocabulary resizing through the library
 * (the oracle comparison with transformers.js is tests/toktrain_oracle.py):
 * both tokenizer types reach the requested size, put the special tokens at
 * their ids, round-trip the samples, are byte-for-byte deterministic across
 * runs and thread counts; extension keeps every id and spelling and leaves
 * English encodings alone when it learns from Chinese; resizing keeps old
 * rows bit-identical and puts the mean in the new ones; and the error paths
 * write nothing. Small corpora, so it also runs under ASan/UBSan.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cllm/io.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"

static char dir[64];

static const char *const SAMPLES[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's I'll we've DON'T they're",
    "你好，世界！今天天气很好。",
    "日本語のテキストです。カタカナとひらがな。",
    "Emoji: \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
    "def f(x):\n    return x**2  # square\n\n\tif x: pass\r\n",
    "digits 0 1 12 123 1234 3.14159 2024-01-01",
    "\t\t tabs\tand  spaces \t mixed\r\n\r\nend",
    "rare: \xC7\x82 \xE2\x82\xBF \xF0\x9D\x94\x98 <s> </s> <|endoftext|>",
};
#define N_SAMPLES (sizeof SAMPLES / sizeof SAMPLES[0])

static void path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

/* A multilingual corpus: the samples plus generated lines. */
static void make_corpus(void) {
    char p[256];
    path(p, sizeof p, "corpus.txt");
    FILE *f = fopen(p, "wb");
    static const char *const words[] = {"the", "of", "and", "tokenizer", "model", "training", "data", "Hello",
                                        "世界", "数据", "モデル", "学習", "\xF0\x9F\x98\x80", "x", "foo_bar",
                                        "CamelCase", "123", "4567", "3.5", "don't", "über", "Привет", "(", ")"};
    static const char *const seps[] = {" ", " ", " ", "  ", "\t", "\n", "\r\n", ""};
    cllm_rng r;
    cllm_rng_seed(&r, 5);
    for (int i = 0; i < 2500; i++) {
        int k = 1 + (int)cllm_rng_below(&r, 15);
        for (int j = 0; j < k; j++) {
            fputs(words[cllm_rng_below(&r, sizeof words / sizeof words[0])], f);
            fputs(seps[cllm_rng_below(&r, sizeof seps / sizeof seps[0])], f);
        }
        fputc('\n', f);
    }
    for (int r2 = 0; r2 < 3; r2++)
        for (size_t i = 0; i < N_SAMPLES; i++) fprintf(f, "%s\n", SAMPLES[i]);
    fclose(f);
    /* Chinese only, for extension */
    path(p, sizeof p, "zh.txt");
    f = fopen(p, "wb");
    for (int i = 0; i < 1500; i++) {
        int k = 3 + (int)cllm_rng_below(&r, 20);
        for (int j = 0; j < k; j++) {
            char b[4];
            uint32_t cp = 0x4E00 + (uint32_t)(cllm_rng_below(&r, 60) * cllm_rng_below(&r, 5));
            b[0] = (char)(0xE0 | (cp >> 12));
            b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            b[2] = (char)(0x80 | (cp & 0x3F));
            fwrite(b, 1, 3, f);
        }
        fputs("。\n", f);
    }
    fclose(f);
}

static bool same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool same = cllm_read_file(a, &x, &nx) == CLLM_OK && cllm_read_file(b, &y, &ny) == CLLM_OK && nx == ny &&
                memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static bool exists(const char *name) {
    char p[256];
    struct stat sb;
    path(p, sizeof p, name);
    return stat(p, &sb) == 0;
}

static cllm_tokenizer *load(const char *name) {
    char p[256];
    path(p, sizeof p, name);
    cllm_tokenizer *tok = NULL;
    if (cllm_tokenizer_load(&tok, p)) fprintf(stderr, "load %s: %s\n", name, cllm_last_error());
    return tok;
}

/* decode(encode(s)) == s, special tokens in the text kept as text */
static bool round_trips(const cllm_tokenizer *tok, const char *s) {
    cllm_token_buf b = {0};
    char *text = NULL;
    size_t len = 0;
    bool ok = cllm_tokenizer_encode(tok, s, strlen(s), false, &b) == CLLM_OK &&
              cllm_tokenizer_decode(tok, b.ids, b.n, false, &text, &len) == CLLM_OK && len == strlen(s) &&
              memcmp(text, s, len) == 0;
    free(text);
    cllm_token_buf_free(&b);
    return ok;
}

static cllm_status train(cllm_tokenizer_type type, int32_t vocab, int workers, const char *out) {
    char in[256], o[256];
    path(in, sizeof in, "corpus.txt");
    path(o, sizeof o, out);
    const char *files[] = {in};
    cllm_tokenizer_train_params p = {0};
    p.type = type;
    p.vocab_size = vocab;
    p.min_frequency = 2;
    p.n_workers = workers;
    return cllm_tokenizer_train(files, 1, &p, o, NULL);
}

static void test_train(cllm_tokenizer_type type, const char *name, int32_t vocab) {
    char a[256], b[256];
    CHECK(train(type, vocab, 2, name) == CLLM_OK, "%s: %s", name, cllm_last_error());
    char name1[64];
    snprintf(name1, sizeof name1, "%s_w1", name);
    CHECK(train(type, vocab, 1, name1) == CLLM_OK, "%s", cllm_last_error());
    snprintf(a, sizeof a, "%s/%s/tokenizer.json", dir, name);
    snprintf(b, sizeof b, "%s/%s/tokenizer.json", dir, name1);
    CHECK(same_file(a, b), "%s: 1 and 2 workers give the same file", name);
    CHECK(train(type, vocab, 2, name1) == CLLM_OK, "%s", cllm_last_error());
    CHECK(same_file(a, b), "%s: a second run gives the same file", name);
    cllm_tokenizer *tok = load(name);
    CHECK(tok != NULL, "%s loads", name);
    if (!tok) return;
    CHECK(cllm_tokenizer_vocab_size(tok) == vocab, "%s: vocab %d, want %d", name, cllm_tokenizer_vocab_size(tok), vocab);
    bool sp = type == CLLM_TOKENIZER_SP_BPE;
    if (sp) {
        CHECK(cllm_tokenizer_token_to_id(tok, "<unk>", 5) == 0 && cllm_tokenizer_token_to_id(tok, "<s>", 3) == 1 &&
                  cllm_tokenizer_token_to_id(tok, "</s>", 4) == 2,
              "sp special ids");
        CHECK(cllm_tokenizer_bos_id(tok) == 1 && cllm_tokenizer_eos_id(tok) == 2 && cllm_tokenizer_unk_id(tok) == 0,
              "sp bos/eos/unk");
        CHECK(cllm_tokenizer_token_to_id(tok, "<0x0A>", 6) == 13, "newline byte token at 3 + 10");
        cllm_token_buf buf = {0};
        CHECK(cllm_tokenizer_encode(tok, "Hello", 5, true, &buf) == CLLM_OK && buf.n >= 2 && buf.ids[0] == 1,
              "BOS first");
        cllm_token_buf_free(&buf);
    } else {
        CHECK(cllm_tokenizer_token_to_id(tok, "<|endoftext|>", 13) == 0 && cllm_tokenizer_is_special(tok, 0),
              "<|endoftext|> at id 0");
        CHECK(cllm_tokenizer_eos_id(tok) == 0, "eos");
    }
    for (size_t i = 0; i < N_SAMPLES; i++)
        CHECK(round_trips(tok, SAMPLES[i]), "%s round trip of sample %zu", name, i);
    cllm_tokenizer_free(tok);
}

static void test_extend(const char *base, const char *out, int32_t add) {
    char b[256], o[256], in[256];
    path(b, sizeof b, base);
    path(o, sizeof o, out);
    path(in, sizeof in, "zh.txt");
    const char *files[] = {in};
    cllm_tokenizer_train_params p = {0};
    p.n_add = add;
    p.min_frequency = 2;
    cllm_tokenizer_train_stats s;
    CHECK(cllm_tokenizer_extend(b, files, 1, &p, o, &s) == CLLM_OK, "extend %s: %s", base, cllm_last_error());
    cllm_tokenizer *t0 = load(base), *t1 = load(out);
    CHECK(t0 && t1, "both load");
    if (!t0 || !t1) goto done;
    int32_t n0 = cllm_tokenizer_vocab_size(t0);
    CHECK(cllm_tokenizer_vocab_size(t1) == n0 + add, "%s grows by %d: %d -> %d", out, add, n0,
          cllm_tokenizer_vocab_size(t1));
    int changed = 0;
    for (int32_t id = 0; id < n0; id++) {
        size_t l0 = 0, l1 = 0;
        const char *s0 = cllm_tokenizer_id_to_token(t0, id, &l0), *s1 = cllm_tokenizer_id_to_token(t1, id, &l1);
        changed += !(s0 && s1 && l0 == l1 && memcmp(s0, s1, l0) == 0);
    }
    CHECK(changed == 0, "%d old ids changed", changed);
    /* text without Chinese encodes as before */
    static const char *const en[] = {"Hello world", "The quick brown fox jumps over the lazy dog.",
                                     "def f(x):\n    return x**2\n", "digits 12 123 1234"};
    for (size_t i = 0; i < sizeof en / sizeof en[0]; i++) {
        cllm_token_buf x = {0}, y = {0};
        CHECK(cllm_tokenizer_encode(t0, en[i], strlen(en[i]), true, &x) == CLLM_OK &&
                  cllm_tokenizer_encode(t1, en[i], strlen(en[i]), true, &y) == CLLM_OK && x.n == y.n &&
                  memcmp(x.ids, y.ids, x.n * sizeof *x.ids) == 0,
              "%s: '%s' encodes as before", out, en[i]);
        cllm_token_buf_free(&x);
        cllm_token_buf_free(&y);
    }
    /* Chinese gets shorter */
    const char *zh = "一一丁一丂一丄一。一丁丁丂";
    cllm_token_buf x = {0}, y = {0};
    CHECK(cllm_tokenizer_encode(t0, zh, strlen(zh), false, &x) == CLLM_OK &&
              cllm_tokenizer_encode(t1, zh, strlen(zh), false, &y) == CLLM_OK && y.n < x.n,
          "%s: Chinese needs fewer tokens (%zu -> %zu)", out, x.n, y.n);
    cllm_token_buf_free(&x);
    cllm_token_buf_free(&y);
    for (size_t i = 0; i < N_SAMPLES; i++) CHECK(round_trips(t1, SAMPLES[i]), "%s round trip of sample %zu", out, i);
done:
    cllm_tokenizer_free(t0);
    cllm_tokenizer_free(t1);
}

static void test_errors(void) {
    char in[256], o[256], missing[256];
    path(in, sizeof in, "corpus.txt");
    path(missing, sizeof missing, "no-such-file.txt");
    path(o, sizeof o, "err_out");
    cllm_tokenizer_train_params p = {0};
    p.vocab_size = 200; /* < 1 special + 256 bytes */
    const char *files[] = {in};
    CHECK(cllm_tokenizer_train(files, 1, &p, o, NULL) == CLLM_ERR_ARG, "vocab below the base alphabet");
    CHECK(strstr(cllm_last_error(), "257") != NULL, "message names the minimum: %s", cllm_last_error());
    p.type = CLLM_TOKENIZER_SP_BPE;
    p.vocab_size = 259;
    CHECK(cllm_tokenizer_train(files, 1, &p, o, NULL) == CLLM_ERR_ARG, "sp vocab below specials + bytes + U+2581");
    const char *bad[] = {in, missing};
    p.vocab_size = 300;
    CHECK(cllm_tokenizer_train(bad, 2, &p, o, NULL) == CLLM_ERR_IO, "missing input");
    CHECK(strstr(cllm_last_error(), "no-such-file.txt") != NULL, "message names the file: %s", cllm_last_error());
    const char *empty_tok[] = {""};
    p.special_tokens = empty_tok;
    p.n_special = 1;
    CHECK(cllm_tokenizer_train(files, 1, &p, o, NULL) == CLLM_ERR_ARG, "empty special token");
    CHECK(!exists("err_out"), "nothing written on errors");
    cllm_tokenizer_train_params e = {0};
    e.n_add = 0;
    char b[256];
    path(b, sizeof b, "bb");
    CHECK(cllm_tokenizer_extend(b, files, 1, &e, o, NULL) == CLLM_ERR_ARG, "extend by 0");
    e.n_add = 5;
    path(b, sizeof b, "nope");
    CHECK(cllm_tokenizer_extend(b, files, 1, &e, o, NULL) == CLLM_ERR_IO, "extend a missing tokenizer");
    CHECK(!exists("err_out"), "nothing written on errors");
}

static void test_resize(cllm_arch arch, bool untie) {
    json_t *cfg = NULL;
    cllm_model *m = NULL;
    CHECK(cllm_model_preset(&cfg, arch, "tiny") == CLLM_OK, "preset");
    if (!cfg) return;
    json_object_set_new(cfg, "vocab_size", json_integer(100));
    if (untie) json_object_set_new(cfg, "tie_word_embeddings", json_false());
    CHECK(cllm_model_init_random(&m, cfg, 7) == CLLM_OK, "init: %s", cllm_last_error());
    json_decref(cfg);
    if (!m) return;
    /* a copy of the old parameters */
    int nt = cllm_model_n_tensors(m);
    size_t np = cllm_model_buffer_len(m);
    float *old = malloc(np * sizeof *old);
    memcpy(old, cllm_model_params(m), np * sizeof *old);
    cllm_tensor_info *ti = malloc((size_t)nt * sizeof *ti);
    for (int i = 0; i < nt; i++) ti[i] = *cllm_model_tensor(m, i);
    cllm_model *keep = m;
    CHECK(cllm_model_resize_vocab(&m, 90, 0, 0) == CLLM_ERR_ARG && m == keep, "shrinking is refused");
    CHECK(cllm_model_resize_vocab(&m, 137, 0, 0) == CLLM_OK, "resize: %s", cllm_last_error());
    CHECK(cllm_model_get_config(m)->vocab_size == 137, "config vocab_size");
    CHECK(cllm_model_n_tensors(m) == nt, "same tensors");
    int grown = 0;
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        const float *p = cllm_model_params(m) + t->offset, *q = old + ti[i].offset;
        if (t->ndim == 2 && ti[i].shape[0] == 100 && t->shape[0] == 137) {
            grown++;
            int C = (int)t->shape[1];
            CHECK(memcmp(p, q, ti[i].numel * sizeof *p) == 0, "%s: old rows bit-identical", t->name);
            int bad = 0;
            for (int c = 0; c < C; c++) {
                double mean = 0;
                for (int v = 0; v < 100; v++) mean += q[(size_t)v * C + c];
                float want = (float)(mean / 100);
                for (int v = 100; v < 137; v++) bad += p[(size_t)v * C + c] != want;
            }
            CHECK(bad == 0, "%s: %d new values differ from the mean", t->name, bad);
        } else {
            CHECK(t->numel == ti[i].numel && memcmp(p, q, t->numel * sizeof *p) == 0, "%s unchanged", t->name);
        }
    }
    bool tied = cllm_model_get_config(m)->tie_embeddings;
    CHECK(grown == (tied ? 1 : 2), "%s: %d tensors grew", cllm_arch_name(arch), grown);
    /* runs on ids in the new range */
    int32_t tok[8] = {0, 136, 120, 101, 5, 99, 100, 136}, tgt[8];
    cllm_model_make_targets(tgt, tok, 1, 8);
    double loss = 0;
    long n = 0;
    CHECK(cllm_model_prepare(m, 1, 8, true) == CLLM_OK &&
              cllm_model_forward_backward(m, tok, tgt, 1, 8, true, 1.0f / 7, &loss, &n) == CLLM_OK && n == 7 &&
              loss == loss,
          "forward/backward with new ids: %s", cllm_last_error());
    free(old);
    free(ti);
    cllm_model_free(m);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cllm_toktrain_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    make_corpus();
    test_train(CLLM_TOKENIZER_BYTE_BPE, "bb", 420);
    test_train(CLLM_TOKENIZER_SP_BPE, "sp", 420);
    test_extend("bb", "bb_ext", 60);
    test_extend("sp", "sp_ext", 120);
    test_errors();
    test_resize(CLLM_ARCH_GPT2, false);
    test_resize(CLLM_ARCH_LLAMA, true);
    test_resize(CLLM_ARCH_BLOOM, false);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
