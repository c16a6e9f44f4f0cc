/*
 * The text-generation-inference routes: POST /generate, /generate_stream
 * and / (the compatibility route: a one-element list, or a stream when the
 * body says "stream": true), POST /tokenize and GET /info. Response and
 * event shapes follow TGI's API: finish reasons "length", "eos_token",
 * "stop_sequence"; errors {"error", "error_type"}.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

static const char *tgi_finish(cllm_finish_reason r) {
    switch (r) {
    case CLLM_FINISH_EOS: return "eos_token";
    case CLLM_FINISH_STOP_SEQUENCE: return "stop_sequence";
    default: return "length";
    }
}

/* The log-probability TGI reports: that of the distribution the token was
 * drawn from (the raw one for greedy decoding). */
static double tok_logprob(const srv_job *j, const srv_tok *t) { return j->gen.sampling ? t->logprob : t->raw; }

static json_t *token_json(const cllm_server *s, const srv_job *j, const srv_seq *q, size_t i) {
    const srv_tok *t = &q->toks[i];
    (void)s;
    return json_pack("{s:i, s:o, s:o, s:b}", "id", (int)t->id, "text", srv_jstr(q->text + t->text_off, t->text_len),
                     "logprob", srv_jnum(tok_logprob(j, t)), "special", t->special);
}

/* The alternatives of one position: [{id, text, logprob, special}]. */
static json_t *top_json(const cllm_server *s, const int32_t *ids, const float *lp, int n) {
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++) {
        if (ids[k] < 0) continue;
        char *text = NULL;
        size_t len = 0;
        if (cllm_tokenizer_decode(s->tok, &ids[k], 1, false, &text, &len)) len = 0;
        json_array_append_new(a, json_pack("{s:i, s:o, s:o, s:b}", "id", (int)ids[k], "text", srv_jstr(text ? text : "", len),
                                           "logprob", srv_jnum(lp[k]), "special", cllm_tokenizer_is_special(s->tok, ids[k])));
        free(text);
    }
    return a;
}

static json_t *generated_text(const srv_job *j, const srv_seq *q) {
    if (!j->gen.full_text) return srv_jstr(q->text, q->text_len);
    size_t a = strlen(j->gen.prompt_text);
    char *t = malloc(a + q->text_len + 1);
    if (!t) return NULL;
    memcpy(t, j->gen.prompt_text, a);
    memcpy(t + a, q->text, q->text_len);
    json_t *r = srv_jstr(t, a + q->text_len);
    free(t);
    return r;
}

static json_t *prefill_json(const cllm_server *s, const srv_job *j) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < j->gen.n_ids; i++) {
        char *text = NULL;
        size_t len = 0;
        if (cllm_tokenizer_decode(s->tok, &j->gen.ids[i], 1, false, &text, &len)) len = 0;
        json_t *lp = j->prompt_lp && i > 0 ? srv_jnum(j->prompt_lp[i]) : json_null();
        json_array_append_new(a, json_pack("{s:i, s:o, s:o}", "id", (int)j->gen.ids[i], "text", srv_jstr(text ? text : "", len),
                                           "logprob", lp));
        free(text);
    }
    return a;
}

static json_t *details_json(const cllm_server *s, const srv_job *j, const srv_seq *q) {
    json_t *tokens = json_array(), *top = j->gen.top_n ? json_array() : NULL;
    for (size_t i = 0; i < q->n_toks; i++) {
        json_array_append_new(tokens, token_json(s, j, q, i));
        if (top)
            json_array_append_new(top, top_json(s, q->top_ids + i * (size_t)j->gen.top_n,
                                                q->top_lp + i * (size_t)j->gen.top_n, j->gen.top_n));
    }
    json_t *d = json_pack("{s:s, s:i, s:o, s:o, s:o}", "finish_reason", tgi_finish(q->finish), "generated_tokens",
                          (int)q->n_toks, "seed", j->gen.sampling ? json_integer((json_int_t)j->gen.gp.seed) : json_null(),
                          "prefill", j->gen.prompt_logprobs ? prefill_json(s, j) : json_array(), "tokens", tokens);
    if (d && top) json_object_set_new(d, "top_tokens", top);
    else json_decref(top);
    return d;
}

/* ---- streaming ---- */
typedef struct {
    size_t next;
} tgi_stream;

static bool tgi_format(srv_job *j, void *state, char **buf, size_t *len, size_t *cap) {
    tgi_stream *st = state;
    cllm_server *s = j->srv;
    srv_seq *q = &j->seq[0];
    if (j->err_status) {
        srv_buf_sse_json(buf, len, cap, json_pack("{s:s, s:s}", "error", j->err, "error_type", "generation"), false);
        return true;
    }
    while (st->next < q->n_toks) {
        size_t i = st->next;
        bool last = q->done && i + 1 == q->n_toks;
        json_t *ev = json_pack("{s:i, s:o, s:o, s:o}", "index", (int)i + 1, "token", token_json(s, j, q, i),
                               "generated_text", last ? generated_text(j, q) : json_null(), "details",
                               last && j->gen.details
                                   ? json_pack("{s:s, s:i, s:o, s:i}", "finish_reason", tgi_finish(q->finish),
                                               "generated_tokens", (int)q->n_toks, "seed",
                                               j->gen.sampling ? json_integer((json_int_t)j->gen.gp.seed) : json_null(),
                                               "input_length", (int)j->gen.n_ids)
                                   : json_null());
        if (ev && j->gen.top_n)
            json_object_set_new(ev, "top_tokens", top_json(s, q->top_ids + i * (size_t)j->gen.top_n,
                                                           q->top_lp + i * (size_t)j->gen.top_n, j->gen.top_n));
        if (!srv_buf_sse_json(buf, len, cap, ev, false)) return true;
        st->next++;
    }
    return (q->done && st->next >= q->n_toks) || j->cancel;
}

enum MHD_Result srv_tgi_generate(cllm_server *s, struct MHD_Connection *c, const json_t *body, bool stream,
                                 bool compat) {
    srv_gen g;
    srv_err e = {0};
    if (srv_parse_tgi(s, body, &g, &e)) {
        srv_gen_free(&g);
        if (e.status == 422) {
            pthread_mutex_lock(&s->mu);
            s->met.req_validation++;
            pthread_mutex_unlock(&s->mu);
        }
        return srv_reply_tgi_error(c, (unsigned)e.status, e.msg);
    }
    if (!compat && g.stream) g.stream = false; /* "stream" in the body only matters on / */
    srv_job *j;
    if (srv_job_submit(s, &g, stream ? "generate_stream" : "generate", &j, &e))
        return srv_reply_tgi_error(c, (unsigned)e.status, e.msg);
    srv_job_wait_submitted(j);
    if (j->err_status) {
        enum MHD_Result r = srv_reply_tgi_error(c, (unsigned)j->err_status, j->err);
        srv_job_release(j);
        return r;
    }
    if (stream) {
        tgi_stream *st = calloc(1, sizeof *st);
        if (!st) {
            srv_job_release(j);
            return MHD_NO;
        }
        return srv_reply_sse(c, j, tgi_format, st, free);
    }
    if (!srv_wait_done(c, j)) {
        srv_job_release(j);
        return MHD_NO; /* the client left */
    }
    enum MHD_Result r;
    if (j->err_status) {
        r = srv_reply_tgi_error(c, (unsigned)j->err_status, j->err);
    } else {
        srv_seq *q = &j->seq[0];
        json_t *res = json_pack("{s:o}", "generated_text", generated_text(j, q));
        if (res && j->gen.details) json_object_set_new(res, "details", details_json(s, j, q));
        if (compat) {
            json_t *a = json_array();
            json_array_append_new(a, res);
            res = a;
        }
        r = srv_reply_json(c, 200, res);
    }
    srv_job_release(j);
    return r;
}

enum MHD_Result srv_tgi_tokenize(cllm_server *s, struct MHD_Connection *c, const json_t *body) {
    const json_t *in = json_object_get(body, "inputs");
    if (!json_is_object(body) || !json_is_string(in))
        return srv_reply_tgi_error(c, 422, "`inputs` must be a string");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)body, k, v) if (strcmp(k, "inputs") && strcmp(k, "parameters")) {
        char msg[200];
        snprintf(msg, sizeof msg, "unknown field `%s`", k);
        return srv_reply_tgi_error(c, 422, msg);
    }
    cllm_token_buf b = {0};
    if (cllm_tokenizer_encode(s->tok, json_string_value(in), json_string_length(in), true, &b)) {
        cllm_token_buf_free(&b);
        return srv_reply_tgi_error(c, 500, cllm_last_error());
    }
    /* Offsets in the decoded text, piece by piece. */
    cllm_text_stream *ts = NULL;
    json_t *a = json_array();
    size_t off = 0;
    char *all = NULL;
    size_t all_len = 0, all_cap = 0;
    bool ok = a && !cllm_text_stream_init(&ts, s->tok, NULL, 0);
    for (size_t i = 0; ok && i < b.n; i++) {
        const char *piece;
        size_t n, rn = 0;
        ok = !cllm_text_stream_push(ts, b.ids[i], &piece, &n) && srv_buf_add(&all, &all_len, &all_cap, piece, n);
        if (ok && i + 1 == b.n) /* what the stream still holds belongs to the last token */
            ok = !cllm_text_stream_finish(ts, &piece, &rn) && srv_buf_add(&all, &all_len, &all_cap, piece, rn);
        if (!ok) break;
        n += rn;
        json_array_append_new(a, json_pack("{s:i, s:o, s:i, s:i}", "id", (int)b.ids[i], "text", srv_jstr(all + off, n),
                                           "start", (int)off, "stop", (int)(off + n)));
        off += n;
    }
    cllm_text_stream_free(ts);
    free(all);
    cllm_token_buf_free(&b);
    if (!ok) {
        json_decref(a);
        return srv_reply_tgi_error(c, 500, "tokenization failed");
    }
    return srv_reply_json(c, 200, a);
}

enum MHD_Result srv_tgi_info(cllm_server *s, struct MHD_Connection *c) {
    int tokens;
    cllm_server_pool(s, &tokens, NULL);
    /* the weight format when it is not fp32 (bf16, int8, q4), else the matmul precision */
    const char *dtype = cllm_model_weights(s->m) != CLLM_WFMT_FP32 ? cllm_wfmt_name(cllm_model_weights(s->m))
                                                                  : cllm_precision_name(cllm_model_precision(s->m));
    json_t *j = json_pack(
        "{s:s, s:n, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:n, s:n}", "model_id",
        s->model_id, "model_sha", "model_dtype", dtype, "model_device_type", "cpu", "model_pipeline_tag",
        "text-generation", "max_concurrent_requests", s->p.max_concurrent_requests, "max_best_of", 1,
        "max_stop_sequences", s->p.max_stop_sequences, "max_input_tokens", s->p.max_input_tokens, "max_input_length",
        s->p.max_input_tokens, "max_total_tokens", s->p.max_total_tokens, "max_batch_total_tokens", tokens,
        "max_batch_size", s->p.max_batch_size, "max_client_batch_size", 1, "validation_workers", 1, "router", "cllm",
        "version", s->p.version ? s->p.version : "", "sha", "docker_label");
    /* tensor parallelism: the ranks and what each holds (weights, KV cache) */
    size_t pool_bytes = 0;
    cllm_server_pool(s, NULL, &pool_bytes);
    if (j) {
        json_object_set_new(j, "tensor_parallel_size", json_integer(cllm_model_tensor_size(s->m)));
        json_object_set_new(j, "rank_weight_bytes", json_integer((json_int_t)cllm_model_held_bytes(s->m)));
        json_object_set_new(j, "rank_kv_cache_bytes", json_integer((json_int_t)pool_bytes));
        json_object_set_new(j, "kv_cache_dtype",
                            json_string(cllm_kv_dtype_name(cllm_kv_cache_dtype_for(s->m, s->p.kv_dtype))));
        json_t *ad = json_array(); /* LoRA adapters: what a request's adapter_id may name */
        for (int i = 0; i < cllm_lora_set_count(s->p.adapters); i++) {
            const cllm_lora_config *lc = cllm_lora_set_config(s->p.adapters, i);
            json_array_append_new(ad, json_pack("{s:s, s:s, s:i, s:f, s:i, s:I}", "id",
                                                cllm_lora_set_name(s->p.adapters, i), "path",
                                                cllm_lora_set_dir(s->p.adapters, i), "r", lc->r, "lora_alpha",
                                                lc->lora_alpha, "layers", cllm_lora_set_layers(s->p.adapters, i),
                                                "parameters", (json_int_t)cllm_lora_set_numel(s->p.adapters, i)));
        }
        json_object_set_new(j, "lora_adapters", ad);
    }
    return srv_reply_json(c, 200, j);
}
