/*
 * cllm generate: continue a prompt with a model, streaming the text to
 * stdout as tokens are produced.
 *
 *   cllm generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [flags]
 *
 * The prompt is encoded with the tokenizer (tokenizer.json in --tokenizer,
 * by default the model folder; BOS/EOS as its post-processor adds them), run
 * through the model once to fill the key/value cache, then tokens are
 * sampled one at a time until EOS (the config's eos_token_id or the
 * tokenizer's), --max-new-tokens, a --stop string, or the model's position
 * limit. Text is printed as soon as it forms whole UTF-8 characters (and
 * can no longer turn into a stop string). With --prompt-ids and no
 * tokenizer, the generated ids are printed instead, separated by spaces.
 * A summary (token counts, prefill and decode speed, why it stopped) goes to
 * stderr; with --top-n N, so does one JSON line per generated token with
 * its log-probabilities and the N most likely alternatives. Exit codes: 0
 * ok, 1 failure, 2 usage.
 *
 * The loop itself is the library's cllm_generation (cllm/generate.h); this
 * file parses flags, loads, prints.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cllm/core.h"
#include "cllm/dist.h"
#include "cllm/generate.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"
#include "commands.h"
#include "quant_flags.h"

/* Parses "1,2,3" (spaces allowed around commas) into a malloc'd array. */
static int parse_id_list(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids) return 1;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char buf[32];
        while (len && (*p == ' ' || *p == '\t')) p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        int v;
        if (len == 0 || len >= sizeof buf) return 2;
        memcpy(buf, p, len);
        buf[len] = 0;
        if (!cllm_parse_int(buf, &v)) return 2;
        (*ids)[(*n)++] = v;
        if (!end) break;
        p = end + 1;
        if (!*p) return 2; /* trailing comma */
    }
    return *n ? 0 : 2;
}

/* Parses the --logit-bias items "ID=VALUE" into malloc'd arrays; on a
 * malformed item returns its index + 1 (0 = ok, -1 = out of memory). */
static int parse_bias(const arg_list *l, int32_t **ids, float **vals) {
    *ids = malloc((size_t)(l->n ? l->n : 1) * sizeof **ids);
    *vals = malloc((size_t)(l->n ? l->n : 1) * sizeof **vals);
    if (!*ids || !*vals) return -1;
    for (int i = 0; i < l->n; i++) {
        char buf[64];
        const char *eq = strchr(l->items[i], '=');
        size_t len = eq ? (size_t)(eq - l->items[i]) : 0;
        int id;
        double v;
        if (!eq || len == 0 || len >= sizeof buf) return i + 1;
        memcpy(buf, l->items[i], len);
        buf[len] = 0;
        if (!cllm_parse_int(buf, &id) || !cllm_parse_f64(eq + 1, &v) || !(v >= -100 && v <= 100)) return i + 1;
        (*ids)[i] = id;
        (*vals)[i] = (float)v;
    }
    return 0;
}

/* With --top-n: one JSON line per generated token on stderr. */
static void print_top(const cllm_generate_event *ev) {
    fprintf(stderr, "{\"token\": %d, \"logprob\": %.9g, \"raw_logprob\": %.9g, \"top\": [", ev->token,
            (double)ev->logprob, (double)ev->raw_logprob);
    for (int i = 0; i < ev->n_top; i++)
        fprintf(stderr, "%s[%d, %.9g]", i ? ", " : "", ev->top_ids[i], (double)ev->top_logprobs[i]);
    fprintf(stderr, "]}\n");
}

static bool file_exists(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static bool write_out(const char *s, size_t n) {
    if (n && fwrite(s, 1, n, stdout) != n) return false;
    return fflush(stdout) == 0;
}

int cmd_generate(int argc, char **argv) {
    const char *model_dir, *tok_dir, *prompt, *prompt_ids, *output, *weights, *adapter, *kv_dtype_s;
    cllm_kv_dtype kv_dtype = CLLM_KV_AUTO;
    int max_new, top_k, top_n, tensor;
    double temperature, top_p, rep, typical_p, freq_pen, pres_pen;
    long long seed;
    bool greedy = false, ignore_eos = false;
    arg_list stops = {0}, bias = {0};
    quant_flags qf = {0};
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder (config.json + safetensors)"},
        {"adapter", ARG_STR, &adapter, NULL, false, "PEFT LoRA adapter folder applied to the model (docs/lora.md)"},
        QUANT_FLAG_SPECS(qf),
        {"prompt", ARG_STR, &prompt, NULL, false, "prompt text (encoded with the tokenizer)"},
        {"prompt-ids", ARG_STR, &prompt_ids, NULL, false, "prompt as comma-separated token ids, e.g. \"1,2,3\""},
        {"tokenizer", ARG_STR, &tok_dir, NULL, false, "folder with tokenizer.json (default: the model folder)"},
        {"weights", ARG_STR, &weights, NULL, false, "fp32, bf16, int8 (Q8_0 blocks) or q4 (Q4_0 blocks) weights (default: as stored)"},
        {"max-new-tokens", ARG_INT, &max_new, "64", false, "stop after this many generated tokens"},
        {"kv-cache-dtype", ARG_STR, &kv_dtype_s, "auto", false,
         "how the KV cache stores keys and values: fp32, bf16, or auto (bf16 for bf16 / int8 / q4 weights, fp32 "
         "for fp32)"},
        {"temperature", ARG_F64, &temperature, "1.0", false, "divide logits by this; 0 = greedy"},
        {"top-k", ARG_INT, &top_k, "0", false, "sample among the k most likely tokens; 0 = all"},
        {"top-p", ARG_F64, &top_p, "1.0", false, "nucleus sampling: smallest set with probability >= p; 1 = off"},
        {"repetition-penalty", ARG_F64, &rep, "1.0", false, "penalise tokens already seen (HF/CTRL); 1 = off"},
        {"typical-p", ARG_F64, &typical_p, "1.0", false, "locally typical sampling with this mass (HF); 1 = off"},
        {"frequency-penalty", ARG_F64, &freq_pen, "0", false,
         "subtract count x this from the logit of each generated token (OpenAI), in [-2, 2]"},
        {"presence-penalty", ARG_F64, &pres_pen, "0", false,
         "subtract this from the logit of every token generated so far (OpenAI), in [-2, 2]"},
        {"logit-bias", ARG_LIST, &bias, NULL, false,
         "ID=VALUE (repeatable): add VALUE in [-100, 100] to token ID's logit before anything else"},
        {"top-n", ARG_INT, &top_n, "0", false,
         "print each token's N most likely alternatives (raw model) as JSON lines on stderr; 0..20"},
        {"seed", ARG_I64, &seed, "0", false, "random seed for sampling"},
        {"greedy", ARG_FLAG, &greedy, NULL, false, "always take the most likely token"},
        {"ignore-eos", ARG_FLAG, &ignore_eos, NULL, false, "keep generating past EOS (benchmarks)"},
        {"stop", ARG_LIST, &stops, NULL, false,
         "stop strings (repeatable): the text ends right before the first one generated (needs a tokenizer)"},
        {"output", ARG_STR, &output, "auto", false, "text, ids, or auto (text when a tokenizer is available)"},
        {"tensor", ARG_INT, &tensor, "1", false,
         "tensor-parallel ranks: under mpirun -np N each rank holds 1/N of the weights (HF folder)"},
    };
    const char *summary = "Continue a prompt with a model, streaming text to stdout.";
    int rc = args_parse("generate", summary, argc, argv, specs, ARGS_COUNT(specs));
    if (rc) {
        args_free(specs, ARGS_COUNT(specs));
        return rc == 1 ? 0 : 2;
    }

    const char *usage_err = NULL;
    if (!prompt == !prompt_ids) usage_err = "give exactly one of --prompt and --prompt-ids";
    else if (max_new < 0) usage_err = "--max-new-tokens must be >= 0";
    else if (!(temperature >= 0) || temperature > 1e30) usage_err = "--temperature must be >= 0 (0 = greedy)";
    else if (top_k < 0) usage_err = "--top-k must be >= 0 (0 = off)";
    else if (!(top_p > 0 && top_p <= 1)) usage_err = "--top-p must be in (0, 1]";
    else if (!(rep > 0) || rep > 1e30) usage_err = "--repetition-penalty must be > 0 (1 = off)";
    else if (!(typical_p >= 0 && typical_p <= 1)) usage_err = "--typical-p must be in [0, 1] (1 = off)";
    else if (!(freq_pen >= -2 && freq_pen <= 2)) usage_err = "--frequency-penalty must be in [-2, 2]";
    else if (!(pres_pen >= -2 && pres_pen <= 2)) usage_err = "--presence-penalty must be in [-2, 2]";
    else if (top_n < 0 || top_n > CLLM_MAX_TOP_N) usage_err = "--top-n must be in [0, 20]";
    else if (strcmp(output, "auto") && strcmp(output, "text") && strcmp(output, "ids"))
        usage_err = "--output must be text, ids or auto";
    else if (cllm_kv_dtype_parse(kv_dtype_s, &kv_dtype)) usage_err = "--kv-cache-dtype must be auto, fp32 or bf16";
    for (int i = 0; !usage_err && i < stops.n; i++)
        if (!stops.items[i][0]) usage_err = "--stop strings must not be empty";
    int32_t *bias_ids = NULL;
    float *bias_vals = NULL;
    int bad_bias = usage_err ? 0 : parse_bias(&bias, &bias_ids, &bias_vals);
    if (bad_bias > 0)
        fprintf(stderr, "cllm generate: --logit-bias '%s': expected ID=VALUE with VALUE in [-100, 100], e.g. 50256=-100\n",
                bias.items[bad_bias - 1]);
    else if (bad_bias < 0)
        fprintf(stderr, "cllm generate: out of memory\n");
    if (usage_err || bad_bias) {
        if (usage_err) fprintf(stderr, "cllm generate: %s (see cllm generate --help)\n", usage_err);
        free(bias_ids);
        free(bias_vals);
        args_free(specs, ARGS_COUNT(specs));
        return bad_bias < 0 ? 1 : 2;
    }
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    if (prompt_ids) {
        int prc = parse_id_list(prompt_ids, &ids, &n_prompt);
        if (prc) {
            free(ids);
            free(bias_ids);
            free(bias_vals);
            fprintf(stderr, "cllm generate: --prompt-ids '%s': %s\n", prompt_ids,
                    prc == 1 ? "out of memory" : "expected comma-separated integers such as \"1,2,3\"");
            args_free(specs, ARGS_COUNT(specs));
            return prc == 1 ? 1 : 2;
        }
    }

    cllm_model *m = NULL;
    cllm_tokenizer *tok = NULL;
    cllm_generation *gen = NULL;
    cllm_token_buf enc = {0};
    rc = 1;
    if (quant_flags_any(&qf) && tensor > 1) {
        fprintf(stderr, "cllm generate: --tensor with a quantized base (--load-in-4bit / --load-in-8bit): not "
                        "supported\n");
        goto done;
    }
    if (tool_tp_load(&m, model_dir, tensor, weights, "generate")) goto fail;
    if (tool_tp_follower(m)) { /* ranks > 0 follow rank 0's forward passes */
        rc = tool_tp_follow(m, "generate");
        m = NULL;
        goto done;
    }
    if (!m && quant_flags_load(&qf, &m, model_dir, weights)) goto fail;
    if ((adapter && cllm_lora_load(m, adapter)) || cllm_model_set_inference(m)) goto fail;
    const cllm_model_config *c = cllm_model_get_config(m);
    const char *tdir = tok_dir ? tok_dir : model_dir;
    bool want_tok = prompt || tok_dir || file_exists(tdir, "tokenizer.json");
    if (want_tok && strcmp(output, "ids") == 0 && !prompt && !stops.n) want_tok = false;
    if (want_tok && cllm_tokenizer_load(&tok, tdir)) {
        if (prompt && !tok_dir)
            cllm_fail_context(CLLM_ERR_IO, "no tokenizer for --prompt (put tokenizer.json in the model folder, pass "
                                           "--tokenizer DIR, or use --prompt-ids)");
        goto fail;
    }
    if (prompt) {
        if (cllm_tokenizer_encode(tok, prompt, strlen(prompt), true, &enc)) goto fail;
        ids = enc.ids;
        n_prompt = enc.n;
        enc.ids = NULL;
        if (n_prompt == 0) {
            int32_t bos = c->bos_token_id >= 0 ? c->bos_token_id : cllm_tokenizer_bos_id(tok);
            if (bos < 0) {
                CLLM_FAIL(CLLM_ERR_ARG, "the prompt is empty and the model has no BOS token to start from");
                goto fail;
            }
            free(ids);
            ids = malloc(sizeof *ids);
            if (!ids) {
                CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                goto fail;
            }
            ids[0] = bos;
            n_prompt = 1;
        }
    }
    bool text_out = tok && strcmp(output, "ids") != 0;
    if (strcmp(output, "text") == 0 && !tok) {
        CLLM_FAIL(CLLM_ERR_ARG, "--output text needs a tokenizer (tokenizer.json in %s)", tdir);
        goto fail;
    }
    if (stops.n && !tok) {
        CLLM_FAIL(CLLM_ERR_ARG, "--stop needs a tokenizer (tokenizer.json in %s, or --tokenizer DIR)", tdir);
        goto fail;
    }

    cllm_generate_params gp = cllm_generate_params_default();
    gp.max_new_tokens = max_new;
    gp.sample = (cllm_sample_params){.greedy = greedy, .temperature = (float)temperature, .top_k = top_k,
                                     .top_p = (float)top_p, .repetition_penalty = (float)rep,
                                     .typical_p = (float)typical_p, .frequency_penalty = (float)freq_pen,
                                     .presence_penalty = (float)pres_pen, .bias_ids = bias_ids,
                                     .bias_values = bias_vals, .n_bias = (size_t)bias.n};
    gp.top_n = top_n;
    gp.kv_dtype = kv_dtype;
    gp.seed = (uint64_t)seed;
    gp.stop = (const char *const *)stops.items;
    gp.n_stop = (size_t)stops.n;
    gp.ignore_eos = ignore_eos;
    /* The EOS ids are listed here because the tokenizer's EOS counts even
     * when the loop gets no tokenizer (--output ids decodes nothing). */
    int32_t eos[CLLM_MAX_EOS_IDS + 1];
    size_t n_eos = 0;
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] < cllm_model_vocab(m)) eos[n_eos++] = c->eos_token_ids[i];
    int32_t tok_eos = tok ? cllm_tokenizer_eos_id(tok) : -1;
    if (tok_eos >= 0 && tok_eos < cllm_model_vocab(m)) eos[n_eos++] = tok_eos;
    gp.eos_ids = eos;
    gp.n_eos = n_eos;
    if (cllm_generate_init(&gen, m, text_out || stops.n ? tok : NULL, &gp)) goto fail;
    if (cllm_generate_prefill(gen, ids, n_prompt)) goto fail;
    cllm_generate_event ev = {0};
    int printed = 0;
    do {
        if (cllm_generate_step(gen, &ev)) goto fail;
        if (top_n && ev.token >= 0) print_top(&ev);
        bool ok = true;
        if (text_out)
            ok = write_out(ev.text, ev.text_len);
        else if (ev.token >= 0 && ev.finish != CLLM_FINISH_EOS)
            ok = printf(printed++ ? " %d" : "%d", ev.token) > 0 && fflush(stdout) == 0;
        if (!ok) {
            CLLM_FAIL(CLLM_ERR_IO, "stdout: %s", strerror(errno));
            goto fail;
        }
    } while (!ev.finish);
    if (!text_out && printed) printf("\n");
    fflush(stdout);
    cllm_generate_stats gs = cllm_generate_get_stats(gen);
    size_t n_gen = gs.n_generated - (ev.finish == CLLM_FINISH_EOS);
    const char *why = ev.finish == CLLM_FINISH_EOS              ? "eos"
                      : ev.finish == CLLM_FINISH_CONTEXT        ? "context limit"
                      : ev.finish == CLLM_FINISH_STOP_SEQUENCE ? "stop sequence"
                                                                : "max-new-tokens";
    if (ev.finish == CLLM_FINISH_CONTEXT)
        fprintf(stderr, "\ncllm generate: stopped at the model's limit of %d positions\n", c->n_ctx);
    double tp = gs.prefill_seconds, td = gs.decode_seconds;
    fprintf(stderr,
            "\ncllm generate: prompt %zu tokens in %.3f s (%.1f tok/s), generated %zu tokens, decode %.3f s (%.1f "
            "tok/s), stop: %s\n",
            n_prompt, tp, tp > 0 ? (double)n_prompt / tp : 0.0, n_gen, td,
            td > 0 && gs.n_decode_forwards ? (double)gs.n_decode_forwards / td : 0.0, why);
    rc = 0;
    goto done;
fail:
    fflush(stdout);
    tool_fail("generate");
done:
    free(ids);
    free(bias_ids);
    free(bias_vals);
    cllm_token_buf_free(&enc);
    cllm_generate_free(gen);
    tool_tp_end(m);
    cllm_tokenizer_free(tok);
    cllm_model_free(m);
    cllm_dist_finalize();
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
