/*
 * cllm generate: text generation with a key/value cache, token sampling and
 * incremental detokenization for streaming output.
 *
 * Three independent pieces:
 *
 *   cllm_kv_cache   per-sequence keys and values of every layer in a paged
 *                   pool, and the inference forward that extends them (the
 *                   training forward's code run on new rows): feed the
 *                   prompt once (prefill), then one token per step; each
 *                   call returns the logits of the last new position of
 *                   each sequence. Sequences may stand at different
 *                   positions and add different numbers of tokens in one
 *                   call (ragged), so a server can batch requests that
 *                   started at different times. Works for all three
 *                   families: GPT-2 learned positions, LLaMA RoPE at
 *                   absolute positions with grouped-query heads, BLOOM
 *                   ALiBi.
 *   cllm_sampler    turns logits into a token: greedy, temperature, top-k,
 *                   top-p and repetition penalty with HF semantics, from a
 *                   seeded cllm_rng so runs are reproducible.
 *   cllm_text_stream  decodes tokens one at a time into UTF-8 text that can
 *                   be printed immediately, holding back the bytes of a
 *                   character split across tokens until it is complete.
 *
 * A typical loop:
 *   cllm_kv_cache_init(&kv, model, 1, 0, 0);
 *   cllm_sampler_init(&s, V, params, seed);
 *   cllm_kv_cache_forward(kv, prompt, n_prompt, logits);
 *   for (;;) {
 *       cllm_sampler_sample(s, &tok, logits, history, n_history);
 *       if (tok == eos || done) break;
 *       cllm_kv_cache_forward(kv, &tok, 1, logits);
 *   }
 *
 * Not thread-safe per object. Different caches over one fp32 model may be
 * used from different threads (they only read its parameters); a model set
 * to bf16/fp16 (cllm_model_set_precision) also lends its operand scratch
 * to the cached pass, so its caches must be used from one thread at a
 * time. Kernels inside a forward run multi-threaded with OpenMP.
 */
#ifndef CLLM_GENERATE_H
#define CLLM_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/model.h"
#include "cllm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ kv cache */

typedef struct cllm_kv_cache cllm_kv_cache;

/* A paged cache: keys and values of up to max_seqs sequences in blocks of
 * block_size positions from one pool of n_blocks blocks. A sequence takes
 * blocks as it grows and gives them back when rewound or reset, so
 * sequences that start and finish at different times share the pool.
 *   max_seqs    sequences (slots 0..max_seqs-1)
 *   max_pos     positions per sequence; 0 = the model's limit (n_ctx), or
 *               2048 for BLOOM, which has none; above n_ctx: CLLM_ERR_ARG
 *   max_rows    new rows (tokens of all sequences together) per forward
 *               call: the scratch is sized for it; 0 = max_seqs x max_pos
 *   block_size  positions per block (default 64)
 *   n_blocks    blocks in the pool; 0 = enough for every sequence to reach
 *               max_pos */
typedef struct {
    int max_seqs, max_pos, max_rows, block_size, n_blocks;
} cllm_kv_cache_params;

/* max_seqs 1, everything else the defaults above. */
cllm_kv_cache_params cllm_kv_cache_params_default(void);

/* Allocates a paged cache with everything it will use (pool, block tables,
 * scratch); forward calls do not allocate. Memory: 2 * n_layer * n_blocks *
 * block_size * n_kv_head * head_dim floats of pool plus about max_rows *
 * (4 C + 3 F + QKV) floats of scratch. `m` is borrowed: it must outlive the
 * cache, and its parameters must not change while the cache holds keys
 * computed from them. A tensor-parallel part is CLLM_ERR_UNSUPPORTED.
 * Returns CLLM_OK, CLLM_ERR_ARG or CLLM_ERR_NOMEM; *out is NULL on failure. */
cllm_status cllm_kv_cache_init_paged(cllm_kv_cache **out, const cllm_model *m, const cllm_kv_cache_params *p);

/* The lockstep form: B sequences that advance together (every forward call
 * adds the same number of tokens to each), max_pos positions each, scratch
 * for up to max_chunk new tokens per sequence per call (0 = max_pos: a
 * whole prompt in one call; smaller values save memory, callers then
 * prefill in chunks). A paged cache with block_size 64 and blocks for every
 * sequence to reach max_pos. */
cllm_status cllm_kv_cache_init(cllm_kv_cache **out, const cllm_model *m, int B, int max_pos, int max_chunk);

/* NULL is a no-op. */
void cllm_kv_cache_free(cllm_kv_cache *kv);

/* Ragged step: sequence i adds n_new[i] >= 0 tokens (0: it sits this call
 * out); tokens holds them packed, sequence after sequence (sum n_new
 * ids). Each sequence's tokens go to its own next positions, their keys and
 * values are appended, its position advances, and the logits of its last
 * new token are written to logits[i * V ..] (rows of sequences that add
 * nothing are left untouched; logits has max_seqs rows).
 * Errors, with nothing changed: a negative count, more rows than max_rows,
 * positions beyond the sequence's capacity (the message names the limit and
 * whether it is the model's), token ids outside [0, V) (named with their
 * sequence and index): CLLM_ERR_ARG; not enough free blocks: CLLM_ERR_NOMEM
 * naming how many are needed and free. CLLM_ERR_INTERNAL if a matmul fails;
 * positions do not advance then and the blocks the call took are returned,
 * so the call can be retried. */
cllm_status cllm_kv_cache_forward_ragged(cllm_kv_cache *kv, const int32_t *tokens, const int *n_new, float *logits);

/* Lockstep step: tokens[B,n] (row b holds sequence b's n new tokens), every
 * sequence at its own next positions; logits[B,V] of each sequence's last
 * new token. n < 1 or n > max_rows / B is CLLM_ERR_ARG; otherwise as
 * cllm_kv_cache_forward_ragged with n_new[i] = n. */
cllm_status cllm_kv_cache_forward(cllm_kv_cache *kv, const int32_t *tokens, int n, float *logits);

/* Positions filled in sequence 0 (the next token's position; in lockstep
 * use, every sequence's). */
int cllm_kv_cache_pos(const cllm_kv_cache *kv);
/* Positions filled in sequence `seq`; -1 if there is no such sequence. */
int cllm_kv_cache_seq_pos(const cllm_kv_cache *kv, int seq);
/* Positions one sequence can hold (max_pos as resolved by init). */
int cllm_kv_cache_capacity(const cllm_kv_cache *kv);
/* Sequences (slots), positions per block, and blocks free in the pool. */
int cllm_kv_cache_max_seqs(const cllm_kv_cache *kv);
int cllm_kv_cache_block_size(const cllm_kv_cache *kv);
int cllm_kv_cache_blocks_free(const cllm_kv_cache *kv);
/* Forgets every sequence's positions pos..end, so the next forward
 * continues at `pos` (0 starts new sequences). pos outside [0, filled] of
 * any sequence is CLLM_ERR_ARG and nothing changes. */
cllm_status cllm_kv_cache_rewind(cllm_kv_cache *kv, int pos);
/* The same for one sequence; its blocks past `pos` go back to the pool
 * (pos 0: the slot is free for a new sequence). */
cllm_status cllm_kv_cache_seq_rewind(cllm_kv_cache *kv, int seq, int pos);

/* ------------------------------------------------------------- sampling */

/* How a token is chosen from logits. The processors run in HF's order:
 * repetition penalty, then (unless greedy) temperature, top-k, top-p.
 *   greedy              argmax of the penalised logits (lowest id on ties);
 *                       also selected by temperature == 0
 *   temperature         > 0: logits are divided by it (1 = unchanged)
 *   top_k               > 0: keep the k largest logits (ties with the k-th
 *                       are kept too, as HF does); 0 = off
 *   top_p               in (0, 1]: keep the smallest set of most probable
 *                       tokens whose probability sums to >= top_p (always at
 *                       least one); 1 = off
 *   repetition_penalty  > 0: each distinct token of the history has its logit
 *                       divided by the penalty if positive, multiplied if
 *                       negative (CTRL / HF); 1 = off */
typedef struct {
    bool greedy;
    float temperature;
    int top_k;
    float top_p;
    float repetition_penalty;
} cllm_sample_params;

/* Plain sampling from the softmax: temperature 1, no top-k/top-p/penalty. */
cllm_sample_params cllm_sample_params_default(void);

typedef struct cllm_sampler cllm_sampler;

/* Allocates a sampler for a vocabulary of V tokens (scratch of a few
 * floats per token) with its own RNG seeded with `seed`. Out-of-range
 * parameters are CLLM_ERR_ARG naming the parameter. */
cllm_status cllm_sampler_init(cllm_sampler **out, int V, cllm_sample_params p, uint64_t seed);
void cllm_sampler_free(cllm_sampler *s); /* NULL is a no-op */

/* Picks the next token from logits[V] given the tokens seen so far
 * (history[n_history], the prompt and everything generated; used by the
 * repetition penalty). logits are not modified. Draws one uniform number
 * from the sampler's RNG unless greedy. History ids outside [0, V) are
 * CLLM_ERR_ARG. */
cllm_status cllm_sampler_sample(cllm_sampler *s, int32_t *token, const float *logits, const int32_t *history,
                                size_t n_history);

/* The distribution cllm_sampler_sample draws from: probs[V] after every
 * processor (zero for removed tokens, summing to 1; greedy: one-hot).
 * Draws nothing from the RNG. For tests and for callers that sample
 * themselves. */
cllm_status cllm_sampler_probs(cllm_sampler *s, float *probs, const float *logits, const int32_t *history,
                               size_t n_history);

/* --------------------------------------------------- streaming decoding */

typedef struct cllm_text_stream cllm_text_stream;

/* Starts a stream of generated tokens that follow `context` (usually the
 * prompt; only its last token is kept, so that decoders that drop a
 * leading space at the start of a text do not drop the first generated
 * word's). `tok` is borrowed. Special tokens are not printed. */
cllm_status cllm_text_stream_init(cllm_text_stream **out, const cllm_tokenizer *tok, const int32_t *context,
                                  size_t n_context);
void cllm_text_stream_free(cllm_text_stream *ts); /* NULL is a no-op */

/* Adds one token and returns in *text / *len the bytes that became final:
 * always whole UTF-8 characters (a character whose bytes are split across
 * tokens is held back until it is complete). *text is borrowed until the
 * next call on the stream and may be empty. Ids the tokenizer cannot decode
 * are CLLM_ERR_ARG. */
cllm_status cllm_text_stream_push(cllm_text_stream *ts, int32_t id, const char **text, size_t *len);

/* Returns whatever is still held back (an incomplete character at the end
 * of generation comes out as U+FFFD, as in a full decode). */
cllm_status cllm_text_stream_finish(cllm_text_stream *ts, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
