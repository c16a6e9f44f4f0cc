/*
 * Pipeline-parallel training step: this rank's stage of the layer sequence,
 * the schedule of its micro-batches (cllm/pipe.h), the activations and
 * gradients exchanged with the neighbouring stages, and the tied embedding
 * shared by the first and the last stage.
 *
 * Memory: a stage keeps, per micro-batch in flight, only its INPUT
 * ([micro, T, C] floats, or nothing on the first stage, whose input is the
 * token ids) and recomputes the stage's forward right before that
 * micro-batch's backward (GPipe's re-materialisation), so in-flight
 * micro-batches cost one [micro, T, C] each and the block activations exist
 * once per stage. The price is one more forward pass of the stage per
 * micro-batch, except on the last stage, whose forward is run only once,
 * fused with its backward. Send buffers are as many as the micro-batches in
 * flight: a buffer is reused only after its previous message was received
 * (tests/test_pipe.c shows the schedules cannot deadlock that way).
 *
 * The flat parameter buffer is split between stages in unit order, so stage
 * s owns one contiguous range [begin, end); ranges of consecutive stages
 * touch. Every rank still allocates the whole flat buffer (the other
 * stages' parts are never read except the tied embedding on the last
 * stage, and are refreshed only when the model is saved or evaluated).
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/split.h"
#include "train_impl.h"

struct train_pipe {
    int K, s, M, mb, T, C;
    size_t nc;         /* floats of one stage message (this tensor rank's positions under sequence parallelism) */
    cllm_stage stage;
    cllm_pipe_schedule sched;
    int prev, next; /* world ranks of the neighbouring stages, -1 at the ends */
    size_t begin, end, n;
    size_t *counts;             /* [K] range lengths of the stages, for gathering the model */
    cllm_stage *stages;         /* [K] every stage's units */
    size_t tied_begin, tied_len; /* the embedding matrix, when the head is tied */
    cllm_dist_group *pipe_grp, *tied_grp;
    int slots;                  /* micro-batches in flight */
    float *xin, *xsend, *dsend, *drecv, *scratch; /* [slots][NC] x3, [NC] x2 */
    cllm_dist_req *xreq, *dreq;  /* [slots] */
    cllm_pipe_op *ops;           /* [2M] */
    double busy, wait;           /* seconds computing / blocked in receives, summed over steps */
    size_t in_flight_peak;       /* bytes of stage inputs held at once, at most */
};

/* Range of the flat buffer holding units [u0, u1): the model's parameter
 * groups are the units, each one contiguous range, in order. */
static void unit_range(const cllm_model *m, int u0, int u1, size_t *b, size_t *e) {
    size_t ignore;
    cllm_model_group_range(m, u0, b, &ignore);
    cllm_model_group_range(m, u1 - 1, &ignore, e);
}

cllm_status train_pipe_init(train_pipe **out, const cllm_train_config *c, cllm_model *m, const cllm_topo *topo,
                            const char *where) {
    *out = NULL;
    train_pipe *p = calloc(1, sizeof *p);
    if (!p) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    const cllm_model_config *mc = cllm_model_get_config(m);
    p->K = topo->dims[CLLM_AXIS_PIPE];
    p->s = topo->coord[CLLM_AXIS_PIPE];
    p->M = (int)c->gradient_accumulation_steps;
    p->mb = (int)c->train_micro_batch_size_per_gpu;
    p->T = c->seq_len;
    p->C = mc->n_embd;
    p->n = cllm_model_buffer_len(m);
    cllm_status st = CLLM_OK;
    cllm_stage *stages = calloc((size_t)p->K, sizeof *stages);
    p->counts = calloc((size_t)p->K, sizeof *p->counts);
    int *ranks = calloc((size_t)p->K, sizeof *ranks);
    if (!stages || !p->counts || !ranks) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = cllm_topo_partition(mc, p->K, &c->model_topo.parts, stages, where))) goto done;
    p->sched = c->model_topo.schedule;
    p->stage = stages[p->s];
    p->stages = stages;
    for (int k = 0; k < p->K; k++) {
        size_t b, e;
        unit_range(m, stages[k].first_unit, stages[k].first_unit + stages[k].n_units, &b, &e);
        p->counts[k] = e - b;
        if (k == p->s) p->begin = b, p->end = e;
    }
    cllm_topo_group(topo, CLLM_AXIS_PIPE, ranks);
    p->prev = p->s > 0 ? ranks[p->s - 1] : -1;
    p->next = p->s + 1 < p->K ? ranks[p->s + 1] : -1;
    if ((st = cllm_dist_group_init(&p->pipe_grp, ranks, p->K))) goto done;
    /* tied head: the first and the last stage of each pipeline form a pair */
    if (mc->tie_embeddings) {
        const cllm_tensor_info *wte = NULL;
        for (int i = 0; i < cllm_model_n_tensors(m) && !wte; i++)
            if (cllm_tp_rule_of(m, i).unit == 0 && cllm_tp_rule_of(m, i).cut == CLLM_TP_ROWS) wte = cllm_model_tensor(m, i);
        p->tied_begin = wte ? wte->offset : 0;
        p->tied_len = wte ? wte->numel : 0;
        int pair[2] = {ranks[0], ranks[p->K - 1]}, self = topo->rank;
        bool end = p->s == 0 || p->s == p->K - 1;
        if ((st = cllm_dist_group_init(&p->tied_grp, end ? pair : &self, end ? 2 : 1))) goto done;
    }
    p->slots = cllm_pipe_max_in_flight(p->sched, p->K, p->s, p->M);
    size_t NC = p->nc = cllm_model_stage_floats(m, p->mb, p->T);
    p->xin = cllm_alloc(3 * (size_t)p->slots * NC * sizeof(float), "pipeline stage buffers");
    p->drecv = cllm_alloc(2 * NC * sizeof(float), "pipeline stage buffers");
    p->xreq = calloc(2 * (size_t)p->slots, sizeof *p->xreq);
    p->ops = calloc(2 * (size_t)p->M, sizeof *p->ops);
    if (!p->xin || !p->drecv || !p->xreq || !p->ops) {
        st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for pipeline buffers");
        goto done;
    }
    p->xsend = p->xin + (size_t)p->slots * NC;
    p->dsend = p->xsend + (size_t)p->slots * NC;
    p->scratch = p->drecv + NC;
    p->dreq = p->xreq + p->slots;
    cllm_pipe_ops(p->sched, p->K, p->s, p->M, p->ops);
    p->in_flight_peak = (p->s > 0 ? (size_t)p->slots : 0) * NC * sizeof(float);
done:
    if (!p->stages) free(stages);
    free(ranks);
    if (st) {
        train_pipe_free(p);
        return st;
    }
    *out = p;
    return CLLM_OK;
}

void train_pipe_free(train_pipe *p) {
    if (!p) return;
    for (int i = 0; p->xreq && i < 2 * p->slots; i++) cllm_dist_send_wait(&p->xreq[i]);
    cllm_dist_group_free(p->pipe_grp);
    cllm_dist_group_free(p->tied_grp);
    cllm_free(p->xin);
    cllm_free(p->drecv);
    free(p->xreq);
    free(p->ops);
    free(p->counts);
    free(p->stages);
    free(p);
}

void train_pipe_range(const train_pipe *p, size_t *begin, size_t *end) {
    *begin = p->begin;
    *end = p->end;
}
const cllm_stage *train_pipe_stage(const train_pipe *p) { return &p->stage; }
int train_pipe_slots(const train_pipe *p) { return p->slots; }
size_t train_pipe_inflight_bytes(const train_pipe *p) { return p->in_flight_peak; }
const char *train_pipe_schedule(const train_pipe *p) { return cllm_pipe_schedule_name(p->sched); }
void train_pipe_times(const train_pipe *p, double *busy, double *wait) {
    *busy = p->busy;
    *wait = p->wait;
}

cllm_status train_pipe_run(train_pipe *p, cllm_model *m, const int32_t *tokens, const int32_t *targets,
                           float grad_scale, double *loss_sum) {
    const size_t NC = p->nc, rows = (size_t)p->mb * (size_t)p->T;
    const bool first = p->s == 0, last = p->s == p->K - 1;
    const int u0 = p->stage.first_unit, u1 = u0 + p->stage.n_units;
    cllm_status st = CLLM_OK;
    *loss_sum = 0;
    for (int k = 0; k < 2 * p->M && !st; k++) {
        cllm_pipe_op op = p->ops[k];
        const int i = op.micro, slot = i % p->slots;
        float *xin = p->xin + (size_t)slot * NC;
        const int32_t *tok = tokens + (size_t)i * rows, *tgt = targets + (size_t)i * rows;
        double t0 = cllm_time_sec(), sum = 0;
        long cnt = 0;
        if (op.kind == CLLM_PIPE_FWD) {
            if (!first && (st = cllm_dist_recv_f32(xin, NC, p->prev, 2 * i))) break;
            double t1 = cllm_time_sec();
            p->wait += t1 - t0;
            if (last) continue; /* runs fused with the backward */
            float *xs = p->xsend + (size_t)slot * NC;
            if ((st = cllm_dist_send_wait(&p->xreq[slot]))) break;
            cllm_model_stage_io io = {u0, u1, tok, NULL, xin, NULL, xs, NULL, false, 0};
            if ((st = cllm_model_stage_run(m, &io, p->mb, p->T, &sum, &cnt))) break;
            st = cllm_dist_isend_f32(xs, NC, p->next, 2 * i, &p->xreq[slot]);
            p->busy += cllm_time_sec() - t1;
        } else {
            if (!last && (st = cllm_dist_recv_f32(p->drecv, NC, p->next, 2 * i + 1))) break;
            double t1 = cllm_time_sec();
            p->wait += t1 - t0;
            float *ds = p->dsend + (size_t)slot * NC;
            if (!first && (st = cllm_dist_send_wait(&p->dreq[slot]))) break;
            cllm_model_stage_io io = {u0, u1, tok, tgt, xin, p->drecv, p->scratch, ds, true, grad_scale};
            if ((st = cllm_model_stage_run(m, &io, p->mb, p->T, &sum, &cnt))) break;
            *loss_sum += sum;
            if (!first) st = cllm_dist_isend_f32(ds, NC, p->prev, 2 * i + 1, &p->dreq[slot]);
            p->busy += cllm_time_sec() - t1;
        }
    }
    /* every message of the step is delivered before the buffers change hands */
    for (int j = 0; j < 2 * p->slots; j++) {
        cllm_status w = cllm_dist_send_wait(&p->xreq[j]);
        if (!st) st = w;
    }
    return st;
}

cllm_status train_pipe_eval(train_pipe *p, cllm_model *m, const int32_t *tokens, const int32_t *targets, int rows,
                            double *loss_sum, long *n_counted) {
    const bool first = p->s == 0, last = p->s == p->K - 1;
    const size_t NC = cllm_model_stage_floats(m, rows, p->T); /* rows <= micro: fits one slot */
    const int tag = 2 * p->M; /* above the training step's tags (its messages are all delivered) */
    *loss_sum = 0;
    *n_counted = 0;
    double t0 = cllm_time_sec();
    cllm_status st = first ? CLLM_OK : cllm_dist_recv_f32(p->xin, NC, p->prev, tag);
    if (st) return st;
    double t1 = cllm_time_sec();
    p->wait += t1 - t0;
    cllm_model_stage_io io = {p->stage.first_unit, p->stage.first_unit + p->stage.n_units, tokens, targets, p->xin,
                              NULL, last ? NULL : p->xsend, NULL, false, 0};
    if ((st = cllm_model_stage_run(m, &io, rows, p->T, loss_sum, n_counted))) return st;
    if (!last && !(st = cllm_dist_isend_f32(p->xsend, NC, p->next, tag, &p->xreq[0])))
        st = cllm_dist_send_wait(&p->xreq[0]);
    p->busy += cllm_time_sec() - t1;
    return st;
}

cllm_status train_pipe_sync_tied_grads(train_pipe *p, float *grads) {
    if (!p->tied_grp || cllm_dist_group_size(p->tied_grp) < 2) return CLLM_OK;
    return cllm_dist_g_allreduce_sum_f32(p->tied_grp, grads + p->tied_begin, p->tied_len);
}

cllm_status train_pipe_sync_tied_params(train_pipe *p, float *params) {
    if (!p->tied_grp || cllm_dist_group_size(p->tied_grp) < 2) return CLLM_OK;
    /* the first stage owns the embedding and its optimizer state */
    return cllm_dist_g_bcast(p->tied_grp, params + p->tied_begin, p->tied_len * sizeof(float), 0);
}

cllm_status train_pipe_gather_params(train_pipe *p, float *params) {
    return cllm_dist_g_allgather_f32(p->pipe_grp, params, p->counts);
}

cllm_status train_pipe_gather_params_to_first(train_pipe *p, float *params) {
    return cllm_dist_g_gather_f32(p->pipe_grp, params, p->counts, 0);
}

cllm_status train_pipe_gather_layout(train_pipe *p, const cllm_model *m, float *buf) {
    size_t *counts = calloc((size_t)p->K, sizeof *counts);
    if (!counts) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int k = 0; k < p->K; k++) {
        size_t b, e;
        unit_range(m, p->stages[k].first_unit, p->stages[k].first_unit + p->stages[k].n_units, &b, &e);
        counts[k] = e - b;
    }
    cllm_status st = cllm_dist_g_allgather_f32(p->pipe_grp, buf, counts);
    free(counts);
    return st;
}

const cllm_dist_group *train_pipe_group(const train_pipe *p) { return p->pipe_grp; }

const cllm_dist_group *train_pipe_tied(const train_pipe *p, size_t *at, size_t *len) {
    *at = p->tied_begin;
    *len = p->tied_len;
    return p->tied_grp && cllm_dist_group_size(p->tied_grp) > 1 ? p->tied_grp : NULL;
}

/* The parts of the flat buffers this rank uses: its stage's range, and the
 * tied embedding on the last stage (the head reads it). */
static int keep_ranges(const train_pipe *p, size_t *b, size_t *e) {
    int k = 0;
    bool tied_here = p->tied_grp && cllm_dist_group_size(p->tied_grp) > 1 && p->s == p->K - 1;
    if (tied_here) b[k] = p->tied_begin, e[k] = p->tied_begin + p->tied_len, k++;
    b[k] = p->begin, e[k] = p->end, k++;
    return k;
}

void train_pipe_zero_grads(const train_pipe *p, float *grads) {
    if (!grads) return; /* per-layer gradient buffers (ZeRO 2-3 layer hooks, zero3.c) */
    size_t b[2], e[2];
    int k = keep_ranges(p, b, e);
    for (int i = 0; i < k; i++) memset(grads + b[i], 0, (e[i] - b[i]) * sizeof(float));
}

void train_pipe_release(const train_pipe *p, float *buf) {
    if (!buf) return;
    size_t b[2], e[2];
    int k = keep_ranges(p, b, e);
    size_t at = 0; /* release the gaps between the kept ranges (sorted: the embedding comes first) */
    for (int i = 0; i < k; i++) {
        if (b[i] > at) cllm_mem_release(buf + at, (b[i] - at) * sizeof(float));
        if (e[i] > at) at = e[i];
    }
    if (p->n > at) cllm_mem_release(buf + at, (p->n - at) * sizeof(float));
}
