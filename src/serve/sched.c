/*
 * The scheduler thread (see serve_impl.h): connection threads hand jobs in
 * through srv->incoming; the scheduler submits each job's sequences to the
 * engine, runs engine steps while anything is queued or running, and
 * records every event into the job's sequences, waking the job's
 * connection thread. Cancelled jobs (client gone) are taken out of the
 * engine before the next step.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_impl.h"

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void srv_gen_free(srv_gen *g) {
    if (!g) return;
    free(g->ids);
    for (size_t i = 0; i < g->n_stop; i++) free(g->stops[i]);
    free(g->stops);
    free(g->prompt_text);
    free((void *)g->gp.sample.bias_ids);
    free((void *)g->gp.sample.bias_values);
    memset(g, 0, sizeof *g);
}

static void seq_free(srv_seq *q) {
    free(q->toks);
    free(q->top_ids);
    free(q->top_lp);
    free(q->text);
}

static void job_destroy(srv_job *j) {
    for (int i = 0; j->seq && i < j->gen.n; i++) seq_free(&j->seq[i]);
    free(j->seq);
    free(j->prompt_lp);
    srv_gen_free(&j->gen);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* With mu held. */
static void job_unref_locked(srv_job *j) {
    if (--j->refs == 0) job_destroy(j);
}

bool srv_job_finished_locked(const srv_job *j) { return j->err_status || j->n_done == j->gen.n; }

/* With mu held: the job has finished (or failed, or was cancelled): count
 * it once and let it leave the in-flight count, so that a client's next
 * request never finds its previous one still counted. */
static void job_account_locked(cllm_server *s, srv_job *j) {
    if (j->accounted) return;
    j->accounted = true;
    s->in_flight--;
    srv_metrics *m = &s->met;
    bool cancelled = false;
    for (int i = 0; i < j->gen.n; i++) cancelled |= j->seq[i].finish == CLLM_FINISH_CANCELLED;
    if (j->cancel && (cancelled || !srv_job_finished_locked(j))) m->req_cancelled++;
    else if (j->err_status == 422) m->req_validation++;
    else if (j->err_status) m->req_generation++;
    else {
        m->req_ok++;
        size_t gen = 0;
        for (int i = 0; i < j->gen.n; i++) gen += j->seq[i].n_toks;
        m->adapter_req[j->gen.adapter]++;
        m->adapter_tokens[j->gen.adapter] += gen;
        srv_hist_add(&m->duration, j->t_last - j->t_arrive);
        srv_hist_add(&m->gen_len, (double)gen);
        if (gen > 1 && j->t_last > j->t_first) srv_hist_add(&m->tpot, (j->t_last - j->t_first) / (double)(gen - 1));
    }
}

/* With mu held: the job is over for the scheduler: account for it and
 * drop the scheduler's reference. */
static void job_retire_locked(cllm_server *s, srv_job *j) {
    job_account_locked(s, j);
    pthread_cond_broadcast(&j->cv);
    job_unref_locked(j);
}

int srv_job_submit(cllm_server *s, srv_gen *gen, const char *route, srv_job **out, srv_err *err) {
    *out = NULL;
    srv_job *j = calloc(1, sizeof *j);
    srv_seq *seq = j ? calloc((size_t)gen->n, sizeof *seq) : NULL;
    if (!seq) {
        free(j);
        srv_gen_free(gen);
        return srv_errf(err, 500, "out of memory");
    }
    j->srv = s;
    j->gen = *gen;
    memset(gen, 0, sizeof *gen);
    j->seq = seq;
    j->route = route;
    j->refs = 2;
    j->t_arrive = srv_now();
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&s->mu);
    int status = 0;
    if (s->draining || s->stopping) status = srv_errf(err, 503, "the server is shutting down");
    else if (s->in_flight >= s->p.max_concurrent_requests) {
        s->met.req_overloaded++;
        status = srv_errf(err, 429, "Model is overloaded");
    }
    if (status) {
        pthread_mutex_unlock(&s->mu);
        j->refs = 0;
        job_destroy(j);
        return status;
    }
    s->in_flight++;
    s->met.prompt_tokens += j->gen.n_ids;
    srv_hist_add(&s->met.input_len, (double)j->gen.n_ids);
    j->next = NULL;
    srv_job **tail = &s->incoming;
    while (*tail) tail = &(*tail)->next;
    *tail = j;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    *out = j;
    return 0;
}

void srv_job_wait_locked(srv_job *j, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->srv->mu, &ts);
}

void srv_job_wait_submitted(srv_job *j) {
    pthread_mutex_lock(&j->srv->mu);
    while (!j->submitted && !j->err_status) srv_job_wait_locked(j, 200);
    pthread_mutex_unlock(&j->srv->mu);
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    cllm_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    if (!srv_job_finished_locked(j) && !j->cancel) {
        j->cancel = true;
        pthread_cond_signal(&s->work);
    }
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
}

/* ---- event recording (engine callback, scheduler thread) ---- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static srv_seq *find_seq(cllm_server *s, uint64_t eid, srv_job **job) {
    for (srv_job *j = s->active; j; j = j->next)
        for (int i = 0; i < j->gen.n; i++)
            if (j->seq[i].eid == eid && !j->seq[i].done) {
                *job = j;
                return &j->seq[i];
            }
    return NULL;
}

static int on_event(const cllm_engine_event *e, void *user) {
    cllm_server *s = user;
    pthread_mutex_lock(&s->mu);
    srv_job *j = NULL;
    srv_seq *q = find_seq(s, e->id, &j);
    if (!q) {
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    const cllm_generate_event *ev = &e->ev;
    double now = srv_now();
    bool ok = true;
    if (ev->token >= 0) {
        int tn = j->gen.top_n;
        ok = grow((void **)&q->toks, &q->cap, q->n_toks + 1, sizeof *q->toks) &&
             grow((void **)&q->text, &q->text_cap, q->text_len + ev->text_len + 1, 1);
        if (ok && tn) {
            size_t tc = q->top_cap;
            ok = grow((void **)&q->top_ids, &tc, (q->n_toks + 1) * (size_t)tn, sizeof *q->top_ids);
            tc = q->top_cap;
            ok = ok && grow((void **)&q->top_lp, &tc, (q->n_toks + 1) * (size_t)tn, sizeof *q->top_lp);
            if (ok) q->top_cap = tc;
        }
        if (ok) {
            srv_tok *t = &q->toks[q->n_toks];
            t->id = ev->token;
            t->logprob = ev->logprob;
            t->raw = ev->raw_logprob;
            t->special = cllm_tokenizer_is_special(s->tok, ev->token);
            t->text_off = q->text_len;
            t->text_len = ev->text_len;
            if (ev->text_len) memcpy(q->text + q->text_len, ev->text, ev->text_len);
            q->text_len += ev->text_len;
            q->text[q->text_len] = 0;
            if (tn) {
                int k = ev->n_top < tn ? ev->n_top : tn;
                for (int i = 0; i < tn; i++) {
                    q->top_ids[q->n_toks * (size_t)tn + i] = i < k ? ev->top_ids[i] : -1;
                    q->top_lp[q->n_toks * (size_t)tn + i] = i < k ? ev->top_logprobs[i] : -INFINITY;
                }
            }
            q->n_toks++;
            s->met.generated_tokens++;
            if (j->t_first == 0) {
                j->t_first = now;
                srv_hist_add(&s->met.ttft, now - j->t_arrive);
            }
        }
    } else if (ev->text_len) {
        ok = grow((void **)&q->text, &q->text_cap, q->text_len + ev->text_len + 1, 1);
        if (ok) {
            memcpy(q->text + q->text_len, ev->text, ev->text_len);
            q->text_len += ev->text_len;
            q->text[q->text_len] = 0;
        }
    }
    j->t_last = now;
    int cancel = 0;
    if (!ok) {
        j->err_status = 500;
        snprintf(j->err, sizeof j->err, "out of memory recording the output");
        cancel = 1;
    } else if (j->cancel) {
        cancel = 1;
    }
    if (ev->finish != CLLM_FINISH_NONE || cancel) {
        q->done = true;
        q->finish = cancel ? CLLM_FINISH_CANCELLED : ev->finish;
        j->n_done++;
        if (srv_job_finished_locked(j)) job_account_locked(s, j);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&s->mu);
    return cancel;
}

/* ---- the scheduler loop ---- */

/* Prompt log-probabilities (TGI decoder_input_details, OpenAI echo with
 * logprobs): one forward pass of the prompt with per-token losses, on this
 * thread (the engine's caches only read the weights). Alternatives are not
 * computed for prompt positions. On failure prompt_lp stays NULL (the
 * values are then reported as null). */
static void prompt_logprobs(cllm_server *s, srv_job *j) {
    size_t n = j->gen.n_ids;
    float *loss = malloc(n * sizeof *loss);
    int32_t *targets = malloc(n * sizeof *targets);
    j->prompt_lp = malloc(n * sizeof *j->prompt_lp);
    double sum;
    long counted;
    cllm_token_io io = {.token_loss = loss};
    if (loss && targets && j->prompt_lp) {
        for (size_t t = 0; t + 1 < n; t++) targets[t] = j->gen.ids[t + 1];
        targets[n - 1] = -100;
    }
    bool ok = loss && targets && j->prompt_lp && !cllm_model_prepare(s->m, 1, (int)n, false);
    if (ok && j->gen.adapter) ok = !cllm_lora_set_apply(s->p.adapters, j->gen.adapter - 1); /* the request's adapter */
    ok = ok && !cllm_model_forward_backward_ex(s->m, j->gen.ids, targets, 1, (int)n, false, 1.0f, &io, &sum, &counted);
    if (j->gen.adapter) cllm_lora_set_apply(s->p.adapters, -1);
    if (!ok) {
        free(j->prompt_lp);
        j->prompt_lp = NULL;
    } else {
        j->prompt_lp[0] = NAN;
        for (size_t t = 1; t < n; t++) j->prompt_lp[t] = -loss[t - 1];
    }
    free(loss);
    free(targets);
}

static void submit_job(cllm_server *s, srv_job *j) {
    if (j->gen.prompt_logprobs) prompt_logprobs(s, j);
    srv_gen *g = &j->gen;
    int failed = 0;
    char msg[512] = "";
    for (int i = 0; i < g->n && !failed; i++) {
        cllm_generate_params gp = g->gp;
        if (i) gp.seed = g->gp.seed + (uint64_t)i;
        uint64_t eid = 0;
        cllm_status st = cllm_engine_submit_adapter(s->engine, g->ids, g->n_ids, &gp, g->adapter - 1, &eid);
        if (st) {
            failed = st == CLLM_ERR_ARG ? 422 : 500;
            snprintf(msg, sizeof msg, "%s", cllm_last_error());
            for (int k = 0; k < i; k++) cllm_engine_cancel(s->engine, j->seq[k].eid);
        } else {
            j->seq[i].eid = eid;
        }
    }
    pthread_mutex_lock(&s->mu);
    j->submitted = true;
    if (failed) {
        j->err_status = failed;
        snprintf(j->err, sizeof j->err, "%s", msg);
        job_retire_locked(s, j);
    } else {
        j->next = s->active;
        s->active = j;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* With mu held: retires finished or cancelled jobs of the active list. */
static void sweep_locked(cllm_server *s) {
    srv_job **pp = &s->active;
    while (*pp) {
        srv_job *j = *pp;
        if (j->cancel && !srv_job_finished_locked(j))
            for (int i = 0; i < j->gen.n; i++)
                if (!j->seq[i].done) {
                    cllm_engine_cancel(s->engine, j->seq[i].eid);
                    j->seq[i].done = true;
                    j->seq[i].finish = CLLM_FINISH_CANCELLED;
                }
        bool over = j->cancel || srv_job_finished_locked(j);
        if (over) {
            *pp = j->next;
            j->next = NULL;
            job_retire_locked(s, j);
        } else {
            pp = &j->next;
        }
    }
}

static void *sched_main(void *arg) {
    cllm_server *s = arg;
    /* OpenMP's thread count is per thread: set it where the model runs. */
    if (s->p.threads > 0) omp_set_num_threads(s->p.threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        sweep_locked(s);
        srv_job *in = s->incoming;
        s->incoming = NULL;
        if (in) {
            pthread_mutex_unlock(&s->mu);
            while (in) {
                srv_job *next = in->next;
                in->next = NULL;
                submit_job(s, in);
                in = next;
            }
            pthread_mutex_lock(&s->mu);
            continue;
        }
        cllm_engine_stats st;
        cllm_engine_get_stats(s->engine, &st);
        s->running_seqs = st.running;
        s->queued_seqs = st.queued;
        if (st.running + st.queued == 0) {
            if (s->stopping) break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        cllm_status rc = cllm_engine_step(s->engine, on_event, s, NULL);
        pthread_mutex_lock(&s->mu);
        if (rc) {
            /* A failed forward: fail every running job rather than spin. */
            const char *why = cllm_last_error();
            for (srv_job *j = s->active; j; j = j->next)
                if (!srv_job_finished_locked(j)) {
                    j->err_status = 424;
                    snprintf(j->err, sizeof j->err, "generation failed: %s", why);
                    for (int i = 0; i < j->gen.n; i++)
                        if (!j->seq[i].done) cllm_engine_cancel(s->engine, j->seq[i].eid);
                }
        }
    }
    /* Stopping: fail what is left. */
    for (srv_job *j = s->incoming; j;) {
        srv_job *next = j->next;
        j->submitted = true;
        j->err_status = 503;
        snprintf(j->err, sizeof j->err, "the server is shutting down");
        job_retire_locked(s, j);
        j = next;
    }
    s->incoming = NULL;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

cllm_status srv_sched_start(cllm_server *s) {
    if (pthread_create(&s->sched, NULL, sched_main, s))
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "cannot start the scheduler thread");
    s->sched_running = true;
    return CLLM_OK;
}

void srv_sched_stop(cllm_server *s) {
    if (!s->sched_running) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    /* Cancel whatever still runs. */
    for (srv_job *j = s->active; j; j = j->next) j->cancel = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->sched, NULL);
    s->sched_running = false;
}
