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
 *                   top-p, typical-p and repetition penalty with HF
 *                   semantics, OpenAI's frequency/presence penalties and
 *                   logit bias, from a seeded cllm_rng so runs are
 *                   reproducible.
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
 * The decode loop built on the three (prefill, sample, stop rules, stop
 * strings, streamed text, log-probabilities) is cllm_generation, at the end
 * of this header.
 *
 * Threads: one cache is used by one thread at a time. Different caches
 * over one model may run forwards at the same time on different threads,
 * whatever its precision: a cache takes the model as const (its weights,
 * see model.h) and writes only its own memory, the operand scratch of the
 * bf16/fp16 linear layers included. The one exception is the model's
 * low-precision weight copy, rebuilt under a lock by the first forward
 * after the parameters changed. The GEMMs run concurrently as well (see
 * cllm_matmul in kernels.h; a cache over a bf16 model on a CPU without a
 * native bf16 GEMM widens its operands in a workspace of its own). Kernels
 * inside a forward run multi-threaded with OpenMP.
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
 *               max_pos
 *   kv_dtype    how keys and values are stored: CLLM_KV_AUTO (0, the
 *               default) is bf16 when the model's weights are in a format
 *               other than fp32 (cllm_model_weights) and fp32 otherwise;
 *               CLLM_KV_FP32 / CLLM_KV_BF16 force one. A bf16 cache rounds
 *               each key and value to bf16 (nearest even) as it is written;
 *               attention widens them and computes in fp32.
 *   prefault    write the whole pool once at init, so its pages are
 *               resident from the start and no later step takes a page
 *               fault (the server: its memory is known at start-up, and a
 *               step never waits on the kernel for a fresh page). Without
 *               it pages arrive as sequences first reach them.
 * The pool asks for transparent huge pages (cllm_alloc_huge): a decode
 * step streams the keys and values of every running sequence, and on
 * 4 KiB pages each page of them costs a TLB miss. */
typedef enum { CLLM_KV_AUTO = 0, CLLM_KV_FP32, CLLM_KV_BF16 } cllm_kv_dtype;
typedef struct {
    int max_seqs, max_pos, max_rows, block_size, n_blocks;
    cllm_kv_dtype kv_dtype;
    bool prefault;
} cllm_kv_cache_params;

/* max_seqs 1, everything else the defaults above. */
cllm_kv_cache_params cllm_kv_cache_params_default(void);

/* What a cache asked for kv_dtype d stores for m: d itself, or for
 * CLLM_KV_AUTO CLLM_KV_BF16 when m's weights are not fp32, else
 * CLLM_KV_FP32. */
cllm_kv_dtype cllm_kv_cache_dtype_for(const cllm_model *m, cllm_kv_dtype d);
/* Bytes of one cached key or value element of that dtype: 2 (bf16) or 4. */
size_t cllm_kv_cache_value_bytes(const cllm_model *m, cllm_kv_dtype d);

/* "auto", "fp32", "bf16": the names command lines use (--kv-cache-dtype);
 * NULL for any other value. */
const char *cllm_kv_dtype_name(cllm_kv_dtype d);
/* The dtype named by s (one of the names above); CLLM_ERR_ARG with a
 * message naming s otherwise. */
cllm_status cllm_kv_dtype_parse(const char *s, cllm_kv_dtype *out);
/* Whether the cache stores bf16 keys and values. */
bool cllm_kv_cache_is_bf16(const cllm_kv_cache *kv);

/* Allocates a paged cache with everything it will use (pool, block tables,
 * scratch); forward calls do not allocate. Memory: 2 * n_layer * n_blocks *
 * block_size * n_kv_head * head_dim values of pool (4 bytes each, 2 in a
 * bf16 cache) plus about max_rows *
 * (4 C + 3 F + QKV) floats of scratch, max_seqs * V floats of logits
 * when max_seqs > 1, and, for a model set to bf16 (fp16), max_rows *
 * max(C, F, n_head * head_dim) bf16 values (floats) of operand scratch,
 * plus for bf16 on CPUs without a native bf16 GEMM a widening workspace of
 * at most 32 MiB (cllm_matmul_bf16_scratch_bound). `m` is borrowed: it must outlive the
 * cache, and its parameters must not change while the cache holds keys
 * computed from them. Over a tensor-parallel part see "tensor-parallel
 * inference" below.
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

/* LoRA adapters per sequence (cllm/lora.h, cllm_lora_set over the cache's
 * model; borrowed, must outlive the cache): after this call each sequence
 * runs with the adapter cllm_kv_cache_seq_adapter chose for it (none at
 * first), the rows of every adapter in one call sharing the base's matrix
 * products. Allocates the set's per-row scratch for max_rows rows. Not on
 * a tensor-parallel part (CLLM_ERR_UNSUPPORTED). */
struct cllm_lora_set;
cllm_status cllm_kv_cache_set_adapters(cllm_kv_cache *kv, const struct cllm_lora_set *set);
/* Sequence seq's adapter from its next forward: an index of the set, or -1
 * for the base alone. Its cached positions must have been computed with the
 * same adapter (rewind to 0 when switching). CLLM_ERR_ARG out of range. */
cllm_status cllm_kv_cache_seq_adapter(cllm_kv_cache *kv, int seq, int adapter);

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

/* ---- tensor-parallel inference ----
 * Caches work over a tensor part (cllm_tp_model_load, then
 * cllm_model_set_tensor_parallel): each rank's cache holds its own
 * key/value heads (n_kv_head / tp), and the forward is collective over the
 * tensor group. Rank 0 uses its caches as usual (every call above, the
 * generation loop and the serving engine on top of them); its logits are
 * the whole model's, gathered from every rank (vocabulary padding
 * dropped). Every other rank calls cllm_kv_cache_follow, which runs each of
 * rank 0's cache calls (open, forward, rewind, free) on a cache of its own
 * until rank 0 calls cllm_kv_cache_stop_followers. Rank 0's caches must be
 * used by one thread at a time between them (one command stream). Greedy
 * output equals the whole model's up to the order of the partial sums.
 * A failed command ends the job (the ranks' caches would no longer
 * agree). Without tensor parallelism follow is CLLM_ERR_ARG and stop is a
 * no-op. */
cllm_status cllm_kv_cache_follow(const cllm_model *part);
cllm_status cllm_kv_cache_stop_followers(const cllm_model *part);

/* ------------------------------------------------------------- sampling */

/* How a token is chosen from logits. The processors run in the order HF
 * generate() and TGI apply them: first the logits processors (also when
 * greedy) logit bias, repetition penalty, frequency and presence penalties;
 * then, unless greedy, the warpers temperature, top-k, top-p, typical-p.
 * The fields after repetition_penalty are off when zero, so a struct
 * zero-initialised past the first five fields keeps their behaviour.
 *   greedy              argmax of the processed logits (lowest id on ties);
 *                       also selected by temperature == 0
 *   temperature         > 0: logits are divided by it (1 = unchanged)
 *   top_k               > 0: keep the k largest logits (ties with the k-th
 *                       are kept too, as HF does); 0 = off
 *   top_p               in (0, 1]: keep the smallest set of most probable
 *                       tokens whose probability sums to >= top_p (always at
 *                       least one); 1 = off
 *   repetition_penalty  > 0: each distinct token of the history (prompt and
 *                       generated) has its logit divided by the penalty if
 *                       positive, multiplied if negative (CTRL / HF); 1 = off
 *   typical_p           in [0, 1]: locally typical sampling (Meister et al.,
 *                       HF TypicalLogitsWarper) on the distribution left by
 *                       the earlier warpers: with entropy H, tokens sorted
 *                       by |-ln p - H| (ascending, lower id first on ties)
 *                       are kept up to and including the first whose
 *                       cumulative probability reaches typical_p, plus any
 *                       token with the same |-ln p - H| as that one (at
 *                       least one token); 0 or 1 = off
 *   frequency_penalty   in [-2, 2]: OpenAI's definition,
 *   presence_penalty    in [-2, 2]:  l[t] -= c[t] * frequency_penalty
 *                                        + (c[t] > 0) * presence_penalty
 *                       where c[t] counts t among the GENERATED tokens only
 *                       (the history after its first n_prompt tokens; see
 *                       cllm_sampler_sample_ex). TGI's frequency_penalty
 *                       differs (counts over prompt and output divided by
 *                       their length); a server offering TGI's semantics
 *                       converts. 0 = off
 *   bias_ids, bias_values, n_bias
 *                       OpenAI logit_bias: bias_values[i] in [-100, 100] is
 *                       added to the logit of bias_ids[i] (in [0, V), each
 *                       id at most once) before every other processor;
 *                       -100 in effect bans a token, 100 all but forces it.
 *                       Copied by cllm_sampler_init; n_bias 0 = off */
typedef struct {
    bool greedy;
    float temperature;
    int top_k;
    float top_p;
    float repetition_penalty;
    float typical_p;
    float frequency_penalty;
    float presence_penalty;
    const int32_t *bias_ids;
    const float *bias_values;
    size_t n_bias;
} cllm_sample_params;

/* Largest |frequency_penalty| and |presence_penalty|, and |bias value|. */
#define CLLM_MAX_PENALTY 2.0f
#define CLLM_MAX_LOGIT_BIAS 100.0f

/* Plain sampling from the softmax: temperature 1, every other processor
 * off. */
cllm_sample_params cllm_sample_params_default(void);

typedef struct cllm_sampler cllm_sampler;

/* Allocates a sampler for a vocabulary of V tokens (scratch of a few
 * numbers per token) with its own RNG seeded with `seed`, and copies the
 * logit bias. Out-of-range parameters (a bias id outside [0, V) or listed
 * twice, a bias value outside [-100, 100], n_bias > 0 with a NULL list
 * included) are CLLM_ERR_ARG naming the parameter. */
cllm_status cllm_sampler_init(cllm_sampler **out, int V, cllm_sample_params p, uint64_t seed);
void cllm_sampler_free(cllm_sampler *s); /* NULL is a no-op */

/* Picks the next token from logits[V] given the tokens seen so far
 * (history[n_history]: the prompt and everything generated). logits are
 * not modified. Draws one uniform number from the sampler's RNG unless
 * greedy. history[0 .. n_prompt) is the prompt and the rest the generated
 * tokens: the repetition penalty looks at all of it, the frequency and
 * presence penalties at the generated part only. n_prompt > n_history or
 * history ids outside [0, V) are CLLM_ERR_ARG. On success *logprob (may be
 * NULL) is the natural log of the drawn token's probability under the
 * distribution it was drawn from (the one cllm_sampler_probs_ex returns; 0
 * when greedy). */
cllm_status cllm_sampler_sample_ex(cllm_sampler *s, int32_t *token, double *logprob, const float *logits,
                                   const int32_t *history, size_t n_history, size_t n_prompt);

/* cllm_sampler_sample_ex with n_prompt 0 (every history token counts as
 * generated) and no logprob. */
cllm_status cllm_sampler_sample(cllm_sampler *s, int32_t *token, const float *logits, const int32_t *history,
                                size_t n_history);

/* cllm_sampler_sample_ex with n_prompt 0. Same draws as
 * cllm_sampler_sample for the same seed. */
cllm_status cllm_sampler_sample_logprob(cllm_sampler *s, int32_t *token, double *logprob, const float *logits,
                                        const int32_t *history, size_t n_history);

/* The distribution cllm_sampler_sample_ex draws from: probs[V] after every
 * processor (zero for removed tokens, summing to 1; greedy: one-hot).
 * Draws nothing from the RNG. For tests and for callers that sample
 * themselves. Errors as cllm_sampler_sample_ex. */
cllm_status cllm_sampler_probs_ex(cllm_sampler *s, float *probs, const float *logits, const int32_t *history,
                                  size_t n_history, size_t n_prompt);

/* cllm_sampler_probs_ex with n_prompt 0. */
cllm_status cllm_sampler_probs(cllm_sampler *s, float *probs, const float *logits, const int32_t *history,
                               size_t n_history);

/* Largest top_n of cllm_generate_params (OpenAI's top_logprobs bound;
 * TGI's default cap on top_n_tokens is 5, a server's own limit). */
#define CLLM_MAX_TOP_N 20

/* The n most likely tokens of the raw distribution log_softmax(logits[V])
 * (no processor applied): ids[n] highest first, ties by lower id, and
 * their log-probabilities logprobs[n] (cllm_sampler_raw_logprob of each
 * logit and cllm_logsumexp of the row). 0 <= n <= V, else CLLM_ERR_ARG;
 * logits that are not all finite are CLLM_ERR_ARG. Does not allocate;
 * thread-safe. */
cllm_status cllm_sampler_top_logprobs(int32_t *ids, float *logprobs, int n, const float *logits, int V);
/* ln softmax(x)[i] as every raw log-probability is reported: logit x[i]
 * minus lse = cllm_logsumexp(x, V) (cllm/kernels.h), in double, rounded
 * to float; the generation events' raw_logprob and the top-n alternatives
 * agree bit for bit. */
float cllm_sampler_raw_logprob(float logit, double lse);

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

/* ------------------------------------------------------- the decode loop */
/*
 * cllm_generation: one sequence being generated, the loop that an HTTP
 * server's scheduler (many sequences, each stepped one token at a time,
 * some cancelled mid-way), an RL rollout and `cllm generate` share:
 *
 *   cllm_generate_init(&g, model, tok, &params);   // sampler, stop strings
 *   cllm_generate_prefill(g, prompt, n_prompt);    // cache + first logits
 *   do cllm_generate_step(g, &ev);                 // one token per call
 *   while (ev.finish == CLLM_FINISH_NONE);
 *   cllm_generate_free(g);
 *
 * or cllm_generate_run(g, prompt, n, callback, user) for the whole loop.
 * It is built on the public cllm_kv_cache_* (B = 1), cllm_sampler_* and
 * cllm_text_stream_* calls above.
 *
 * Each step returns the token, its log-probability under the distribution
 * it was sampled from and under the raw model (log_softmax of the
 * unmodified logits), optionally the top_n most likely tokens of the raw
 * model with theirs, the text that became final, and a finish reason on
 * the step that ends the sequence. The token of that last step is part of
 * the sequence (an EOS included); nothing comes after it.
 *
 * Text (only with a tokenizer): generated tokens are decoded incrementally
 * (cllm_text_stream: whole UTF-8 characters, special tokens skipped). With
 * stop strings, the text is cut right before the first occurrence of any of
 * them, and text is held back while its end could still be the beginning
 * of a stop string, so the pieces streamed to a client never contain any
 * part of a stop string; when the sequence finishes for another reason the
 * held-back text is released. The concatenated pieces always equal
 * cllm_generate_text() without the prompt.
 *
 * Ownership: the model and tokenizer are borrowed and must outlive the
 * object; the parameters (stop strings and EOS list included) are copied
 * by init. Pointers returned by the object are borrowed until the next call
 * on it (or its free).
 *
 * Threads: one object is used by one thread at a time. Objects over one
 * model and one tokenizer may run on different threads, whatever the
 * model's precision: each has its own cache, the cache forward only reads
 * the model (see the cache's thread notes at the top of this header), and
 * tokenizer decoding is thread-safe. Nothing may modify the model
 * (training, loading new weights) while objects over it exist.
 */

typedef enum {
    CLLM_FINISH_NONE = 0,      /* still generating */
    CLLM_FINISH_EOS,           /* the token is one of the EOS ids */
    CLLM_FINISH_LENGTH,        /* max_new_tokens tokens generated */
    CLLM_FINISH_STOP_SEQUENCE, /* the text reached a stop string */
    CLLM_FINISH_CONTEXT,       /* the model's position limit is full */
    CLLM_FINISH_CANCELLED      /* cllm_generate_cancel or the run callback */
} cllm_finish_reason;

/* "none", "eos", "length", "stop_sequence", "context", "cancelled" (the
 * names of TGI's finish_reason); NULL for any other value. */
const char *cllm_finish_reason_name(cllm_finish_reason r);

/* Generation parameters; cllm_generate_params_default() gives the values in
 * brackets. */
typedef struct {
    int max_new_tokens;        /* [64] >= 0; counts every generated token,
                                * a final EOS included; 0: the step after
                                * prefill finishes with `length` at once */
    cllm_sample_params sample; /* [cllm_sample_params_default()] */
    uint64_t seed;             /* [0] seed of the sampler's RNG */
    const char *const *stop;   /* [NULL] n_stop non-empty stop strings */
    size_t n_stop;             /* [0] needs a tokenizer */
    const int32_t *eos_ids;    /* [NULL] n_eos ids that end generation; NULL:
                                * the config's eos_token_id (every id of a
                                * list) and the tokenizer's EOS */
    size_t n_eos;              /* [0] */
    bool ignore_eos;           /* [false] never stop at EOS (benchmarks) */
    bool include_prompt;       /* [false] cllm_generate_text starts with the
                                * decoded prompt (TGI return_full_text); the
                                * streamed pieces never contain it */
    int top_n;                 /* [0] 0..CLLM_MAX_TOP_N: each event lists the
                                * top_n most likely tokens of the raw
                                * distribution (at most V); TGI top_n_tokens,
                                * OpenAI top_logprobs */
    cllm_kv_dtype kv_dtype;    /* [CLLM_KV_AUTO] how the cache that
                                * cllm_generate_prefill allocates stores
                                * keys and values (cllm_kv_cache_params).
                                * A request of an engine runs in the
                                * engine's pool (cllm_engine_params.kv_dtype):
                                * there it must be AUTO or the pool's own */
} cllm_generate_params;

cllm_generate_params cllm_generate_params_default(void);

typedef struct cllm_generation cllm_generation;

/* What one step produced. */
typedef struct {
    int32_t token;        /* the new token; -1 when the step produced none
                           * (max_new_tokens 0) */
    float logprob;        /* ln p(token) under the sampling distribution
                           * (penalty, temperature, top-k, top-p applied;
                           * 0 when greedy) */
    float raw_logprob;    /* ln softmax(logits)[token] of the unmodified
                           * logits */
    const char *text;     /* text that became final with this step (may be
                           * empty; "" without a tokenizer); not
                           * NUL-terminated; borrowed until the next call */
    size_t text_len;
    cllm_finish_reason finish; /* CLLM_FINISH_NONE while going on */
    int n_top;            /* min(top_n, V) when a token was drawn, else 0 */
    const int32_t *top_ids;   /* [n_top] the most likely tokens under the
                               * raw distribution (log_softmax of the
                               * unmodified logits, as raw_logprob), highest
                               * first, ties by lower id; borrowed until the
                               * next call on the object; NULL when n_top 0 */
    const float *top_logprobs; /* [n_top] their raw log-probabilities */
} cllm_generate_event;

/* Counters of one sequence. */
typedef struct {
    size_t n_prompt;        /* prompt tokens */
    size_t n_generated;     /* tokens produced by steps, a final EOS included */
    size_t n_decode_forwards; /* single-token forwards (one per token but
                                * the last) */
    double prefill_seconds; /* the prompt's forward */
    double decode_seconds;  /* inside cllm_generate_step (forward, sampling,
                             * detokenization) */
} cllm_generate_stats;

/* Creates a sequence over model `m` (borrowed) and tokenizer `tok`
 * (borrowed; NULL: no text, and then no stop strings). Allocates the
 * sampler and copies the parameters; the cache is allocated by prefill,
 * sized for the prompt plus max_new_tokens (at most the model's position
 * limit). Errors (CLLM_ERR_ARG naming the parameter; *out NULL):
 * max_new_tokens < 0, sampling parameters out of range, top_n outside
 * [0, CLLM_MAX_TOP_N], stop strings
 * without a tokenizer, an empty or NULL stop string, n_eos > 0 with a NULL
 * list, an EOS id outside the vocabulary. */
cllm_status cllm_generate_init(cllm_generation **out, const cllm_model *m, const cllm_tokenizer *tok,
                               const cllm_generate_params *p);

/* NULL is a no-op. */
void cllm_generate_free(cllm_generation *g);

/* Runs the prompt ids[n] through the model (one forward) and prepares the
 * first step. Once per object. CLLM_ERR_ARG (nothing changed): a second
 * call, an empty prompt (start from the BOS token), an id outside the
 * vocabulary (named with its position), a prompt longer than the model's
 * position limit. CLLM_ERR_NOMEM for the cache. */
cllm_status cllm_generate_prefill(cllm_generation *g, const int32_t *ids, size_t n);

/* Generates one token and fills *ev. The step that ends the sequence has
 * ev->finish set (its token, if any, is part of the sequence) and releases
 * all held-back text; an incomplete UTF-8 character at the end comes out
 * as U+FFFD. CLLM_ERR_ARG: before prefill or after the sequence finished.
 * A failing forward (CLLM_ERR_INTERNAL) leaves the object as it was, so the
 * step may be retried; after any other failure (out of memory, logits that
 * are not finite, an id the tokenizer cannot decode) further steps are
 * CLLM_ERR_ARG and only free is useful. */
cllm_status cllm_generate_step(cllm_generation *g, cllm_generate_event *ev);

/* ---- sequences whose forward passes the caller runs (batching engines,
 * cllm/engine.h): the same sampling, stop rules, text and statistics, with
 * the logits supplied by a shared batched forward.
 * cllm_generate_prefill_external takes the prompt without running it;
 * `capacity` is the positions the caller's cache holds for the sequence
 * (context limit). Then, repeatedly: feed cllm_generate_next_input(g) (the
 * prompt's tokens the first time, then this id) through the model, and pass
 * the logits of the sequence's last position to cllm_generate_step_logits,
 * which draws the next token exactly as cllm_generate_step would. Mixing
 * the two kinds of step on one object is CLLM_ERR_ARG. */
cllm_status cllm_generate_prefill_external(cllm_generation *g, const int32_t *ids, size_t n, int capacity);
cllm_status cllm_generate_step_logits(cllm_generation *g, const float *logits, cllm_generate_event *ev);
/* The last token of the sequence so far (the one to feed next); -1 before
 * the prompt or after the finish. */
int32_t cllm_generate_next_input(const cllm_generation *g);
/* Ends the sequence with `why` from outside (a server's deadline, a full
 * cache): held-back text is released unless it is CLLM_FINISH_CANCELLED
 * (then as cllm_generate_cancel). No-op on a finished sequence. */
cllm_status cllm_generate_end(cllm_generation *g, cllm_finish_reason why);

/* Ends the sequence with CLLM_FINISH_CANCELLED; held-back text is dropped.
 * No-op on a finished sequence. */
void cllm_generate_cancel(cllm_generation *g);

/* Called after every step with its event; return non-zero to cancel. */
typedef int (*cllm_generate_callback)(const cllm_generate_event *ev, void *user);

/* prefill(ids, n), then steps until the sequence finishes, calling cb
 * (may be NULL) after each. When cb returns non-zero on a step that did not
 * finish the sequence, the sequence ends as CLLM_FINISH_CANCELLED (read it
 * with cllm_generate_finish_reason) and CLLM_OK is returned. Errors as for
 * prefill and step. */
cllm_status cllm_generate_run(cllm_generation *g, const int32_t *ids, size_t n, cllm_generate_callback cb,
                              void *user);

/* CLLM_FINISH_NONE until the sequence has finished. */
cllm_finish_reason cllm_generate_finish_reason(const cllm_generation *g);

/* The generated ids so far (a final EOS included) in *n; borrowed. */
const int32_t *cllm_generate_tokens(const cllm_generation *g, size_t *n);

/* The text released so far: its first *len bytes (len may be NULL once
 * finished). Once the sequence has finished this is the whole text (cut
 * before a stop string) and it is NUL-terminated at *len; before that,
 * bytes held back may follow. Starts with the decoded prompt when
 * include_prompt is set. "" without a tokenizer. Borrowed. */
const char *cllm_generate_text(const cllm_generation *g, size_t *len);

cllm_generate_stats cllm_generate_get_stats(const cllm_generation *g);

#ifdef __cplusplus
}
#endif
#endif
