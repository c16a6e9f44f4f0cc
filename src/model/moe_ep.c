/*
 * Expert parallelism: the experts of every block split over the ranks of an
 * expert-parallel group of P ranks, rank q running experts q*E/P ..
 * (q+1)*E/P - 1 on the rows that every rank of the group routed to them.
 *
 * Forward, per block (moe.c has routed and grouped this rank's rows, so
 * the rows of rank q's experts are contiguous in its grouped order):
 *   1. an all-to-all of the per-expert row counts (E/P ints to each rank);
 *   2. dispatch: an all-to-all of the rows themselves, C floats each;
 *   3. the received rows, in source-major order (rank s's rows for local
 *      expert 0, 1, .., then rank s+1's), permuted to expert-major order so
 *      that each local expert runs one set of GEMMs on all of its rows;
 *   4. the outputs permuted back and returned by the reverse all-to-all
 *      (combine) into the sender's grouped order, where moe.c weights them.
 * Backward: the output gradients of the kept choices travel as the rows
 * did (dispatch direction), each local expert's backward pass accumulates
 * its weight gradients and produces its input gradients, which return by
 * the reverse all-to-all (combine direction). Every rank keeps the
 * received rows and the experts' activations of every block (grown on
 * demand) for the backward pass.
 *
 * The experts' weight gradients then hold the contributions of the whole
 * group's rows on the rank that runs the expert: in a part holding only
 * its own experts (moe_slice.c) the trainer sums them over the ranks
 * holding the same experts; in a model holding every expert the others get
 * zeros, and the data-parallel gradient sum over every rank gives each
 * expert the sum over all rows of all ranks, as one process accumulating
 * the same micro-batches would.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "model_impl.h"

typedef struct {
    size_t cap;                  /* rows the buffers hold */
    int n;                       /* rows received in the last forward */
    int32_t *cnt;                /* [P * E/P] rows from rank s for local expert le */
    float *xr, *h1, *h3, *act;   /* expert-major rows: [n,C], [n,F] x 3 */
} ep_layer;

struct model_moe_ep {
    ep_layer *layer;             /* [n_layer] */
    size_t cap;                  /* rows of the scratch */
    float *rbuf, *ebuf, *dxr;    /* [cap,C]: source-major rows, expert-major rows, input gradients */
    float *dact, *dh1, *dh3;     /* [cap,F] */
};

void model_moe_ep_free(cllm_model *m) {
    struct model_moe_ep *ep = m->ep;
    if (!ep) return;
    for (int l = 0; l < m->cfg.n_layer && ep->layer; l++) {
        free(ep->layer[l].cnt);
        cllm_free(ep->layer[l].xr);
    }
    free(ep->layer);
    cllm_free(ep->rbuf);
    free(ep);
    m->ep = NULL;
}

/* Grows a block's buffers to n rows (one allocation: xr, h1, h3, act). */
static cllm_status grow_layer(const cllm_model *m, ep_layer *L, size_t n) {
    const size_t C = (size_t)m->cfg.n_embd, F = (size_t)m->cfg.n_inner;
    if (n <= L->cap) return CLLM_OK;
    n += n / 4 + 16;
    float *b = cllm_alloc(n * (C + 3 * F) * sizeof(float), "expert-parallel rows");
    if (!b) return CLLM_ERR_NOMEM;
    cllm_free(L->xr);
    L->xr = b;
    L->h1 = b + n * C;
    L->h3 = L->h1 + n * F;
    L->act = L->h3 + n * F;
    L->cap = n;
    return CLLM_OK;
}

static cllm_status grow_scratch(const cllm_model *m, struct model_moe_ep *ep, size_t n) {
    const size_t C = (size_t)m->cfg.n_embd, F = (size_t)m->cfg.n_inner;
    if (n <= ep->cap) return CLLM_OK;
    n += n / 4 + 16;
    float *b = cllm_alloc(n * (3 * C + 3 * F) * sizeof(float), "expert-parallel scratch");
    if (!b) return CLLM_ERR_NOMEM;
    cllm_free(ep->rbuf);
    ep->rbuf = b;
    ep->ebuf = b + n * C;
    ep->dxr = ep->ebuf + n * C;
    ep->dact = ep->dxr + n * C;
    ep->dh1 = ep->dact + n * F;
    ep->dh3 = ep->dh1 + n * F;
    ep->cap = n;
    return CLLM_OK;
}

/* Rows between source-major and expert-major order (width floats each). */
static void permute(float *dst, const float *src, const int32_t *cnt, int P, int El, size_t width, bool to_expert) {
    size_t cur[1024], at = 0;
    for (int le = 0; le < El; le++) {
        cur[le] = at;
        for (int s = 0; s < P; s++) at += (size_t)cnt[s * El + le];
    }
    size_t sm = 0;
    for (int s = 0; s < P; s++)
        for (int le = 0; le < El; le++) {
            size_t n = (size_t)cnt[s * El + le], em = cur[le];
            if (n) {
                if (to_expert) memcpy(dst + em * width, src + sm * width, n * width * sizeof(float));
                else memcpy(dst + sm * width, src + em * width, n * width * sizeof(float));
            }
            cur[le] += n;
            sm += n;
        }
}

/* Byte counts of the row exchange: what this rank sends to each rank (its
 * grouped rows of that rank's experts) and receives from each. */
static void row_counts(const cllm_model *m, const int32_t *off, const int32_t *cnt, size_t *send, size_t *recv) {
    const int P = m->ep_size, El = m->cfg.n_experts / P;
    const size_t row = (size_t)m->cfg.n_embd * sizeof(float);
    for (int q = 0; q < P; q++) {
        send[q] = (size_t)(off[(q + 1) * El] - off[q * El]) * row;
        size_t n = 0;
        for (int le = 0; le < El; le++) n += (size_t)cnt[q * El + le];
        recv[q] = n * row;
    }
}

/* Rows of each local expert (from every rank) and where they start in
 * expert-major order. */
static void expert_rows(const ep_layer *L, int P, int El, int *n, size_t *start) {
    size_t at = 0;
    for (int le = 0; le < El; le++) {
        n[le] = 0;
        for (int s = 0; s < P; s++) n[le] += L->cnt[s * El + le];
        start[le] = at;
        at += (size_t)n[le];
    }
}

/* The tensor offset of this rank's local expert le from its block's first
 * expert: le in a part that holds only its own experts, its global index
 * in a model that holds them all. */
static int local_index(const cllm_model *m, int El, int le) { return m->ep_held ? le : m->ep_rank * El + le; }

cllm_status model_moe_ep_forward(const cllm_model *m, model_lp_scratch *lp, int l, const int32_t *off,
                                 const float *xs, float *eo) {
    struct model_moe_ep *ep = m->ep;
    const int P = m->ep_size, E = m->cfg.n_experts, El = E / P, C = m->cfg.n_embd, F = m->cfg.n_inner;
    ep_layer *L = &ep->layer[l];
    size_t sc[1024], rc[1024]; /* P <= E <= 1024 */
    int32_t mine[1024];
    for (int e = 0; e < E; e++) mine[e] = off[e + 1] - off[e];
    for (int q = 0; q < P; q++) sc[q] = rc[q] = (size_t)El * sizeof(int32_t);
    cllm_status st = cllm_dist_g_alltoallv(m->ep_grp, mine, sc, L->cnt, rc);
    if (st) return cllm_fail_context(st, "expert-parallel counts of block %d", l);
    size_t n = 0;
    for (int i = 0; i < P * El; i++) n += (size_t)L->cnt[i];
    if ((st = grow_layer(m, L, n)) || (st = grow_scratch(m, ep, n))) return st;
    L->n = (int)n;
    row_counts(m, off, L->cnt, sc, rc);
    if ((st = cllm_dist_g_alltoallv(m->ep_grp, xs, sc, ep->rbuf, rc)))
        return cllm_fail_context(st, "expert-parallel dispatch of block %d", l);
    permute(L->xr, ep->rbuf, L->cnt, P, El, (size_t)C, true);
    int rows[1024];
    size_t r0[1024];
    expert_rows(L, P, El, rows, r0);
    for (int le = 0; le < El; le++) {
        size_t oc = r0[le] * (size_t)C, of = r0[le] * (size_t)F;
        if (rows[le] && (st = model_moe_expert_forward(m, lp, l, local_index(m, El, le), rows[le], L->xr + oc,
                                                       L->h1 + of, L->h3 + of, L->act + of, ep->ebuf + oc)))
            return st;
    }
    permute(ep->rbuf, ep->ebuf, L->cnt, P, El, (size_t)C, false);
    if ((st = cllm_dist_g_alltoallv(m->ep_grp, ep->rbuf, rc, eo, sc)))
        return cllm_fail_context(st, "expert-parallel combine of block %d", l);
    return CLLM_OK;
}

cllm_status model_moe_ep_backward(cllm_model *m, int l, const int32_t *off, const float *deo, float *dxs) {
    struct model_moe_ep *ep = m->ep;
    const int P = m->ep_size, El = m->cfg.n_experts / P, C = m->cfg.n_embd, F = m->cfg.n_inner;
    ep_layer *L = &ep->layer[l];
    size_t sc[1024], rc[1024];
    row_counts(m, off, L->cnt, sc, rc);
    cllm_status st = cllm_dist_g_alltoallv(m->ep_grp, deo, sc, ep->rbuf, rc);
    if (st) return cllm_fail_context(st, "expert-parallel gradient dispatch of block %d", l);
    permute(ep->ebuf, ep->rbuf, L->cnt, P, El, (size_t)C, true);
    int rows[1024];
    size_t r0[1024];
    expert_rows(L, P, El, rows, r0);
    for (int le = 0; le < El; le++) {
        size_t oc = r0[le] * (size_t)C, of = r0[le] * (size_t)F;
        if (rows[le] && (st = model_moe_expert_backward(m, l, local_index(m, El, le), rows[le], ep->ebuf + oc,
                                                        L->xr + oc, L->h1 + of, L->h3 + of, L->act + of,
                                                        ep->dact + of, ep->dh1 + of, ep->dh3 + of, ep->dxr + oc)))
            return st;
    }
    permute(ep->rbuf, ep->dxr, L->cnt, P, El, (size_t)C, false);
    if ((st = cllm_dist_g_alltoallv(m->ep_grp, ep->rbuf, rc, dxs, sc)))
        return cllm_fail_context(st, "expert-parallel gradient combine of block %d", l);
    return CLLM_OK;
}

/* ------------------------------------------------------------ settings */

cllm_status cllm_model_set_expert_parallel(cllm_model *m, const cllm_dist_group *g, int rank, int size) {
    const int E = m->cfg.n_experts;
    if (size < 1 || rank < 0 || rank >= size)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert-parallel rank %d of %d", rank, size);
    if (size > 1 && !E)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert_parallel_size %d: the model has no experts (not a mixture of experts)",
                         size);
    if (size > 1 && E % size)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert_parallel_size %d does not divide the model's %d experts "
                         "(num_local_experts)", size, E);
    if (size > 1 && cllm_dist_group_size(g) != size)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert_parallel_size %d over a group of %d ranks", size,
                         cllm_dist_group_size(g));
    if (m->ep_held && (size * m->ep_held != E || rank * m->ep_held != m->ep_first))
        return CLLM_FAIL(CLLM_ERR_ARG, "this model holds experts %d..%d of %d only: it runs as rank %d of %d of an "
                         "expert-parallel group, not as rank %d of %d", m->ep_first, m->ep_first + m->ep_held - 1, E,
                         m->ep_first / m->ep_held, E / m->ep_held, rank, size);
    if (size > 1 && m->tp_size > 1)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "expert parallelism with tensor parallelism: not supported");
    if (size > 1 && !m->ep) {
        struct model_moe_ep *ep = calloc(1, sizeof *ep);
        if (!ep || !(ep->layer = calloc((size_t)m->cfg.n_layer, sizeof *ep->layer))) {
            free(ep);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        m->ep = ep;
        for (int l = 0; l < m->cfg.n_layer; l++)
            if (!(ep->layer[l].cnt = calloc((size_t)E, sizeof(int32_t)))) {
                model_moe_ep_free(m);
                return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            }
    }
    m->ep_grp = size > 1 ? g : NULL;
    m->ep_rank = size > 1 ? rank : 0;
    m->ep_size = size;
    return CLLM_OK;
}

int cllm_model_expert_parallel_size(const cllm_model *m) { return m->ep_size > 1 ? m->ep_size : 1; }

cllm_status cllm_model_set_moe_capacity(cllm_model *m, double capacity_factor, int min_capacity) {
    if (!(capacity_factor >= 0) || min_capacity < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "capacity factor %g, min_capacity %d (expected >= 0)", capacity_factor,
                         min_capacity);
    m->moe_capacity_factor = capacity_factor;
    m->moe_min_capacity = min_capacity;
    return CLLM_OK;
}

cllm_status cllm_model_moe_reset_counters(cllm_model *m) {
    const int E = m->cfg.n_experts;
    if (!E) return CLLM_OK;
    if (!m->moe_load && !(m->moe_load = calloc((size_t)E + 2, sizeof *m->moe_load)))
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memset(m->moe_load, 0, ((size_t)E + 2) * sizeof *m->moe_load);
    return CLLM_OK;
}

const int64_t *cllm_model_moe_counters(const cllm_model *m) { return m->moe_load; }
