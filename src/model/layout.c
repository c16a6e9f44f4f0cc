/*
 * The architecture table: for each family, the HF name and shape of every
 * parameter tensor and the slot it fills, laid out back to back in one flat
 * buffer (embeddings, then block 0..L-1 in HF order, then the final norm and
 * an untied head). The same offsets index the gradient buffer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

typedef struct {
    int slot;       /* L_* or G_* */
    const char *fmt; /* name; "%d" is the block index for block tensors */
    char rows, cols; /* symbolic dims: see dim() */
    bool no_decay;
} tensor_rule;

/* Symbolic dimensions used in the tables below. */
static int dim(const cllm_model_config *c, char d) {
    switch (d) {
    case 'V': return c->vocab_size;
    case 'P': return c->n_ctx;
    case 'C': return c->n_embd;
    case '3': return 3 * c->n_head * c->head_dim; /* = 3C, or 3C/tp for a tensor rank's part */
    case 'F': return c->n_inner;
    case 'Q': return c->n_head * c->head_dim;
    case 'K': return c->n_kv_head * c->head_dim;
    case 'L': return c->num_labels;
    case '1': return 1;
    case '0': return 0; /* 1-D tensor */
    }
    return -1;
}

int model_qkv_width(const cllm_model_config *c) { return (c->n_head + 2 * c->n_kv_head) * c->head_dim; }

/* GPT-2: Conv1D weights are [in, out]. */
static const tensor_rule gpt2_pre[] = {
    {G_WTE, "transformer.wte.weight", 'V', 'C', false},
    {G_WPE, "transformer.wpe.weight", 'P', 'C', false},
};
static const tensor_rule gpt2_block[] = {
    {L_LN1_W, "transformer.h.%d.ln_1.weight", 'C', '0', true},
    {L_LN1_B, "transformer.h.%d.ln_1.bias", 'C', '0', true},
    {L_QKV_W, "transformer.h.%d.attn.c_attn.weight", 'C', '3', false},
    {L_QKV_B, "transformer.h.%d.attn.c_attn.bias", '3', '0', true},
    {L_O_W, "transformer.h.%d.attn.c_proj.weight", 'Q', 'C', false},
    {L_O_B, "transformer.h.%d.attn.c_proj.bias", 'C', '0', true},
    {L_LN2_W, "transformer.h.%d.ln_2.weight", 'C', '0', true},
    {L_LN2_B, "transformer.h.%d.ln_2.bias", 'C', '0', true},
    {L_FC_W, "transformer.h.%d.mlp.c_fc.weight", 'C', 'F', false},
    {L_FC_B, "transformer.h.%d.mlp.c_fc.bias", 'F', '0', true},
    {L_DOWN_W, "transformer.h.%d.mlp.c_proj.weight", 'F', 'C', false},
    {L_DOWN_B, "transformer.h.%d.mlp.c_proj.bias", 'C', '0', true},
};
static const tensor_rule gpt2_post[] = {
    {G_LNF_W, "transformer.ln_f.weight", 'C', '0', true},
    {G_LNF_B, "transformer.ln_f.bias", 'C', '0', true},
    {G_SCORE, "score.weight", 'L', 'C', false},
    {G_VHEAD_W, "v_head.summary.weight", '1', 'C', false},
    {G_VHEAD_B, "v_head.summary.bias", '1', '0', true},
};

/* LLaMA: nn.Linear weights are [out, in]; biases only when configured. */
static const tensor_rule llama_pre[] = {
    {G_WTE, "model.embed_tokens.weight", 'V', 'C', false},
};
static const tensor_rule llama_block[] = {
    {L_LN1_W, "model.layers.%d.input_layernorm.weight", 'C', '0', true},
    {L_Q_W, "model.layers.%d.self_attn.q_proj.weight", 'Q', 'C', false},
    {L_Q_B, "model.layers.%d.self_attn.q_proj.bias", 'Q', '0', true},
    {L_K_W, "model.layers.%d.self_attn.k_proj.weight", 'K', 'C', false},
    {L_K_B, "model.layers.%d.self_attn.k_proj.bias", 'K', '0', true},
    {L_V_W, "model.layers.%d.self_attn.v_proj.weight", 'K', 'C', false},
    {L_V_B, "model.layers.%d.self_attn.v_proj.bias", 'K', '0', true},
    {L_O_W, "model.layers.%d.self_attn.o_proj.weight", 'C', 'Q', false},
    {L_O_B, "model.layers.%d.self_attn.o_proj.bias", 'C', '0', true},
    {L_LN2_W, "model.layers.%d.post_attention_layernorm.weight", 'C', '0', true},
    {L_FC_W, "model.layers.%d.mlp.gate_proj.weight", 'F', 'C', false},
    {L_FC_B, "model.layers.%d.mlp.gate_proj.bias", 'F', '0', true},
    {L_UP_W, "model.layers.%d.mlp.up_proj.weight", 'F', 'C', false},
    {L_UP_B, "model.layers.%d.mlp.up_proj.bias", 'F', '0', true},
    {L_DOWN_W, "model.layers.%d.mlp.down_proj.weight", 'C', 'F', false},
    {L_DOWN_B, "model.layers.%d.mlp.down_proj.bias", 'C', '0', true},
};
static const tensor_rule llama_post[] = {
    {G_LNF_W, "model.norm.weight", 'C', '0', true},
    {G_HEAD, "lm_head.weight", 'V', 'C', false},
    {G_SCORE, "score.weight", 'L', 'C', false},
    {G_VHEAD_W, "v_head.summary.weight", '1', 'C', false},
    {G_VHEAD_B, "v_head.summary.bias", '1', '0', true},
};

/* BLOOM: nn.Linear weights; query_key_value outputs are per head [q,k,v]. */
static const tensor_rule bloom_pre[] = {
    {G_WTE, "transformer.word_embeddings.weight", 'V', 'C', false},
    {G_EMB_LN_W, "transformer.word_embeddings_layernorm.weight", 'C', '0', true},
    {G_EMB_LN_B, "transformer.word_embeddings_layernorm.bias", 'C', '0', true},
};
static const tensor_rule bloom_block[] = {
    {L_LN1_W, "transformer.h.%d.input_layernorm.weight", 'C', '0', true},
    {L_LN1_B, "transformer.h.%d.input_layernorm.bias", 'C', '0', true},
    {L_QKV_W, "transformer.h.%d.self_attention.query_key_value.weight", '3', 'C', false},
    {L_QKV_B, "transformer.h.%d.self_attention.query_key_value.bias", '3', '0', true},
    {L_O_W, "transformer.h.%d.self_attention.dense.weight", 'C', 'Q', false},
    {L_O_B, "transformer.h.%d.self_attention.dense.bias", 'C', '0', true},
    {L_LN2_W, "transformer.h.%d.post_attention_layernorm.weight", 'C', '0', true},
    {L_LN2_B, "transformer.h.%d.post_attention_layernorm.bias", 'C', '0', true},
    {L_FC_W, "transformer.h.%d.mlp.dense_h_to_4h.weight", 'F', 'C', false},
    {L_FC_B, "transformer.h.%d.mlp.dense_h_to_4h.bias", 'F', '0', true},
    {L_DOWN_W, "transformer.h.%d.mlp.dense_4h_to_h.weight", 'C', 'F', false},
    {L_DOWN_B, "transformer.h.%d.mlp.dense_4h_to_h.bias", 'C', '0', true},
};
static const tensor_rule bloom_post[] = {
    {G_LNF_W, "transformer.ln_f.weight", 'C', '0', true},
    {G_LNF_B, "transformer.ln_f.bias", 'C', '0', true},
    {G_SCORE, "score.weight", 'L', 'C', false},
    {G_VHEAD_W, "v_head.summary.weight", '1', 'C', false},
    {G_VHEAD_B, "v_head.summary.bias", '1', '0', true},
};

typedef struct {
    const tensor_rule *pre, *block, *post;
    int n_pre, n_block, n_post;
} arch_table;

#define TABLE(a) a##_pre, a##_block, a##_post, \
    (int)(sizeof a##_pre / sizeof a##_pre[0]), (int)(sizeof a##_block / sizeof a##_block[0]), \
    (int)(sizeof a##_post / sizeof a##_post[0])
static const arch_table tables[CLLM_ARCH_COUNT] = {{TABLE(gpt2)}, {TABLE(llama)}, {TABLE(bloom)}};

/* Whether a rule applies to this config (optional biases, untied head). */
static bool rule_present(const cllm_model_config *c, const tensor_rule *r, bool block) {
    /* a sequence-classification model: the score head instead of the LM head */
    if (!block && r->slot == G_SCORE) return c->num_labels > 0;
    if (!block && (r->slot == G_VHEAD_W || r->slot == G_VHEAD_B)) return c->value_head; /* PPO's value head */
    if (!block && r->slot == G_HEAD && c->num_labels > 0) return false;
    if (c->arch != CLLM_ARCH_LLAMA) return true;
    if (!block) return r->slot != G_HEAD || !c->tie_embeddings;
    switch (r->slot) {
    case L_Q_B: case L_K_B: case L_V_B: case L_O_B: return c->attn_bias;
    case L_FC_B: case L_UP_B: case L_DOWN_B: return c->mlp_bias && !c->n_experts;
    case L_FC_W: case L_UP_W: case L_DOWN_W: return !c->n_experts; /* Mixtral: experts instead (moe.c) */
    default: return true;
    }
}

static void add_tensor_at(cllm_model *m, const char *name, int slot, int layer, int group, int rows, int cols,
                          bool no_decay, size_t *offset) {
    cllm_tensor_info *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->offset = *offset;
    t->no_decay = no_decay;
    /* keep every tensor 16-float (64-byte) aligned inside the flat buffer */
    *offset += (t->numel + 15) & ~(size_t)15;
    if (layer >= 0) {
        if (m->lslot[layer][slot] < 0) m->lslot[layer][slot] = m->n_tensors; /* experts: the first one */
    } else {
        m->gslot[slot] = m->n_tensors;
    }
    m->tgroup[m->n_tensors] = group;
    m->groups[group].end = *offset;
    m->n_tensors++;
}

static void add_tensor(cllm_model *m, const tensor_rule *r, int layer, int group, size_t *offset) {
    char name[96];
    snprintf(name, sizeof name, r->fmt, layer);
    add_tensor_at(m, name, r->slot, layer, group, dim(&m->cfg, r->rows), dim(&m->cfg, r->cols), r->no_decay, offset);
}

/* A block tensor of block `layer` (its group is layer + 1), for moe.c. */
static void add_block_tensor(cllm_model *m, const char *name, int slot, int layer, int rows, int cols, bool no_decay,
                             size_t *offset) {
    add_tensor_at(m, name, slot, layer, layer + 1, rows, cols, no_decay, offset);
}

cllm_status model_build_layout(cllm_model *m) {
    const cllm_model_config *c = &m->cfg;
    const arch_table *tb = &tables[c->arch];
    int cap = tb->n_pre + tb->n_post + (tb->n_block + 1 + 3 * c->n_experts) * c->n_layer;
    m->tensors = cllm_calloc((size_t)cap, sizeof *m->tensors, "tensor table");
    m->lslot = cllm_calloc((size_t)c->n_layer, sizeof *m->lslot, "layer slots");
    m->tgroup = cllm_calloc((size_t)cap, sizeof *m->tgroup, "tensor groups");
    m->groups = cllm_calloc((size_t)c->n_layer + 2, sizeof *m->groups, "parameter groups");
    if (!m->tensors || !m->lslot || !m->tgroup || !m->groups) return CLLM_ERR_NOMEM;
    for (int l = 0; l < c->n_layer; l++)
        for (int s = 0; s < L_NSLOTS; s++) m->lslot[l][s] = -1;
    for (int s = 0; s < G_NSLOTS; s++) m->gslot[s] = -1;
    /* groups: the tensors of one block are added back to back, so each
     * group (pre, block l, post) is one contiguous range */
    size_t offset = 0;
    for (int i = 0; i < tb->n_pre; i++)
        if (rule_present(c, &tb->pre[i], false)) add_tensor(m, &tb->pre[i], -1, 0, &offset);
    for (int l = 0; l < c->n_layer; l++) {
        m->groups[l + 1].begin = m->groups[l + 1].end = offset;
        for (int i = 0; i < tb->n_block; i++)
            if (rule_present(c, &tb->block[i], true)) add_tensor(m, &tb->block[i], l, l + 1, &offset);
        if (c->n_experts) model_moe_layout(m, l, add_block_tensor, &offset);
    }
    m->groups[c->n_layer + 1].begin = m->groups[c->n_layer + 1].end = offset;
    for (int i = 0; i < tb->n_post; i++)
        if (rule_present(c, &tb->post[i], false)) add_tensor(m, &tb->post[i], -1, c->n_layer + 1, &offset);
    m->n_params = offset;
    return CLLM_OK;
}
