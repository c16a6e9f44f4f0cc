/*
 * cllm eval: mean loss and perplexity of a model over one epoch of the
 * loader's samples (any --data spec, see cllm/loader.h), in data order, B
 * rows at a time. Prints one JSON
 * line {"loss": ..., "ppl": ..., "tokens": ...}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "args.h"
#include "batch.h"
#include "cllm/checkpoint.h"
#include "cllm/loader.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "commands.h"
#include "quant_flags.h"

int cmd_eval(int argc, char **argv) {
    const char *model_dir, *data_path, *tok_dir, *split, *prec_name, *weights, *adapter;
    int B, T, skip_bad;
    quant_flags qf = {0};
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder, checkpoint folder, or a training output folder (its latest checkpoint)"},
        {"data", ARG_STR, &data_path, NULL, true,
         "prepared PREFIX, .json/.jsonl/.txt file or blend \"W1 SPEC1 W2 SPEC2\" (docs/data.md)"},
        {"tokenizer", ARG_STR, &tok_dir, NULL, false, "tokenizer folder for raw text (default: the --model folder)"},
        {"split", ARG_STR, &split, NULL, false, "train, valid or test (weights stored by data prepare --split)"},
        {"skip-bad", ARG_INT, &skip_bad, "0", false, "skip up to N bad records of raw data files"},
        {"seq-len", ARG_INT, &T, "128", false, "tokens per row (longer samples are truncated, shorter padded)"},
        {"batch-size", ARG_INT, &B, "8", false, "rows per forward pass"},
        {"precision", ARG_STR, &prec_name, "fp32", false, "matmul precision: fp32, bf16 or fp16"},
        {"weights", ARG_STR, &weights, NULL, false, "fp32, bf16, int8 (Q8_0 blocks) or q4 (Q4_0 blocks) weights (default: as stored)"},
        {"adapter", ARG_STR, &adapter, NULL, false, "PEFT LoRA adapter folder applied to the model (docs/lora.md)"},
        QUANT_FLAG_SPECS(qf),
    };
    int rc = args_parse("eval", "Reports the mean loss and perplexity of a model on data.", argc, argv, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    cllm_loader *d = NULL;
    tool_batch b = {0};
    /* a run folder (OUTPUT_DIR with a `latest` pointer and no model of its
     * own yet) means its newest checkpoint; a checkpoint folder is an HF
     * folder already. ckpt lives until the end: model_dir may point to it. */
    char *ckpt = NULL, cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model_dir);
    if (access(cfg_path, F_OK) != 0 && cllm_ckpt_find(model_dir, "auto", &ckpt) == CLLM_OK && ckpt) {
        if (cllm_ckpt_verify(ckpt)) {
            rc = tool_fail("eval");
            goto done;
        }
        model_dir = ckpt;
    }
    cllm_precision prec;
    if (!cllm_precision_from_name(prec_name, &prec)) {
        fprintf(stderr, "cllm eval: --precision must be fp32, bf16 or fp16, got '%s'\n", prec_name);
        rc = 2;
        goto done;
    }
    if ((quant_flags_any(&qf) ? quant_flags_load(&qf, &m, model_dir, weights)
                              : cllm_ckpt_load_model_weights(&m, model_dir, weights)) ||
        cllm_model_set_precision(m, prec) ||
        (adapter && cllm_lora_load(m, adapter)) || cllm_model_set_inference(m)) { /* an HF folder or either checkpoint format */
        rc = tool_fail("eval");
        goto done;
    }
    if ((rc = tool_check_shape("eval", m, B, T))) goto done;
    cllm_loader_opts lo = {.spec = data_path, .tokenizer = tok_dir ? tok_dir : model_dir, .seq_len = T,
                           .vocab_size = cllm_model_get_config(m)->vocab_size, .split = split,
                           .skip_bad = skip_bad};
    if (cllm_loader_open(&d, &lo) || cllm_model_prepare(m, B, T, false)) {
        rc = tool_fail("eval");
        goto done;
    }
    if (tool_batch_init(&b, B, T)) {
        fprintf(stderr, "cllm eval: out of memory\n");
        rc = 1;
        goto done;
    }
    double total = 0, aux_total = 0; /* aux: Mixtral's load-balancing loss, per counted target */
    long count = 0;
    uint64_t n = cllm_loader_size(d);
    for (uint64_t i = 0; i < n; i += (uint64_t)B) {
        int rows = n - i < (uint64_t)B ? (int)(n - i) : B;
        if (tool_batch_fill_loader(&b, d, i, rows) < 0) {
            rc = tool_fail("eval");
            goto done;
        }
        double sum;
        long k;
        if (cllm_model_forward_backward(m, b.tokens, b.targets, rows, T, false, 0, &sum, &k)) {
            rc = tool_fail("eval");
            goto done;
        }
        total += sum;
        count += k;
        aux_total += cllm_model_aux_loss(m) * (double)k;
    }
    if (count == 0) {
        fprintf(stderr, "cllm eval: %s has no target tokens (every label is -100 or samples have one token)\n",
                data_path);
        rc = 1;
        goto done;
    }
    double loss = total / (double)count;
    const cllm_model_config *mc = cllm_model_get_config(m);
    if (mc->n_experts) {
        /* Mixtral: "loss" is HF's outputs.loss (cross-entropy plus the scaled
         * load-balancing loss when output_router_logits is set); both parts
         * are reported, and the perplexity is the cross-entropy's */
        double aux = aux_total / (double)count, ce = loss - (mc->router_aux ? mc->router_aux_coef * aux : 0);
        printf("{\"loss\": %.9g, \"ppl\": %.9g, \"tokens\": %ld, \"ce_loss\": %.9g, \"aux_loss\": %.9g, "
               "\"router_aux_loss_coef\": %.9g, \"aux_in_loss\": %s}\n",
               loss, exp(ce), count, ce, aux, (double)mc->router_aux_coef, mc->router_aux ? "true" : "false");
    } else {
        printf("{\"loss\": %.9g, \"ppl\": %.9g, \"tokens\": %ld}\n", loss, exp(loss), count);
    }
done:
    free(ckpt);
    tool_batch_free(&b);
    cllm_loader_free(d);
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
