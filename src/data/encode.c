/*
 * Rendered samples -> token ids and labels. Each text segment is encoded on
 * its own (no special tokens), so a token never straddles a prompt/answer
 * boundary and the loss mask lines up with the tokens exactly. The price:
 * at a boundary the ids can differ from encoding the whole string at once
 * (as with every prompt/answer-split SFT pipeline). Truncation and padding
 * are the caller's (prepare.c, loader.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cllm/sample.h"
#include "data/data_impl.h"

static cllm_status push(cllm_token_buf *b, int32_t v) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory encoding a sample");
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = v;
    return CLLM_OK;
}

static cllm_status at_fail(const cllm_loc *w, cllm_status st, const char *msg, int a, int b) {
    if (w)
        return cllm_fail_at(st, w->file, w->line, w->col, "%s (%d, vocabulary %d)", msg, a, b);
    return cllm_fail(st, "cllm_sample_encode", "%s (%d, vocabulary %d)", msg, a, b);
}

cllm_status cllm_sample_encode(const cllm_sample *s, const cllm_tokenizer *tok, const cllm_template *t,
                               int vocab_size, const cllm_loc *where, cllm_token_buf *ids, cllm_token_buf *labels) {
    size_t n0 = ids->n, l0 = labels->n;
    cllm_status st = CLLM_OK;
    if (s->type == CLLM_SAMPLE_TOKENS) {
        for (size_t i = 0; i < s->n_ids && !st; i++) {
            st = push(ids, s->ids[i]);
            if (!st) st = push(labels, s->labels[i]);
        }
        goto done;
    }
    if (!tok) {
        st = where ? cllm_fail_at(CLLM_ERR_ARG, where->file, where->line, where->col,
                                  "a %s record needs a tokenizer (--tokenizer DIR)", cllm_sample_type_name(s->type))
                   : CLLM_FAIL(CLLM_ERR_ARG, "text records need a tokenizer");
        goto done;
    }
    bool want_bos = cllm_template_wants_bos(t, tok);
    for (size_t i = 0; i < s->n_seg && !st; i++) {
        const cllm_segment *g = &s->seg[i];
        if (g->kind == CLLM_SEG_TEXT) {
            size_t before = ids->n;
            st = cllm_tokenizer_encode(tok, s->text + g->off, g->len, false, ids);
            for (size_t k = before; k < ids->n && !st; k++) st = push(labels, g->loss ? ids->ids[k] : -100);
            continue;
        }
        if (g->kind == CLLM_SEG_BOS && !want_bos) continue;
        int32_t id = g->kind == CLLM_SEG_BOS ? cllm_tokenizer_bos_id(tok) : cllm_tokenizer_eos_id(tok);
        if (id < 0) {
            st = at_fail(where, CLLM_ERR_ARG,
                         g->kind == CLLM_SEG_BOS ? "the template wants a BOS token but the tokenizer has none"
                                                 : "the template wants an EOS token but the tokenizer has none "
                                                   "(set \"eos\": false in a template file)",
                         id, vocab_size);
            break;
        }
        st = push(ids, id);
        if (!st) st = push(labels, g->loss ? id : -100);
    }
    if (!st && vocab_size > 0)
        for (size_t k = n0; k < ids->n; k++)
            if (ids->ids[k] < 0 || ids->ids[k] >= vocab_size) {
                st = at_fail(where, CLLM_ERR_ARG, "the tokenizer produced a token id outside the model's vocabulary",
                             ids->ids[k], vocab_size);
                break;
            }
done:
    if (st) {
        ids->n = n0;
        labels->n = l0;
    }
    return st;
}
