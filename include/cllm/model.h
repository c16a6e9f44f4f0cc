/*
 * cllm model: HuggingFace causal language models (GPT-2, LLaMA, BLOOM, and
 * Mixtral: LLaMA with a sparse mixture-of-experts FFN, docs/moe.md) in C.
 *
 * A model is its config (parsed from HF config.json), a table of named
 * tensors with HF names and shapes, and one flat fp32 buffer holding every
 * parameter; gradients live in a second flat buffer with the same layout, so
 * an optimizer is one loop over n_params floats and a data-parallel gradient
 * reduction is one call. Weights keep the layout their HF file uses (GPT-2's
 * Conv1D [in,out], nn.Linear [out,in]), so loading and saving are copies.
 *
 * Loss semantics are those of HF causal LMs: labels are aligned with
 * input_ids, position t predicts label t+1, label -100 is ignored, and the
 * loss is the mean over all counted targets. Callers pass `targets` already
 * shifted (targets[b,t] = labels[b,t+1], -100 at t = T-1); see
 * cllm_model_make_targets().
 *
 * Weights and run state. A model object holds two things:
 *   the weights: config, tensor table and layout, the flat parameter
 *     buffer, and the read-only copy derived from it for bf16/fp16
 *     matmuls (cllm_model_set_precision);
 *   the training run's state: gradients, activations, backward scratch,
 *     the operand scratch of bf16/fp16 linear layers, hooks.
 * A `const cllm_model *` is the weights: no call that takes one writes
 * anything behind it, with one exception made safe by a lock: the
 * low-precision copy is rebuilt by the first linear layer that runs after
 * the parameters changed (cllm_model_params, cllm_model_params_updated).
 * The weights as an object of their own, shared by many run states (a
 * server's workers, PPO's reference, LoRA fine-tunes over one base), are
 * cllm/weights.h: a model made by cllm_model_from_weights borrows them and
 * owns only its run state. Inference state lives outside the model: each KV cache
 * (generate.h) owns its activations and operand scratch, so caches over one
 * model run forwards concurrently on different threads.
 * Calls that take a non-const model (prepare, forward, backward, training)
 * use the run state: one thread at a time, and not while caches over the
 * model run. The kernels run multi-threaded with OpenMP.
 */
#ifndef CLLM_MODEL_H
#define CLLM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most ids a config's eos_token_id list may hold. */
enum { CLLM_MAX_EOS_IDS = 8 };

typedef enum { CLLM_ARCH_GPT2 = 0, CLLM_ARCH_LLAMA, CLLM_ARCH_BLOOM, CLLM_ARCH_COUNT } cllm_arch;

/* "gpt2", "llama", "bloom"; CLLM_ARCH_COUNT and NULL for anything else. */
const char *cllm_arch_name(cllm_arch a);
cllm_arch cllm_arch_from_name(const char *name);

typedef struct {
    cllm_arch arch;
    int vocab_size;
    int n_ctx;     /* max positions (gpt2 n_positions, llama max_position_embeddings; bloom: 0 = no limit) */
    int n_embd;    /* C: hidden size */
    int n_layer;
    int n_head;    /* query heads */
    int n_kv_head; /* key/value heads (GQA); = n_head for gpt2/bloom */
    int head_dim;  /* HS */
    int n_inner;   /* FFN hidden size */
    float norm_eps;
    float rope_theta;
    bool attn_bias; /* llama attention_bias (gpt2/bloom always have biases) */
    bool mlp_bias;  /* llama mlp_bias */
    bool tie_embeddings;
    int bos_token_id, eos_token_id, pad_token_id; /* -1 when absent */
    /* Every id of eos_token_id (HF allows a list, e.g. Llama 3's
     * [128001, 128009]); eos_token_id is the first, n_eos_token_ids = 0 when
     * absent. Lists longer than CLLM_MAX_EOS_IDS are a format error. */
    int eos_token_ids[CLLM_MAX_EOS_IDS];
    int n_eos_token_ids;
    /* 0: a causal LM (the LM head). 1: HF's *ForSequenceClassification
     * with one label, a reward model: architectures names
     * "...ForSequenceClassification", the head is `score.weight` [1, C]
     * (no bias, no lm_head) read at each row's last non-padding token
     * (cllm_model_score_position). The label count comes from id2label
     * (else num_labels, else HF's default 2); any count but 1 is refused. */
    int num_labels;
    /* Mixtral (model_type "mixtral": arch is CLLM_ARCH_LLAMA with a sparse
     * mixture-of-experts FFN in every block, see docs/moe.md). n_experts 0
     * is a dense FFN (every other family). n_inner is each expert's width. */
    int n_experts;         /* num_local_experts */
    int n_experts_per_tok; /* num_experts_per_tok: experts each token is routed to */
    bool router_aux;       /* output_router_logits: the load-balancing loss joins the loss */
    float router_aux_coef; /* router_aux_loss_coef */
    int sliding_window;    /* sliding_window: query i sees keys i - window < j <= i; 0 = all */
    /* A value head beside the LM head (trl's AutoModelForCausalLMWithValueHead,
     * for PPO): `v_head.summary.weight` [1, C] and `v_head.summary.bias` [1],
     * the last tensors of the layout, read at every position of the final
     * norm's output (cllm_token_io.values). Not a config.json key: set when
     * the safetensors hold v_head.summary.weight, or by
     * cllm_model_add_value_head. */
    bool value_head;
} cllm_model_config;

/* One named parameter tensor: a view into the flat buffers at `offset`. */
typedef struct {
    char name[96];    /* HF name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    int ndim;
    int64_t shape[2];
    size_t offset;    /* in floats from the start of params/grads */
    size_t numel;
    bool no_decay;    /* biases and norm weights: skipped by weight decay by default */
} cllm_tensor_info;

typedef struct cllm_model cllm_model;

/* ---- construction ---- */

/* Parses an HF config.json (already loaded as a jansson object) into cfg;
 * `path` only names the file in messages. Unknown model_type, a missing or
 * mistyped key, or inconsistent sizes (hidden size not divisible by heads,
 * heads not divisible by kv heads...) fail with a message naming the key. */
struct json_t;
cllm_status cllm_model_config_from_json(cllm_model_config *cfg, const struct json_t *j,
                                        const char *path);

/* Loads an HF folder (config.json + model.safetensors or a sharded index).
 * Accepts names with or without GPT-2's "transformer." prefix, ignores
 * attn.bias / attn.masked_bias / rotary_emb.inv_freq buffers, and a
 * lm_head.weight duplicate when the head is tied. A missing tensor, an
 * unexpected one, or a wrong shape is an error naming it. */
cllm_status cllm_model_load(cllm_model **out, const char *dir);
/* cllm_model_load with the matrices of inference (linear weights, token
 * embedding, head) in weight format `weights` ("fp32", "bf16", "int8",
 * "q4"; cllm/quant.h), converted while loading; NULL keeps the stored
 * format: the cllm_weights format of a folder written by cllm convert
 * --quantize, bf16 when the files hold bf16 matrices, else fp32. In a
 * format other than fp32 the fp32 copies of those matrices are never made
 * (memory: the format's bytes plus the fp32 norms, biases and position
 * embeddings) and the model runs forwards only (cllm_model_prepare with
 * train is CLLM_ERR_UNSUPPORTED). An unknown name is CLLM_ERR_ARG. */
cllm_status cllm_model_load_weights(cllm_model **out, const char *dir, const char *weights);
/* Loads an HF folder with the linear layers of its blocks quantized as
 * BitsAndBytesConfig c says (cllm/quant.h, docs/lora.md#qlora): a frozen
 * QLoRA base. Embeddings, head, norms and biases stay fp32; the fp32
 * values of the quantized layers are never held whole (one tensor at a
 * time while loading). The model trains only with a trainable set that
 * leaves those layers frozen (LoRA adapters); forwards (eval, generate)
 * run on it as on any model. fp32 matmul precision only. */
cllm_status cllm_model_load_quantized(cllm_model **out, const char *dir, const cllm_bnb_config *c);
/* The format of a quantized base (CLLM_BNB_NONE for other models) and the
 * bytes of its quantized layers. */
cllm_bnb_type cllm_model_quantized(const cllm_model *m);
size_t cllm_model_quantized_bytes(const cllm_model *m);
/* What quantizing a model of config mc by c would hold (cllm estimate):
 * the parameters of the quantized layers, their stored bytes and the
 * parameters of the largest (its dequantized copy is the passes' scratch). */
cllm_status cllm_model_config_quantized(const cllm_model_config *mc, const cllm_bnb_config *c, size_t *numel,
                                        size_t *bytes, size_t *widest);
/* Converts the matrices of a model that has its fp32 parameters into
 * format f (fp32: back to the flat buffer). The fp32 buffer is kept. A
 * model loaded in another format, or prepared for training, is
 * CLLM_ERR_UNSUPPORTED. Not thread-safe with forwards. */
cllm_status cllm_model_set_weights(cllm_model *m, cllm_wfmt f);
/* Lays an fp32 model's weights out for forwards (generate, serve, eval
 * call it after loading): GPT-2's Conv1D matrices, [in, out] in the files,
 * are transposed in place to [out, in], so that decode steps read them
 * row by row on cllm_qmatmul as every other matrix (no second copy; one
 * matrix of scratch while it runs). cllm_model_params then holds those
 * matrices as [out, in]. Whatever needs the file layout puts it back
 * first: cllm_model_prepare with train, cllm_model_set_trainable (and so
 * cllm_lora_attach / cllm_lora_load), cllm_lora_merge,
 * cllm_model_set_weights; cllm_model_save writes the file layout; a
 * tensor-parallel part cannot be cut from it, but a part loaded as one
 * (cllm_tp_model_load_weights) is laid out like a whole model: its slices
 * are matrices of their own. A no-op for other architectures, other weight
 * formats, quantized bases, models prepared for training and models that
 * carry adapters or trainable copies. Not thread-safe with forwards. */
cllm_status cllm_model_set_inference(cllm_model *m);
/* The format the matrices are read in (CLLM_WFMT_FP32 without a store). */
cllm_wfmt cllm_model_weights(const cllm_model *m);
/* Bytes of the matrices one decode step reads: every linear weight and the
 * head (a tied head counted once), in their format. */
size_t cllm_model_weight_bytes(const cllm_model *m);
/* Bytes of the weight buffers the model holds (cllm_weights_bytes of a
 * model): the flat parameters (without the never-written slots of the
 * matrices a weight format stores), the low-precision copy, the weight
 * format's matrices and a quantized base. A tensor part: its slices. */
size_t cllm_model_held_bytes(const cllm_model *m);
/* Writes the model as an HF-style folder whose matrices are stored in its
 * weight format (config.json gains "cllm_weights"; docs/formats/quantized.md)
 * so that cllm_model_load_weights reads them back without conversion. For
 * fp32 weights, as cllm_model_save. */
cllm_status cllm_model_save_weights(const cllm_model *m, const char *dir, size_t max_shard_bytes);

/* Builds a randomly initialised model from an HF config object (copied; it
 * is what cllm_model_save writes back as config.json). Init follows the HF
 * conventions of each family: normal(0, initializer_range) weights, zero
 * biases, unit norm weights, GPT-2's scaled residual projections. */
cllm_status cllm_model_init_random(cllm_model **out, const struct json_t *config, uint64_t seed);

/* Writes config.json and safetensors (F32) into `dir`, creating it if needed;
 * shards when the total exceeds max_shard_bytes (0 = one file). Files are
 * written atomically; the output is a pure function of the model. */
cllm_status cllm_model_save(const cllm_model *m, const char *dir, size_t max_shard_bytes);

void cllm_model_free(cllm_model *m); /* NULL is a no-op */

/* ---- introspection ---- */
const cllm_model_config *cllm_model_get_config(const cllm_model *m);
/* The HF config object cllm_model_save writes as config.json (borrowed). */
const struct json_t *cllm_model_config_json(const cllm_model *m);
int cllm_model_n_tensors(const cllm_model *m);
const cllm_tensor_info *cllm_model_tensor(const cllm_model *m, int i);
const cllm_tensor_info *cllm_model_find_tensor(const cllm_model *m, const char *name);
size_t cllm_model_n_params(const cllm_model *m); /* parameters (sum of numel) */
/* Floats in the params and grads buffers (tensors are 64-byte aligned inside
 * them, so this is slightly more than n_params; the gaps stay zero). */
size_t cllm_model_buffer_len(const cllm_model *m);
float *cllm_model_params(cllm_model *m);
/* The gradients of the trainable buffer (below): NULL until
 * cllm_model_prepare() has allocated training buffers. */
float *cllm_model_grads(cllm_model *m);

/* ---- the trainable set ----
 * By default every tensor trains and the trainable buffer is the flat
 * parameter buffer (cllm_model_params, same length and offsets). A
 * trainable set freezes the rest: the trainable buffer is then a compact
 * allocation of its own, and gradients (and an optimizer's state) exist
 * for it only. Its views are either trained copies of model tensors
 * (`base` >= 0: copied in at declaration, copied back into the model's
 * parameters by cllm_model_params_updated, so call that after every
 * update) or extra tensors that live only there (`base` -1: LoRA's A and
 * B, a new head; zero until the caller writes them through
 * cllm_model_trainable_params). A set that lists every model tensor
 * first (view i copying tensor i) keeps them in place instead: the flat
 * parameter buffer grows by the extra tensors and is the trainable buffer,
 * with the model's own offsets (full training plus a new head, no copy).
 * Frozen tensors get no gradient: the backward pass skips their weight
 * gradients and computes only what flows through them. A view's name must be unique and shorter than 96
 * characters; the shape of a copy is its tensor's (ndim/shape ignored).
 * Frees the gradient buffer (the next prepare allocates one of the new
 * length). Refused with layer hooks set (ZeRO-3, per-layer reductions). */
typedef struct {
    const char *name;
    int base;          /* model tensor index, or -1 for an extra tensor */
    int ndim;          /* extra tensors: 1 or 2 */
    int64_t shape[2];
    bool no_decay;
} cllm_trainable_spec;
cllm_status cllm_model_set_trainable(cllm_model *m, const cllm_trainable_spec *views, int n);
/* Back to training everything (drops the set and its buffers, and LoRA
 * adapters with them: cllm_lora_merge first to keep what they learned).
 * cllm_model_set_trainable is refused while adapters are attached. */
void cllm_model_train_all(cllm_model *m);
/* True when a trainable set is declared (frozen tensors or extra ones). */
bool cllm_model_has_trainable_set(const cllm_model *m);
/* The views of the trainable buffer (every model tensor without a set):
 * names, shapes and offsets into cllm_model_trainable_params / grads. */
int cllm_model_n_trainable(const cllm_model *m);
const cllm_tensor_info *cllm_model_trainable(const cllm_model *m, int i);
/* The model tensor view i copies, or -1 for an extra tensor. */
int cllm_model_trainable_base(const cllm_model *m, int i);
int cllm_model_find_trainable(const cllm_model *m, const char *name); /* -1: none */
/* Floats of the trainable buffer (alignment gaps included) and the
 * trainable parameters it holds (sum of numel). */
size_t cllm_model_trainable_len(const cllm_model *m);
size_t cllm_model_trainable_numel(const cllm_model *m);
/* The trainable buffer: cllm_model_params(m) without a set. */
float *cllm_model_trainable_params(cllm_model *m);

/* Freezes the model tensors whose names match any of the n patterns and
 * trains the others: a trainable set (above) of copies of the tensors
 * left, so gradients and optimizer state exist for them alone (the
 * training config's "freeze", docs/training.md#freezing-tensors). Each
 * pattern is a PCRE2 regular expression searched anywhere in the
 * safetensors names (Python's re.search: "embed" freezes
 * model.embed_tokens.weight; anchor with ^ and $). A pattern that does not
 * compile or matches no tensor, and patterns that freeze every tensor, are
 * CLLM_ERR_ARG naming the pattern. */
cllm_status cllm_model_freeze(cllm_model *m, const char *const *patterns, int n);
/* The inverse (the config's "unfrozen_parameters", axolotl's key and rule):
 * the patterns name the tensors that train and every other tensor is
 * frozen; each pattern matches from the start of a name (Python's
 * re.match) with every "." literal ("model.layers.1[0-9]" trains blocks
 * 10-19). The same errors, and patterns that name every tensor. */
cllm_status cllm_model_freeze_except(cllm_model *m, const char *const *patterns, int n);
/* The trainable buffer such a freeze (except: cllm_model_freeze_except)
 * gives a model of HF config object `config` (floats, alignment gaps
 * included: cllm_model_trainable_len) and the parameters it trains, without
 * allocating the model (cllm estimate). The same errors. */
cllm_status cllm_model_config_freeze(const struct json_t *config, const char *const *patterns, int n, bool except,
                                     size_t *len, size_t *numel);

/* ---- running ---- */

/* Allocates activation buffers for batches of up to B x T tokens (and the
 * gradient buffer when `train` is set). Reallocates only when the shape grows.
 * T must not exceed n_ctx (when the model has a limit). */
cllm_status cllm_model_prepare(cllm_model *m, int B, int T, bool train);

/* Builds shifted targets from labels: targets[b,t] = labels[b,t+1] for
 * t < T-1, -100 at t = T-1. Returns the number of counted targets. */
long cllm_model_make_targets(int32_t *targets, const int32_t *labels, int B, int T);

/* Checks every id of tokens[n] (and of targets, where not -100) against the
 * vocabulary; the message names the first bad position. */
cllm_status cllm_model_check_ids(const cllm_model *m, const int32_t *tokens, const int32_t *targets,
                                 size_t n);

/* Forward pass with loss: returns in *loss_sum the sum of per-target losses
 * and in *n_counted the number of counted targets. When `backward` is set,
 * also runs the backward pass and ACCUMULATES grad_scale * d(loss_sum)/dparam
 * into the gradient buffer (callers zero it per optimizer step with
 * cllm_model_zero_grads; for a mean loss pass grad_scale = 1/total counted).
 * tokens and targets are [B,T]; ids must be valid (cllm_model_check_ids). */
cllm_status cllm_model_forward_backward(cllm_model *m, const int32_t *tokens,
                                        const int32_t *targets, int B, int T, bool backward,
                                        float grad_scale, double *loss_sum, long *n_counted);
void cllm_model_zero_grads(cllm_model *m);

/* Per-token inputs and outputs of a loss pass, for training objectives
 * other than the mean token loss (include/cllm/objective.h):
 *   token_loss  [B*T] out: each target's loss -log p(target | prefix),
 *               0 where the target is -100; NULL: not wanted
 *   token_scale [B*T] in: d(objective)/d(token_loss[n]) per token, used
 *               by the backward pass in place of the uniform grad_scale
 *               (e.g. -w for an objective that rewards a weighted sum of
 *               log-probabilities); NULL: grad_scale for every token */
typedef struct {
    float *token_loss;
    const float *token_scale;
    /* hidden  [B*T, C] out: the final norm's output (what the LM head reads;
     *         a reward model's score head reads a row of it); NULL: not wanted
     * dhidden [B*T, C] in: d(objective)/d(hidden), added to what the LM head
     *         sends back (a value head beside the LM loss, or alone);
     *         NULL: none
     * no_lm_head: skip the LM head and its loss altogether (*loss_sum and
     *         *n_counted are 0; targets are not read): the backward pass
     *         starts from dhidden alone */
    float *hidden;
    const float *dhidden;
    bool no_lm_head;
    /* The score head of a sequence-classification model (num_labels 1) in
     * place of the LM head (required for such a model; targets are not read
     * and *loss_sum, *n_counted are 0):
     * score_pos [B] in: the position scored in each row (see
     *         cllm_model_score_position)
     * scores  [B] out: score.weight . final-norm hidden state at that position
     * score_grad: with backward, called once between the forward and the
     *         backward pass with the scores; it writes dscores[B] =
     *         d(objective)/d(score) (grad_scale already applied), which the
     *         backward pass sends into score.weight's gradient and the model.
     *         score_ctx is its first argument; dscores the caller's [B]. */
    const int32_t *score_pos;
    float *scores;
    float *dscores;
    cllm_status (*score_grad)(void *ctx, const float *scores, float *dscores, int B);
    void *score_ctx;
    /* The value head of a model with one (cllm_model_config.value_head),
     * beside the LM head or alone (no_lm_head):
     * values  [B*T] out: v_head.summary.weight . h[n] + bias at every
     *         position n of the final norm's output; NULL: not wanted
     * dvalues [B*T] in: with backward, d(objective)/d(values[n]) (grad_scale
     *         already applied), sent into the value head's gradient and the
     *         model; NULL: none */
    float *values;
    const float *dvalues;
} cllm_token_io;

/* cllm_model_forward_backward with per-token outputs and gradient scales
 * (io may be NULL: then exactly cllm_model_forward_backward). With
 * token_scale the backward pass ACCUMULATES sum_n token_scale[n] *
 * d(token_loss[n])/dparam. Works at every ZeRO stage and under tensor
 * parallelism; *loss_sum and *n_counted as there. The hidden-state fields
 * serve heads other than the LM head (reward scores, values). */
cllm_status cllm_model_forward_backward_ex(cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                           bool backward, float grad_scale, const cllm_token_io *io,
                                           double *loss_sum, long *n_counted);

/* ---- sequence classification (reward models) ----
 * The position HF's *ForSequenceClassification reads in a row of `len`
 * tokens: the last one that is not the config's pad_token_id (the last
 * token when the config has none; 0 when every token is padding). */
int cllm_model_score_position(const cllm_model *m, const int32_t *row, int len);

/* Turns the causal LM *m into a reward model (a no-op when it already is
 * one): same config and base tensors, architectures
 * "<Family>ForSequenceClassification", id2label {"0": "LABEL_0"}, the LM
 * head dropped, and a new score.weight [1, C] drawn from
 * normal(0, initializer_range) (HF's init; default 0.02) with `seed`.
 * pad_token_id, when the config has none, becomes eos_token_id (trl's
 * usual pad = EOS), so that HF scores the same token on padded batches.
 * On success *m is replaced (call cllm_model_prepare again); on failure it
 * is untouched. */
cllm_status cllm_model_to_reward(cllm_model **m, uint64_t seed);

/* Gives the causal LM *m a value head (a no-op when it has one): the same
 * config and tensors plus v_head.summary.weight [1, C] and
 * v_head.summary.bias [1], initialised as torch's nn.Linear(C, 1) is
 * (uniform in +-1/sqrt(C), trl's default) from `seed`. cllm_model_save
 * writes them under those names beside the model's (trl's layout). On
 * success *m is replaced (call cllm_model_prepare again). */
cllm_status cllm_model_add_value_head(cllm_model **m, uint64_t seed);

/* ---- pipeline stages ----
 * A stage runs units [u0, u1) of the layer sequence (0 the embedding,
 * 1 + l block l, n_layer + 1 the final norm, head and loss; see
 * cllm/topo.h). Its input is the token ids (u0 == 0) or x_in[B*T, C], the
 * previous stage's output; its output is x_out[B*T, C], or the loss (the
 * stage holding the head: *loss_sum and *n_counted as in
 * cllm_model_forward_backward, with targets). With `backward` the same call
 * continues into the backward pass: dx_out[B*T, C] is the gradient of the
 * stage's output (unused on the head's stage), parameter gradients of the
 * stage's tensors ACCUMULATE into the gradient buffer (scaled by grad_scale
 * at the loss), and dx_in[B*T, C] receives the gradient of its input
 * (unused on the embedding's stage). Running every stage in order, each on
 * the previous one's output and gradient, gives exactly the values of
 * cllm_model_forward_backward (the same kernels in the same order). Only
 * the stage's parameters are read, plus the embedding matrix on a tied
 * head's stage. The layer hooks (below) run around each of the stage's
 * groups as in the whole-model pass; a tied head's stage (without the
 * embedding) also fetches group 0 around the head, and its gradient of
 * group 0 is ready (grads_ready) after the head's backward: the hooks give
 * that stage its own copy of the embedding and take its share of the
 * gradient (the first stage adds the embedding's). */
typedef struct {
    int u0, u1;
    const int32_t *tokens, *targets; /* [B*T]: tokens on the first stage, targets on the head's */
    const float *x_in, *dx_out;
    float *x_out, *dx_in;
    bool backward;
    float grad_scale;
} cllm_model_stage_io;
cllm_status cllm_model_stage_run(cllm_model *m, const cllm_model_stage_io *io, int B, int T, double *loss_sum,
                                 long *n_counted);
/* Floats of x_in, x_out, dx_out and dx_in: B*T*C, or under sequence
 * parallelism (cllm_model_set_sequence_parallel) this tensor rank's
 * B*(T/tp)*C, the positions it holds (stages then exchange that part). */
size_t cllm_model_stage_floats(const cllm_model *m, int B, int T);

/* ---- tensor parallelism ----
 * Marks m as tensor rank `rank`'s part of a model cut over `size` ranks
 * (cllm_tp_model_part in cllm/split.h), running with the other parts over
 * the dist group g (size ranks, group rank = tensor rank). Every forward and
 * backward call is then collective over g: all its ranks call with the same
 * tokens and targets, and every rank gets the whole model's loss and its
 * part of the gradient. size 1 (the default) is the single-process code,
 * bit for bit. cllm_model_forward_logits refuses a part; generation over
 * parts runs through the key/value cache (cllm/generate.h, "Tensor-parallel
 * inference"). */
struct cllm_dist_group;
cllm_status cllm_model_set_tensor_parallel(cllm_model *m, const struct cllm_dist_group *g, int rank, int size);
/* The whole model's vocabulary: config vocab_size, or for a tensor part the
 * unpadded vocabulary of the model it was cut from (its config holds the
 * padded local ceil(V / tp)). Token ids and logits rows use this. */
int cllm_model_vocab(const cllm_model *m);
/* Tensor-parallel size and this part's rank (1 and 0 for a whole model). */
int cllm_model_tensor_size(const cllm_model *m);
int cllm_model_tensor_rank(const cllm_model *m);
/* Megatron's sequence parallelism on a tensor part (Korthikanti et al.,
 * "Reducing Activation Recomputation in Large Transformer Models"): the
 * regions outside the tensor-parallel linears (the norms, the residual adds,
 * the embedding output, the final norm) run on this rank's T / size
 * positions of every sequence; an all-gather along the sequence replaces the
 * identity before each column-parallel linear (QKV, fc/gate/up, the head)
 * and a reduce-scatter replaces the all-reduce after each row-parallel one
 * (o, down, the vocabulary-parallel embedding); the backward pass runs the
 * conjugates, and the norms' parameter gradients of the local positions are
 * summed over the group. Losses and gradients equal the tensor-parallel run
 * (up to the order of additions). Call before cllm_model_prepare, after
 * cllm_model_set_tensor_parallel (size > 1: CLLM_ERR_ARG otherwise); every
 * pass must then have T divisible by the tensor size. Training passes only
 * (pipeline stages exchange the local positions: cllm_model_stage_floats);
 * a score or value head and hidden states are refused. */
cllm_status cllm_model_set_sequence_parallel(cllm_model *m, bool on);
bool cllm_model_sequence_parallel(const cllm_model *m);

/* Mixtral's load-balancing loss of the last forward pass (transformers'
 * load_balancing_loss_func over every layer's router), unscaled; 0 for a
 * dense model. With output_router_logits set in config.json, the loss_sum
 * of a cllm_model_forward_backward(_ex) call without per-token scales also
 * holds router_aux_loss_coef * aux * n_counted (so loss_sum / n_counted is
 * HF's outputs.loss, cross-entropy plus the scaled auxiliary loss), and its
 * backward pass includes the auxiliary loss's gradient. */
double cllm_model_aux_loss(const cllm_model *m);

/* ---- mixture of experts: capacity and expert parallelism (docs/moe.md) ----
 * Capacity (DeepSpeed-MoE's): a pass over N rows lets each expert keep at
 * most max(min_capacity, ceil(N * k / E * capacity_factor)) of its routed
 * choices, every row's first choice before any second choice and rows in
 * order within a rank of choice; a dropped choice adds nothing to its row's
 * output (the other choices keep their weights; a row with every choice
 * dropped passes through the block's residual only). Factor 0 (the
 * default): no limit, transformers' Mixtral. */
cllm_status cllm_model_set_moe_capacity(cllm_model *m, double capacity_factor, int min_capacity);
/* Runs the experts of every block split over the `size` ranks of group g
 * (this rank is group rank `rank` and runs experts rank*E/size ..
 * (rank+1)*E/size - 1, on the rows every rank of g routes to them: two
 * all-to-alls per block forward and two backward). Every forward and
 * backward pass is then collective over g. A model that keeps every
 * expert leaves the others' untouched (zero gradients here: the
 * data-parallel gradient sum over all ranks completes them); a part
 * (cllm_moe_model_part) holds only its own. size 1 turns it off (refused
 * for a part). Errors name expert_parallel_size when it does not divide the
 * experts or the model has none. */
struct cllm_dist_group;
cllm_status cllm_model_set_expert_parallel(cllm_model *m, const struct cllm_dist_group *g, int rank, int size);
int cllm_model_expert_parallel_size(const cllm_model *m);
/* Expert-parallel parts (moe_slice.c): the model one rank of an
 * expert-parallel group of P ranks holds when its flat buffers keep only
 * its own experts. cllm_moe_model_part: group rank q's part of `full`:
 * every non-expert tensor (the router still scores all E experts) and
 * experts q*E/P .. (q+1)*E/P - 1 of every block under their global names,
 * values copied; it runs only under cllm_model_set_expert_parallel with
 * that rank and size (others are refused). Every part of a group has the
 * same layout. cllm_moe_model_whole: the whole model's layout (every
 * expert) with zeroed parameters, for a part's config.
 * cllm_moe_cut_buffer: the part's share of a buffer laid out as the whole
 * model's (parameters or an optimizer state); cllm_moe_gather_buffer:
 * collective over the group g (group rank q holding part q): full_buf on
 * group rank 0 (NULL: not kept) receives every part's tensors.
 * cllm_moe_model_experts_held: experts per block in m's buffers (E when
 * whole) and the first one's index; cllm_moe_tensor_is_expert: tensor i is
 * an expert's; cllm_moe_model_expert_params: parameters of those. */
cllm_status cllm_moe_model_part(cllm_model **out, const cllm_model *full, int P, int q);
cllm_status cllm_moe_model_whole(cllm_model **out, const cllm_model *part);
void cllm_moe_cut_buffer(const cllm_model *whole, const cllm_model *part, const float *full_buf, float *part_buf);
cllm_status cllm_moe_gather_buffer(const cllm_model *whole, const cllm_model *part, const struct cllm_dist_group *g,
                                   const float *part_buf, float *full_buf);
int cllm_moe_model_experts_held(const cllm_model *m, int *first);
bool cllm_moe_tensor_is_expert(const cllm_model *m, int i);
size_t cllm_moe_model_expert_params(const cllm_model *m);
/* The file layout of a Mixtral's expert tensors (docs/moe.md, "Tensors"):
 * per-expert, transformers 4.x's block_sparse_moe.experts.N.w1/w2/w3 and
 * cllm's own tensor names; fused, transformers 5.x's mlp.experts.gate_up_proj
 * [E, 2F, C] and down_proj [E, C, F] with the router at mlp.gate. Loading
 * reads either (the tensor names tell); cllm_model_save writes the one set
 * here, per-expert by default (transformers 4.x reads only that one, 5.x
 * converts it when loading). Fused on a model without experts is an error. */
typedef enum { CLLM_EXPERTS_PER_EXPERT = 0, CLLM_EXPERTS_FUSED = 1 } cllm_expert_layout;
bool cllm_expert_layout_from_name(const char *name, cllm_expert_layout *out); /* "per-expert", "fused" */
cllm_status cllm_model_set_expert_layout(cllm_model *m, cllm_expert_layout layout);
/* Counters of the training forwards since the last reset (which allocates
 * them): [n_experts + 2] = choices routed to each expert (summed over
 * blocks, before the capacity), choices dropped, all choices. NULL before
 * the first reset or for a dense model. */
cllm_status cllm_model_moe_reset_counters(cllm_model *m);
const int64_t *cllm_model_moe_counters(const cllm_model *m);

/* Logits of the last position of each row, for generation: logits[B,V]. */
cllm_status cllm_model_forward_logits(cllm_model *m, const int32_t *tokens, int B, int T,
                                      float *logits);

/* FLOPs of one training step (forward + backward) on B x T tokens, counting
 * matmuls and attention (2 FLOPs per multiply-add, backward = 2x forward). */
double cllm_model_train_flops(const cllm_model *m, int B, int T);

/* ---- per-phase timing of the training pass ---- */

/* Wall-clock seconds of each phase of cllm_model_forward_backward(_ex),
 * summed over the calls since the last take: the dense matrix products
 * (oneDNN; the LM head's apart), the tiled attention, and the element-wise
 * passes. Off by default; when off the passes read no clock. The trainer
 * turns it on with the environment variable CLLM_PROFILE=1 and writes each
 * step's figures into metrics.jsonl as prof_<name> (docs/training.md). */
typedef enum {
    CLLM_PROF_GEMM_FWD,  /* block linears, forward (QKV, O, MLP) */
    CLLM_PROF_GEMM_BWD,  /* block linears, input and weight gradients */
    CLLM_PROF_HEAD_GEMM, /* LM head, forward and backward */
    CLLM_PROF_XENT,      /* softmax cross-entropy over the vocabulary (and its gradient) */
    CLLM_PROF_ATTN_FWD,  /* tiled causal attention, forward */
    CLLM_PROF_ATTN_BWD,  /* tiled causal attention, backward */
    CLLM_PROF_NORM,      /* LayerNorm / RMSNorm, forward and backward */
    CLLM_PROF_ACT,       /* GELU / SwiGLU, forward and backward */
    CLLM_PROF_ROPE,      /* rotary embeddings, forward and backward */
    CLLM_PROF_RESIDUAL,  /* residual adds */
    CLLM_PROF_ZERO,      /* zeroing the gradient scratch before accumulation */
    CLLM_PROF_EMBED,     /* embedding lookup and its gradient */
    CLLM_PROF_N
} cllm_prof_phase;

/* Starts (on) or stops timing the phases; starting clears the sums. */
cllm_status cllm_model_set_profile(cllm_model *m, bool on);
/* Copies the sums into seconds[CLLM_PROF_N] (zeros when off) and clears them. */
void cllm_model_take_profile(cllm_model *m, double seconds[CLLM_PROF_N]);
/* "gemm_fwd", "gemm_bwd", "head_gemm", "xent", ...: the phase's name. */
const char *cllm_prof_name(int phase);

/* ---- parameter groups and layer hooks (ZeRO-3, per-layer gradient reduction) ---- */

/* The flat buffer in groups: group 0 holds the tensors before the blocks
 * (embeddings, BLOOM's embedding norm), group 1 + l block l's tensors, group
 * n_layer + 1 those after the blocks (final norm, an untied head). Each group
 * is one contiguous range [begin, end) of the flat buffer (64-byte aligned
 * tensors back to back, gaps included). n_groups = n_layer + 2. */
int cllm_model_n_groups(const cllm_model *m);
void cllm_model_group_range(const cllm_model *m, int group, size_t *begin, size_t *end);

/* Optional callbacks around the use of each group by the forward and
 * backward passes (cllm_model_forward_backward, cllm_model_forward_logits).
 * Every member may be NULL; without hooks the flat buffers are used and
 * nothing changes (bit for bit).
 *   fetch_params(ctx, g, next, &p): before group g's parameters are read
 *     (forward, recomputation or backward). *p receives a buffer of the
 *     group's length (end - begin floats, laid out as the flat buffer from
 *     `begin`) that the passes read until release_params(g); `next` is the
 *     group the passes will fetch next (-1: none), for prefetching.
 *   fetch_params_lp(ctx, g, &lp): with a bf16/fp16 model (set_precision),
 *     right after fetch_params: *lp receives the low-precision copy of the
 *     group's parameters that its matmuls read (cllm_model_lp_copy of the
 *     buffer fetch_params handed out, element for element), valid until
 *     release_params(g). Without it such a model fails in its first
 *     linear layer once the flat parameters are dropped.
 *   release_params(ctx, g): group g's parameters are no longer read.
 *   fetch_grads(ctx, g, &gr): before group g's gradients are written in a
 *     backward pass; *gr receives a ZEROED buffer of the group's length that
 *     the backward accumulates into until grads_ready(g). With this hook,
 *     cllm_model_prepare allocates no flat gradient buffer.
 *   grads_ready(ctx, g): group g's gradient of this backward pass is
 *     complete (blocks right after their backward, group n_layer + 1 after
 *     the final norm's, group 0 last). The buffer is not touched again. It
 *     is called also without fetch_grads (the group's part of the flat
 *     gradient buffer is then complete).
 * Order: forward fetches 0, 1, ..., n_layer + 1 (and 0 again with a tied
 * head); backward fetches n_layer + 1 (and 0 when tied) for the head, then
 * n_layer, ..., 1, then 0; each fetch is released before the same group is
 * fetched again. A failing hook's status is returned by the pass. */
typedef struct {
    void *ctx;
    cllm_status (*fetch_params)(void *ctx, int group, int next, float **params);
    cllm_status (*release_params)(void *ctx, int group);
    cllm_status (*fetch_grads)(void *ctx, int group, float **grads);
    cllm_status (*grads_ready)(void *ctx, int group);
    cllm_status (*fetch_params_lp)(void *ctx, int group, const void **lp);
} cllm_model_hooks;

/* Installs (copies) the hooks; NULL removes them. Set fetch_grads before
 * cllm_model_prepare to avoid the flat gradient buffer. */
void cllm_model_set_hooks(cllm_model *m, const cllm_model_hooks *hooks);
/* Frees the flat parameter buffer (ZeRO-3: the ranks keep slices, and the
 * hooks hand out gathered groups) and its low-precision copy;
 * cllm_model_params returns NULL after it, and loading, saving and
 * generation need cllm_model_set_params first (which makes the copy again
 * for a bf16/fp16 model, lazily). */
void cllm_model_drop_params(cllm_model *m);
/* Replaces the flat parameter buffer with `params` (cllm_model_buffer_len
 * floats from cllm_alloc/malloc), taking ownership of it. */
void cllm_model_set_params(cllm_model *m, float *params);

/* ---- presets for `cllm init` ---- */
/* Fills `config` (a new JSON object the caller json_decref()s) with the HF
 * config.json of a named preset of an architecture: "tiny" (for tests),
 * "gpt2-124M", "llama-100M", "bloom-560m"... Unknown names fail listing the
 * known ones. */
cllm_status cllm_model_preset(struct json_t **config, cllm_arch arch, const char *preset);
/* Whether `key` is a config.json key of the family that cllm reads or
 * writes (the presets' keys and the optional ones the parser reads), so a
 * misspelt `cllm init --set` key can be refused. */
bool cllm_model_config_key_known(cllm_arch arch, const char *key);
/* The same by family name: an arch's name, or "mixtral" (the LLaMA code
 * with a mixture-of-experts FFN: presets "tiny", "mixtral-8x100M"). */
cllm_status cllm_model_family_preset(struct json_t **config, const char *family, const char *preset);
bool cllm_model_family_key_known(const char *family, const char *key);

/* ---- vocabulary resizing ---- */
/* Grows the vocabulary of *m to new_vocab rows: the token embedding (GPT-2
 * wte, LLaMA embed_tokens, BLOOM word_embeddings) and an untied lm_head.
 * Old rows are copied bit for bit; each new row is the mean of the old rows
 * of its tensor (computed in double), plus noise_std * N(0, 1) from a
 * generator seeded with `seed` when noise_std > 0. config vocab_size is
 * updated. On success *m is replaced by the resized model (the old one is
 * freed; activation and gradient buffers are not carried over, call
 * cllm_model_prepare again). Shrinking (new_vocab < vocab_size) is refused
 * with CLLM_ERR_ARG because the dropped rows may belong to ids in use; equal
 * sizes leave *m unchanged. On failure *m is untouched. */
cllm_status cllm_model_resize_vocab(cllm_model **m, int new_vocab, float noise_std, uint64_t seed);

/* ---- activation checkpointing and memory sizes ---- */

/* Requests activation recomputation ("gradient checkpointing") from the next
 * cllm_model_prepare on: the forward pass keeps only each block's input
 * (n_layer x [B,T,C]) plus ONE set of the other per-block activations shared
 * by all blocks, and the backward pass recomputes each block's forward from
 * its saved input just before that block's backward (the last block's are
 * still in place). The same kernels run in the same order, so losses and
 * gradients are bit-for-bit those of a run without recomputation; the price
 * is one more forward pass of all blocks but the last per backward. Call it
 * before cllm_model_prepare (a prepared model switching modes reallocates on
 * the next prepare). Off by default. */
void cllm_model_set_recompute(cllm_model *m, bool on);
/* True when the buffers of the last prepare use recomputation. */
bool cllm_model_recomputes(const cllm_model *m);

/* The parts of the one activation allocation of cllm_model_prepare, in
 * bytes (each part rounded as it is carved: 64-byte aligned regions). */
typedef struct {
    size_t block_inputs; /* every block's input x: n_layer x [N,C] */
    size_t block_set;    /* one block's other saved activations (ln1, qkv, attention, mlp, stats) */
    size_t block_saved;  /* those of all blocks: n_layer x block_set, or 1 x block_set with recompute */
    size_t logits;       /* one chunk of logits [rows,V] of the fused head + cross-entropy */
    size_t head;         /* final norm, embedding norm (BLOOM), losses, RoPE/ALiBi tables */
    size_t backward;     /* backward scratch (gradients of one block's activations); 0 without train */
    size_t total;        /* sum of the above: the allocation's size */
} cllm_act_bytes;

/* Sizes of the activation buffer cllm_model_prepare(B, T, train) allocates
 * for a model of config c, with or without recomputation; computed by the
 * same carving code prepare uses, without allocating. */
void cllm_model_activation_bytes(const cllm_model_config *c, int B, int T, bool train, bool recompute,
                                 cllm_act_bytes *out);

/* The same for a tensor part with sequence parallelism over sp ranks
 * (cllm_model_set_sequence_parallel; sp 1, or sp not dividing T: without):
 * the residual stream, the norms and their statistics hold T / sp positions
 * of each sequence, plus shared buffers for the gathered norm outputs. */
void cllm_model_activation_bytes_sp(const cllm_model_config *c, int B, int T, bool train, bool recompute, int sp,
                                    cllm_act_bytes *out);

/* Bytes of the activation buffer allocated by the last prepare (0 before). */
size_t cllm_model_activation_alloc(const cllm_model *m);

/* Parameters (sum of numel) and flat buffer length in floats (with the
 * 64-byte alignment gaps, as cllm_model_buffer_len) of a model of config c,
 * without allocating its parameters. Fails only when out of memory. */
cllm_status cllm_model_config_params(const cllm_model_config *c, size_t *n_params, size_t *buffer_len);

/* Parameters of each unit of the layer sequence a pipeline splits: units[0]
 * the embedding (with GPT-2's positions and BLOOM's embedding norm),
 * units[1 + l] block l, units[n_layer + 1] the head (final norm and LM
 * head; a tied head counts the embedding matrix again, since the stage that
 * runs the head keeps a copy). units has n_layer + 2 entries. */
cllm_status cllm_model_config_unit_params(const cllm_model_config *c, size_t *units);

/* Per unit as above, the floats of the tensors with fewer than `threshold`
 * elements (those ZeRO-3 keeps whole: stage3_param_persistence_threshold);
 * a tied embedding counts in units[0] only. */
cllm_status cllm_model_config_unit_small(const cllm_model_config *c, double threshold, size_t *units);

/* Floats of parameter group 0 (embeddings), of the last group (final norm,
 * untied head) and of the largest block group of a model of config c (see
 * cllm_model_n_groups), without allocating its parameters. */
cllm_status cllm_model_config_groups(const cllm_model_config *c, size_t *first, size_t *last, size_t *max_block);

/* ---- mixed precision ---- */

/* Arithmetic of the matmuls (every linear layer and the head):
 * - CLLM_PREC_FP32: fp32 operands (the default).
 * - CLLM_PREC_BF16: bf16 operands, fp32 accumulation and fp32 outputs
 *   (oneDNN, AMX/AVX512-BF16 where the CPU has them). Weights come from a
 *   bf16 copy of the parameters; the input activations of each matmul and,
 *   in the backward pass, the output gradients are rounded to bf16 as they
 *   enter it. Everything else stays fp32: the parameters themselves (the
 *   master weights the optimizer updates), gradients, embeddings, norms and
 *   their statistics, softmax/attention, GELU/SwiGLU, residual adds,
 *   cross-entropy and the loss.
 * - CLLM_PREC_FP16: the same data flow with IEEE half precision, emulated
 *   in fp32 (this CPU's oneDNN has no fp16 GEMM): operands are rounded to
 *   fp16 values, multiplied in fp32 (the products of two fp16 values are
 *   exact in fp32) and accumulated in fp32, and every matmul output (the
 *   linear outputs, the logits and the activation gradients) is rounded to
 *   fp16, so values beyond +-65504 become +-inf as on fp16 hardware: what a
 *   dynamic loss scaler has to see. It costs a little more than fp32.
 * The low-precision copy of the parameters is refreshed lazily, before the
 * next forward pass, after anything that may have changed the parameters:
 * cllm_model_set_precision, cllm_model_params_updated, and any call of
 * cllm_model_params (its pointer is writable, so a caller may change them).
 * Load, init and resize give a fresh model (resize keeps the precision).
 * Costs 2 bytes (bf16) or 4 bytes (fp16) per parameter, plus two operand
 * scratch buffers sized at cllm_model_prepare (cllm_model_precision_bytes).
 * Fails only when out of memory (the model is then unchanged). */
typedef enum { CLLM_PREC_FP32 = 0, CLLM_PREC_BF16, CLLM_PREC_FP16, CLLM_PREC_COUNT } cllm_precision;
cllm_status cllm_model_set_precision(cllm_model *m, cllm_precision p);
cllm_precision cllm_model_precision(const cllm_model *m);
/* Marks the parameters as changed (call after an optimizer step or any
 * write through cllm_model_params' pointer made after the last call). */
void cllm_model_params_updated(cllm_model *m);
/* The low-precision copy of n parameters as a model of precision p feeds
 * them to its matmuls: bf16 values (uint16_t) for bf16, fp16 values held in
 * fp32 (float) for fp16; cllm_precision_copy_bytes(p) bytes per element (0
 * for fp32, where nothing is written). */
void cllm_model_lp_copy(cllm_precision p, void *dst, const float *src, size_t n);
size_t cllm_precision_copy_bytes(cllm_precision p);
/* "fp32", "bf16", "fp16"; NULL / false for anything else. */
const char *cllm_precision_name(cllm_precision p);
bool cllm_precision_from_name(const char *name, cllm_precision *out);
/* Bytes the precision adds to a model of config c prepared for B x T
 * tokens (the parameter copy and the operand scratch, and for bf16 on a CPU
 * without a native bf16 GEMM the widened operands of the largest GEMM, see
 * cllm_matmul_bf16_scratch_bytes); 0 for fp32. */
size_t cllm_model_precision_bytes(const cllm_model_config *c, size_t buffer_len, int B, int T, cllm_precision p);

#ifdef __cplusplus
}
#endif
#endif
