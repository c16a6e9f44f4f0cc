/*
 * Encoding: the pipeline of include/cllm/tokenizer.h (UTF-8 repair, added
 * tokens on raw text, normalizer per segment, added tokens on normalized
 * text, pre-tokenizer, BPE, BOS/EOS) and the pool of per-call work states
 * that lets several threads encode with one tokenizer.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

static tk_work *work_new(void) {
    tk_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->md = pcre2_match_data_create(16, NULL);
    w->mctx = pcre2_match_context_create(NULL);
    w->cache = calloc(TK_CACHE_SLOTS, sizeof *w->cache);
    if (!w->md || !w->mctx || !w->cache) {
        tk_work_free(w);
        return NULL;
    }
    /* a larger JIT stack than the 32 KiB default; if it cannot be made the
     * default stack is used (and the interpreter needs none) */
    w->jstack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
    if (w->jstack) pcre2_jit_stack_assign(w->mctx, NULL, w->jstack);
    return w;
}

void tk_work_free(tk_work *w) {
    if (!w) return;
    pcre2_match_data_free(w->md);
    pcre2_match_context_free(w->mctx);
    pcre2_jit_stack_free(w->jstack);
    tk_str_free(&w->clean);
    tk_str_free(&w->norm);
    tk_str_free(&w->tmp);
    tk_pieces_free(&w->pieces[0]);
    tk_pieces_free(&w->pieces[1]);
    free(w->segs[0]);
    free(w->segs[1]);
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->soff);
    free(w->slen);
    free(w->heap);
    free(w->cache);
    free(w);
}

tk_work *tk_work_acquire(const cllm_tokenizer *tok, int *slot) {
    tk_pool *p = tok->pool;
    for (int i = 0; i < TK_POOL; i++) {
        if (atomic_flag_test_and_set(&p->busy[i])) continue;
        if (!p->w[i] && !(p->w[i] = work_new())) {
            atomic_flag_clear(&p->busy[i]);
            break;
        }
        *slot = i;
        return p->w[i];
    }
    /* every pooled state is in use: a private one for this call */
    *slot = -1;
    return work_new();
}

void tk_work_release(const cllm_tokenizer *tok, tk_work *w, int slot) {
    if (slot < 0) {
        tk_work_free(w);
        return;
    }
    /* keep pooled memory bounded after a huge input */
    if (w->sym_cap > (1u << 20) || w->heap_cap > (1u << 20) || w->clean.cap > (1u << 24) ||
        w->pieces[0].buf.cap > (1u << 24)) {
        tk_work_free(w);
        tok->pool->w[slot] = NULL;
    }
    atomic_flag_clear(&tok->pool->busy[slot]);
}

/* Pre-tokenizes and BPE-encodes one stretch of normalized text. */
static cllm_status encode_text(const cllm_tokenizer *tok, tk_work *w, const char *s, size_t n, bool at_start,
                               cllm_token_buf *out) {
    if (n == 0) return CLLM_OK;
    int r;
    cllm_status st = tk_pretok_run(tok->pretok, w, s, n, at_start, &r);
    if (st) return st;
    const tk_pieces *pl = &w->pieces[r];
    for (size_t i = 0; i < pl->n; i++) {
        st = tk_bpe_word(tok, w, pl->buf.p + pl->v[i].off, pl->v[i].len, out);
        if (st) return st;
    }
    return CLLM_OK;
}

static cllm_status encode_all(const cllm_tokenizer *tok, tk_work *w, const char *s, size_t n, bool add_special,
                              cllm_token_buf *out) {
    cllm_status st;
    if (add_special)
        for (size_t i = 0; i < tok->n_pre; i++)
            if (!tk_buf_push(out, tok->pre_ids[i])) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    size_t nseg;
    if ((st = tk_added_split(tok, &tok->trie_raw, w, 0, s, n, &nseg))) return st;
    for (size_t k = 0; k < nseg; k++) {
        tk_seg seg = w->segs[0][k];
        if (seg.id >= 0) {
            if (!tk_buf_push(out, seg.id)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            continue;
        }
        const char *t = s + seg.off;
        size_t tn = seg.len;
        bool at_start = seg.off == 0;
        if (tok->norm) {
            if ((st = tk_norm_apply(tok->norm, w, t, tn, &w->norm))) return st;
            t = w->norm.p;
            tn = w->norm.n;
        }
        if (!tok->has_norm_added) {
            if ((st = encode_text(tok, w, t, tn, at_start, out))) return st;
            continue;
        }
        size_t nsub;
        if ((st = tk_added_split(tok, &tok->trie_norm, w, 1, t, tn, &nsub))) return st;
        for (size_t j = 0; j < nsub; j++) {
            tk_seg sub = w->segs[1][j];
            if (sub.id >= 0) {
                if (!tk_buf_push(out, sub.id)) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            } else if ((st = encode_text(tok, w, t + sub.off, sub.len, at_start && sub.off == 0, out))) {
                return st;
            }
        }
    }
    if (add_special)
        for (size_t i = 0; i < tok->n_post; i++)
            if (!tk_buf_push(out, tok->post_ids[i])) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return CLLM_OK;
}

cllm_status cllm_tokenizer_encode(const cllm_tokenizer *tok, const char *text, size_t len, bool add_special,
                                  cllm_token_buf *out) {
    if (!tok || !out || (!text && len)) return CLLM_FAIL(CLLM_ERR_ARG, "tok, out and text must not be NULL");
    size_t n0 = out->n;
    int slot;
    tk_work *w = tk_work_acquire(tok, &slot);
    if (!w) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for the encoder state");
    const char *s = len ? text : "";
    if (tk_utf8_valid_prefix(s, len) != len) {
        w->clean.n = 0;
        if (!tk_utf8_lossy(&w->clean, s, len)) {
            tk_work_release(tok, w, slot);
            return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        }
        s = w->clean.p;
        len = w->clean.n;
    }
    cllm_status st = encode_all(tok, w, s, len, add_special, out);
    if (st) out->n = n0;
    tk_work_release(tok, w, slot);
    return st;
}
