/*
 * Mixture-of-experts training (docs/moe.md): the "moe" section's capacity
 * and expert parallelism, and the step's expert load, dropped choices and
 * all-to-all traffic for metrics.jsonl.
 *
 * Expert parallelism of size P over W ranks: ranks g*P .. g*P+P-1 form
 * expert-parallel group g (W/P groups); each rank reads its own batch (data
 * parallelism over all W ranks, as without experts) and runs E/P experts of
 * every block on the rows that the P ranks of its group route to them.
 *
 * At ZeRO 0-2 (sliced experts) the model becomes this rank's part: the
 * non-expert tensors and its own experts only (cllm_moe_model_part). The
 * non-expert gradients are summed over the expert-parallel group, then ZeRO
 * (partition, reduction, updates) runs over the expert-data group, the W/P
 * ranks q, q+P, .. holding the same experts, which completes the non-expert
 * sums to all W ranks and sums each expert over the ranks running it.
 * Checkpoints and the final model are gathered into the whole model's
 * layout on rank 0 (engine.c), so they resume on any expert-parallel size.
 * Elsewhere (ZeRO-3, and the settings replicated_reason names) the flat
 * buffers keep every expert on every rank: a rank's gradient holds its own
 * experts' sums over its group's rows and zeros for the others, and the
 * data-parallel sum over all W ranks is, for an expert, the sum over the
 * W/P ranks that run it.
 */
#include <stdio.h>
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

/* Why this run keeps every expert on every rank (NULL: it slices them). */
static const char *replicated_reason(const cllm_train_config *c) {
    if (c->zero.stage >= 3)
        return "ZeRO-3 with sliced experts is not built (its partitioned parameters and the replicated small "
               "tensors are gathered and summed over one group, the data-parallel world; a sliced expert's over "
               "another, the ranks holding the same experts)";
    if (c->n_freeze) return "freeze keeps a trainable set of the whole model";
    if (c->task && strcmp(c->task, "lm") != 0) return "the task's extra models hold every expert";
    if (c->zero.offload_optimizer.device == CLLM_OFFLOAD_NVME) return "offload_optimizer streams the whole buffer";
    if (c->comm_dtype != CLLM_F32) return "16-bit gradient sums run over the whole world";
    return NULL;
}

/* The ranges of the flat buffer outside the expert tensors (the tensors are
 * in offset order; the gaps between tensors go with the shared ranges). */
static cllm_status shared_ranges(trainer *tr) {
    const cllm_model *m = tr->m;
    const int nt = cllm_model_n_tensors(m);
    if (!(tr->ep_shared = calloc((size_t)nt + 1, sizeof *tr->ep_shared))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    size_t at = 0;
    for (int i = 0; i < nt; i++) {
        if (!cllm_moe_tensor_is_expert(m, i)) continue;
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        if (t->offset > at) tr->ep_shared[tr->n_ep_shared++] = (cllm_param_range){at, t->offset, false};
        at = t->offset + t->numel;
    }
    size_t n = cllm_model_buffer_len(m);
    if (n > at) tr->ep_shared[tr->n_ep_shared++] = (cllm_param_range){at, n, false};
    return CLLM_OK;
}

/* This rank's part of the model (its experts only) in place of the whole,
 * and the expert-data group: the ranks with the same expert-parallel index. */
static cllm_status slice_experts(trainer *tr) {
    const cllm_train_config *c = tr->cfg;
    const int P = ep_size(c), W = cllm_dist_size(), q = cllm_dist_rank() % P;
    const char *why = replicated_reason(c);
    cllm_model *whole = tr->m;
    const size_t n_whole = cllm_model_n_params(whole);
    if (why) {
        if (c->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0)
            fprintf(stderr, "cllm train: expert parallelism keeps every expert on every rank (%zu parameters per "
                    "rank): %s\n", n_whole, why);
        return CLLM_OK;
    }
    int *ranks = calloc((size_t)W / (size_t)P, sizeof *ranks);
    if (!ranks) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < W / P; i++) ranks[i] = q + i * P;
    cllm_status st = cllm_dist_group_init(&tr->edp_grp, ranks, W / P);
    free(ranks);
    if (st) return cllm_fail_context(st, "expert-data-parallel group");
    cllm_model *part = NULL;
    if ((st = cllm_moe_model_part(&part, whole, P, q))) return cllm_fail_context(st, "moe.expert_parallel_size");
    if ((st = cllm_model_set_expert_parallel(part, tr->ep_grp, q, P))) {
        cllm_model_free(part);
        return st;
    }
    cllm_model_free(whole);
    tr->m = part;
    tr->ep_sliced = true;
    if ((st = shared_ranges(tr))) return st;
    if (c->log != CLLM_LOG_MODE_QUIET) {
        const int E = cllm_model_get_config(part)->n_experts;
        fprintf(stderr, "cllm train: rank %d: parameters on this rank: %zu (experts: local %d of %d per block, %zu "
                "expert parameters; the whole model %zu)\n", cllm_dist_rank(), cllm_model_n_params(part),
                cllm_moe_model_experts_held(part, NULL), E, cllm_moe_model_expert_params(part), n_whole);
    }
    return CLLM_OK;
}

cllm_status train_moe_zero_init(trainer *tr, size_t n) {
    cllm_status st = train_zero_init_group(&tr->zero, tr->cfg, n, n, tr->ranges, tr->n_ranges, tr->edp_grp, tr->ep_grp);
    if (st) return st;
    tr->zero.shared_grp = tr->ep_grp;
    tr->zero.shared = tr->ep_shared;
    tr->zero.n_shared = tr->n_ep_shared;
    if (cllm_dist_group_rank(tr->ep_grp) == 0) return st;
    /* the non-expert tensors' norm counted once, by the first rank of each expert-parallel group */
    cllm_param_range *r = malloc(((size_t)tr->n_ep_shared + 1) * sizeof *r);
    if (!r) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    memcpy(r, tr->ep_shared, (size_t)tr->n_ep_shared * sizeof *r);
    tr->zero.norm_skip = r;
    tr->zero.n_norm_skip = tr->n_ep_shared;
    return CLLM_OK;
}

cllm_status train_moe_gather(trainer *tr, const float *part_buf, cllm_model **whole, float **full_buf) {
    *whole = NULL;
    *full_buf = NULL;
    /* only the group of the writer (world rank 0) takes part */
    if (cllm_dist_rank() >= ep_size(tr->cfg)) return CLLM_OK;
    cllm_status st = CLLM_OK;
    if (cllm_dist_rank() == 0) {
        if ((st = cllm_moe_model_whole(whole, tr->m))) return st;
        *full_buf = cllm_model_params(*whole);
    }
    return cllm_moe_gather_buffer(*whole, tr->m, tr->ep_grp, part_buf, *full_buf);
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
        if ((st = slice_experts(tr))) return st;
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
    /* a part holds only its experts: it stays expert-parallel (evaluation too) */
    cllm_status st = tr->ep_sliced ? CLLM_OK : cllm_model_set_expert_parallel(tr->m, NULL, 0, 1);
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
    cllm_dist_group_free(tr->edp_grp);
    tr->edp_grp = NULL;
    free(tr->ep_shared);
    tr->ep_shared = NULL;
}
