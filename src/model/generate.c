/*
 * Inference forward with a key/value cache, for GPT-2, LLaMA and BLOOM.
 *
 * The math is the training forward of run.c restricted to new rows: with
 * N = B*n new tokens at positions pos..pos+n-1,
 *   gpt2:  x = wte[tok] + wpe[pos + t]
 *   bloom: x = LN(wte[tok])
 *   llama: x = wte[tok]
 *   block: h = x + o(attn(q, K, V)),  y = h + mlp(norm2(h))
 * where q is the new rows' query (rotated at its absolute position for
 * LLaMA) and K, V are the cached keys/values of positions 0..pos+t, into
 * which the new rows' own keys and values are written first. Only the last
 * new row of each sequence goes through the final norm and the head.
 *
 * Cache layout k[n_layer][B][NKV][S][HS] (and v alike), S = capacity:
 * attention for one (sequence, kv head) reads one contiguous [pos+n, HS]
 * block, and appending a token writes one HS row per head. The alternative
 * [S][NKV][HS] (token-major) makes appends one contiguous row but strides
 * every key read by NKV*HS; reads dominate (every step reads all keys), so
 * head-major wins.
 *
 * All scratch is carved out of one allocation at init, sized for B x
 * max_chunk rows, so forward calls never allocate. Projections go through
 * cllm_linear_forward (oneDNN).
 *
 * Left out: sequences of different lengths in one batch (rows advance in
 * lockstep), sliding windows, cache quantisation, logits of every new
 * position (only the last one is returned).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/generate.h"
#include "cllm/kernels.h"
#include "model_impl.h"

/* Default capacity for models without a position limit (BLOOM). */
enum { DEFAULT_MAX_POS = 2048 };

struct cllm_kv_cache {
    const cllm_model *m;
    int B, S, chunk, pos;
    float *kc, *vc;          /* [n_layer][B][NKV][S][HS] */
    float *buf;              /* everything below is carved from buf */
    float *x, *ln, *x1;      /* [N,C] residual stream, normed input, residual after attention */
    float *mean, *rstd;      /* [N] */
    float *qkv;              /* [N,QKV] same layouts as training */
    float *atty;             /* [N,NH*HS] */
    float *fc, *up, *act;    /* [N,F] (up: llama only) */
    float *last, *lnf;       /* [B,C] last rows, normed */
    float *lmean, *lrstd;    /* [B] */
    float *rope_cos, *rope_sin; /* [S,HS/2] llama */
    float *alibi;            /* [NH] bloom */
};

static const float *param(const cllm_model *m, int idx) { return idx < 0 ? NULL : m->params + m->tensors[idx].offset; }

static size_t carve(float **p, float *base, size_t used, size_t n) {
    *p = base ? base + used : NULL;
    return used + ((n + 15) & ~(size_t)15);
}

/* Lays out the scratch (base == NULL: measure only); returns floats used. */
static size_t assign(cllm_kv_cache *kv, float *base) {
    const cllm_model_config *c = &kv->m->cfg;
    size_t N = (size_t)kv->B * kv->chunk, C = (size_t)c->n_embd, F = (size_t)c->n_inner;
    size_t u = 0;
    u = carve(&kv->x, base, u, N * C);
    u = carve(&kv->ln, base, u, N * C);
    u = carve(&kv->x1, base, u, N * C);
    u = carve(&kv->mean, base, u, N);
    u = carve(&kv->rstd, base, u, N);
    u = carve(&kv->qkv, base, u, N * (size_t)model_qkv_width(c));
    u = carve(&kv->atty, base, u, N * (size_t)c->n_head * c->head_dim);
    u = carve(&kv->fc, base, u, N * F);
    u = carve(&kv->up, base, u, c->arch == CLLM_ARCH_LLAMA ? N * F : 0);
    u = carve(&kv->act, base, u, N * F);
    u = carve(&kv->last, base, u, (size_t)kv->B * C);
    u = carve(&kv->lnf, base, u, (size_t)kv->B * C);
    u = carve(&kv->lmean, base, u, (size_t)kv->B);
    u = carve(&kv->lrstd, base, u, (size_t)kv->B);
    size_t half = c->arch == CLLM_ARCH_LLAMA ? (size_t)kv->S * (c->head_dim / 2) : 0;
    u = carve(&kv->rope_cos, base, u, half);
    u = carve(&kv->rope_sin, base, u, half);
    u = carve(&kv->alibi, base, u, (size_t)c->n_head);
    return u;
}

cllm_status cllm_kv_cache_init(cllm_kv_cache **out, const cllm_model *m, int B, int max_pos, int max_chunk) {
    *out = NULL;
    const cllm_model_config *c = &m->cfg;
    if (B < 1 || max_pos < 0 || max_chunk < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "batch %d, max_pos %d, max_chunk %d: need B >= 1 and sizes >= 0", B, max_pos,
                         max_chunk);
    int S = max_pos ? max_pos : (c->n_ctx > 0 ? c->n_ctx : DEFAULT_MAX_POS);
    if (c->n_ctx > 0 && S > c->n_ctx)
        return CLLM_FAIL(CLLM_ERR_ARG, "%d positions requested, but the %s model handles at most %d (%s)", S,
                         cllm_arch_name(c->arch), c->n_ctx,
                         c->arch == CLLM_ARCH_GPT2 ? "n_positions" : "max_position_embeddings");
    int chunk = max_chunk && max_chunk < S ? max_chunk : S;

    size_t kv_floats, row = (size_t)c->n_kv_head * c->head_dim;
    if (!cllm_size_mul(row, (size_t)S, &kv_floats) || !cllm_size_mul(kv_floats, (size_t)B, &kv_floats) ||
        !cllm_size_mul(kv_floats, (size_t)c->n_layer, &kv_floats) ||
        (size_t)B * (size_t)chunk > ((size_t)1 << 28))
        return CLLM_FAIL(CLLM_ERR_NOMEM, "cache of %d x %d positions is too large", B, S);

    cllm_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    kv->m = m;
    kv->B = B;
    kv->S = S;
    kv->chunk = chunk;
    size_t scratch = assign(kv, NULL);
    kv->kc = cllm_alloc(kv_floats * sizeof(float), "key cache");
    kv->vc = kv->kc ? cllm_alloc(kv_floats * sizeof(float), "value cache") : NULL;
    kv->buf = kv->vc ? cllm_alloc(scratch * sizeof(float), "generation scratch") : NULL;
    if (!kv->buf) {
        cllm_kv_cache_free(kv);
        return CLLM_ERR_NOMEM;
    }
    assign(kv, kv->buf);
    if (c->arch == CLLM_ARCH_LLAMA) cllm_rope_tables(kv->rope_cos, kv->rope_sin, S, c->head_dim, c->rope_theta);
    if (c->arch == CLLM_ARCH_BLOOM) cllm_alibi_slopes(kv->alibi, c->n_head);
    *out = kv;
    return CLLM_OK;
}

void cllm_kv_cache_free(cllm_kv_cache *kv) {
    if (!kv) return;
    cllm_free(kv->kc);
    cllm_free(kv->vc);
    cllm_free(kv->buf);
    free(kv);
}

int cllm_kv_cache_pos(const cllm_kv_cache *kv) { return kv->pos; }
int cllm_kv_cache_capacity(const cllm_kv_cache *kv) { return kv->S; }

cllm_status cllm_kv_cache_rewind(cllm_kv_cache *kv, int pos) {
    if (pos < 0 || pos > kv->pos)
        return CLLM_FAIL(CLLM_ERR_ARG, "cannot rewind to position %d (filled: %d)", pos, kv->pos);
    kv->pos = pos;
    return CLLM_OK;
}

/* Views of q, k, v inside the qkv scratch of N rows: GPT-2 [N, Q|K|V],
 * BLOOM [N, NH, 3, HS], LLaMA three regions [N,Q] [N,K] [N,K] (the layouts
 * of the training forward, so the same weights apply unchanged). */
static void qkv_views(const cllm_model_config *c, float *qkv, size_t N, cllm_view *q, cllm_view *k, cllm_view *v) {
    int C = c->n_embd, HS = c->head_dim, Q = c->n_head * HS, K = c->n_kv_head * HS;
    switch (c->arch) {
    case CLLM_ARCH_GPT2:
        *q = (cllm_view){qkv, 3 * C, HS};
        *k = (cllm_view){qkv + C, 3 * C, HS};
        *v = (cllm_view){qkv + 2 * C, 3 * C, HS};
        break;
    case CLLM_ARCH_BLOOM:
        *q = (cllm_view){qkv, 3 * C, 3 * HS};
        *k = (cllm_view){qkv + HS, 3 * C, 3 * HS};
        *v = (cllm_view){qkv + 2 * HS, 3 * C, 3 * HS};
        break;
    default:
        *q = (cllm_view){qkv, Q, HS};
        *k = (cllm_view){qkv + N * (size_t)Q, K, HS};
        *v = (cllm_view){qkv + N * (size_t)(Q + K), K, HS};
        break;
    }
}

/* Copies the n new rows of every (sequence, kv head) from a view into the
 * cache block of layer l at positions pos..pos+n-1. */
static void cache_append(float *cache, cllm_view src, const cllm_kv_cache *kv, int l, int n) {
    const cllm_model_config *c = &kv->m->cfg;
    int NKV = c->n_kv_head, HS = c->head_dim;
    for (int b = 0; b < kv->B; b++)
        for (int g = 0; g < NKV; g++) {
            float *dst = cache + ((((size_t)l * kv->B + b) * NKV + g) * kv->S + kv->pos) * HS;
            for (int t = 0; t < n; t++)
                memcpy(dst + (size_t)t * HS, src.p + ((size_t)b * n + t) * src.rs + (size_t)g * src.hs,
                       (size_t)HS * sizeof(float));
        }
}

static void norm(const cllm_model_config *c, float *out, float *mean, float *rstd, const float *inp, const float *w,
                 const float *b, int N) {
    if (c->arch == CLLM_ARCH_LLAMA)
        cllm_rmsnorm_forward(out, rstd, inp, w, N, c->n_embd, c->norm_eps);
    else
        cllm_layernorm_forward(out, mean, rstd, inp, w, b, N, c->n_embd, c->norm_eps);
}

#define TRY(x)                          \
    do {                                \
        cllm_status st_ = (x);          \
        if (st_ != CLLM_OK) return st_; \
    } while (0)

/* One block over N = B*n new rows: kv->x in, kv->x out (updated in place). */
static cllm_status block(cllm_kv_cache *kv, int l, int n) {
    const cllm_model *m = kv->m;
    const cllm_model_config *c = &m->cfg;
    const int *s = m->lslot[l];
    int N = kv->B * n, C = c->n_embd, F = c->n_inner, HS = c->head_dim;
    int Q = c->n_head * HS, K = c->n_kv_head * HS;
    bool in_out = c->arch == CLLM_ARCH_GPT2; /* Conv1D weights [IN,OUT] */
    const float *P[L_NSLOTS];
    for (int i = 0; i < L_NSLOTS; i++) P[i] = param(m, s[i]);

    norm(c, kv->ln, kv->mean, kv->rstd, kv->x, P[L_LN1_W], P[L_LN1_B], N);
    cllm_view q, k, v;
    qkv_views(c, kv->qkv, (size_t)N, &q, &k, &v);
    if (c->arch == CLLM_ARCH_LLAMA) {
        TRY(cllm_linear_forward(q.p, kv->ln, P[L_Q_W], P[L_Q_B], N, C, Q, false));
        TRY(cllm_linear_forward(k.p, kv->ln, P[L_K_W], P[L_K_B], N, C, K, false));
        TRY(cllm_linear_forward(v.p, kv->ln, P[L_V_W], P[L_V_B], N, C, K, false));
        /* rope_apply takes row t's angles from row t of the table it is given:
         * starting the tables at row pos rotates row t by position pos + t. */
        size_t off = (size_t)kv->pos * (HS / 2);
        cllm_rope_apply(q.p, kv->rope_cos + off, kv->rope_sin + off, kv->B, n, c->n_head, HS, Q, HS, 1);
        cllm_rope_apply(k.p, kv->rope_cos + off, kv->rope_sin + off, kv->B, n, c->n_kv_head, HS, K, HS, 1);
    } else {
        TRY(cllm_linear_forward(kv->qkv, kv->ln, P[L_QKV_W], P[L_QKV_B], N, C, 3 * C, in_out));
    }
    cache_append(kv->kc, k, kv, l, n);
    cache_append(kv->vc, v, kv, l, n);
    size_t layer_off = (size_t)l * kv->B * c->n_kv_head * kv->S * HS;
    cllm_attention_forward_cached((cllm_view){kv->atty, Q, HS}, (cllm_cview){q.p, q.rs, q.hs}, kv->kc + layer_off,
                                  kv->vc + layer_off, c->arch == CLLM_ARCH_BLOOM ? kv->alibi : NULL, kv->B, n,
                                  kv->pos, kv->S, c->n_head, c->n_kv_head, HS, 1.0f / sqrtf((float)HS));
    TRY(cllm_linear_forward(kv->x1, kv->atty, P[L_O_W], P[L_O_B], N, Q, C, in_out));
    cllm_add(kv->x1, kv->x1, kv->x, (long)N * C);

    norm(c, kv->ln, kv->mean, kv->rstd, kv->x1, P[L_LN2_W], P[L_LN2_B], N);
    TRY(cllm_linear_forward(kv->fc, kv->ln, P[L_FC_W], P[L_FC_B], N, C, F, in_out));
    if (c->arch == CLLM_ARCH_LLAMA) {
        TRY(cllm_linear_forward(kv->up, kv->ln, P[L_UP_W], P[L_UP_B], N, C, F, false));
        cllm_swiglu_forward(kv->act, kv->fc, kv->up, (long)N * F);
    } else {
        cllm_gelu_forward(kv->act, kv->fc, (long)N * F);
    }
    TRY(cllm_linear_forward(kv->x, kv->act, P[L_DOWN_W], P[L_DOWN_B], N, F, C, in_out));
    cllm_add(kv->x, kv->x, kv->x1, (long)N * C);
    return CLLM_OK;
}

cllm_status cllm_kv_cache_forward(cllm_kv_cache *kv, const int32_t *tokens, int n, float *logits) {
    const cllm_model *m = kv->m;
    const cllm_model_config *c = &m->cfg;
    int B = kv->B, C = c->n_embd, V = c->vocab_size, N = B * n;
    if (n < 1 || n > kv->chunk)
        return CLLM_FAIL(CLLM_ERR_ARG, "%d new tokens per sequence; this cache takes 1 to %d per call", n, kv->chunk);
    if (n > kv->S - kv->pos) {
        if (c->n_ctx > 0 && kv->S == c->n_ctx)
            return CLLM_FAIL(CLLM_ERR_ARG,
                             "positions %d..%d exceed the model's limit of %d positions (%s); shorten the prompt or "
                             "generate fewer tokens",
                             kv->pos, kv->pos + n - 1, c->n_ctx,
                             c->arch == CLLM_ARCH_GPT2 ? "n_positions" : "max_position_embeddings");
        return CLLM_FAIL(CLLM_ERR_ARG, "positions %d..%d exceed the cache's %d positions; init a larger cache", kv->pos,
                         kv->pos + n - 1, kv->S);
    }
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return CLLM_FAIL(CLLM_ERR_ARG, "token id %d (sequence %d, new token %d) is outside the vocabulary [0, %d)",
                             tokens[i], i / n, i % n, V);

    const float *wte = param(m, m->gslot[G_WTE]);
    switch (c->arch) {
    case CLLM_ARCH_GPT2: /* wpe rows pos..pos+n-1: row t of each sequence gets wpe[pos + t] */
        cllm_embedding_forward(kv->x, tokens, wte, param(m, m->gslot[G_WPE]) + (size_t)kv->pos * C, N, n, C);
        break;
    case CLLM_ARCH_LLAMA: cllm_embedding_forward(kv->x, tokens, wte, NULL, N, n, C); break;
    default:
        cllm_embedding_forward(kv->ln, tokens, wte, NULL, N, n, C);
        cllm_layernorm_forward(kv->x, kv->mean, kv->rstd, kv->ln, param(m, m->gslot[G_EMB_LN_W]),
                               param(m, m->gslot[G_EMB_LN_B]), N, C, c->norm_eps);
        break;
    }
    for (int l = 0; l < c->n_layer; l++) {
        cllm_status st = block(kv, l, n);
        if (st) return st;
    }
    for (int b = 0; b < B; b++)
        memcpy(kv->last + (size_t)b * C, kv->x + ((size_t)b * n + n - 1) * C, (size_t)C * sizeof(float));
    norm(c, kv->lnf, kv->lmean, kv->lrstd, kv->last, param(m, m->gslot[G_LNF_W]), param(m, m->gslot[G_LNF_B]), B);
    int head = m->gslot[G_HEAD] >= 0 ? m->gslot[G_HEAD] : m->gslot[G_WTE];
    TRY(cllm_linear_forward(logits, kv->lnf, param(m, head), NULL, B, C, V, false));
    kv->pos += n;
    return CLLM_OK;
}
