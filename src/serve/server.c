/*
 * The HTTP side of cllm/server.h on libmicrohttpd: one thread per
 * connection, bodies collected up to max_body_bytes (413 beyond), the API
 * key checked, routes dispatched to tgi.c / openai.c, server-sent events
 * streamed from a job as its tokens arrive, and the server's lifecycle.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve_impl.h"

/* ------------------------------------------------------------ replies */

enum MHD_Result srv_reply_json(struct MHD_Connection *c, unsigned status, json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) text = strdup("{\"error\":\"out of memory\",\"error_type\":\"internal\"}"), status = 500;
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static const char *tgi_error_type(unsigned status) {
    switch (status) {
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 413: return "payload_too_large";
    case 422: return "validation";
    case 424: return "generation";
    case 429: return "overloaded";
    case 503: return "unavailable";
    default: return status >= 500 ? "internal" : "bad_request";
    }
}

enum MHD_Result srv_reply_tgi_error(struct MHD_Connection *c, unsigned status, const char *msg) {
    char full[640];
    if (status == 422) snprintf(full, sizeof full, "Input validation error: %s", msg);
    else snprintf(full, sizeof full, "%s", msg);
    return srv_reply_json(c, status, json_pack("{s:s, s:s}", "error", full, "error_type", tgi_error_type(status)));
}

enum MHD_Result srv_reply_openai_error(struct MHD_Connection *c, unsigned status, const char *msg) {
    return srv_reply_openai_error_code(c, status, msg, NULL);
}

const char *srv_model_name(const cllm_server *s, const srv_gen *g) {
    return g->adapter > 0 ? cllm_lora_set_name(s->p.adapters, g->adapter - 1) : s->model_id;
}

int srv_adapter_find(const cllm_server *s, const char *name) {
    if (!strcmp(name, s->model_id)) return 0;
    int i = cllm_lora_set_find(s->p.adapters, name);
    return i >= 0 ? i + 1 : -1;
}

enum MHD_Result srv_reply_openai_error_code(struct MHD_Connection *c, unsigned status, const char *msg,
                                            const char *code) {
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 && !code ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    return srv_reply_json(c, status,
                          json_pack("{s:{s:s, s:s, s:n, s:o}}", "error", "message", msg, "type", type, "param", "code",
                                    code ? json_string(code) : json_null()));
}

bool srv_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd pf = {.fd = ci->connect_fd, .events = POLLIN};
    if (poll(&pf, 1, 0) <= 0) return false;
    if (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool srv_wait_done(struct MHD_Connection *c, srv_job *j) {
    cllm_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    while (!srv_job_finished_locked(j)) {
        if (j->cancel) break;
        srv_job_wait_locked(j, 100);
        if (!srv_job_finished_locked(j)) {
            pthread_mutex_unlock(&s->mu);
            bool gone = srv_client_gone(c);
            pthread_mutex_lock(&s->mu);
            if (gone && !j->cancel) {
                j->cancel = true;
                pthread_cond_signal(&s->work);
            }
        }
    }
    bool done = srv_job_finished_locked(j);
    pthread_mutex_unlock(&s->mu);
    return done;
}

bool srv_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        while (c < *len + n + 1) c *= 2;
        char *p = realloc(*buf, c);
        if (!p) return false;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

bool srv_buf_sse_json(char **buf, size_t *len, size_t *cap, json_t *j, bool space) {
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!t) return false;
    bool ok = srv_buf_add(buf, len, cap, space ? "data: " : "data:", space ? 6 : 5) &&
              srv_buf_add(buf, len, cap, t, strlen(t)) && srv_buf_add(buf, len, cap, "\n\n", 2);
    free(t);
    return ok;
}

json_t *srv_jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *srv_jstr(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *t = malloc(n * 3 + 1);
    if (!t) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80 && c) {
            t[o++] = (char)c;
        } else {
            memcpy(t + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    j = json_stringn(t, o);
    free(t);
    return j;
}

/* ---- server-sent events ---- */
typedef struct {
    srv_job *job;
    struct MHD_Connection *conn;
    srv_sse_format format;
    void *state;
    void (*state_free)(void *);
    char *buf;
    size_t len, cap, sent;
    bool finished; /* format said everything is in buf */
} sse_ctx;

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    sse_ctx *x = cls;
    cllm_server *s = x->job->srv;
    for (;;) {
        if (x->sent < x->len) {
            size_t n = x->len - x->sent;
            if (n > max) n = max;
            memcpy(out, x->buf + x->sent, n);
            x->sent += n;
            if (x->sent == x->len) x->sent = x->len = 0;
            return (ssize_t)n;
        }
        if (x->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&s->mu);
        bool fin = x->format(x->job, x->state, &x->buf, &x->len, &x->cap);
        if (!fin && x->len == 0) {
            srv_job_wait_locked(x->job, 100);
            fin = x->format(x->job, x->state, &x->buf, &x->len, &x->cap);
        }
        pthread_mutex_unlock(&s->mu);
        x->finished = fin;
        if (x->len == 0 && !fin && srv_client_gone(x->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void sse_free(void *cls) {
    sse_ctx *x = cls;
    srv_job_release(x->job);
    if (x->state_free) x->state_free(x->state);
    free(x->buf);
    free(x);
}

enum MHD_Result srv_reply_sse(struct MHD_Connection *c, srv_job *j, srv_sse_format f, void *state,
                              void (*state_free)(void *)) {
    sse_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        srv_job_release(j);
        if (state_free) state_free(state);
        return MHD_NO;
    }
    x->job = j;
    x->conn = c;
    x->format = f;
    x->state = state;
    x->state_free = state_free;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, x, sse_free);
    if (!r) {
        sse_free(x);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ------------------------------------------------------------ routing */

typedef struct {
    char *body;
    size_t len, cap;
    bool too_large;
} conn_ctx;

typedef enum { R_NONE = 0, R_COMPAT, R_GENERATE, R_STREAM, R_TOKENIZE, R_HEALTH, R_INFO, R_METRICS, R_MODELS,
               R_COMPLETIONS, R_CHAT } route_id;

static const struct {
    const char *path;
    const char *method;
    route_id id;
    bool openai;
} routes[] = {
    {"/", "POST", R_COMPAT, false},
    {"/generate", "POST", R_GENERATE, false},
    {"/generate_stream", "POST", R_STREAM, false},
    {"/tokenize", "POST", R_TOKENIZE, false},
    {"/health", "GET", R_HEALTH, false},
    {"/info", "GET", R_INFO, false},
    {"/metrics", "GET", R_METRICS, false},
    {"/v1/models", "GET", R_MODELS, true},
    {"/v1/completions", "POST", R_COMPLETIONS, true},
    {"/v1/chat/completions", "POST", R_CHAT, true},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

static enum MHD_Result reply_error(struct MHD_Connection *c, bool openai, unsigned status, const char *msg) {
    return openai ? srv_reply_openai_error(c, status, msg) : srv_reply_tgi_error(c, status, msg);
}

static bool key_ok(const cllm_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t a = strlen(h), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i % (b ? b : 1)];
    return diff == 0;
}

static enum MHD_Result dispatch(cllm_server *s, struct MHD_Connection *c, route_id r, bool openai, conn_ctx *x) {
    json_t *body = NULL;
    if (r == R_HEALTH) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (r == R_INFO) return srv_tgi_info(s, c);
    if (r == R_MODELS) return srv_openai_models(s, c);
    if (r == R_METRICS) {
        char *t = srv_metrics_text(s);
        if (!t) return MHD_NO;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(t), t, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    json_error_t jerr;
    body = json_loadb(x->body ? x->body : "", x->len, JSON_REJECT_DUPLICATES, &jerr);
    if (!body) {
        char msg[400];
        snprintf(msg, sizeof msg, "malformed JSON body: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        pthread_mutex_lock(&s->mu);
        s->met.req_validation++;
        pthread_mutex_unlock(&s->mu);
        return reply_error(c, openai, openai ? 400 : 422, msg);
    }
    enum MHD_Result ret;
    switch (r) {
    case R_COMPAT: {
        const json_t *st = json_object_get(body, "stream");
        ret = srv_tgi_generate(s, c, body, json_is_true(st), true);
        break;
    }
    case R_GENERATE: ret = srv_tgi_generate(s, c, body, false, false); break;
    case R_STREAM: ret = srv_tgi_generate(s, c, body, true, false); break;
    case R_TOKENIZE: ret = srv_tgi_tokenize(s, c, body); break;
    case R_COMPLETIONS: ret = srv_openai_complete(s, c, body, false); break;
    case R_CHAT: ret = srv_openai_complete(s, c, body, true); break;
    default: ret = reply_error(c, openai, 404, "not found");
    }
    json_decref(body);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **req_cls) {
    (void)version;
    cllm_server *s = cls;
    conn_ctx *x = *req_cls;
    route_id r = R_NONE;
    bool openai = strncmp(url, "/v1/", 4) == 0, path_known = false;
    for (size_t i = 0; i < N_ROUTES; i++)
        if (strcmp(url, routes[i].path) == 0) {
            path_known = true;
            if (strcmp(method, routes[i].method) == 0 || (strcmp(method, "HEAD") == 0 && !strcmp(routes[i].method, "GET")))
                r = routes[i].id;
        }
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        *req_cls = x;
        /* Refuse early, before reading a body. */
        if (r != R_HEALTH && !key_ok(s, c)) {
            pthread_mutex_lock(&s->mu);
            s->met.req_unauthorized++;
            pthread_mutex_unlock(&s->mu);
            return reply_error(c, openai, 401, "missing or wrong API key (Authorization: Bearer KEY)");
        }
        if (r == R_NONE) {
            if (!path_known) return reply_error(c, openai, 404, "no such route");
            char msg[160];
            snprintf(msg, sizeof msg, "method %s is not allowed on %s", method, url);
            return reply_error(c, openai, 405, msg);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body_bytes) {
            char msg[160];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->p.max_body_bytes);
            return reply_error(c, openai, 413, msg);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!x->too_large) {
            if (x->len + *upload_size > s->p.max_body_bytes) {
                x->too_large = true;
                free(x->body);
                x->body = NULL;
                x->len = x->cap = 0;
            } else if (!srv_buf_add(&x->body, &x->len, &x->cap, upload, *upload_size)) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (x->too_large) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->p.max_body_bytes);
        return reply_error(c, openai, 413, msg);
    }
    return dispatch(s, c, r, openai, x);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn_ctx *x = *req_cls;
    if (!x) return;
    free(x->body);
    free(x);
    *req_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    cllm_log(CLLM_LOG_DEBUG, "http: %s", msg);
}

/* ------------------------------------------------------------ lifecycle */

/* Bytes of pool one cached position takes: keys and values of every layer
 * (over a tensor part, of its own heads). */
static size_t pool_token_bytes(const cllm_model *m, cllm_kv_dtype d) {
    const cllm_model_config *c = cllm_model_get_config(m);
    const int kvh = c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
    return 2 * (size_t)c->n_layer * (size_t)kvh * (size_t)c->head_dim * cllm_kv_cache_value_bytes(m, d);
}

cllm_status cllm_server_fit_pool(cllm_server_params *q, size_t per_token, size_t avail, bool by_default) {
    if (!avail || !per_token) return CLLM_OK;
    const double mib = 1024.0 * 1024.0;
    const double want = (double)q->kv_cache_tokens * (double)per_token;
    if (!by_default) {
        if (want <= (double)avail) return CLLM_OK;
        return CLLM_FAIL(CLLM_ERR_NOMEM, "--kv-cache-tokens %d needs %.0f MiB of key/value pool (%zu bytes a position) "
                         "and %.0f MiB are available: lower --kv-cache-tokens", q->kv_cache_tokens, want / mib,
                         per_token, avail / mib);
    }
    size_t fit = avail / 2 / per_token;
    if (fit >= (size_t)q->kv_cache_tokens) return CLLM_OK;
    fit = fit / (size_t)q->block_size * (size_t)q->block_size;
    if (fit < (size_t)q->max_total_tokens)
        return CLLM_FAIL(CLLM_ERR_NOMEM, "one request of --max-total-tokens %d needs %.0f MiB of key/value pool "
                         "and %.0f MiB are available: lower --max-total-tokens", q->max_total_tokens,
                         (double)q->max_total_tokens * (double)per_token / mib, avail / mib);
    cllm_log(CLLM_LOG_WARN, "key/value pool: %zu positions (half of the %.0f MiB available) instead of %d; "
             "--kv-cache-tokens sets it", fit, avail / mib, q->kv_cache_tokens);
    q->kv_cache_tokens = (int)fit;
    return CLLM_OK;
}

cllm_status cllm_server_init(cllm_server **out, cllm_model *m, const cllm_tokenizer *tok,
                             const cllm_chat_template *tmpl, const char *bos, const char *eos,
                             const cllm_server_params *p) {
    *out = NULL;
    if (!m || !tok || !p) return CLLM_FAIL(CLLM_ERR_ARG, "a model, a tokenizer and settings are required");
    const cllm_model_config *mc = cllm_model_get_config(m);
    cllm_server *s = calloc(1, sizeof *s);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->m = m;
    s->tok = tok;
    s->tmpl = tmpl;
    s->vocab = cllm_model_vocab(m);
    s->n_ctx = mc->n_ctx > 0 ? mc->n_ctx : 2048;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    srv_metrics_init(&s->met);
    cllm_server_params *q = &s->p;
    cllm_status st = CLLM_OK;
    if (q->port < 0 || q->port > 65535) st = CLLM_FAIL(CLLM_ERR_ARG, "--port %d is not in [0, 65535]", q->port);
    else if (q->max_concurrent_requests < 0 || q->max_batch_size < 0 || q->max_input_tokens < 0 ||
             q->max_total_tokens < 0 || q->kv_cache_tokens < 0 || q->max_batch_prefill_tokens < 0 ||
             q->block_size < 0 || q->max_stop_sequences < 0 || q->max_top_n_tokens < 0 || q->max_n < 0 ||
             q->timeout_s < 0 || q->drain_s < 0)
        st = CLLM_FAIL(CLLM_ERR_ARG, "server limits must be >= 0 (0 = default)");
    else if (!cllm_kv_dtype_name(q->kv_dtype))
        st = CLLM_FAIL(CLLM_ERR_ARG, "kv_dtype %d: expected CLLM_KV_AUTO, CLLM_KV_FP32 or CLLM_KV_BF16", (int)q->kv_dtype);
    if (st) goto fail;
    if (!q->max_concurrent_requests) q->max_concurrent_requests = 128;
    if (!q->max_batch_size) q->max_batch_size = 16;
    if (!q->block_size) q->block_size = 16;
    if (!q->max_stop_sequences) q->max_stop_sequences = 4;
    if (!q->max_top_n_tokens) q->max_top_n_tokens = 5;
    if (q->max_top_n_tokens > CLLM_MAX_TOP_N) q->max_top_n_tokens = CLLM_MAX_TOP_N;
    if (!q->max_n) q->max_n = 8;
    if (!q->max_body_bytes) q->max_body_bytes = 1 << 20;
    if (!q->timeout_s) q->timeout_s = 30;
    if (!q->drain_s) q->drain_s = 30;
    if (q->max_total_tokens > s->n_ctx) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "--max-total-tokens %d exceeds the model's %d positions", q->max_total_tokens,
                       s->n_ctx);
        goto fail;
    }
    if (!q->max_total_tokens) q->max_total_tokens = s->n_ctx;
    if (q->kv_cache_tokens && q->max_total_tokens > q->kv_cache_tokens) {
        if (p->max_total_tokens) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "--max-total-tokens %d exceeds --kv-cache-tokens %d: one request could "
                           "never fit", q->max_total_tokens, q->kv_cache_tokens);
            goto fail;
        }
        q->max_total_tokens = q->kv_cache_tokens;
    }
    if (q->max_total_tokens < 2) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "max total tokens %d leaves no room to generate", q->max_total_tokens);
        goto fail;
    }
    if (!q->max_input_tokens) q->max_input_tokens = q->max_total_tokens - 1;
    if (q->max_input_tokens >= q->max_total_tokens) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "--max-input-tokens %d must be below --max-total-tokens %d", q->max_input_tokens,
                       q->max_total_tokens);
        goto fail;
    }
    if (q->kv_cache_tokens > (1 << 30)) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "--kv-cache-tokens %d is above the limit of %d", q->kv_cache_tokens, 1 << 30);
        goto fail;
    }
    if (!q->kv_cache_tokens) {
        long long t = (long long)q->max_batch_size * q->max_total_tokens;
        if (t > 65536) t = 65536;
        if (t < q->max_total_tokens) t = q->max_total_tokens;
        q->kv_cache_tokens = (int)t;
    }
    if ((st = cllm_server_fit_pool(q, pool_token_bytes(m, q->kv_dtype), cllm_mem_available(), p->kv_cache_tokens == 0)))
        goto fail;
    if (!q->max_batch_prefill_tokens) q->max_batch_prefill_tokens = 512;
    if (q->max_batch_prefill_tokens < q->max_batch_size) q->max_batch_prefill_tokens = q->max_batch_size;
    s->host = strdup(q->host ? q->host : "127.0.0.1");
    s->model_id = strdup(q->model_id ? q->model_id : "cllm");
    s->api_key = q->api_key ? strdup(q->api_key) : NULL;
    s->bos = bos ? strdup(bos) : NULL;
    s->eos = eos ? strdup(eos) : NULL;
    if (!s->host || !s->model_id || (q->api_key && !s->api_key) || (bos && !s->bos) || (eos && !s->eos)) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    q->host = s->host;
    q->model_id = s->model_id;
    q->api_key = s->api_key;
    cllm_engine_params ep = {.max_seqs = q->max_batch_size,
                             .max_pos = q->max_total_tokens,
                             .block_size = q->block_size,
                             .n_blocks = (q->kv_cache_tokens + q->block_size - 1) / q->block_size,
                             .max_batch_tokens = q->max_batch_prefill_tokens,
                             .adapters = q->adapters,
                             .kv_dtype = q->kv_dtype};
    size_t na = 1 + (size_t)cllm_lora_set_count(q->adapters);
    s->met.adapter_req = calloc(na, sizeof *s->met.adapter_req);
    s->met.adapter_tokens = calloc(na, sizeof *s->met.adapter_tokens);
    if (!s->met.adapter_req || !s->met.adapter_tokens) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i + 1 < na; i++)
        if (!strcmp(cllm_lora_set_name(q->adapters, (int)i), s->model_id)) {
            st = CLLM_FAIL(CLLM_ERR_ARG, "adapter name '%s' is the base model's id: choose another (or --model-id)",
                           s->model_id);
            goto fail;
        }
    if ((st = cllm_engine_init(&s->engine, m, tok, &ep))) goto fail;
    *out = s;
    return CLLM_OK;
fail:
    cllm_server_free(s);
    return st;
}

void cllm_server_pool(const cllm_server *s, int *tokens, size_t *bytes) {
    int blocks = (s->p.kv_cache_tokens + s->p.block_size - 1) / s->p.block_size;
    if (tokens) *tokens = blocks * s->p.block_size;
    if (bytes) *bytes = (size_t)blocks * (size_t)s->p.block_size * pool_token_bytes(s->m, s->p.kv_dtype);
}

cllm_status cllm_server_start(cllm_server *s) {
    if (s->started) return CLLM_FAIL(CLLM_ERR_ARG, "the server is already started");
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, s->host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)s->p.port);
    } else if (inet_pton(AF_INET6, s->host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)s->p.port);
        flags |= MHD_USE_IPv6;
    } else {
        return CLLM_FAIL(CLLM_ERR_ARG, "--host '%s' is not an IPv4 or IPv6 address", s->host);
    }
    cllm_status st = srv_sched_start(s);
    if (st) return st;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->p.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(s->p.max_concurrent_requests + 64), MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        MHD_OPTION_END);
    if (!s->daemon) {
        srv_sched_stop(s);
        return CLLM_FAIL(CLLM_ERR_IO, "cannot listen on %s:%d (address in use or not available)", s->host,
                         s->p.port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    s->started = true;
    s->t_start = srv_now();
    return CLLM_OK;
}

int cllm_server_port(const cllm_server *s) { return s->port; }

void cllm_server_drain(cllm_server *s) {
    if (!s || !s->started) return;
    s->started = false;
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    /* Stop accepting; connections already open keep being served. */
    MHD_quiesce_daemon(s->daemon);
    double deadline = srv_now() + s->p.drain_s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int left = s->in_flight;
        pthread_mutex_unlock(&s->mu);
        if (left == 0 || srv_now() > deadline) break;
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    /* Let the last responses reach their clients (at most 2 s more). */
    double until = srv_now() + 2;
    while (srv_now() < until) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!di || di->num_connections == 0) break;
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    srv_sched_stop(s); /* cancels what remains; connection threads see it and end */
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}

void cllm_server_free(cllm_server *s) {
    if (!s) return;
    cllm_server_drain(s);
    srv_sched_stop(s);
    cllm_engine_free(s->engine);
    free(s->met.adapter_req);
    free(s->met.adapter_tokens);
    free(s->host);
    free(s->model_id);
    free(s->api_key);
    free(s->bos);
    free(s->eos);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
