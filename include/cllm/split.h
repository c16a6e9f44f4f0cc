/*
 * cllm split: how tensor parallelism cuts each parameter (Megatron's 1-D
 * scheme), and a model folder split into per-unit, per-tensor-rank files
 * ("stage layout") and merged back.
 *
 * Tensor-parallel rules, with W in the layout its HF file stores:
 *   column-parallel (output features split): QKV / q, k, v (by heads; for
 *     GQA k and v by key/value heads), fc / gate, up; their biases too.
 *   row-parallel (input features split): the attention output projection
 *     and the down projection; their biases stay whole (added once, after
 *     the all-reduce).
 *   vocabulary-parallel: the token embedding and an untied LM head, by rows.
 *   replicated: norms, GPT-2's position embedding.
 * nn.Linear stores W[out,in], so column-parallel cuts its rows; GPT-2's
 * Conv1D stores W[in,out], so there it cuts columns. Fused projections are
 * cut per segment: GPT-2's c_attn columns are [Q|K|V] and each third is cut
 * by heads; BLOOM's query_key_value rows are [head][q,k,v][head_dim], so a
 * contiguous run of heads is a contiguous run of rows.
 *
 * A stage layout is a folder:
 *   config.json, tokenizer files         as in the HF folder
 *   layout.json                          {"format": "cllm-stage-layout", "version": 1,
 *                                          "tensor": T, "units": U, "files": [...]}
 *   unit_UUU-tp_RR.safetensors           the tensors of unit UUU (0 = embedding,
 *                                        1..n_layer = blocks, n_layer + 1 = head) as
 *                                        tensor rank RR holds them, HF names, F32
 * Units do not depend on the pipeline split: a stage of any `parts` loads the
 * files of its units, so one folder serves every pipe size; the tensor size
 * is fixed by the folder (merge and split again to change it). Writing goes
 * to a temporary folder renamed into place at the end.
 */
#ifndef CLLM_SPLIT_H
#define CLLM_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"
#include "cllm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CLLM_TP_REPLICATE = 0, /* every rank holds the whole tensor */
    CLLM_TP_ROWS,          /* cut along dim 0 (1-D tensors: their only dim) */
    CLLM_TP_COLS           /* cut along dim 1 */
} cllm_tp_cut;

typedef struct {
    cllm_tp_cut cut;
    int segments; /* the cut dim is `segments` equal parts, each cut separately (GPT-2 c_attn: 3) */
    int unit;     /* 0 embedding, 1 + l block l, n_layer + 1 head */
} cllm_tp_rule;

/* The rule of tensor i of model m (cllm_model_tensor order). */
cllm_tp_rule cllm_tp_rule_of(const cllm_model *m, int i);

/* Shape of rank r's part of tensor t under rule: out_shape[2]. */
void cllm_tp_shape(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int64_t *out_shape);

/* Copies rank r's part of full (t's whole tensor) into part, or (merge)
 * the part back into its place in full. tp must divide the cut dimension
 * per segment (cllm_topo_check_tensor checks the model), except for an
 * unsegmented row cut (the vocabulary: token embedding, LM head), which is
 * padded as Megatron pads it: each part has ceil(rows / tp) rows, rank r
 * rows r * that.., and rows past the tensor's end are zeros in the part and
 * dropped when merging. */
void cllm_tp_slice(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int r, const float *full, float *part);
void cllm_tp_unslice(const cllm_tensor_info *t, cllm_tp_rule rule, int tp, int r, const float *part, float *full);

/* Tensor rank r's part of the whole model `full` cut over tp ranks: a model
 * whose config has n_head, n_kv_head and n_inner divided by tp, vocab_size
 * ceil(vocab_size / tp) (padded: see cllm_tp_slice; the padded logits never
 * count: cross-entropy and generation see the whole model's vocabulary)
 * (head_dim and n_embd whole) and whose tensors are the cllm_tp_slice parts,
 * same names, same order. It keeps full's config.json. Fails with
 * cllm_topo_check_tensor's message when the sizes do not divide. The part
 * still needs cllm_model_set_tensor_parallel to run. */
cllm_status cllm_tp_model_part(cllm_model **out, const cllm_model *full, int tp, int r);

/* The same part read straight from an HF folder (config.json +
 * safetensors), without ever holding the whole model: each tensor is read
 * (and converted to fp32) one at a time and only rank r's slice is kept, so
 * the peak is the part plus the largest tensor. Values equal those of
 * cllm_tp_model_part over cllm_model_load bit for bit; errors as both. */
cllm_status cllm_tp_model_load(cllm_model **out, const char *dir, int tp, int r);
/* The same part with its matrices in weight format `weights` ("fp32",
 * "bf16", "int8", "q4"; NULL: as the folder stores them, so that a folder
 * written by cllm convert --quantize loads without re-quantization), as
 * cllm_model_load_weights holds them (cllm/quant.h): only the slices, each
 * in the format. The stored values are those of the whole model in that
 * format, cut: column-parallel slices are whole rows, row-parallel slices
 * runs of inputs, which for int8 / q4 must be whole 32-value blocks (a cut
 * inside a block is CLLM_ERR_UNSUPPORTED naming the tensor and its sizes).
 * Forwards only, like every model in those formats. */
cllm_status cllm_tp_model_load_weights(cllm_model **out, const char *dir, int tp, int r, const char *weights);

/* Collective over the tensor group g: gathers every rank's part (of
 * cllm_tp_model_part(full, size of g, rank in g)) into full's parameters.
 * Replicated tensors come from group rank 0; when max_repl_diff is not
 * NULL it receives the largest absolute difference between any rank's copy
 * of a replicated tensor and rank 0's (0 when the ranks kept them equal). */
struct cllm_dist_group;
cllm_status cllm_tp_model_gather(cllm_model *full, const cllm_model *part, const struct cllm_dist_group *g,
                                 float *max_repl_diff);
/* The same for any buffer laid out as the models' flat parameters (an
 * optimizer state, for checkpoints): part_buf [part's buffer length] of
 * every rank of g into full_buf [full's buffer length]. */
cllm_status cllm_tp_gather_buffer(const cllm_model *full, const cllm_model *part, const struct cllm_dist_group *g,
                                  const float *part_buf, float *full_buf, float *max_repl_diff);
/* Rank r's part of full_buf (laid out as full's parameters) into part_buf
 * (laid out as part's): what cllm_tp_model_part does to the parameters. */
void cllm_tp_cut_buffer(const cllm_model *full, const cllm_model *part, int tp, int r, const float *full_buf,
                        float *part_buf);

/* Writes model m as a stage layout for `tensor` ranks into out_dir (which
 * must not exist yet, or be a previous stage layout: it is replaced). Files
 * named in copy_files (NULL-terminated, may be NULL) are copied from
 * src_dir when they exist there (tokenizer files). */
cllm_status cllm_split_save(const cllm_model *m, int tensor, const char *src_dir, const char *const *copy_files,
                            const char *out_dir);

/* Reads a stage layout back into one model (every unit, every tensor rank);
 * the result is the model the layout was made from, bit for bit. */
cllm_status cllm_split_load(cllm_model **out, const char *dir);

/* True when dir holds a stage layout (a layout.json of this format). */
int cllm_split_is_layout(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
