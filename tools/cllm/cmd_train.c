/*
 * cllm train: the minimal training loop. Each step takes B samples from the
 * loader (cllm/loader.h: sample g = step*B + row; in data order with
 * --no-shuffle, else from a seeded per-epoch permutation), runs
 * forward and backward with the loss averaged over counted targets, clips
 * the global gradient norm, and applies the optimizer at a constant learning
 * rate. The model is written to --out as an HF folder at the end, with
 * metrics.jsonl (one JSON object per step). Nothing is written if the run
 * fails before the end.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "batch.h"
#include "cllm/loader.h"
#include "cllm/io.h"
#include "cllm/model.h"
#include "cllm/optim.h"
#include "commands.h"

/* Appends one formatted line to a growing text buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} text_buf;

static int text_appendf(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int text_appendf(text_buf *t, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->len + (size_t)n + 1) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) return -1;
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, line, (size_t)n);
    t->len += (size_t)n;
    t->p[t->len] = '\0';
    return 0;
}

int cmd_train(int argc, char **argv) {
    const char *model_dir, *data_path, *out, *opt_name, *shard, *tok_dir, *split;
    int B, T, steps, log_every, skip_bad;
    double lr, wd, clip;
    long long seed;
    bool no_shuffle;
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder to start from"},
        {"data", ARG_STR, &data_path, NULL, true,
         "prepared PREFIX, .json/.jsonl/.txt file or blend \"W1 SPEC1 W2 SPEC2\" (docs/data.md)"},
        {"tokenizer", ARG_STR, &tok_dir, NULL, false, "tokenizer folder for raw text (default: the --model folder)"},
        {"split", ARG_STR, &split, NULL, false, "train, valid or test (weights stored by data prepare --split)"},
        {"skip-bad", ARG_INT, &skip_bad, "0", false, "skip up to N bad records of raw data files"},
        {"out", ARG_STR, &out, NULL, true, "output folder for the trained model and metrics.jsonl"},
        {"optimizer", ARG_STR, &opt_name, "adamw", false, "sgd, adam, adamw or lion"},
        {"lr", ARG_F64, &lr, "1e-3", false, "learning rate (constant)"},
        {"steps", ARG_INT, &steps, NULL, true, "optimizer steps"},
        {"batch-size", ARG_INT, &B, "8", false, "samples per step"},
        {"seq-len", ARG_INT, &T, "128", false, "tokens per sample (longer truncated, shorter padded)"},
        {"no-shuffle", ARG_FLAG, &no_shuffle, NULL, false, "take samples in file order (sample i -> step i/B, row i%B)"},
        {"weight-decay", ARG_F64, &wd, "0", false, "weight decay (not applied to biases and norm weights)"},
        {"grad-clip", ARG_F64, &clip, "0", false, "clip the global gradient L2 norm to this value (0 = off)"},
        {"seed", ARG_I64, &seed, "42", false, "seed for data shuffling"},
        {"log-every", ARG_INT, &log_every, "1", false, "print a progress line every N steps"},
        {"max-shard-size", ARG_STR, &shard, "0", false, "shard the saved safetensors (e.g. 2GB); 0 = one file"},
    };
    int rc = args_parse("train", "Trains a model with a minimal loop (constant learning rate).", argc, argv, specs,
                        ARGS_COUNT(specs));
    if (rc) return rc == 1 ? 0 : rc;
    cllm_model *m = NULL;
    cllm_loader *d = NULL;
    cllm_optimizer *opt = NULL;
    cllm_param_range *ranges = NULL;
    tool_batch b = {0};
    size_t max_shard = 0;
    text_buf metrics = {0};

    cllm_opt_type ot = cllm_opt_from_name(opt_name);
    if (ot == CLLM_OPT_COUNT) {
        fprintf(stderr, "cllm train: --optimizer: unknown optimizer '%s' (sgd, adam, adamw, lion)\n", opt_name);
        rc = 2;
        goto done;
    }
    if (steps <= 0 || !(lr > 0) || wd < 0 || clip < 0 || log_every <= 0) {
        fprintf(stderr, "cllm train: --steps and --lr must be positive, --weight-decay and --grad-clip non-negative\n");
        rc = 2;
        goto done;
    }
    if (cllm_parse_size(shard, &max_shard)) {
        fprintf(stderr, "cllm train: --max-shard-size: %s\n", cllm_last_error());
        rc = 2;
        goto done;
    }
    if (cllm_model_load(&m, model_dir)) {
        rc = tool_fail("train");
        goto done;
    }
    if ((rc = tool_check_shape("train", m, B, T))) goto done;
    cllm_loader_opts lo = {.spec = data_path, .tokenizer = tok_dir ? tok_dir : model_dir, .seq_len = T,
                           .vocab_size = cllm_model_get_config(m)->vocab_size, .shuffle = !no_shuffle,
                           .seed = (uint64_t)seed, .split = split, .skip_bad = skip_bad};
    if (cllm_loader_open(&d, &lo) || cllm_model_prepare(m, B, T, true)) {
        rc = tool_fail("train");
        goto done;
    }
    cllm_optim_params op = cllm_optim_defaults(ot);
    op.lr = lr;
    op.weight_decay = wd;
    int nt = cllm_model_n_tensors(m);
    ranges = calloc((size_t)nt, sizeof *ranges);
    if (!ranges || tool_batch_init(&b, B, T) ||
        cllm_optim_init(&opt, &op, cllm_model_buffer_len(m))) {
        fprintf(stderr, "cllm train: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        ranges[i] = (cllm_param_range){t->offset, t->offset + t->numel, !t->no_decay};
    }
    double flops = cllm_model_train_flops(m, B, T);
    fprintf(stderr, "cllm train: %zu parameters, %zu samples, %d steps of %d x %d tokens, %s lr %g\n",
            cllm_model_n_params(m), (size_t)cllm_loader_size(d), steps, B, T, cllm_opt_name(ot), lr);
    double t_start = cllm_time_sec();
    for (int step = 1; step <= steps; step++) {
        double t0 = cllm_time_sec();
        long counted = tool_batch_fill_loader(&b, d, (uint64_t)(step - 1) * (uint64_t)B, B);
        if (counted < 0) {
            rc = tool_fail("train");
            goto done;
        }
        cllm_model_zero_grads(m);
        double sum = 0;
        long k = 0;
        if (counted > 0 &&
            cllm_model_forward_backward(m, b.tokens, b.targets, B, T, true, 1.0f / (float)counted, &sum, &k)) {
            rc = tool_fail("train");
            goto done;
        }
        double loss = k ? sum / (double)k : 0.0;
        double gnorm = cllm_grad_clip(cllm_model_grads(m), cllm_model_buffer_len(m), clip);
        if (!isfinite(loss) || !isfinite(gnorm)) {
            fprintf(stderr, "cllm train: step %d: non-finite loss or gradient (loss %g, grad norm %g); stopping\n",
                    step, loss, gnorm);
            rc = 1;
            goto done;
        }
        if (k) cllm_optim_step(opt, cllm_model_params(m), cllm_model_grads(m), ranges, nt, lr);
        double dt = cllm_time_sec() - t0;
        double tps = (double)B * T / dt;
        if (text_appendf(&metrics,
                         "{\"step\": %d, \"loss\": %.9g, \"lr\": %g, \"grad_norm\": %.9g, \"tokens\": %ld, "
                         "\"step_time\": %.6f, \"tokens_per_sec\": %.1f, \"gflops\": %.2f}\n",
                         step, loss, lr, gnorm, k, dt, tps, flops / dt * 1e-9)) {
            fprintf(stderr, "cllm train: out of memory\n");
            rc = 1;
            goto done;
        }
        if (step % log_every == 0 || step == steps)
            fprintf(stderr, "step %5d/%d | loss %.4f | grad norm %.3f | %.0f tok/s | %.1f GFLOP/s\n", step, steps, loss,
                    gnorm, tps, flops / dt * 1e-9);
    }
    fprintf(stderr, "cllm train: %d steps in %.1f s\n", steps, cllm_time_sec() - t_start);
    if (cllm_model_save(m, out, max_shard)) {
        rc = tool_fail("train");
        goto done;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    if (cllm_write_file_atomic(path, metrics.p, metrics.len)) {
        rc = tool_fail("train");
        goto done;
    }
    fprintf(stderr, "cllm train: wrote %s\n", out);
done:
    free(metrics.p);
    free(ranges);
    tool_batch_free(&b);
    cllm_optim_free(opt);
    cllm_loader_free(d);
    cllm_model_free(m);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
