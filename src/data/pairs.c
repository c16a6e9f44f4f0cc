/*
 * Preference pairs (docs/alignment.md): JSONL records in trl's standard
 * format, each turned into two rows of the loader's store, chosen then
 * rejected, sharing the prompt.
 *
 *   {"prompt": "...", "chosen": "...", "rejected": "..."}
 *       prompt ids = [BOS] + encode(prompt), BOS when the tokenizer's
 *       post-processor adds one (LLaMA's, not GPT-2's); completion ids =
 *       encode(completion) + [EOS] (when the tokenizer has one); texts are
 *       encoded without the post-processor's special tokens: the rows
 *       trl's DPO trainer builds for `prompt + chosen`.
 *       Without "prompt" (trl's implicit prompt, the reward trainer's
 *       format) the prompt is [BOS] alone (or nothing).
 *   {"prompt_input_ids": [...], "chosen_input_ids": [...],
 *    "rejected_input_ids": [...]}
 *       used as given: nothing added; prompt_input_ids may be left out.
 *   {"input_ids_chosen": [...], "input_ids_rejected": [...]}
 *       trl's tokenized reward pairs: whole rows, used as given.
 * An optional "margin" number (trl's reward data) is kept per pair.
 *
 * Labels are -100 on the prompt (and, from fill_row, on padding), the ids
 * on the completion. A row longer than T keeps its last T tokens (trl's
 * truncation_mode "keep_end"): the prompt is cut from its start first.
 */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/tokenizer.h"
#include "data/data_impl.h"

static cllm_status push(cllm_token_buf *b, int32_t v) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = v;
    return CLLM_OK;
}

/* Reads key as an array of ids in [0, vocab) into out. */
static cllm_status get_ids(json_t *o, const char *key, const cllm_loc *l, int vocab, cllm_token_buf *out) {
    json_t *a = json_object_get(o, key);
    if (!a) return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "missing key \"%s\"", key);
    if (!json_is_array(a))
        return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "\"%s\": expected an array of token ids", key);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v))
            return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "\"%s\"[%zu]: expected an integer token id",
                                key, i);
        json_int_t x = json_integer_value(v);
        if (x < 0 || (vocab > 0 && x >= vocab))
            return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                                "\"%s\"[%zu]: token id %lld is outside the vocabulary [0, %d)", key, i, (long long)x,
                                vocab);
        cllm_status st = push(out, (int32_t)x);
        if (st) return st;
    }
    return CLLM_OK;
}

static cllm_status get_text(json_t *o, const char *key, const cllm_loc *l, const cllm_tokenizer *tok,
                            cllm_token_buf *out) {
    json_t *s = json_object_get(o, key);
    if (!s) return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "missing key \"%s\"", key);
    if (!json_is_string(s))
        return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "\"%s\": expected a string", key);
    return cllm_tokenizer_encode(tok, json_string_value(s), json_string_length(s), false, out);
}

/* Whether the tokenizer's post-processor starts a text with BOS (LLaMA's
 * does, GPT-2's does not): *state 1 if so, else -1. */
static cllm_status adds_bos(const cllm_tokenizer *tok, int *state) {
    cllm_token_buf b = {0};
    int32_t bos = cllm_tokenizer_bos_id(tok);
    cllm_status st = cllm_tokenizer_encode(tok, "", 0, true, &b);
    *state = !st && bos >= 0 && b.n > 0 && b.ids[0] == bos ? 1 : -1;
    cllm_token_buf_free(&b);
    return st;
}

/* One row: the last T tokens of prompt + completion, labels -100 on the
 * prompt. A row must score at least one token: a completion token after
 * the row's first (the first token has nothing before it to predict it). */
static cllm_status append_row(cllm_store *mem, const cllm_token_buf *p, const cllm_token_buf *c, int T,
                              const cllm_loc *l, const char *which, cllm_token_buf *ids, cllm_token_buf *labels) {
    ids->n = labels->n = 0;
    size_t n = p->n + c->n, skip = n > (size_t)T ? n - (size_t)T : 0;
    if (n < 2 || (p->n == 0 && c->n < 2))
        return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                            "the %s row scores no token: with an empty prompt the completion needs 2 tokens or more",
                            which);
    cllm_status st = CLLM_OK;
    for (size_t i = skip; i < n && !st; i++) {
        bool is_prompt = i < p->n;
        int32_t x = is_prompt ? p->ids[i] : c->ids[i - p->n];
        st = push(ids, x);
        if (!st) st = push(labels, is_prompt ? -100 : x);
    }
    return st ? st : cllm_store_append(mem, ids->ids, labels->ids, ids->n);
}

/* Per-row extras being read: grown to hold rows [0, n_rows + 2). */
typedef struct {
    cllm_pair_extra x;
    size_t cap;
    bool any_margin, any_single;
} extras;

/* The record's "margin" (a finite number; 0 when absent) and single flag
 * for the two rows from n_rows. */
static cllm_status put_extras(extras *e, json_t *o, const cllm_loc *l, size_t n_rows, bool single) {
    json_t *v = json_object_get(o, "margin");
    double x = 0;
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !(fabs(json_number_value(v)) <= FLT_MAX))
            return cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                                "\"margin\": expected a finite number (within float range)");
        x = json_number_value(v);
        e->any_margin = true;
    }
    e->any_single |= single;
    if (n_rows + 2 > e->cap) {
        size_t c = e->cap ? 2 * e->cap : 128;
        float *p = realloc(e->x.margin, c * sizeof *p);
        if (p) e->x.margin = p;
        unsigned char *q = p ? realloc(e->x.single, c) : NULL;
        if (q) e->x.single = q;
        if (!q) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        e->cap = c;
    }
    e->x.margin[n_rows] = e->x.margin[n_rows + 1] = (float)x;
    e->x.single[n_rows] = e->x.single[n_rows + 1] = single;
    return CLLM_OK;
}

/* A record of one text (cllm score): {"input_ids"}, {"text"} or
 * {"prompt", "completion"}, with no "chosen". */
static bool is_single(json_t *o) {
    return !json_object_get(o, "chosen") && !json_object_get(o, "chosen_input_ids") &&
           !json_object_get(o, "input_ids_chosen") &&
           (json_object_get(o, "input_ids") || json_object_get(o, "text") || json_object_get(o, "completion"));
}

cllm_status cllm_pairs_load(cllm_store *mem, int32_t *pad, cllm_pair_extra *extra, bool singles, const char *path,
                            const char *tokenizer, int vocab, int T) {
    cllm_record_reader *rd = NULL;
    extras ex;
    memset(&ex, 0, sizeof ex);
    memset(extra, 0, sizeof *extra);
    cllm_tokenizer *tok = NULL;
    cllm_token_buf p = {0}, c = {0}, r = {0}, ids = {0}, labels = {0};
    int bos_state = 0; /* 0 not known yet, 1 the tokenizer adds BOS, -1 it does not */
    cllm_pairs_chat chat = {0};
    *pad = 0;
    cllm_status st = cllm_records_open(&rd, path);
    while (!st) {
        cllm_record rec;
        bool got;
        if ((st = cllm_records_next(rd, &rec, &got)) || !got) break;
        const cllm_loc *l = &rec.loc;
        if (rec.kind != CLLM_REC_JSON) {
            st = cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col,
                              "a preference record must be a JSON object with \"prompt\", \"chosen\", \"rejected\"");
            break;
        }
        json_error_t err;
        json_t *o = json_loadb(rec.text, rec.len, JSON_REJECT_DUPLICATES, &err);
        if (!o || !json_is_object(o)) {
            st = cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "%s%s",
                              o ? "a preference record must be a JSON object" : "malformed JSON: ", o ? "" : err.text);
            json_decref(o);
            break;
        }
        p.n = c.n = r.n = 0;
        const bool single = singles && is_single(o);
        const char *kc = single ? "completion" : "chosen", *kr = single ? "completion" : "rejected";
        st = put_extras(&ex, o, l, mem->n, single);
        if (!st && single && json_object_get(o, "input_ids")) {
            st = get_ids(o, "input_ids", l, vocab, &c);
            if (!st) st = get_ids(o, "input_ids", l, vocab, &r);
        } else if (!st && json_object_get(o, "input_ids_chosen")) { /* trl's tokenized reward pairs: whole rows */
            st = get_ids(o, "input_ids_chosen", l, vocab, &c);
            if (!st) st = get_ids(o, "input_ids_rejected", l, vocab, &r);
        } else if (!st && (json_object_get(o, "prompt_input_ids") || json_object_get(o, "chosen_input_ids"))) {
            /* no prompt_input_ids: an implicit prompt, the rows are the completions */
            if (json_object_get(o, "prompt_input_ids") || !json_object_get(o, "chosen_input_ids"))
                st = get_ids(o, "prompt_input_ids", l, vocab, &p);
            if (!st) st = get_ids(o, "chosen_input_ids", l, vocab, &c);
            if (!st) st = get_ids(o, "rejected_input_ids", l, vocab, &r);
        } else if (!st) {
            if (!tokenizer)
                st = cllm_fail_at(CLLM_ERR_ARG, l->file, l->line, l->col,
                                  "a text preference record needs a tokenizer (--tokenizer DIR)");
            else if (!tok && (st = cllm_tokenizer_load(&tok, tokenizer))) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", cllm_last_error());
                st = cllm_fail_at(st, l->file, l->line, l->col,
                                  "a text preference record needs a tokenizer (--tokenizer DIR): %s", msg);
            } else if (vocab > 0 && cllm_tokenizer_vocab_size(tok) > vocab) {
                st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: the tokenizer's %d ids do not fit the model's vocabulary of %d",
                               tokenizer, (int)cllm_tokenizer_vocab_size(tok), vocab);
            }
            int32_t eos = tok ? cllm_tokenizer_eos_id(tok) : -1;
            if (single && json_object_get(o, "text")) kc = kr = "text";
            if (!st && cllm_pairs_is_chat(o, kc)) { /* message lists: the chat template writes any BOS */
                char *text[3];
                st = cllm_pairs_chat_render(&chat, tokenizer, tok, o, l, kc, kr, text);
                cllm_token_buf *dst[3] = {&p, &c, &r};
                for (int i = 0; i < 3 && !st; i++)
                    st = cllm_tokenizer_encode(tok, text[i], strlen(text[i]), false, dst[i]);
                for (int i = 0; i < 3; i++) free(text[i]);
            } else {
                if (!st && bos_state == 0) st = adds_bos(tok, &bos_state);
                if (!st && bos_state > 0) st = push(&p, cllm_tokenizer_bos_id(tok));
                /* no "prompt": trl's implicit prompt, inside chosen and rejected */
                if (!st && json_object_get(o, "prompt")) st = get_text(o, "prompt", l, tok, &p);
                if (!st) st = get_text(o, kc, l, tok, &c);
                if (!st) st = get_text(o, kr, l, tok, &r);
            }
            if (!st && c.n && eos >= 0) st = push(&c, eos);
            if (!st && r.n && eos >= 0) st = push(&r, eos);
        }
        json_decref(o);
        if (!st && (c.n == 0 || r.n == 0))
            st = cllm_fail_at(CLLM_ERR_FORMAT, l->file, l->line, l->col, "empty %s completion",
                              c.n == 0 ? "chosen" : "rejected");
        if (!st) st = append_row(mem, &p, &c, T, l, "chosen", &ids, &labels);
        if (!st) st = append_row(mem, &p, &r, T, l, "rejected", &ids, &labels);
    }
    if (!st && mem->n == 0) st = CLLM_FAIL(CLLM_ERR_FORMAT, "%s: no preference pairs", path);
    if (!st && ex.any_margin) {
        extra->margin = ex.x.margin;
        ex.x.margin = NULL;
    }
    if (!st && ex.any_single) {
        extra->single = ex.x.single;
        ex.x.single = NULL;
    }
    free(ex.x.margin);
    free(ex.x.single);
    if (tok) {
        int32_t pd = cllm_tokenizer_pad_id(tok), e = cllm_tokenizer_eos_id(tok);
        *pad = pd >= 0 ? pd : e >= 0 ? e : 0;
    }
    cllm_pairs_chat_free(&chat);
    cllm_tokenizer_free(tok);
    cllm_records_close(rd);
    cllm_token_buf_free(&p);
    cllm_token_buf_free(&c);
    cllm_token_buf_free(&r);
    cllm_token_buf_free(&ids);
    cllm_token_buf_free(&labels);
    return st;
}
