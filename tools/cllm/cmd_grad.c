/*
 * cllm grad: loss and parameter gradients of the first B samples of a data
 * file (file order), for checking the model against a reference. Prints
 * {"loss": mean, "tokens": counted} and writes every gradient as F32 under
 * its parameter's HF name (a tied head's gradient is part of the
 * embedding's). --grad-ckpt runs the same batch with activation
 * checkpointing (the gradients must not change). --precision bf16|fp16
 * runs the matmuls in that precision; --logits-out also writes the logits
 * of the last position of each row ("logits", F32 [rows,V]). --adapter
 * loads a PEFT LoRA adapter folder onto the model: the base is frozen and
 * the gradients written are those of the trainable views (lora_A, lora_B,
 * trained biases and modules_to_save) under their PEFT names.
 * --load-in-4bit / --load-in-8bit (with --adapter) quantize the base's
 * linear layers as QLoRA does (docs/lora.md#qlora).
 */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "batch.h"
#include "cllm/data.h"
#include "cllm/io.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "commands.h"
#include "quant_flags.h"

int cmd_grad(int argc, char **argv) {
    const char *model_dir, *data_path, *out, *prec_name, *logits_out, *adapter;
    int B, T;
    bool grad_ckpt = false;
    quant_flags qf = {0};
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder"},
        {"data", ARG_STR, &data_path, NULL, true, "pre-tokenized JSONL"},
        {"seq-len", ARG_INT, &T, "128", false, "tokens per row"},
        {"batch-size", ARG_INT, &B, "8", false, "rows (the first B samples)"},
        {"out", ARG_STR, &out, NULL, true, "safetensors file to write the gradients to"},
        {"grad-ckpt", ARG_FLAG, &grad_ckpt, NULL, false,
         "activation checkpointing: keep block inputs only, recompute in backward (same gradients)"},
        {"precision", ARG_STR, &prec_name, "fp32", false, "matmul precision: fp32, bf16 or fp16"},
        {"logits-out", ARG_STR, &logits_out, NULL, false, "safetensors file for the last position's logits"},
        {"adapter", ARG_STR, &adapter, NULL, false, "PEFT LoRA adapter folder: gradients of its tensors only"},
        QUANT_FLAG_SPECS(qf),
    };
    int rc = args_parse("grad", "Computes loss and parameter gradients for one batch.", argc, argv, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    cllm_dataset *d = NULL;
    tool_batch b = {0};
    size_t *idx = NULL;
    cllm_st_entry *e = NULL;
    float *logits = NULL;
    cllm_precision prec;
    if (!cllm_precision_from_name(prec_name, &prec)) {
        fprintf(stderr, "cllm grad: --precision must be fp32, bf16 or fp16, got '%s'\n", prec_name);
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    if (quant_flags_any(&qf) && !adapter) {
        fprintf(stderr, "cllm grad: a quantized base (--load-in-4bit / --load-in-8bit) is frozen: give --adapter\n");
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    if (quant_flags_load(&qf, &m, model_dir, "fp32") || cllm_model_set_precision(m, prec) ||
        (adapter && cllm_lora_load(m, adapter))) {
        cllm_model_free(m);
        args_free(specs, ARGS_COUNT(specs));
        return tool_fail("grad");
    }
    if ((rc = tool_check_shape("grad", m, B, T))) goto done;
    cllm_model_set_recompute(m, grad_ckpt);
    if (cllm_dataset_load_jsonl(&d, data_path, cllm_model_get_config(m)->vocab_size) ||
        cllm_model_prepare(m, B, T, true)) {
        rc = tool_fail("grad");
        goto done;
    }
    int rows = cllm_dataset_count(d) < (size_t)B ? (int)cllm_dataset_count(d) : B;
    idx = malloc((size_t)B * sizeof *idx);
    if (!idx || tool_batch_init(&b, B, T)) {
        fprintf(stderr, "cllm grad: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int r = 0; r < rows; r++) idx[r] = (size_t)r;
    long counted = tool_batch_fill(&b, d, idx, rows, 0);
    if (counted == 0) {
        fprintf(stderr, "cllm grad: the batch has no target tokens\n");
        rc = 1;
        goto done;
    }
    double sum;
    long k;
    cllm_model_zero_grads(m);
    if (cllm_model_forward_backward(m, b.tokens, b.targets, rows, T, true, 1.0f / (float)counted, &sum, &k)) {
        rc = tool_fail("grad");
        goto done;
    }
    int nt = cllm_model_n_trainable(m);
    e = calloc((size_t)nt, sizeof *e);
    if (!e) {
        rc = 1;
        goto done;
    }
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *t = cllm_model_trainable(m, i);
        e[i] = (cllm_st_entry){.name = t->name, .dtype = CLLM_F32, .ndim = t->ndim,
                               .shape = {t->shape[0], t->shape[1]}, .data = cllm_model_grads(m) + t->offset};
    }
    if (cllm_st_save(out, e, nt)) {
        rc = tool_fail("grad");
        goto done;
    }
    if (logits_out) {
        int V = cllm_model_get_config(m)->vocab_size;
        logits = malloc((size_t)rows * (size_t)V * sizeof *logits);
        if (!logits) {
            fprintf(stderr, "cllm grad: out of memory\n");
            rc = 1;
            goto done;
        }
        cllm_st_entry le = {.name = "logits", .dtype = CLLM_F32, .ndim = 2, .shape = {rows, V}, .data = logits};
        if (cllm_model_forward_logits(m, b.tokens, rows, T, logits) || cllm_st_save(logits_out, &le, 1)) {
            rc = tool_fail("grad");
            goto done;
        }
    }
    if (cllm_model_get_config(m)->n_experts) /* Mixtral: the load-balancing loss too (in "loss" when configured) */
        printf("{\"loss\": %.9g, \"tokens\": %ld, \"aux_loss\": %.9g}\n", sum / (double)k, k, cllm_model_aux_loss(m));
    else
        printf("{\"loss\": %.9g, \"tokens\": %ld}\n", sum / (double)k, k);
done:
    free(logits);
    free(e);
    free(idx);
    tool_batch_free(&b);
    cllm_dataset_free(d);
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
