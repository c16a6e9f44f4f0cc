/*
 * GGUF writer: a cllm model and its tokenizer as one llama.cpp model file.
 *
 * Byte layout (GGUF version 3, every number little-endian):
 *    0  u32  magic 0x46554747 ("GGUF")
 *    4  u32  version 3
 *    8  u64  tensor count
 *   16  u64  metadata key/value count
 *   24  key/value pairs: key (u64 length + UTF-8 bytes, no NUL), u32 value
 *       type (0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
 *       8 string, 9 array, 10 u64, 11 i64, 12 f64), value; an array is
 *       u32 element type, u64 count, the elements
 *       tensor infos: name (string), u32 n_dims, u64 dims[n_dims]
 *       (dims[0] the fastest-varying: a row-major [rows, cols] matrix is
 *       {cols, rows}), u32 ggml type (0 F32, 1 F16, 2 Q4_0, 8 Q8_0), u64 offset of its
 *       data from the start of the data section (a multiple of the
 *       alignment)
 *       zero padding to general.alignment (32)
 *       data section: each tensor's data, zero-padded to the alignment
 *
 * The tensor names, the metadata keys, the permutation of LLaMA's q/k rows
 * and the reordering of BLOOM's fused QKV rows follow llama.cpp's HF
 * converter, so llama.cpp treats the file as one
 * it produced itself. Tensors are converted one at a time into a scratch
 * buffer and streamed through the atomic writer; the model is never copied.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/gguf.h"
#include "io/io_impl.h"

enum { GGUF_ALIGN = 32, GGUF_VERSION = 3 };
/* ggml tensor types (the blocks are in ggml_blocks.c) */
enum { G_F32 = 0, G_F16 = 1, G_Q4_0 = 2, G_Q8_0 = 8, QK = CLLM_GGML_QK };
enum { T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STR = 8, T_ARR = 9 };

bool cllm_gguf_type_from_name(const char *name, cllm_gguf_type *out) {
    if (!name) return false;
    if (strcmp(name, "f32") == 0) *out = CLLM_GGUF_F32;
    else if (strcmp(name, "f16") == 0) *out = CLLM_GGUF_F16;
    else if (strcmp(name, "q8_0") == 0) *out = CLLM_GGUF_Q8_0;
    else if (strcmp(name, "q4_0") == 0) *out = CLLM_GGUF_Q4_0;
    else return false;
    return true;
}

const char *cllm_gguf_type_name(cllm_gguf_type t) {
    return t == CLLM_GGUF_F32    ? "f32"
           : t == CLLM_GGUF_F16  ? "f16"
           : t == CLLM_GGUF_Q8_0 ? "q8_0"
           : t == CLLM_GGUF_Q4_0 ? "q4_0"
                                 : NULL;
}

cllm_gguf_params cllm_gguf_params_default(void) { return (cllm_gguf_params){CLLM_GGUF_F32, NULL}; }

/* ---- a growable little-endian byte buffer (metadata and tensor infos) ---- */
typedef struct {
    unsigned char *p;
    size_t n, cap;
    bool oom;
    uint64_t n_kv;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) {
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(b, x, 4);
}
static void put_u64(buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}
static void put_f32(buf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}
static void put_str(buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void key(buf *b, const char *k, uint32_t type) {
    put_str(b, k, strlen(k));
    put_u32(b, type);
    b->n_kv++;
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    key(b, k, T_U32);
    put_u32(b, v);
}
static void kv_f32(buf *b, const char *k, float v) {
    key(b, k, T_F32);
    put_f32(b, v);
}
static void kv_bool(buf *b, const char *k, bool v) {
    key(b, k, T_BOOL);
    unsigned char x = v;
    put(b, &x, 1);
}
static void kv_str(buf *b, const char *k, const char *v) {
    key(b, k, T_STR);
    put_str(b, v, strlen(v));
}
static void arr(buf *b, const char *k, uint32_t elem, uint64_t n) {
    key(b, k, T_ARR);
    put_u32(b, elem);
    put_u64(b, n);
}

/* ---- tensors ---- */
typedef enum { X_COPY, X_TRANSPOSE, X_PERMUTE, X_QKV_SPLIT } xform;
typedef struct {
    char name[64];
    const float *src; /* HF layout, row-major [rows, cols] (cols = 1 for vectors) */
    int64_t rows, cols;
    int ndim;
    xform x;
    int n_head;       /* X_PERMUTE, X_QKV_SPLIT: heads the rows are grouped in */
    uint32_t type;    /* ggml type */
    uint64_t offset;  /* in the data section */
    size_t bytes;
} gtensor;

typedef struct {
    gtensor *v;
    int n, cap;
} tlist;

static cllm_status add_tensor(tlist *l, cllm_model *m, const char *hf, const char *gg, xform x, int n_head,
                              cllm_gguf_type mtype) {
    const cllm_tensor_info *ti = cllm_model_find_tensor(m, hf);
    if (!ti) return CLLM_FAIL(CLLM_ERR_ARG, "the model has no tensor %s (for %s)", hf, gg);
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        gtensor *q = realloc(l->v, (size_t)cap * sizeof *q);
        if (!q) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the tensor list");
        l->v = q;
        l->cap = cap;
    }
    gtensor *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", gg);
    t->src = cllm_model_params(m) + ti->offset;
    t->ndim = ti->ndim;
    t->rows = ti->shape[0];
    t->cols = ti->ndim == 2 ? ti->shape[1] : 1;
    t->x = x;
    t->n_head = n_head;
    if ((x == X_PERMUTE && (n_head <= 0 || t->rows % (2 * n_head) != 0)) ||
        (x == X_QKV_SPLIT && (n_head <= 0 || t->rows % (3 * n_head) != 0)))
        return CLLM_FAIL(CLLM_ERR_ARG, "%s: %lld rows do not split into %d heads of an even size", hf,
                         (long long)t->rows, n_head);
    /* GGUF's row (dims[0]) is the stored matrix's column count */
    const int64_t ne0 = x == X_TRANSPOSE ? t->rows : t->cols;
    const size_t numel = (size_t)(t->rows * t->cols);
    t->type = G_F32;
    if (t->ndim == 2 && mtype == CLLM_GGUF_F16) t->type = G_F16;
    /* Q8_0 and Q4_0 blocks run along rows: a row length that is not a
     * multiple of 32 falls back to F16, and position embeddings stay F32, as
     * llama.cpp's converter does */
    if (t->ndim == 2 && (mtype == CLLM_GGUF_Q8_0 || mtype == CLLM_GGUF_Q4_0))
        t->type = strcmp(gg, "position_embd.weight") == 0 ? G_F32
                  : ne0 % QK != 0                          ? G_F16
                  : mtype == CLLM_GGUF_Q8_0                ? G_Q8_0
                                                           : G_Q4_0;
    t->bytes = t->type == G_Q8_0   ? numel / QK * CLLM_GGML_Q8_0_BYTES
               : t->type == G_Q4_0 ? numel / QK * CLLM_GGML_Q4_0_BYTES
                                   : numel * (t->type == G_F16 ? 2u : 4u);
    return CLLM_OK;
}

/* The tensor in llama.cpp's layout, as floats in dst [numel]. */
static void convert(const gtensor *t, float *dst) {
    const int64_t R = t->rows, C = t->cols;
    if (t->x == X_TRANSPOSE) {
        /* HF Conv1D [in, out] -> [out, in] */
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) dst[c * R + r] = t->src[r * C + c];
    } else if (t->x == X_PERMUTE) {
        /* The converter's permute: rows as [heads, 2, HS/2] -> [heads, HS/2, 2],
         * i.e. new row h*HS + 2i + j is old row h*HS + j*HS/2 + i. */
        const int64_t HS = R / t->n_head, half = HS / 2;
        for (int64_t h = 0; h < t->n_head; h++)
            for (int64_t i = 0; i < half; i++)
                for (int64_t j = 0; j < 2; j++)
                    memcpy(dst + (h * HS + 2 * i + j) * C, t->src + (h * HS + j * half + i) * C,
                           (size_t)C * sizeof *dst);
    } else if (t->x == X_QKV_SPLIT) {
        /* BLOOM's fused rows [heads, 3, HS] -> [3, heads, HS]: all queries,
         * then all keys, then all values (llama.cpp splits them so) */
        const int64_t HS = R / (3 * t->n_head);
        for (int64_t h = 0; h < t->n_head; h++)
            for (int64_t k = 0; k < 3; k++)
                memcpy(dst + ((k * t->n_head + h) * HS) * C, t->src + ((h * 3 + k) * HS) * C,
                       (size_t)(HS * C) * sizeof *dst);
    } else {
        memcpy(dst, t->src, (size_t)(R * C) * sizeof *dst);
    }
}

static void put_tensor_info(buf *b, const gtensor *t) {
    put_str(b, t->name, strlen(t->name));
    /* GGUF dims run fastest first: a stored [rows, cols] matrix is {cols, rows} */
    int64_t out_rows = t->x == X_TRANSPOSE ? t->cols : t->rows;
    int64_t out_cols = t->x == X_TRANSPOSE ? t->rows : t->cols;
    if (t->ndim == 1) {
        put_u32(b, 1);
        put_u64(b, (uint64_t)t->rows);
    } else {
        put_u32(b, 2);
        put_u64(b, (uint64_t)out_cols);
        put_u64(b, (uint64_t)out_rows);
    }
    put_u32(b, t->type);
    put_u64(b, t->offset);
}

/* ---- metadata ---- */
static void put_hparams(buf *b, const cllm_model_config *c, const char *a) {
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, a), k)
    /* BLOOM has no position limit: llama.cpp still wants a training context */
    kv_u32(b, KEY("context_length"), (uint32_t)(c->n_ctx > 0 ? c->n_ctx : 2048));
    kv_u32(b, KEY("embedding_length"), (uint32_t)c->n_embd);
    kv_u32(b, KEY("block_count"), (uint32_t)c->n_layer);
    kv_u32(b, KEY("feed_forward_length"), (uint32_t)c->n_inner);
    kv_u32(b, KEY("attention.head_count"), (uint32_t)c->n_head);
    kv_u32(b, KEY("vocab_size"), (uint32_t)c->vocab_size);
    if (c->arch == CLLM_ARCH_LLAMA) {
        kv_u32(b, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_head);
        kv_f32(b, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
        kv_f32(b, KEY("rope.freq_base"), c->rope_theta);
        kv_u32(b, KEY("rope.dimension_count"), (uint32_t)c->head_dim);
        if (c->head_dim * c->n_head != c->n_embd) {
            kv_u32(b, KEY("attention.key_length"), (uint32_t)c->head_dim);
            kv_u32(b, KEY("attention.value_length"), (uint32_t)c->head_dim);
        }
    } else {
        if (c->arch == CLLM_ARCH_BLOOM) kv_u32(b, KEY("attention.head_count_kv"), (uint32_t)c->n_head);
        kv_f32(b, KEY("attention.layer_norm_epsilon"), c->norm_eps);
    }
#undef KEY
}

/* tokenizer.ggml.*: V entries (the model's vocabulary size). */
static cllm_status put_tokenizer(buf *b, const cllm_tokenizer *tok, const cllm_model_config *c) {
    const int32_t V = c->vocab_size, n_tok = cllm_tokenizer_vocab_size(tok);
    if (n_tok > V)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "the tokenizer has ids up to %d but the model's vocab_size is %d; resize the model first "
                         "(cllm model resize-vocab)", n_tok - 1, V);
    const bool bpe = cllm_tokenizer_is_byte_level(tok);
    cllm_tokenizer_merge *mg = NULL;
    size_t n_mg = 0;
    float *score = NULL;
    cllm_status st = cllm_tokenizer_merges(tok, &mg, &n_mg);
    if (st) return st;
    kv_str(b, "tokenizer.ggml.model", bpe ? "gpt2" : "llama");
    kv_str(b, "tokenizer.ggml.pre", bpe ? "gpt-2" : "default");
    char pad[32];
    arr(b, "tokenizer.ggml.tokens", T_STR, (uint64_t)V);
    for (int32_t i = 0; i < V; i++) {
        size_t len = 0;
        const char *s = i < n_tok ? cllm_tokenizer_id_to_token(tok, i, &len) : NULL;
        if (!s) {
            len = (size_t)snprintf(pad, sizeof pad, "[PAD%d]", (int)i);
            s = pad;
        }
        put_str(b, s, len);
    }
    if (!bpe) {
        /* SentencePiece-style: llama.cpp merges the adjacent pair whose joined
         * piece scores highest, so a piece made by merge rank r scores -(r+1)
         * and the merges apply in the order the tokenizer.json lists them;
         * pieces no merge makes score -1e9 (never preferred), special and
         * byte pieces 0 (they are not made by merging). */
        score = malloc((size_t)V * sizeof *score);
        if (!score) {
            st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for %d scores", (int)V);
            goto done;
        }
        for (int32_t i = 0; i < V; i++)
            score[i] = cllm_tokenizer_token_kind(tok, i) == CLLM_TOKEN_NORMAL ? -1e9f : 0.0f;
        for (size_t i = n_mg; i-- > 0;)
            if (mg[i].merged >= 0 && mg[i].merged < V) score[mg[i].merged] = -(float)mg[i].rank - 1.0f;
        arr(b, "tokenizer.ggml.scores", T_F32, (uint64_t)V);
        for (int32_t i = 0; i < V; i++) put_f32(b, score[i]);
    }
    arr(b, "tokenizer.ggml.token_type", T_I32, (uint64_t)V);
    for (int32_t i = 0; i < V; i++) put_u32(b, (uint32_t)cllm_tokenizer_token_kind(tok, i));
    if (bpe) {
        arr(b, "tokenizer.ggml.merges", T_STR, (uint64_t)n_mg);
        for (size_t i = 0; i < n_mg; i++) {
            size_t la = 0, lb = 0;
            const char *a = cllm_tokenizer_id_to_token(tok, mg[i].left, &la);
            const char *bb = cllm_tokenizer_id_to_token(tok, mg[i].right, &lb);
            if (!a || !bb) {
                st = CLLM_FAIL(CLLM_ERR_INTERNAL, "merge %zu names an id with no token", i);
                goto done;
            }
            put_u64(b, la + 1 + lb);
            put(b, a, la);
            put(b, " ", 1);
            put(b, bb, lb);
        }
    }
    int32_t bos = cllm_tokenizer_bos_id(tok), eos = cllm_tokenizer_eos_id(tok);
    if (bos < 0) bos = c->bos_token_id;
    if (eos < 0) eos = c->eos_token_id;
    const int32_t unk = cllm_tokenizer_unk_id(tok), padid = cllm_tokenizer_pad_id(tok);
    if (bos >= 0 && bos < V) kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0 && eos < V) kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (unk >= 0 && unk < V) kv_u32(b, "tokenizer.ggml.unknown_token_id", (uint32_t)unk);
    if (padid >= 0 && padid < V) kv_u32(b, "tokenizer.ggml.padding_token_id", (uint32_t)padid);
    kv_bool(b, "tokenizer.ggml.add_bos_token", cllm_tokenizer_adds_bos(tok));
    kv_bool(b, "tokenizer.ggml.add_eos_token", cllm_tokenizer_adds_eos(tok));
done:
    free(score);
    free(mg);
    return st;
}

/* ---- the tensor table of each family ---- */
static cllm_status build_tensors(tlist *l, cllm_model *m, cllm_gguf_type ty) {
    const cllm_model_config *c = cllm_model_get_config(m);
    char hf[128], gg[64];
    cllm_status st = CLLM_OK;
#define T(H, G, X, NH)                                                                                     \
    do {                                                                                                   \
        if ((st = add_tensor(l, m, (H), (G), (X), (NH), ty))) return st;                                   \
    } while (0)
#define TL(Hfmt, Gfmt, X, NH)                                                                              \
    do {                                                                                                   \
        snprintf(hf, sizeof hf, Hfmt, L);                                                                  \
        snprintf(gg, sizeof gg, Gfmt, L);                                                                  \
        T(hf, gg, X, NH);                                                                                  \
    } while (0)
#define TLB(Hfmt, Gfmt, X, NH)                                                                             \
    do {                                                                                                   \
        snprintf(hf, sizeof hf, Hfmt, L);                                                                  \
        if (cllm_model_find_tensor(m, hf)) TL(Hfmt, Gfmt, X, NH);                                          \
    } while (0)
    if (c->arch == CLLM_ARCH_LLAMA) {
        T("model.embed_tokens.weight", "token_embd.weight", X_COPY, 0);
        for (int L = 0; L < c->n_layer; L++) {
            TL("model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight", X_COPY, 0);
            TL("model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight", X_PERMUTE, c->n_head);
            TLB("model.layers.%d.self_attn.q_proj.bias", "blk.%d.attn_q.bias", X_PERMUTE, c->n_head);
            TL("model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight", X_PERMUTE, c->n_kv_head);
            TLB("model.layers.%d.self_attn.k_proj.bias", "blk.%d.attn_k.bias", X_PERMUTE, c->n_kv_head);
            TL("model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight", X_COPY, 0);
            TLB("model.layers.%d.self_attn.v_proj.bias", "blk.%d.attn_v.bias", X_COPY, 0);
            TL("model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight", X_COPY, 0);
            TLB("model.layers.%d.self_attn.o_proj.bias", "blk.%d.attn_output.bias", X_COPY, 0);
            TL("model.layers.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight", X_COPY, 0);
            TL("model.layers.%d.mlp.gate_proj.weight", "blk.%d.ffn_gate.weight", X_COPY, 0);
            TLB("model.layers.%d.mlp.gate_proj.bias", "blk.%d.ffn_gate.bias", X_COPY, 0);
            TL("model.layers.%d.mlp.up_proj.weight", "blk.%d.ffn_up.weight", X_COPY, 0);
            TLB("model.layers.%d.mlp.up_proj.bias", "blk.%d.ffn_up.bias", X_COPY, 0);
            TL("model.layers.%d.mlp.down_proj.weight", "blk.%d.ffn_down.weight", X_COPY, 0);
            TLB("model.layers.%d.mlp.down_proj.bias", "blk.%d.ffn_down.bias", X_COPY, 0);
        }
        T("model.norm.weight", "output_norm.weight", X_COPY, 0);
        /* a tied head has no output.weight: llama.cpp then reads token_embd */
        if (!c->tie_embeddings) T("lm_head.weight", "output.weight", X_COPY, 0);
    } else if (c->arch == CLLM_ARCH_BLOOM) {
        T("transformer.word_embeddings.weight", "token_embd.weight", X_COPY, 0);
        T("transformer.word_embeddings_layernorm.weight", "token_embd_norm.weight", X_COPY, 0);
        T("transformer.word_embeddings_layernorm.bias", "token_embd_norm.bias", X_COPY, 0);
        for (int L = 0; L < c->n_layer; L++) {
            TL("transformer.h.%d.input_layernorm.weight", "blk.%d.attn_norm.weight", X_COPY, 0);
            TL("transformer.h.%d.input_layernorm.bias", "blk.%d.attn_norm.bias", X_COPY, 0);
            TL("transformer.h.%d.self_attention.query_key_value.weight", "blk.%d.attn_qkv.weight", X_QKV_SPLIT,
               c->n_head);
            TL("transformer.h.%d.self_attention.query_key_value.bias", "blk.%d.attn_qkv.bias", X_QKV_SPLIT, c->n_head);
            TL("transformer.h.%d.self_attention.dense.weight", "blk.%d.attn_output.weight", X_COPY, 0);
            TL("transformer.h.%d.self_attention.dense.bias", "blk.%d.attn_output.bias", X_COPY, 0);
            TL("transformer.h.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight", X_COPY, 0);
            TL("transformer.h.%d.post_attention_layernorm.bias", "blk.%d.ffn_norm.bias", X_COPY, 0);
            TL("transformer.h.%d.mlp.dense_h_to_4h.weight", "blk.%d.ffn_up.weight", X_COPY, 0);
            TL("transformer.h.%d.mlp.dense_h_to_4h.bias", "blk.%d.ffn_up.bias", X_COPY, 0);
            TL("transformer.h.%d.mlp.dense_4h_to_h.weight", "blk.%d.ffn_down.weight", X_COPY, 0);
            TL("transformer.h.%d.mlp.dense_4h_to_h.bias", "blk.%d.ffn_down.bias", X_COPY, 0);
        }
        T("transformer.ln_f.weight", "output_norm.weight", X_COPY, 0);
        T("transformer.ln_f.bias", "output_norm.bias", X_COPY, 0);
        /* the converter writes the tied head as its own copy */
        T("transformer.word_embeddings.weight", "output.weight", X_COPY, 0);
    } else {
        T("transformer.wte.weight", "token_embd.weight", X_COPY, 0);
        T("transformer.wpe.weight", "position_embd.weight", X_COPY, 0);
        for (int L = 0; L < c->n_layer; L++) {
            TL("transformer.h.%d.ln_1.weight", "blk.%d.attn_norm.weight", X_COPY, 0);
            TL("transformer.h.%d.ln_1.bias", "blk.%d.attn_norm.bias", X_COPY, 0);
            TL("transformer.h.%d.attn.c_attn.weight", "blk.%d.attn_qkv.weight", X_TRANSPOSE, 0);
            TL("transformer.h.%d.attn.c_attn.bias", "blk.%d.attn_qkv.bias", X_COPY, 0);
            TL("transformer.h.%d.attn.c_proj.weight", "blk.%d.attn_output.weight", X_TRANSPOSE, 0);
            TL("transformer.h.%d.attn.c_proj.bias", "blk.%d.attn_output.bias", X_COPY, 0);
            TL("transformer.h.%d.ln_2.weight", "blk.%d.ffn_norm.weight", X_COPY, 0);
            TL("transformer.h.%d.ln_2.bias", "blk.%d.ffn_norm.bias", X_COPY, 0);
            TL("transformer.h.%d.mlp.c_fc.weight", "blk.%d.ffn_up.weight", X_TRANSPOSE, 0);
            TL("transformer.h.%d.mlp.c_fc.bias", "blk.%d.ffn_up.bias", X_COPY, 0);
            TL("transformer.h.%d.mlp.c_proj.weight", "blk.%d.ffn_down.weight", X_TRANSPOSE, 0);
            TL("transformer.h.%d.mlp.c_proj.bias", "blk.%d.ffn_down.bias", X_COPY, 0);
        }
        T("transformer.ln_f.weight", "output_norm.weight", X_COPY, 0);
        T("transformer.ln_f.bias", "output_norm.bias", X_COPY, 0);
        /* the converter writes GPT-2's tied head as its own copy */
        T("transformer.wte.weight", "output.weight", X_COPY, 0);
    }
#undef TLB
#undef TL
#undef T
    return st;
}

static const unsigned char zeros[GGUF_ALIGN];

static uint64_t align_up(uint64_t x) { return (x + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN; }

cllm_status cllm_gguf_export(cllm_model *m, const cllm_tokenizer *tok, const cllm_gguf_params *p, const char *path) {
    const cllm_model_config *c = cllm_model_get_config(m);
    cllm_gguf_params prm = p ? *p : cllm_gguf_params_default();
    if (c->arch != CLLM_ARCH_LLAMA && c->arch != CLLM_ARCH_GPT2 && c->arch != CLLM_ARCH_BLOOM)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: GGUF export supports llama, gpt2 and bloom models, not %s", path,
                         cllm_arch_name(c->arch));
    if (c->num_labels > 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "%s: GGUF export of a sequence-classification (reward) model: it has "
                         "no LM head", path);
    if (!cllm_gguf_type_name(prm.type)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: unknown GGUF type %d", path, prm.type);
    if (!cllm_model_params(m)) return CLLM_FAIL(CLLM_ERR_ARG, "%s: the model has no parameters in memory", path);
    const char *arch = cllm_arch_name(c->arch);
    buf kv = {0}, ti = {0};
    tlist tl = {0};
    float *scratch = NULL;
    uint16_t *half = NULL;
    cllm_io_atomic w;
    bool open = false;
    cllm_status st = build_tensors(&tl, m, prm.type);
    if (st) goto done;

    kv_str(&kv, "general.architecture", arch);
    kv_str(&kv, "general.name", prm.name ? prm.name : arch);
    kv_u32(&kv, "general.alignment", GGUF_ALIGN);
    /* llama_ftype: 0 all F32, 1 mostly F16, 2 mostly Q4_0, 7 mostly Q8_0 */
    kv_u32(&kv, "general.file_type", prm.type == CLLM_GGUF_F16    ? 1u
                                     : prm.type == CLLM_GGUF_Q8_0 ? 7u
                                     : prm.type == CLLM_GGUF_Q4_0 ? 2u
                                                                  : 0u);
    if (prm.type == CLLM_GGUF_Q8_0 || prm.type == CLLM_GGUF_Q4_0) kv_u32(&kv, "general.quantization_version", 2);
    put_hparams(&kv, c, arch);
    if ((st = put_tokenizer(&kv, tok, c))) goto done;

    uint64_t off = 0;
    size_t max_numel = 0;
    for (int i = 0; i < tl.n; i++) {
        tl.v[i].offset = off;
        off = align_up(off + tl.v[i].bytes);
        size_t numel = (size_t)(tl.v[i].rows * tl.v[i].cols);
        if (numel > max_numel) max_numel = numel;
        put_tensor_info(&ti, &tl.v[i]);
    }
    if (kv.oom || ti.oom) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory for the metadata", path);
        goto done;
    }
    scratch = malloc(max_numel * sizeof *scratch);
    half = prm.type != CLLM_GGUF_F32 ? malloc(max_numel * sizeof *half) : NULL;
    if (!scratch || (prm.type != CLLM_GGUF_F32 && !half)) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory for a tensor of %zu values", path, max_numel);
        goto done;
    }

    buf hd = {0};
    put_u32(&hd, 0x46554747u);
    put_u32(&hd, GGUF_VERSION);
    put_u64(&hd, (uint64_t)tl.n);
    put_u64(&hd, kv.n_kv);
    if (hd.oom) {
        free(hd.p);
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((st = cllm_io_atomic_begin(&w, path))) {
        free(hd.p);
        goto done;
    }
    open = true;
    uint64_t pos = hd.n + kv.n + ti.n;
    st = cllm_io_atomic_write(&w, hd.p, hd.n);
    free(hd.p);
    if (st || (st = cllm_io_atomic_write(&w, kv.p, kv.n)) || (st = cllm_io_atomic_write(&w, ti.p, ti.n)) ||
        (st = cllm_io_atomic_write(&w, zeros, (size_t)(align_up(pos) - pos))))
        goto done;
    for (int i = 0; i < tl.n; i++) {
        const gtensor *t = &tl.v[i];
        size_t numel = (size_t)(t->rows * t->cols);
        convert(t, scratch);
        const void *data = scratch;
        if (t->type == G_Q8_0 || t->type == G_Q4_0) { /* fewer than 2 bytes per value: fit in `half` */
            if (t->type == G_Q8_0) cllm_ggml_quantize_q8_0(scratch, numel, (unsigned char *)half);
            else cllm_ggml_quantize_q4_0(scratch, numel, (unsigned char *)half);
            data = half;
        } else if (t->type == G_F16) {
            for (size_t k = 0; k < numel; k++) {
                uint16_t h = cllm_f32_to_f16(scratch[k]);
                unsigned char *q = (unsigned char *)&half[k];
                q[0] = (unsigned char)h;
                q[1] = (unsigned char)(h >> 8);
            }
            data = half;
        } else {
            /* little-endian on disk: bytes of each float, low first */
            for (size_t k = 0; k < numel; k++) {
                uint32_t u;
                memcpy(&u, &scratch[k], 4);
                unsigned char *q = (unsigned char *)&scratch[k];
                q[0] = (unsigned char)u;
                q[1] = (unsigned char)(u >> 8);
                q[2] = (unsigned char)(u >> 16);
                q[3] = (unsigned char)(u >> 24);
            }
        }
        if ((st = cllm_io_atomic_write(&w, data, t->bytes)) ||
            (st = cllm_io_atomic_write(&w, zeros, (size_t)(align_up(t->bytes) - t->bytes))))
            goto done;
    }
    st = cllm_io_atomic_commit(&w);
    open = false;
done:
    if (open) cllm_io_atomic_abort(&w);
    free(scratch);
    free(half);
    free(tl.v);
    free(kv.p);
    free(ti.p);
    return st;
}
