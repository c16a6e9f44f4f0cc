/*
 * Inference weight formats of a model (cllm_model_load_weights,
 * cllm_model_set_weights; formats and kernels in cllm/quant.h).
 *
 * The matrices a decode step reads (every linear layer's weight, the token
 * embedding and an untied head) live in one allocation, the weight store,
 * each as a [out, in] matrix of the chosen format (GPT-2's Conv1D weights
 * transposed); the flat fp32 buffer keeps the rest (norms, biases, position
 * embeddings). model_linear_forward finds a layer's stored matrix by its
 * tensor index. The rows of a decode step run on cllm_qmatmul (int8 and q4
 * up to CLLM_QGEMM_MIN_ROWS - 1 rows, bf16 up to WEIGHTS_SMALL_ROWS), longer
 * prompts on cllm_qgemm: oneDNN's fp32 GEMM over panels of output channels
 * widened into the run's scratch (int8 / q4 activations rounded to their
 * quantized values first, so both paths compute the same products, up to
 * fp32 rounding). Embedding rows are widened from the stored matrix as
 * they are looked up.
 *
 * A model loaded in a format other than fp32 never writes the fp32 slots of
 * the stored matrices: its flat buffer comes from calloc, whose untouched
 * zero pages the system maps lazily, so they cost address space, not
 * memory. Such a model runs forwards only (no training, no backward).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/io.h"
#include "cllm/json.h"
#include "cllm/kernels.h"
#include "model_impl.h"

struct model_wstore {
    cllm_wfmt fmt;
    cllm_qweight *w;  /* [n_tensors]: data NULL for a tensor kept in the flat buffer */
    unsigned char *buf;
    size_t bytes;
};

/* The block slots that are linear weights. */
static const int linear_slots[] = {L_QKV_W, L_Q_W, L_K_W, L_V_W, L_O_W, L_FC_W, L_UP_W, L_DOWN_W};

/* Whether tensor idx is one of the matrices a weight store holds; *conv:
 * stored in the file as [in, out] (GPT-2 Conv1D). */
static bool stored_matrix(const cllm_model *m, int idx, bool *conv) {
    *conv = false;
    if (idx < 0) return false;
    if (idx == m->gslot[G_WTE] || idx == m->gslot[G_HEAD]) return true;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (size_t s = 0; s < sizeof linear_slots / sizeof linear_slots[0]; s++)
            if (m->lslot[l][linear_slots[s]] == idx) {
                *conv = m->cfg.arch == CLLM_ARCH_GPT2;
                return true;
            }
    return false;
}

/* rows (out) and cols (in) of a stored matrix */
static void stored_shape(const cllm_model *m, int idx, int *rows, int *cols) {
    bool conv;
    stored_matrix(m, idx, &conv);
    const cllm_tensor_info *t = &m->tensors[idx];
    *rows = (int)(conv ? t->shape[1] : t->shape[0]);
    *cols = (int)(conv ? t->shape[0] : t->shape[1]);
}

const cllm_qweight *model_weights_get(const cllm_model *m, int idx) {
    if (!m->ws || idx < 0 || !m->ws->w[idx].data) return NULL;
    return &m->ws->w[idx];
}

void model_weights_free(cllm_model *m) {
    if (!m->ws) return;
    free(m->ws->w);
    cllm_free(m->ws->buf);
    free(m->ws);
    m->ws = NULL;
}

cllm_status model_weights_init(cllm_model *m, cllm_wfmt f) {
    struct model_wstore *ws = calloc(1, sizeof *ws);
    if (ws) ws->w = calloc((size_t)m->n_tensors, sizeof *ws->w);
    if (!ws || !ws->w) {
        free(ws);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        total = 0;
        for (int i = 0; i < m->n_tensors; i++) {
            bool conv;
            if (!stored_matrix(m, i, &conv)) continue;
            int rows, cols;
            stored_shape(m, i, &rows, &cols);
            if (pass) ws->w[i] = (cllm_qweight){.fmt = f, .data = ws->buf + total, .rows = rows, .cols = cols};
            total += (cllm_qweight_bytes(f, rows, cols) + 63) / 64 * 64;
        }
        if (!pass && !(ws->buf = cllm_alloc_huge(total, "weight store"))) {
            free(ws->w);
            free(ws);
            return CLLM_ERR_NOMEM;
        }
    }
    ws->fmt = f;
    ws->bytes = total;
    model_weights_free(m);
    m->ws = ws;
    return CLLM_OK;
}

bool model_weights_stored(const cllm_model *m, int idx) { return model_weights_get(m, idx) != NULL; }

cllm_status model_weights_fill(cllm_model *m, int idx, const float *src) {
    bool conv;
    stored_matrix(m, idx, &conv);
    const cllm_qweight *q = &m->ws->w[idx];
    return cllm_quant_matrix((void *)(uintptr_t)q->data, q->fmt, src, q->rows, q->cols, conv);
}

cllm_status model_weights_read(cllm_model *m, int idx, const cllm_st_tensor *t, cllm_wfmt file_fmt) {
    const cllm_qweight *q = &m->ws->w[idx];
    const cllm_tensor_info *ti = &m->tensors[idx];
    if (t->dtype == CLLM_U8) { /* a stored matrix written by cllm convert --quantize */
        size_t rb = cllm_wfmt_row_bytes(file_fmt, q->cols);
        if (file_fmt == CLLM_WFMT_FP32 || t->ndim != 2 || t->shape[0] != q->rows || (size_t)t->shape[1] != rb)
            return CLLM_FAIL(CLLM_ERR_FORMAT,
                             "%s: tensor '%s' (U8) is not a [%d, %zu] matrix of %s blocks as config.json's "
                             "cllm_weights says",
                             t->file, t->name, q->rows, rb, cllm_wfmt_name(file_fmt));
        if (file_fmt == q->fmt) {
            memcpy((void *)(uintptr_t)q->data, t->data, (size_t)q->rows * rb);
            return CLLM_OK;
        }
        /* another format: widen the rows and store them again */
        float *tmp = cllm_alloc((size_t)q->rows * (size_t)q->cols * sizeof(float), "widened weight");
        if (!tmp) return CLLM_ERR_NOMEM;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < q->rows; r++)
            cllm_quant_dequant_row(tmp + (size_t)r * q->cols, (const unsigned char *)t->data + (size_t)r * rb, file_fmt,
                                   q->cols);
        cllm_status st = cllm_quant_matrix((void *)(uintptr_t)q->data, q->fmt, tmp, q->rows, q->cols, false);
        cllm_free(tmp);
        return st;
    }
    float *tmp = cllm_alloc((size_t)ti->numel * sizeof(float), "weight being converted");
    if (!tmp) return CLLM_ERR_NOMEM;
    cllm_status st = cllm_st_read_f32(t, tmp, (int64_t)ti->numel);
    if (!st) st = model_weights_fill(m, idx, tmp);
    cllm_free(tmp);
    return st;
}

cllm_status model_weights_widen(const cllm_model *m, int idx, const cllm_st_tensor *t, cllm_wfmt file_fmt,
                                float *dst) {
    bool conv;
    if (!stored_matrix(m, idx, &conv))
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' holds U8 values; only matrices are stored quantized", t->file,
                         t->name);
    int rows, cols;
    stored_shape(m, idx, &rows, &cols);
    size_t rb = cllm_wfmt_row_bytes(file_fmt, cols);
    if (t->ndim != 2 || t->shape[0] != rows || (size_t)t->shape[1] != rb)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' (U8) is not a [%d, %zu] matrix of %s blocks", t->file,
                         t->name, rows, rb, cllm_wfmt_name(file_fmt));
    float *tmp = conv ? cllm_alloc((size_t)rows * (size_t)cols * sizeof(float), "widened weight") : dst;
    if (!tmp) return CLLM_ERR_NOMEM;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        cllm_quant_dequant_row(tmp + (size_t)r * cols, (const unsigned char *)t->data + (size_t)r * rb, file_fmt, cols);
    if (conv) { /* [out, in] rows back to the Conv1D [in, out] layout */
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = tmp[(size_t)r * cols + c];
        cllm_free(tmp);
    }
    return CLLM_OK;
}

cllm_status cllm_model_set_weights(cllm_model *m, cllm_wfmt f) {
    if ((unsigned)f >= CLLM_WFMT_COUNT) return CLLM_FAIL(CLLM_ERR_ARG, "unknown weight format %d", (int)f);
    if (m->ws && m->ws->fmt == f) return CLLM_OK;
    if (m->shared) return model_shared_refuse("a change of weight format");
    if (m->ws && m->params_lazy)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "the model was loaded with %s weights and has no fp32 copy to convert "
                         "from: load it again with the format wanted", cllm_wfmt_name(m->ws->fmt));
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "the model's parameters were dropped");
    if (m->has_backward)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a model prepared for training keeps fp32 weights");
    if (m->qb) return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "--weights with a quantized base (load_in_4bit / load_in_8bit)");
    cllm_status rs = model_conv_restore(m); /* the store is filled from the file layout */
    if (rs) return rs;
    if (f == CLLM_WFMT_FP32) {
        model_weights_free(m);
        return CLLM_OK;
    }
    cllm_status init = model_weights_init(m, f);
    if (init) return init;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->ws->w[i].data) {
            cllm_status st = model_weights_fill(m, i, model_param(m, i));
            if (st) {
                model_weights_free(m);
                return st;
            }
        }
    return CLLM_OK;
}

size_t model_weights_store_bytes(const cllm_model *m) { return m->ws ? m->ws->bytes : 0; }

cllm_wfmt cllm_model_weights(const cllm_model *m) { return m->ws ? m->ws->fmt : CLLM_WFMT_FP32; }

size_t cllm_model_weight_bytes(const cllm_model *m) {
    size_t bytes = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const cllm_qweight *q = model_weights_get(m, i);
        bool conv;
        if (q) {
            if (i != m->gslot[G_WTE] || m->gslot[G_HEAD] < 0) bytes += cllm_qweight_bytes(q->fmt, q->rows, q->cols);
        } else if (stored_matrix(m, i, &conv) && (i != m->gslot[G_WTE] || m->gslot[G_HEAD] < 0)) {
            bytes += m->tensors[i].numel * sizeof(float);
        }
    }
    return bytes;
}

/* ------------------------------------------------ the fp32 decode layout */

/* Every Conv1D matrix of the flat buffer transposed in place through one
 * scratch matrix: [in, out] -> [out, in] when to_rows, back otherwise. The
 * transpose runs in 32 x 32 tiles so both sides stay in cache. */
static cllm_status conv_transpose(cllm_model *m, bool to_rows) {
    size_t widest = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        bool conv;
        if (stored_matrix(m, i, &conv) && conv && m->tensors[i].numel > widest) widest = m->tensors[i].numel;
    }
    float *tmp = widest ? cllm_alloc(widest * sizeof(float), "weight being transposed") : NULL;
    if (widest && !tmp) return CLLM_ERR_NOMEM;
    for (int i = 0; i < m->n_tensors; i++) {
        bool conv;
        if (!stored_matrix(m, i, &conv) || !conv) continue;
        const cllm_tensor_info *t = &m->tensors[i];
        float *p = m->params + t->offset;
        /* the source is [sr, sc], the result [sc, sr] */
        const int sr = (int)(to_rows ? t->shape[0] : t->shape[1]), sc = (int)(to_rows ? t->shape[1] : t->shape[0]);
        memcpy(tmp, p, t->numel * sizeof(float));
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < sc; c0 += 32)
            for (int r0 = 0; r0 < sr; r0 += 32)
                for (int c = c0; c < c0 + 32 && c < sc; c++)
                    for (int r = r0; r < r0 + 32 && r < sr; r++) p[(size_t)c * sr + r] = tmp[(size_t)r * sc + c];
    }
    cllm_free(tmp);
    m->conv_rows = to_rows;
    atomic_store(&m->lp_stale, true); /* bf16 / fp16 copies follow the flat buffer */
    return CLLM_OK;
}

cllm_status cllm_model_set_inference(cllm_model *m) {
    if (m->conv_rows || m->cfg.arch != CLLM_ARCH_GPT2 || !m->params || m->ws || m->qb || m->params_lazy ||
        m->has_backward || m->lora || m->tcopies || m->shared)
        return CLLM_OK; /* a run over shared weights leaves their layout alone */
    return conv_transpose(m, true);
}

cllm_status model_conv_restore(cllm_model *m) { return m->conv_rows ? conv_transpose(m, false) : CLLM_OK; }

const float *model_conv_file_layout(const cllm_model *m, int idx, float **tmp) {
    const cllm_tensor_info *t = &m->tensors[idx];
    const float *p = m->params + t->offset;
    bool conv;
    *tmp = NULL;
    if (!m->conv_rows || !stored_matrix(m, idx, &conv) || !conv) return p;
    const size_t in = (size_t)t->shape[0], out = (size_t)t->shape[1];
    if (!(*tmp = cllm_alloc(t->numel * sizeof(float), "weight in the file layout"))) return NULL;
    for (size_t r = 0; r < out; r++)
        for (size_t c = 0; c < in; c++) (*tmp)[c * out + r] = p[r * in + c];
    return *tmp;
}

/* ------------------------------------------------------------ forwards */

static void embed_row(const cllm_qweight *q, float *out, const int32_t *tokens, const float *wpe, int T, int n) {
    const int C = q->cols;
    float *o = out + (size_t)n * C;
    cllm_quant_dequant_row(o, (const unsigned char *)q->data + (size_t)tokens[n] * cllm_wfmt_row_bytes(q->fmt, C), q->fmt,
                           C);
    if (wpe) {
        const float *p = wpe + (size_t)(n % T) * C;
        for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

void model_weights_embed(const cllm_model *m, float *out, const int32_t *tokens, const float *wpe, int N, int T) {
    const cllm_qweight *q = model_weights_get(m, m->gslot[G_WTE]);
    if (N <= 4) { /* a decode step: no OpenMP region (cllm_add in src/kernels/elementwise.c says why) */
        for (int n = 0; n < N; n++) embed_row(q, out, tokens, wpe, T, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) embed_row(q, out, tokens, wpe, T, n);
}

/* Whether a forward of `rows` rows through matrices of format f runs on
 * cllm_qgemm (panels of widened rows on oneDNN's GEMM) rather than on
 * cllm_qmatmul: bf16 past WEIGHTS_SMALL_ROWS, int8 / q4 from
 * CLLM_QGEMM_MIN_ROWS (below it widening costs more than the integer tiles
 * save). */
static bool on_gemm(cllm_wfmt f, int rows) {
    if (f == CLLM_WFMT_BF16) return rows > WEIGHTS_SMALL_ROWS;
    return (f == CLLM_WFMT_INT8 || f == CLLM_WFMT_Q4) && rows >= CLLM_QGEMM_MIN_ROWS;
}

/* Floats of lp->deq a forward of up to `rows` rows needs: the quantized
 * activations of cllm_qmatmul, and where `rows` run on cllm_qgemm its
 * widened panel, panel output and rounded activations. */
static size_t scratch_floats(const cllm_model *m, int rows, int widest) {
    if (!m->ws) return 0;
    size_t b = cllm_qmatmul_scratch_bytes(m->ws->fmt, widest, rows);
    if (on_gemm(m->ws->fmt, rows)) {
        size_t g = cllm_qgemm_scratch_bytes(m->ws->fmt, widest, rows);
        if (g > b) b = g;
    }
    return (b + sizeof(float) - 1) / sizeof(float);
}

size_t model_weights_scratch(const cllm_model *m, int rows) {
    if (m->qb) return model_qbase_scratch(m); /* a quantized base: one dequantized matrix */
    int widest = 0;
    for (int i = 0; m->ws && i < m->n_tensors; i++)
        if (m->ws->w[i].data && m->ws->w[i].cols > widest) widest = m->ws->w[i].cols;
    return scratch_floats(m, rows, widest);
}

cllm_status model_weights_linear(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp,
                                 const cllm_qweight *q, const float *bias, int N) {
    size_t need = scratch_floats(m, N, q->cols);
    if (need > lp->deq_elems) {
        if (lp->fixed)
            return CLLM_FAIL(CLLM_ERR_INTERNAL, "a forward of %d rows, weight scratch sized for fewer", N);
        float *d = cllm_alloc(need * sizeof(float), "weight-format scratch");
        if (!d) return CLLM_ERR_NOMEM;
        cllm_free(lp->deq);
        lp->deq = d;
        lp->deq_elems = need;
    }
    if (on_gemm(q->fmt, N)) return cllm_qgemm(out, inp, q, bias, N, lp->deq);
    cllm_qmatmul(out, inp, q, bias, N, lp->deq);
    return CLLM_OK;
}

/* ------------------------------------------------------------ saving */

cllm_status cllm_model_save_weights(const cllm_model *m, const char *dir, size_t max_shard_bytes) {
    if (!m->ws) return cllm_model_save(m, dir, max_shard_bytes);
    const cllm_wfmt f = m->ws->fmt;
    cllm_status st = cllm_make_dirs(dir);
    if (st) return st;
    cllm_st_entry *e = calloc((size_t)m->n_tensors, sizeof *e);
    uint16_t **bf = calloc((size_t)m->n_tensors, sizeof *bf);
    json_t *config = json_deep_copy(m->config_json);
    if (!e || !bf || !config) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < m->n_tensors && !st; i++) {
        const cllm_tensor_info *t = &m->tensors[i];
        const cllm_qweight *q = model_weights_get(m, i);
        e[i] = (cllm_st_entry){.name = t->name, .dtype = CLLM_F32, .ndim = t->ndim, .data = m->params + t->offset};
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
        if (!q) continue;
        if (f == CLLM_WFMT_BF16) { /* plain BF16 tensors in the file layout: an HF folder */
            bool conv;
            stored_matrix(m, i, &conv);
            if (!(bf[i] = cllm_alloc(t->numel * sizeof(uint16_t), "bf16 tensor"))) {
                st = CLLM_ERR_NOMEM;
                break;
            }
            const uint16_t *src = q->data;
            for (int r = 0; r < q->rows; r++)
                for (int c = 0; c < q->cols; c++)
                    bf[i][conv ? (size_t)c * q->rows + r : (size_t)r * q->cols + c] = src[(size_t)r * q->cols + c];
            e[i].dtype = CLLM_BF16;
            e[i].data = bf[i];
        } else { /* rows of blocks, [out, in] */
            e[i].dtype = CLLM_U8;
            e[i].ndim = 2;
            e[i].shape[0] = q->rows;
            e[i].shape[1] = (int64_t)cllm_wfmt_row_bytes(f, q->cols);
            e[i].data = q->data;
        }
    }
    if (!st && f != CLLM_WFMT_BF16 &&
        json_object_set_new(config, "cllm_weights",
                            json_pack("{s:s, s:i, s:s}", "format", cllm_wfmt_name(f), "block_size", CLLM_QBLOCK, "layout",
                                      "rows: [out, in], blocks along in")))
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!st) st = cllm_st_save_dir(dir, e, m->n_tensors, max_shard_bytes);
    if (!st) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        st = cllm_json_save_file(config, path);
    }
done:
    for (int i = 0; bf && i < m->n_tensors; i++) cllm_free(bf[i]);
    free(bf);
    free(e);
    json_decref(config);
    return st;
}
