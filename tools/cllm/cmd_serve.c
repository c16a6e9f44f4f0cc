/*
 * cllm serve: the HTTP server (TGI and OpenAI APIs, continuous batching)
 * over one model; see include/cllm/server.h and docs/serve.md.
 *
 *   cllm serve --model DIR [--tokenizer DIR] [--host 127.0.0.1] [--port 8080]
 *              [--model-id NAME] [--max-concurrent-requests 128]
 *              [--max-batch-size N] [--max-input-tokens N] [--max-total-tokens N]
 *              [--kv-cache-tokens N] [--kv-cache-dtype auto|fp32|bf16]
 *              [--api-key KEY] [--threads N]
 *              [--weights fp32|bf16|int8|q4] [--lora-adapters NAME=DIR,...]
 *
 * DIR is an HF folder, a checkpoint folder (either format) or a run folder
 * (its newest checkpoint). When ready it prints "listening on
 * http://HOST:PORT" to stderr. SIGTERM or SIGINT: stop accepting, let the
 * requests in flight finish (up to --drain-seconds), exit 0.
 * Exit codes: 0 ok, 1 failure, 2 usage.
 */
#include <omp.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cllm/chat_template.h"
#include "cllm/checkpoint.h"
#include "cllm/core.h"
#include "cllm/dist.h"
#include "cllm/lora.h"
#include "cllm/server.h"
#include "commands.h"

#ifndef CLLM_VERSION_STRING
#define CLLM_VERSION_STRING "dev"
#endif

/* SIGTERM / SIGINT once the server runs: the signal thread
 * (tool_signals_arm, once the server has started) records which one came
 * and wakes the main thread. A signal while the model loads ends the
 * process (default action); a second one during the drain ends it too. */
static atomic_int g_stop_sig;
static sem_t g_stop_sem;
static void on_stop_signal(int sig) {
    atomic_store(&g_stop_sig, sig);
    sem_post(&g_stop_sem);
}

static bool has_file(const char *dir, const char *name) {
    char p[4096];
    int n = snprintf(p, sizeof p, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof p && access(p, F_OK) == 0;
}

/* The folder's last path component (the default model id). */
static const char *base_name(const char *dir, char *buf, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(buf, n, "%.*s", (int)(len - start), dir + start);
    return buf;
}

/* --lora-adapters: NAME=DIR or DIR (named after its folder), separated by
 * commas or given as several values. Returns 0, or 2 after a message. */
static int load_adapters(cllm_lora_set *set, const arg_list *l) {
    for (int i = 0; i < l->n; i++) {
        char *all = strdup(l->items[i]), *save = NULL, nb[256];
        if (!all) {
            CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            return 1;
        }
        for (char *it = strtok_r(all, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(it, '=');
            const char *dir = eq ? eq + 1 : it, *name = eq ? (*eq = 0, it) : base_name(it, nb, sizeof nb);
            bool bad = !*name || !*dir;
            for (const char *c = name; *c && !bad; c++)
                bad = (unsigned char)*c <= ' ' || *c == '"' || *c == '\\' || *c == 0x7f;
            if (bad) {
                fprintf(stderr, "cllm serve: --lora-adapters '%s': expected NAME=DIR (a name without spaces, quotes "
                                "or control characters), e.g. sql=runs/lora-sql\n", l->items[i]);
                free(all);
                return 2;
            }
            if (cllm_lora_set_add(set, name, dir)) {
                free(all);
                return 1;
            }
            int k = cllm_lora_set_count(set) - 1;
            const cllm_lora_config *c = cllm_lora_set_config(set, k);
            fprintf(stderr, "cllm serve: adapter %s (%s): r=%d alpha=%g on %d layers, %zu parameters\n", name, dir,
                    c->r, c->lora_alpha, cllm_lora_set_layers(set, k), cllm_lora_set_numel(set, k));
        }
        free(all);
    }
    return 0;
}

int cmd_serve(int argc, char **argv) {
    if (tool_signals_start()) return 1; /* before any thread exists */
    const char *model_dir, *tok_dir, *host, *model_id, *api_key, *wfmt, *kv_dtype_s;
    int port, max_conc, max_batch, max_prefill, max_in, max_total, kv_tokens, threads, drain, timeout, tensor;
    long long max_body;
    arg_list lora = {0};
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, NULL, true, "HF model folder, checkpoint folder or run folder"},
        {"tokenizer", ARG_STR, &tok_dir, NULL, false, "folder with tokenizer.json (default: the model's)"},
        {"weights", ARG_STR, &wfmt, NULL, false, "fp32, bf16, int8 (Q8_0 blocks) or q4 (Q4_0 blocks) weights (default: as stored)"},
        {"host", ARG_STR, &host, "127.0.0.1", false, "address to listen on (IPv4 or IPv6 literal)"},
        {"port", ARG_INT, &port, "8080", false, "port; 0 picks a free one"},
        {"model-id", ARG_STR, &model_id, NULL, false, "model name in responses (default: the folder's name)"},
        {"max-concurrent-requests", ARG_INT, &max_conc, "128", false, "requests queued or running; more get 429"},
        {"max-batch-size", ARG_INT, &max_batch, "16", false, "sequences decoded together"},
        {"max-batch-prefill-tokens", ARG_INT, &max_prefill, "512", false,
         "prompt tokens read per step (longer prompts are read in chunks)"},
        {"max-input-tokens", ARG_INT, &max_in, "0", false, "prompt tokens per request (0: max-total-tokens - 1)"},
        {"max-total-tokens", ARG_INT, &max_total, "0", false,
         "prompt + generated tokens per request (0: the model's position limit)"},
        {"kv-cache-tokens", ARG_INT, &kv_tokens, "0", false,
         "positions in the shared KV cache pool, resident from start-up (0: max-batch-size x max-total-tokens, at most 65536 and half the available memory)"},
        {"kv-cache-dtype", ARG_STR, &kv_dtype_s, "auto", false,
         "how the pool stores keys and values: fp32, bf16 (half the bytes), or auto (bf16 for bf16 / int8 / q4 "
         "weights, fp32 for fp32)"},
        {"api-key", ARG_STR, &api_key, NULL, false, "require 'Authorization: Bearer KEY' on every route but /health"},
        {"threads", ARG_INT, &threads, "0", false, "compute threads (0: OpenMP's default)"},
        {"max-body-bytes", ARG_I64, &max_body, "1048576", false, "larger request bodies get 413"},
        {"timeout", ARG_INT, &timeout, "30", false, "seconds before an idle connection is closed"},
        {"drain-seconds", ARG_INT, &drain, "30", false, "on SIGTERM, how long requests in flight may take"},
        {"tensor", ARG_INT, &tensor, "1", false,
         "tensor-parallel ranks: under mpirun -np N each rank holds 1/N of the weights; rank 0 serves HTTP"},
        {"lora-adapters", ARG_LIST, &lora, NULL, false,
         "NAME=DIR,... PEFT LoRA adapter folders on the one base; a request picks one by TGI's adapter_id or "
         "OpenAI's model (docs/serve.md)"},
    };
    int rc = args_parse("serve", "Serves a model over HTTP: TGI and OpenAI APIs with continuous batching.", argc,
                        argv, specs, ARGS_COUNT(specs));
    if (rc) {
        args_free(specs, ARGS_COUNT(specs));
        return rc == 1 ? 0 : 2;
    }
    const char *usage = NULL;
    cllm_kv_dtype kv_dtype = CLLM_KV_AUTO;
    if (cllm_kv_dtype_parse(kv_dtype_s, &kv_dtype)) usage = "--kv-cache-dtype must be auto, fp32 or bf16";
    else if (port < 0 || port > 65535) usage = "--port must be in [0, 65535]";
    else if (max_conc < 1) usage = "--max-concurrent-requests must be >= 1";
    else if (max_batch < 1) usage = "--max-batch-size must be >= 1";
    else if (max_prefill < 1) usage = "--max-batch-prefill-tokens must be >= 1";
    else if (max_in < 0 || max_total < 0 || kv_tokens < 0) usage = "token limits must be >= 0 (0 = default)";
    else if (threads < 0) usage = "--threads must be >= 0";
    else if (max_body < 64 || max_body > (1LL << 30)) usage = "--max-body-bytes must be in [64, 2^30]";
    else if (timeout < 1 || drain < 1) usage = "--timeout and --drain-seconds must be >= 1";
    else if (lora.n && tensor > 1)
        usage = "--lora-adapters with --tensor: adapters are not served on a tensor-parallel model (merge one with "
                "`cllm lora merge`, or serve without --tensor)";
    if (usage) {
        fprintf(stderr, "cllm serve: %s (see cllm serve --help)\n", usage);
        args_free(specs, ARGS_COUNT(specs));
        return 2;
    }
    if (threads) omp_set_num_threads(threads);

    cllm_model *m = NULL;
    cllm_tokenizer *tok = NULL;
    cllm_chat_template *tmpl = NULL;
    cllm_server *srv = NULL;
    cllm_lora_set *adapters = NULL;
    char *ckpt = NULL, *bos = NULL, *eos = NULL, idbuf[256];
    rc = 1;
    /* A run folder means its newest checkpoint; the tokenizer and template
     * may live in the run folder rather than the checkpoint. */
    const char *weights = model_dir;
    if (!has_file(model_dir, "config.json") && cllm_ckpt_find(model_dir, "auto", &ckpt) == CLLM_OK && ckpt) {
        if (cllm_ckpt_verify(ckpt)) goto fail;
        weights = ckpt;
    }
    if (tool_tp_load(&m, weights, tensor, wfmt, "serve")) goto fail;
    if (tool_tp_follower(m)) { /* ranks > 0 follow rank 0's forward passes */
        rc = tool_tp_follow(m, "serve");
        m = NULL;
        goto done;
    }
    if (!m && cllm_ckpt_load_model_weights(&m, weights, wfmt)) goto fail;
    if (lora.n) {
        if (cllm_lora_set_init(&adapters, m)) goto fail;
        int lrc = load_adapters(adapters, &lora);
        if (lrc == 2) rc = 2;
        if (lrc) goto fail_rc;
    }
    if (cllm_model_set_inference(m)) goto fail; /* after the adapters: their loading needs the file layout */
    const char *tdir = tok_dir ? tok_dir : has_file(weights, "tokenizer.json") ? weights : model_dir;
    char parent[4096];
    if (!tok_dir && !has_file(tdir, "tokenizer.json")) {
        int n = snprintf(parent, sizeof parent, "%s/..", weights);
        if (n > 0 && (size_t)n < sizeof parent && has_file(parent, "tokenizer.json")) tdir = parent;
    }
    if (cllm_tokenizer_load(&tok, tdir)) {
        cllm_fail_context(CLLM_ERR_IO, "the server needs a tokenizer (tokenizer.json in the model folder, or "
                                       "--tokenizer DIR)");
        goto fail;
    }
    if (cllm_chat_template_load_dir(&tmpl, &bos, &eos, tdir)) goto fail;
    cllm_server_params sp = {.host = host,
                             .port = port,
                             .model_id = model_id ? model_id : base_name(model_dir, idbuf, sizeof idbuf),
                             .api_key = api_key,
                             .max_concurrent_requests = max_conc,
                             .max_batch_size = max_batch,
                             .max_batch_prefill_tokens = max_prefill,
                             .max_input_tokens = max_in,
                             .max_total_tokens = max_total,
                             .kv_cache_tokens = kv_tokens,
                             .kv_dtype = kv_dtype,
                             .max_body_bytes = (size_t)max_body,
                             .timeout_s = timeout,
                             .drain_s = drain,
                             .version = CLLM_VERSION_STRING,
                             .threads = threads,
                             .adapters = adapters};
    if (cllm_server_init(&srv, m, tok, tmpl, bos, eos, &sp)) goto fail;

    signal(SIGPIPE, SIG_IGN);
    if (sem_init(&g_stop_sem, 0, 0) != 0) {
        CLLM_FAIL(CLLM_ERR_IO, "cannot create the stop semaphore");
        goto fail;
    }
    if (cllm_server_start(srv)) goto fail;
    /* armed before the ready line: a client that signals the moment it reads
     * it gets a drain, not the default action */
    tool_signals_arm(on_stop_signal);
    int pool_tokens;
    size_t pool_bytes;
    cllm_server_pool(srv, &pool_tokens, &pool_bytes);
    if (tensor > 1)
        fprintf(stderr, "cllm serve: %d tensor-parallel ranks; per rank %.1f MiB of weights and %.1f MiB of KV cache\n",
                tensor, (double)cllm_model_held_bytes(m) / (1 << 20), (double)pool_bytes / (1 << 20));
    const char *shown_host = strchr(host, ':') ? NULL : host;
    const char *pool_dtype = cllm_kv_dtype_name(cllm_kv_cache_dtype_for(m, kv_dtype));
    fprintf(stderr, "cllm serve: %s weights, %.1f MiB read per decode step\n", cllm_wfmt_name(cllm_model_weights(m)),
            (double)cllm_model_weight_bytes(m) / (1 << 20));
    if (shown_host)
        fprintf(stderr, "cllm serve: %s: KV cache pool %d tokens (%.1f MiB, %s)%s; listening on http://%s:%d\n",
                sp.model_id, pool_tokens, (double)pool_bytes / (1 << 20), pool_dtype, tmpl ? ", chat template" : "", host,
                cllm_server_port(srv));
    else
        fprintf(stderr, "cllm serve: %s: KV cache pool %d tokens (%.1f MiB, %s)%s; listening on http://[%s]:%d\n",
                sp.model_id, pool_tokens, (double)pool_bytes / (1 << 20), pool_dtype, tmpl ? ", chat template" : "",
                host, cllm_server_port(srv));
    fflush(stderr);
    while (sem_wait(&g_stop_sem) != 0) {
    }
    const int sig = atomic_load(&g_stop_sig);
    fprintf(stderr, "cllm serve: %s: finishing the requests in flight\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    cllm_server_drain(srv);
    fprintf(stderr, "cllm serve: stopped\n");
    rc = 0;
    goto done;
fail:
    rc = tool_fail("serve");
    goto done;
fail_rc:
    if (rc != 2) rc = tool_fail("serve");
done:
    cllm_server_free(srv);
    cllm_lora_set_free(adapters);
    tool_tp_end(m);
    cllm_chat_template_free(tmpl);
    cllm_tokenizer_free(tok);
    cllm_model_free(m);
    cllm_dist_finalize();
    free(ckpt);
    free(bos);
    free(eos);
    args_free(specs, ARGS_COUNT(specs));
    return rc;
}
