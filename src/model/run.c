/*
 * Forward and backward passes of the three families over the flat buffers.
 *
 * One block, with N = B*T rows, C channels, F FFN width:
 *   gpt2:  h = x + proj(attn(LN1(x)));        y = h + down(gelu(fc(LN2(h))))
 *   bloom: same, with ALiBi instead of positions and a LayerNorm after the
 *          word embeddings
 *   llama: h = x + o(attn(rope(q), rope(k), v)(RMS1(x)));
 *          y = h + down(silu(gate(RMS2(h))) * up(RMS2(h)))
 * The head and the cross-entropy are fused and processed in row chunks: the
 * logits of a chunk are computed, turned into their gradient in place, and
 * pushed back through the head before the next chunk, so the full [N,V]
 * logits never exist. Backward mirrors forward, accumulating parameter
 * gradients (the kernels add into them) and reusing a few scratch buffers.
 * With activation checkpointing (cllm_model_set_recompute) the blocks share
 * one set of saved activations and the backward pass refills it from each
 * block's saved input just before that block's backward.
 * Under sequence parallelism (seqpar.c) the norms, residual adds, embedding
 * output and final norm run on this tensor rank's positions only, with an
 * all-gather before each column-parallel linear and a reduce-scatter after
 * each row-parallel one.
 * Optional hooks (cllm_model_hooks) run around each parameter group's use:
 * ZeRO-3 gathers a group's parameters into a working buffer and the
 * per-layer gradient reduction takes a block's gradient when it is done.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cllm/kernels.h"
#include "cllm/quant.h"
#include "model_impl.h"

#define TRY(x)                         \
    do {                               \
        cllm_status st_ = (x);         \
        if (st_ != CLLM_OK) return st_; \
    } while (0)

/* Strided views of q, k, v inside a block's QKV activation (or gradient). */
typedef struct {
    cllm_view q, k, v;
} qkv_views;

static qkv_views make_views(const cllm_model_config *c, float *qkv, size_t N) {
    qkv_views r;
    int HS = c->head_dim;
    int Q = c->n_head * HS, K = c->n_kv_head * HS; /* gpt2, bloom: Q = K = C (C/tp on a tensor rank) */
    switch (c->arch) {
    case CLLM_ARCH_GPT2: /* [N, Q|K|V] column blocks */
        r.q = (cllm_view){qkv, 3 * Q, HS};
        r.k = (cllm_view){qkv + Q, 3 * Q, HS};
        r.v = (cllm_view){qkv + 2 * Q, 3 * Q, HS};
        break;
    case CLLM_ARCH_BLOOM: /* [N, NH, 3, HS] */
        r.q = (cllm_view){qkv, 3 * Q, 3 * HS};
        r.k = (cllm_view){qkv + HS, 3 * Q, 3 * HS};
        r.v = (cllm_view){qkv + 2 * HS, 3 * Q, 3 * HS};
        break;
    default: /* llama: three contiguous regions [N,Q], [N,K], [N,K] */
        r.q = (cllm_view){qkv, Q, HS};
        r.k = (cllm_view){qkv + N * (size_t)Q, K, HS};
        r.v = (cllm_view){qkv + N * (size_t)(Q + K), K, HS};
        break;
    }
    return r;
}

static cllm_cview cv(cllm_view v) { return (cllm_cview){v.p, v.rs, v.hs}; }

void model_norm_forward(const cllm_model *m, float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N) {
    const cllm_model_config *c = &m->cfg;
    MODEL_PROF(m, CLLM_PROF_NORM, if (c->arch == CLLM_ARCH_LLAMA)
        cllm_rmsnorm_forward(out, rstd, inp, w, N, c->n_embd, c->norm_eps);
    else
        cllm_layernorm_forward(out, mean, rstd, inp, w, b, N, c->n_embd, c->norm_eps));
}

static void norm_backward(const cllm_model *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N) {
    const cllm_model_config *c = &m->cfg;
    MODEL_PROF(m, CLLM_PROF_NORM, if (c->arch == CLLM_ARCH_LLAMA)
        cllm_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, c->n_embd);
    else
        cllm_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, c->n_embd));
}

/* A norm's backward over this rank's rows. Under sequence parallelism they
 * are T / tp positions of each sequence: the weight and bias gradients of
 * those rows go through sp_dnorm and are summed over the tensor group before
 * they are added (the replicated norm parameters see every position). */
static cllm_status norm_backward_sp(const cllm_model *m, float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *w, const float *mean, const float *rstd, int N) {
    if (!m->acts_sp) {
        norm_backward(m, dinp, dw, db, dout, inp, w, mean, rstd, N);
        return CLLM_OK;
    }
    const int C = m->cfg.n_embd;
    float *sw = m->sp_dnorm, *sb = db ? m->sp_dnorm + C : NULL;
    memset(sw, 0, 2 * (size_t)C * sizeof(float));
    norm_backward(m, dinp, sw, sb, dout, inp, w, mean, rstd, N);
    TRY(model_tp_allreduce(m, sw, 2 * (size_t)C));
    if (dw) cllm_add(dw, dw, sw, C);
    if (db) cllm_add(db, db, sb, C);
    return CLLM_OK;
}

/* The input of the column-parallel linears after a norm: its output ln, or
 * under sequence parallelism (sp) that output gathered along the sequence
 * into sp_full. */
static cllm_status linear_input(const cllm_model *m, const float *ln, int B, int T, bool sp, const float **in) {
    *in = sp ? m->sp_full : ln;
    return sp ? model_sp_gather(m, m->sp_full, ln, B, T) : CLLM_OK;
}

/* A row-parallel linear's partial sums summed over the tensor group into
 * out[N,C] plus the bias once: all-reduced in out (N rows: B x T, or a
 * cached pass's), or under sequence parallelism reduce-scattered from
 * sp_full into out's local rows. Without tensor parallelism out already
 * holds the sum and its bias. */
static cllm_status row_parallel_sum(const cllm_model *m, float *out, const float *bias, int B, int T, int N, bool sp) {
    const int C = m->cfg.n_embd;
    if (sp) {
        TRY(model_sp_scatter(m, out, m->sp_full, B, T));
        model_tp_add_bias(out, bias, model_sp_rows(m, B, T), C);
        return CLLM_OK;
    }
    return m->tp_size > 1 ? model_tp_reduce_bias(m, out, bias, N, C) : CLLM_OK;
}

/* The embeddings of N rows into x0[N,C] (BLOOM: through emb[N,C] and its
 * LayerNorm, statistics in emb_mean/emb_rstd). Positions: B x T from 0, or
 * the cache's ragged rows (GPT-2 reads wpe at each row's position). */
cllm_status model_embed_forward(const cllm_model *m, float *x0, float *emb, float *emb_mean, float *emb_rstd,
                                const int32_t *tokens, int B, int T, const model_rows *rows) {
    const cllm_model_config *c = &m->cfg;
    const int C = c->n_embd, N = rows ? rows->rows[rows->n_seq] : B * T;
    const int Nl = rows ? N : model_sp_rows(m, B, T); /* sequence parallelism: this rank's positions */
    float *e = c->arch == CLLM_ARCH_BLOOM ? emb : x0;
    const float *wte = model_param(m, m->gslot[G_WTE]);
    const float *wpe = c->arch == CLLM_ARCH_GPT2 ? model_param(m, m->gslot[G_WPE]) : NULL;
    if (m->tp_size > 1) { /* vocabulary-parallel lookup, summed over the tensor group */
        TRY(model_tp_embed_forward(m, e, tokens, N, T, rows));
    } else if (!rows) {
        if (model_weights_stored(m, m->gslot[G_WTE]))
            model_weights_embed(m, e, tokens, wpe, N, T);
        else
            cllm_embedding_forward(e, tokens, wte, wpe, N, T, C);
    } else { /* sequence i's rows start at position past[i]: wpe rows from there */
        for (int i = 0; i < rows->n_seq; i++) {
            int r0 = rows->rows[i], n = rows->rows[i + 1] - r0;
            const float *p = wpe ? wpe + (size_t)rows->past[i] * C : NULL;
            if (n > 0 && model_weights_stored(m, m->gslot[G_WTE]))
                model_weights_embed(m, e + (size_t)r0 * C, tokens + r0, p, n, n);
            else if (n > 0)
                cllm_embedding_forward(e + (size_t)r0 * C, tokens + r0, wte, p, n, n, C);
        }
    }
    if (c->arch == CLLM_ARCH_BLOOM)
        cllm_layernorm_forward(x0, emb_mean, emb_rstd, emb, model_param(m, m->gslot[G_EMB_LN_W]),
                               model_param(m, m->gslot[G_EMB_LN_B]), Nl, C, c->norm_eps);
    return CLLM_OK;
}

static cllm_status embed_forward(cllm_model *m, const int32_t *tokens, int B, int T) {
    MODEL_PROF(m, CLLM_PROF_EMBED,
               TRY(model_embed_forward(m, m->layers[0].x, m->emb, m->emb_mean, m->emb_rstd, tokens, B, T, NULL)));
    return CLLM_OK;
}

/* Rotates the q or k view by each row's position: B x T rows from 0 with
 * the model's tables, or the cache's ragged rows with the cache's. */
static void rope_rows(const cllm_model *m, cllm_view x, int nh, int B, int T, const model_rows *rows, int sign) {
    const int HS = m->cfg.head_dim;
    if (!rows) {
        cllm_rope_apply(x.p, m->rope_cos, m->rope_sin, B, T, nh, HS, x.rs, x.hs, sign);
        return;
    }
    /* rope_apply takes row t's angles from row t of the table it is given:
     * starting the tables at row past rotates row t by position past + t */
    for (int i = 0; i < rows->n_seq; i++) {
        int r0 = rows->rows[i], n = rows->rows[i + 1] - r0;
        size_t off = (size_t)rows->past[i] * (HS / 2);
        if (n > 0)
            cllm_rope_apply(x.p + (size_t)r0 * x.rs, rows->rope_cos + off, rows->rope_sin + off, 1, n, nh, HS, x.rs,
                            x.hs, sign);
    }
}

/* Row r (of sequence i) of append_rows. */
static void cache_append_row(const model_rows *rows, size_t off, int i, int r, cllm_view k, cllm_view v, int NKV,
                             int HS) {
    const int BS = rows->block_size, pos = rows->past[i] + (r - rows->rows[i]);
    const size_t blk = (size_t)rows->table[(size_t)i * rows->max_blocks + pos / BS];
    for (int g = 0; g < NKV; g++) {
        size_t dst = off + ((blk * NKV + g) * BS + (size_t)(pos % BS)) * HS;
        const float *ks = k.p + (size_t)r * k.rs + (size_t)g * k.hs, *vs = v.p + (size_t)r * v.rs + (size_t)g * v.hs;
        if (rows->kv_bf16) {
            cllm_to_bf16((uint16_t *)rows->k + dst, ks, HS);
            cllm_to_bf16((uint16_t *)rows->v + dst, vs, HS);
        } else {
            memcpy((float *)rows->k + dst, ks, (size_t)HS * sizeof(float));
            memcpy((float *)rows->v + dst, vs, (size_t)HS * sizeof(float));
        }
    }
}

/* Writes the new rows' keys and values of layer l into the cache blocks
 * at their positions (a bf16 cache: rounded to nearest even); a prompt's
 * rows on OpenMP threads, a decode step's on the caller. */
static void cache_append(const model_rows *rows, int l, cllm_view k, cllm_view v, int NKV, int HS) {
    const size_t off = (size_t)l * rows->layer_stride;
    const int N = rows->n_seq > 0 ? rows->rows[rows->n_seq] : 0;
    if ((long)N * NKV * HS < 32768L) { /* CLLM_PAR_MIN of the kernels */
        for (int i = 0; i < rows->n_seq; i++)
            for (int r = rows->rows[i]; r < rows->rows[i + 1]; r++) cache_append_row(rows, off, i, r, k, v, NKV, HS);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        int i = 0; /* the sequence of row r */
        while (rows->rows[i + 1] <= r) i++;
        cache_append_row(rows, off, i, r, k, v, NKV, HS);
    }
}

/* The FFN activation of N rows of F values: GELU of fc, or LLaMA's SwiGLU
 * of fc and up. A decode step (N <= WEIGHTS_SMALL_ROWS: its matmuls run on
 * cllm_qmatmul's pool) runs it on that pool in chunks of whole groups of 64
 * values, each an ordinary call below the kernels' OpenMP threshold, so no
 * OpenMP team wakes between the step's matmuls; the values do not depend
 * on the chunks (each is elementwise, every chunk starts 64 values apart
 * from the buffer's start). Longer calls use the kernels' own threads. */
typedef struct {
    float *out;
    const float *fc, *up;
    long n, per;
} act_job;

static void act_chunk(void *ctx, int c) {
    const act_job *j = ctx;
    const long i0 = (long)c * j->per, n = j->n - i0 < j->per ? j->n - i0 : j->per;
    if (j->up) cllm_swiglu_forward(j->out + i0, j->fc + i0, j->up + i0, n);
    else cllm_gelu_forward(j->out + i0, j->fc + i0, n);
}

static void ffn_act(float *out, const float *fc, const float *up, int N, int F) {
    act_job j = {.out = out, .fc = fc, .up = up, .n = (long)N * F};
    const int nt = cllm_quant_threads();
    if (N > WEIGHTS_SMALL_ROWS || nt <= 1 || j.n < 8192) {
        j.per = j.n;
        act_chunk(&j, 0);
        return;
    }
    j.per = (j.n + 4L * nt - 1) / (4L * nt);
    j.per = j.per < 4096 ? 4096 : j.per > 16384 ? 16384 : (j.per + 63) / 64 * 64;
    cllm_quant_parallel(act_chunk, &j, (int)((j.n + j.per - 1) / j.per));
}

/* One block over N rows: a->x in, y out; every intermediate lands in a's
 * buffers (saved for backward in training, scratch in a cached pass).
 * Without `rows` the rows are B x T from position 0 and attention is the
 * causal self-attention of each sequence (lse saved for backward); with
 * `rows` they are the cache's ragged new rows, whose keys and values are
 * appended to the cache before they attend to it. With `recompute`,
 * refills the activations from a->x and stops before the down projection:
 * the block output (the next block's input) is kept from the forward pass.
 * y may be a->x (a cached pass updates the residual stream in place). */
cllm_status model_block_forward(const cllm_model *m, model_lp_scratch *lp, int l, const layer_acts *a, float *y,
                                int B, int T, const model_rows *rows, bool recompute) {
    const cllm_model_config *c = &m->cfg;
    const int *s = m->lslot[l];
    int N = rows ? rows->rows[rows->n_seq] : B * T, C = c->n_embd, F = c->n_inner, HS = c->head_dim;
    int Q = c->n_head * HS, K = c->n_kv_head * HS;
    bool in_out = c->arch == CLLM_ARCH_GPT2 && !m->conv_rows; /* Conv1D weights in the file layout */
    float *P[L_NSLOTS];
    for (int i = 0; i < L_NSLOTS; i++) P[i] = model_param(m, s[i]);

    /* sequence parallelism: the norms and residual adds over this rank's Nl
     * rows, each norm's output gathered (into sp_full) for the
     * column-parallel linears, each row-parallel output reduce-scattered */
    const bool sp = !rows && m->acts_sp;
    const int Nl = sp ? model_sp_rows(m, B, T) : N;
    model_norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, a->x, P[L_LN1_W], P[L_LN1_B], Nl);
    const float *in;
    TRY(linear_input(m, a->ln1, B, T, sp, &in));
    qkv_views v = make_views(c, a->qkv, (size_t)N);
    if (c->arch == CLLM_ARCH_LLAMA) {
        MODEL_PROF(m, CLLM_PROF_GEMM_FWD, TRY(model_linear_forward(m, lp, v.q.p, in, s[L_Q_W], P[L_Q_B], N, C, Q, false));
                   TRY(model_linear_forward(m, lp, v.k.p, in, s[L_K_W], P[L_K_B], N, C, K, false));
                   TRY(model_linear_forward(m, lp, v.v.p, in, s[L_V_W], P[L_V_B], N, C, K, false)));
        MODEL_PROF(m, CLLM_PROF_ROPE, rope_rows(m, v.q, c->n_head, B, T, rows, 1);
                   rope_rows(m, v.k, c->n_kv_head, B, T, rows, 1));
    } else {
        MODEL_PROF(m, CLLM_PROF_GEMM_FWD,
                   TRY(model_linear_forward(m, lp, a->qkv, in, s[L_QKV_W], P[L_QKV_B], N, C, 3 * Q, in_out)));
    }
    const float scale = 1.0f / sqrtf((float)HS);
    if (!rows) {
        const float *alibi = c->arch == CLLM_ARCH_BLOOM ? m->alibi : NULL;
        MODEL_PROF(m, CLLM_PROF_ATTN_FWD,
                   cllm_attention_forward_window((cllm_view){a->atty, Q, HS}, a->lse, cv(v.q), cv(v.k), cv(v.v), alibi,
                                                 B, T, c->n_head, c->n_kv_head, HS, scale, c->sliding_window));
    } else {
        cache_append(rows, l, v.k, v.v, c->n_kv_head, HS);
        const size_t off = (size_t)l * rows->layer_stride;
        const float *alibi = c->arch == CLLM_ARCH_BLOOM ? rows->alibi : NULL;
        if (rows->kv_bf16)
            cllm_attention_forward_paged_bf16((cllm_view){a->atty, Q, HS}, cv(v.q), (const uint16_t *)rows->k + off,
                                              (const uint16_t *)rows->v + off, rows->table, rows->max_blocks,
                                              rows->block_size, rows->rows, rows->past, alibi, rows->n_seq, c->n_head,
                                              c->n_kv_head, HS, scale, c->sliding_window);
        else
            cllm_attention_forward_paged_window((cllm_view){a->atty, Q, HS}, cv(v.q), (const float *)rows->k + off,
                                                (const float *)rows->v + off, rows->table, rows->max_blocks,
                                                rows->block_size, rows->rows, rows->past, alibi, rows->n_seq,
                                                c->n_head, c->n_kv_head, HS, scale, c->sliding_window);
    }
    /* row-parallel under tensor parallelism: partial sums, reduced, then the bias once */
    const bool tp = m->tp_size > 1;
    MODEL_PROF(m, CLLM_PROF_GEMM_FWD, TRY(model_linear_forward(m, lp, sp ? m->sp_full : a->x1, a->atty, s[L_O_W],
                                                               tp ? NULL : P[L_O_B], N, Q, C, in_out)));
    TRY(row_parallel_sum(m, a->x1, P[L_O_B], B, T, N, sp));
    MODEL_PROF(m, CLLM_PROF_RESIDUAL, cllm_add(a->x1, a->x1, a->x, (long)Nl * C));

    model_norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->x1, P[L_LN2_W], P[L_LN2_B], Nl);
    TRY(linear_input(m, a->ln2, B, T, sp, &in));
    if (c->n_experts) { /* Mixtral: the sparse FFN (moe.c); recomputation refills its state */
        TRY(model_moe_forward(m, lp, l, a, recompute ? NULL : y, N, !rows && !recompute));
        if (!recompute) cllm_add(y, y, a->x1, (long)N * C);
        return CLLM_OK;
    }
    MODEL_PROF(m, CLLM_PROF_GEMM_FWD, TRY(model_linear_forward(m, lp, a->fc, in, s[L_FC_W], P[L_FC_B], N, C, F, in_out)));
    if (c->arch == CLLM_ARCH_LLAMA) {
        MODEL_PROF(m, CLLM_PROF_GEMM_FWD,
                   TRY(model_linear_forward(m, lp, a->up, in, s[L_UP_W], P[L_UP_B], N, C, F, false)));
        MODEL_PROF(m, CLLM_PROF_ACT, ffn_act(a->act, a->fc, a->up, N, F));
    } else {
        MODEL_PROF(m, CLLM_PROF_ACT, ffn_act(a->act, a->fc, NULL, N, F));
    }
    if (recompute) return CLLM_OK;
    MODEL_PROF(m, CLLM_PROF_GEMM_FWD, TRY(model_linear_forward(m, lp, sp ? m->sp_full : y, a->act, s[L_DOWN_W],
                                                               tp ? NULL : P[L_DOWN_B], N, F, C, in_out)));
    TRY(row_parallel_sum(m, y, P[L_DOWN_B], B, T, N, sp));
    MODEL_PROF(m, CLLM_PROF_RESIDUAL, cllm_add(y, y, a->x1, (long)Nl * C));
    return CLLM_OK;
}

/* Block l of the training pass: its saved activations and output slot. */
static cllm_status block_forward(cllm_model *m, int l, int B, int T, bool recompute) {
    float *y = l + 1 < m->cfg.n_layer ? m->layers[l + 1].x : m->x_out;
    return model_block_forward(m, &m->lp_run, l, &m->layers[l], y, B, T, NULL, recompute);
}

/* dx holds dL/d(block output) on entry and dL/d(block input) on return.
 * aux_scale: d(loss_sum)/d(load-balancing loss) of a Mixtral (0: none). */
static cllm_status block_backward(cllm_model *m, int l, int B, int T, double aux_scale) {
    const cllm_model_config *c = &m->cfg;
    const int *s = m->lslot[l];
    layer_acts *a = &m->layers[l];
    model_lp_scratch *lp = &m->lp_run;
    int N = B * T, C = c->n_embd, F = c->n_inner, HS = c->head_dim;
    int Q = c->n_head * HS, K = c->n_kv_head * HS;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    bool in_out = c->arch == CLLM_ARCH_GPT2 && !m->conv_rows;
    float *P[L_NSLOTS], *G[L_NSLOTS];
    for (int i = 0; i < L_NSLOTS; i++) {
        P[i] = model_param(m, s[i]);
        G[i] = model_grad(m, s[i]);
    }
    /* sequence parallelism: dx holds this rank's Nl rows; the gradient of a
     * row-parallel output is gathered (into dln) before its backward, a
     * norm's output gathered again (sp_full) for the column-parallel weight
     * gradients, and their input gradient reduce-scattered (into sp_loc) */
    const bool sp = m->acts_sp;
    const int Nl = model_sp_rows(m, B, T);
    const float *dy = m->dx, *in;
    const float *dl = m->dln;
    if (sp) TRY(model_sp_gather(m, m->dln, m->dx, B, T));
    if (sp) dy = m->dln;

    /* MLP: y = h + down(act(fc(LN2(h)))) */
    if (c->n_experts) {
        memset(m->dln, 0, NC * sizeof(float));
        TRY(model_moe_backward(m, l, a, m->dln, m->dx, N, aux_scale));
    } else {
        MODEL_PROF(m, CLLM_PROF_ZERO, memset(m->dact, 0, NF * sizeof(float)));
        MODEL_PROF(m, CLLM_PROF_GEMM_BWD, TRY(model_linear_backward(m, lp, m->dact, G[L_DOWN_W], G[L_DOWN_B], dy,
                                                                    a->act, P[L_DOWN_W], N, F, C, in_out)));
        MODEL_PROF(m, CLLM_PROF_ZERO, memset(m->dfc, 0, NF * sizeof(float)); memset(m->dln, 0, NC * sizeof(float)));
        TRY(linear_input(m, a->ln2, B, T, sp, &in));
        if (c->arch == CLLM_ARCH_LLAMA) {
            MODEL_PROF(m, CLLM_PROF_ZERO, memset(m->dup, 0, NF * sizeof(float)));
            MODEL_PROF(m, CLLM_PROF_ACT, cllm_swiglu_backward(m->dfc, m->dup, m->dact, a->fc, a->up, (long)NF));
            MODEL_PROF(m, CLLM_PROF_GEMM_BWD, TRY(model_linear_backward(m, lp, m->dln, G[L_UP_W], G[L_UP_B], m->dup,
                                                                        in, P[L_UP_W], N, C, F, false)));
        } else {
            MODEL_PROF(m, CLLM_PROF_ACT, cllm_gelu_backward(m->dfc, m->dact, a->fc, (long)NF));
        }
        MODEL_PROF(m, CLLM_PROF_GEMM_BWD, TRY(model_linear_backward(m, lp, m->dln, G[L_FC_W], G[L_FC_B], m->dfc, in,
                                                                    P[L_FC_W], N, C, F, in_out)));
    }
    /* column-parallel input gradient: summed over the tensor group */
    if (sp) TRY(model_sp_scatter(m, m->sp_loc, m->dln, B, T));
    else TRY(model_tp_allreduce(m, m->dln, NC));
    if (sp) dl = m->sp_loc;
    TRY(norm_backward_sp(m, m->dx, G[L_LN2_W], G[L_LN2_B], dl, a->x1, P[L_LN2_W], a->ln2_mean, a->ln2_rstd, Nl));

    /* attention: h = x + o(attn(qkv(LN1(x)))) */
    if (sp) TRY(model_sp_gather(m, m->dln, m->dx, B, T));
    MODEL_PROF(m, CLLM_PROF_ZERO, memset(m->datty, 0, (size_t)N * Q * sizeof(float)));
    MODEL_PROF(m, CLLM_PROF_GEMM_BWD, TRY(model_linear_backward(m, lp, m->datty, G[L_O_W], G[L_O_B], dy, a->atty,
                                                                P[L_O_W], N, Q, C, in_out)));
    MODEL_PROF(m, CLLM_PROF_ZERO, memset(m->dqkv, 0, (size_t)N * model_qkv_width(c) * sizeof(float)));
    qkv_views v = make_views(c, a->qkv, (size_t)N), dv = make_views(c, m->dqkv, (size_t)N);
    const float *alibi = c->arch == CLLM_ARCH_BLOOM ? m->alibi : NULL;
    MODEL_PROF(m, CLLM_PROF_ATTN_BWD,
               cllm_attention_backward_window(dv.q, dv.k, dv.v, (cllm_cview){m->datty, Q, HS},
                                              (cllm_cview){a->atty, Q, HS}, a->lse, cv(v.q), cv(v.k), cv(v.v), alibi,
                                              B, T, c->n_head, c->n_kv_head, HS, 1.0f / sqrtf((float)HS),
                                              c->sliding_window));
    MODEL_PROF(m, CLLM_PROF_ZERO, memset(m->dln, 0, NC * sizeof(float)));
    TRY(linear_input(m, a->ln1, B, T, sp, &in));
    if (c->arch == CLLM_ARCH_LLAMA) {
        /* undo the rotation: the gradient of a rotation is its inverse */
        MODEL_PROF(m, CLLM_PROF_ROPE, cllm_rope_apply(dv.q.p, m->rope_cos, m->rope_sin, B, T, c->n_head, HS, Q, HS, -1);
                   cllm_rope_apply(dv.k.p, m->rope_cos, m->rope_sin, B, T, c->n_kv_head, HS, K, HS, -1));
        MODEL_PROF(m, CLLM_PROF_GEMM_BWD,
                   TRY(model_linear_backward(m, lp, m->dln, G[L_Q_W], G[L_Q_B], dv.q.p, in, P[L_Q_W], N, C, Q, false));
                   TRY(model_linear_backward(m, lp, m->dln, G[L_K_W], G[L_K_B], dv.k.p, in, P[L_K_W], N, C, K, false));
                   TRY(model_linear_backward(m, lp, m->dln, G[L_V_W], G[L_V_B], dv.v.p, in, P[L_V_W], N, C, K, false)));
    } else {
        MODEL_PROF(m, CLLM_PROF_GEMM_BWD, TRY(model_linear_backward(m, lp, m->dln, G[L_QKV_W], G[L_QKV_B], m->dqkv, in,
                                                                    P[L_QKV_W], N, C, 3 * Q, in_out)));
    }
    if (sp) TRY(model_sp_scatter(m, m->sp_loc, m->dln, B, T));
    else TRY(model_tp_allreduce(m, m->dln, NC));
    return norm_backward_sp(m, m->dx, G[L_LN1_W], G[L_LN1_B], dl, a->x, P[L_LN1_W], a->ln1_mean, a->ln1_rstd, Nl);
}

/* Under sequence parallelism dx (and BLOOM's embedding norm) hold this
 * rank's positions: the lookup's gradient is gathered first. */
static cllm_status embed_backward(cllm_model *m, const int32_t *tokens, int B, int T) {
    const cllm_model_config *c = &m->cfg;
    int N = B * T, C = c->n_embd, Nl = model_sp_rows(m, B, T);
    float *dwte = model_grad(m, m->gslot[G_WTE]);
    float *dwpe = model_grad(m, m->gslot[G_WPE]);
    const float *dout = m->dx;
    float *dlw = model_grad(m, m->gslot[G_EMB_LN_W]), *dlb = model_grad(m, m->gslot[G_EMB_LN_B]);
    if (!dwte && !dwpe && !dlw && !dlb) return CLLM_OK; /* frozen embeddings: nothing to accumulate */
    if (c->arch == CLLM_ARCH_BLOOM) {
        memset(m->dln, 0, (size_t)N * C * sizeof(float));
        TRY(norm_backward_sp(m, dwte ? m->dln : NULL, dlw, dlb, m->dx, m->emb, model_param(m, m->gslot[G_EMB_LN_W]),
                             m->emb_mean, m->emb_rstd, Nl));
        dout = m->dln;
    }
    if (!dwte && !dwpe) return CLLM_OK;
    if (m->acts_sp) {
        TRY(model_sp_gather(m, m->sp_full, dout, B, T));
        dout = m->sp_full;
    }
    MODEL_PROF(m, CLLM_PROF_EMBED, if (m->tp_size > 1)
        model_tp_embed_backward(m, dwte, dwpe, dout, tokens, N, T);
    else
        cllm_embedding_backward(dwte, dwpe, dout, tokens, N, T, C, c->vocab_size));
    return CLLM_OK;
}

/* x[r, :] *= scale[r] for a [rows, V] chunk. */
static void scale_rows(float *x, const float *scale, int rows, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * V;
        const float s = scale[r];
#pragma omp simd
        for (int v = 0; v < V; v++) row[v] *= s;
    }
}

static int head_slot(const cllm_model *m) { return m->gslot[G_HEAD] >= 0 ? m->gslot[G_HEAD] : m->gslot[G_WTE]; }

/* The layer hooks (cllm_model_hooks): no-ops without them. Group 0 is the
 * embeddings, 1 + l block l, n_layer + 1 the final norm and untied head. */
static cllm_status fetch(cllm_model *m, int g, int next) {
    if (!m->hooks.fetch_params) return CLLM_OK;
    float *p = NULL;
    TRY(m->hooks.fetch_params(m->hooks.ctx, g, next, &p));
    m->groups[g].p = p;
    if (m->prec != CLLM_PREC_FP32 && m->hooks.fetch_params_lp) {
        const void *lp = NULL;
        TRY(m->hooks.fetch_params_lp(m->hooks.ctx, g, &lp));
        m->groups[g].lp = lp;
    }
    return CLLM_OK;
}
static cllm_status release(cllm_model *m, int g) {
    if (!m->hooks.fetch_params) return CLLM_OK;
    m->groups[g].p = NULL;
    m->groups[g].lp = NULL;
    return m->hooks.release_params ? m->hooks.release_params(m->hooks.ctx, g) : CLLM_OK;
}
static cllm_status fetch_grads(cllm_model *m, int g) {
    if (!m->hooks.fetch_grads) return CLLM_OK;
    float *p = NULL;
    TRY(m->hooks.fetch_grads(m->hooks.ctx, g, &p));
    m->groups[g].g = p;
    return CLLM_OK;
}
static cllm_status grads_ready(cllm_model *m, int g) {
    if (m->hooks.fetch_grads) m->groups[g].g = NULL;
    return m->hooks.grads_ready ? m->hooks.grads_ready(m->hooks.ctx, g) : CLLM_OK;
}

/* Embeddings and blocks, group by group; leaves the last block's output in
 * x_out. */
static cllm_status forward_blocks(cllm_model *m, const int32_t *tokens, int B, int T) {
    int L = m->cfg.n_layer;
    model_moe_begin(m);
    TRY(fetch(m, 0, 1));
    TRY(embed_forward(m, tokens, B, T));
    TRY(release(m, 0));
    for (int l = 0; l < L; l++) {
        TRY(fetch(m, l + 1, l + 2));
        TRY(block_forward(m, l, B, T, false));
        TRY(release(m, l + 1));
    }
    return CLLM_OK;
}

/* Final norm, fused head + cross-entropy chunk by chunk, and (backward) the
 * head's input gradient in m->dlnf. Under tensor parallelism the logits of a
 * chunk are this rank's vocabulary columns, the softmax statistics come from
 * the tensor group, and dlnf is summed over it. */
/* The final norm of B x T rows into m->lnf; under sequence parallelism
 * over this rank's positions (into sp_loc), then gathered into lnf whole. */
static cllm_status final_norm(cllm_model *m, int B, int T) {
    const float *w = model_param(m, m->gslot[G_LNF_W]), *b = model_param(m, m->gslot[G_LNF_B]);
    if (!m->acts_sp) {
        model_norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_out, w, b, B * T);
        return CLLM_OK;
    }
    model_norm_forward(m, m->sp_loc, m->lnf_mean, m->lnf_rstd, m->x_out, w, b, model_sp_rows(m, B, T));
    return model_sp_gather(m, m->lnf, m->sp_loc, B, T);
}

/* The final norm's backward from dlnf (sp_loc under sequence parallelism)
 * into dx, which it sets. */
static cllm_status final_norm_backward(cllm_model *m, int B, int T) {
    const int Nl = model_sp_rows(m, B, T);
    memset(m->dx, 0, (size_t)Nl * m->cfg.n_embd * sizeof(float));
    return norm_backward_sp(m, m->dx, model_grad(m, m->gslot[G_LNF_W]), model_grad(m, m->gslot[G_LNF_B]),
                            m->acts_sp ? m->sp_loc : m->dlnf, m->x_out, model_param(m, m->gslot[G_LNF_W]),
                            m->lnf_mean, m->lnf_rstd, Nl);
}

static cllm_status head_run(cllm_model *m, const int32_t *targets, int B, int T, bool backward, float grad_scale,
                            const float *tscale, double *loss_sum, long *n_counted) {
    const cllm_model_config *c = &m->cfg;
    int C = c->n_embd, V = c->vocab_size;
    const bool tp = m->tp_size > 1;
    const int N = B * T;
    TRY(final_norm(m, B, T));
    int hs = head_slot(m);
    const float *W = model_param(m, hs);
    float *dW = backward ? model_grad(m, hs) : NULL;
    int chunk = model_logit_chunk(c, N);
    if (backward) memset(m->dlnf, 0, (size_t)N * C * sizeof(float));
    double total = 0;
    long count = 0;
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int rows = N - r0 < chunk ? N - r0 : chunk;
        const float *h = m->lnf + (size_t)r0 * C;
        MODEL_PROF(m, CLLM_PROF_HEAD_GEMM,
                   TRY(model_linear_forward(m, &m->lp_run, m->logits, h, hs, NULL, rows, C, V, false)));
        long k = 0;
        /* per-token scales: the unit gradient of each row's loss, then each
         * row times its own scale */
        float ds = tscale ? 1.0f : grad_scale;
        MODEL_PROF(m, CLLM_PROF_XENT, if (tp)
            TRY(model_tp_xent(m, m->losses + r0, m->logits, targets + r0, rows, backward, ds, &k));
        else if (backward)
            k = cllm_xent_forward_backward(m->losses + r0, m->logits, targets + r0, rows, V, ds);
        else
            k = cllm_xent_forward(m->losses + r0, m->logits, targets + r0, rows, V);
        if (backward && tscale && k) scale_rows(m->logits, tscale + r0, rows, V));
        if (backward && k)
            MODEL_PROF(m, CLLM_PROF_HEAD_GEMM, TRY(model_linear_backward(m, &m->lp_run, m->dlnf + (size_t)r0 * C, dW,
                                                                         NULL, m->logits, h, W, rows, C, V, false)));
        count += k;
        for (int i = 0; i < rows; i++) total += m->losses[r0 + i];
    }
    *loss_sum = total;
    *n_counted = count;
    /* the head's input gradient: summed over the tensor group (under
     * sequence parallelism reduce-scattered into sp_loc: this rank's rows) */
    if (backward && m->acts_sp) TRY(model_sp_scatter(m, m->sp_loc, m->dlnf, B, T));
    else if (backward) TRY(model_tp_allreduce(m, m->dlnf, (size_t)N * C));
    return CLLM_OK;
}

/* The score head of a sequence-classification model over the final norm's
 * output: scores[b] = w . lnf[b, pos[b]]; with backward, the caller's
 * dscores go into w's gradient and the rows of dlnf (zero elsewhere). */
static cllm_status score_run(cllm_model *m, const cllm_token_io *io, int B, int T, bool backward) {
    const int C = m->cfg.n_embd;
    const float *w = model_param(m, m->gslot[G_SCORE]);
    for (int b = 0; b < B; b++) {
        int t = io->score_pos[b];
        if (t < 0 || t >= T) return CLLM_FAIL(CLLM_ERR_ARG, "score position %d of row %d is outside [0, %d)", t, b, T);
        const float *h = m->lnf + ((size_t)b * T + (size_t)t) * C;
        double acc = 0;
        for (int i = 0; i < C; i++) acc += (double)w[i] * (double)h[i];
        io->scores[b] = acc > FLT_MAX ? INFINITY : acc < -FLT_MAX ? -INFINITY : (float)acc;
    }
    if (!backward) return CLLM_OK;
    memset(m->dlnf, 0, (size_t)B * T * C * sizeof(float));
    if (!io->score_grad || !io->dscores)
        return CLLM_FAIL(CLLM_ERR_ARG, "a backward pass through the score head needs score_grad and dscores");
    TRY(io->score_grad(io->score_ctx, io->scores, io->dscores, B));
    float *dw = model_grad(m, m->gslot[G_SCORE]);
    for (int b = 0; b < B; b++) {
        const float g = io->dscores[b];
        size_t row = ((size_t)b * T + (size_t)io->score_pos[b]) * C;
        const float *h = m->lnf + row;
        float *dh = m->dlnf + row;
        for (int i = 0; i < C; i++) {
            dw[i] += g * h[i];
            dh[i] = g * w[i];
        }
    }
    return CLLM_OK;
}

/* The value head over the final norm's output: values[n] = w . lnf[n] + b
 * at every position; with backward, dvalues go into w's and b's gradients
 * and are added to dlnf. */
static void value_run(cllm_model *m, const cllm_token_io *io, int N, bool backward) {
    const int C = m->cfg.n_embd;
    const float *w = model_param(m, m->gslot[G_VHEAD_W]), *bias = model_param(m, m->gslot[G_VHEAD_B]);
    if (io->values)
        for (int n = 0; n < N; n++) {
            const float *h = m->lnf + (size_t)n * C;
            double acc = bias[0];
            for (int i = 0; i < C; i++) acc += (double)w[i] * (double)h[i];
            io->values[n] = acc > FLT_MAX ? INFINITY : acc < -FLT_MAX ? -INFINITY : (float)acc;
        }
    if (!backward || !io->dvalues) return;
    float *dw = model_grad(m, m->gslot[G_VHEAD_W]), *db = model_grad(m, m->gslot[G_VHEAD_B]);
    double dbias = 0;
    for (int n = 0; n < N; n++) {
        const float g = io->dvalues[n];
        if (g == 0.0f) continue;
        const float *h = m->lnf + (size_t)n * C;
        float *dh = m->dlnf + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            dw[i] += g * h[i];
            dh[i] += g * w[i];
        }
        dbias += g;
    }
    db[0] += (float)dbias;
}

static cllm_status check_prepared(const cllm_model *m, int B, int T, bool backward) {
    if (!m->acts || B > m->act_B || T > m->act_T)
        return CLLM_FAIL(CLLM_ERR_ARG, "model prepared for %d x %d tokens, called with %d x %d (call cllm_model_prepare)",
                         m->act_B, m->act_T, B, T);
    if (backward && !m->has_backward)
        return CLLM_FAIL(CLLM_ERR_ARG, "model not prepared for training (cllm_model_prepare with train = true)");
    if (m->acts_sp && T % m->tp_size)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence parallelism: sequence length %d is not divisible by the %d tensor "
                         "ranks", T, m->tp_size);
    return CLLM_OK;
}

cllm_status cllm_model_forward_backward(cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                        bool backward, float grad_scale, double *loss_sum, long *n_counted) {
    return cllm_model_forward_backward_ex(m, tokens, targets, B, T, backward, grad_scale, NULL, loss_sum, n_counted);
}

static cllm_status forward_backward(cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                    bool backward, float grad_scale, const cllm_token_io *io, double *loss_sum,
                                    long *n_counted);

/* Adapter dropout is on in the passes that train (those with a backward). */
cllm_status cllm_model_forward_backward_ex(cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                           bool backward, float grad_scale, const cllm_token_io *io,
                                           double *loss_sum, long *n_counted) {
    model_lora_set_training(m, backward);
    cllm_status st = forward_backward(m, tokens, targets, B, T, backward, grad_scale, io, loss_sum, n_counted);
    model_lora_set_training(m, false);
    return st;
}

static cllm_status forward_backward(cllm_model *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                                    bool backward, float grad_scale, const cllm_token_io *io, double *loss_sum,
                                    long *n_counted) {
    TRY(check_prepared(m, B, T, backward));
    const float *tscale = io ? io->token_scale : NULL;
    const cllm_model_config *c = &m->cfg;
    int N = B * T, C = c->n_embd, L = c->n_layer;
    const bool score = io && io->score_pos, lm = !(io && (io->no_lm_head || score));
    if (c->num_labels > 0 && !score && !(io && io->no_lm_head))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a sequence-classification (reward) model has a score head, not an LM "
                         "head: train it with task \"reward\", score with `cllm score`");
    if (score && (c->num_labels != 1 || !io->scores))
        return CLLM_FAIL(CLLM_ERR_ARG, c->num_labels != 1 ? "score positions given for a model without a score head "
                         "(a causal LM; see cllm_model_to_reward)" : "score positions given without a scores buffer");
    if (score && m->tp_size > 1)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "the score head of a tensor-parallel part");
    if (m->acts_sp && io && (io->values || io->dvalues || io->hidden || io->dhidden || io->no_lm_head))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "sequence parallelism with a value head, hidden states or no LM head "
                         "(the language-modelling loss only)");
    const bool value = io && (io->values || io->dvalues);
    if (value && !c->value_head)
        return CLLM_FAIL(CLLM_ERR_ARG, "values asked of a model without a value head (see cllm_model_add_value_head)");
    int hs = head_slot(m);
    bool tied = lm && m->tgroup[hs] == 0; /* the head is the embedding: group 0 again */
    TRY(forward_blocks(m, tokens, B, T));
    TRY(fetch(m, L + 1, tied ? 0 : backward ? L : -1));
    if (tied) TRY(fetch(m, 0, backward ? L : -1));
    if (backward) {
        TRY(fetch_grads(m, L + 1));
        if (tied) TRY(fetch_grads(m, 0));
    }
    if (lm) {
        TRY(head_run(m, targets, B, T, backward, grad_scale, tscale, loss_sum, n_counted));
        if (io && io->token_loss) memcpy(io->token_loss, m->losses, (size_t)N * sizeof(float));
    } else { /* the final norm only: another head (the score head, a value head) reads it */
        TRY(final_norm(m, B, T));
        *loss_sum = 0;
        *n_counted = 0;
        if (score)
            TRY(score_run(m, io, B, T, backward));
        else if (backward)
            memset(m->dlnf, 0, (size_t)N * C * sizeof(float));
    }
    /* Mixtral with output_router_logits: HF's loss adds the scaled
     * load-balancing loss (per counted target here, as loss_sum is a sum) */
    double aux_scale = 0;
    if (c->n_experts && c->router_aux && lm && !tscale && *n_counted > 0) {
        *loss_sum += (double)c->router_aux_coef * model_moe_aux(m) * (double)*n_counted;
        aux_scale = (double)c->router_aux_coef * (double)*n_counted * grad_scale;
    }
    if (io && io->hidden) memcpy(io->hidden, m->lnf, (size_t)N * C * sizeof(float));
    if (backward && io && io->dhidden) cllm_add(m->dlnf, m->dlnf, io->dhidden, (long)N * C);
    if (value) value_run(m, io, N, backward);
    if (tied) TRY(release(m, 0));
    if (!backward) return release(m, L + 1);

    TRY(final_norm_backward(m, B, T));
    TRY(grads_ready(m, L + 1));
    TRY(release(m, L + 1));
    for (int l = L - 1; l >= 0; l--) {
        TRY(fetch(m, l + 1, l));
        /* checkpointing: the shared set still holds the last block's */
        if (m->acts_recompute && l + 1 < L) TRY(block_forward(m, l, B, T, true));
        TRY(fetch_grads(m, l + 1));
        TRY(block_backward(m, l, B, T, aux_scale));
        TRY(grads_ready(m, l + 1));
        TRY(release(m, l + 1));
    }
    TRY(fetch(m, 0, -1));
    if (!tied) TRY(fetch_grads(m, 0));
    TRY(embed_backward(m, tokens, B, T));
    TRY(grads_ready(m, 0));
    return release(m, 0);
}

/* ------------------------------------------------------ pipeline stages */

cllm_status cllm_model_stage_run(cllm_model *m, const cllm_model_stage_io *io, int B, int T, double *loss_sum,
                                 long *n_counted) {
    const cllm_model_config *c = &m->cfg;
    const int L = c->n_layer, u0 = io->u0, u1 = io->u1;
    if (u0 < 0 || u1 > L + 2 || u0 >= u1)
        return CLLM_FAIL(CLLM_ERR_ARG, "stage units [%d, %d) outside the model's %d", u0, u1, L + 2);
    TRY(check_prepared(m, B, T, io->backward));
    if (c->n_experts) /* the load-balancing loss spans every layer's router */
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "pipeline stages of a mixture-of-experts model (model_type mixtral)");
    const bool embed = u0 == 0, head = u1 == L + 2;
    if (head && c->num_labels > 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a pipeline stage with the score head of a sequence-classification "
                         "model: not supported");
    const int l0 = u0 < 1 ? 0 : u0 - 1, l1 = u1 > L + 1 ? L : u1 - 1; /* blocks [l0, l1) */
    /* the stage's input and output: this tensor rank's positions under sequence parallelism */
    const size_t NC = (size_t)model_sp_rows(m, B, T) * c->n_embd;
    if ((!embed && !io->x_in) || (embed && !io->tokens) || (head && !io->targets) || (!head && !io->x_out) ||
        (io->backward && !head && !io->dx_out) || (io->backward && !embed && !io->dx_in))
        return CLLM_FAIL(CLLM_ERR_ARG, "stage [%d, %d): a required input or output buffer is NULL", u0, u1);
    /* a tied head reads group 0, the embedding, which the hooks then give
     * this stage too (its own copy), and its gradient of it is ready once
     * the head's backward is done (the first stage adds its own) */
    const bool tied = head && !embed && m->tgroup[head_slot(m)] == 0;
    if (head && embed && m->tgroup[head_slot(m)] == 0 && (m->hooks.fetch_params || m->hooks.fetch_grads))
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "one stage of every unit with a tied head and layer hooks: run the "
                         "whole model (cllm_model_forward_backward)");
    /* the stage's input lands where its first unit reads it */
    float *in = l0 < L ? m->layers[l0].x : m->x_out;
    if (embed) {
        TRY(fetch(m, 0, l0 < l1 ? l0 + 1 : -1));
        TRY(embed_forward(m, io->tokens, B, T));
        TRY(release(m, 0));
    } else {
        memcpy(in, io->x_in, NC * sizeof(float));
    }
    for (int l = l0; l < l1; l++) {
        TRY(fetch(m, l + 1, l + 1 < l1 ? l + 2 : head ? L + 1 : -1));
        TRY(block_forward(m, l, B, T, false));
        TRY(release(m, l + 1));
    }
    float *out = l1 < L ? m->layers[l1].x : m->x_out;
    *loss_sum = 0;
    *n_counted = 0;
    if (head) {
        TRY(fetch(m, L + 1, tied ? 0 : io->backward && l1 > l0 ? l1 : -1));
        if (tied) TRY(fetch(m, 0, io->backward && l1 > l0 ? l1 : -1));
        if (io->backward) TRY(fetch_grads(m, L + 1));
        if (io->backward && tied) TRY(fetch_grads(m, 0));
        TRY(head_run(m, io->targets, B, T, io->backward, io->grad_scale, NULL, loss_sum, n_counted));
        if (io->backward && tied) TRY(grads_ready(m, 0));
        if (tied) TRY(release(m, 0));
    } else {
        memcpy(io->x_out, out, NC * sizeof(float));
    }
    if (!io->backward) return head ? release(m, L + 1) : CLLM_OK;
    if (head) {
        TRY(final_norm_backward(m, B, T));
        TRY(grads_ready(m, L + 1));
        TRY(release(m, L + 1));
    } else {
        memcpy(m->dx, io->dx_out, NC * sizeof(float));
    }
    for (int l = l1 - 1; l >= l0; l--) {
        TRY(fetch(m, l + 1, l > l0 || embed ? l : -1));
        if (m->acts_recompute && l + 1 < l1) TRY(block_forward(m, l, B, T, true));
        TRY(fetch_grads(m, l + 1));
        TRY(block_backward(m, l, B, T, 0));
        TRY(grads_ready(m, l + 1));
        TRY(release(m, l + 1));
    }
    if (embed) {
        TRY(fetch(m, 0, -1));
        TRY(fetch_grads(m, 0));
        TRY(embed_backward(m, io->tokens, B, T));
        TRY(grads_ready(m, 0));
        TRY(release(m, 0));
    } else {
        memcpy(io->dx_in, m->dx, NC * sizeof(float));
    }
    return CLLM_OK;
}

size_t cllm_model_stage_floats(const cllm_model *m, int B, int T) {
    int rows = cllm_model_sequence_parallel(m) ? B * (T / m->tp_size) : B * T;
    return (size_t)rows * (size_t)m->cfg.n_embd;
}

cllm_status cllm_model_forward_logits(cllm_model *m, const int32_t *tokens, int B, int T, float *logits) {
    TRY(check_prepared(m, B, T, false));
    if (m->tp_size > 1)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "logits of a tensor-parallel part (rank %d of %d): generate with the "
                         "whole model", m->tp_rank, m->tp_size);
    if (m->cfg.num_labels > 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "logits of a sequence-classification (reward) model: it has no LM head");
    const cllm_model_config *c = &m->cfg;
    int N = B * T, C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    int hs = head_slot(m);
    bool tied = m->tgroup[hs] == 0;
    TRY(forward_blocks(m, tokens, B, T));
    TRY(fetch(m, L + 1, tied ? 0 : -1));
    if (tied) TRY(fetch(m, 0, -1));
    model_norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->x_out, model_param(m, m->gslot[G_LNF_W]),
                 model_param(m, m->gslot[G_LNF_B]), N);
    for (int b = 0; b < B; b++)
        TRY(model_linear_forward(m, &m->lp_run, logits + (size_t)b * V, m->lnf + ((size_t)b * T + T - 1) * C, hs, NULL,
                                 1, C, V, false));
    if (tied) TRY(release(m, 0));
    return release(m, L + 1);
}

double cllm_model_train_flops(const cllm_model *m, int B, int T) {
    const cllm_model_config *c = &m->cfg;
    double C = c->n_embd, F = c->n_inner, Q = (double)c->n_head * c->head_dim;
    double per_layer = C * model_qkv_width(c) + Q * C + C * F * (c->arch == CLLM_ARCH_LLAMA ? 3 : 2);
    if (c->n_experts) /* Mixtral: each token runs its k experts and the router */
        per_layer += C * F * 3 * (c->n_experts_per_tok - 1) + C * c->n_experts;
    double matmul_params = per_layer * c->n_layer + C * c->vocab_size;
    double N = (double)B * T;
    /* causal attention: q.k and p.v over (T+1)/2 keys on average */
    double attn = 2.0 * 2.0 * N * ((T + 1) / 2.0) * Q * c->n_layer;
    return 3.0 * (2.0 * N * matmul_params + attn);
}
