/*
 * What an exporter needs to describe a loaded tokenizer to another runtime
 * (a GGUF file's tokenizer.ggml.* keys): each id's kind, whether the
 * pre-tokenizer is byte-level, whether encode adds BOS/EOS, and the BPE
 * merges in rank order. Read-only views of the loaded tables; nothing here
 * changes encoding.
 */
#include <stdlib.h>

#include "tok_impl.h"

cllm_token_kind cllm_tokenizer_token_kind(const cllm_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_ids || tok->tok_off[id] == UINT32_MAX) return CLLM_TOKEN_UNUSED;
    if (id == tok->model_unk || id == tok->unk) return CLLM_TOKEN_UNKNOWN;
    if (tok->tok_flags[id] & TK_F_SPECIAL) return CLLM_TOKEN_CONTROL;
    if (tok->tok_flags[id] & TK_F_ADDED) return CLLM_TOKEN_USER_DEFINED;
    if (tok->byte_fallback)
        for (int b = 0; b < 256; b++)
            if (tok->byte_fb[b] == id) return CLLM_TOKEN_BYTE;
    return CLLM_TOKEN_NORMAL;
}

bool cllm_tokenizer_is_byte_level(const cllm_tokenizer *tok) { return tok->byte_level; }

bool cllm_tokenizer_adds_bos(const cllm_tokenizer *tok) {
    return tok->bos >= 0 && tok->n_pre > 0 && tok->pre_ids[0] == tok->bos;
}

bool cllm_tokenizer_adds_eos(const cllm_tokenizer *tok) {
    return tok->eos >= 0 && tok->n_post > 0 && tok->post_ids[tok->n_post - 1] == tok->eos;
}

static int by_rank(const void *a, const void *b) {
    const tk_pair_ent *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

cllm_status cllm_tokenizer_merges(const cllm_tokenizer *tok, cllm_tokenizer_merge **out, size_t *n) {
    *out = NULL;
    *n = 0;
    const tk_pairmap *m = &tok->merges;
    if (m->n == 0 || !m->e) return CLLM_OK;
    tk_pair_ent *e = malloc(m->n * sizeof *e);
    cllm_tokenizer_merge *r = malloc(m->n * sizeof *r);
    if (!e || !r) {
        free(e);
        free(r);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for %zu merges", m->n);
    }
    size_t k = 0;
    for (size_t i = 0; i <= m->mask && k < m->n; i++)
        if (m->e[i].key != UINT64_MAX) e[k++] = m->e[i];
    qsort(e, k, sizeof *e, by_rank);
    for (size_t i = 0; i < k; i++) {
        r[i].left = (int32_t)(e[i].key >> 32);
        r[i].right = (int32_t)(uint32_t)e[i].key;
        r[i].merged = e[i].merged;
        r[i].rank = e[i].rank;
    }
    free(e);
    *out = r;
    *n = k;
    return CLLM_OK;
}
