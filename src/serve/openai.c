/*
 * The OpenAI routes: POST /v1/completions and /v1/chat/completions (with
 * n, streaming, stream_options.include_usage, logprobs) and GET /v1/models.
 * Finish reasons are OpenAI's: "stop" (an end-of-sequence token or a stop
 * string) and "length" (max_tokens or the context). Errors use OpenAI's
 * {"error": {"message", "type", "param", "code"}} with 400 for invalid
 * requests.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_impl.h"

static const char *oa_finish(cllm_finish_reason r) {
    return r == CLLM_FINISH_EOS || r == CLLM_FINISH_STOP_SEQUENCE ? "stop" : "length";
}

/* The text of one token on its own (for logprobs). */
static char *token_text(const cllm_server *s, int32_t id, size_t *len) {
    char *t = NULL;
    if (cllm_tokenizer_decode(s->tok, &id, 1, false, &t, len)) {
        *len = 0;
        return strdup("");
    }
    return t;
}

static json_t *bytes_json(const char *t, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)t[i]));
    return a;
}

/* Chat logprobs entries for tokens [from, to) of a sequence. */
static json_t *chat_logprobs(const cllm_server *s, const srv_job *j, const srv_seq *q, size_t from, size_t to) {
    json_t *content = json_array();
    for (size_t i = from; content && i < to; i++) {
        size_t n;
        char *t = token_text(s, q->toks[i].id, &n);
        json_t *top = json_array();
        for (int k = 0; k < j->gen.top_n; k++) {
            int32_t id = q->top_ids[i * (size_t)j->gen.top_n + k];
            if (id < 0) continue;
            size_t tn;
            char *tt = token_text(s, id, &tn);
            json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token", srv_jstr(tt ? tt : "", tn), "logprob",
                                                 srv_jnum(q->top_lp[i * (size_t)j->gen.top_n + k]), "bytes",
                                                 bytes_json(tt ? tt : "", tn)));
            free(tt);
        }
        json_array_append_new(content, json_pack("{s:o, s:o, s:o, s:o}", "token", srv_jstr(t ? t : "", n), "logprob",
                                                 srv_jnum(q->toks[i].raw), "bytes", bytes_json(t ? t : "", n),
                                                 "top_logprobs", top));
        free(t);
    }
    return json_pack("{s:o}", "content", content);
}

/* Completion logprobs {tokens, token_logprobs, top_logprobs, text_offset}
 * for the prompt (echo) and tokens [from, to). `offset` is where the first
 * token's text starts in the choice's text. */
static json_t *completion_logprobs(const cllm_server *s, const srv_job *j, const srv_seq *q, bool with_prompt,
                                   size_t from, size_t to, size_t offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int tn = j->gen.top_n;
    size_t np = with_prompt ? j->gen.n_ids : 0;
    for (size_t i = 0; i < np + (to - from); i++) {
        bool prompt = i < np;
        int32_t id = prompt ? j->gen.ids[i] : q->toks[from + i - np].id;
        size_t n;
        char *t = token_text(s, id, &n);
        json_array_append_new(tokens, srv_jstr(t ? t : "", n));
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += n;
        free(t);
        double lp = prompt ? (j->prompt_lp && i ? j->prompt_lp[i] : NAN) : q->toks[from + i - np].raw;
        json_array_append_new(lps, srv_jnum(lp));
        if (!tn || prompt) { /* no alternatives are computed for prompt tokens */
            json_array_append_new(tops, json_null());
            continue;
        }
        const int32_t *ids = q->top_ids + (from + i - np) * (size_t)tn;
        const float *tl = q->top_lp + (from + i - np) * (size_t)tn;
        json_t *o = json_object();
        for (int k = 0; k < tn; k++) {
            if (ids[k] < 0) continue;
            size_t tl_n;
            char *tt = token_text(s, ids[k], &tl_n);
            char *key = tt ? tt : strdup("");
            if (key) json_object_set_new(o, key, srv_jnum(tl[k]));
            free(key);
        }
        json_array_append_new(tops, o);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *usage_json(const srv_job *j) {
    size_t gen = 0;
    for (int i = 0; i < j->gen.n; i++) gen += j->seq[i].n_toks;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", (int)j->gen.n_ids, "completion_tokens", (int)gen,
                     "total_tokens", (int)(j->gen.n_ids + gen));
}

typedef struct {
    bool chat;
    char id[40];
    long long created;
    size_t *next;     /* per sequence: tokens sent */
    bool *head_sent;  /* per sequence: role / echo sent */
    bool *tail_sent;  /* per sequence: finish sent */
    size_t *offset;   /* per sequence: text offset (completions logprobs) */
    bool usage_sent, done_sent;
} oa_stream;

static void oa_stream_free(void *p) {
    oa_stream *st = p;
    if (!st) return;
    free(st->next);
    free(st->head_sent);
    free(st->tail_sent);
    free(st->offset);
    free(st);
}

static json_t *chunk(const cllm_server *s, const oa_stream *st, json_t *choice, const srv_job *j) {
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", st->id, "object",
                          st->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)st->created, "model",
                          srv_model_name(s, &j->gen), "choices", choice);
    if (c && j->gen.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

static bool oa_format(srv_job *j, void *state, char **buf, size_t *len, size_t *cap) {
    oa_stream *st = state;
    cllm_server *s = j->srv;
    if (j->err_status && !st->done_sent) {
        srv_buf_sse_json(buf, len, cap, json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", j->err, "type",
                                                  "server_error", "param", "code"), true);
        srv_buf_add(buf, len, cap, "data: [DONE]\n\n", 14);
        st->done_sent = true;
        return true;
    }
    bool all_done = true;
    for (int i = 0; i < j->gen.n; i++) {
        srv_seq *q = &j->seq[i];
        if (!st->head_sent[i]) {
            st->head_sent[i] = true;
            if (st->chat) {
                srv_buf_sse_json(buf, len, cap,
                                 chunk(s, st, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i, "delta", "role",
                                                        "assistant", "content", "", "logprobs", "finish_reason"), j),
                                 true);
            } else if (j->gen.echo) {
                size_t pl = strlen(j->gen.prompt_text);
                json_t *lp = j->gen.logprobs ? completion_logprobs(s, j, q, true, 0, 0, 0) : json_null();
                srv_buf_sse_json(buf, len, cap,
                                 chunk(s, st, json_pack("{s:o, s:i, s:o, s:n}", "text", srv_jstr(j->gen.prompt_text, pl),
                                                        "index", i, "logprobs", lp, "finish_reason"), j),
                                 true);
                st->offset[i] = pl;
            }
        }
        size_t to = q->n_toks;
        if (st->next[i] < to) {
            size_t from = st->next[i];
            size_t a = q->toks[from].text_off, b = q->toks[to - 1].text_off + q->toks[to - 1].text_len;
            bool final_now = q->done;
            if (final_now) b = q->text_len;
            json_t *choice;
            if (st->chat) {
                json_t *delta = b > a ? json_pack("{s:o}", "content", srv_jstr(q->text + a, b - a)) : json_object();
                choice = json_pack("{s:i, s:o, s:o, s:o}", "index", i, "delta", delta, "logprobs",
                                   j->gen.logprobs ? chat_logprobs(s, j, q, from, to) : json_null(), "finish_reason",
                                   final_now ? json_string(oa_finish(q->finish)) : json_null());
            } else {
                json_t *lp = j->gen.logprobs ? completion_logprobs(s, j, q, false, from, to, st->offset[i]) : json_null();
                choice = json_pack("{s:i, s:o, s:o, s:o}", "index", i, "text", srv_jstr(q->text + a, b - a), "logprobs",
                                   lp, "finish_reason", final_now ? json_string(oa_finish(q->finish)) : json_null());
                for (size_t k = from; k < to; k++) {
                    size_t n;
                    free(token_text(s, q->toks[k].id, &n));
                    st->offset[i] += n;
                }
            }
            srv_buf_sse_json(buf, len, cap, chunk(s, st, choice, j), true);
            st->next[i] = to;
            if (final_now) st->tail_sent[i] = true;
        }
        if (q->done && !st->tail_sent[i]) {
            st->tail_sent[i] = true;
            json_t *choice = st->chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", i, "delta", "logprobs",
                                                  "finish_reason", oa_finish(q->finish))
                                      : json_pack("{s:i, s:s, s:n, s:s}", "index", i, "text", "", "logprobs",
                                                  "finish_reason", oa_finish(q->finish));
            srv_buf_sse_json(buf, len, cap, chunk(s, st, choice, j), true);
        }
        if (!q->done) all_done = false;
    }
    if (j->cancel && !all_done) return true;
    if (!all_done) return false;
    if (j->gen.include_usage && !st->usage_sent) {
        st->usage_sent = true;
        srv_buf_sse_json(buf, len, cap,
                         json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", st->id, "object",
                                   st->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)st->created,
                                   "model", srv_model_name(s, &j->gen), "choices", "usage", usage_json(j)),
                         true);
    }
    if (!st->done_sent) {
        st->done_sent = true;
        srv_buf_add(buf, len, cap, "data: [DONE]\n\n", 14);
    }
    return true;
}

static void make_id(char *out, size_t n, const char *prefix) {
    static uint64_t counter;
    uint64_t x = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)time(NULL);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    snprintf(out, n, "%s%016llx", prefix, (unsigned long long)x);
}

enum MHD_Result srv_openai_complete(cllm_server *s, struct MHD_Connection *c, const json_t *body, bool chat) {
    srv_gen g;
    srv_err e = {0};
    if (srv_parse_openai(s, body, chat, &g, &e)) {
        srv_gen_free(&g);
        if (e.status < 500) {
            pthread_mutex_lock(&s->mu);
            s->met.req_validation++;
            pthread_mutex_unlock(&s->mu);
        }
        return srv_reply_openai_error_code(c, (unsigned)e.status, e.msg, e.code);
    }
    bool stream = g.stream;
    srv_job *j;
    if (srv_job_submit(s, &g, chat ? "chat_completions" : "completions", &j, &e))
        return srv_reply_openai_error(c, (unsigned)e.status, e.msg);
    srv_job_wait_submitted(j);
    if (j->err_status) {
        enum MHD_Result r = srv_reply_openai_error(c, j->err_status == 422 ? 400 : (unsigned)j->err_status, j->err);
        srv_job_release(j);
        return r;
    }
    oa_stream *st = calloc(1, sizeof *st);
    if (st) {
        st->chat = chat;
        make_id(st->id, sizeof st->id, chat ? "chatcmpl-" : "cmpl-");
        st->created = (long long)time(NULL);
        st->next = calloc((size_t)j->gen.n, sizeof *st->next);
        st->head_sent = calloc((size_t)j->gen.n, sizeof *st->head_sent);
        st->tail_sent = calloc((size_t)j->gen.n, sizeof *st->tail_sent);
        st->offset = calloc((size_t)j->gen.n, sizeof *st->offset);
    }
    if (!st || !st->next || !st->head_sent || !st->tail_sent || !st->offset) {
        oa_stream_free(st);
        srv_job_release(j);
        return MHD_NO;
    }
    if (stream) return srv_reply_sse(c, j, oa_format, st, oa_stream_free);
    if (!srv_wait_done(c, j)) {
        oa_stream_free(st);
        srv_job_release(j);
        return MHD_NO;
    }
    enum MHD_Result r;
    if (j->err_status) {
        r = srv_reply_openai_error(c, (unsigned)j->err_status, j->err);
    } else {
        json_t *choices = json_array();
        for (int i = 0; i < j->gen.n; i++) {
            srv_seq *q = &j->seq[i];
            json_t *ch;
            if (chat) {
                ch = json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", i, "message", "role", "assistant",
                               "content", srv_jstr(q->text, q->text_len), "refusal", "logprobs",
                               j->gen.logprobs ? chat_logprobs(s, j, q, 0, q->n_toks) : json_null(), "finish_reason",
                               oa_finish(q->finish));
            } else {
                size_t pl = j->gen.echo ? strlen(j->gen.prompt_text) : 0;
                char *text = malloc(pl + q->text_len + 1);
                if (text) {
                    memcpy(text, j->gen.prompt_text ? j->gen.prompt_text : "", pl);
                    memcpy(text + pl, q->text, q->text_len);
                }
                ch = json_pack("{s:o, s:i, s:o, s:s}", "text", text ? srv_jstr(text, pl + q->text_len) : NULL, "index", i,
                               "logprobs",
                               j->gen.logprobs ? completion_logprobs(s, j, q, j->gen.echo, 0, q->n_toks, 0) : json_null(),
                               "finish_reason", oa_finish(q->finish));
                free(text);
            }
            json_array_append_new(choices, ch);
        }
        json_t *res = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o}", "id", st->id, "object",
                                chat ? "chat.completion" : "text_completion", "created", (json_int_t)st->created, "model",
                                srv_model_name(s, &j->gen), "system_fingerprint", "cllm", "choices", choices, "usage", usage_json(j));
        r = srv_reply_json(c, 200, res);
    }
    oa_stream_free(st);
    srv_job_release(j);
    return r;
}

/* The base, then each adapter (with its base as "parent", as vLLM lists
 * LoRA modules). */
enum MHD_Result srv_openai_models(cllm_server *s, struct MHD_Connection *c) {
    json_int_t now = (json_int_t)time(NULL);
    json_t *data = json_array();
    json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", s->model_id, "object", "model", "created", now,
                                          "owned_by", "cllm"));
    for (int i = 0; i < cllm_lora_set_count(s->p.adapters); i++)
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id",
                                              cllm_lora_set_name(s->p.adapters, i), "object", "model", "created", now,
                                              "owned_by", "cllm", "root", cllm_lora_set_dir(s->p.adapters, i),
                                              "parent", s->model_id));
    return srv_reply_json(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}
