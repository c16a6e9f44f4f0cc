/*
 * Tensor parallelism (Megatron's 1-D scheme) on the model side: a tensor
 * rank's part of a model, gathering the parts back, and the pieces of the
 * forward and backward passes that talk to the tensor group (run.c calls
 * them where the single-process code has no communication).
 *
 * A part is an ordinary model whose config has n_head / tp query heads,
 * n_kv_head / tp key/value heads, n_inner / tp FFN width and vocab_size / tp
 * vocabulary rows, with the whole head_dim and n_embd; the layout tables
 * then give every tensor exactly its cut shape (cllm_tp_shape), in the same
 * order and with the same names as the whole model. The part keeps the
 * whole model's config.json. Passes over a part:
 *   embedding  rows of this rank's vocabulary range, zeros elsewhere, summed
 *              over the group; GPT-2's positions (and BLOOM's embedding
 *              norm) are applied once after the sum
 *   QKV, fc, gate, up   column-parallel: local; their input gradient is
 *              summed over the group before the norm's backward
 *   attention  over the local heads (GQA groups stay whole: heads are cut in
 *              contiguous runs)
 *   o, down    row-parallel: partial products summed, then the bias once
 *   head       vocabulary-parallel logits and cross-entropy (global max and
 *              sum of exp per row from the group); the input gradient is
 *              summed over the group
 * Norm parameters are replicated; their gradients come out equal on every
 * rank because their inputs and output gradients are.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/json.h"
#include "cllm/kernels.h"
#include "cllm/split.h"
#include "cllm/topo.h"
#include "model_impl.h"

/* ------------------------------------------------------------ parts */

/* The part's layout with zeroed parameters, its shapes checked against the
 * cut shapes of full's tensors (full may hold no parameters). lazy: the
 * buffer of a part whose matrices live in a weight store, zero pages from
 * calloc that are mapped only where written (norms, biases). */
static cllm_status part_layout(cllm_model **out, const cllm_model *full, int tp, int r, bool lazy, bool huge) {
    *out = NULL;
    if (tp < 1 || r < 0 || r >= tp) return CLLM_FAIL(CLLM_ERR_ARG, "tensor rank %d of %d", r, tp);
    cllm_status st = cllm_topo_check_tensor(&full->cfg, tp, "config.json");
    if (st) return st;
    cllm_model *m = calloc(1, sizeof *m);
    if (!m) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    m->cfg = full->cfg;
    m->cfg.n_head /= tp;
    m->cfg.n_kv_head /= tp;
    m->cfg.n_inner /= tp;
    m->cfg.vocab_size = (full->cfg.vocab_size + tp - 1) / tp; /* padded, as Megatron pads it */
    m->config_json = json_deep_copy(full->config_json);
    if (!m->config_json) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot copy config");
        goto fail;
    }
    if ((st = model_build_layout(m))) goto fail;
    if (m->n_tensors != full->n_tensors) {
        st = CLLM_FAIL(CLLM_ERR_INTERNAL, "tensor part has %d tensors, the model %d", m->n_tensors, full->n_tensors);
        goto fail;
    }
    /* huge: a part that only runs forwards reads its buffer every step
     * (cllm_model_load_weights says why it asks for huge pages) */
    m->params = lazy   ? calloc(m->n_params ? m->n_params : 1, sizeof(float))
                : huge ? cllm_calloc_huge(m->n_params, sizeof(float), "model parameters")
                       : cllm_calloc(m->n_params, sizeof(float), "model parameters");
    m->params_lazy = lazy;
    if (!m->params) {
        if (lazy) CLLM_FAIL(CLLM_ERR_NOMEM, "cannot allocate %zu parameters", m->n_params);
        st = CLLM_ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const cllm_tensor_info *t = &full->tensors[i], *p = &m->tensors[i];
        int64_t shape[2];
        cllm_tp_shape(t, cllm_tp_rule_of(full, i), tp, shape);
        if (strcmp(t->name, p->name) != 0 || shape[0] != p->shape[0] || (p->ndim > 1 && shape[1] != p->shape[1])) {
            st = CLLM_FAIL(CLLM_ERR_INTERNAL, "tensor part of %s: cut shape [%lld, %lld], layout [%lld, %lld]",
                           t->name, (long long)shape[0], (long long)shape[1], (long long)p->shape[0],
                           (long long)p->shape[1]);
            goto fail;
        }
    }
    m->tp_rank = r;
    m->tp_size = tp;
    m->tp_vocab = full->cfg.vocab_size;
    *out = m;
    return CLLM_OK;
fail:
    cllm_model_free(m);
    return st;
}

cllm_status cllm_tp_model_part(cllm_model **out, const cllm_model *full, int tp, int r) {
    if (full->conv_rows)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a tensor-parallel part of a model laid out for forwards "
                         "(cllm_model_set_inference): cut the model as loaded");
    cllm_status st = part_layout(out, full, tp, r, false, false);
    if (st) return st;
    cllm_model *m = *out;
    for (int i = 0; i < m->n_tensors; i++)
        cllm_tp_slice(&full->tensors[i], cllm_tp_rule_of(full, i), tp, r, full->params + full->tensors[i].offset,
                      m->params + m->tensors[i].offset);
    return CLLM_OK;
}

/* Loading a part straight from the files: each tensor is read (converted
 * to fp32 in a scratch buffer unless the file holds aligned fp32, which is
 * cut from the mapping) and only this rank's slice is kept, in the part's
 * weight store when it has one (tp_weights.c; blocks of a quantized folder
 * are cut as they are). */
typedef struct {
    const cllm_model *whole;
    cllm_model *part;
    cllm_wfmt file_fmt;
    float *tmp;
    size_t tmp_len;
} part_loader;

static cllm_status put_slice(void *ctx, int idx, const cllm_st_tensor *t) {
    part_loader *pl = ctx;
    const cllm_tensor_info *ti = &pl->whole->tensors[idx];
    const bool stored = model_weights_stored(pl->part, idx);
    if (t->dtype == CLLM_U8 && pl->file_fmt == CLLM_WFMT_FP32)
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' holds U8 values but config.json has no cllm_weights",
                         t->file, t->name);
    /* blocks to int8 / q4 slices: cut as bytes (whole blocks: model_tp_check_blocks); to bf16 the
     * whole tensor is widened first, since a bf16 slice may cut inside a block */
    if (t->dtype == CLLM_U8 && stored && cllm_model_weights(pl->part) != CLLM_WFMT_BF16)
        return model_tp_put_blocks(pl->whole, pl->part, idx, t, pl->file_fmt);
    const float *src;
    if (t->dtype == CLLM_F32 && (uintptr_t)t->data % sizeof(float) == 0) {
        src = t->data;
    } else {
        if (ti->numel > pl->tmp_len) {
            cllm_free(pl->tmp);
            pl->tmp = cllm_alloc(ti->numel * sizeof(float), "tensor being cut");
            pl->tmp_len = pl->tmp ? ti->numel : 0;
            if (!pl->tmp) return CLLM_ERR_NOMEM;
        }
        cllm_status st = t->dtype == CLLM_U8 ? model_weights_widen(pl->whole, idx, t, pl->file_fmt, pl->tmp)
                                             : cllm_st_read_f32(t, pl->tmp, (int64_t)ti->numel);
        if (st) return st;
        src = pl->tmp;
    }
    if (stored) return model_tp_put_values(pl->whole, pl->part, idx, src);
    cllm_tp_slice(ti, cllm_tp_rule_of(pl->whole, idx), pl->part->tp_size, pl->part->tp_rank, src,
                  pl->part->params + pl->part->tensors[idx].offset);
    return CLLM_OK;
}

static cllm_status load_part(cllm_model **out, const char *dir, int tp, int r, const char *weights, bool huge);

cllm_status cllm_tp_model_load(cllm_model **out, const char *dir, int tp, int r) {
    return load_part(out, dir, tp, r, "fp32", false);
}

cllm_status cllm_tp_model_load_weights(cllm_model **out, const char *dir, int tp, int r, const char *weights) {
    return load_part(out, dir, tp, r, weights, true);
}

static cllm_status load_part(cllm_model **out, const char *dir, int tp, int r, const char *weights, bool huge) {
    *out = NULL;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/config.json", dir);
    if (n < 0 || (size_t)n >= sizeof path) return CLLM_FAIL(CLLM_ERR_ARG, "path too long: %s", dir);
    json_t *config = NULL;
    cllm_status st = cllm_json_load_file(&config, path);
    if (st) return st;
    part_loader pl = {0};
    cllm_model *whole = NULL;
    cllm_st_set *set = NULL;
    cllm_wfmt fmt = CLLM_WFMT_FP32;
    if ((st = model_from_config_ex(&whole, config, path, false)) || (st = cllm_st_set_open(&set, dir)) ||
        (st = model_stored_format(whole, config, set, path, &pl.file_fmt)))
        goto done;
    fmt = pl.file_fmt;
    if (weights && !cllm_wfmt_from_name(weights, &fmt)) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "unknown weight format '%s' (expected fp32, bf16, int8 or q4)", weights);
        goto done;
    }
    if ((st = part_layout(&pl.part, whole, tp, r, fmt != CLLM_WFMT_FP32, huge))) goto done;
    if (fmt != CLLM_WFMT_FP32 &&
        ((st = model_weights_init(pl.part, fmt)) || (st = model_tp_check_blocks(whole, pl.part, fmt))))
        goto done;
    pl.whole = whole;
    st = model_load_tensors(whole, dir, put_slice, &pl);
done:
    cllm_st_set_close(set);
    cllm_free(pl.tmp);
    cllm_model_free(whole);
    json_decref(config);
    if (st) {
        cllm_model_free(pl.part);
        return st;
    }
    *out = pl.part;
    return CLLM_OK;
}

cllm_status cllm_tp_gather_buffer(const cllm_model *full, const cllm_model *part, const cllm_dist_group *g,
                                  const float *part_buf, float *full_buf, float *max_repl_diff) {
    int tp = cllm_dist_group_size(g);
    size_t n = part->n_params;
    float *all = cllm_calloc((size_t)tp * n, sizeof(float), "tensor-parallel gather");
    size_t *counts = calloc((size_t)tp, sizeof *counts);
    cllm_status st = CLLM_OK;
    if (!all || !counts) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < tp; r++) counts[r] = n;
    memcpy(all + (size_t)cllm_dist_group_rank(g) * n, part_buf, n * sizeof(float));
    if ((st = cllm_dist_g_allgather_f32(g, all, counts))) goto done;
    float diff = 0;
    for (int r = tp - 1; r >= 0; r--) /* rank 0's replicated tensors last */
        for (int i = 0; i < full->n_tensors; i++) {
            const cllm_tensor_info *t = &full->tensors[i];
            cllm_tp_rule rule = cllm_tp_rule_of(full, i);
            const float *src = all + (size_t)r * n + part->tensors[i].offset;
            if (rule.cut == CLLM_TP_REPLICATE && r > 0)
                for (size_t k = 0; k < t->numel; k++) {
                    float d = fabsf(src[k] - all[part->tensors[i].offset + k]);
                    if (!(d <= diff)) diff = d; /* NaN counts as a difference */
                }
            cllm_tp_unslice(t, rule, tp, r, src, full_buf + t->offset);
        }
    if (max_repl_diff) *max_repl_diff = diff;
done:
    cllm_free(all);
    free(counts);
    return st;
}

cllm_status cllm_tp_model_gather(cllm_model *full, const cllm_model *part, const cllm_dist_group *g,
                                 float *max_repl_diff) {
    return cllm_tp_gather_buffer(full, part, g, part->params, full->params, max_repl_diff);
}

void cllm_tp_cut_buffer(const cllm_model *full, const cllm_model *part, int tp, int r, const float *full_buf,
                        float *part_buf) {
    for (int i = 0; i < full->n_tensors; i++)
        cllm_tp_slice(&full->tensors[i], cllm_tp_rule_of(full, i), tp, r, full_buf + full->tensors[i].offset,
                      part_buf + part->tensors[i].offset);
}

int model_tp_real_cols(const cllm_model *m) {
    const int V = m->cfg.vocab_size;
    if (m->tp_size <= 1) return V;
    int n = m->tp_vocab - m->tp_rank * V;
    return n < 0 ? 0 : n > V ? V : n;
}

int cllm_model_vocab(const cllm_model *m) { return m->tp_size > 1 ? m->tp_vocab : m->cfg.vocab_size; }
int cllm_model_tensor_size(const cllm_model *m) { return m->tp_size > 1 ? m->tp_size : 1; }
int cllm_model_tensor_rank(const cllm_model *m) { return m->tp_size > 1 ? m->tp_rank : 0; }

cllm_status cllm_model_set_tensor_parallel(cllm_model *m, const cllm_dist_group *g, int rank, int size) {
    if (size < 1 || rank < 0 || rank >= size)
        return CLLM_FAIL(CLLM_ERR_ARG, "tensor rank %d of %d", rank, size);
    if (size > 1 && cllm_dist_group_size(g) != size)
        return CLLM_FAIL(CLLM_ERR_ARG, "tensor group of %d ranks for a model cut %d ways", cllm_dist_group_size(g),
                         size);
    m->tp_grp = g;
    m->tp_rank = rank;
    m->tp_size = size;
    if (!m->tp_vocab) m->tp_vocab = m->cfg.vocab_size * size;
    return m->acts ? model_tp_prepare(m) : CLLM_OK;
}

/* --------------------------------------------------------- passes */

cllm_status model_tp_prepare(cllm_model *m) {
    const cllm_model_config *c = &m->cfg;
    if (m->tp_size <= 1 || !m->acts) return CLLM_OK;
    int rows = model_logit_chunk(c, m->act_B * m->act_T);
    if (rows > m->tp_rows) {
        free(m->tp_max);
        free(m->tp_sum);
        m->tp_max = malloc((size_t)rows * sizeof *m->tp_max);
        m->tp_sum = malloc(2 * (size_t)rows * sizeof *m->tp_sum);
        m->tp_rows = m->tp_max && m->tp_sum ? rows : 0;
        if (!m->tp_rows) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    return c->arch == CLLM_ARCH_BLOOM ? model_tp_alibi(m, m->alibi) : CLLM_OK;
}

cllm_status model_tp_alibi(const cllm_model *m, float *out) {
    int NH = m->cfg.n_head, tp = m->tp_size > 1 ? m->tp_size : 1;
    if (tp == 1) {
        cllm_alibi_slopes(out, NH);
        return CLLM_OK;
    }
    /* the slopes of heads r * NH .. (r + 1) * NH - 1 of the whole model */
    float *all = malloc((size_t)NH * (size_t)tp * sizeof *all);
    if (!all) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_alibi_slopes(all, NH * tp);
    memcpy(out, all + (size_t)m->tp_rank * NH, (size_t)NH * sizeof *all);
    free(all);
    return CLLM_OK;
}

cllm_status model_tp_allreduce(const cllm_model *m, float *buf, size_t n) {
    if (m->tp_size <= 1) return CLLM_OK;
    return cllm_dist_g_allreduce_sum_f32(m->tp_grp, buf, n);
}

cllm_status model_tp_embed_forward(const cllm_model *m, float *out, const int32_t *tokens, int N, int T,
                                   const model_rows *rows) {
    const cllm_model_config *c = &m->cfg;
    const int C = c->n_embd, V = c->vocab_size;
    /* sequence parallelism: the lookup's partial sums are reduce-scattered,
     * out holds this rank's positions */
    const bool sp = !rows && m->acts_sp;
    float *look = sp ? m->sp_full : out;
    if (model_weights_stored(m, m->gslot[G_WTE])) /* a part in bf16 / int8 / q4 */
        model_tp_embed_stored(m, look, tokens, N);
    else
        cllm_embedding_vp_forward(look, tokens, model_param(m, m->gslot[G_WTE]), N, C, m->tp_rank * V, V);
    cllm_status st = sp ? model_sp_scatter(m, out, m->sp_full, N / T, T) : model_tp_allreduce(m, out, (size_t)N * C);
    if (st) return st;
    const float *wpe = model_param(m, m->gslot[G_WPE]);
    const int Nl = sp ? N / m->tp_size : N;
    if (wpe) { /* row n stands at position n % T, or at the cache's position */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < Nl; n++) {
            int pos = sp ? model_sp_pos(m, n, T) : n % (T > 0 ? T : 1);
            if (rows) {
                int i = 0;
                while (n >= rows->rows[i + 1]) i++;
                pos = rows->past[i] + n - rows->rows[i];
            }
            float *o = out + (size_t)n * C;
            const float *p = wpe + (size_t)pos * C;
#pragma omp simd
            for (int k = 0; k < C; k++) o[k] += p[k];
        }
    }
    return CLLM_OK;
}

void model_tp_embed_backward(cllm_model *m, float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int N,
                             int T) {
    const int C = m->cfg.n_embd, V = m->cfg.vocab_size;
    cllm_embedding_vp_backward(dwte, dout, tokens, N, C, m->tp_rank * V, V);
    if (!dwpe) return;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *p = dwpe + (size_t)t * C;
        for (int n = t; n < N; n += T) {
            const float *d = dout + (size_t)n * C;
#pragma omp simd
            for (int k = 0; k < C; k++) p[k] += d[k];
        }
    }
}

void model_tp_add_bias(float *out, const float *bias, int N, int C) {
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
#pragma omp simd
        for (int k = 0; k < C; k++) o[k] += bias[k];
    }
}

cllm_status model_tp_reduce_bias(const cllm_model *m, float *out, const float *bias, int N, int C) {
    cllm_status st = model_tp_allreduce(m, out, (size_t)N * C);
    if (!st) model_tp_add_bias(out, bias, N, C);
    return st;
}

cllm_status model_tp_xent(cllm_model *m, float *losses, float *logits, const int32_t *targets, int rows, bool backward,
                          float dscale, long *counted) {
    const int V = m->cfg.vocab_size, v0 = m->tp_rank * V;
    if (rows > m->tp_rows) return CLLM_FAIL(CLLM_ERR_INTERNAL, "%d logit rows, statistics for %d", rows, m->tp_rows);
    /* padded vocabulary columns (ids past the whole vocabulary) take no
     * probability: -inf before the statistics, zero gradient after */
    const int pad0 = model_tp_real_cols(m);
    if (pad0 < V)
        for (int i = 0; i < rows; i++)
            for (int v = pad0; v < V; v++) logits[(size_t)i * V + v] = -INFINITY;
    cllm_xent_vp_max(m->tp_max, logits, rows, V);
    cllm_status st = cllm_dist_g_allreduce_max_f32(m->tp_grp, m->tp_max, (size_t)rows);
    if (st) return st;
    cllm_xent_vp_sum(m->tp_sum, logits, targets, m->tp_max, rows, V, v0, backward);
    if ((st = cllm_dist_g_allreduce_sum_f64(m->tp_grp, m->tp_sum, 2 * (size_t)rows))) return st;
    *counted = cllm_xent_vp_finish(losses, backward ? logits : NULL, targets, m->tp_max, m->tp_sum, rows, V, v0, dscale);
    if (backward && pad0 < V)
        for (int i = 0; i < rows; i++) memset(logits + (size_t)i * V + pad0, 0, (size_t)(V - pad0) * sizeof(float));
    return CLLM_OK;
}
