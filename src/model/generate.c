/*
 * The key/value cache and the cached inference pass, for GPT-2, LLaMA and
 * BLOOM.
 *
 * The pass is the training forward of run.c (model_embed_forward and
 * model_block_forward, the same code) run on new rows only: sequence i's
 * n_i new tokens stand at positions past_i..past_i+n_i-1, their keys and
 * values are written into the cache, and each row attends to its own
 * sequence's cached positions 0..its own. Sequences in one call may stand at
 * different positions and add different numbers of rows (ragged batches).
 * Only the last new row of each sequence goes through the final norm and
 * the head.
 *
 * Paged cache: keys and values live in fixed-size blocks of block_size
 * positions taken from one pool, k[n_layer][n_blocks][NKV][block_size][HS]
 * (v alike); each sequence has a block table mapping its position s to
 * block table[s / block_size], row s % block_size. Blocks are taken from a
 * free list as a sequence grows and returned when it is rewound or reset,
 * so sequences that start and end at different times share one pool (what
 * a server batching requests needs). Within a block the keys one head reads
 * are contiguous: a decode step streams each block front to back.
 *
 * All memory is allocated at init (pool, tables, scratch for max_rows new
 * rows per call, the bf16/fp16 operand scratch), so forward calls never
 * allocate. The cache holds a const model and writes only its own memory,
 * so caches over one model run forwards on different threads at once.
 *
 * A sliding window (Mixtral's sliding_window) limits what each row reads;
 * the cache still holds every position.
 *
 * The pool holds fp32 keys and values, or bf16 ones (half the bytes a
 * decode step reads and half the memory per position) when the model's
 * weights are in a format other than fp32 (cllm_kv_cache_params.kv_dtype
 * overrides): a model already rounded to bf16 or coarser loses nothing it
 * had to the cache's rounding, while an fp32 model keeps fp32's results.
 *
 * Left out: 8-bit caches, sharing blocks between
 * sequences (prefix caching), logits of every new position (only the last
 * one of each sequence is returned).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/generate.h"
#include "cllm/kernels.h"
#include "cllm/lora.h"
#include "model_impl.h"

#define TRY(x)                          \
    do {                                \
        cllm_status st_ = (x);          \
        if (st_ != CLLM_OK) return st_; \
    } while (0)

/* Default capacity for models without a position limit (BLOOM). */
enum { DEFAULT_MAX_POS = 2048, DEFAULT_BLOCK = 64 };

struct cllm_kv_cache {
    const cllm_model *m;      /* the weights: only read */
    model_lp_scratch lp;      /* operand scratch of bf16/fp16 linear layers (none for fp32) */
    int n_seq, S, max_rows, block_size, max_blocks, n_blocks;
    int32_t *past;            /* [n_seq] positions filled per sequence */
    int32_t *table;           /* [n_seq][max_blocks] block ids, -1 = none */
    int32_t *call_table;      /* [n_seq][max_blocks] the current call's entries' tables */
    int *n_lock;              /* [n_seq] scratch of cllm_kv_cache_forward */
    int32_t *free_list;       /* [n_blocks] free block ids, n_free of them */
    int n_free;
    int32_t *rows, *call_past; /* [n_seq + 1], [n_seq]: the rows of the current call */
    int32_t *seq_of;          /* [n_seq] sequence of each call entry */
    void *kc, *vc;            /* pools: floats, or bf16 values when kv_bf16 */
    bool kv_bf16;
    float *buf;               /* everything below is carved from buf */
    layer_acts a;             /* [N,...] scratch for one block (ln1 == ln2, mean/rstd shared) */
    float *emb;               /* [N,C] BLOOM's embedding before its LayerNorm */
    float *last, *lnf;        /* [n_seq,C] last rows, normed */
    float *head_out;          /* [n_seq,V] logits of a call with idle sequences */
    float *lmean, *lrstd;     /* [n_seq] */
    float *rope_cos, *rope_sin; /* [S,HS/2] llama */
    float *alibi;             /* [NH] bloom */
    /* tensor parallelism (model a part): the logits of every rank gathered
     * at rank 0, and the command rank 0 sends the other ranks' caches */
    int tp_id;                /* the cache's id in the commands */
    float *tp_gather;         /* [tp][n_seq * V_local] */
    size_t *tp_counts;        /* [tp] */
    int32_t *tp_msg;          /* [n_seq + max_rows] a forward's n_new and tokens */
    /* LoRA adapters per sequence (lora_set.c): the set, each sequence's
     * choice, the current call's, one-row segments for the head */
    model_lora_rows lrows;
    int32_t *seq_adapter, *call_adapter, *iota;
};

static size_t carve(float **p, float *base, size_t used, size_t n) {
    *p = base ? base + used : NULL;
    return used + ((n + 15) & ~(size_t)15);
}

/* Lays out the scratch (base == NULL: measure only); returns floats used. */
static size_t assign(cllm_kv_cache *kv, float *base) {
    const cllm_model_config *c = &kv->m->cfg;
    size_t N = (size_t)kv->max_rows, C = (size_t)c->n_embd, F = (size_t)c->n_inner;
    layer_acts *a = &kv->a;
    size_t u = 0;
    u = carve(&a->x, base, u, N * C);
    u = carve(&a->ln1, base, u, N * C);
    u = carve(&a->x1, base, u, N * C);
    u = carve(&a->ln1_mean, base, u, N);
    u = carve(&a->ln1_rstd, base, u, N);
    u = carve(&a->qkv, base, u, N * (size_t)model_qkv_width(c));
    u = carve(&a->atty, base, u, N * (size_t)c->n_head * c->head_dim);
    u = carve(&a->fc, base, u, N * F);
    u = carve(&a->up, base, u, c->arch == CLLM_ARCH_LLAMA ? N * F : 0);
    u = carve(&a->act, base, u, N * F);
    u = carve(&a->moe, base, u, model_moe_act_floats(c, N)); /* Mixtral: the sparse FFN's state */
    u = carve(&kv->last, base, u, (size_t)kv->n_seq * C);
    u = carve(&kv->lnf, base, u, (size_t)kv->n_seq * C);
    u = carve(&kv->head_out, base, u, kv->n_seq > 1 && kv->m->tp_size <= 1 ? (size_t)kv->n_seq * (size_t)c->vocab_size : 0);
    u = carve(&kv->lmean, base, u, (size_t)kv->n_seq);
    u = carve(&kv->lrstd, base, u, (size_t)kv->n_seq);
    size_t half = c->arch == CLLM_ARCH_LLAMA ? (size_t)kv->S * (c->head_dim / 2) : 0;
    u = carve(&kv->rope_cos, base, u, half);
    u = carve(&kv->rope_sin, base, u, half);
    u = carve(&kv->alibi, base, u, (size_t)c->n_head);
    /* the second norm and the embedding reuse buffers that are dead then */
    a->ln2 = a->ln1;
    a->ln2_mean = a->ln1_mean;
    a->ln2_rstd = a->ln1_rstd;
    a->lse = NULL;
    kv->emb = a->ln1;
    return u;
}

cllm_kv_cache_params cllm_kv_cache_params_default(void) {
    return (cllm_kv_cache_params){.max_seqs = 1, .max_pos = 0, .max_rows = 0, .block_size = DEFAULT_BLOCK,
                                  .n_blocks = 0};
}

static const char *limit_name(const cllm_model_config *c) {
    return c->arch == CLLM_ARCH_GPT2 ? "n_positions" : "max_position_embeddings";
}

cllm_status cllm_kv_cache_init_paged(cllm_kv_cache **out, const cllm_model *m, const cllm_kv_cache_params *p) {
    *out = NULL;
    const cllm_model_config *c = &m->cfg;
    if (!m->params) return CLLM_FAIL(CLLM_ERR_ARG, "the model holds no parameters");
    if (c->num_labels > 0)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "a sequence-classification (reward) model has no LM head to generate "
                         "with; score texts with `cllm score`");
    if ((unsigned)p->kv_dtype > CLLM_KV_BF16)
        return CLLM_FAIL(CLLM_ERR_ARG, "kv_dtype %d: expected CLLM_KV_AUTO, CLLM_KV_FP32 or CLLM_KV_BF16", (int)p->kv_dtype);
    if (p->max_seqs < 1 || p->max_pos < 0 || p->max_rows < 0 || p->block_size < 1 || p->n_blocks < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "max_seqs %d, max_pos %d, max_rows %d, block_size %d, n_blocks %d: need "
                         "max_seqs >= 1, block_size >= 1 and sizes >= 0", p->max_seqs, p->max_pos, p->max_rows,
                         p->block_size, p->n_blocks);
    int S = p->max_pos ? p->max_pos : (c->n_ctx > 0 ? c->n_ctx : DEFAULT_MAX_POS);
    if (c->n_ctx > 0 && S > c->n_ctx)
        return CLLM_FAIL(CLLM_ERR_ARG, "%d positions requested, but the %s model handles at most %d (%s)", S,
                         cllm_arch_name(c->arch), c->n_ctx, limit_name(c));
    int max_blocks = (S + p->block_size - 1) / p->block_size;
    size_t n_blocks = p->n_blocks ? (size_t)p->n_blocks : (size_t)p->max_seqs * (size_t)max_blocks;
    size_t rows = p->max_rows ? (size_t)p->max_rows : (size_t)p->max_seqs * (size_t)S;
    size_t kv_floats, row = (size_t)c->n_kv_head * c->head_dim, table_len;
    if (!cllm_size_mul(row, (size_t)p->block_size, &kv_floats) || !cllm_size_mul(kv_floats, n_blocks, &kv_floats) ||
        !cllm_size_mul(kv_floats, (size_t)c->n_layer, &kv_floats) || kv_floats > SIZE_MAX / sizeof(float) ||
        n_blocks > INT32_MAX ||
        !cllm_size_mul((size_t)p->max_seqs, (size_t)max_blocks, &table_len) || rows > ((size_t)1 << 28))
        return CLLM_FAIL(CLLM_ERR_NOMEM, "cache of %zu blocks of %d positions (%d sequences) is too large", n_blocks,
                         p->block_size, p->max_seqs);

    cllm_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    kv->m = m;
    kv->n_seq = p->max_seqs;
    kv->S = S;
    kv->max_rows = (int)rows;
    kv->block_size = p->block_size;
    kv->max_blocks = max_blocks;
    kv->n_blocks = (int)n_blocks;
    size_t scratch = assign(kv, NULL);
    size_t ns = (size_t)kv->n_seq;
    kv->past = calloc(ns, sizeof *kv->past);
    kv->call_past = calloc(ns, sizeof *kv->call_past);
    kv->seq_of = calloc(ns, sizeof *kv->seq_of);
    kv->rows = calloc(ns + 1, sizeof *kv->rows);
    kv->table = malloc(table_len * sizeof *kv->table);
    kv->call_table = malloc(table_len * sizeof *kv->call_table);
    kv->n_lock = malloc(ns * sizeof *kv->n_lock);
    kv->free_list = malloc(n_blocks * sizeof *kv->free_list);
    kv->kv_bf16 = cllm_kv_cache_dtype_for(m, p->kv_dtype) == CLLM_KV_BF16;
    const size_t vb = kv->kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    if (p->prefault) { /* every page written now: resident before the first step */
        kv->kc = cllm_calloc_huge(kv_floats, vb, "key cache");
        kv->vc = kv->kc ? cllm_calloc_huge(kv_floats, vb, "value cache") : NULL;
    } else {
        kv->kc = cllm_alloc_huge(kv_floats * vb, "key cache");
        kv->vc = kv->kc ? cllm_alloc_huge(kv_floats * vb, "value cache") : NULL;
    }
    kv->buf = kv->vc ? cllm_alloc(scratch * sizeof(float), "generation scratch") : NULL;
    if (kv->buf && m->tp_size > 1) {
        size_t part = (size_t)kv->n_seq * (size_t)c->vocab_size;
        kv->tp_gather = cllm_alloc((size_t)m->tp_size * part * sizeof(float), "tensor-parallel logits");
        kv->tp_counts = malloc((size_t)m->tp_size * sizeof *kv->tp_counts);
        kv->tp_msg = malloc((ns + rows) * sizeof *kv->tp_msg);
        if (!kv->tp_gather || !kv->tp_counts || !kv->tp_msg) {
            cllm_kv_cache_free(kv);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the tensor-parallel buffers");
        }
    }
    if (kv->buf && model_lp_scratch_init(&kv->lp, m, kv->max_rows, kv->n_seq)) {
        cllm_kv_cache_free(kv);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the operand scratch of %d rows", kv->max_rows);
    }
    if (!kv->buf || !kv->past || !kv->call_past || !kv->seq_of || !kv->rows || !kv->table || !kv->free_list ||
        !kv->call_table || !kv->n_lock) {
        cllm_kv_cache_free(kv);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for a cache of %zu blocks", n_blocks);
    }
    for (size_t i = 0; i < table_len; i++) kv->table[i] = -1;
    /* popped from the end: block 0 first */
    for (int i = 0; i < kv->n_blocks; i++) kv->free_list[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    assign(kv, kv->buf);
    if (c->arch == CLLM_ARCH_LLAMA) cllm_rope_tables(kv->rope_cos, kv->rope_sin, S, c->head_dim, c->rope_theta);
    if (c->arch == CLLM_ARCH_BLOOM && model_tp_alibi(m, kv->alibi)) {
        cllm_kv_cache_free(kv);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    /* tensor parallelism: the other ranks open the same cache (rank 0 sends
     * the resolved sizes and element type, so every rank's cache has the
     * same pool) */
    if (m->tp_size > 1 && m->tp_rank == 0) {
        kv->tp_id = model_tp_next_id();
        int32_t cmd[TP_CMD_LEN] = {TP_OP_INIT, kv->tp_id, kv->n_seq, kv->S, kv->max_rows, kv->block_size,
                                   kv->n_blocks, (kv->kv_bf16 ? CLLM_KV_BF16 : CLLM_KV_FP32) | (p->prefault ? 256 : 0)};
        cllm_status st = model_tp_announce(m, cmd, NULL, 0);
        if (st) {
            cllm_kv_cache_free(kv);
            return st;
        }
    }
    *out = kv;
    return CLLM_OK;
}

cllm_status cllm_kv_cache_init(cllm_kv_cache **out, const cllm_model *m, int B, int max_pos, int max_chunk) {
    *out = NULL;
    if (B < 1 || max_pos < 0 || max_chunk < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "batch %d, max_pos %d, max_chunk %d: need B >= 1 and sizes >= 0", B, max_pos,
                         max_chunk);
    const cllm_model_config *c = &m->cfg;
    int S = max_pos ? max_pos : (c->n_ctx > 0 ? c->n_ctx : DEFAULT_MAX_POS);
    int chunk = max_chunk && max_chunk < S ? max_chunk : S;
    if ((size_t)B * (size_t)chunk > ((size_t)1 << 28))
        return CLLM_FAIL(CLLM_ERR_NOMEM, "cache of %d x %d positions is too large", B, S);
    cllm_kv_cache_params p = cllm_kv_cache_params_default();
    p.max_seqs = B;
    p.max_pos = max_pos;
    p.max_rows = B * chunk;
    return cllm_kv_cache_init_paged(out, m, &p);
}

void cllm_kv_cache_free(cllm_kv_cache *kv) {
    if (!kv) return;
    if (kv->tp_id) { /* the other ranks free theirs (a failure here ends the job: see model_tp_announce) */
        int32_t cmd[TP_CMD_LEN] = {TP_OP_FREE, kv->tp_id};
        model_tp_announce(kv->m, cmd, NULL, 0);
    }
    cllm_free(kv->tp_gather);
    free(kv->tp_counts);
    free(kv->tp_msg);
    cllm_free(kv->kc);
    cllm_free(kv->vc);
    cllm_free(kv->buf);
    model_lp_scratch_free(&kv->lp);
    cllm_free(kv->lrows.scratch);
    free(kv->seq_adapter);
    free(kv->call_adapter);
    free(kv->iota);
    free(kv->past);
    free(kv->call_past);
    free(kv->seq_of);
    free(kv->rows);
    free(kv->table);
    free(kv->call_table);
    free(kv->n_lock);
    free(kv->free_list);
    free(kv);
}

int cllm_kv_cache_pos(const cllm_kv_cache *kv) { return kv->past[0]; }
bool cllm_kv_cache_is_bf16(const cllm_kv_cache *kv) { return kv->kv_bf16; }

cllm_kv_dtype cllm_kv_cache_dtype_for(const cllm_model *m, cllm_kv_dtype d) {
    if (d != CLLM_KV_AUTO) return d;
    return cllm_model_weights(m) != CLLM_WFMT_FP32 ? CLLM_KV_BF16 : CLLM_KV_FP32;
}

size_t cllm_kv_cache_value_bytes(const cllm_model *m, cllm_kv_dtype d) {
    return cllm_kv_cache_dtype_for(m, d) == CLLM_KV_BF16 ? sizeof(uint16_t) : sizeof(float);
}

static const char *const kv_dtype_names[] = {"auto", "fp32", "bf16"};

const char *cllm_kv_dtype_name(cllm_kv_dtype d) {
    return (unsigned)d <= CLLM_KV_BF16 ? kv_dtype_names[d] : NULL;
}

cllm_status cllm_kv_dtype_parse(const char *s, cllm_kv_dtype *out) {
    for (int d = CLLM_KV_AUTO; d <= CLLM_KV_BF16; d++)
        if (s && !strcmp(s, kv_dtype_names[d])) {
            *out = (cllm_kv_dtype)d;
            return CLLM_OK;
        }
    return CLLM_FAIL(CLLM_ERR_ARG, "key/value cache dtype '%s': expected auto, fp32 or bf16", s ? s : "(null)");
}
int cllm_kv_cache_capacity(const cllm_kv_cache *kv) { return kv->S; }
int cllm_kv_cache_max_seqs(const cllm_kv_cache *kv) { return kv->n_seq; }
int cllm_kv_cache_block_size(const cllm_kv_cache *kv) { return kv->block_size; }
int cllm_kv_cache_blocks_free(const cllm_kv_cache *kv) { return kv->n_free; }

int cllm_kv_cache_seq_pos(const cllm_kv_cache *kv, int seq) {
    return seq >= 0 && seq < kv->n_seq ? kv->past[seq] : -1;
}

/* Returns the blocks of sequence `seq` past position `pos` to the pool. */
static void release_from(cllm_kv_cache *kv, int seq, int pos) {
    int32_t *t = kv->table + (size_t)seq * kv->max_blocks;
    for (int b = (pos + kv->block_size - 1) / kv->block_size; b < kv->max_blocks && t[b] >= 0; b++) {
        kv->free_list[kv->n_free++] = t[b];
        t[b] = -1;
    }
}

cllm_status cllm_kv_cache_seq_rewind(cllm_kv_cache *kv, int seq, int pos) {
    if (seq < 0 || seq >= kv->n_seq)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence %d outside the cache's %d", seq, kv->n_seq);
    if (pos < 0 || pos > kv->past[seq])
        return CLLM_FAIL(CLLM_ERR_ARG, "cannot rewind sequence %d to position %d (filled: %d)", seq, pos,
                         kv->past[seq]);
    if (kv->tp_id) {
        int32_t cmd[TP_CMD_LEN] = {TP_OP_REWIND, kv->tp_id, seq, pos};
        TRY(model_tp_announce(kv->m, cmd, NULL, 0));
    }
    release_from(kv, seq, pos);
    kv->past[seq] = pos;
    return CLLM_OK;
}

cllm_status cllm_kv_cache_rewind(cllm_kv_cache *kv, int pos) {
    for (int i = 0; i < kv->n_seq; i++)
        if (pos < 0 || pos > kv->past[i])
            return CLLM_FAIL(CLLM_ERR_ARG, "cannot rewind to position %d (filled: %d)", pos, kv->past[i]);
    for (int i = 0; i < kv->n_seq; i++) cllm_kv_cache_seq_rewind(kv, i, pos);
    return CLLM_OK;
}

/* Checks a call and takes the blocks it needs; on failure nothing has
 * changed. Builds kv->rows / call_past / seq_of for the n_call sequences
 * that add rows. */
static cllm_status plan(cllm_kv_cache *kv, const int32_t *tokens, const int *n_new, int *n_call) {
    const cllm_model_config *c = &kv->m->cfg;
    const int V = cllm_model_vocab(kv->m); /* a tensor part: the whole vocabulary */
    long total = 0;
    int k = 0;
    kv->rows[0] = 0;
    for (int i = 0; i < kv->n_seq; i++) {
        int n = n_new[i];
        if (n < 0) return CLLM_FAIL(CLLM_ERR_ARG, "sequence %d: %d new tokens", i, n);
        if (n == 0) continue;
        if (n > kv->S - kv->past[i]) {
            if (c->n_ctx > 0 && kv->S == c->n_ctx)
                return CLLM_FAIL(CLLM_ERR_ARG,
                                 "positions %d..%d exceed the model's limit of %d positions (%s); shorten the prompt "
                                 "or generate fewer tokens",
                                 kv->past[i], kv->past[i] + n - 1, c->n_ctx, limit_name(c));
            return CLLM_FAIL(CLLM_ERR_ARG, "positions %d..%d exceed the cache's %d positions; init a larger cache",
                             kv->past[i], kv->past[i] + n - 1, kv->S);
        }
        for (int t = 0; t < n; t++) {
            int32_t id = tokens[total + t];
            if (id < 0 || id >= V)
                return CLLM_FAIL(CLLM_ERR_ARG, "token id %d (sequence %d, new token %d) is outside the vocabulary "
                                 "[0, %d)", id, i, t, V);
        }
        total += n;
        kv->seq_of[k] = i;
        kv->call_past[k] = kv->past[i];
        kv->rows[k + 1] = (int32_t)total;
        k++;
    }
    if (total > kv->max_rows)
        return CLLM_FAIL(CLLM_ERR_ARG, "%ld new rows in one call; this cache takes at most %d", total, kv->max_rows);
    int need = 0;
    for (int j = 0; j < k; j++) {
        int i = kv->seq_of[j], n = kv->rows[j + 1] - kv->rows[j];
        need += (kv->past[i] + n + kv->block_size - 1) / kv->block_size - (kv->past[i] + kv->block_size - 1) /
                                                                            kv->block_size;
    }
    if (need > kv->n_free)
        return CLLM_FAIL(CLLM_ERR_NOMEM, "the cache needs %d more blocks of %d positions, %d are free", need,
                         kv->block_size, kv->n_free);
    for (int j = 0; j < k; j++) {
        int i = kv->seq_of[j], end = kv->past[i] + kv->rows[j + 1] - kv->rows[j];
        int32_t *t = kv->table + (size_t)i * kv->max_blocks;
        for (int b = 0; b * kv->block_size < end; b++)
            if (t[b] < 0) t[b] = kv->free_list[--kv->n_free];
    }
    *n_call = k;
    return CLLM_OK;
}

/* The head of a tensor part: this rank's vocabulary columns of the call's
 * rows, gathered at rank 0 into logits (whole vocabulary, padding dropped);
 * the other ranks pass logits NULL. */
static cllm_status tp_head(cllm_kv_cache *kv, int W, int n_call, float *logits) {
    const cllm_model *m = kv->m;
    const int C = m->cfg.n_embd, Vl = m->cfg.vocab_size, V = cllm_model_vocab(m), tp = m->tp_size;
    const size_t part = (size_t)n_call * (size_t)Vl;
    TRY(model_linear_forward(m, &kv->lp, kv->tp_gather + (size_t)m->tp_rank * part, kv->lnf, W, NULL, n_call, C, Vl,
                             false));
    for (int r = 0; r < tp; r++) kv->tp_counts[r] = part;
    TRY(cllm_dist_g_gather_f32(m->tp_grp, kv->tp_gather, kv->tp_counts, 0));
    if (m->tp_rank != 0 || !logits) return CLLM_OK;
    for (int r = 0; r < tp; r++) {
        int n = V - r * Vl < Vl ? V - r * Vl : Vl; /* real columns of rank r */
        for (int j = 0; n > 0 && j < n_call; j++)
            memcpy(logits + (size_t)kv->seq_of[j] * V + (size_t)r * Vl, kv->tp_gather + r * part + (size_t)j * Vl,
                   (size_t)n * sizeof(float));
    }
    return CLLM_OK;
}

cllm_status cllm_kv_cache_set_adapters(cllm_kv_cache *kv, const struct cllm_lora_set *set) {
    if (kv->m->tp_size > 1)
        return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "LoRA adapters on a tensor-parallel part: not supported");
    if (kv->seq_adapter || !set) return CLLM_FAIL(CLLM_ERR_ARG, "the cache's adapters are set once, to a set");
    size_t ns = (size_t)kv->n_seq, nf = model_lora_rows_scratch(set, kv->max_rows);
    kv->seq_adapter = malloc(ns * sizeof *kv->seq_adapter);
    kv->call_adapter = malloc(ns * sizeof *kv->call_adapter);
    kv->iota = malloc((ns + 1) * sizeof *kv->iota);
    kv->lrows = (model_lora_rows){.set = set, .all = -1, .seg_adapter = kv->call_adapter,
                                  .scratch = cllm_alloc((nf ? nf : 16) * sizeof(float), "LoRA adapter rows")};
    if (!kv->seq_adapter || !kv->call_adapter || !kv->iota || !kv->lrows.scratch)
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the adapters' scratch of %d rows", kv->max_rows);
    for (size_t i = 0; i < ns; i++) kv->seq_adapter[i] = -1;
    for (size_t i = 0; i <= ns; i++) kv->iota[i] = (int32_t)i;
    return CLLM_OK;
}

cllm_status cllm_kv_cache_seq_adapter(cllm_kv_cache *kv, int seq, int adapter) {
    if (seq < 0 || seq >= kv->n_seq) return CLLM_FAIL(CLLM_ERR_ARG, "sequence %d outside the cache's %d", seq, kv->n_seq);
    int n = cllm_lora_set_count(kv->lrows.set);
    if (adapter < -1 || adapter >= n || (adapter >= 0 && !kv->seq_adapter))
        return CLLM_FAIL(CLLM_ERR_ARG, "adapter %d: the cache has %d (cllm_kv_cache_set_adapters)", adapter, n);
    if (kv->seq_adapter) kv->seq_adapter[seq] = adapter;
    return CLLM_OK;
}

static cllm_status run_rows_inner(cllm_kv_cache *kv, const int32_t *tokens, int n_call, float *logits);

/* Runs the planned rows (run_rows_inner) with each sequence's adapter. */
static cllm_status run_rows(cllm_kv_cache *kv, const int32_t *tokens, int n_call, float *logits) {
    if (!kv->seq_adapter) return run_rows_inner(kv, tokens, n_call, logits);
    bool any = false;
    for (int j = 0; j < n_call; j++) any |= (kv->call_adapter[j] = kv->seq_adapter[kv->seq_of[j]]) >= 0;
    kv->lrows.n_seg = n_call;
    kv->lrows.seg_rows = kv->rows;
    kv->lp.rows = any ? &kv->lrows : NULL;
    cllm_status st = run_rows_inner(kv, tokens, n_call, logits);
    kv->lp.rows = NULL;
    return st;
}

/* Runs the planned rows: embeddings, every block, and the head on the
 * last new row of each sequence that added rows. */
static cllm_status run_rows_inner(cllm_kv_cache *kv, const int32_t *tokens, int n_call, float *logits) {
    const cllm_model *m = kv->m;
    const cllm_model_config *c = &m->cfg;
    const int C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    /* the kernel reads tables by call entry */
    for (int j = 0; j < n_call; j++)
        memcpy(kv->call_table + (size_t)j * kv->max_blocks, kv->table + (size_t)kv->seq_of[j] * kv->max_blocks,
               (size_t)kv->max_blocks * sizeof *kv->table);
    model_rows rows = {.n_seq = n_call, .rows = kv->rows, .past = kv->call_past, .k = kv->kc, .v = kv->vc,
                       .kv_bf16 = kv->kv_bf16,
                       .layer_stride = (size_t)kv->n_blocks * c->n_kv_head * kv->block_size * c->head_dim,
                       .block_size = kv->block_size, .max_blocks = kv->max_blocks, .table = kv->call_table,
                       .rope_cos = kv->rope_cos, .rope_sin = kv->rope_sin, .alibi = kv->alibi};
    layer_acts *a = &kv->a;
    cllm_status st = model_embed_forward(m, a->x, kv->emb, a->ln1_mean, a->ln1_rstd, tokens, 0, 0, &rows);
    for (int l = 0; l < L && !st; l++) st = model_block_forward(m, &kv->lp, l, a, a->x, 0, 0, &rows, false);
    if (st) return st;
    for (int j = 0; j < n_call; j++)
        memcpy(kv->last + (size_t)j * C, a->x + ((size_t)kv->rows[j + 1] - 1) * C, (size_t)C * sizeof(float));
    model_norm_forward(m, kv->lnf, kv->lmean, kv->lrstd, kv->last, model_param(m, m->gslot[G_LNF_W]),
                       model_param(m, m->gslot[G_LNF_B]), n_call);
    int head = m->gslot[G_HEAD] >= 0 ? m->gslot[G_HEAD] : m->gslot[G_WTE];
    if (m->tp_size > 1) return tp_head(kv, head, n_call, logits);
    kv->lrows.seg_rows = kv->iota; /* the head's rows: one per call entry */
    /* one GEMM for every sequence of the call (the head weight is read
     * once); with some sequences idle, their rows of `logits` stay as they
     * were, so unless the call's are the first ones the rows go through the
     * scratch and are placed after */
    bool in_place = true; /* the call's sequences are 0 .. n_call - 1: their rows are logits' first ones */
    for (int j = 0; j < n_call; j++) in_place &= kv->seq_of[j] == j;
    if (in_place) return model_linear_forward(m, &kv->lp, logits, kv->lnf, head, NULL, n_call, C, V, false);
    TRY(model_linear_forward(m, &kv->lp, kv->head_out, kv->lnf, head, NULL, n_call, C, V, false));
    for (int j = 0; j < n_call; j++)
        memcpy(logits + (size_t)kv->seq_of[j] * V, kv->head_out + (size_t)j * V, (size_t)V * sizeof(float));
    return CLLM_OK;
}

int32_t model_kv_state(const cllm_kv_cache *kv) {
    uint32_t h = (uint32_t)kv->n_free;
    for (int i = 0; i < kv->n_seq; i++) h = h * 2654435761u + (uint32_t)kv->past[i];
    return (int32_t)(h & 0x7fffffffu);
}

cllm_status cllm_kv_cache_forward_ragged(cllm_kv_cache *kv, const int32_t *tokens, const int *n_new, float *logits) {
    int n_call = 0;
    const int32_t state = kv->tp_id ? model_kv_state(kv) : 0; /* before this call */
    TRY(plan(kv, tokens, n_new, &n_call));
    if (n_call == 0) return CLLM_OK;
    cllm_status st = CLLM_OK;
    if (kv->tp_id) { /* rank 0 of a part: the other ranks run the same call */
        int total = kv->rows[n_call];
        for (int i = 0; i < kv->n_seq; i++) kv->tp_msg[i] = n_new[i];
        memcpy(kv->tp_msg + kv->n_seq, tokens, (size_t)total * sizeof *tokens);
        int32_t cmd[TP_CMD_LEN] = {TP_OP_FORWARD, kv->tp_id, kv->n_seq + total, state};
        st = model_tp_announce(kv->m, cmd, kv->tp_msg, (size_t)(kv->n_seq + total));
    }
    if (!st) st = run_rows(kv, tokens, n_call, logits);
    if (st) { /* keep the positions: return the blocks this call took */
        for (int j = 0; j < n_call; j++) release_from(kv, kv->seq_of[j], kv->past[kv->seq_of[j]]);
        return st;
    }
    for (int j = 0; j < n_call; j++) kv->past[kv->seq_of[j]] += kv->rows[j + 1] - kv->rows[j];
    return CLLM_OK;
}

cllm_status cllm_kv_cache_forward(cllm_kv_cache *kv, const int32_t *tokens, int n, float *logits) {
    int chunk = kv->max_rows / kv->n_seq;
    if (n < 1 || n > chunk)
        return CLLM_FAIL(CLLM_ERR_ARG, "%d new tokens per sequence; this cache takes 1 to %d per call", n, chunk);
    for (int i = 0; i < kv->n_seq; i++) kv->n_lock[i] = n;
    return cllm_kv_cache_forward_ragged(kv, tokens, kv->n_lock, logits);
}
