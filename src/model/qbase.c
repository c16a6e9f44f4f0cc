/*
 * A quantized frozen base (QLoRA): the linear layers of the blocks held in
 * bitsandbytes' formats (cllm/quant.h: nf4, fp4, int8 row-wise), as
 * transformers' BitsAndBytesConfig loads a model, for training LoRA
 * adapters on it, evaluating and generating.
 *
 * What is quantized is what transformers' replace_with_bnb_linear
 * converts: every linear layer of the blocks (GPT-2's Conv1D ones
 * transposed to [out, in] first), not the embeddings, the head, the norms
 * or the biases, and not a layer named in llm_int8_skip_modules. Those stay
 * fp32 in the flat parameter buffer; the quantized layers' slots there are
 * never written (zero pages from calloc cost address space, not memory),
 * so the model's fp32 weights never exist whole, not even while loading
 * (one tensor's fp32 copy at a time).
 *
 * Passes, through the linear seam (precision.c): forward dequantizes the
 * whole matrix into the run's scratch (lp->deq) and runs oneDNN's fp32 GEMM
 * on it, as bitsandbytes dequantizes then multiplies; backward dequantizes
 * it again and adds dout . W to the input gradient. The base gets no
 * weight gradient (it is frozen: a trainable quantized weight is an
 * internal error). The scratch holds one fp32 matrix, the largest.
 *
 * bnb_4bit_compute_dtype bfloat16 / float16 (4-bit types only, as
 * bitsandbytes' Linear4bit): the dequantized matrix is rounded in place to
 * that type, the input is rounded into lp->a, the fp32 GEMM runs on those
 * exact values (every product is exact in fp32; the sums accumulate in
 * fp32) and the output is rounded; the bias is rounded first, as
 * Linear4bit casts it. Backward rounds dout, multiplies it by the rounded
 * matrix and rounds the product before adding it to dinp, as torch's
 * autograd does through the casts; the bias gradient is the rounded sum of
 * the rounded dout. The scratch grows by one layer's
 * operands, never by a copy of the parameters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/kernels.h"
#include "model_impl.h"

struct model_qbase {
    cllm_bnb_type type;
    bool dq;
    cllm_bnb_matrix *w;  /* [n_tensors]: type CLLM_BNB_NONE for an fp32 tensor */
    unsigned char *buf;
    size_t bytes;
    size_t widest;       /* numel of the largest quantized matrix */
    cllm_bnb_compute compute;
    int max_rows, max_cols; /* of the quantized matrices */
};

static const int linear_slots[] = {L_QKV_W, L_Q_W, L_K_W, L_V_W, L_O_W, L_FC_W, L_UP_W, L_DOWN_W};

/* Whether module `mod` (a weight's name without ".weight") is named by an
 * entry of llm_int8_skip_modules (equal, or ending with "." + the entry). */
static bool skipped(const cllm_bnb_config *c, const char *name) {
    size_t ln = strlen(name) > 7 ? strlen(name) - 7 : 0; /* without ".weight" */
    for (int i = 0; i < c->n_skip_modules; i++) {
        size_t ls = strlen(c->skip_modules[i]);
        if (ls > ln || strncmp(name + ln - ls, c->skip_modules[i], ls)) continue;
        if (ls == ln || name[ln - ls - 1] == '.') return true;
    }
    return false;
}

void model_qbase_free(cllm_model *m) {
    if (!m->qb) return;
    free(m->qb->w);
    cllm_free(m->qb->buf);
    free(m->qb);
    m->qb = NULL;
}

/* Walks the quantized matrices of m (a layout is enough): for each, its
 * tensor, [out, in] shape and stored bytes; returns the bytes of all of
 * them (64-byte aligned each) and sets *widest, *numel. With q, carves
 * q->buf into views. */
static size_t walk(const cllm_model *m, const cllm_bnb_config *c, cllm_bnb_type type, bool dq, struct model_qbase *q,
                   size_t *widest, size_t *numel) {
    size_t total = 0;
    *widest = *numel = 0;
    bool conv = m->cfg.arch == CLLM_ARCH_GPT2;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (size_t s = 0; s < sizeof linear_slots / sizeof linear_slots[0]; s++) {
            int t = m->lslot[l][linear_slots[s]];
            if (t < 0 || skipped(c, m->tensors[t].name)) continue;
            const cllm_tensor_info *ti = &m->tensors[t];
            int rows = (int)(conv ? ti->shape[1] : ti->shape[0]), cols = (int)(conv ? ti->shape[0] : ti->shape[1]);
            if (q) cllm_bnb_view(&q->w[t], type, dq, rows, cols, q->buf + total);
            if (ti->numel > *widest) *widest = ti->numel;
            *numel += ti->numel;
            total += (cllm_bnb_bytes(type, dq, rows, cols) + 63) / 64 * 64;
        }
    return total;
}

static cllm_status qbase_init(cllm_model *m, const cllm_bnb_config *c) {
    struct model_qbase *q = calloc(1, sizeof *q);
    if (q) q->w = calloc((size_t)m->n_tensors, sizeof *q->w);
    if (!q || !q->w) {
        free(q);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    q->type = cllm_bnb_config_type(c);
    q->dq = c->double_quant && q->type != CLLM_BNB_INT8;
    size_t numel;
    q->bytes = walk(m, c, q->type, q->dq, NULL, &q->widest, &numel);
    if (!(q->buf = cllm_alloc(q->bytes ? q->bytes : 64, "quantized base"))) {
        free(q->w);
        free(q);
        return CLLM_ERR_NOMEM;
    }
    walk(m, c, q->type, q->dq, q, &q->widest, &numel);
    q->compute = q->type == CLLM_BNB_INT8 ? CLLM_BNB_COMPUTE_FP32 : c->compute;
    for (int t = 0; t < m->n_tensors; t++)
        if (q->w[t].type != CLLM_BNB_NONE) {
            if (q->w[t].rows > q->max_rows) q->max_rows = q->w[t].rows;
            if (q->w[t].cols > q->max_cols) q->max_cols = q->w[t].cols;
        }
    m->qb = q;
    return CLLM_OK;
}

cllm_status cllm_model_config_quantized(const cllm_model_config *mc, const cllm_bnb_config *c, size_t *numel,
                                        size_t *bytes, size_t *widest) {
    cllm_model tmp = {0};
    tmp.cfg = *mc;
    cllm_status st = model_build_layout(&tmp);
    if (!st) {
        cllm_bnb_type t = cllm_bnb_config_type(c);
        *bytes = walk(&tmp, c, t, c->double_quant && t != CLLM_BNB_INT8, NULL, widest, numel);
    }
    free(tmp.tensors);
    free(tmp.lslot);
    free(tmp.tgroup);
    free(tmp.groups);
    return st;
}

const cllm_bnb_matrix *model_qbase_get(const cllm_model *m, int idx) {
    if (!m->qb || idx < 0 || m->qb->w[idx].type == CLLM_BNB_NONE) return NULL;
    return &m->qb->w[idx];
}

int model_qbase_index(const cllm_model *m, const float *w) {
    int t = m->qb ? model_tensor_at(m, w) : -1;
    return t >= 0 && m->qb->w[t].type != CLLM_BNB_NONE ? t : -1;
}

size_t model_qbase_scratch(const cllm_model *m) { return m->qb ? m->qb->widest : 0; }

size_t model_qbase_operand_elems(const cllm_model *m, int rows) {
    if (!m->qb || m->qb->compute == CLLM_BNB_COMPUTE_FP32) return 0;
    return (size_t)rows * (size_t)m->qb->max_cols + (size_t)m->qb->max_rows;
}

/* ------------------------------------------------------------ loading */

typedef struct {
    cllm_model *m;
    float *tmp, *tr, *scratch; /* the largest matrix's fp32 values, its transpose, the absmax scratch */
} load_ctx;

static cllm_status put_tensor(void *ctx, int idx, const cllm_st_tensor *t) {
    load_ctx *c = ctx;
    cllm_model *m = c->m;
    const cllm_tensor_info *ti = &m->tensors[idx];
    if (t->dtype == CLLM_U8)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' holds blocks of a cllm convert --quantize folder: a "
                         "quantized base loads from fp32, fp16 or bf16 weights", t->file, t->name);
    cllm_bnb_matrix *q = m->qb->w[idx].type != CLLM_BNB_NONE ? &m->qb->w[idx] : NULL;
    cllm_status st = cllm_st_read_f32(t, q ? c->tmp : m->params + ti->offset, (int64_t)ti->numel);
    /* the file's pages of this tensor are read: out of the resident set, so
     * that loading never holds the whole fp32 (or bf16) model */
    cllm_mem_release((void *)(uintptr_t)t->data, t->nbytes);
    if (st || !q) return st;
    const float *src = c->tmp;
    if (m->cfg.arch == CLLM_ARCH_GPT2) { /* Conv1D [in, out] -> [out, in] */
        const int R = q->rows, K = q->cols;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) c->tr[(size_t)r * K + k] = c->tmp[(size_t)k * R + r];
        src = c->tr;
    }
    cllm_bnb_quantize(q, src, c->scratch);
    return CLLM_OK;
}

cllm_status cllm_model_load_quantized(cllm_model **out, const char *dir, const cllm_bnb_config *qc) {
    *out = NULL;
    if (!qc || !qc->enabled) return CLLM_FAIL(CLLM_ERR_ARG, "quantization: neither load_in_8bit nor load_in_4bit set");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *config = NULL;
    cllm_model *m = NULL;
    load_ctx c = {0};
    cllm_status st = cllm_json_load_file(&config, path);
    if (st) return st;
    if ((st = model_from_config_ex(&m, config, path, false))) goto done;
    if (json_object_get(config, "cllm_weights")) {
        st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: a folder written by cllm convert --quantize (cllm_weights): a "
                       "quantized base loads from fp32, fp16 or bf16 weights", path);
        goto done;
    }
    if ((st = qbase_init(m, qc))) goto done;
    if (!(m->params = calloc(m->n_params ? m->n_params : 1, sizeof(float)))) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot allocate %zu parameters", m->n_params);
        goto done;
    }
    m->params_lazy = true;
    size_t w = m->qb->widest ? m->qb->widest : 1, nb = w / CLLM_BNB_BLOCK + 1;
    c.m = m;
    c.tmp = cllm_alloc(w * sizeof(float), "weight being quantized");
    c.tr = cllm_alloc(w * sizeof(float), "weight being quantized");
    c.scratch = cllm_alloc(nb * sizeof(float), "absmax values");
    if (!c.tmp || !c.tr || !c.scratch) {
        st = CLLM_ERR_NOMEM;
        goto done;
    }
    st = model_load_tensors(m, dir, put_tensor, &c);
done:
    cllm_free(c.tmp);
    cllm_free(c.tr);
    cllm_free(c.scratch);
    json_decref(config);
    if (st) {
        cllm_model_free(m);
        return st;
    }
    *out = m;
    return CLLM_OK;
}

cllm_bnb_type cllm_model_quantized(const cllm_model *m) { return m->qb ? m->qb->type : CLLM_BNB_NONE; }

size_t cllm_model_quantized_bytes(const cllm_model *m) { return m->qb ? m->qb->bytes : 0; }

/* ------------------------------------------------------------ passes */

/* lp->deq with room for one dequantized matrix. */
static cllm_status deq_scratch(const cllm_model *m, model_lp_scratch *lp, float **out) {
    size_t need = m->qb->widest;
    if (need > lp->deq_elems) {
        if (lp->fixed) return CLLM_FAIL(CLLM_ERR_INTERNAL, "quantized base: scratch sized for a smaller matrix");
        float *d = cllm_alloc(need * sizeof(float), "dequantized base weight");
        if (!d) return CLLM_ERR_NOMEM;
        cllm_free(lp->deq);
        lp->deq = d;
        lp->deq_elems = need;
    }
    *out = lp->deq;
    return CLLM_OK;
}

/* dst[n] = src[n] rounded to the compute dtype (dst may alias src). */
static void round_to(cllm_bnb_compute c, float *dst, const float *src, size_t n) {
    if (c == CLLM_BNB_COMPUTE_BF16)
        cllm_round_bf16(dst, src, (long)n);
    else
        cllm_round_f16(dst, src, (long)n);
}

/* The dequantized matrix in lp->deq, rounded to the compute dtype. */
static cllm_status weight_of(const cllm_model *m, model_lp_scratch *lp, const cllm_bnb_matrix *q, float **W) {
    cllm_status st = deq_scratch(m, lp, W);
    if (st) return st;
    cllm_bnb_dequantize(*W, q, 0, q->rows);
    if (m->qb->compute != CLLM_BNB_COMPUTE_FP32) round_to(m->qb->compute, *W, *W, (size_t)q->rows * q->cols);
    return CLLM_OK;
}

cllm_status model_qbase_forward(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp,
                                const cllm_bnb_matrix *q, const float *bias, int N) {
    float *W = NULL;
    cllm_status st = weight_of(m, lp, q, &W);
    if (st) return st;
    cllm_bnb_compute c = m->qb->compute;
    if (c == CLLM_BNB_COMPUTE_FP32) return cllm_linear_forward(out, inp, W, bias, N, q->cols, q->rows, false);
    size_t nin = (size_t)N * q->cols;
    if ((st = model_lp_reserve(lp, CLLM_PREC_FP32, nin + (size_t)q->rows))) return st;
    float *x = lp->a, *b = bias ? x + nin : NULL;
    round_to(c, x, inp, nin);
    if (b) round_to(c, b, bias, (size_t)q->rows);
    st = cllm_linear_forward(out, x, W, b, N, q->cols, q->rows, false);
    if (!st) round_to(c, out, out, (size_t)N * q->rows);
    return st;
}

/* The backward pass under bf16 / fp16 compute: g = round(dout) in lp->a;
 * dinp += round(g . W), dbias += round(column sums of g) (the bias was cast
 * too), each product in lp->b. */
static cllm_status backward_rounded(const cllm_model *m, model_lp_scratch *lp, float *dinp, float *dbias,
                                    const float *dout, const cllm_bnb_matrix *q, int N) {
    cllm_bnb_compute c = m->qb->compute;
    size_t nin = (size_t)N * q->cols, nout = (size_t)N * q->rows;
    cllm_status st = model_lp_reserve(lp, CLLM_PREC_FP32, (nin > nout ? nin : nout) + (size_t)q->rows);
    if (st) return st;
    if (!lp->b) return CLLM_FAIL(CLLM_ERR_INTERNAL, "a backward pass through a forward-only operand scratch");
    float *d = lp->a, *g = lp->b, *W = NULL;
    round_to(c, d, dout, nout);
    if (dinp && !(st = weight_of(m, lp, q, &W)) &&
        !(st = cllm_matmul(g, d, W, N, q->cols, q->rows, false, false, 1.0f, 0.0f))) {
        round_to(c, g, g, nin);
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < nin; i++) dinp[i] += g[i];
    }
    if (!st && dbias) {
        memset(g, 0, (size_t)q->rows * sizeof *g);
        st = cllm_linear_backward(NULL, NULL, g, d, NULL, NULL, N, q->cols, q->rows, false);
        round_to(c, g, g, (size_t)q->rows);
        for (int j = 0; j < q->rows; j++) dbias[j] += g[j];
    }
    return st;
}

cllm_status model_qbase_backward(const cllm_model *m, model_lp_scratch *lp, float *dinp, float *dw, float *dbias,
                                 const float *dout, int idx, int N) {
    const cllm_bnb_matrix *q = &m->qb->w[idx];
    if (dw)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "%s is quantized (%s) and cannot train: keep it frozen",
                         m->tensors[idx].name, cllm_bnb_type_name(q->type));
    if (m->qb->compute != CLLM_BNB_COMPUTE_FP32) return backward_rounded(m, lp, dinp, dbias, dout, q, N);
    cllm_status st = CLLM_OK;
    if (dinp) {
        float *W = NULL;
        if ((st = weight_of(m, lp, q, &W))) return st;
        /* dinp[N, in] += dout[N, out] . W[out, in] */
        st = cllm_matmul(dinp, dout, W, N, q->cols, q->rows, false, false, 1.0f, 1.0f);
    }
    if (!st && dbias) st = cllm_linear_backward(NULL, NULL, dbias, dout, NULL, NULL, N, q->cols, q->rows, false);
    return st;
}
