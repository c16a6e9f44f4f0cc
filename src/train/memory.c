/*
 * Memory estimates of training runs (see cllm/memory.h and docs/memory.md).
 * The formulas live here once; activation sizes come from the model's own
 * carving code.
 */
#include <string.h>

#include "cllm/memory.h"

/* Rank 0's slice (the largest): ceil(n / dp) rounded up to 16 floats, as
 * train_zero_init partitions the flat buffer. */
static size_t shard(size_t n, int dp) {
    if (dp <= 1) return n;
    size_t s = (n + (size_t)dp - 1) / (size_t)dp;
    s = (s + 15) / 16 * 16;
    return s < n ? s : n;
}

cllm_status cllm_memory_estimate(const cllm_model_config *c, const cllm_mem_setup *s, cllm_mem_estimate *out) {
    memset(out, 0, sizeof *out);
    if (s->micro_batch <= 0 || s->seq_len <= 0 || s->grad_accum <= 0 || s->dp <= 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "micro-batch, sequence length, accumulation and dp must be positive");
    if (s->zero_stage < 0 || s->zero_stage > 3)
        return CLLM_FAIL(CLLM_ERR_ARG, "ZeRO stage %d (expected 0, 1, 2 or 3)", s->zero_stage);
    if (c->n_ctx > 0 && s->seq_len > c->n_ctx)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence length %d exceeds the model's %d positions", s->seq_len, c->n_ctx);
    if ((size_t)s->micro_batch * (size_t)s->seq_len > (size_t)1 << 28)
        return CLLM_FAIL(CLLM_ERR_ARG, "micro-batch of %d x %d tokens is too large", s->micro_batch, s->seq_len);
    size_t n_params, len;
    cllm_status st = cllm_model_config_params(c, &n_params, &len);
    if (st) return st;
    size_t bytes = len * sizeof(float);
    int states = 0;
    switch (s->optimizer) {
    case CLLM_OPT_ADAM:
    case CLLM_OPT_ADAMW: states = 2; break;
    case CLLM_OPT_LION: states = 1; break;
    default: states = s->sgd_momentum ? 1 : 0; break;
    }
    out->n_params = n_params;
    out->params = s->zero_stage >= 3 ? shard(len, s->dp) * sizeof(float) : bytes;
    out->grads = s->zero_stage >= 2 ? shard(len, s->dp) * sizeof(float) : bytes;
    out->optim = (size_t)states * (s->zero_stage >= 1 ? shard(len, s->dp) * sizeof(float) : bytes);
    if (s->offload_optimizer) {
        if (s->offload_buffer_count < 3 || s->offload_buffer_size < 1)
            return CLLM_FAIL(CLLM_ERR_ARG, "offload buffer: %ld buffers of %ld floats (expected >= 3 and >= 1)",
                             s->offload_buffer_count, s->offload_buffer_size);
        size_t slice = s->zero_stage >= 1 ? shard(len, s->dp) : len;
        size_t chunk = (size_t)s->offload_buffer_size < slice ? (size_t)s->offload_buffer_size : slice;
        out->optim_disk = out->optim;
        out->optim = 0;
        out->offload_buffer = (size_t)s->offload_buffer_count * (size_t)states * chunk * sizeof(float);
    }
    if (s->zero_stage >= 2) {
        /* stages 2-3 reduce per group: a group's gradient is written into a
         * working buffer (group 0, last group, blocks); stage 3 also gathers
         * parameters into working buffers (group 0, last group, two blocks) */
        size_t first, last, block;
        if ((st = cllm_model_config_groups(c, &first, &last, &block))) return st;
        out->work = (first + last + block) * sizeof(float);
        if (s->zero_stage >= 3) out->work += (first + last + 2 * block) * sizeof(float);
    }
    cllm_model_activation_bytes(c, s->micro_batch, s->seq_len, true, s->grad_ckpt, &out->act);
    out->logits = out->act.logits;
    out->activations = out->act.total - out->act.logits;
    out->snapshot = s->async_save && !s->offload_optimizer ? out->params + out->optim : 0;
    out->other = 3 * (size_t)s->micro_batch * (size_t)s->grad_accum * (size_t)s->seq_len * sizeof(int32_t);
    out->precision = cllm_model_precision_bytes(c, len, s->micro_batch, s->seq_len, s->precision);
    out->overhead = s->overhead;
    out->total = out->params + out->grads + out->optim + out->offload_buffer + out->work + out->activations +
                 out->logits + out->snapshot + out->other + out->precision + out->overhead;
    return CLLM_OK;
}

static double setup_cost(const cllm_mem_setup *s, const cllm_mem_setup *start) {
    double cost = 1.0;
    if (s->grad_ckpt && !start->grad_ckpt) cost *= 4.0 / 3.0;
    for (int b = s->micro_batch; b < start->micro_batch; b *= 2) cost *= 1.05;
    if (s->zero_stage >= 3 && start->zero_stage < 3 && s->dp > 1) cost *= 1.5;
    return cost;
}

bool cllm_memory_suggest(const cllm_model_config *c, const cllm_mem_setup *start, size_t budget, cllm_mem_setup *best,
                         cllm_mem_estimate *est) {
    bool found = false;
    double best_cost = 0;
    for (int stage = start->zero_stage; stage <= 3; stage++) {
        if (stage > start->zero_stage && start->dp < 2) break; /* sharding over one rank saves nothing */
        for (int ck = start->grad_ckpt ? 1 : 0; ck <= 1; ck++) {
            for (int mb = start->micro_batch; mb >= 1; mb = mb == 1 ? 0 : (mb + 1) / 2) {
                cllm_mem_setup s = *start;
                s.zero_stage = stage;
                s.grad_ckpt = ck;
                s.micro_batch = mb;
                /* keep the samples per step: accumulate more */
                long samples = (long)start->micro_batch * start->grad_accum;
                s.grad_accum = (int)((samples + mb - 1) / mb);
                cllm_mem_estimate e;
                if (cllm_memory_estimate(c, &s, &e) || e.total > budget) continue;
                double cost = setup_cost(&s, start);
                if (!found || cost < best_cost || (cost == best_cost && e.total < est->total)) {
                    found = true;
                    best_cost = cost;
                    *best = s;
                    *est = e;
                }
            }
        }
    }
    return found;
}
