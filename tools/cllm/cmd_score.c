/*
 * cllm score: the rewards a reward model (an HF *ForSequenceClassification
 * folder with one label, written by `cllm train --task reward` or by
 * transformers) gives to the records of a .json/.jsonl file, one JSON line
 * per record:
 *   preference pairs (any format `cllm train --task reward` reads)
 *       {"index": i, "chosen_reward": r_c, "rejected_reward": r_r,
 *        "margin": r_c - r_r, "correct": r_c > r_r}
 *   single texts: {"text"}, {"prompt", "completion"} or {"input_ids"}
 *       {"index": i, "reward": r}
 * A text is tokenized as a pair's row is (BOS where the tokenizer adds it,
 * the text, EOS), and scored at its last non-padding token, as HF's
 * *ForSequenceClassification does. Rows keep their last --seq-len tokens.
 * A summary (pairwise accuracy, mean rewards) goes to stderr. --adapter
 * applies a reward model's LoRA adapter (PEFT task_type SEQ_CLS: the
 * adapters and the trained score head) to --model, a reward model or the
 * causal LM it was made from, as PEFT's PeftModel does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cllm/checkpoint.h"
#include "cllm/io.h"
#include "cllm/loader.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/objective.h"
#include "commands.h"

typedef struct {
    char *p;
    size_t n, cap;
} text_buf;

static int append(text_buf *b, const char *line) {
    size_t k = strlen(line);
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->n + k + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, line, k + 1);
    b->n += k;
    return 0;
}

int cmd_score(int argc, char **argv) {
    const char *model_dir, *data_path, *tok_dir, *out_path, *prec_name, *adapter;
    int B, T;
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "reward model: an HF *ForSequenceClassification folder (num_labels 1) or a checkpoint of one"},
        {"data", ARG_STR, &data_path, NULL, true,
         ".json/.jsonl records: preference pairs, or {\"text\"}, {\"prompt\", \"completion\"}, {\"input_ids\"}"},
        {"tokenizer", ARG_STR, &tok_dir, NULL, false, "tokenizer folder for text records (default: the --model folder)"},
        {"out", ARG_STR, &out_path, NULL, false, "write the JSON lines to this file (atomically) instead of stdout"},
        {"seq-len", ARG_INT, &T, "512", false, "tokens per row (longer records keep their last tokens)"},
        {"batch-size", ARG_INT, &B, "8", false, "records per forward pass"},
        {"precision", ARG_STR, &prec_name, "fp32", false, "matmul precision: fp32, bf16 or fp16"},
        {"adapter", ARG_STR, &adapter, NULL, false,
         "PEFT LoRA adapter folder of a reward model (task_type SEQ_CLS, written by cllm train --task reward with "
         "LoRA); --model may then be the causal LM it was trained from"},
    };
    int rc = args_parse("score", "Scores records with a reward model: one JSON line per record.", argc, argv, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    cllm_loader *d = NULL;
    int32_t *tokens = NULL, *labels = NULL, *targets = NULL, *pos = NULL;
    float *scores = NULL;
    text_buf out = {0};
    cllm_precision prec;
    if (!cllm_precision_from_name(prec_name, &prec)) {
        fprintf(stderr, "cllm score: --precision must be fp32, bf16 or fp16, got '%s'\n", prec_name);
        rc = 2;
        goto done;
    }
    if (B < 1 || T < 2) {
        fprintf(stderr, "cllm score: --batch-size must be >= 1 and --seq-len >= 2\n");
        rc = 2;
        goto done;
    }
    if (cllm_ckpt_load_model(&m, model_dir) || cllm_model_set_precision(m, prec) ||
        (adapter && (cllm_lora_load_model(&m, adapter, 0) || cllm_model_set_inference(m)))) {
        rc = tool_fail("score");
        goto done;
    }
    const cllm_model_config *mc = cllm_model_get_config(m);
    if (mc->num_labels != 1) {
        fprintf(stderr, "cllm score: %s is a causal LM, not a reward model (config.json's architectures must name a "
                "*ForSequenceClassification with one label; train one with cllm train --task reward)\n", model_dir);
        rc = 1;
        goto done;
    }
    if (mc->n_ctx > 0 && T > mc->n_ctx) T = mc->n_ctx;
    cllm_loader_opts lo = {.spec = data_path, .tokenizer = tok_dir ? tok_dir : model_dir, .seq_len = T,
                           .vocab_size = mc->vocab_size, .pairs = true, .singles = true};
    if (cllm_loader_open(&d, &lo) || cllm_model_prepare(m, 2 * B, T, false)) {
        rc = tool_fail("score");
        goto done;
    }
    size_t nt = (size_t)2 * (size_t)B * (size_t)T;
    tokens = malloc(nt * sizeof *tokens);
    labels = malloc(nt * sizeof *labels);
    targets = malloc(nt * sizeof *targets);
    pos = malloc((size_t)2 * (size_t)B * sizeof *pos);
    scores = malloc((size_t)2 * (size_t)B * sizeof *scores);
    if (!tokens || !labels || !targets || !pos || !scores) {
        fprintf(stderr, "cllm score: out of memory\n");
        rc = 1;
        goto done;
    }
    uint64_t n = cllm_loader_size(d); /* rows: two per record */
    long n_pairs = 0, n_single = 0, n_correct = 0;
    double sum_c = 0, sum_r = 0, sum_single = 0;
    for (uint64_t g0 = 0; g0 < n; g0 += (uint64_t)(2 * B)) {
        int rows = n - g0 < (uint64_t)(2 * B) ? (int)(n - g0) : 2 * B;
        for (int r = 0; r < rows; r++)
            if (cllm_loader_get(d, g0 + (uint64_t)r, tokens + (size_t)r * T, labels + (size_t)r * T, NULL)) {
                rc = tool_fail("score");
                goto done;
            }
        cllm_model_make_targets(targets, labels, rows, T);
        if (cllm_reward_positions(m, tokens, targets, rows, T, pos)) {
            rc = tool_fail("score");
            goto done;
        }
        cllm_token_io io;
        memset(&io, 0, sizeof io);
        io.score_pos = pos;
        io.scores = scores;
        double s = 0;
        long k = 0;
        if (cllm_model_forward_backward_ex(m, tokens, targets, rows, T, false, 0.0f, &io, &s, &k)) {
            rc = tool_fail("score");
            goto done;
        }
        for (int i = 0; i < rows / 2; i++) {
            float margin;
            bool single = false;
            long idx = (long)((g0 + (uint64_t)(2 * i)) / 2);
            if (cllm_loader_pair_info(d, g0 + (uint64_t)(2 * i), &margin, &single)) {
                rc = tool_fail("score");
                goto done;
            }
            double rc_ = scores[2 * i], rr = scores[2 * i + 1];
            if (single) {
                n_single++;
                sum_single += rc_;
            } else {
                n_pairs++;
                sum_c += rc_;
                sum_r += rr;
                n_correct += rc_ > rr;
            }
            char line[256];
            if (single)
                snprintf(line, sizeof line, "{\"index\": %ld, \"reward\": %.9g}\n", idx, rc_);
            else
                snprintf(line, sizeof line, "{\"index\": %ld, \"chosen_reward\": %.9g, \"rejected_reward\": %.9g, "
                         "\"margin\": %.9g, \"correct\": %s}\n", idx, rc_, rr, rc_ - rr, rc_ > rr ? "true" : "false");
            if (append(&out, line)) {
                fprintf(stderr, "cllm score: out of memory\n");
                rc = 1;
                goto done;
            }
        }
    }
    if (out_path) {
        if (cllm_write_file_atomic(out_path, out.p ? out.p : "", out.n)) {
            rc = tool_fail("score");
            goto done;
        }
    } else if (out.n) {
        fwrite(out.p, 1, out.n, stdout);
    }
    if (n_pairs)
        fprintf(stderr, "cllm score: %ld pairs: accuracy %.4f, mean chosen reward %.6g, mean rejected reward %.6g, "
                "mean margin %.6g\n", n_pairs, (double)n_correct / (double)n_pairs, sum_c / (double)n_pairs,
                sum_r / (double)n_pairs, (sum_c - sum_r) / (double)n_pairs);
    if (n_single)
        fprintf(stderr, "cllm score: %ld texts: mean reward %.6g\n", n_single, sum_single / (double)n_single);
done:
    free(out.p);
    free(tokens);
    free(labels);
    free(targets);
    free(pos);
    free(scores);
    cllm_loader_free(d);
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
