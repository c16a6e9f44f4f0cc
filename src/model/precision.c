/*
 * Mixed-precision linear layers: the matmuls of a model in bf16 (or
 * emulated fp16) while the parameters, gradients and every other operator
 * stay fp32.
 *
 * The fp32 parameter buffer remains the master copy. A low-precision copy
 * with the same layout (same offsets) feeds the matmuls; it is rebuilt in
 * one pass before the first linear layer that runs after the parameters may
 * have changed (lp_stale), so it can lag behind only if a caller writes
 * through a pointer obtained from cllm_model_params() and then runs the
 * model without calling cllm_model_params_updated() or cllm_model_params()
 * again, as documented in model.h.
 *
 * Activations and gradients are converted where they enter a matmul, into
 * the run's two scratch regions (model_lp_scratch: the training run's in
 * the model, or a KV cache's own, so that caches over one model may run on
 * several threads; the weights behind a const cllm_model * are never
 * written by a forward, but for the one rebuild of the low-precision copy
 * after the parameters changed, under a lock): forward converts the
 * input, backward converts the output gradient (region a) and the saved input
 * (region b; converted again rather than kept from the forward pass, which
 * costs one cheap pass and no memory per layer). Saved activations stay
 * fp32. The rounding is deterministic, so the backward pass sees exactly the
 * operands the forward pass used.
 *
 * bf16: oneDNN's bf16 matmul primitive with an fp32 destination, so the sum
 * over K and the beta=1 accumulation into the fp32 gradients are fp32.
 * fp16: an emulation. Operands are rounded to fp16 values held in fp32 and
 * go through the fp32 GEMM; the output (linear output after the bias,
 * logits, input gradients) is rounded to fp16 so that overflow shows up as
 * inf. The weight gradients are the fp32 accumulation of fp16 operands
 * (master gradients, as mixed-precision training keeps them).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "cllm/kernels.h"
#include "model_impl.h"

static const char *const prec_names[CLLM_PREC_COUNT] = {"fp32", "bf16", "fp16"};

const char *cllm_precision_name(cllm_precision p) {
    return (unsigned)p < CLLM_PREC_COUNT ? prec_names[p] : NULL;
}

bool cllm_precision_from_name(const char *name, cllm_precision *out) {
    for (int i = 0; name && i < CLLM_PREC_COUNT; i++)
        if (!strcmp(name, prec_names[i])) {
            *out = (cllm_precision)i;
            return true;
        }
    return false;
}

static size_t elem_size(cllm_precision p) { return p == CLLM_PREC_BF16 ? sizeof(uint16_t) : sizeof(float); }

size_t cllm_precision_copy_bytes(cllm_precision p) {
    return p == CLLM_PREC_BF16 || p == CLLM_PREC_FP16 ? elem_size(p) : 0;
}

void cllm_model_lp_copy(cllm_precision p, void *dst, const float *src, size_t n) {
    if (p == CLLM_PREC_BF16)
        cllm_to_bf16(dst, src, (long)n);
    else if (p == CLLM_PREC_FP16)
        cllm_round_f16(dst, src, (long)n);
}

/* Elements of each operand scratch region: the largest matmul operand of a
 * B x T batch (an input or output of any linear layer, or a logits chunk). */
static size_t scratch_elems(const cllm_model_config *c, int B, int T) {
    size_t N = (size_t)B * (size_t)T, w = (size_t)c->n_embd;
    size_t qkv = (size_t)model_qkv_width(c), q = (size_t)c->n_head * (size_t)c->head_dim;
    if ((size_t)c->n_inner > w) w = (size_t)c->n_inner;
    if (qkv > w) w = qkv;
    if (q > w) w = q;
    size_t head = (size_t)model_logit_chunk(c, (int)N) * (size_t)c->vocab_size;
    return N * w > head ? N * w : head;
}

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* The widened-operand scratch cllm_matmul_bf16 keeps on CPUs without a
 * native bf16 GEMM: the largest over the three GEMMs (forward, input
 * gradient, weight gradient) of every linear layer and of a logits chunk. */
static size_t widen_bytes(const cllm_model_config *c, int B, int T) {
    int N = B * T, C = c->n_embd, F = c->n_inner, Q = c->n_head * c->head_dim, QKV = model_qkv_width(c);
    int rows = model_logit_chunk(c, N);
    const int lin[][3] = {{N, C, QKV}, {N, Q, C}, {N, C, F}, {N, F, C}, {rows, C, c->vocab_size}}; /* rows, IN, OUT */
    size_t best = 0;
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        int n = lin[i][0], in = lin[i][1], out = lin[i][2];
        size_t g[3] = {cllm_matmul_bf16_scratch_bytes(n, out, in), cllm_matmul_bf16_scratch_bytes(n, in, out),
                       cllm_matmul_bf16_scratch_bytes(out, in, n)};
        for (int j = 0; j < 3; j++)
            if (g[j] > best) best = g[j];
    }
    return round64(best);
}

size_t cllm_model_precision_bytes(const cllm_model_config *c, size_t buffer_len, int B, int T, cllm_precision p) {
    if (p == CLLM_PREC_FP32 || (unsigned)p >= CLLM_PREC_COUNT) return 0;
    size_t es = elem_size(p);
    return round64(buffer_len * es) + 2 * round64(scratch_elems(c, B, T) * es) +
           (p == CLLM_PREC_BF16 ? widen_bytes(c, B, T) : 0);
}

void model_lp_scratch_free(model_lp_scratch *lp) {
    cllm_free(lp->a);
    cllm_free(lp->b);
    cllm_free(lp->widen);
    cllm_free(lp->deq);
    *lp = (model_lp_scratch){0};
}

void model_lp_release(cllm_model *m) {
    cllm_free(m->lp_params);
    m->lp_params = NULL;
    model_lp_scratch_free(&m->lp_run);
}

cllm_status model_lp_reserve(model_lp_scratch *lp, cllm_precision p, size_t elems) {
    if (elems <= lp->elems) return CLLM_OK;
    if (lp->fixed)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "operand of %zu elements, scratch sized for %zu", elems, lp->elems);
    size_t es = elem_size(p), bytes;
    if (!cllm_size_mul(elems, es, &bytes)) return CLLM_FAIL(CLLM_ERR_NOMEM, "operand scratch size overflows");
    void *a = cllm_alloc(bytes, "mixed-precision operands");
    void *b = a ? cllm_alloc(bytes, "mixed-precision operands") : NULL;
    if (!b) {
        cllm_free(a);
        return CLLM_ERR_NOMEM;
    }
    cllm_free(lp->a);
    cllm_free(lp->b);
    lp->a = a;
    lp->b = b;
    lp->elems = elems;
    return CLLM_OK;
}

cllm_status model_lp_prepare(cllm_model *m) {
    if (m->prec == CLLM_PREC_FP32 || !m->acts) return CLLM_OK;
    return model_lp_reserve(&m->lp_run, m->prec, scratch_elems(&m->cfg, m->act_B, m->act_T));
}

/* The widened-GEMM workspace of forwards of up to `rows` rows (and
 * head_rows through the head): the bound over every linear layer. */
static size_t forward_widen_bytes(const cllm_model_config *c, int rows, int head_rows) {
    int C = c->n_embd, F = c->n_inner, Q = c->n_head * c->head_dim, QKV = model_qkv_width(c);
    const int lin[][3] = {{rows, C, QKV}, {rows, Q, C}, {rows, C, F}, {rows, F, C}, {head_rows, C, c->vocab_size}};
    size_t best = 0;
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        size_t b = cllm_matmul_bf16_scratch_bound(lin[i][0], lin[i][2], lin[i][1]); /* M rows, N = OUT, K = IN */
        if (b > best) best = b;
    }
    return best;
}

/* A forward pass converts only linear inputs: rows x the widest input
 * (C, the attention width, or F), and head_rows x C into the head. */
cllm_status model_lp_scratch_init(model_lp_scratch *lp, const cllm_model *m, int rows, int head_rows) {
    *lp = (model_lp_scratch){.fixed = true};
    size_t deq = model_weights_scratch(m, rows > head_rows ? rows : head_rows);
    if (deq) {
        lp->deq = cllm_alloc(deq * sizeof(float), "widened weight tiles");
        if (!lp->deq) return CLLM_ERR_NOMEM;
        lp->deq_elems = deq;
    }
    if (m->prec == CLLM_PREC_FP32) {
        /* a quantized base computing in bf16 / fp16: its rounded operands */
        size_t qe = model_qbase_operand_elems(m, rows);
        if (!qe) return CLLM_OK;
        if (!(lp->a = cllm_alloc(qe * sizeof(float), "rounded operands of the quantized base"))) {
            model_lp_scratch_free(lp);
            return CLLM_ERR_NOMEM;
        }
        lp->elems = qe;
        return CLLM_OK;
    }
    const cllm_model_config *c = &m->cfg;
    size_t w = (size_t)c->n_embd, q = (size_t)c->n_head * (size_t)c->head_dim, bytes;
    if ((size_t)c->n_inner > w) w = (size_t)c->n_inner;
    if (q > w) w = q;
    size_t elems = (size_t)rows * w, head = (size_t)head_rows * (size_t)c->n_embd;
    if (head > elems) elems = head;
    if (!cllm_size_mul(elems, elem_size(m->prec), &bytes))
        return CLLM_FAIL(CLLM_ERR_NOMEM, "operand scratch size overflows");
    lp->a = cllm_alloc(bytes ? bytes : 1, "mixed-precision operands");
    if (!lp->a) return CLLM_ERR_NOMEM;
    lp->elems = elems;
    size_t wb = m->prec == CLLM_PREC_BF16 ? forward_widen_bytes(c, rows, head_rows) : 0;
    if (wb) {
        lp->widen = cllm_alloc(wb, "widened bf16 GEMM operands");
        if (!lp->widen) {
            model_lp_scratch_free(lp);
            return CLLM_ERR_NOMEM;
        }
        lp->widen_bytes = wb;
    }
    return CLLM_OK;
}

cllm_status cllm_model_set_precision(cllm_model *m, cllm_precision p) {
    if ((unsigned)p >= CLLM_PREC_COUNT) return CLLM_FAIL(CLLM_ERR_ARG, "unknown precision %d", (int)p);
    if (p == m->prec) return CLLM_OK;
    if (m->shared) return model_shared_refuse("a change of matmul precision");
    if (m->qb)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s matmuls over a %s base: the rest of a QLoRA model stays fp32; "
                         "bnb_4bit_compute_dtype (--bnb-4bit-compute-dtype bfloat16) sets the 4-bit layers' matmul "
                         "dtype", cllm_precision_name(p), cllm_bnb_type_name(cllm_model_quantized(m)));
    if (m->ws)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s matmuls over %s weights: the weight format sets the precision "
                         "(use --weights fp32 for mixed precision)", cllm_precision_name(p), cllm_wfmt_name(cllm_model_weights(m)));
    cllm_precision old = m->prec;
    model_lp_scratch orun = m->lp_run;
    void *op = m->lp_params;
    m->lp_run = (model_lp_scratch){0};
    m->lp_params = NULL;
    m->prec = p;
    cllm_status st = CLLM_OK;
    if (p != CLLM_PREC_FP32) {
        /* no flat parameters (ZeRO-3 dropped them): the layer hooks hand
         * out each gathered group's copy instead */
        if (m->params) m->lp_params = cllm_calloc(m->n_params, elem_size(p), "low-precision parameter copy");
        st = m->lp_params || !m->params ? model_lp_prepare(m) : CLLM_ERR_NOMEM;
    }
    if (st) { /* restore the previous state */
        model_lp_release(m);
        m->prec = old;
        m->lp_run = orun;
        m->lp_params = op;
        return st;
    }
    model_lp_scratch_free(&orun);
    cllm_free(op);
    atomic_store(&m->lp_stale, true);
    return CLLM_OK;
}

cllm_precision cllm_model_precision(const cllm_model *m) { return m->prec; }

void cllm_model_params_updated(cllm_model *m) {
    if (m->shared && !m->own_params) return; /* shared weights never change (cllm/weights.h) */
    if (m->frozen) { /* frozen weights never change: only trained copies of model tensors can */
        model_trainable_sync(m);
        if (!m->tcopies && !m->tshared) return;
    }
    atomic_store(&m->lp_stale, true);
}

/* Brings the low-precision weights up to date after the parameters
 * changed. The copy is derived from the weights, not run state: it is
 * rebuilt once, by whichever forward reaches a linear layer first, while
 * the others wait on the lock; afterwards every forward only reads it (the
 * acquire load pairs with the release store below). */
static pthread_mutex_t g_refresh = PTHREAD_MUTEX_INITIALIZER;

cllm_status model_lp_refresh(const cllm_model *m) {
    if (!atomic_load_explicit(&m->lp_stale, memory_order_acquire)) return CLLM_OK;
    cllm_status st = CLLM_OK;
    pthread_mutex_lock(&g_refresh);
    cllm_model *w = (cllm_model *)(uintptr_t)m; /* the derived copy only */
    if (atomic_load_explicit(&w->lp_stale, memory_order_relaxed)) {
        /* parameters set again after cllm_model_drop_params: the copy is made anew */
        if (!w->lp_params) w->lp_params = cllm_alloc(w->n_params * elem_size(w->prec), "low-precision parameter copy");
        if (w->lp_params) {
            cllm_model_lp_copy(w->prec, w->lp_params, w->params, w->n_params);
            atomic_store_explicit(&w->lp_stale, false, memory_order_release);
        } else {
            st = CLLM_ERR_NOMEM;
        }
    }
    pthread_mutex_unlock(&g_refresh);
    return st;
}

/* The low-precision copy of weight w (numel floats): inside the flat
 * buffer's copy, or inside the copy a layer hook handed out with w's
 * gathered group (ZeRO-3). Pointers are compared as integers: w may
 * legitimately point elsewhere only in fp32 mode. */
static cllm_status lp_weight(const cllm_model *m, const float *w, size_t numel, const void **out) {
    const uintptr_t p = (uintptr_t)w;
    const size_t es = elem_size(m->prec);
    if (m->params) {
        uintptr_t base = (uintptr_t)m->params;
        if (p >= base && (p - base) / sizeof(float) + numel <= m->n_params) {
            cllm_status st = model_lp_refresh(m);
            if (st) return st;
            *out = (const char *)m->lp_params + (p - base) / sizeof(float) * es;
            return CLLM_OK;
        }
    }
    for (int g = 0; g < m->cfg.n_layer + 2; g++) {
        const struct model_group *gr = &m->groups[g];
        uintptr_t base = (uintptr_t)gr->p;
        if (!gr->p || !gr->lp || p < base || (p - base) / sizeof(float) + numel > gr->end - gr->begin) continue;
        *out = (const char *)gr->lp + (p - base) / sizeof(float) * es;
        return CLLM_OK;
    }
    return CLLM_FAIL(CLLM_ERR_INTERNAL, "%s linear layer with a weight that has no low-precision copy (outside the "
                     "parameter buffer, or in a gathered group handed out without one)", cllm_precision_name(m->prec));
}

static void add_bias(float *out, const float *bias, int N, int OUT) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OUT;
#pragma omp simd
        for (int j = 0; j < OUT; j++) o[j] += bias[j];
    }
}

static cllm_status linear_forward(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp, int widx,
                                  const float *bias, int N, int IN, int OUT, bool w_in_out) {
    const cllm_qweight *q = model_weights_get(m, widx);
    if (q) return model_weights_linear(m, lp, out, inp, q, bias, N);
    const cllm_bnb_matrix *qb = model_qbase_get(m, widx);
    if (qb) return model_qbase_forward(m, lp, out, inp, qb, bias, N);
    const float *w = model_param(m, widx);
    if (m->prec == CLLM_PREC_FP32) {
        /* decode steps of [out, in] weights (GPT-2's Conv1D ones once cllm_model_set_inference
         * transposed them): the bandwidth-bound kernel, in place on the flat buffer. Conv1D
         * weights in the file layout stay on oneDNN's GEMV, which reads [in, out] faster than
         * cllm_qmatmul's axpy strips (bench/qmatmul_bench.c). */
        if (N > WEIGHTS_SMALL_ROWS || w_in_out) return cllm_linear_forward(out, inp, w, bias, N, IN, OUT, w_in_out);
        cllm_qweight v = {.fmt = CLLM_WFMT_FP32, .data = w, .rows = OUT, .cols = IN, .in_out = w_in_out};
        cllm_qmatmul(out, inp, &v, bias, N, NULL);
        return CLLM_OK;
    }
    size_t nin = (size_t)N * IN;
    const void *wl = NULL;
    cllm_status st = lp_weight(m, w, (size_t)IN * OUT, &wl);
    if (!st) st = model_lp_reserve(lp, m->prec, nin);
    if (st) return st;
    if (m->prec == CLLM_PREC_BF16) {
        uint16_t *a = lp->a;
        cllm_to_bf16(a, inp, (long)nin);
        st = cllm_matmul_bf16_ws(out, a, wl, N, OUT, IN, false, !w_in_out, 1.0f, 0.0f, lp->widen, lp->widen_bytes);
        if (!st && bias) add_bias(out, bias, N, OUT);
        return st;
    }
    float *a = lp->a;
    cllm_round_f16(a, inp, (long)nin);
    st = cllm_linear_forward(out, a, wl, bias, N, IN, OUT, w_in_out);
    if (!st) cllm_round_f16(out, out, (long)N * OUT);
    return st;
}

static cllm_status linear_backward(const cllm_model *m, model_lp_scratch *lp, float *dinp, float *dw, float *dbias,
                                   const float *dout, const float *inp, const float *w, int N, int IN, int OUT,
                                   bool w_in_out) {
    int qi = model_qbase_index(m, w);
    if (qi >= 0) return model_qbase_backward(m, lp, dinp, dw, dbias, dout, qi, N);
    if (m->prec == CLLM_PREC_FP32) return cllm_linear_backward(dinp, dw, dbias, dout, inp, w, N, IN, OUT, w_in_out);
    size_t nin = (size_t)N * IN, nout = (size_t)N * OUT;
    const void *wl = NULL;
    cllm_status st = lp_weight(m, w, (size_t)IN * OUT, &wl);
    if (!st) st = model_lp_reserve(lp, m->prec, nin > nout ? nin : nout);
    if (!st && !lp->b) st = CLLM_FAIL(CLLM_ERR_INTERNAL, "a backward pass through a forward-only operand scratch");
    if (st) return st;
    if (m->prec == CLLM_PREC_BF16) {
        uint16_t *d = lp->a, *x = lp->b;
        const uint16_t *w16 = wl;
        cllm_to_bf16(d, dout, (long)nout);
        if (dinp)
            st = cllm_matmul_bf16_ws(dinp, d, w16, N, IN, OUT, false, w_in_out, 1.0f, 1.0f, lp->widen, lp->widen_bytes);
        if (!st && dw) {
            cllm_to_bf16(x, inp, (long)nin);
            if (w_in_out)
                st = cllm_matmul_bf16_ws(dw, x, d, IN, OUT, N, true, false, 1.0f, 1.0f, lp->widen, lp->widen_bytes);
            else
                st = cllm_matmul_bf16_ws(dw, d, x, OUT, IN, N, true, false, 1.0f, 1.0f, lp->widen, lp->widen_bytes);
        }
        /* the bias gradient is a column sum of the fp32 dout */
        if (!st && dbias) st = cllm_linear_backward(NULL, NULL, dbias, dout, NULL, NULL, N, IN, OUT, w_in_out);
        return st;
    }
    float *d = lp->a, *x = lp->b;
    cllm_round_f16(d, dout, (long)nout);
    if (dw) cllm_round_f16(x, inp, (long)nin);
    st = cllm_linear_backward(dinp, dw, dbias, d, x, wl, N, IN, OUT, w_in_out);
    if (!st && dinp) cllm_round_f16(dinp, dinp, (long)nin);
    return st;
}

/* The linear seam: the base layer in the model's precision, then the
 * layer's LoRA adapter (lora.c) when it carries one. */
cllm_status model_linear_forward(const cllm_model *m, model_lp_scratch *lp, float *out, const float *inp, int w,
                                 const float *bias, int N, int IN, int OUT, bool w_in_out) {
    cllm_status st = linear_forward(m, lp, out, inp, w, bias, N, IN, OUT, w_in_out);
    const struct model_adapter *ad = st || !m->lora ? NULL : model_lora_find(m, model_param(m, w));
    if (ad) st = model_lora_forward(m, ad, out, inp, N);
    if (!st && lp && lp->rows) st = model_lora_rows_forward(lp->rows, w, out, inp, N); /* a set's, per row */
    return st;
}

cllm_status model_linear_backward(const cllm_model *m, model_lp_scratch *lp, float *dinp, float *dw, float *dbias,
                                  const float *dout, const float *inp, const float *w, int N, int IN, int OUT,
                                  bool w_in_out) {
    cllm_status st = linear_backward(m, lp, dinp, dw, dbias, dout, inp, w, N, IN, OUT, w_in_out);
    const struct model_adapter *ad = st || !m->lora ? NULL : model_lora_find(m, w);
    return ad ? model_lora_backward(m, ad, dinp, dout, inp, N) : st;
}
