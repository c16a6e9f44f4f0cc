/*
 * Expert-parallel parts of a Mixtral: the model that one rank of an
 * expert-parallel group of P ranks holds, with every non-expert tensor
 * (attention, norms, the router of all E experts, embeddings, head) and only
 * its own experts q*E/P .. (q+1)*E/P - 1 of every block, under their global
 * names. Every part of a group has the same layout (the same shapes at the
 * same offsets): local expert le of part q is global expert q*E/P + le. The
 * whole model's buffers are cut into parts (loading a checkpoint) and put
 * back together from them on a group's first rank (saving one).
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "model_impl.h"

static const int kinds[3] = {L_EXP_W1, L_EXP_W3, L_EXP_W2};

/* The layout of cfg with experts first..first+held-1 (held 0: all) and
 * zeroed parameters. */
static cllm_status layout_like(cllm_model **out, const cllm_model *src, int first, int held) {
    *out = NULL;
    cllm_model *m = calloc(1, sizeof *m);
    if (!m) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    m->cfg = src->cfg;
    m->ep_first = first;
    m->ep_held = held;
    cllm_status st = CLLM_OK;
    if (!(m->config_json = json_deep_copy(src->config_json))) st = CLLM_FAIL(CLLM_ERR_NOMEM, "cannot copy config");
    if (!st) st = model_build_layout(m);
    if (!st && !(m->params = cllm_calloc(m->n_params ? m->n_params : 1, sizeof(float), "model parameters")))
        st = CLLM_ERR_NOMEM;
    if (st) {
        cllm_model_free(m);
        return st;
    }
    m->expert_layout = src->expert_layout;
    *out = m;
    return CLLM_OK;
}

/* The whole model's tensor index of tensor i of a part as group rank q holds it. */
static int whole_index(const cllm_model *whole, const cllm_model *part, int i, int q) {
    const int El = part->ep_held;
    for (int l = 0; l < part->cfg.n_layer; l++)
        for (int k = 0; k < 3; k++) {
            const int first = part->lslot[l][kinds[k]];
            if (i >= first && i < first + El) return whole->lslot[l][kinds[k]] + q * El + (i - first);
        }
    const cllm_tensor_info *t = cllm_model_find_tensor(whole, part->tensors[i].name);
    return t ? (int)(t - whole->tensors) : -1;
}


/* part_buf <-> full_buf for the tensors of group rank q's part (experts
 * only when experts_only). */
static void copy_part(const cllm_model *whole, const cllm_model *part, int q, float *part_buf, float *full_buf,
                      bool to_part, bool experts_only) {
    for (int i = 0; i < part->n_tensors; i++) {
        if (experts_only && !cllm_moe_tensor_is_expert(part, i)) continue;
        const int w = whole_index(whole, part, i, q);
        const cllm_tensor_info *pt = &part->tensors[i], *wt = &whole->tensors[w];
        if (to_part) memcpy(part_buf + pt->offset, full_buf + wt->offset, pt->numel * sizeof(float));
        else memcpy(full_buf + wt->offset, part_buf + pt->offset, pt->numel * sizeof(float));
    }
}

cllm_status cllm_moe_model_part(cllm_model **out, const cllm_model *full, int P, int q) {
    *out = NULL;
    const int E = full->cfg.n_experts;
    if (!E) return CLLM_FAIL(CLLM_ERR_ARG, "expert_parallel_size %d: the model has no experts (not a mixture of "
                             "experts)", P);
    if (P < 1 || q < 0 || q >= P || E % P)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert_parallel_size %d does not divide the model's %d experts "
                         "(num_local_experts)", P, E);
    if (full->ep_held) return CLLM_FAIL(CLLM_ERR_ARG, "an expert-parallel part cut again");
    if (!full->params) return CLLM_FAIL(CLLM_ERR_ARG, "an expert-parallel part of a model without parameters");
    cllm_model *m;
    cllm_status st = layout_like(&m, full, q * (E / P), E / P);
    if (st) return st;
    for (int i = 0; i < m->n_tensors; i++)
        if (whole_index(full, m, i, q) < 0 ||
            full->tensors[whole_index(full, m, i, q)].numel != m->tensors[i].numel) {
            cllm_model_free(m);
            return CLLM_FAIL(CLLM_ERR_INTERNAL, "expert-parallel part: tensor %s has no counterpart",
                             m->tensors[i].name);
        }
    copy_part(full, m, q, m->params, full->params, true, false);
    *out = m;
    return CLLM_OK;
}

cllm_status cllm_moe_model_whole(cllm_model **out, const cllm_model *part) {
    return layout_like(out, part, 0, 0);
}

int cllm_moe_model_experts_held(const cllm_model *m, int *first) {
    if (first) *first = m->ep_held ? m->ep_first : 0;
    return m->ep_held ? m->ep_held : m->cfg.n_experts;
}

size_t cllm_moe_model_expert_params(const cllm_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (cllm_moe_tensor_is_expert(m, i)) n += m->tensors[i].numel;
    return n;
}

bool cllm_moe_tensor_is_expert(const cllm_model *m, int i) {
    if (!m->cfg.n_experts) return false;
    const int held = m->ep_held ? m->ep_held : m->cfg.n_experts;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int k = 0; k < 3; k++) {
            const int first = m->lslot[l][kinds[k]];
            if (i >= first && i < first + held) return true;
        }
    return false;
}

void cllm_moe_cut_buffer(const cllm_model *whole, const cllm_model *part, const float *full_buf, float *part_buf) {
    copy_part(whole, part, part->ep_first / part->ep_held, part_buf, (float *)full_buf, true, false);
}

cllm_status cllm_moe_gather_buffer(const cllm_model *whole, const cllm_model *part, const cllm_dist_group *g,
                                   const float *part_buf, float *full_buf) {
    const int P = cllm_dist_group_size(g), me = cllm_dist_group_rank(g);
    const size_t n = cllm_model_buffer_len(part);
    if (part->ep_held * P != part->cfg.n_experts)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "expert-parallel gather: a part of %d experts over %d ranks",
                         part->ep_held, P);
    float *tmp = me == 0 ? cllm_alloc(n * sizeof(float), "expert-parallel gather") : NULL;
    if (me == 0 && !tmp) return CLLM_ERR_NOMEM;
    if (me == 0 && full_buf) copy_part(whole, part, 0, (float *)part_buf, full_buf, false, false);
    /* one part at a time to the group's first rank (the others hold only
     * their own): an all-to-all in which only rank s sends, to rank 0 */
    size_t *sc = calloc(2 * (size_t)P, sizeof *sc), *rc = sc ? sc + P : NULL;
    cllm_status st = sc ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    const size_t chunk = (size_t)1 << 28; /* floats per call: the all-to-all's buffers stay under INT_MAX bytes */
    for (int s = 1; s < P && !st; s++) {
        for (size_t b = 0; b < n && !st; b += chunk) {
            const size_t k = n - b < chunk ? n - b : chunk;
            memset(sc, 0, 2 * (size_t)P * sizeof *sc);
            if (me == s) sc[0] = k * sizeof(float);
            if (me == 0) rc[s] = k * sizeof(float);
            st = cllm_dist_g_alltoallv(g, part_buf + b, sc, tmp ? tmp + b : NULL, rc);
        }
        if (!st && me == 0 && full_buf) copy_part(whole, part, s, tmp, full_buf, false, true);
    }
    free(sc);
    cllm_free(tmp);
    return st;
}
