/*
 * Memory estimates of training runs (see cllm/memory.h and docs/memory.md).
 * The formulas live here once; activation sizes come from the model's own
 * carving code.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/kernels.h"
#include "cllm/memory.h"
#include "cllm/topo.h"

/* Rank 0's slice (the largest): ceil(n / dp) rounded up to 16 floats, as
 * train_zero_init partitions the flat buffer. */
static size_t shard(size_t n, int dp) {
    if (dp <= 1) return n;
    size_t s = (n + (size_t)dp - 1) / (size_t)dp;
    s = (s + 15) / 16 * 16;
    return s < n ? s : n;
}

/* The three GEMMs of a linear layer over R rows, IN -> OUT (w_in_out: the
 * weight stored [IN, OUT]), as cllm_linear_forward/_backward call them:
 * the largest oneDNN workspace among them. */
static size_t linear_work(int R, int IN, int OUT, bool w_in_out, int threads) {
    size_t w[3] = {cllm_matmul_workspace(R, OUT, IN, false, !w_in_out, threads),
                   cllm_matmul_workspace(R, IN, OUT, false, w_in_out, threads),
                   w_in_out ? cllm_matmul_workspace(IN, OUT, R, true, false, threads)
                            : cllm_matmul_workspace(OUT, IN, R, true, false, threads)};
    size_t m = w[0] > w[1] ? w[0] : w[1];
    return m > w[2] ? m : w[2];
}

/* The largest oneDNN GEMM workspace of a training step of (local) config
 * c: *blocks over every linear layer of a block (llama: separate q, k, v
 * and gate/up projections; gpt2: Conv1D weights stored [IN, OUT]) over
 * N = B*T rows, *head over the head's logits chunk of `rows` rows. */
static void gemm_work(const cllm_model_config *c, int N, int rows, int threads, size_t *blocks, size_t *head) {
    const int C = c->n_embd, F = c->n_inner, Q = c->n_head * c->head_dim, K = c->n_kv_head * c->head_dim;
    const bool io = c->arch == CLLM_ARCH_GPT2, llama = c->arch == CLLM_ARCH_LLAMA;
    size_t w[5] = {llama ? linear_work(N, C, Q, false, threads) : linear_work(N, C, 3 * Q, io, threads),
                   llama ? linear_work(N, C, K, false, threads) : 0,
                   linear_work(N, Q, C, io, threads),
                   linear_work(N, C, F, io, threads),
                   linear_work(N, F, C, io, threads)};
    *blocks = 0;
    for (int i = 0; i < 5; i++)
        if (w[i] > *blocks) *blocks = w[i];
    *head = rows > 0 ? linear_work(rows, C, c->vocab_size, false, threads) : 0;
}

/* Mixture of experts: the active parameters, and the rows an expert-parallel
 * rank receives per block (src/model/moe_ep.c): at most every rank's N*k
 * choices, or with a capacity factor f at most E * capacity ~ N*k*f. */
static cllm_status expert_terms(const cllm_model_config *c, const cllm_mem_setup *s, cllm_mem_estimate *out) {
    const int ep = s->expert_parallel > 1 ? s->expert_parallel : 1, E = c->n_experts, k = c->n_experts_per_tok;
    const size_t C = (size_t)c->n_embd, F = (size_t)c->n_inner, L = (size_t)c->n_layer;
    out->active_params = out->n_params;
    if (E > 0) out->active_params -= L * (size_t)(E - k) * 3 * C * F;
    if (ep == 1) return CLLM_OK;
    if (!E) return CLLM_FAIL(CLLM_ERR_ARG, "expert parallelism %d: the model has no experts", ep);
    if (E % ep) return CLLM_FAIL(CLLM_ERR_ARG, "expert parallelism %d does not divide the model's %d experts", ep, E);
    if (s->dp % ep)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert parallelism %d does not divide the %d data-parallel ranks", ep, s->dp);
    if (s->pipe > 1 || s->tensor > 1)
        return CLLM_FAIL(CLLM_ERR_ARG, "expert parallelism with pipeline or tensor parallelism is not supported");
    const double nk = (double)s->micro_batch * s->seq_len * k;
    double rows = s->capacity_factor > 0 && s->capacity_factor < ep ? nk * s->capacity_factor : nk * ep;
    size_t r = (size_t)rows + (size_t)E; /* the capacity's rounding up, per expert */
    out->expert_buffers = (L * r * (C + 3 * F) + r * (3 * C + 3 * F)) * sizeof(float);
    return CLLM_OK;
}

/* ZeRO-3 inside pipeline stage g, whose range of the flat buffer is `range`
 * floats: the stage's slices of parameters, gradient and optimizer state
 * (its range partitioned over its data group); the working buffers of its
 * own groups (group 0 on the first stage, the last group on the last, the
 * blocks' if it has any: a group's gradient, the gathered parameters and
 * their 16-bit copy); with a tied head the embedding kept whole on the
 * first and the last stage (values, gradient, optimizer state; the last
 * stage's group-0 buffers hold it). Every rank loads the whole model
 * (`final` floats) before it keeps its slice, and the first stage gathers
 * it again at the end, after its optimizer state and working buffers were
 * freed: counted where that is more than they are. */
static cllm_status stage3_terms(const cllm_model_config *c, const cllm_mem_setup *s, const cllm_stage *g,
                                size_t range, size_t small, size_t final, int states, size_t *prm, size_t *grd,
                                size_t *opt, size_t *work) {
    size_t first, last, block;
    cllm_status st = cllm_model_config_groups(c, &first, &last, &block);
    if (st) return st;
    const bool embed = g->first_unit == 0;
    const size_t VC = (size_t)c->vocab_size * (size_t)c->n_embd;
    /* whole: the stage's small tensors, and the tied embedding (the first
     * stage's counts among them when it is small too) */
    size_t tied = c->tie_embeddings && ((embed && (double)VC >= s->persistence) || g->head) ? VC : 0;
    tied += small;
    const size_t f = embed || (c->tie_embeddings && g->head) ? first : 0, l = g->head ? last : 0;
    const size_t b = g->n_layers > 0 ? block : 0;
    const size_t slice = shard(range, s->dp), F = sizeof(float);
    *prm = (slice + tied) * F;
    *grd = (slice + tied) * F;
    *opt = s->offload_optimizer ? 0 : (size_t)states * (slice + tied) * F;
    *work = (f + l + b) * F + (f + l + 2 * b) * (F + cllm_precision_copy_bytes(s->precision));
    if (final * F > *opt + *work) *prm += final * F - *opt - *work;
    return CLLM_OK;
}

cllm_status cllm_memory_estimate(const cllm_model_config *c, const cllm_mem_setup *s, cllm_mem_estimate *out) {
    memset(out, 0, sizeof *out);
    if (s->micro_batch <= 0 || s->seq_len <= 0 || s->grad_accum <= 0 || s->dp <= 0 || s->pipe < 0 || s->tensor < 0 ||
        s->threads < 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "micro-batch, sequence length, accumulation and dp must be positive, pipe, "
                         "tensor and threads not negative");
    if (s->zero_stage < 0 || s->zero_stage > 3)
        return CLLM_FAIL(CLLM_ERR_ARG, "ZeRO stage %d (expected 0, 1, 2 or 3)", s->zero_stage);
    if (c->n_ctx > 0 && s->seq_len > c->n_ctx)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence length %d exceeds the model's %d positions", s->seq_len, c->n_ctx);
    if ((size_t)s->micro_batch * (size_t)s->seq_len > (size_t)1 << 28)
        return CLLM_FAIL(CLLM_ERR_ARG, "micro-batch of %d x %d tokens is too large", s->micro_batch, s->seq_len);
    const int P = s->pipe > 1 ? s->pipe : 1, TP = s->tensor > 1 ? s->tensor : 1;
    /* a pipeline stage at ZeRO 2 holds its gradient slice and per-layer
     * buffers, or with a tied head its range's gradient as at stage 1
     * (reduce-scattered after the stage's backward); at stage 3 its slices
     * and its own groups' gathered buffers (below) */
    if (s->trainable && (P > 1 || TP > 1 || s->offload_param))
        return CLLM_FAIL(CLLM_ERR_ARG, "a frozen base (LoRA) trains with data parallelism only (ZeRO stage 0-3, "
                         "offload_optimizer; not offload_param)");
    if (s->sequence_parallel && TP < 2)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence parallelism needs tensor parallelism (tensor > 1)");
    if (s->sequence_parallel && s->seq_len % TP)
        return CLLM_FAIL(CLLM_ERR_ARG, "sequence parallelism: sequence length %d is not divisible by the %d tensor "
                         "ranks", s->seq_len, TP);
    if (s->quant_numel && !s->trainable)
        return CLLM_FAIL(CLLM_ERR_ARG, "a quantized base trains only with LoRA adapters");
    size_t n_params, len, full_len = 0;
    cllm_status st = cllm_model_config_params(c, &n_params, &len);
    if (st) return st;
    /* a tensor rank's part: heads, FFN width and vocabulary cut TP ways */
    cllm_model_config local = *c;
    if (TP > 1) {
        if ((st = cllm_topo_check_tensor(c, TP, "model"))) return st;
        local.n_head /= TP;
        local.n_kv_head /= TP;
        local.n_inner /= TP;
        local.vocab_size = (local.vocab_size + TP - 1) / TP; /* padded */
        full_len = len;
        size_t whole_params = n_params;
        if ((st = cllm_model_config_params(&local, &n_params, &len))) return st;
        n_params = whole_params;
        c = &local;
    }
    /* a pipeline rank's optimizer covers its stage's range; at stage 3 a
     * stage's small tensors stay whole (small[u]: their floats per unit;
     * without a pipeline they are not counted, R = 0 in docs/memory.md) */
    cllm_stage *stages = NULL;
    size_t *units = NULL, *small = calloc((size_t)c->n_layer + 2, sizeof *small);
    if (!small) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (P > 1 && s->zero_stage >= 3 && s->persistence > 0 && !s->trainable)
        st = cllm_model_config_unit_small(c, s->persistence, small);
    if (P > 1 && !st) {
        stages = calloc((size_t)P, sizeof *stages);
        units = calloc((size_t)c->n_layer + 2, sizeof *units);
        if (!stages || !units) st = CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        if (!st) st = cllm_topo_partition(c, P, NULL, stages, "estimate");
        if (!st) st = cllm_model_config_unit_params(c, units);
        if (!st && c->tie_embeddings) /* the head's copy of the embedding is not in its range */
            units[c->n_layer + 1] -= (size_t)c->vocab_size * (size_t)c->n_embd;
        if (st) {
            free(stages);
            free(units);
            free(small);
            return st;
        }
    }
    if (st) {
        free(small);
        return st;
    }
    /* expert parallelism at ZeRO 0-2 (moe_train.c): a rank holds the
     * non-expert tensors and E / ep experts of every block; ZeRO's slices
     * are those of the dp / ep ranks holding the same experts */
    const int ep = s->expert_parallel > 1 ? s->expert_parallel : 1;
    int dz = s->dp;
    if (ep > 1 && c->n_experts && c->n_experts % ep == 0 && s->dp % ep == 0 && s->zero_stage <= 2 && !s->trainable &&
        P == 1 && TP == 1) {
        const size_t expert = (size_t)c->n_layer * (size_t)c->n_experts * 3 * (size_t)c->n_embd * (size_t)c->n_inner;
        len -= expert / (size_t)ep * (size_t)(ep - 1);
        out->rank_params = n_params - expert / (size_t)ep * (size_t)(ep - 1);
        dz = s->dp / ep;
    } else {
        out->rank_params = n_params;
    }
    size_t opt_len = len;
    size_t bytes = len * sizeof(float);
    int states = 0;
    switch (s->optimizer) {
    case CLLM_OPT_ADAM:
    case CLLM_OPT_ADAMW: states = 2; break;
    case CLLM_OPT_LION: states = 1; break;
    default: states = s->sgd_momentum ? 1 : 0; break;
    }
    out->n_params = n_params;
    /* a frozen base stays whole on every rank at stage 3 (below) */
    out->params = (s->zero_stage >= 3 && !s->trainable ? shard(len, s->dp) * sizeof(float) : bytes) +
                  full_len * sizeof(float);
    if (s->offload_param) {
        if (s->zero_stage < 3) {
            free(stages);
            free(units);
            free(small);
            return CLLM_FAIL(CLLM_ERR_ARG, "parameter offload needs ZeRO stage 3");
        }
        out->params_disk = out->params; /* mapped from a file; pages dropped after each use */
        out->params = 0;
    }
    if (s->trainable) { /* the frozen base whole; the trainable buffer beside it (whole during a step) */
        opt_len = s->trainable;
        bytes = s->trainable * sizeof(float);
        /* a quantized base: its linear layers' fp32 slots are never touched */
        out->params += bytes + s->quant_bytes - s->quant_numel * sizeof(float);
    }
    out->grads = s->zero_stage >= 2 ? shard(opt_len, dz) * sizeof(float) : bytes;
    out->optim = (size_t)states * (s->zero_stage >= 1 ? shard(opt_len, dz) : opt_len) * sizeof(float);
    if (s->offload_optimizer) {
        if (s->offload_buffer_count < 3 || s->offload_buffer_size < 1) {
            free(stages);
            free(units);
            free(small);
            return CLLM_FAIL(CLLM_ERR_ARG, "offload buffer: %ld buffers of %ld floats (expected >= 3 and >= 1)",
                             s->offload_buffer_count, s->offload_buffer_size);
        }
        size_t slice = s->zero_stage >= 1 ? shard(opt_len, dz) : opt_len;
        size_t chunk = (size_t)s->offload_buffer_size < slice ? (size_t)s->offload_buffer_size : slice;
        out->optim_disk = out->optim;
        out->optim = 0;
        out->offload_buffer = (size_t)s->offload_buffer_count * (size_t)states * chunk * sizeof(float);
    }
    if (s->trainable) {
        /* a frozen base reduces after the backward (no per-group buffers);
         * an adapter's pass holds its rank-r activations and their gradient
         * (none with lora_rank 0: frozen tensors, no adapters) */
        out->work = 2 * (size_t)s->micro_batch * (size_t)s->seq_len * (size_t)s->lora_rank * sizeof(float);
        out->work += s->quant_widest * sizeof(float); /* one dequantized layer of a quantized base */
        if (s->quant_compute16) { /* its rounded input / output gradient and product (+ bias), at the widest */
            size_t w = (size_t)c->n_embd, qkv = (size_t)(c->n_head + 2 * c->n_kv_head) * (size_t)c->head_dim;
            if ((size_t)c->n_inner > w) w = (size_t)c->n_inner;
            if (qkv > w) w = qkv;
            out->work += 2 * ((size_t)s->micro_batch * (size_t)s->seq_len + 1) * w * sizeof(float);
        }
    } else if (s->zero_stage >= 2 && (P == 1 || !c->tie_embeddings)) {
        /* stages 2-3 reduce per group (a tied pipeline's stage at stage 2
         * after its backward): a group's gradient is written into a
         * working buffer (group 0, last group, blocks); stage 3 also gathers
         * parameters into working buffers (group 0, last group, two blocks) */
        size_t first, last, block;
        if ((st = cllm_model_config_groups(c, &first, &last, &block))) {
            free(stages);
            free(units);
            free(small);
            return st;
        }
        out->work = (first + last + block) * sizeof(float);
        /* stage 3: the gathered buffers, and with 16-bit matmuls a 16-bit
         * copy of each (instead of one of the whole flat buffer, below) */
        if (s->zero_stage >= 3)
            out->work += (first + last + 2 * block) * (sizeof(float) + cllm_precision_copy_bytes(s->precision));
    }
    cllm_model_activation_bytes_sp(c, s->micro_batch, s->seq_len, true, s->grad_ckpt, s->sequence_parallel ? TP : 1,
                                   &out->act);
    out->logits = out->act.logits;
    out->activations = out->act.total - out->act.logits;
    out->snapshot = s->async_save && !s->offload_optimizer ? (s->trainable ? bytes : out->params) + out->optim : 0;
    out->other = 3 * (size_t)s->micro_batch * (size_t)s->grad_accum * (size_t)s->seq_len * sizeof(int32_t);
    /* the head's chunk rows, from the logits chunk the carving code sized */
    int rows = c->vocab_size > 0 ? (int)(out->act.logits / sizeof(float) / (size_t)c->vocab_size) : 0;
    size_t gw_blocks = 0, gw_head = 0;
    gemm_work(c, s->micro_batch * s->seq_len, rows, s->threads, &gw_blocks, &gw_head);
    out->gemm_work = gw_blocks > gw_head ? gw_blocks : gw_head;
    if (P > 1) {
        /* the stage whose own memory is largest. Pages a stage never touches
         * (other stages' activations, unused message buffers) are allocated
         * but not resident, so they are not counted: the stage's blocks'
         * activations, the head's logits on the last stage, and under 1F1B
         * min(P - k, M) stage inputs (not on the first stage), as many send
         * buffers each way, one receive and one scratch buffer. */
        /* a stage message: this tensor rank's positions under sequence parallelism */
        const size_t NC = (size_t)s->micro_batch * (size_t)(s->seq_len / (s->sequence_parallel ? TP : 1)) *
                          (size_t)c->n_embd * sizeof(float);
        const cllm_act_bytes *A = &out->act;
        size_t best = 0;
        for (int k = 0; k < P; k++) {
            const cllm_stage *g = &stages[k];
            size_t range = 0;
            size_t sm = 0;
            for (int u = g->first_unit; u < g->first_unit + g->n_units; u++) range += units[u], sm += small[u];
            size_t opt = (size_t)states * (s->zero_stage >= 1 ? shard(range, s->dp) : range) * sizeof(float);
            size_t per = (size_t)(c->n_layer > 0 ? c->n_layer : 1);
            size_t act = A->head + A->backward + A->block_inputs / per * (size_t)g->n_layers +
                         (s->grad_ckpt ? A->block_saved : A->block_saved / per * (size_t)g->n_layers);
            size_t logits = g->head ? A->logits : 0;
            size_t slots = (size_t)(P - k < s->grad_accum ? P - k : s->grad_accum);
            size_t bufs = ((k > 0 ? 2 * slots : 0) + (k < P - 1 ? slots + 2 : 0)) * NC;
            if (s->offload_optimizer) opt = 0;
            /* parameters and gradients: the stage's range (and the tied
             * embedding on the last stage); the first stage receives the
             * whole parameters for the final save */
            size_t keep = range + (c->tie_embeddings && k == P - 1 ? (size_t)c->vocab_size * (size_t)c->n_embd : 0);
            size_t prm = (k == 0 ? len : keep) * sizeof(float), grd = keep * sizeof(float);
            if (s->zero_stage >= 2 && !c->tie_embeddings) grd = shard(range, s->dp) * sizeof(float); /* per layer */
            /* only the last stage runs the head's GEMMs */
            size_t gw = g->head && gw_head > gw_blocks ? gw_head : g->n_layers > 0 ? gw_blocks : 0;
            size_t wk = out->work;
            if (s->zero_stage >= 3 && (st = stage3_terms(c, s, g, range, sm, len, states, &prm, &grd,
                                                          &opt, &wk)))
                break;
            size_t tot = prm + grd + opt + act + logits + bufs + gw + wk;
            if (tot >= best) {
                out->work = wk;
                out->gemm_work = gw;
                best = tot;
                opt_len = range;
                out->params = prm + full_len * sizeof(float);
                out->grads = grd;
                if (!s->offload_optimizer) out->optim = opt;
                out->activations = act;
                out->logits = logits;
                out->pipe_buffers = bufs;
            }
        }
        if (st) {
            free(stages);
            free(units);
            free(small);
            return st;
        }
        if (s->offload_param) { /* the stage's slice lives in the file */
            out->params_disk = shard(opt_len, s->dp) * sizeof(float);
            out->params -= out->params_disk < out->params ? out->params_disk : out->params;
        }
        if (s->offload_optimizer) {
            size_t chunk = (size_t)s->offload_buffer_size < opt_len ? (size_t)s->offload_buffer_size : opt_len;
            out->optim_disk = (size_t)states * (s->zero_stage >= 1 ? shard(opt_len, s->dp) : opt_len) * sizeof(float);
            out->offload_buffer = (size_t)s->offload_buffer_count * (size_t)states * chunk * sizeof(float);
        }
    }
    /* a tensor rank gathers every rank's part at the end (and at each
     * checkpoint): TP x its part, while everything else is still allocated */
    if (TP > 1) out->pipe_buffers += (size_t)TP * len * sizeof(float);
    free(stages);
    free(units);
    free(small);
    if ((st = expert_terms(c, s, out))) return st;
    /* MPI's temporaries while one gradient bucket is reduced over the dz
     * data-parallel ranks, measured with Open MPI 4.1 (2 and 4 ranks, 1-34 MB):
     * an in-place reduce-scatter of n floats raises every rank's peak RSS by
     * about 1.45 n floats, an all-reduce by 0.5 n. ZeRO 2-3 reduce-scatter one
     * group's gradient at a time (a frozen base, or a tied pipeline's stage at
     * stage 2, the whole trainable range); ZeRO 0-1 all-reduce the buffer. */
    if (dz > 1) {
        size_t n = opt_len;
        if (s->zero_stage >= 2 && !s->trainable && (P == 1 || !c->tie_embeddings || s->zero_stage >= 3)) {
            size_t first, last, block;
            if ((st = cllm_model_config_groups(c, &first, &last, &block))) return st;
            n = first > last ? first : last;
            if (block > n) n = block;
        }
        const size_t bucket = s->reduce_bucket ? s->reduce_bucket : (size_t)500000000;
        if (n > bucket) n = bucket;
        out->mpi_buffers = (s->zero_stage >= 2 ? 3 * n / 2 : n / 2) * sizeof(float);
    }
    out->precision = cllm_model_precision_bytes(c, s->zero_stage >= 3 && !s->trainable ? 0 : len, s->micro_batch,
                                                s->seq_len, s->precision);
    out->overhead = s->overhead;
    out->total = out->params + out->grads + out->optim + out->offload_buffer + out->work + out->activations +
                 out->logits + out->snapshot + out->other + out->precision + out->pipe_buffers + out->gemm_work +
                 out->expert_buffers + out->mpi_buffers + out->overhead;
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
