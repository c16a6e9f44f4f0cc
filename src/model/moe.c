/*
 * Mixtral's sparse mixture-of-experts FFN, in place of a block's dense FFN.
 *
 * For each of the N rows h of the block's second norm:
 *   p = softmax(router h)                      (fp32, over E experts)
 *   the k largest p (ties: the lower expert index, as torch.topk), their
 *   weights renormalised to sum 1: w_j = p_j / sum_i p_i
 *   out = sum_j w_j * expert_j(h),  expert(h) = w2(silu(w1 h) * w3 h)
 * The rows are grouped per expert (a counting sort of the N*k choices): the
 * rows routed to expert e are gathered into one contiguous [n_e, C] slice,
 * its three linear layers run on that slice alone through the model's
 * linear seam (precision, quantisation), and the outputs are combined back
 * per row in a fixed order. No expert ever computes a row not routed to it.
 * With a capacity (cllm_model_set_moe_capacity) an expert keeps only its
 * first choices in DeepSpeed's order; a dropped choice has no position in
 * the grouped order (pos -1) and adds nothing to its row. Under expert
 * parallelism (moe_ep.c) the grouped rows of other ranks' experts travel
 * to them and back between the gather and the combine.
 *
 * The backward pass mirrors it: the combine's gradient per choice (w_j dy
 * to the expert's output rows; dy . expert output to w_j), each expert's
 * three linear backward passes on its slice, a scatter-add of the gathered
 * input gradient, and the router's gradient through the renormalisation
 * and the softmax (the top-k selection is a constant, as in autograd), plus
 * the load-balancing loss's gradient when it is part of the loss.
 *
 * Load-balancing loss (transformers' load_balancing_loss_func): over the R
 * rows of every layer's router together (R = n_layer * N),
 *   aux = E * sum_e f_e * P_e,  f_e = (choices of e) / R,  P_e = mean p_e
 * f is piecewise constant, so d aux / d p[r, e] = E * f_e / R.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cllm/kernels.h"
#include "model_impl.h"

/* One block's saved state, carved from a->moe (R = N*k choices). */
typedef struct {
    float *probs;   /* [N,E] router softmax */
    int32_t *sel;   /* [N,k] chosen experts, in descending probability */
    float *wsel;    /* [N,k] their renormalised weights */
    int32_t *pos;   /* [N,k] where choice (n,j) sits in the grouped order */
    int32_t *rowof; /* [R] the row of each grouped position */
    int32_t *off;   /* [E+1] expert e's grouped rows are off[e]..off[e+1]-1 */
    float *xs;      /* [R,C] gathered inputs */
    float *h1, *h3; /* [R,F] gate and up projections */
    float *act;     /* [R,F] silu(h1) * h3 */
    float *eo;      /* [R,C] expert outputs */
} moe_state;

/* Backward scratch and statistics, carved from m->moe_scratch. */
typedef struct {
    double *stats;  /* [2E+1]: choices per expert, summed probabilities, rows */
    float *deo;     /* [R,C] */
    float *dact, *dh1, *dh3; /* [R,F] */
    float *dxs;     /* [R,C] */
    float *dlogits; /* [N,E] */
    float *dw;      /* [N,k] */
} moe_scratch;

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Carves the state from base (NULL: measures); returns floats used. */
static size_t state_carve(const cllm_model_config *c, size_t N, float *base, moe_state *s) {
    size_t E = (size_t)c->n_experts, k = (size_t)c->n_experts_per_tok, C = (size_t)c->n_embd, F = (size_t)c->n_inner;
    size_t R = N * k, u = 0;
#define PART(field, type, n)                                         \
    do {                                                             \
        s->field = base ? (type *)(void *)(base + u) : NULL;         \
        u += up16(n);                                                \
    } while (0)
    PART(probs, float, N * E);
    PART(sel, int32_t, R);
    PART(wsel, float, R);
    PART(pos, int32_t, R);
    PART(rowof, int32_t, R);
    PART(off, int32_t, E + 1);
    PART(xs, float, R * C);
    PART(h1, float, R * F);
    PART(h3, float, R * F);
    PART(act, float, R * F);
    PART(eo, float, R * C);
    return u;
}

static size_t scratch_carve(const cllm_model_config *c, size_t N, bool train, float *base, moe_scratch *s) {
    size_t E = (size_t)c->n_experts, k = (size_t)c->n_experts_per_tok, C = (size_t)c->n_embd, F = (size_t)c->n_inner;
    size_t R = N * k, u = 0;
    PART(stats, double, 2 * (2 * E + 1));
    if (!train) {
        s->deo = s->dact = s->dh1 = s->dh3 = s->dxs = s->dlogits = s->dw = NULL;
        return u;
    }
    PART(deo, float, R * C);
    PART(dact, float, R * F);
    PART(dh1, float, R * F);
    PART(dh3, float, R * F);
    PART(dxs, float, R * C);
    PART(dlogits, float, N * E);
    PART(dw, float, R);
#undef PART
    return u;
}

size_t model_moe_act_floats(const cllm_model_config *c, size_t N) {
    moe_state s;
    return c->n_experts ? state_carve(c, N, NULL, &s) : 0;
}

size_t model_moe_scratch_floats(const cllm_model_config *c, size_t N, bool train) {
    moe_scratch s;
    return c->n_experts ? scratch_carve(c, N, train, NULL, &s) : 0;
}

void model_moe_layout(cllm_model *m, int l, model_add_fn add, size_t *offset) {
    const cllm_model_config *c = &m->cfg;
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.gate.weight", l);
    add(m, name, L_ROUTER_W, l, c->n_experts, c->n_embd, false, offset);
    /* all w1, then all w3, then all w2: expert e's tensor is the first + e */
    static const struct {
        int slot;
        const char *w;
    } kinds[] = {{L_EXP_W1, "w1"}, {L_EXP_W3, "w3"}, {L_EXP_W2, "w2"}};
    const int e0 = m->ep_held ? m->ep_first : 0, e1 = m->ep_held ? e0 + m->ep_held : c->n_experts;
    for (int i = 0; i < 3; i++)
        for (int e = e0; e < e1; e++) {
            snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, kinds[i].w);
            bool down = kinds[i].slot == L_EXP_W2;
            add(m, name, kinds[i].slot, l, down ? c->n_embd : c->n_inner, down ? c->n_inner : c->n_embd, false,
                offset);
        }
}

void model_moe_begin(cllm_model *m) {
    if (!m->cfg.n_experts || !m->moe_stats) return;
    memset(m->moe_stats, 0, (2 * (size_t)m->cfg.n_experts + 1) * sizeof(double));
}

double model_moe_aux(const cllm_model *m) {
    const int E = m->cfg.n_experts;
    if (!E || !m->moe_stats || m->moe_stats[2 * E] <= 0) return 0;
    const double *st = m->moe_stats, R = st[2 * E];
    double sum = 0;
    for (int e = 0; e < E; e++) sum += (st[e] / R) * (st[E + e] / R);
    return E * sum;
}

double cllm_model_aux_loss(const cllm_model *m) { return model_moe_aux(m); }

/* Softmax of each router row and its top-k choices, renormalised. */
static void route(const cllm_model_config *c, const moe_state *s, int N) {
    const int E = c->n_experts, k = c->n_experts_per_tok;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = s->probs + (size_t)n * E;
        float mx = p[0];
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        float sum = 0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        int32_t *sel = s->sel + (size_t)n * k;
        float *w = s->wsel + (size_t)n * k, tot = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= sel[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e; /* ties keep the lower index */
            }
            sel[j] = best;
            w[j] = p[best];
            tot += p[best];
        }
        for (int j = 0; j < k; j++) w[j] /= tot;
    }
}

/* Expert capacity of a pass over N rows (DeepSpeed-MoE's rule):
 * ceil(N * k / E * capacity_factor), at least min_capacity; no limit when
 * the factor is 0 (transformers' Mixtral, every choice computed). */
int model_moe_capacity(const cllm_model *m, int N) {
    const cllm_model_config *c = &m->cfg;
    if (m->moe_capacity_factor <= 0) return N * c->n_experts_per_tok;
    double v = ceil((double)N * c->n_experts_per_tok / c->n_experts * m->moe_capacity_factor);
    int cap = v > (double)N * c->n_experts_per_tok ? N * c->n_experts_per_tok : (int)v;
    return cap < m->moe_min_capacity ? m->moe_min_capacity : cap;
}

/* Groups the kept choices by expert (stable: rows in order within one).
 * With a capacity, expert e keeps its first `cap` choices in DeepSpeed's
 * order: every row's first choice before any second choice, rows in
 * order within a rank of choice; a dropped choice gets pos -1. Returns the
 * number dropped. */
static int group(const cllm_model *m, const moe_state *s, int N) {
    const cllm_model_config *c = &m->cfg;
    const int E = c->n_experts, k = c->n_experts_per_tok, R = N * k, cap = model_moe_capacity(m, N);
    int32_t used[1024] = {0};
    int dropped = 0;
    for (int j = 0; j < k; j++)
        for (int n = 0; n < N; n++) {
            int r = n * k + j, e = s->sel[r];
            if (used[e] < cap) {
                used[e]++;
                s->pos[r] = 0;
            } else {
                s->pos[r] = -1;
                dropped++;
            }
        }
    memset(s->off, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int r = 0; r < R; r++)
        if (s->pos[r] >= 0) s->off[s->sel[r] + 1]++;
    for (int e = 0; e < E; e++) s->off[e + 1] += s->off[e];
    int32_t fill[1024];
    memcpy(fill, s->off, (size_t)E * sizeof(int32_t));
    for (int r = 0; r < R; r++) {
        if (s->pos[r] < 0) continue;
        int p = fill[s->sel[r]]++;
        s->pos[r] = p;
        s->rowof[p] = r / k;
    }
    return dropped;
}

cllm_status model_moe_expert_forward(const cllm_model *m, model_lp_scratch *lp, int l, int e, int n, const float *x,
                                     float *h1, float *h3, float *act, float *eo) {
    const cllm_model_config *c = &m->cfg;
    const int C = c->n_embd, F = c->n_inner, *sl = m->lslot[l];
    cllm_status st;
    if ((st = model_linear_forward(m, lp, h1, x, sl[L_EXP_W1] + e, NULL, n, C, F, false))) return st;
    if ((st = model_linear_forward(m, lp, h3, x, sl[L_EXP_W3] + e, NULL, n, C, F, false))) return st;
    cllm_swiglu_forward(act, h1, h3, (long)n * F);
    return model_linear_forward(m, lp, eo, act, sl[L_EXP_W2] + e, NULL, n, F, C, false);
}

cllm_status model_moe_expert_backward(cllm_model *m, int l, int e, int n, const float *deo, const float *x,
                                      const float *h1, const float *h3, const float *act, float *dact, float *dh1,
                                      float *dh3, float *dx) {
    const cllm_model_config *c = &m->cfg;
    const int C = c->n_embd, F = c->n_inner, *sl = m->lslot[l];
    const int w1 = sl[L_EXP_W1] + e, w3 = sl[L_EXP_W3] + e, w2 = sl[L_EXP_W2] + e;
    model_lp_scratch *lp = &m->lp_run;
    memset(dact, 0, (size_t)n * F * sizeof(float));
    memset(dh1, 0, (size_t)n * F * sizeof(float));
    memset(dh3, 0, (size_t)n * F * sizeof(float));
    memset(dx, 0, (size_t)n * C * sizeof(float));
    cllm_status st = model_linear_backward(m, lp, dact, model_grad(m, w2), NULL, deo, act, model_param(m, w2), n, F,
                                           C, false);
    if (st) return st;
    cllm_swiglu_backward(dh1, dh3, dact, h1, h3, (long)n * F);
    st = model_linear_backward(m, lp, dx, model_grad(m, w1), NULL, dh1, x, model_param(m, w1), n, C, F, false);
    if (st) return st;
    return model_linear_backward(m, lp, dx, model_grad(m, w3), NULL, dh3, x, model_param(m, w3), n, C, F, false);
}

cllm_status model_moe_forward(const cllm_model *m, model_lp_scratch *lp, int l, const layer_acts *a, float *out, int N,
                              bool stats) {
    const cllm_model_config *c = &m->cfg;
    const int E = c->n_experts, k = c->n_experts_per_tok, C = c->n_embd, F = c->n_inner;
    const int *sl = m->lslot[l];
    moe_state s;
    cllm_status st;
    state_carve(c, (size_t)N, a->moe, &s);
    if ((st = model_linear_forward(m, lp, s.probs, a->ln2, sl[L_ROUTER_W], NULL, N, C, E, false))) return st;
    route(c, &s, N);
    const int dropped = group(m, &s, N), R = N * k, kept = s.off[E];
#pragma omp parallel for schedule(static)
    for (int p = 0; p < kept; p++)
        memcpy(s.xs + (size_t)p * C, a->ln2 + (size_t)s.rowof[p] * C, (size_t)C * sizeof(float));
    if (m->ep_size > 1) { /* the rows travel to the ranks holding their experts and back (moe_ep.c) */
        if ((st = model_moe_ep_forward(m, lp, l, s.off, s.xs, s.eo))) return st;
    } else {
        for (int e = 0; e < E; e++) {
            int r0 = s.off[e], n = s.off[e + 1] - r0;
            if (!n) continue;
            size_t oc = (size_t)r0 * C, of = (size_t)r0 * F;
            st = model_moe_expert_forward(m, lp, l, e, n, s.xs + oc, s.h1 + of, s.h3 + of, s.act + of, s.eo + oc);
            if (st) return st;
        }
    }
    if (out) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *y = out + (size_t)n * C;
            memset(y, 0, (size_t)C * sizeof(float));
            for (int j = 0; j < k; j++) {
                const int p = s.pos[(size_t)n * k + j];
                if (p < 0) continue; /* dropped: no expert output */
                const float w = s.wsel[(size_t)n * k + j], *eo = s.eo + (size_t)p * C;
                for (int i = 0; i < C; i++) y[i] += w * eo[i];
            }
        }
    }
    if (stats && m->moe_stats) {
        double *sum = m->moe_stats;
        for (int r = 0; r < R; r++) sum[s.sel[r]] += 1;
        for (int n = 0; n < N; n++)
            for (int e = 0; e < E; e++) sum[E + e] += s.probs[(size_t)n * E + e];
        sum[2 * E] += N;
    }
    if (stats && m->moe_load) {
        for (int r = 0; r < R; r++) m->moe_load[s.sel[r]]++;
        m->moe_load[E] += dropped;
        m->moe_load[E + 1] += R;
    }
    return CLLM_OK;
}

cllm_status model_moe_backward(cllm_model *m, int l, const layer_acts *a, float *dln, const float *dy, int N,
                               double aux_scale) {
    const cllm_model_config *c = &m->cfg;
    const int E = c->n_experts, k = c->n_experts_per_tok, C = c->n_embd, F = c->n_inner, R = N * k;
    const int *sl = m->lslot[l];
    model_lp_scratch *lp = &m->lp_run;
    moe_state s;
    moe_scratch z;
    (void)F;
    cllm_status st;
    state_carve(c, (size_t)N, a->moe, &s);
    scratch_carve(c, (size_t)N, true, m->moe_scratch, &z);

    /* combine: out[n] = sum_j w[n,j] eo[pos[n,j]] over the kept choices */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        if (s.pos[r] < 0) {
            z.dw[r] = 0;
            continue;
        }
        const float *g = dy + (size_t)(r / k) * C, *eo = s.eo + (size_t)s.pos[r] * C;
        float *de = z.deo + (size_t)s.pos[r] * C, w = s.wsel[r];
        double dot = 0;
        for (int i = 0; i < C; i++) {
            de[i] = w * g[i];
            dot += (double)g[i] * eo[i];
        }
        z.dw[r] = (float)dot;
    }
    /* experts, each on its own rows */
    if (m->ep_size > 1) {
        if ((st = model_moe_ep_backward(m, l, s.off, z.deo, z.dxs))) return st;
    } else {
        for (int e = 0; e < E; e++) {
            int r0 = s.off[e], n = s.off[e + 1] - r0;
            if (!n) continue;
            size_t oc = (size_t)r0 * C, of = (size_t)r0 * F;
            st = model_moe_expert_backward(m, l, e, n, z.deo + oc, s.xs + oc, s.h1 + of, s.h3 + of, s.act + of,
                                           z.dact + of, z.dh1 + of, z.dh3 + of, z.dxs + oc);
            if (st) return st;
        }
    }
    /* router: through the renormalisation, the aux loss and the softmax */
    const double *sum = m->moe_stats;
    const double rows = sum ? sum[2 * E] : 0;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *g = dln + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int p = s.pos[(size_t)n * k + j];
            if (p < 0) continue;
            const float *dx = z.dxs + (size_t)p * C;
            for (int i = 0; i < C; i++) g[i] += dx[i];
        }
        const float *p = s.probs + (size_t)n * E;
        const int32_t *sel = s.sel + (size_t)n * k;
        const float *dw = z.dw + (size_t)n * k;
        float *dl = z.dlogits + (size_t)n * E;
        double S = 0, wdot = 0;
        for (int j = 0; j < k; j++) {
            S += p[sel[j]];
            wdot += (double)dw[j] * p[sel[j]];
        }
        double dp[1024];
        for (int e = 0; e < E; e++)
            dp[e] = aux_scale != 0 && rows > 0 ? aux_scale * E * (sum[e] / rows) / rows : 0;
        for (int j = 0; j < k; j++) dp[sel[j]] += dw[j] / S - wdot / (S * S);
        double pd = 0;
        for (int e = 0; e < E; e++) pd += dp[e] * p[e];
        for (int e = 0; e < E; e++) dl[e] = (float)(p[e] * (dp[e] - pd));
    }
    return model_linear_backward(m, lp, dln, model_grad(m, sl[L_ROUTER_W]), NULL, z.dlogits, a->ln2,
                                 model_param(m, sl[L_ROUTER_W]), N, C, E, false);
}
