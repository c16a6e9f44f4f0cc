/*
 * cllm eval: mean loss and perplexity of a model over every sample of a
 * pre-tokenized JSONL file, in file order, B rows at a time. Prints one JSON
 * line {"loss": ..., "ppl": ..., "tokens": ...}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "args.h"
#include "batch.h"
#include "cllm/checkpoint.h"
#include "cllm/data.h"
#include "cllm/model.h"
#include "commands.h"

int cmd_eval(int argc, char **argv) {
    const char *model_dir, *data_path;
    int B, T;
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder, checkpoint folder, or a training output folder (its latest checkpoint)"},
        {"data", ARG_STR, &data_path, NULL, true, "pre-tokenized JSONL ({\"input_ids\": [...], \"labels\": [...]})"},
        {"seq-len", ARG_INT, &T, "128", false, "tokens per row (longer samples are truncated, shorter padded)"},
        {"batch-size", ARG_INT, &B, "8", false, "rows per forward pass"},
    };
    int rc = args_parse("eval", "Reports the mean loss and perplexity of a model on data.", argc, argv, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    cllm_dataset *d = NULL;
    tool_batch b = {0};
    size_t *idx = NULL;
    /* a run folder (OUTPUT_DIR with a `latest` pointer and no model of its
     * own yet) means its newest checkpoint; a checkpoint folder is an HF
     * folder already */
    char *ckpt = NULL, cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model_dir);
    if (access(cfg_path, F_OK) != 0 && cllm_ckpt_find(model_dir, "auto", &ckpt) == CLLM_OK && ckpt) {
        if (cllm_ckpt_verify(ckpt)) {
            free(ckpt);
            return tool_fail("eval");
        }
        model_dir = ckpt;
    }
    cllm_status lst = cllm_model_load(&m, model_dir);
    free(ckpt);
    if (lst) return tool_fail("eval");
    if ((rc = tool_check_shape("eval", m, B, T))) goto done;
    if (cllm_dataset_load_jsonl(&d, data_path, cllm_model_get_config(m)->vocab_size) ||
        cllm_model_prepare(m, B, T, false)) {
        rc = tool_fail("eval");
        goto done;
    }
    idx = malloc((size_t)B * sizeof *idx);
    if (!idx || tool_batch_init(&b, B, T)) {
        fprintf(stderr, "cllm eval: out of memory\n");
        rc = 1;
        goto done;
    }
    double total = 0;
    long count = 0;
    size_t n = cllm_dataset_count(d);
    for (size_t i = 0; i < n; i += (size_t)B) {
        int rows = n - i < (size_t)B ? (int)(n - i) : B;
        for (int r = 0; r < rows; r++) idx[r] = i + (size_t)r;
        tool_batch_fill(&b, d, idx, rows, 0);
        double sum;
        long k;
        if (cllm_model_forward_backward(m, b.tokens, b.targets, rows, T, false, 0, &sum, &k)) {
            rc = tool_fail("eval");
            goto done;
        }
        total += sum;
        count += k;
    }
    if (count == 0) {
        fprintf(stderr, "cllm eval: %s has no target tokens (every label is -100 or samples have one token)\n",
                data_path);
        rc = 1;
        goto done;
    }
    double loss = total / (double)count;
    printf("{\"loss\": %.9g, \"ppl\": %.9g, \"tokens\": %ld}\n", loss, exp(loss), count);
done:
    free(idx);
    tool_batch_free(&b);
    cllm_dataset_free(d);
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
