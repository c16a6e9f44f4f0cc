/*
 * cllm server: an HTTP server over the continuous-batching engine
 * (cllm/engine.h) speaking the text-generation-inference (TGI) API and the
 * OpenAI completions and chat completions APIs. docs/serve.md is the user's
 * manual (routes, parameters, errors, metrics, limits); this header is the
 * programmer's.
 *
 * Threads: libmicrohttpd runs one thread per connection; each parses and
 * validates its request, tokenizes it (chat requests are rendered with the
 * model's chat template first), and hands it to the one scheduler thread,
 * which owns the engine: it admits queued requests, runs one batched step
 * for all running sequences and appends each sequence's new token and text
 * to its request, waking the connection thread that streams or collects
 * it. A connection thread that finds its client gone marks the request
 * cancelled; the scheduler drops it before the next step, so its cache
 * blocks return to the pool within one step.
 *
 * Lifecycle: cllm_server_init (allocates the engine, with its whole KV
 * cache pool), cllm_server_start (binds; the port is then known),
 * cllm_server_drain (stops accepting, lets the requests in flight finish
 * within a grace period, cancels the rest), cllm_server_free.
 */
#ifndef CLLM_SERVER_H
#define CLLM_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/chat_template.h"
#include "cllm/core.h"
#include "cllm/generate.h"
#include "cllm/lora.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cllm_server cllm_server;

/* Settings; 0 / NULL picks the default in brackets. */
typedef struct {
    const char *host;            /* [127.0.0.1] address to bind (IPv4 or IPv6 literal) */
    int port;                    /* [0: any free port] */
    const char *model_id;        /* [the model folder's name] name in /info, /v1/models, responses */
    const char *api_key;         /* [none] every route but /health then needs "Authorization: Bearer KEY" */
    int max_concurrent_requests; /* [128] requests queued or running; more get 429 */
    int max_batch_size;          /* [16] sequences decoded together */
    int max_batch_prefill_tokens;/* [512] prompt tokens read per step, all sequences together */
    int max_input_tokens;        /* [max_total_tokens - 1] */
    int max_total_tokens;        /* [the model's position limit, at most kv_cache_tokens] prompt + new tokens */
    int kv_cache_tokens;         /* [max_batch_size x max_total_tokens, at most 65536 and at most half the
                                  * memory available] positions in the pool, which is written whole at
                                  * start-up (resident from then on): a pool asked for that is larger
                                  * than the available memory is refused (CLLM_ERR_NOMEM) */
    int block_size;              /* [16] positions per cache block */
    cllm_kv_dtype kv_dtype;      /* [CLLM_KV_AUTO: bf16 for bf16 / int8 / q4 weights, fp32 for fp32] how the pool
                                  * stores keys and values (cllm/generate.h); bf16 halves the pool's bytes and the
                                  * bytes each decode step reads from it */
    int max_stop_sequences;      /* [4] */
    int max_top_n_tokens;        /* [5] TGI top_n_tokens; OpenAI top_logprobs allows 20 */
    int max_n;                   /* [8] OpenAI n */
    size_t max_body_bytes;       /* [1 MiB] larger request bodies get 413 */
    int timeout_s;               /* [30] a connection idle this long is closed */
    int drain_s;                 /* [30] grace period of cllm_server_drain */
    const char *version;         /* [""] the version /info reports */
    int threads;                 /* [OpenMP's default] compute threads of the scheduler thread */
    struct cllm_lora_set *adapters; /* [none] LoRA adapters over the model (cllm/lora.h; borrowed): a request
                                     * names one by TGI's parameters.adapter_id or OpenAI's model; the base's
                                     * id (model_id) or no name means the base alone */
} cllm_server_params;

/* The model and tokenizer are borrowed and must outlive the server (the
 * tokenizer is required: the APIs speak text). tmpl (borrowed, may be NULL:
 * chat requests then get 422) renders chat messages, with bos/eos (copied,
 * may be NULL) as its bos_token/eos_token. Allocates the engine and its
 * cache pool; nothing is bound yet. CLLM_ERR_ARG for bad settings. */
cllm_status cllm_server_init(cllm_server **out, cllm_model *m, const cllm_tokenizer *tok,
                             const cllm_chat_template *tmpl, const char *bos, const char *eos,
                             const cllm_server_params *p);

/* Binds host:port, starts the scheduler and the HTTP threads. CLLM_ERR_IO
 * when the address cannot be bound (message names it). */
cllm_status cllm_server_start(cllm_server *s);

/* The bound port (after start). */
int cllm_server_port(const cllm_server *s);

/* The pool-size rule cllm_server_init applies (exposed for tests): the
 * pool is written whole at start-up, so it must fit in the `avail` bytes
 * the system has free (cllm_mem_available; 0 = unknown, nothing checked),
 * at `per_token` bytes a position. q->kv_cache_tokens, max_total_tokens and
 * block_size must be resolved. A pool sized by default (by_default) is cut
 * to at most half of avail, in whole blocks, with a warning, and is refused
 * (CLLM_ERR_NOMEM naming --max-total-tokens) when that leaves less than one
 * request's max_total_tokens; one asked for (--kv-cache-tokens) that does
 * not fit in avail is refused (CLLM_ERR_NOMEM naming --kv-cache-tokens)
 * rather than the process being killed for memory later. */
cllm_status cllm_server_fit_pool(cllm_server_params *q, size_t per_token, size_t avail, bool by_default);

/* Positions in the cache pool and the bytes it takes (after init). */
void cllm_server_pool(const cllm_server *s, int *tokens, size_t *bytes);

/* Stops accepting connections, waits up to drain_s for the requests in
 * flight (queued ones included) to finish, cancels what remains, and stops
 * every thread. Idempotent. */
void cllm_server_drain(cllm_server *s);

/* Drains if needed and frees everything. NULL is a no-op. */
void cllm_server_free(cllm_server *s);

#ifdef __cplusplus
}
#endif
#endif
