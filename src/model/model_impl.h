/*
 * Private model internals shared by layout.c, model.c, run.c and
 * generate.c: the per-layer parameter slots of the architecture table, the
 * activation buffers of a prepared model, and the one forward pass.
 */
#ifndef CLLM_MODEL_IMPL_H
#define CLLM_MODEL_IMPL_H

#include <jansson.h>
#include <stdint.h>
#include <stdatomic.h>

#include "cllm/io.h"
#include "cllm/model.h"
#include "cllm/quant.h"

/* Parameter slots of one transformer block. Each family fills the ones it
 * has; the others stay -1. "fc" is GPT-2's c_fc, BLOOM's dense_h_to_4h and
 * LLaMA's gate_proj; "down" is c_proj / dense_4h_to_h / down_proj. QKV is the
 * fused projection of GPT-2 and BLOOM; Q, K, V are LLaMA's separate ones. */
enum {
    L_LN1_W, L_LN1_B, L_QKV_W, L_QKV_B, L_Q_W, L_Q_B, L_K_W, L_K_B, L_V_W, L_V_B,
    L_O_W, L_O_B, L_LN2_W, L_LN2_B, L_FC_W, L_FC_B, L_UP_W, L_UP_B, L_DOWN_W, L_DOWN_B,
    /* Mixtral's sparse FFN (moe.c): the router, and the first expert's w1
     * (gate), w3 (up), w2 (down); expert e's tensor is that index + e */
    L_ROUTER_W, L_EXP_W1, L_EXP_W3, L_EXP_W2,
    L_NSLOTS
};
/* Slots outside the blocks. G_HEAD is -1 when the head is tied to G_WTE
 * and in a sequence-classification model, whose head is G_SCORE (HF's
 * score.weight [num_labels, C]; -1 in a causal LM). */
enum { G_WTE, G_WPE, G_EMB_LN_W, G_EMB_LN_B, G_LNF_W, G_LNF_B, G_HEAD, G_SCORE, G_VHEAD_W, G_VHEAD_B, G_NSLOTS };

/* Adapters of a set (cllm_lora_set, lora_set.c) chosen per row of a
 * forward: the rows seg_rows[k]..seg_rows[k+1]-1 use adapter
 * seg_adapter[k] (-1: none), or every row adapter `all` when it is >= 0.
 * scratch holds model_lora_rows_scratch(set, rows) floats (NULL with `all`). */
typedef struct {
    const struct cllm_lora_set *set;
    int all, n_seg;
    const int32_t *seg_rows;    /* [n_seg + 1] */
    const int32_t *seg_adapter; /* [n_seg] */
    float *scratch;
} model_lora_rows;
/* out[N, OUT] += each row's adapter on the layer of weight tensor w. */
cllm_status model_lora_rows_forward(const model_lora_rows *r, int w, float *out, const float *inp, int N);
/* The adapter delta of decode-sized calls (N <= WEIGHTS_SMALL_ROWS rows),
 * without a GEMM call per adapter: out[n] += scale_n * B_n (A_n inp[n]) for
 * every row n whose ad[n].A is set, row by row in one fixed order (a row's
 * result depends on nothing else in the call), in one parallel region.
 * h: N * max(ad[n].r) floats. Used by the single adapter (lora.c) and the
 * per-row sets (lora_set.c) alike, so both give the same bits. */
typedef struct {
    const float *A, *B; /* [r, IN], [OUT, r] */
    int r;
    float scale;
} model_lora_row;
void model_lora_small_forward(float *out, const float *inp, const model_lora_row *ad, int N, int IN, int OUT,
                              float *h);
size_t model_lora_rows_scratch(const struct cllm_lora_set *set, int rows);

/* Operand scratch of the bf16/fp16 linear layers (precision.c): where
 * activations and gradients are rounded on their way into a matmul. It is
 * run state, never part of the weights: the training run keeps one in the
 * model (grown to the prepared batch), each KV cache its own (sized once
 * at init, `fixed`), so forwards over one model on several threads never
 * share one. `widen` is the workspace of bf16 GEMMs widened to fp32 on CPUs
 * without a native bf16 GEMM (NULL: the matmul module's shared buffer). */
typedef struct {
    void *a, *b;      /* two regions of `elems` elements (b is NULL in a cache: forwards only) */
    size_t elems;
    bool fixed;       /* never grown: too small is an internal error */
    float *widen;
    size_t widen_bytes;
    float *deq;       /* weight formats (weights.c): quantized activations, or widened bf16 tiles */
    size_t deq_elems;
    const model_lora_rows *rows; /* adapters per row (lora_set.c), NULL: none */
} model_lp_scratch;

/* Activations of one block, saved by the forward pass for the backward.
 * With recomputation (activation checkpointing) each layer keeps its own
 * `x` and every other pointer is the same for all layers: one shared set
 * that the backward pass refills from `x` before each block's backward. */
typedef struct {
    float *x;        /* [N,C] block input (residual stream) */
    float *ln1;      /* [N,C] */
    float *ln1_mean, *ln1_rstd; /* [N] (mean unused by RMSNorm) */
    float *qkv;      /* [N,QKV]: fused layout, or q|k|v regions for llama */
    float *atty;     /* [N,NH*HS] attention output */
    float *lse;      /* [B,NH,T] */
    float *x1;       /* [N,C] residual after attention */
    float *ln2;      /* [N,C] */
    float *ln2_mean, *ln2_rstd;
    float *fc;       /* [N,F] pre-activation (GELU input / gate) */
    float *up;       /* [N,F] llama up projection */
    float *act;      /* [N,F] activation output */
    float *moe;      /* Mixtral: the sparse FFN's saved state (moe.c); NULL for a dense FFN */
} layer_acts;

struct cllm_model {
    cllm_model_config cfg;
    json_t *config_json; /* written back as config.json */

    cllm_tensor_info *tensors;
    int n_tensors;
    int (*lslot)[L_NSLOTS]; /* [n_layer][L_NSLOTS] tensor index or -1 */
    int gslot[G_NSLOTS];

    float *params;            /* flat parameters; NULL after cllm_model_drop_params */
    float *grads;             /* gradients of the trainable buffer (below); not allocated when hooks.fetch_grads is set */
    size_t n_params;

    /* The trainable set (trainable.c). Without one (`frozen` false: no set declared) every
     * tensor trains and the trainable buffer is `params` itself. With one,
     * the trainable buffer `tparams` [tlen] is a compact allocation of its
     * own: trained copies of some model tensors (copied back into params
     * after each update) and extra tensors (adapters, new heads) that live
     * there alone; grads has its length, optimizer state its slices.
     * ttab[i] are its views (offsets into tparams), tbase[i] the model
     * tensor a view copies (-1: an extra tensor), goff[t] the offset of
     * model tensor t's gradient (SIZE_MAX: frozen, no gradient). */
    bool frozen;
    float *tparams;
    size_t tlen;
    cllm_tensor_info *ttab;
    int *tbase;
    int n_ttab;
    size_t *goff;
    bool tcopies;             /* some views copy model tensors */
    bool tshared;             /* every model tensor in place: tparams is params (grown by the extras) */
    /* LoRA adapters on linear layers (lora.c): NULL without */
    struct model_lora *lora;

    /* parameter groups (cllm_model_n_groups): 0 = before the blocks, 1..L =
     * blocks, L+1 = after them; each a contiguous range of the flat buffer.
     * p / g: the group's working buffers handed out by the hooks (NULL:
     * the flat buffers); lp: p's low-precision copy (fetch_params_lp) for
     * a bf16/fp16 model. tgroup[tensor] = its group. */
    struct model_group {
        size_t begin, end;
        float *p, *g;
        const void *lp;
    } *groups;
    int *tgroup;
    cllm_model_hooks hooks;

    /* activations, all carved from one buffer */
    bool recompute;           /* requested by cllm_model_set_recompute */
    bool acts_recompute;      /* layout of `acts`: one shared set of block activations */
    int act_B, act_T;
    float *acts;
    size_t acts_floats;
    layer_acts *layers;
    float *x_out;             /* [N,C] output of the last block */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *emb;               /* [N,C] BLOOM: embedding before word_embeddings_layernorm */
    float *emb_mean, *emb_rstd;
    float *logits;            /* [chunk,V] */
    float *losses;            /* [N] */
    float *rope_cos, *rope_sin; /* [T,HS/2] */
    float *alibi;             /* [NH] */
    /* backward scratch */
    float *dx, *dln, *dqkv, *datty, *dfc, *dup, *dact, *dlnf;
    bool has_backward;
    int32_t *pos_tokens;      /* [N] scratch */

    /* mixed precision (precision.c). lp_params is part of the weights: a
     * read-only copy of params, rebuilt (under a lock, by the first linear
     * layer that runs) only after the parameters changed (lp_stale). lp_run
     * is the training run's operand scratch. */
    cllm_precision prec;
    void *lp_params;          /* bf16: uint16 [n_params]; fp16: fp32 [n_params] holding fp16 values */
    atomic_bool lp_stale;     /* lp_params no longer match params */
    model_lp_scratch lp_run;
    /* tensor parallelism (tp.c): this model is rank tp_rank's part of a
     * model cut over tp_size ranks (cllm_tp_model_part); tp_size 1 = whole */
    /* inference weight formats (weights.c): the matrices of a decode step
     * in a format of cllm/quant.h; NULL: fp32 from the flat buffer.
     * params_lazy: the flat buffer's stored-matrix slots were never
     * written (a model loaded in that format). */
    struct model_wstore *ws;
    bool params_lazy;
    /* conv_rows: GPT-2's Conv1D matrices are held [out, in] in the flat
     * buffer (cllm_model_set_inference), so that fp32 decode steps read
     * them on cllm_qmatmul's row kernel; model_conv_restore puts the file
     * layout back for whatever needs it. */
    bool conv_rows;
    /* a quantized frozen base (qbase.c): the block linear layers in a
     * bitsandbytes format; NULL otherwise */
    struct model_qbase *qb;
    const struct cllm_dist_group *tp_grp;
    int tp_rank, tp_size;
    int tp_vocab;    /* the whole model's vocabulary (the part's rows past it are padding) */
    /* sequence parallelism (seqpar.c): with sp (requested by
     * cllm_model_set_sequence_parallel) the activations of the last prepare
     * (acts_sp) hold this rank's T / tp_size positions of every sequence in
     * the residual stream, the norms and their statistics, x_out and dx;
     * sp_full [N,C] holds a gathered norm output or a row-parallel partial
     * sum, sp_pack [N,C] (B > 1) the rank-major order of a collective,
     * sp_loc [N/tp,C] the final norm's local output or a local gradient,
     * sp_dnorm [2C] a norm's local weight and bias gradients */
    bool sp, acts_sp;
    float *sp_full, *sp_pack, *sp_loc, *sp_dnorm;
    size_t *sp_counts; /* [tp_size] */
    float *tp_max;   /* [logit chunk] per-row maximum of the logits */
    double *tp_sum;  /* [2 * logit chunk] per-row sum of exp, target logit */
    int tp_rows;     /* rows of tp_max / tp_sum */
    /* Mixtral (moe.c): backward scratch and the router statistics of the
     * last forward pass (for the load-balancing loss) */
    float *moe_scratch;
    double *moe_stats;
    /* capacity (cllm_model_set_moe_capacity): factor 0 = no limit */
    double moe_capacity_factor;
    int moe_min_capacity;
    /* [n_experts + 2]: choices routed to each expert, choices dropped,
     * choices, counted by training forwards (NULL until counters are reset) */
    int64_t *moe_load;
    /* expert parallelism (moe_ep.c): this rank holds experts
     * ep_rank * E / ep_size .. of the group ep_grp; 1 = every expert here */
    const struct cllm_dist_group *ep_grp;
    int ep_rank, ep_size;
    struct model_moe_ep *ep; /* the owner side's buffers, grown on demand */
    /* an expert-parallel part (cllm_moe_model_part): the flat buffer holds
     * experts ep_first .. ep_first + ep_held - 1 of every block (local
     * expert le is lslot[L_EXP_*] + le); ep_held 0: every expert */
    int ep_first, ep_held;
    cllm_expert_layout expert_layout; /* the layout cllm_model_save writes (moe_layout.c) */
    /* A run over shared weights (shared.c, cllm/weights.h): the weight
     * fields (config_json, tensors, lslot, tgroup, params, lp_params, ws,
     * qb) are borrowed from shared's model, which frees them; groups is
     * the run's own copy. own_params: params (and lp_params) were replaced
     * by cllm_model_set_params and are the run's own. NULL: owns its weights. */
    struct cllm_weights *shared;
    bool own_params;
    /* per-phase seconds (cllm_model_set_profile): [CLLM_PROF_N], NULL when off */
    double *prof;
};

/* Runs the statement(s) and adds their wall time to phase ph of m's
 * profile; without a profile, only the statements run. */
#define MODEL_PROF(m, ph, ...)                                  \
    do {                                                        \
        double *prof_ = (m)->prof;                              \
        double t_ = prof_ ? cllm_time_sec() : 0.0;              \
        __VA_ARGS__;                                            \
        if (prof_) prof_[ph] += cllm_time_sec() - t_;           \
    } while (0)

/* The rows of a cached forward pass (generate.c builds it, run.c reads
 * it): n_seq sequences, sequence i with new rows rows[i]..rows[i+1]-1 at
 * positions past[i].., and the paged key/value cache they extend. */
typedef struct {
    int n_seq;
    const int32_t *rows;       /* [n_seq + 1] row offsets */
    const int32_t *past;       /* [n_seq] positions already cached */
    void *k, *v;               /* [n_layer][n_blocks][NKV][block_size][HS] floats, or bf16 values */
    bool kv_bf16;              /* k, v hold bf16 values */
    size_t layer_stride;       /* values of one layer's pool */
    int block_size, max_blocks;
    const int32_t *table;      /* [n_seq][max_blocks] block ids */
    const float *rope_cos, *rope_sin; /* [positions, HS/2] from position 0 (llama) */
    const float *alibi;        /* [NH] (bloom) */
} model_rows;

/* The one forward pass of the three families (run.c), used by training,
 * evaluation, pipeline stages, tensor-parallel parts and the cached
 * inference pass (generate.c). Rows are B x T from position 0 when `rows`
 * is NULL, else the cache's ragged rows (B, T unused). The model is only
 * read: every buffer written is the caller's (a, y, the cache in rows) or
 * its operand scratch lp. */
cllm_status model_embed_forward(const cllm_model *m, float *x0, float *emb, float *emb_mean, float *emb_rstd,
                                const int32_t *tokens, int B, int T, const model_rows *rows);
cllm_status model_block_forward(const cllm_model *m, model_lp_scratch *lp, int l, const layer_acts *a, float *y,
                                int B, int T, const model_rows *rows, bool recompute);
/* The family's norm (RMSNorm for llama, LayerNorm otherwise) over N rows. */
void model_norm_forward(const cllm_model *m, float *out, float *mean, float *rstd, const float *inp, const float *w,
                        const float *b, int N);

/* Tensor-parallel pieces of the forward and backward passes (tp.c). */
cllm_status model_tp_embed_forward(const cllm_model *m, float *out, const int32_t *tokens, int N, int T,
                                   const model_rows *rows);
void model_tp_embed_backward(cllm_model *m, float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int N,
                             int T);
/* out[N,C] += bias (NULL: nothing) */
void model_tp_add_bias(float *out, const float *bias, int N, int C);
/* out[N,C] <- all-reduce(out) + bias (bias may be NULL): a row-parallel output */
cllm_status model_tp_reduce_bias(const cllm_model *m, float *out, const float *bias, int N, int C);
/* buf[n] <- sum over the tensor group (identity without tensor parallelism) */
cllm_status model_tp_allreduce(const cllm_model *m, float *buf, size_t n);
/* Vocabulary-parallel cross-entropy of a chunk of local logits [rows, V/tp]:
 * as cllm_xent_forward(_backward) over the whole vocabulary. */
cllm_status model_tp_xent(cllm_model *m, float *losses, float *logits, const int32_t *targets, int rows, bool backward,
                          float dscale, long *counted);
/* Local vocabulary columns of a tensor part that are real tokens (the rest
 * are padding): cfg.vocab_size without tensor parallelism. */
int model_tp_real_cols(const cllm_model *m);
/* ALiBi slopes of this part's heads (the whole model's heads r * NH ..), or
 * of all heads without tensor parallelism: out[cfg.n_head]. */
cllm_status model_tp_alibi(const cllm_model *m, float *out);

/* A tensor part's matrices in a weight format (tp_weights.c).
 * model_tp_check_blocks: CLLM_ERR_UNSUPPORTED naming the tensor and sizes
 * when format f (int8 / q4) would cut a stored row inside a 32-value block.
 * model_tp_put_values: stores the part's slice of tensor idx from the whole
 * tensor's fp32 values (file layout). model_tp_put_blocks: the same from
 * U8 file tensor t of a quantized folder (file_fmt blocks), cut without
 * re-quantization. model_tp_embed_stored: out[N, C] = this part's stored
 * rows of the tokens (zeros for tokens of other ranks), before the sum. */
cllm_status model_tp_check_blocks(const cllm_model *whole, const cllm_model *part, cllm_wfmt f);
cllm_status model_tp_put_values(const cllm_model *whole, cllm_model *part, int idx, const float *src);
cllm_status model_tp_put_blocks(const cllm_model *whole, cllm_model *part, int idx, const cllm_st_tensor *t,
                                cllm_wfmt file_fmt);
void model_tp_embed_stored(const cllm_model *m, float *out, const int32_t *tokens, int N);
/* The weight format of a folder (model.c): config.json's cllm_weights (a
 * folder of cllm convert --quantize), else bf16 when its first stored
 * matrix is BF16, else fp32. */
cllm_status model_stored_format(const cllm_model *m, const json_t *config, const cllm_st_set *set, const char *path,
                                cllm_wfmt *out);

/* Sequence parallelism (seqpar.c): rows of this rank's sequence part
 * (B x T / tp_size) when the activations are sequence-parallel, else B x T.
 * model_sp_gather: full[B*T,C] <- every rank's local rows in sequence order;
 * model_sp_scatter: local[B*T/tp,C] <- the sum over the tensor group of
 * full's rows of this rank's positions (full and local distinct). */
int model_sp_rows(const cllm_model *m, int B, int T);
cllm_status model_sp_gather(const cllm_model *m, float *full, const float *local, int B, int T);
cllm_status model_sp_scatter(const cllm_model *m, float *local, const float *full, int B, int T);
/* position of local row i of a sequence-parallel pass (of T positions) */
static inline int model_sp_pos(const cllm_model *m, int i, int T) {
    int Ts = T / m->tp_size;
    return m->tp_rank * Ts + i % Ts;
}

/* Tensor-parallel inference (tp_infer.c): rank 0's caches over a part send
 * each call that changes them to the other ranks, which run the same call on
 * theirs (cllm_kv_cache_follow), so every rank's cache holds the same
 * positions and block tables, each with its own heads. A command is
 * TP_CMD_LEN int32s {op, cache id, args...}; a forward's n_new and tokens
 * follow it. */
enum { TP_CMD_LEN = 8 };
enum { TP_OP_STOP = 0, TP_OP_INIT, TP_OP_FREE, TP_OP_FORWARD, TP_OP_REWIND };
/* Rank 0 only (a no-op elsewhere and without tensor parallelism). A
 * failure here leaves the ranks out of step: the job is ended. */
cllm_status model_tp_announce(const cllm_model *m, const int32_t *cmd, int32_t *payload, size_t n);
/* A fresh cache id (> 0). */
int model_tp_next_id(void);
/* A digest of a cache's positions and free blocks (generate.c): a forward's
 * command carries rank 0's, and a follower whose cache disagrees ends the
 * job instead of computing with other block tables. */
struct cllm_kv_cache;
int32_t model_kv_state(const struct cllm_kv_cache *kv);
/* After the activations are (re)allocated: the cross-entropy statistics
 * buffers and the ALiBi slopes of this rank's heads. */
cllm_status model_tp_prepare(cllm_model *m);

/* Mixtral's sparse mixture-of-experts FFN (moe.c), in place of the dense
 * FFN of a block when cfg.n_experts > 0.
 * model_moe_act_floats: floats of one block's saved state for N rows;
 * model_moe_scratch_floats: floats of the model-wide backward scratch and
 * router statistics (train: with the backward scratch).
 * model_moe_forward: routes the N rows of a->ln2 and writes the weighted
 * sum of the experts' outputs into out[N,C] (out NULL: only refills the
 * saved state, for recomputation). With `stats` (a training forward) adds
 * the router's statistics of these rows into m->moe_stats.
 * model_moe_backward: from dy[N,C] (the block output's gradient)
 * accumulates the input gradient into dln[N,C] and the router's and
 * experts' gradients; aux_scale is d(loss_sum)/d(aux loss) (0: none). */
size_t model_moe_act_floats(const cllm_model_config *c, size_t N);
size_t model_moe_scratch_floats(const cllm_model_config *c, size_t N, bool train);
void model_moe_begin(cllm_model *m);
cllm_status model_moe_forward(const cllm_model *m, model_lp_scratch *lp, int l, const layer_acts *a, float *out, int N,
                              bool stats);
cllm_status model_moe_backward(cllm_model *m, int l, const layer_acts *a, float *dln, const float *dy, int N,
                               double aux_scale);
/* Expert capacity of a pass over N rows (the most choices one expert keeps). */
int model_moe_capacity(const cllm_model *m, int N);
/* One expert (global index e) of block l on n gathered rows x[n,C]: the
 * forward fills h1, h3, act [n,F] and eo [n,C]; the backward accumulates
 * the expert's weight gradients and writes dx[n,C] (dact, dh1, dh3: [n,F]
 * scratch). */
cllm_status model_moe_expert_forward(const cllm_model *m, model_lp_scratch *lp, int l, int e, int n, const float *x,
                                     float *h1, float *h3, float *act, float *eo);
cllm_status model_moe_expert_backward(cllm_model *m, int l, int e, int n, const float *deo, const float *x,
                                      const float *h1, const float *h3, const float *act, float *dact, float *dh1,
                                      float *dh3, float *dx);
/* Expert parallelism (moe_ep.c): off[E+1] the grouped kept choices of this
 * rank (expert e's rows off[e]..off[e+1]-1 of xs). The forward sends each
 * expert's rows to its rank, runs this rank's experts on the rows it
 * receives and returns their outputs into eo (grouped order); the backward
 * does the same with deo -> dxs, accumulating the local experts' weight
 * gradients. Collective over m->ep_grp. */
cllm_status model_moe_ep_forward(const cllm_model *m, model_lp_scratch *lp, int l, const int32_t *off,
                                 const float *xs, float *eo);
cllm_status model_moe_ep_backward(cllm_model *m, int l, const int32_t *off, const float *deo, float *dxs);
void model_moe_ep_free(cllm_model *m);
/* The load-balancing loss of the last training forward (transformers'
 * load_balancing_loss_func over every layer's router), unscaled. */
double model_moe_aux(const cllm_model *m);
/* Mixtral's tensors of block l (layout.c calls it in the block's group). */
typedef void (*model_add_fn)(cllm_model *m, const char *name, int slot, int layer, int rows, int cols, bool no_decay,
                             size_t *offset);
void model_moe_layout(cllm_model *m, int l, model_add_fn add, size_t *offset);

/* A model with zeroed parameters from an HF config object (model.c);
 * _ex with alloc false: the layout only, params NULL. */
cllm_status model_from_config(cllm_model **out, const json_t *config, const char *path);
cllm_status model_from_config_ex(cllm_model **out, const json_t *config, const char *path, bool alloc);
/* The same with a value head (cllm_model_config.value_head) or without. */
cllm_status model_from_config_vh(cllm_model **out, const json_t *config, const char *path, bool alloc,
                                 bool value_head);
/* Reads the safetensors of HF folder `dir` against m's tensor table (names
 * with or without the family prefix, shapes checked, ignored buffers
 * skipped, every tensor exactly once): put(ctx, tensor index, file tensor)
 * for each (model.c). */
typedef cllm_status (*model_tensor_fn)(void *ctx, int idx, const cllm_st_tensor *t);
/* The expert tensors' file layouts (moe_layout.c). model_moe_file_tensor
 * looks at file tensor t: a tensor of the fused layout is cut into the
 * per-expert views put(ctx, idx, view) gets (*handled true); one of either
 * layout fixes the folder's layout in *f (zeroed before the first call)
 * and one of the other layout is an error naming both. model_moe_file_name:
 * tensor idx's name in that layout (buf when it differs). */
typedef struct {
    cllm_expert_layout layout;
    char first[128]; /* the first expert tensor seen; empty: none yet */
} model_moe_file;
cllm_status model_moe_file_tensor(const cllm_model *m, const cllm_st_tensor *t, model_tensor_fn put, void *ctx,
                                  bool *seen, model_moe_file *f, bool *handled);
const char *model_moe_file_name(const cllm_model *m, int idx, const model_moe_file *f, char *buf, size_t n);
/* Saving in the fused layout: rewrites the n entries (entry i = tensor i)
 * into the fused layout's when m's layout is fused (*out owns the
 * concatenated data; NULL otherwise). */
typedef struct model_moe_fused model_moe_fused;
cllm_status model_moe_fuse_entries(const cllm_model *m, cllm_st_entry *e, int *n, model_moe_fused **out);
void model_moe_fused_free(model_moe_fused *b);
cllm_status model_load_tensors(const cllm_model *m, const char *dir, model_tensor_fn put, void *ctx);

/* Builds m->tensors, slots and n_params from m->cfg (layout.c). */
cllm_status model_build_layout(cllm_model *m);

/* Mixed precision (precision.c). model_lp_prepare (re)sizes the training
 * run's operand scratch for the prepared batch; model_lp_release frees it
 * and the low-precision weights. */
cllm_status model_lp_prepare(cllm_model *m);
/* Grows lp's two operand regions (a, b) to at least `elems` elements of
 * precision p each; CLLM_ERR_INTERNAL on a fixed scratch that is smaller. */
cllm_status model_lp_reserve(model_lp_scratch *lp, cllm_precision p, size_t elems);
void model_lp_release(cllm_model *m);
/* A fixed operand scratch for forwards of up to `rows` rows, plus `head_rows`
 * rows through the head (a KV cache's): nothing when the model is fp32.
 * model_lp_scratch_free on a zeroed scratch is a no-op. */
cllm_status model_lp_scratch_init(model_lp_scratch *lp, const cllm_model *m, int rows, int head_rows);
void model_lp_scratch_free(model_lp_scratch *lp);
/* Linear layers in the model's precision: cllm_linear_forward/backward
 * semantics; operands rounded in lp. The forward takes the weight's tensor
 * index w (its matrix in the weight store, else model_param(m, w)); the
 * backward a pointer into m->params. Rows up to WEIGHTS_SMALL_ROWS of an
 * fp32 model run on cllm_qmatmul, the others on oneDNN.
 * A layer that carries a LoRA adapter (found by its weight) adds the
 * adapter's output, and in the backward pass its input gradient and its
 * A/B gradients; dw NULL skips the (frozen) weight's gradient.
 * Thread-safe over one model with a different lp per thread. */
cllm_status model_linear_forward(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp, int w,
                                 const float *bias, int N, int IN, int OUT, bool w_in_out);
cllm_status model_linear_backward(const cllm_model *m, model_lp_scratch *lp, float *dinp, float *dw, float *dbias,
                                  const float *dout, const float *inp, const float *w, int N, int IN, int OUT,
                                  bool w_in_out);

/* Inference weight formats (weights.c). int8 / q4 linear forwards of fewer
 * than CLLM_QGEMM_MIN_ROWS rows run on cllm_qmatmul (activations quantized
 * in lp->deq), fp32 and bf16 ones up to WEIGHTS_SMALL_ROWS rows too; longer
 * ones on cllm_qgemm (panels of widened rows in lp->deq, on oneDNN). */
enum { WEIGHTS_SMALL_ROWS = 16 };
/* The stored matrix of tensor idx, or NULL (no store, or kept in params). */
const cllm_qweight *model_weights_get(const cllm_model *m, int idx);
bool model_weights_stored(const cllm_model *m, int idx);
/* A store in format f (views for every matrix, contents unset) replacing
 * any previous one; model_weights_free drops it (the model reads fp32). */
cllm_status model_weights_init(cllm_model *m, cllm_wfmt f);
void model_weights_free(cllm_model *m);
/* Stores tensor idx from its fp32 values in the file layout, or from a
 * file tensor (fp32/f16/bf16 values, or U8 rows of format file_fmt). */
cllm_status model_weights_fill(cllm_model *m, int idx, const float *src);
cllm_status model_weights_read(cllm_model *m, int idx, const cllm_st_tensor *t, cllm_wfmt file_fmt);
/* The fp32 values (file layout) of U8 file tensor t of format file_fmt. */
cllm_status model_weights_widen(const cllm_model *m, int idx, const cllm_st_tensor *t, cllm_wfmt file_fmt, float *dst);
/* out[N, C] = stored wte rows of tokens (+ wpe row n % T when wpe). */
void model_weights_embed(const cllm_model *m, float *out, const int32_t *tokens, const float *wpe, int N, int T);
/* out = inp . W^T + bias through the store (see WEIGHTS_SMALL_ROWS); lp->deq
 * grows unless lp is fixed. */
cllm_status model_weights_linear(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp,
                                 const cllm_qweight *q, const float *bias, int N);
/* Floats of lp->deq a forward of `rows` rows needs (0 without a store). */
size_t model_weights_scratch(const cllm_model *m, int rows);
/* The file layout back in the flat buffer when conv_rows (a no-op
 * otherwise). model_conv_file_layout: tensor idx's values in the file
 * layout, a copy in *tmp (to cllm_free) when conv_rows transposed it,
 * NULL when that copy cannot be allocated. */
cllm_status model_conv_restore(cllm_model *m);
const float *model_conv_file_layout(const cllm_model *m, int idx, float **tmp);

/* A quantized base (qbase.c). model_qbase_get: tensor idx's quantized
 * matrix or NULL; model_qbase_index: the quantized tensor whose slot in
 * params starts at w, or -1. model_qbase_scratch: floats of lp->deq its
 * passes need (the largest matrix). The forward writes out[N, rows] =
 * inp . W^T + bias; the backward adds dout . W to dinp and column sums to
 * dbias (dw must be NULL: the base is frozen). */
const cllm_bnb_matrix *model_qbase_get(const cllm_model *m, int idx);
int model_qbase_index(const cllm_model *m, const float *w);
size_t model_qbase_scratch(const cllm_model *m);
/* Floats of lp->a a forward of up to `rows` rows needs for the rounded
 * operands of bf16 / fp16 compute (bnb_4bit_compute_dtype); 0 in fp32. */
size_t model_qbase_operand_elems(const cllm_model *m, int rows);
cllm_status model_qbase_forward(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp,
                                const cllm_bnb_matrix *q, const float *bias, int N);
cllm_status model_qbase_backward(const cllm_model *m, model_lp_scratch *lp, float *dinp, float *dw, float *dbias,
                                 const float *dout, int idx, int N);
void model_qbase_free(cllm_model *m);

/* Width of the fused/stacked QKV activation of one token. */
int model_qkv_width(const cllm_model_config *c);

/* Rows of logits computed at once by the fused head + cross-entropy: a
 * [rows, V] chunk of at most 64 MB, enough rows (>= 64) that the three head
 * GEMMs stay efficient; a full [N, V] tensor never exists for large N. */
static inline int model_logit_chunk(const cllm_model_config *c, int N) {
    int rows = (int)((16u << 20) / (unsigned)c->vocab_size);
    if (rows < 64) rows = 64;
    return rows < N ? rows : N;
}

/* A tensor's parameters (gradients): in its group's working buffer while
 * the hooks have one out, else in the flat buffer. */
static inline float *model_param(const cllm_model *m, int idx) {
    if (idx < 0) return NULL;
    const struct model_group *g = &m->groups[m->tgroup[idx]];
    return g->p ? g->p + (m->tensors[idx].offset - g->begin) : m->params + m->tensors[idx].offset;
}
static inline float *model_grad(const cllm_model *m, int idx) {
    if (idx < 0) return NULL;
    const struct model_group *g = &m->groups[m->tgroup[idx]];
    if (g->g) return g->g + (m->tensors[idx].offset - g->begin);
    if (!m->grads) return NULL;
    if (!m->frozen) return m->grads + m->tensors[idx].offset;
    return m->goff[idx] == SIZE_MAX ? NULL : m->grads + m->goff[idx];
}

/* The tensor whose slot in m->params starts at w (the linear seam's
 * backward passes weights as pointers), or -1. Tensors lie in offset
 * order: a binary search. */
static inline int model_tensor_at(const cllm_model *m, const float *w) {
    uintptr_t base = (uintptr_t)m->params, p = (uintptr_t)w;
    if (!m->params || p < base || (p - base) / sizeof(float) >= m->n_params) return -1;
    size_t off = (p - base) / sizeof(float);
    int lo = 0, hi = m->n_tensors - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->tensors[mid].offset <= off) lo = mid;
        else hi = mid - 1;
    }
    return m->tensors[lo].offset == off ? lo : -1;
}

/* Shared weights (shared.c). model_shared_detach: cllm_model_free's first
 * step for a run (forgets the borrowed fields, drops its reference; a
 * no-op for a model that owns its weights). model_shared_refuse: the
 * CLLM_ERR_UNSUPPORTED of a call that would write shared weights. */
void model_shared_detach(cllm_model *m);
cllm_status model_shared_refuse(const char *what);
/* Brings the low-precision weight copy up to date (precision.c). */
cllm_status model_lp_refresh(const cllm_model *m);
/* Bytes of the weight store's matrices (weights.c; 0 without one). */
size_t model_weights_store_bytes(const cllm_model *m);

/* The trainable set's part of cllm_model_free (trainable.c). */
void model_trainable_free(cllm_model *m);
/* After an update: trained copies of model tensors back into params. */
void model_trainable_sync(cllm_model *m);

/* LoRA (lora.c). model_lora_find: the adapter on the linear layer whose
 * weight starts at w (a pointer into m->params), or NULL. The forward adds
 * scale * B (A drop(x)) to out; the backward adds the adapter's part of
 * dinp and accumulates dA, dB into the trainable gradients. Adapters run in
 * fp32 whatever the model's precision. */
struct model_adapter;
const struct model_adapter *model_lora_find(const cllm_model *m, const float *w);
cllm_status model_lora_forward(const cllm_model *m, const struct model_adapter *ad, float *out, const float *inp, int N);
cllm_status model_lora_backward(const cllm_model *m, const struct model_adapter *ad, float *dinp, const float *dout,
                                const float *inp, int N);
void model_lora_free(cllm_model *m);
/* Dropout applies only in training passes: set around them (run.c). */
void model_lora_set_training(cllm_model *m, bool on);

#endif
