/*
 * The two file layouts of a Mixtral's expert tensors (docs/moe.md, "Tensors").
 *
 * Per-expert (transformers 4.x, cllm's own tensor table): per block l
 *   model.layers.l.block_sparse_moe.gate.weight            [E, C]
 *   model.layers.l.block_sparse_moe.experts.e.w1.weight    [F, C]  gate
 *   model.layers.l.block_sparse_moe.experts.e.w3.weight    [F, C]  up
 *   model.layers.l.block_sparse_moe.experts.e.w2.weight    [C, F]  down
 * Fused (transformers 5.x): per block l
 *   model.layers.l.mlp.gate.weight                         [E, C]
 *   model.layers.l.mlp.experts.gate_up_proj                [E, 2F, C]
 *       expert e's w1 in rows 0..F-1, its w3 in rows F..2F-1
 *   model.layers.l.mlp.experts.down_proj                   [E, C, F]
 *
 * The model always holds the per-expert tensors. Loading a fused folder
 * cuts each fused tensor into per-expert views of the file's bytes (no
 * copy: every expert's slice is contiguous) and hands them to the loader's
 * callback as if the file held them; saving in the fused layout
 * (cllm_model_set_expert_layout) concatenates them back. A folder holds
 * one layout: the first expert tensor of either kind fixes it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/core.h"
#include "model_impl.h"

enum { K_ROUTER, K_GATE_UP, K_DOWN };

static const char *layout_name(int layout) {
    return layout == CLLM_EXPERTS_FUSED ? "fused (transformers 5.x: mlp.experts.gate_up_proj)"
                                        : "per-expert (transformers 4.x: block_sparse_moe.experts.N.w1)";
}

bool cllm_expert_layout_from_name(const char *name, cllm_expert_layout *out) {
    if (name && strcmp(name, "per-expert") == 0) *out = CLLM_EXPERTS_PER_EXPERT;
    else if (name && strcmp(name, "fused") == 0) *out = CLLM_EXPERTS_FUSED;
    else return false;
    return true;
}

cllm_status cllm_model_set_expert_layout(cllm_model *m, cllm_expert_layout layout) {
    if (layout != CLLM_EXPERTS_PER_EXPERT && layout != CLLM_EXPERTS_FUSED)
        return CLLM_FAIL(CLLM_ERR_ARG, "unknown expert layout %d", (int)layout);
    if (layout == CLLM_EXPERTS_FUSED && !m->cfg.n_experts)
        return CLLM_FAIL(CLLM_ERR_ARG, "the fused expert layout needs a mixture-of-experts model; this %s model has "
                         "no experts", cllm_arch_name(m->cfg.arch));
    m->expert_layout = layout;
    return CLLM_OK;
}

/* The block and part of an expert tensor name of a file (with or without
 * the "model." prefix): returns the layout it belongs to, or -1. */
static int parse(const cllm_model *m, const char *name, int *layer, int *kind) {
    if (strncmp(name, "model.", 6) == 0) name += 6;
    int l, n = 0;
    if (sscanf(name, "layers.%d.%n", &l, &n) != 1 || n == 0 || l < 0 || l >= m->cfg.n_layer) return -1;
    const char *rest = name + n;
    *layer = l;
    if (strncmp(rest, "block_sparse_moe.", 17) == 0) return CLLM_EXPERTS_PER_EXPERT;
    if (strcmp(rest, "mlp.gate.weight") == 0) *kind = K_ROUTER;
    else if (strcmp(rest, "mlp.experts.gate_up_proj") == 0) *kind = K_GATE_UP;
    else if (strcmp(rest, "mlp.experts.down_proj") == 0) *kind = K_DOWN;
    else return -1;
    return CLLM_EXPERTS_FUSED;
}

/* Expert e's [rows, cols] matrix starting `at` elements into t. */
static cllm_st_tensor view(const cllm_st_tensor *t, size_t at, int64_t rows, int64_t cols) {
    size_t el = cllm_dtype_size(t->dtype);
    cllm_st_tensor v = *t;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.numel = rows * cols;
    v.nbytes = (size_t)v.numel * el;
    v.data = (const unsigned char *)t->data + at * el;
    return v;
}

static cllm_status put_view(const cllm_st_tensor *t, const cllm_st_tensor *v, int idx, model_tensor_fn put, void *ctx,
                            bool *seen) {
    if (seen[idx]) return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' appears twice", t->file, t->name);
    cllm_status st = put(ctx, idx, v);
    if (!st) seen[idx] = true;
    return st;
}

cllm_status model_moe_file_tensor(const cllm_model *m, const cllm_st_tensor *t, model_tensor_fn put, void *ctx,
                                  bool *seen, model_moe_file *f, bool *handled) {
    *handled = false;
    int l = 0, kind = 0, layout = m->cfg.n_experts ? parse(m, t->name, &l, &kind) : -1;
    if (layout < 0) return CLLM_OK;
    if (!f->first[0]) {
        f->layout = (cllm_expert_layout)layout;
        snprintf(f->first, sizeof f->first, "%s", t->name);
    } else if ((int)f->layout != layout) {
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' is in the %s expert layout, but '%s' of the same folder is "
                         "in the %s one: a folder holds one of the two", t->file, t->name, layout_name(layout),
                         f->first, layout_name(f->layout));
    }
    if (layout == CLLM_EXPERTS_PER_EXPERT) return CLLM_OK; /* the model's own names */
    *handled = true;
    const int64_t E = m->cfg.n_experts, C = m->cfg.n_embd, F = m->cfg.n_inner;
    const int64_t want[3][3] = {{E, C, 0}, {E, 2 * F, C}, {E, C, F}};
    const char *dims[3] = {"num_local_experts, hidden_size", "num_local_experts, 2 x intermediate_size, hidden_size",
                           "num_local_experts, hidden_size, intermediate_size"};
    int nd = kind == K_ROUTER ? 2 : 3;
    bool ok = t->dtype != CLLM_U8 && t->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == want[kind][d];
    if (!ok) {
        char got[96] = "";
        size_t len = 0;
        for (int d = 0; d < t->ndim && len < sizeof got - 24; d++)
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        char need[64];
        if (nd == 2)
            snprintf(need, sizeof need, "%lld, %lld", (long long)want[kind][0], (long long)want[kind][1]);
        else
            snprintf(need, sizeof need, "%lld, %lld, %lld", (long long)want[kind][0], (long long)want[kind][1],
                     (long long)want[kind][2]);
        return CLLM_FAIL(CLLM_ERR_FORMAT, "%s: tensor '%s' has shape [%s]%s, the config needs [%s] (%s)", t->file,
                         t->name, got, t->dtype == CLLM_U8 ? " of U8 values" : "", need, dims[kind]);
    }
    const int *slot = m->lslot[l];
    if (kind == K_ROUTER) return put_view(t, t, slot[L_ROUTER_W], put, ctx, seen);
    cllm_status st = CLLM_OK;
    for (int64_t e = 0; e < E && !st; e++) {
        if (kind == K_DOWN) {
            cllm_st_tensor v = view(t, (size_t)(e * C * F), C, F);
            st = put_view(t, &v, slot[L_EXP_W2] + (int)e, put, ctx, seen);
            continue;
        }
        cllm_st_tensor w1 = view(t, (size_t)(e * 2 * F * C), F, C), w3 = view(t, (size_t)((e * 2 + 1) * F * C), F, C);
        st = put_view(t, &w1, slot[L_EXP_W1] + (int)e, put, ctx, seen);
        if (!st) st = put_view(t, &w3, slot[L_EXP_W3] + (int)e, put, ctx, seen);
    }
    return st;
}

/* Block l and kind of tensor idx when it is a router or expert tensor. */
static bool expert_tensor(const cllm_model *m, int idx, int *layer, int *kind) {
    const int E = m->cfg.n_experts;
    for (int l = 0; E && l < m->cfg.n_layer; l++) {
        const int *s = m->lslot[l];
        int k = -1;
        if (idx == s[L_ROUTER_W]) k = K_ROUTER;
        else if ((idx >= s[L_EXP_W1] && idx < s[L_EXP_W1] + E) || (idx >= s[L_EXP_W3] && idx < s[L_EXP_W3] + E))
            k = K_GATE_UP;
        else if (idx >= s[L_EXP_W2] && idx < s[L_EXP_W2] + E) k = K_DOWN;
        if (k >= 0) {
            *layer = l;
            *kind = k;
            return true;
        }
    }
    return false;
}

static void fused_name(char *buf, size_t n, int l, int kind) {
    static const char *part[3] = {"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    snprintf(buf, n, "model.layers.%d.%s", l, part[kind]);
}

const char *model_moe_file_name(const cllm_model *m, int idx, const model_moe_file *f, char *buf, size_t n) {
    int l, kind;
    if (!f->first[0] || f->layout != CLLM_EXPERTS_FUSED || !expert_tensor(m, idx, &l, &kind))
        return m->tensors[idx].name;
    fused_name(buf, n, l, kind);
    return buf;
}

/* ------------------------------------------------------------ saving */

struct model_moe_fused {
    char (*names)[96]; /* [3 * n_layer] */
    float *data;       /* every block's gate_up_proj and down_proj */
};

void model_moe_fused_free(model_moe_fused *b) {
    if (!b) return;
    free(b->names);
    cllm_free(b->data);
    free(b);
}

cllm_status model_moe_fuse_entries(const cllm_model *m, cllm_st_entry *e, int *n, model_moe_fused **out) {
    *out = NULL;
    if (m->expert_layout != CLLM_EXPERTS_FUSED || !m->cfg.n_experts) return CLLM_OK;
    const size_t E = (size_t)m->cfg.n_experts, C = (size_t)m->cfg.n_embd, F = (size_t)m->cfg.n_inner;
    const size_t block = 3 * E * F * C; /* gate_up_proj and down_proj of one block */
    model_moe_fused *b = calloc(1, sizeof *b);
    if (b) b->names = calloc(3 * (size_t)m->cfg.n_layer, sizeof *b->names);
    if (!b || !b->names || !(b->data = cllm_alloc(block * (size_t)m->cfg.n_layer * sizeof(float), "fused experts"))) {
        model_moe_fused_free(b);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the fused expert tensors");
    }
    int w = 0;
    for (int i = 0; i < *n; i++) {
        int l, kind;
        if (!expert_tensor(m, i, &l, &kind)) {
            e[w++] = e[i];
            continue;
        }
        const int *s = m->lslot[l];
        if (i != s[L_ROUTER_W] && i != s[L_EXP_W1] && i != s[L_EXP_W2]) continue; /* inside a fused tensor */
        char *name = b->names[3 * l + kind];
        fused_name(name, sizeof b->names[0], l, kind);
        cllm_st_entry v = e[i];
        v.name = name;
        if (kind != K_ROUTER) {
            float *dst = b->data + block * (size_t)l + (kind == K_DOWN ? 2 * E * F * C : 0);
            for (size_t x = 0; x < E; x++)
                if (kind == K_DOWN) {
                    memcpy(dst + x * C * F, e[s[L_EXP_W2] + x].data, C * F * sizeof(float));
                } else {
                    memcpy(dst + 2 * x * F * C, e[s[L_EXP_W1] + x].data, F * C * sizeof(float));
                    memcpy(dst + (2 * x + 1) * F * C, e[s[L_EXP_W3] + x].data, F * C * sizeof(float));
                }
            v.ndim = 3;
            v.shape[0] = (int64_t)E;
            v.shape[1] = (int64_t)(kind == K_DOWN ? C : 2 * F);
            v.shape[2] = (int64_t)(kind == K_DOWN ? F : C);
            v.data = dst;
        }
        e[w++] = v;
    }
    *n = w;
    *out = b;
    return CLLM_OK;
}
