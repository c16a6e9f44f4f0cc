/*
 * cllm engine: continuous batching of generation requests on one model,
 * the inference core a server (and RL rollouts) run: requests arrive at any
 * time, each step runs ONE forward pass over every running sequence (the
 * new tokens of sequences still reading their prompt, one token of each
 * decoding sequence: a ragged batch on a paged KV cache), then draws each
 * sequence's next token with its own sampler, stop rules and streamed text
 * (cllm_generation, cllm/generate.h). A finished or cancelled sequence
 * gives its cache blocks back at once and a queued request takes its place
 * in the next step.
 *
 * Scheduling: first come, first served. A request is admitted when a
 * sequence slot is free and the pool can reserve the blocks its prompt
 * plus max_new_tokens can ever fill, so a running sequence never waits for
 * memory and nothing is preempted. Within a step, decoding sequences come
 * first (one row each), then prompt chunks in arrival order fill the rest
 * of max_batch_tokens. A prompt longer than that is read over several
 * steps.
 *
 * Results equal those of running each request alone with
 * cllm_generate_run (the same draws from the same seeds), up to the
 * rounding of batched matrix products.
 *
 * Not thread-safe: one thread submits, steps and cancels (a server's
 * scheduler thread); callbacks run on it, inside cllm_engine_step.
 */
#ifndef CLLM_ENGINE_H
#define CLLM_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/generate.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cllm_engine cllm_engine;

/* Sizes; 0 picks the default given. */
typedef struct {
    int max_seqs;         /* sequences decoded together (8) */
    int max_pos;          /* positions per sequence: prompt + generated (the model's limit, or 2048) */
    int block_size;       /* positions per KV cache block (64) */
    int n_blocks;         /* blocks in the pool (enough for max_seqs sequences of max_pos) */
    int max_batch_tokens; /* new tokens per forward, all sequences together (max(512, max_seqs)) */
    const struct cllm_lora_set *adapters; /* LoRA adapters requests may choose (cllm/lora.h; borrowed), or NULL */
    cllm_kv_dtype kv_dtype; /* how the pool stores keys and values (CLLM_KV_AUTO: bf16 for weights other than
                             * fp32, else fp32; cllm_kv_cache_params) */
} cllm_engine_params;

/* One step's news about one request: the event of its sequence
 * (cllm_generate_event: the token drawn with its log-probabilities, the
 * request's top_n alternatives, the text that became final, the finish
 * reason on the last one). Borrowed, the alternatives and the text
 * included: valid during the callback only. */
typedef struct {
    uint64_t id;
    cllm_generate_event ev;
} cllm_engine_event;

/* Called for every event; return non-zero to cancel that request (its
 * sequence ends with CLLM_FINISH_CANCELLED, no further event). */
typedef int (*cllm_engine_callback)(const cllm_engine_event *ev, void *user);

/* Model and tokenizer are borrowed (the tokenizer may be NULL: no text,
 * no stop strings) and must outlive the engine. Allocates the cache pool
 * and scratch up front. CLLM_ERR_ARG for bad sizes, CLLM_ERR_NOMEM. */
cllm_status cllm_engine_init(cllm_engine **out, const cllm_model *m, const cllm_tokenizer *tok,
                             const cllm_engine_params *p);
/* Frees everything, including requests still queued or running. NULL is a
 * no-op. */
void cllm_engine_free(cllm_engine *e);

/* Queues a request: prompt ids (copied) and generation parameters (as
 * cllm_generate_init; copied). *id names it in events. A prompt that
 * cannot fit (longer than max_pos, or needing more blocks than the pool
 * has), an empty prompt, ids outside the vocabulary or bad parameters are
 * CLLM_ERR_ARG with a message; nothing is queued then. */
cllm_status cllm_engine_submit(cllm_engine *e, const int32_t *ids, size_t n, const cllm_generate_params *p,
                               uint64_t *id);

/* cllm_engine_submit for adapter `adapter` of the engine's set (-1: the
 * base alone; others CLLM_ERR_ARG). Requests for different adapters run in
 * one batch: each sequence's rows get its own adapter's delta after the
 * shared base products. */
cllm_status cllm_engine_submit_adapter(cllm_engine *e, const int32_t *ids, size_t n, const cllm_generate_params *p,
                                       int adapter, uint64_t *id);

/* Runs one step (admission, one batched forward, one draw per sequence
 * whose prompt is complete) and calls cb for each event, in slot order on
 * the calling thread; *n_events (may be NULL) counts them. The draws
 * (sampling, log-probabilities, text) run on OpenMP threads, one sequence
 * each. With nothing queued or running it returns at once.
 * CLLM_ERR_INTERNAL if the forward fails (no sequence advances; the step
 * may be retried). A sequence whose draw fails is ended without an event
 * and the step returns that error after the other events. */
cllm_status cllm_engine_step(cllm_engine *e, cllm_engine_callback cb, void *user, int *n_events);

/* Cancels a queued or running request (false if there is no such request:
 * finished, cancelled or never submitted). No event follows. */
bool cllm_engine_cancel(cllm_engine *e, uint64_t id);

typedef struct {
    int running, queued;          /* requests */
    int blocks_free, blocks_total; /* the KV cache pool */
    uint64_t steps, forward_rows; /* steps run, token rows through the model */
} cllm_engine_stats;
void cllm_engine_get_stats(const cllm_engine *e, cllm_engine_stats *s);

#ifdef __cplusplus
}
#endif
#endif
