/*
 * Mixture-of-experts training (docs/moe.md): the "moe" section's capacity
 * and expert parallelism, and the step's expert load, dropped choices and
 * all-to-all traffic for metrics.jsonl.
 *
 * Expert parallelism of size P over W ranks: ranks g*P .. g*P+P-1 form
 * expert-parallel group g (W/P groups); each rank reads its own batch (data
 * parallelism over all W ranks, as without experts) and runs E/P experts of
 * every block on the rows that the P ranks of its group route to them. The
 * flat buffers keep every tensor on every rank: a rank's gradient holds its
 * own experts' sums over its group's rows and zeros for the others, so the
 * data-parallel gradient sum over all W ranks (ZeRO 0-3, unchanged) is, for
 * an expert, the sum over the W/P ranks that run it, and checkpoints are
 * those of data parallelism (every tensor by its HF name), which resume on
 * any expert-parallel size.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "engine_impl.h"

static int ep_size(const cllm_train_config *c) {
    return c->moe.expert_parallel_size > 1 ? c->moe.expert_parallel_size : 1;
}

/* The capacity of training (train) or of evaluation. */
static cllm_status set_capacity(trainer *tr, bool train) {
    const cllm_train_config *c = tr->cfg;
    double f = !c->moe.given || !c->moe.drop_tokens ? 0.0 : train ? c->moe.capacity_factor : c->moe.eval_capacity_factor;
    return cllm_model_set_moe_capacity(tr->m, f, c->moe.min_capacity);
}

cllm_status train_moe_setup(trainer *tr, bool piped, bool tensor) {
    const cllm_train_config *c = tr->cfg;
    const int E = cllm_model_get_config(tr->m)->n_experts, P = ep_size(c), W = cllm_dist_size();
    if (c->save_expert_layout == CLLM_EXPERTS_FUSED && !E) /* refused before training, not at the save */
        return CLLM_FAIL(CLLM_ERR_ARG, "save_expert_layout fused: the model has no experts (not a mixture of "
                         "experts)");
    if (P > 1) {
        if (!E)
            return CLLM_FAIL(CLLM_ERR_ARG, "moe.expert_parallel_size %d: the model has no experts (not a mixture of "
                             "experts)", P);
        if (W % P)
            return CLLM_FAIL(CLLM_ERR_ARG, "moe.expert_parallel_size %d does not divide the %d ranks", P, W);
        if (E % P)
            return CLLM_FAIL(CLLM_ERR_ARG, "moe.expert_parallel_size %d does not divide the model's %d experts "
                             "(num_local_experts)", P, E);
        if (piped || tensor)
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "moe.expert_parallel_size with %s parallelism: not supported",
                             piped ? "pipeline" : "tensor");
        if (train_lora_run(c))
            return CLLM_FAIL(CLLM_ERR_UNSUPPORTED, "moe.expert_parallel_size with LoRA: not supported (LoRA trains a "
                             "Mixtral in one process or with data parallelism)");
        int ranks[1024], g0 = cllm_dist_rank() / P * P;
        for (int i = 0; i < P; i++) ranks[i] = g0 + i;
        cllm_status st = cllm_dist_group_init(&tr->ep_grp, ranks, P);
        if (st) return cllm_fail_context(st, "expert-parallel group");
    }
    if (!E) return CLLM_OK;
    if (!(tr->moe_step = calloc((size_t)E + 4, sizeof *tr->moe_step))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    return set_capacity(tr, false);
}

cllm_status train_moe_step_begin(trainer *tr) {
    if (!tr->moe_step) return CLLM_OK;
    cllm_status st = set_capacity(tr, true);
    if (!st && tr->ep_grp)
        st = cllm_model_set_expert_parallel(tr->m, tr->ep_grp, cllm_dist_group_rank(tr->ep_grp), ep_size(tr->cfg));
    if (!st) st = cllm_model_moe_reset_counters(tr->m);
    tr->a2a_bytes0 = (double)cllm_dist_alltoallv_sent_bytes();
    tr->a2a_sec0 = cllm_dist_alltoallv_seconds();
    return st;
}

cllm_status train_moe_step_end(trainer *tr) {
    if (!tr->moe_step) return CLLM_OK;
    const int E = cllm_model_get_config(tr->m)->n_experts;
    cllm_status st = cllm_model_set_expert_parallel(tr->m, NULL, 0, 1);
    if (!st) st = set_capacity(tr, false);
    if (st) return st;
    const int64_t *cnt = cllm_model_moe_counters(tr->m);
    for (int i = 0; i < E + 2; i++) tr->moe_step[i] = cnt ? (double)cnt[i] : 0;
    tr->moe_step[E + 2] = (double)cllm_dist_alltoallv_sent_bytes() - tr->a2a_bytes0;
    /* summed over every rank (the seconds are rank 0's: set after the sum) */
    if ((st = cllm_dist_allreduce_sum_f64(tr->moe_step, (size_t)E + 3))) return st;
    tr->moe_step[E + 3] = cllm_dist_alltoallv_seconds() - tr->a2a_sec0;
    return CLLM_OK;
}

void train_moe_record(const trainer *tr, train_record *r) {
    if (!tr->moe_step) return;
    const int E = cllm_model_get_config(tr->m)->n_experts;
    const double *v = tr->moe_step;
    if (E <= 256) {
        long long load[256];
        for (int e = 0; e < E; e++) load[e] = (long long)v[e];
        rec_ints(r, "expert_load", load, E);
    }
    rec_int(r, "moe_dropped", (long long)v[E]);
    rec_int(r, "moe_choices", (long long)v[E + 1]);
    rec_num(r, "moe_drop_fraction", v[E + 1] > 0 ? v[E] / v[E + 1] : 0.0);
    if (tr->ep_grp) {
        rec_int(r, "expert_parallel_size", ep_size(tr->cfg));
        rec_int(r, "a2a_bytes", (long long)v[E + 2]);
        rec_num(r, "time_a2a", v[E + 3]);
    }
}

void train_moe_free(trainer *tr) {
    free(tr->moe_step);
    tr->moe_step = NULL;
    cllm_dist_group_free(tr->ep_grp);
    tr->ep_grp = NULL;
}
