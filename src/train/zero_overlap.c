/*
 * overlap_comm at ZeRO stages 0 and 1: the gradient all-reduce of each
 * parameter group starts, nonblocking, as soon as the backward pass of the
 * step's last micro-batch has finished that group (the model's grads_ready
 * hook), so the reductions of the later layers run while the earlier ones
 * are still being differentiated. The flat gradient buffer is reduced in
 * place, in reduce_bucket_size pieces, exactly the elements the blocking
 * path reduces; only the grouping of the calls differs. The progress
 * thread of cllm/dist.h moves the collectives while the computation runs
 * (OpenMPI does not progress nonblocking collectives on its own).
 */
#include <stdlib.h>

#include "cllm/dist.h"
#include "train_impl.h"

struct train_overlap {
    train_zero *z;
    cllm_model *m;
    float *grads;
    bool armed;    /* this backward is the step's last: reduce as groups finish */
    bool progress; /* we started the progress thread */
    cllm_dist_request **req;
    double *start;
    int n, cap;
    double comm, wait; /* seconds: collectives from start to completion, and waited for */
};

static cllm_status on_grads_ready(void *ctx, int g) {
    train_overlap *o = ctx;
    if (!o->armed) return CLLM_OK;
    size_t b, e;
    cllm_model_group_range(o->m, g, &b, &e);
    for (size_t b0 = b; b0 < e; b0 += o->z->bucket) {
        size_t b1 = e - b0 > o->z->bucket ? b0 + o->z->bucket : e;
        if (o->n == o->cap) {
            int cap = o->cap ? 2 * o->cap : 64;
            cllm_dist_request **r = realloc(o->req, (size_t)cap * sizeof *r);
            if (r) o->req = r;
            double *t = realloc(o->start, (size_t)cap * sizeof *t);
            if (t) o->start = t;
            if (!r || !t) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            o->cap = cap;
        }
        o->start[o->n] = cllm_time_sec();
        cllm_status st = cllm_dist_iallreduce_sum_f32(o->grads + b0, b1 - b0, &o->req[o->n]);
        if (st) return cllm_fail_context(st, "gradient all-reduce of group %d", g);
        o->n++;
    }
    return CLLM_OK;
}

cllm_status train_overlap_init(train_overlap **out, train_zero *z, cllm_model *m) {
    *out = NULL;
    if (!cllm_model_grads(m)) return CLLM_FAIL(CLLM_ERR_INTERNAL, "overlap_comm: the model has no gradient buffer");
    train_overlap *o = calloc(1, sizeof *o);
    if (!o) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    o->z = z;
    o->m = m;
    o->grads = cllm_model_grads(m);
    cllm_model_hooks h = {.ctx = o, .grads_ready = on_grads_ready};
    cllm_model_set_hooks(m, &h);
    o->progress = cllm_dist_progress_start();
    *out = o;
    return CLLM_OK;
}

void train_overlap_arm(train_overlap *o, bool last_micro_batch) { o->armed = last_micro_batch; }

cllm_status train_overlap_finish(train_overlap *o) {
    cllm_status st = CLLM_OK;
    double t0 = cllm_time_sec();
    for (int i = 0; i < o->n; i++) {
        double done = 0;
        cllm_status sti = cllm_dist_wait(o->req[i], &done);
        o->req[i] = NULL;
        if (!st) st = sti;
        o->comm += done > o->start[i] ? done - o->start[i] : 0.0;
    }
    o->wait += cllm_time_sec() - t0;
    o->n = 0;
    o->armed = false;
    return st ? cllm_fail_context(st, "gradient reduction") : CLLM_OK;
}

double train_overlap_comm_seconds(const train_overlap *o) { return o ? o->comm : 0.0; }
double train_overlap_wait_seconds(const train_overlap *o) { return o ? o->wait : 0.0; }

void train_overlap_free(train_overlap *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) cllm_dist_wait(o->req[i], NULL);
    cllm_model_set_hooks(o->m, NULL);
    if (o->progress) cllm_dist_progress_stop();
    free(o->req);
    free(o->start);
    free(o);
}
