/*
 * /metrics: Prometheus text exposition (version 0.0.4) of the server's
 * counters, gauges and histograms. Every value is read under srv->mu.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

static void hist_init(srv_hist *h, const double *le) {
    memset(h, 0, sizeof *h);
    memcpy(h->le, le, sizeof h->le);
}

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    static const double secs[SRV_HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30};
    static const double toks[SRV_HIST_N] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
    hist_init(&m->ttft, secs);
    hist_init(&m->tpot, secs);
    hist_init(&m->duration, secs);
    hist_init(&m->input_len, toks);
    hist_init(&m->gen_len, toks);
}

void srv_hist_add(srv_hist *h, double v) {
    int i = 0;
    while (i < SRV_HIST_N && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

typedef struct {
    char *buf;
    size_t len, cap;
    bool ok;
} out_t;

static void outf(out_t *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void outf(out_t *o, const char *fmt, ...) {
    if (!o->ok) return;
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || !srv_buf_add(&o->buf, &o->len, &o->cap, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1))
        o->ok = false;
}

static void hist_out(out_t *o, const char *name, const char *help, const srv_hist *h) {
    outf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SRV_HIST_N; i++) {
        cum += h->count[i];
        outf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[SRV_HIST_N];
    outf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
         name, (unsigned long long)h->n);
}

/* A label value in the exposition format: \\, \" and \n escaped (cut to fit). */
static const char *label(char *buf, size_t cap, const char *v) {
    size_t k = 0;
    for (; *v && k + 3 < cap; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n') buf[k++] = '\\';
        buf[k++] = *v == '\n' ? 'n' : *v;
    }
    buf[k] = 0;
    return buf;
}

/* A counter per LoRA adapter: v[0] the base (under its model id), v[i] adapter i - 1. */
static void adapter_counter(out_t *o, const cllm_server *s, const char *name, const char *help, const uint64_t *v) {
    char lb[512];
    outf(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (int i = 0; i <= cllm_lora_set_count(s->p.adapters); i++)
        outf(o, "%s{adapter=\"%s\"} %llu\n", name,
             label(lb, sizeof lb, i ? cllm_lora_set_name(s->p.adapters, i - 1) : s->model_id), (unsigned long long)v[i]);
}

char *srv_metrics_text(cllm_server *s) {
    out_t o = {.ok = true};
    int pool_tokens;
    cllm_server_pool(s, &pool_tokens, NULL);
    pthread_mutex_lock(&s->mu);
    const srv_metrics *m = &s->met;
    outf(&o, "# HELP cllm_requests_total Requests answered, by outcome.\n# TYPE cllm_requests_total counter\n");
    const struct {
        const char *outcome;
        uint64_t v;
    } rows[] = {{"success", m->req_ok},           {"validation", m->req_validation},
                {"overloaded", m->req_overloaded}, {"generation", m->req_generation},
                {"cancelled", m->req_cancelled},   {"unauthorized", m->req_unauthorized}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        outf(&o, "cllm_requests_total{outcome=\"%s\"} %llu\n", rows[i].outcome, (unsigned long long)rows[i].v);
    outf(&o, "# HELP cllm_requests_in_flight Requests accepted and not finished.\n# TYPE cllm_requests_in_flight gauge\n"
             "cllm_requests_in_flight %d\n", s->in_flight);
    outf(&o, "# HELP cllm_queue_size Sequences waiting for a batch slot or cache blocks.\n# TYPE cllm_queue_size gauge\n"
             "cllm_queue_size %d\n", s->queued_seqs);
    outf(&o, "# HELP cllm_batch_current_size Sequences in the running batch.\n# TYPE cllm_batch_current_size gauge\n"
             "cllm_batch_current_size %d\n", s->running_seqs);
    outf(&o, "# HELP cllm_batch_max_size Sequences the batch can hold.\n# TYPE cllm_batch_max_size gauge\n"
             "cllm_batch_max_size %d\n", s->p.max_batch_size);
    outf(&o, "# HELP cllm_kv_cache_tokens Positions in the KV cache pool.\n# TYPE cllm_kv_cache_tokens gauge\n"
             "cllm_kv_cache_tokens %d\n", pool_tokens);
    outf(&o, "# HELP cllm_prompt_tokens_total Prompt tokens of accepted requests.\n# TYPE cllm_prompt_tokens_total counter\n"
             "cllm_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    outf(&o, "# HELP cllm_generated_tokens_total Tokens generated.\n# TYPE cllm_generated_tokens_total counter\n"
             "cllm_generated_tokens_total %llu\n", (unsigned long long)m->generated_tokens);
    adapter_counter(&o, s, "cllm_adapter_requests_total",
                    "Successful requests by LoRA adapter (the base model's id: none).", m->adapter_req);
    adapter_counter(&o, s, "cllm_adapter_generated_tokens_total",
                    "Tokens generated for successful requests by LoRA adapter.", m->adapter_tokens);
    hist_out(&o, "cllm_time_to_first_token_seconds", "From arrival to the first generated token.", &m->ttft);
    hist_out(&o, "cllm_time_per_output_token_seconds", "Mean time per generated token after the first, per request.",
             &m->tpot);
    hist_out(&o, "cllm_request_duration_seconds", "From arrival to the last token of successful requests.",
             &m->duration);
    hist_out(&o, "cllm_request_input_tokens", "Prompt length of accepted requests.", &m->input_len);
    hist_out(&o, "cllm_request_generated_tokens", "Tokens generated per successful request.", &m->gen_len);
    pthread_mutex_unlock(&s->mu);
    if (!o.ok) {
        free(o.buf);
        return NULL;
    }
    return o.buf;
}
