/*
 * Inside cllm/server.h: the request (job) shared by a connection thread and
 * the scheduler thread, the scheduler, the metrics, and the route handlers.
 *
 *   server.c    libmicrohttpd: connections, bodies, auth, routing, limits
 *   sched.c     the scheduler thread around cllm_engine; jobs and waiting
 *   request.c   request bodies (TGI and OpenAI) -> srv_gen, validation
 *   tgi.c       TGI routes: /generate, /generate_stream, /, /tokenize, /info
 *   openai.c    /v1/completions, /v1/chat/completions, /v1/models
 *   metrics.c   counters and histograms, the Prometheus text of /metrics
 *
 * Locking: one mutex (srv->mu) guards every job's outputs and the queues;
 * each job has a condition variable its connection thread waits on; the
 * scheduler waits on srv->work when idle. The engine is touched by the
 * scheduler thread only.
 */
#ifndef CLLM_SERVE_IMPL_H
#define CLLM_SERVE_IMPL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/engine.h"
#include "cllm/server.h"

/* ---------------------------------------------------------------- request */
/* A validated generation request, whatever the API. */
typedef struct {
    int32_t *ids; /* prompt ids (owned) */
    size_t n_ids;
    int n;                     /* sequences (OpenAI n; TGI 1) */
    cllm_generate_params gp;   /* stop / eos pointers below */
    char **stops;              /* owned */
    size_t n_stop;
    bool seed_given;           /* gp.seed came from the request */
    bool sampling;             /* not greedy */
    int top_n;                 /* alternatives per token (0..CLLM_MAX_TOP_N) */
    bool logprobs;             /* OpenAI: return logprobs */
    bool prompt_logprobs;      /* TGI decoder_input_details, OpenAI echo with logprobs */
    bool details;              /* TGI details */
    bool full_text;            /* TGI return_full_text: the prompt text before the output */
    bool stream, include_usage;
    bool echo;                 /* OpenAI completions: prompt text before the completion */
    char *prompt_text;         /* the text the ids came from (owned; for echo / return_full_text) */
    int adapter;               /* 0: the base; i + 1: adapter i of the server's set */
} srv_gen;

void srv_gen_free(srv_gen *g);

/* Errors of request parsing: HTTP status and message. */
typedef struct {
    int status;
    char msg[512];
    const char *code; /* OpenAI error code (static string) or NULL */
} srv_err;

int srv_errf(srv_err *e, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ------------------------------------------------------------------- jobs */
typedef struct {
    int32_t id;
    float logprob, raw;   /* sampling-distribution and raw log-probabilities */
    bool special;
    size_t text_off, text_len; /* this step's released text in seq->text */
} srv_tok;

typedef struct {
    uint64_t eid;           /* engine request id (0: not submitted) */
    srv_tok *toks;
    size_t n_toks, cap;
    int32_t *top_ids;       /* [n_toks * top_n] */
    float *top_lp;
    size_t top_cap;
    char *text;             /* every released piece, back to back */
    size_t text_len, text_cap;
    cllm_finish_reason finish;
    bool done;
} srv_seq;

typedef struct srv_job {
    struct cllm_server *srv;
    srv_gen gen;
    srv_seq *seq;             /* [gen.n] */
    float *prompt_lp;         /* [n_ids] raw log-probs of the prompt tokens (first: NaN) */
    int n_done;               /* sequences finished */
    bool submitted;           /* accepted by the engine (or failed) */
    bool cancel;              /* the client went away */
    bool accounted;           /* counted in the metrics, out of in_flight */
    int err_status;           /* non-zero: the request failed with this status */
    char err[512];
    int refs;                 /* connection + scheduler */
    pthread_cond_t cv;
    double t_arrive, t_first, t_last;
    const char *route;        /* metrics label */
    struct srv_job *next;     /* incoming list / active list */
} srv_job;

/* ------------------------------------------------------------- metrics */
#define SRV_HIST_N 14
typedef struct {
    double le[SRV_HIST_N]; /* bucket bounds; +Inf implied */
    uint64_t count[SRV_HIST_N + 1];
    double sum;
    uint64_t n;
} srv_hist;

typedef struct {
    uint64_t req_ok, req_validation, req_overloaded, req_generation, req_cancelled, req_unauthorized;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t *adapter_req, *adapter_tokens; /* [1 + adapters]: successful requests and their tokens, base first */
    srv_hist ttft, tpot, duration;
    srv_hist input_len, gen_len;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_hist_add(srv_hist *h, double v);
/* The Prometheus text exposition (caller frees). */
char *srv_metrics_text(struct cllm_server *s);

/* -------------------------------------------------------------- server */
struct cllm_server {
    cllm_server_params p;
    char *host, *model_id, *api_key, *bos, *eos;
    cllm_model *m;
    const cllm_tokenizer *tok;
    const cllm_chat_template *tmpl;
    int vocab, n_ctx;
    cllm_engine *engine;
    struct MHD_Daemon *daemon;
    int port;

    pthread_mutex_t mu;
    pthread_cond_t work;      /* scheduler: new job or cancel */
    pthread_t sched;
    bool sched_running, stopping, draining, started;
    srv_job *incoming;        /* waiting for the scheduler to submit */
    srv_job *active;          /* submitted, not finished */
    int in_flight;            /* jobs accepted and not finished */
    int running_seqs, queued_seqs; /* from the engine, for metrics */
    srv_metrics met;
    double t_start;
};

double srv_now(void);

/* sched.c */
cllm_status srv_sched_start(struct cllm_server *s);
void srv_sched_stop(struct cllm_server *s);
/* Takes ownership of gen; on success *out holds a job with one reference
 * for the caller. 429 when max_concurrent_requests are in flight, 503 when
 * draining (then gen is freed and *out NULL). */
int srv_job_submit(struct cllm_server *s, srv_gen *gen, const char *route, srv_job **out, srv_err *err);
/* Waits until the job is accepted by the engine (or failed). Locks mu. */
void srv_job_wait_submitted(srv_job *j);
/* Drops the caller's reference; cancels the job if it is not finished.
 * Locks mu. */
void srv_job_release(srv_job *j);
/* With mu held: waits up to `ms` milliseconds for news. */
void srv_job_wait_locked(srv_job *j, int ms);
bool srv_job_finished_locked(const srv_job *j);

/* server.c helpers for handlers */
/* Queues a JSON response (steals j). */
enum MHD_Result srv_reply_json(struct MHD_Connection *c, unsigned status, json_t *j);
/* TGI error body {"error", "error_type"}. */
enum MHD_Result srv_reply_tgi_error(struct MHD_Connection *c, unsigned status, const char *msg);
/* OpenAI error body {"error": {"message", "type", "param", "code"}}; code
 * may be NULL (null). */
enum MHD_Result srv_reply_openai_error(struct MHD_Connection *c, unsigned status, const char *msg);
enum MHD_Result srv_reply_openai_error_code(struct MHD_Connection *c, unsigned status, const char *msg,
                                            const char *code);
/* The name a request's responses carry: its adapter's, else model_id. */
const char *srv_model_name(const struct cllm_server *s, const srv_gen *g);
/* The adapter named `name` (0: the base, i + 1: adapter i), or -1. */
int srv_adapter_find(const struct cllm_server *s, const char *name);
/* True when the client of the connection has closed its end. */
bool srv_client_gone(struct MHD_Connection *c);
/* Streams a job as server-sent events: `format` appends the events for
 * the job's new output to a buffer (called with mu held); the stream ends
 * when it returns true (all sent). */
typedef bool (*srv_sse_format)(srv_job *j, void *state, char **buf, size_t *len, size_t *cap);
enum MHD_Result srv_reply_sse(struct MHD_Connection *c, srv_job *j, srv_sse_format f, void *state,
                              void (*state_free)(void *));
/* Appends bytes / a printf / a JSON value as "data:<json>\n\n". */
bool srv_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
bool srv_buf_sse_json(char **buf, size_t *len, size_t *cap, json_t *j, bool space); /* steals j */
/* A JSON number, or null when v is not finite (NaN has no JSON form). */
json_t *srv_jnum(double v);
/* A JSON string of text that should be UTF-8; bytes that are not (possible
 * only in text decoded from client-chosen ids) become U+FFFD. */
json_t *srv_jstr(const char *s, size_t n);

/* request.c */
/* TGI {"inputs", "parameters"} -> gen. */
int srv_parse_tgi(struct cllm_server *s, const json_t *body, srv_gen *g, srv_err *e);
int srv_parse_openai(struct cllm_server *s, const json_t *body, bool chat, srv_gen *g, srv_err *e);
/* Encodes text (with the tokenizer's special tokens when add_special) into
 * g->ids, applies truncation (keep the last `truncate` tokens; 0 = none)
 * and the input/total limits. */
int srv_tokenize_prompt(struct cllm_server *s, srv_gen *g, const char *text, size_t len, bool add_special,
                        int truncate, srv_err *e, bool openai);

/* Waits for a job; returns true if it finished, false if the client left
 * (the job is then cancelled). Locks mu. */
bool srv_wait_done(struct MHD_Connection *c, srv_job *j);

/* tgi.c / openai.c handlers: method and path are checked by the router. */
enum MHD_Result srv_tgi_generate(struct cllm_server *s, struct MHD_Connection *c, const json_t *body, bool stream,
                                 bool compat);
enum MHD_Result srv_tgi_tokenize(struct cllm_server *s, struct MHD_Connection *c, const json_t *body);
enum MHD_Result srv_tgi_info(struct cllm_server *s, struct MHD_Connection *c);
enum MHD_Result srv_openai_complete(struct cllm_server *s, struct MHD_Connection *c, const json_t *body, bool chat);
enum MHD_Result srv_openai_models(struct cllm_server *s, struct MHD_Connection *c);


#endif
