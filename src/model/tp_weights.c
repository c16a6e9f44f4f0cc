/*
 * A tensor part's matrices in an inference weight format (bf16, int8, q4;
 * cllm/quant.h): cllm_tp_model_load_weights keeps only this rank's slice of
 * each matrix, stored in the format, as the weight store of a whole model
 * holds it ([out, in] rows; GPT-2's Conv1D weights transposed).
 *
 * In the stored [out, in] view a column-parallel slice (QKV, fc, gate, up,
 * and the vocabulary rows of the embedding and head) is a set of whole
 * rows, and a row-parallel slice (the attention output and down
 * projections) is a run of inputs of every row. Rows of int8 / q4 are
 * blocks of 32 inputs, so a row-parallel slice must start and end on a
 * block boundary: the slices then hold exactly the blocks of the whole
 * model's rows, and the values are those of the one-process model in the
 * same format, bit for bit. A cut that falls inside a block is refused
 * (model_tp_check_blocks) rather than re-blocked, which would change the
 * numbers (the layers' input widths of real models are multiples of 32 per
 * rank: 4096 / 8, 11008 / 8, 3072 / 4...).
 *
 * Sources: fp32 / f16 / bf16 file tensors are cut in fp32 (cllm_tp_slice)
 * and the slice stored; the U8 blocks of a folder written by cllm convert
 * --quantize are cut as bytes (no re-quantization) when the run keeps the
 * file's format, and widened and stored again otherwise. Which rows and
 * inputs a slice holds comes from cllm_tp_slice itself, run over a table of
 * indices, so the cut is the fp32 path's by construction (vocabulary
 * padding included: a padded row holds the blocks of a row of zeros).
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/split.h"
#include "model_impl.h"

/* GPT-2 stores its linear layers as Conv1D [in, out]; the store, like
 * weights.c, holds [out, in]. The vocabulary matrices are [rows, embd]. */
static bool conv_layout(const cllm_model *m, int idx) {
    return m->cfg.arch == CLLM_ARCH_GPT2 && idx != m->gslot[G_WTE] && idx != m->gslot[G_HEAD];
}

/* Whether the slice cuts the stored matrix's inputs (a row-parallel layer). */
static bool cuts_inputs(const cllm_model *whole, int idx, cllm_tp_rule rule) {
    if (rule.cut == CLLM_TP_REPLICATE) return false;
    return conv_layout(whole, idx) ? rule.cut == CLLM_TP_ROWS : rule.cut == CLLM_TP_COLS;
}

/* The whole matrix's inputs (stored cols). */
static int64_t whole_inputs(const cllm_model *whole, int idx) {
    const cllm_tensor_info *t = &whole->tensors[idx];
    return conv_layout(whole, idx) ? t->shape[0] : t->shape[1];
}

cllm_status model_tp_check_blocks(const cllm_model *whole, const cllm_model *part, cllm_wfmt f) {
    if (f != CLLM_WFMT_INT8 && f != CLLM_WFMT_Q4) return CLLM_OK;
    for (int i = 0; i < part->n_tensors; i++) {
        cllm_tp_rule rule = cllm_tp_rule_of(whole, i);
        if (!model_weights_stored(part, i) || !cuts_inputs(whole, i, rule)) continue;
        int64_t k = whole_inputs(whole, i), slice = k / rule.segments / part->tp_size;
        if (slice % CLLM_QBLOCK)
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED,
                             "--weights %s with --tensor %d: %s is cut along its %lld inputs into slices of %lld "
                             "values, not whole %d-value blocks; run this model with --weights bf16 or fp32, or a "
                             "--tensor size whose slices are multiples of %d",
                             cllm_wfmt_name(f), part->tp_size, whole->tensors[i].name, (long long)k, (long long)slice,
                             CLLM_QBLOCK, CLLM_QBLOCK);
    }
    return CLLM_OK;
}

cllm_status model_tp_put_values(const cllm_model *whole, cllm_model *part, int idx, const float *src) {
    float *cut = cllm_alloc(part->tensors[idx].numel * sizeof(float), "tensor slice");
    if (!cut) return CLLM_ERR_NOMEM;
    cllm_tp_slice(&whole->tensors[idx], cllm_tp_rule_of(whole, idx), part->tp_size, part->tp_rank, src, cut);
    cllm_status st = model_weights_fill(part, idx, cut);
    cllm_free(cut);
    return st;
}

/* map[k] = 1 + the index of the whole tensor's entry k of rank r's slice of
 * n entries cut by `rule` as a 1-D tensor, 0 for a padded entry. */
static float *slice_map(int64_t n, cllm_tp_rule rule, int tp, int r, int64_t *len) {
    cllm_tensor_info t = {.ndim = 1, .shape = {n, 0}, .numel = (size_t)n};
    rule.cut = CLLM_TP_ROWS;
    int64_t shape[2];
    cllm_tp_shape(&t, rule, tp, shape);
    float *all = malloc((size_t)n * sizeof *all), *part = malloc((size_t)shape[0] * sizeof *part);
    if (all && part) {
        for (int64_t k = 0; k < n; k++) all[k] = (float)(k + 1); /* exact below 2^24 */
        cllm_tp_slice(&t, rule, tp, r, all, part);
    }
    free(all);
    if (!part) return NULL;
    *len = shape[0];
    return part;
}

cllm_status model_tp_put_blocks(const cllm_model *whole, cllm_model *part, int idx, const cllm_st_tensor *t,
                                cllm_wfmt file_fmt) {
    const cllm_qweight *q = model_weights_get(part, idx);
    const cllm_tp_rule rule = cllm_tp_rule_of(whole, idx);
    const bool in_cut = cuts_inputs(whole, idx, rule), out_cut = rule.cut != CLLM_TP_REPLICATE && !in_cut;
    const int64_t K = whole_inputs(whole, idx), R = (int64_t)(whole->tensors[idx].numel / (size_t)K);
    const size_t rb = cllm_wfmt_row_bytes(file_fmt, K), prb = cllm_wfmt_row_bytes(file_fmt, q->cols);
    const size_t bb = file_fmt == CLLM_WFMT_Q4 ? CLLM_Q4_BLOCK_BYTES : CLLM_Q8_BLOCK_BYTES;
    if (file_fmt == CLLM_WFMT_FP32 || file_fmt == CLLM_WFMT_BF16 || t->ndim != 2 || t->shape[0] != R ||
        (size_t)t->shape[1] != rb)
        return CLLM_FAIL(CLLM_ERR_FORMAT,
                         "%s: tensor '%s' (U8) is not a [%lld, %zu] matrix of %s blocks as config.json's "
                         "cllm_weights says", t->file, t->name, (long long)R, rb, cllm_wfmt_name(file_fmt));
    if (in_cut && (q->cols / rule.segments) % CLLM_QBLOCK) /* model_tp_check_blocks refuses these first */
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "%s: a slice inside a block", t->name);
    int64_t nr = R, nc = K;
    float *rows = out_cut ? slice_map(R, rule, part->tp_size, part->tp_rank, &nr) : NULL;
    float *cols = in_cut ? slice_map(K, rule, part->tp_size, part->tp_rank, &nc) : NULL;
    unsigned char *dst = file_fmt == q->fmt ? (unsigned char *)(uintptr_t)q->data
                                            : cllm_alloc((size_t)q->rows * prb, "weight slice");
    /* a padded vocabulary row: what the quantizer makes of zeros (as a part
     * cut in fp32 and quantized holds) */
    float *zeros = calloc((size_t)nc, sizeof *zeros);
    unsigned char *pad = malloc(prb);
    cllm_status st = CLLM_OK;
    if ((out_cut && !rows) || (in_cut && !cols) || !dst || !zeros || !pad || nr != q->rows || nc != q->cols) {
        st = dst && zeros && pad && (!out_cut || rows) && (!in_cut || cols)
                 ? CLLM_FAIL(CLLM_ERR_INTERNAL, "%s: slice of [%lld, %lld], store of [%d, %d]", t->name,
                             (long long)nr, (long long)nc, q->rows, q->cols)
                 : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (file_fmt == CLLM_WFMT_Q4)
        cllm_quant_q4_0_row(pad, zeros, nc);
    else
        cllm_quant_q8_0_row(pad, zeros, nc);
    const unsigned char *src = t->data;
    const int64_t nb = (nc + CLLM_QBLOCK - 1) / CLLM_QBLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nr; i++) {
        int64_t from = rows ? (int64_t)rows[i] - 1 : i; /* -1: a padded vocabulary row */
        unsigned char *d = dst + (size_t)i * prb;
        if (from < 0) {
            memcpy(d, pad, prb);
            continue;
        }
        if (!cols) {
            memcpy(d, src + (size_t)from * rb, rb);
            continue;
        }
        for (int64_t b = 0; b < nb; b++) /* block b starts at input cols[32 b] - 1, a block boundary */
            memcpy(d + (size_t)b * bb, src + (size_t)from * rb + (size_t)((int64_t)cols[b * CLLM_QBLOCK] - 1) /
                                                                  CLLM_QBLOCK * bb, bb);
    }
    if (dst != q->data) { /* the run's format differs from the file's: widen the slice and store it again */
        float *tmp = cllm_alloc((size_t)q->rows * (size_t)q->cols * sizeof(float), "widened weight");
        if (!tmp) {
            st = CLLM_ERR_NOMEM;
            goto done;
        }
#pragma omp parallel for schedule(static)
        for (int i = 0; i < q->rows; i++)
            cllm_quant_dequant_row(tmp + (size_t)i * q->cols, dst + (size_t)i * prb, file_fmt, q->cols);
        st = cllm_quant_matrix((void *)(uintptr_t)q->data, q->fmt, tmp, q->rows, q->cols, false);
        cllm_free(tmp);
    }
done:
    if (dst != q->data) cllm_free(dst);
    free(zeros);
    free(pad);
    free(rows);
    free(cols);
    return st;
}

void model_tp_embed_stored(const cllm_model *m, float *out, const int32_t *tokens, int N) {
    const cllm_qweight *q = model_weights_get(m, m->gslot[G_WTE]);
    const int C = q->cols, V = m->cfg.vocab_size;
    const int64_t v0 = (int64_t)m->tp_rank * V;
    const size_t rb = cllm_wfmt_row_bytes(q->fmt, C);
#pragma omp parallel for schedule(static) if (N > 4)
    for (int n = 0; n < N; n++) {
        int64_t v = tokens[n] - v0;
        if (v >= 0 && v < V)
            cllm_quant_dequant_row(out + (size_t)n * C, (const unsigned char *)q->data + (size_t)v * rb, q->fmt, C);
        else
            memset(out + (size_t)n * C, 0, (size_t)C * sizeof(float));
    }
}
