/*
 * Data pipeline tests (label data): record formats and auto-detection
 * (seed 003's records exactly as written there), template rendering (exact
 * strings), loss masks (token-level, built from separately tokenized
 * segments with the fixture tokenizers), bad-record messages with
 * FILE:LINE:COL, --skip-bad counting, and the loader: determinism, epochs,
 * splits, packing, blends (exact counts of Megatron's rule), refusal of a
 * mismatched .idx/.bin.
 * Usage: test_data <fixtures/hf> <tests/data> <scratch dir>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cllm/loader.h"
#include "cllm/prepare.h"
#include "cllm/sample.h"
#include "cllm/tokenizer.h"
#include "data/blend_impl.h"
#include "data/data_impl.h"

static const char *g_hf, *g_data, *g_tmp;
static cllm_tokenizer *g_gpt2, *g_llama;

static char *path_in(const char *dir, const char *name) {
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* ids of `text` encoded without special tokens, appended to b. */
static void enc(cllm_tokenizer *tok, const char *text, cllm_token_buf *b) {
    if (cllm_tokenizer_encode(tok, text, strlen(text), false, b)) {
        fprintf(stderr, "encode failed: %s\n", cllm_last_error());
        exit(1);
    }
}

/* Expected ids/labels built from segments: prompt text (no loss), answer
 * text (loss), EOS (loss), BOS (no loss). */
typedef struct {
    cllm_token_buf ids, labels;
} expect;

static void ex_text(expect *e, cllm_tokenizer *tok, const char *text, bool loss) {
    size_t n0 = e->ids.n;
    enc(tok, text, &e->ids);
    for (size_t i = n0; i < e->ids.n; i++) {
        int32_t y = loss ? e->ids.ids[i] : -100;
        cllm_token_buf one = {&y, 1, 1};
        (void)one;
        if (e->labels.n == e->labels.cap) {
            e->labels.cap = e->labels.cap ? e->labels.cap * 2 : 64;
            e->labels.ids = realloc(e->labels.ids, e->labels.cap * sizeof(int32_t));
        }
        e->labels.ids[e->labels.n++] = y;
    }
}

static void ex_id(expect *e, int32_t id, bool loss) {
    if (e->ids.n == e->ids.cap) {
        e->ids.cap = e->ids.cap ? e->ids.cap * 2 : 64;
        e->ids.ids = realloc(e->ids.ids, e->ids.cap * sizeof(int32_t));
    }
    if (e->labels.n == e->labels.cap) {
        e->labels.cap = e->labels.cap ? e->labels.cap * 2 : 64;
        e->labels.ids = realloc(e->labels.ids, e->labels.cap * sizeof(int32_t));
    }
    e->ids.ids[e->ids.n++] = id;
    e->labels.ids[e->labels.n++] = loss ? id : -100;
}

static void ex_free(expect *e) {
    cllm_token_buf_free(&e->ids);
    cllm_token_buf_free(&e->labels);
}

static bool same(const cllm_token_buf *a, const cllm_token_buf *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->ids, b->ids, a->n * sizeof(int32_t)) == 0);
}

/* Reads every record of a file, parsed and encoded with tok. */
typedef struct {
    int n;
    cllm_sample_type type[16];
    uint64_t line[16], col[16];
    char text[16][4096];
    cllm_token_buf ids[16], labels[16];
} parsed;

static void parse_file(const char *path, cllm_tokenizer *tok, parsed *p) {
    memset(p, 0, sizeof *p);
    cllm_record_reader *r;
    cllm_template t;
    CHECK(cllm_template_load(&t, NULL) == CLLM_OK, "%s", cllm_last_error());
    CHECK(cllm_records_open(&r, path) == CLLM_OK, "%s", cllm_last_error());
    cllm_sample s = {0};
    for (;;) {
        cllm_record rec;
        bool got;
        if (cllm_records_next(r, &rec, &got) || !got) break;
        int i = p->n++;
        p->line[i] = rec.loc.line;
        p->col[i] = rec.loc.col;
        cllm_status st = rec.kind == CLLM_REC_TEXT ? cllm_sample_from_text(&s, rec.text, rec.len, &t)
                                                   : cllm_sample_parse(&s, rec.text, rec.len, &rec.loc, &t, 0);
        CHECK(st == CLLM_OK, "%s record %d: %s", path, i, cllm_last_error());
        if (st) continue;
        p->type[i] = s.type;
        snprintf(p->text[i], sizeof p->text[i], "%s", s.text ? s.text : "");
        CHECK(cllm_sample_encode(&s, tok, &t, cllm_tokenizer_vocab_size(tok), &rec.loc, &p->ids[i],
                                 &p->labels[i]) == CLLM_OK,
              "%s", cllm_last_error());
    }
    cllm_sample_free(&s);
    cllm_records_close(r);
    cllm_template_free(&t);
}

static void parsed_free(parsed *p) {
    for (int i = 0; i < p->n; i++) {
        cllm_token_buf_free(&p->ids[i]);
        cllm_token_buf_free(&p->labels[i]);
    }
}

#define NOINPUT                                                                                                  \
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n" \
    "### Instruction:\n"
#define WITHINPUT                                                                                              \
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a " \
    "response that appropriately completes the request.\n\n### Instruction:\n"

static const char *SEED_INS = "补充下面横线上的内容", *SEED_INP = "再多看一眼就会爆炸，________",
                  *SEED_OUT = "再。。。再靠近点快被融化?";

/* Seed 003's records, as written in its format description (comments,
 * trailing comma and all): types, rendered text and token-level masks. */
static void test_seed_formats(cllm_tokenizer *tok, bool bos) {
    parsed p;
    parse_file(path_in(g_data, "seed003.json"), tok, &p);
    CHECK(p.n == 5, "seed003.json: %d records", p.n);
    if (p.n != 5) return;
    const cllm_sample_type want[5] = {CLLM_SAMPLE_PRETRAIN, CLLM_SAMPLE_INSTRUCT, CLLM_SAMPLE_INSTRUCT,
                                      CLLM_SAMPLE_CONVERSATION, CLLM_SAMPLE_REF_QA};
    const uint64_t lines[5] = {3, 9, 15, 22, 37};
    for (int i = 0; i < 5; i++) {
        CHECK(p.type[i] == want[i], "record %d type %s", i, cllm_sample_type_name(p.type[i]));
        CHECK(p.line[i] == lines[i] && p.col[i] == 5, "record %d at %llu:%llu", i, (unsigned long long)p.line[i],
              (unsigned long long)p.col[i]);
    }
    /* Rendered text (BOS/EOS are separate segments, not text). */
    char want_text[4096];
    snprintf(want_text, sizeof want_text, WITHINPUT "%s\n\n### Input:\n%s\n\n### Response:\n%s", SEED_INS, SEED_INP,
             SEED_OUT);
    CHECK(strcmp(p.text[1], want_text) == 0, "instruct with input rendered as:\n%s", p.text[1]);
    const char *conv = "### Human:\n你好\n\n### Assistant:\n你好\n\n### Human:\n今天星期几\n\n### Assistant:\n今天星期三"
                       "\n\n### Human:\n明天星期几\n\n### Human:\n昨天星期几\n\n### Human:\n前天星期几\n\n### "
                       "Assistant:\n傻逼，再问打死你";
    CHECK(strcmp(p.text[3], conv) == 0, "conversation rendered as:\n%s", p.text[3]);
    const char *refqa = "### Reference:\n一掐脖子就翻白眼，一松手就吹牛逼，早有布局遥遥领先，拳打谷歌脚踢微软，千秋万代一统"
                        "江湖\n\n### Human:\n这段话有几个字\n\n### Assistant:\n100个字\n\n### Human:\n多少汉字多少英文\n\n"
                        "### Assistant:\n你不会自己看?";
    CHECK(strcmp(p.text[4], refqa) == 0, "ref_qa rendered as:\n%s", p.text[4]);

    int32_t eos = cllm_tokenizer_eos_id(tok), b = cllm_tokenizer_bos_id(tok);
    /* pretrain: every token trained, EOS at the end. */
    {
        expect e = {0};
        if (bos) ex_id(&e, b, true);
        ex_text(&e, tok, strstr(p.text[0], "我只想说"), true);
        ex_id(&e, eos, true);
        CHECK(same(&e.ids, &p.ids[0]) && same(&e.labels, &p.labels[0]), "pretrain tokens/labels");
        ex_free(&e);
    }
    /* instruct: prompt masked, answer + EOS trained. */
    {
        expect e = {0};
        char prompt[2048];
        snprintf(prompt, sizeof prompt, WITHINPUT "%s\n\n### Input:\n%s\n\n### Response:\n", SEED_INS, SEED_INP);
        if (bos) ex_id(&e, b, false);
        ex_text(&e, tok, prompt, false);
        ex_text(&e, tok, SEED_OUT, true);
        ex_id(&e, eos, true);
        CHECK(same(&e.ids, &p.ids[1]), "instruct ids (%zu vs %zu)", e.ids.n, p.ids[1].n);
        CHECK(same(&e.labels, &p.labels[1]), "instruct labels");
        ex_free(&e);
    }
    /* conversation: three asks in a row are all prompt. */
    {
        expect e = {0};
        if (bos) ex_id(&e, b, false);
        ex_text(&e, tok, "### Human:\n你好\n\n### Assistant:\n", false);
        ex_text(&e, tok, "你好", true);
        ex_id(&e, eos, true);
        ex_text(&e, tok, "\n\n### Human:\n今天星期几\n\n### Assistant:\n", false);
        ex_text(&e, tok, "今天星期三", true);
        ex_id(&e, eos, true);
        ex_text(&e, tok,
                "\n\n### Human:\n明天星期几\n\n### Human:\n昨天星期几\n\n### Human:\n前天星期几\n\n### Assistant:\n",
                false);
        ex_text(&e, tok, "傻逼，再问打死你", true);
        ex_id(&e, eos, true);
        CHECK(same(&e.ids, &p.ids[3]), "conversation ids (%zu vs %zu)", e.ids.n, p.ids[3].n);
        CHECK(same(&e.labels, &p.labels[3]), "conversation labels");
        ex_free(&e);
    }
    /* ref_qa: the reference first, as prompt. */
    {
        expect e = {0};
        if (bos) ex_id(&e, b, false);
        ex_text(&e, tok,
                "### Reference:\n一掐脖子就翻白眼，一松手就吹牛逼，早有布局遥遥领先，拳打谷歌脚踢微软，千秋万代一统江湖"
                "\n\n### Human:\n这段话有几个字\n\n### Assistant:\n",
                false);
        ex_text(&e, tok, "100个字", true);
        ex_id(&e, eos, true);
        ex_text(&e, tok, "\n\n### Human:\n多少汉字多少英文\n\n### Assistant:\n", false);
        ex_text(&e, tok, "你不会自己看?", true);
        ex_id(&e, eos, true);
        CHECK(same(&e.ids, &p.ids[4]) && same(&e.labels, &p.labels[4]), "ref_qa ids/labels");
        ex_free(&e);
    }
    parsed_free(&p);
}

/* Alpaca fields, inferred types, pre-tokenized ids, .txt paragraphs. */
static void test_other_formats(void) {
    const char *f = path_in(g_tmp, "formats.jsonl");
    write_file(f, "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
                  "\n"
                  "  {\"instruction\": \"Add\", \"input\": \"1 2\", \"output\": \"3\"}\n"
                  "{\"text\": \"plain text\"}\n"
                  "{\"rounds\": [[\"user\", \"a\"], [\"assistant\", \"b\"]]}\n"
                  "{\"reference\": \"r\", \"rounds\": [[\"ask\", \"q\"], [\"ans\", \"a\"]]}\n"
                  "{\"input_ids\": [5, 6, 7], \"labels\": [-100, 6, 7]}\n");
    parsed p;
    parse_file(f, g_gpt2, &p);
    CHECK(p.n == 6, "formats.jsonl: %d records", p.n);
    if (p.n == 6) {
        const cllm_sample_type want[6] = {CLLM_SAMPLE_INSTRUCT, CLLM_SAMPLE_INSTRUCT, CLLM_SAMPLE_PRETRAIN,
                                          CLLM_SAMPLE_CONVERSATION, CLLM_SAMPLE_REF_QA, CLLM_SAMPLE_TOKENS};
        for (int i = 0; i < 6; i++) CHECK(p.type[i] == want[i], "record %d: %s", i, cllm_sample_type_name(p.type[i]));
        CHECK(p.line[1] == 3 && p.col[1] == 3, "record 1 at %llu:%llu", (unsigned long long)p.line[1],
              (unsigned long long)p.col[1]);
        CHECK(strcmp(p.text[0], NOINPUT "Say hi\n\n### Response:\nhi") == 0, "empty input = no input: %s", p.text[0]);
        CHECK(strcmp(p.text[1], WITHINPUT "Add\n\n### Input:\n1 2\n\n### Response:\n3") == 0, "alpaca: %s",
              p.text[1]);
        CHECK(strcmp(p.text[3], "### Human:\na\n\n### Assistant:\nb") == 0, "role aliases: %s", p.text[3]);
        int32_t ids[3] = {5, 6, 7}, lab[3] = {-100, 6, 7};
        CHECK(p.ids[5].n == 3 && !memcmp(p.ids[5].ids, ids, sizeof ids) && !memcmp(p.labels[5].ids, lab, sizeof lab),
              "pre-tokenized ids and labels kept");
        /* GPT-2: no BOS (it would be the EOS); pretrain = text + EOS. */
        expect e = {0};
        ex_text(&e, g_gpt2, "plain text", true);
        ex_id(&e, 50256, true);
        CHECK(same(&e.ids, &p.ids[2]) && same(&e.labels, &p.labels[2]), "gpt2 pretrain: text + <|endoftext|>");
        ex_free(&e);
    }
    parsed_free(&p);

    const char *t = path_in(g_tmp, "doc.txt");
    write_file(t, "First paragraph\nstill first.\n\n\n  \nSecond one.\n");
    parse_file(t, g_gpt2, &p);
    CHECK(p.n == 2 && p.line[0] == 1 && p.line[1] == 6, "txt paragraphs: %d", p.n);
    if (p.n == 2) {
        CHECK(strcmp(p.text[0], "First paragraph\nstill first.") == 0, "paragraph 1: %s", p.text[0]);
        CHECK(p.type[1] == CLLM_SAMPLE_PRETRAIN, "txt is pretrain");
    }
    parsed_free(&p);
}

/* A template file: every key, exact rendering, BOS/EOS switches. */
static void test_template_file(void) {
    const char *tf = path_in(g_tmp, "tmpl.json");
    write_file(tf, "{\"system\": \"SYS\\n\", \"ask_prefix\": \"<|user|>\\n\", \"ask_suffix\": \"</s>\\n\","
                   " \"ans_prefix\": \"<|assistant|>\\n\", \"ans_suffix\": \"\\n\", \"bos\": false, \"eos\": true,"
                   " \"instruct\": \"Q: {instruct}\\nA: \", \"instruct_input\": \"Q: {instruct} [{input}]\\nA: \"}");
    cllm_template t;
    CHECK(cllm_template_load(&t, tf) == CLLM_OK, "%s", cllm_last_error());
    cllm_sample s = {0};
    const char *rec = "{\"rounds\": [[\"ask\", \"x\"], [\"ans\", \"y\"], [\"ask\", \"z\"], [\"ans\", \"w\"]]}";
    CHECK(cllm_sample_parse(&s, rec, strlen(rec), NULL, &t, 0) == CLLM_OK, "%s", cllm_last_error());
    CHECK(s.text && strcmp(s.text, "SYS\n<|user|>\nx</s>\n<|assistant|>\ny\n<|user|>\nz</s>\n<|assistant|>\nw") == 0,
          "custom conversation: %s", s.text);
    const char *ins = "{\"instruct\": \"I\", \"input\": \"N\", \"output\": \"O\"}";
    CHECK(cllm_sample_parse(&s, ins, strlen(ins), NULL, &t, 0) == CLLM_OK, "%s", cllm_last_error());
    CHECK(s.text && strcmp(s.text, "SYS\nQ: I [N]\nA: O") == 0, "custom instruct: %s", s.text);
    /* bos false: TinyLlama's <s> is not added. */
    cllm_token_buf ids = {0}, lab = {0};
    CHECK(cllm_sample_encode(&s, g_llama, &t, 32000, NULL, &ids, &lab) == CLLM_OK, "%s", cllm_last_error());
    CHECK(ids.n > 0 && ids.ids[0] != 1 && ids.ids[ids.n - 1] == 2, "bos off, eos on");
    cllm_token_buf_free(&ids);
    cllm_token_buf_free(&lab);
    cllm_template_free(&t);
    write_file(tf, "{\"ask_prefx\": \"x\"}");
    CHECK(cllm_template_load(&t, tf) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "unknown key \"ask_prefx\""),
          "typo refused: %s", cllm_last_error());
    write_file(tf, "{\"instruct\": \"no placeholder\"}");
    CHECK(cllm_template_load(&t, tf) == CLLM_ERR_FORMAT, "instruct without {instruct} refused");
    cllm_sample_free(&s);
}

/* Opening `text` (written to name) with the loader must fail with `want`
 * in the message. */
static void expect_bad(const char *name, const char *text, const char *want) {
    const char *f = path_in(g_tmp, name);
    write_file(f, text);
    cllm_loader *l = NULL;
    cllm_loader_opts o = {.spec = f, .tokenizer = path_in(g_hf, "gpt2"), .seq_len = 16, .vocab_size = 50257};
    cllm_status st = cllm_loader_open(&l, &o);
    char full[1200];
    snprintf(full, sizeof full, "%s:%s", f, want);
    CHECK(st == CLLM_ERR_FORMAT && strstr(cllm_last_error(), full), "%s: want \"%s\", got (%d) \"%s\"", name, full,
          st, cllm_last_error());
    cllm_loader_free(l);
}

static void test_bad_data(void) {
    expect_bad("b1.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\", }\n", "2:16: malformed JSON");
    expect_bad("b2.jsonl", "{\"text\": \"ok\"}\n\n{\"type\": \"chat\", \"text\": \"x\"}\n",
               "3:2: unknown type \"chat\"");
    expect_bad("b3.jsonl", "{\"type\": \"instruct\", \"instruct\": \"x\"}\n", "1:1: missing field \"output\"");
    expect_bad("b4.jsonl", "{\"instruct\": \"x\", \"output\": 5}\n", "1:19: field \"output\" must be a string");
    expect_bad("b5.jsonl", "{\"text\": \"\"}\n", "1:2: empty text in field \"text\"");
    expect_bad("b6.jsonl", "{\"input_ids\": [1, 2, 99999]}\n",
               "1:2: token id 99999 at input_ids[2] is outside the vocabulary [0, 50257)");
    expect_bad("b7.jsonl", "{\"foo\": 1}\n", "1:1: cannot tell the record's format");
    expect_bad("b8.json", "[\n  {\"text\": \"a\"},\n  {\"rounds\": [[\"ask\", \"q\"]]}\n]\n",
               "3:4: no \"ans\" round");
    expect_bad("b9.json", "[\n  {\"text\": \"a\"},\n  {\"rounds\": [[\"ask\", \"q\"], [\"bot\", \"a\"]]}\n]\n",
               "3:4: rounds[1]: unknown role \"bot\"");
    expect_bad("b10.json", "[{\"text\": \"a\"}\n  {\"text\": \"b\"", "2:15: unexpected end of file inside a record");
    expect_bad("b11.json", "{\"text\": \"a\"}\n[1]\n", "2:1: a record must be a JSON object");
    /* Chinese text: columns count characters. */
    expect_bad("b12.jsonl", "{\"text\": \"你好\", \"x\": tru}\n", "1:23: malformed JSON");

    /* skip_bad: up to N bad records are skipped and the rest load. */
    const char *f = path_in(g_tmp, "skip.jsonl");
    write_file(f, "{\"text\": \"a\"}\n{\"text\": 1}\n{\"text\": \"b\"}\n{bad\n{\"text\": \"c\"}\n");
    cllm_loader *l = NULL;
    cllm_loader_opts o = {.spec = f, .tokenizer = path_in(g_hf, "gpt2"), .seq_len = 8, .vocab_size = 50257,
                          .skip_bad = 2};
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK && cllm_loader_size(l) == 3, "skip 2 of 2 bad: %s",
          cllm_last_error());
    cllm_loader_free(l);
    l = NULL;
    o.skip_bad = 1;
    CHECK(cllm_loader_open(&l, &o) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "more than 1 bad records") &&
              strstr(cllm_last_error(), "skip.jsonl:4:4"),
          "third bad record stops: %s", cllm_last_error());
    cllm_loader_free(l);
}

/* Raw JSONL through the loader: rows, padding, truncation, determinism,
 * epochs, splits. */
static void test_loader_raw(void) {
    const char *f = path_in(g_tmp, "ten.jsonl");
    FILE *fp = fopen(f, "w");
    for (int i = 0; i < 10; i++) fprintf(fp, "{\"input_ids\": [%d, %d, %d]}\n", i + 1, i + 2, i + 3);
    fclose(fp);
    enum { T = 4 };
    cllm_loader *l = NULL, *l2 = NULL;
    cllm_loader_opts o = {.spec = f, .seq_len = T, .vocab_size = 100, .shuffle = false, .seed = 7};
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK && cllm_loader_size(l) == 10, "%s", cllm_last_error());
    int32_t tok[T], lab[T], tok2[T], lab2[T];
    long n;
    /* Unshuffled: sample g is record g % 10, padded with 0 / -100. */
    for (uint64_t g = 0; g < 25 && l; g++) {
        cllm_loader_get(l, g, tok, lab, &n);
        int r = (int)(g % 10);
        CHECK(tok[0] == r + 1 && tok[2] == r + 3 && tok[3] == 0 && lab[3] == -100 && lab[0] == r + 1 && n == 3,
              "g=%llu row", (unsigned long long)g);
    }
    cllm_loader_free(l);
    /* Shuffled: each epoch is a permutation; same seed, same stream; epochs
     * differ; another seed differs. */
    o.shuffle = true;
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK && cllm_loader_open(&l2, &o) == CLLM_OK, "%s", cllm_last_error());
    int seen[3][10] = {{0}};
    int order[3][10];
    for (int e = 0; e < 3 && l && l2; e++)
        for (int i = 0; i < 10; i++) {
            uint64_t g = (uint64_t)(e * 10 + i);
            cllm_loader_get(l, g, tok, lab, &n);
            seen[e][tok[0] - 1]++;
            order[e][i] = tok[0];
            /* l2 reads backwards: random access gives the same rows. */
            cllm_loader_get(l2, 29 - g, tok2, lab2, &n);
        }
    for (int g = 29; g >= 0 && l && l2; g--) {
        cllm_loader_get(l, (uint64_t)g, tok, lab, &n);
        cllm_loader_get(l2, (uint64_t)g, tok2, lab2, &n);
        CHECK(!memcmp(tok, tok2, sizeof tok), "g=%d identical across loaders and access orders", g);
    }
    bool perm = true;
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < 10; i++) perm &= seen[e][i] == 1;
    CHECK(perm, "every epoch visits every sample once");
    CHECK(memcmp(order[0], order[1], sizeof order[0]) != 0, "epochs 0 and 1 are shuffled differently");
    cllm_loader_free(l2);
    l2 = NULL;
    o.seed = 8;
    CHECK(cllm_loader_open(&l2, &o) == CLLM_OK, "%s", cllm_last_error());
    int diff = 0;
    for (uint64_t g = 0; g < 10 && l2; g++) {
        cllm_loader_get(l2, g, tok2, lab2, &n);
        diff += tok2[0] != order[0][g];
    }
    CHECK(diff > 0, "another seed, another order");
    cllm_loader_free(l);
    cllm_loader_free(l2);
    l = l2 = NULL;
    /* Splits: Megatron's ranges over 10 documents for 8,1,1: [0,8) [8,9) [9,10). */
    o.shuffle = false;
    o.splits = "8,1,1";
    o.split = "valid";
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK && cllm_loader_size(l) == 1, "valid split size");
    if (l) {
        cllm_loader_get(l, 0, tok, lab, &n);
        CHECK(tok[0] == 9, "valid split holds document 8");
    }
    cllm_loader_free(l);
    l = NULL;
    o.split = "train";
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK && cllm_loader_size(l) == 8, "train split size");
    cllm_loader_free(l);
    l = NULL;
    o.splits = "1,0,0";
    o.split = "test";
    CHECK(cllm_loader_open(&l, &o) == CLLM_ERR_ARG && strstr(cllm_last_error(), "holds no samples"), "empty split");
    cllm_loader_free(l);
    /* Megatron's bounds, round half to even, shifted to end at n. */
    double w[3];
    uint64_t b[4];
    cllm_split_parse("950,30,20", w);
    cllm_split_bounds(w, 1000, b);
    CHECK(b[1] == 950 && b[2] == 980 && b[3] == 1000, "950,30,20 over 1000");
    cllm_split_parse("1,1", w);
    cllm_split_bounds(w, 5, b);
    /* round(2.5) = 2 twice gives [0,2,4,4], shifted by one to end at 5. */
    CHECK(b[1] == 3 && b[2] == 5 && b[3] == 5, "1,1 over 5: [0,3) [3,5): %llu %llu", (unsigned long long)b[1],
          (unsigned long long)b[2]);
}

/* Megatron's blending rule: exact assignment of the first samples. */
static void test_blend_rule(void) {
    cllm_blend b;
    double w[2] = {0.7, 0.3};
    CHECK(cllm_blend_init(&b, w, 2) == CLLM_OK, "init");
    /* By hand: i=0 (x=1): errors .7, .3 -> 0; i=1 (x=1): -.3, .3 -> 1;
     * i=2: .4, -.4 -> 0; i=3: .1, -.1 -> 0; i=4: -.2, .2 -> 1; i=5: .5, .5
     * -> tie -> 0; i=6: .2, -.2 -> 0; i=7: -.1, .1 -> 1; i=8: .6, -.6 -> 0;
     * i=9: .3, -.3 -> 0. */
    const int want[10] = {0, 1, 0, 0, 1, 0, 0, 1, 0, 0};
    const uint64_t wk[10] = {0, 0, 1, 2, 1, 3, 4, 2, 5, 6};
    for (int i = 0; i < 10; i++) {
        int d;
        uint64_t k;
        cllm_blend_get(&b, (uint64_t)i, &d, &k);
        CHECK(d == want[i] && k == wk[i], "blend sample %d -> (%d, %llu)", i, d, (unsigned long long)k);
    }
    /* Over 100000 samples the counts are within one of the weights, also when
     * reading blocks out of order. */
    uint64_t c[2] = {0, 0};
    for (uint64_t i = 100000; i-- > 0;) {
        int d;
        uint64_t k;
        cllm_blend_get(&b, i, &d, &k);
        c[d]++;
    }
    CHECK(c[0] == 70000 && c[1] == 30000, "counts %llu %llu", (unsigned long long)c[0], (unsigned long long)c[1]);
    cllm_blend_free(&b);
}

/* A blend through the loader: rows come from the datasets in Megatron's
 * proportions; each dataset keeps its own order. */
static void test_loader_blend(void) {
    const char *a = path_in(g_tmp, "A.jsonl"), *bb = path_in(g_tmp, "B.jsonl");
    FILE *fa = fopen(a, "w"), *fb = fopen(bb, "w");
    for (int i = 0; i < 5; i++) fprintf(fa, "{\"input_ids\": [%d, 1]}\n", 10 + i);
    for (int i = 0; i < 3; i++) fprintf(fb, "{\"input_ids\": [%d, 1]}\n", 20 + i);
    fclose(fa);
    fclose(fb);
    char spec[2400];
    snprintf(spec, sizeof spec, "0.7 %s 0.3 %s", a, bb);
    cllm_loader *l = NULL;
    cllm_loader_opts o = {.spec = spec, .seq_len = 2, .vocab_size = 100, .shuffle = false};
    CHECK(cllm_loader_open(&l, &o) == CLLM_OK && cllm_loader_size(l) == 8, "blend open: %s", cllm_last_error());
    const int want[10] = {10, 20, 11, 12, 21, 13, 14, 22, 10, 11}; /* A wraps after 5 */
    int32_t tok[2], lab[2];
    long n;
    for (int i = 0; i < 10 && l; i++) {
        cllm_loader_get(l, (uint64_t)i, tok, lab, &n);
        CHECK(tok[0] == want[i], "blend row %d = %d, want %d", i, tok[0], want[i]);
    }
    int from_a = 0;
    for (int i = 0; i < 1000 && l; i++) {
        cllm_loader_get(l, (uint64_t)i, tok, lab, &n);
        from_a += tok[0] < 20;
    }
    CHECK(from_a == 700, "700 of 1000 rows from A (%d)", from_a);
    cllm_loader_free(l);
    l = NULL;
    snprintf(spec, sizeof spec, "0.7 %s 0.3", a);
    CHECK(cllm_loader_open(&l, &o) == CLLM_ERR_ARG, "odd blend refused");
    snprintf(spec, sizeof spec, "-1 %s 1 %s", a, bb);
    CHECK(cllm_loader_open(&l, &o) == CLLM_ERR_ARG, "negative weight refused");
    cllm_loader_free(l);
}

static bool files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool eq = fa && fb;
    while (eq) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) eq = false;
        if (x == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int c;
    while (a && b && (c = fgetc(a)) != EOF) fputc(c, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

static cllm_status prepare(const char *in, const char *prefix, int workers, bool pack, int seq_len,
                           cllm_prepare_report *r) {
    const char *inputs[1] = {in};
    cllm_prepare_opts o = {.inputs = inputs, .n_inputs = 1, .tokenizer = path_in(g_hf, "gpt2"),
                           .out_prefix = prefix, .seq_len = seq_len, .pack = pack, .workers = workers};
    return cllm_prepare(&o, r);
}

/* Prepared data read back through the loader: the same rows as the raw
 * file, packing windows over documents joined by EOS, identical bytes with
 * 1 and 2 workers, and refusal of mismatched files. */
static void test_prepared(void) {
    const char *f = path_in(g_tmp, "mix.jsonl");
    FILE *fp = fopen(f, "w");
    for (int i = 0; i < 40; i++) {
        if (i % 3 == 0)
            fprintf(fp, "{\"text\": \"Document %d says hello %d times.\"}\n", i, i * 7);
        else if (i % 3 == 1)
            fprintf(fp, "{\"instruction\": \"Count to %d\", \"output\": \"%d %d\"}\n", i, i, i + 1);
        else
            fprintf(fp, "{\"rounds\": [[\"ask\", \"hi %d\"], [\"ans\", \"yo\"], [\"ask\", \"?\"], [\"ans\", \"ok %d\"]]}\n",
                    i, i);
    }
    fclose(fp);
    char p1[1024], p2[1024], pk[1024];
    snprintf(p1, sizeof p1, "%s/mix1", g_tmp);
    snprintf(p2, sizeof p2, "%s/mix2", g_tmp);
    snprintf(pk, sizeof pk, "%s/mixpack", g_tmp);
    cllm_prepare_report r;
    CHECK(prepare(f, p1, 1, false, 0, &r) == CLLM_OK && r.records == 40 && r.dtype == 8, "prepare: %s",
          cllm_last_error());
    CHECK(prepare(f, p2, 2, false, 0, &r) == CLLM_OK, "prepare 2 workers: %s", cllm_last_error());
    const char *ext[3] = {".bin", ".idx", ".mask"};
    for (int i = 0; i < 3; i++) {
        char a[1100], b[1100];
        snprintf(a, sizeof a, "%s%s", p1, ext[i]);
        snprintf(b, sizeof b, "%s%s", p2, ext[i]);
        CHECK(files_equal(a, b), "%s identical with 1 and 2 workers", ext[i]);
    }
    enum { T = 64 };
    cllm_loader *raw = NULL, *prep = NULL;
    cllm_loader_opts o = {.spec = f, .tokenizer = path_in(g_hf, "gpt2"), .seq_len = T, .vocab_size = 50257};
    CHECK(cllm_loader_open(&raw, &o) == CLLM_OK, "%s", cllm_last_error());
    o.spec = p1;
    CHECK(cllm_loader_open(&prep, &o) == CLLM_OK && cllm_loader_size(prep) == 40, "%s", cllm_last_error());
    int32_t t1[T], l1[T], t2[T], l2[T];
    long n1, n2;
    int32_t stream[40 * T];
    size_t ns = 0;
    for (uint64_t g = 0; g < 40 && raw && prep; g++) {
        cllm_loader_get(raw, g, t1, l1, &n1);
        cllm_loader_get(prep, g, t2, l2, &n2);
        CHECK(!memcmp(t1, t2, sizeof t1) && !memcmp(l1, l2, sizeof l1) && n1 == n2, "row %llu raw == prepared",
              (unsigned long long)g);
        /* Unpadded tokens of the record (pad = GPT-2's EOS, labels -100). */
        int len = T;
        while (len > 0 && l1[len - 1] == -100 && t1[len - 1] == 50256) len--;
        for (int k = 0; k < len; k++) stream[ns++] = t1[k];
        if (g % 3 == 0) CHECK(t1[len - 1] == 50256 && l1[len - 1] == 50256, "pretrain row ends with a trained EOS");
    }
    cllm_loader_free(raw);
    cllm_loader_free(prep);
    /* A padding id (GPT-2's EOS, 50256, from the .mask header) outside a
     * smaller model's vocabulary is refused when the data is opened, not
     * left to read past the embedding table when a short row is padded. */
    prep = NULL;
    o.vocab_size = 50000;
    CHECK(cllm_loader_open(&prep, &o) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "padding id 50256") &&
              strstr(cllm_last_error(), ".mask") && !prep,
          "padding id outside the vocabulary refused at open: %s", cllm_last_error());
    o.vocab_size = 50257;
    /* Packed: windows of T tokens with stride T-1 over the documents. */
    CHECK(prepare(f, pk, 1, true, 0, &r) == CLLM_OK, "%s", cllm_last_error());
    o.spec = pk;
    enum { W = 16 };
    o.seq_len = W;
    cllm_loader *pl = NULL;
    CHECK(cllm_loader_open(&pl, &o) == CLLM_OK, "%s", cllm_last_error());
    uint64_t want_n = (ns - 1 + W - 2) / (W - 1);
    CHECK(pl && cllm_loader_size(pl) == want_n, "packed windows %llu, want %llu",
          pl ? (unsigned long long)cllm_loader_size(pl) : 0ull, (unsigned long long)want_n);
    for (uint64_t k = 0; pl && k < want_n; k++) {
        int32_t tw[W], lw[W];
        cllm_loader_get(pl, k, tw, lw, NULL);
        bool ok = true;
        for (int t = 0; t < W; t++) {
            size_t pos = k * (W - 1) + (size_t)t;
            ok &= pos < ns ? tw[t] == stream[pos] : (lw[t] == -100);
        }
        CHECK(ok, "packed window %llu", (unsigned long long)k);
    }
    cllm_loader_free(pl);

    /* Mismatched files are refused with a clear message. */
    char mm[1024], a[1100], b[1100];
    snprintf(mm, sizeof mm, "%s/mm", g_tmp);
    const char *small = path_in(g_tmp, "small.jsonl");
    write_file(small, "{\"text\": \"just one small document\"}\n");
    char ps[1024];
    snprintf(ps, sizeof ps, "%s/small", g_tmp);
    CHECK(prepare(small, ps, 1, false, 0, &r) == CLLM_OK, "%s", cllm_last_error());
    snprintf(a, sizeof a, "%s.idx", p1), snprintf(b, sizeof b, "%s.idx", mm), copy_file(a, b);
    snprintf(a, sizeof a, "%s.bin", ps), snprintf(b, sizeof b, "%s.bin", mm), copy_file(a, b);
    cllm_loader *bad = NULL;
    o.spec = mm;
    CHECK(cllm_loader_open(&bad, &o) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "does not match"),
          "idx of another bin refused: %s", cllm_last_error());
    snprintf(a, sizeof a, "%s.bin", p1), copy_file(a, b);
    snprintf(a, sizeof a, "%s.mask", ps), snprintf(b, sizeof b, "%s.mask", mm), copy_file(a, b);
    CHECK(cllm_loader_open(&bad, &o) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "does not belong"),
          "stale mask refused: %s", cllm_last_error());
    remove(b);
    snprintf(b, sizeof b, "%s.bin", mm);
    FILE *tb = fopen(b, "r+b");
    if (tb) {
        fseek(tb, 0, SEEK_END);
        long sz = ftell(tb);
        fclose(tb);
        CHECK(truncate(b, sz - 2) == 0, "truncate");
    }
    CHECK(cllm_loader_open(&bad, &o) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "runs past the end of the .bin"),
          "short .bin refused: %s", cllm_last_error());
    snprintf(b, sizeof b, "%s.idx", mm);
    write_file(b, "MMIDIDX\1\1 not an index");
    CHECK(cllm_loader_open(&bad, &o) == CLLM_ERR_FORMAT && strstr(cllm_last_error(), "not a Megatron MMIDIDX"),
          "bad magic refused: %s", cllm_last_error());
    cllm_loader_free(bad);

    /* A plain Megatron dataset (int32 tokens, two documents, no mask): packed
     * pretraining text, every token trained. */
    char mg[1024];
    snprintf(mg, sizeof mg, "%s/megatron", g_tmp);
    unsigned char idx[34 + 12 * 3 + 8 * 3];
    memcpy(idx, "MMIDIDX\0\0", 9);
    cllm_put_u64(idx + 9, 1);
    idx[17] = 4;
    cllm_put_u64(idx + 18, 3);
    cllm_put_u64(idx + 26, 3);
    const int32_t lens[3] = {3, 2, 4};
    const int64_t ptr[3] = {0, 12, 20}, docs[3] = {0, 2, 3};
    for (int i = 0; i < 3; i++) {
        cllm_put_u32(idx + 34 + 4 * i, (uint32_t)lens[i]);
        cllm_put_u64(idx + 46 + 8 * i, (uint64_t)ptr[i]);
        cllm_put_u64(idx + 70 + 8 * i, (uint64_t)docs[i]);
    }
    snprintf(b, sizeof b, "%s.idx", mg);
    FILE *fi = fopen(b, "wb");
    fwrite(idx, 1, sizeof idx, fi);
    fclose(fi);
    snprintf(b, sizeof b, "%s.bin", mg);
    fi = fopen(b, "wb");
    for (int i = 0; i < 9; i++) {
        unsigned char v[4];
        cllm_put_u32(v, (uint32_t)(70000 + i));
        fwrite(v, 1, 4, fi);
    }
    fclose(fi);
    cllm_loader *ml = NULL;
    cllm_loader_opts mo = {.spec = mg, .seq_len = 5, .vocab_size = 80000};
    CHECK(cllm_loader_open(&ml, &mo) == CLLM_OK && cllm_loader_size(ml) == 2, "megatron int32: %s",
          cllm_last_error());
    int32_t tm[5], lm[5];
    long nm = 0;
    if (ml) {
        cllm_loader_get(ml, 1, tm, lm, &nm);
        CHECK(tm[0] == 70004 && tm[4] == 70008 && lm[0] == 70004 && nm == 5, "second window starts at token 4");
    }
    cllm_loader_free(ml);
    ml = NULL;
    mo.vocab_size = 70005;
    CHECK(cllm_loader_open(&ml, &mo) == CLLM_OK, "open");
    CHECK(ml && cllm_loader_get(ml, 1, tm, lm, &nm) == CLLM_ERR_FORMAT &&
              strstr(cllm_last_error(), "outside the vocabulary"),
          "ids checked against the vocabulary: %s", cllm_last_error());
    cllm_loader_free(ml);
    ml = NULL;
    /* Split by documents: 2 documents, 1,1 -> the second is sequences [2,3). */
    mo.vocab_size = 80000;
    mo.split = "valid";
    mo.splits = "1,1";
    CHECK(cllm_loader_open(&ml, &mo) == CLLM_OK && cllm_loader_size(ml) == 1, "megatron split: %s",
          cllm_last_error());
    if (ml) {
        cllm_loader_get(ml, 0, tm, lm, &nm);
        CHECK(tm[0] == 70005 && tm[3] == 70008 && lm[4] == -100, "valid = document 1, padded");
    }
    cllm_loader_free(ml);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test_data <fixtures/hf> <tests/data> <scratch dir>\n");
        return 2;
    }
    g_hf = argv[1];
    g_data = argv[2];
    g_tmp = argv[3];
    mkdir(g_tmp, 0755);
    cllm_log_set_level(CLLM_LOG_ERROR);
    if (cllm_tokenizer_load(&g_gpt2, path_in(g_hf, "gpt2")) ||
        cllm_tokenizer_load(&g_llama, path_in(g_hf, "tinyllama-1.1b-chat-v1.0"))) {
        fprintf(stderr, "%s\n", cllm_last_error());
        return 1;
    }
    test_seed_formats(g_gpt2, false);
    test_seed_formats(g_llama, true);
    test_other_formats();
    test_template_file();
    test_bad_data();
    test_loader_raw();
    test_blend_rule();
    test_loader_blend();
    test_prepared();
    cllm_tokenizer_free(g_gpt2);
    cllm_tokenizer_free(g_llama);
    return check_summary();
}
