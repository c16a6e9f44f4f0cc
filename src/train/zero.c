/*
 * Data parallelism and ZeRO stages 0-2 for the training step.
 *
 * Every rank holds the whole model (params) and runs forward/backward on its
 * own rows of the global batch into the flat gradient buffer (scaled by
 * 1 / targets of the global batch, so a plain sum over ranks is the
 * one-process gradient). Then, by stage:
 *   0: bucketed all-reduce of the gradient; every rank clips and updates
 *      all parameters with a full optimizer state (replicated).
 *   1: bucketed all-reduce; each rank updates only its slice of the flat
 *      buffer, with optimizer state for that slice only; the parameters are
 *      then all-gathered.
 *   2: bucketed reduce-scatter: each rank receives only its slice of the
 *      summed gradient (the summed gradient is never held in full), then as
 *      stage 1.
 *   3: (only a frozen base's trainable buffer takes this path: full
 *      training at stage 3 partitions per layer, zero3.c) as stage 2, and
 *      the values stay partitioned between steps: after the update each rank
 *      drops the pages outside its slice, and the all-gather waits until the
 *      values are read again (train_zero_gather_values).
 * Slices are contiguous, 16-float (64-byte) aligned ranges of the flat
 * buffer in rank order; the last ones may be shorter or empty. The global
 * gradient norm is the square root of the all-reduced sum of the slices'
 * sums of squares. Weight-decay ranges are intersected with the slice.
 *
 * Stages 2 and 3 reduce per layer during the backward pass instead of
 * after it (zero3.c, through the model's layer hooks); the partition, the
 * buckets, the world checks and the memory report are shared from here.
 * Checkpoints of the slices: ckpt_shard.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "offload.h"
#include "train_impl.h"

#define SLICE_ALIGN 16 /* floats: 64 bytes, the alignment of tensors in the flat buffer */
/* MPI counts are ints: larger buckets are split anyway */
#define MAX_BUCKET ((size_t)1 << 30)

static size_t clamp_bucket(size_t n) { return n > MAX_BUCKET ? MAX_BUCKET : n; }

cllm_status train_zero_init(train_zero *z, const cllm_train_config *c, size_t n, const cllm_param_range *ranges,
                            int n_ranges) {
    /* the topology (model_topo) is checked by the engine (cllm/topo.h) */
    return train_zero_init_group(z, c, n, n, ranges, n_ranges, NULL, NULL);
}

cllm_status train_zero_init_group(train_zero *z, const cllm_train_config *c, size_t n, size_t n_total,
                                  const cllm_param_range *ranges, int n_ranges, const cllm_dist_group *grp,
                                  const cllm_dist_group *norm_grp) {
    memset(z, 0, sizeof *z);
    z->grp = grp;
    z->norm_grp = norm_grp;
    z->rank = cllm_dist_group_rank(grp);
    z->size = cllm_dist_group_size(grp);
    z->world = cllm_dist_size();
    z->stage = c->zero.stage;
    z->comm = c->comm_dtype;
    z->n = n;
    z->n_total = n_total;
    z->bucket = clamp_bucket(c->zero.reduce_bucket_size);
    z->gather_bucket = clamp_bucket(c->zero.allgather_bucket_size);
    z->counts = calloc(2 * (size_t)z->size, sizeof *z->counts);
    z->ranges = calloc(n_ranges > 0 ? (size_t)n_ranges : 1, sizeof *z->ranges);
    if (!z->counts || !z->ranges) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    z->bucket_counts = z->counts + z->size;
    size_t len = n;
    if (z->stage >= 1) {
        len = (n + (size_t)z->size - 1) / (size_t)z->size;
        len = (len + SLICE_ALIGN - 1) / SLICE_ALIGN * SLICE_ALIGN;
    }
    for (int r = 0; r < z->size; r++) {
        size_t b = z->stage >= 1 ? (size_t)r * len : 0;
        if (b > n) b = n;
        size_t e = b + len < n ? b + len : n;
        z->counts[r] = e - b;
        if (r == z->rank) z->begin = b, z->end = e;
    }
    for (int i = 0; i < n_ranges; i++) {
        size_t b = ranges[i].begin > z->begin ? ranges[i].begin : z->begin;
        size_t e = ranges[i].end < z->end ? ranges[i].end : z->end;
        if (b >= e) continue;
        z->ranges[z->n_ranges++] = (cllm_param_range){b - z->begin, e - z->begin, ranges[i].decay};
    }
    size_t slice = z->end - z->begin;
    z->mem.params = (z->stage == 3 ? slice : n) * sizeof(float);
    z->mem.grads = n * sizeof(float);
    z->mem.grads_reduced = (z->stage >= 2 ? slice : n) * sizeof(float);
    if (z->stage == 3) z->mem.work = (n - slice) * sizeof(float); /* the other slices, gathered for a step */
    return CLLM_OK;
}

void train_zero_free(train_zero *z) {
    free(z->counts);
    free(z->ranges);
    free(z->norm_skip);
    memset(z, 0, sizeof *z);
}

size_t train_zero_slice_len(const train_zero *z) { return z->end - z->begin; }

void train_zero_count_optim(train_zero *z, cllm_optimizer *opt) {
    size_t k = (cllm_optim_state(opt, 0) != NULL) + (cllm_optim_state(opt, 1) != NULL);
    z->mem.optim = k * (z->end - z->begin) * sizeof(float);
}

cllm_status train_zero_report(const train_zero *z, bool print) {
    uint64_t mine[5] = {z->mem.params, z->mem.grads, z->mem.grads_reduced, z->mem.optim, z->mem.work};
    uint64_t *all = malloc((size_t)z->world * sizeof mine);
    if (!all) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = cllm_dist_allgather_u64(mine, 5, all);
    for (int r = 0; r < z->world && !st && print; r++) {
        const uint64_t *m = all + 5 * (size_t)r;
        const double mib = 1.0 / (1024.0 * 1024.0);
        fprintf(stderr,
                "cllm train: rank %d/%d, ZeRO stage %d: model state %.2f MiB = params %.2f + grads %.2f (summed "
                "gradient kept %.2f) + optimizer %.2f; working buffers %.2f MiB\n",
                r, z->world, z->stage, (double)(m[0] + m[1] + m[3]) * mib, (double)m[0] * mib, (double)m[1] * mib,
                (double)m[2] * mib, (double)m[3] * mib, (double)m[4] * mib);
    }
    free(all);
    return st;
}

/* The rank parts of the bucket [b0, b1): each rank's slice intersected. */
static void bucket_parts(train_zero *z, size_t b0, size_t b1) {
    size_t off = 0;
    for (int r = 0; r < z->size; r++) {
        size_t b = off > b0 ? off : b0, e = off + z->counts[r] < b1 ? off + z->counts[r] : b1;
        z->bucket_counts[r] = e > b ? e - b : 0;
        off += z->counts[r];
    }
}

cllm_status train_zero_check_world(const train_zero *z, uint64_t config_hash, uint64_t data_size) {
    if (z->world == 1) return CLLM_OK;
    uint64_t mine[3] = {config_hash, data_size, (uint64_t)z->n_total};
    uint64_t *all = malloc((size_t)z->world * sizeof mine);
    if (!all) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = cllm_dist_allgather_u64(mine, 3, all);
    for (int r = 1; r < z->world && !st; r++) {
        const uint64_t *o = all + 3 * (size_t)r;
        if (o[0] != all[0])
            st = CLLM_FAIL(CLLM_ERR_ARG, "rank %d has a different training config than rank 0 (hash %016llx vs "
                           "%016llx): start every rank with the same config file and flags", r,
                           (unsigned long long)o[0], (unsigned long long)all[0]);
        else if (o[1] != all[1])
            st = CLLM_FAIL(CLLM_ERR_ARG, "rank %d sees %llu training samples, rank 0 %llu: every rank must read the "
                           "same data", r, (unsigned long long)o[1], (unsigned long long)all[1]);
        else if (o[2] != all[2])
            st = CLLM_FAIL(CLLM_ERR_ARG, "rank %d has a %llu-float parameter buffer, rank 0 %llu: every rank must "
                           "start from the same model", r, (unsigned long long)o[2], (unsigned long long)all[2]);
    }
    free(all);
    return st;
}

cllm_status train_zero_presum(const train_zero *z, float *buf, size_t b, size_t e) {
    for (int i = 0; i < z->n_shared; i++) {
        size_t lo = z->shared[i].begin > b ? z->shared[i].begin : b, hi = z->shared[i].end < e ? z->shared[i].end : e;
        for (size_t c0 = lo; c0 < hi; c0 += z->bucket) {
            size_t c1 = hi - c0 > z->bucket ? c0 + z->bucket : hi;
            cllm_status st = cllm_dist_g_allreduce_sum_f32(z->shared_grp, buf + (c0 - b), c1 - c0);
            if (st) return cllm_fail_context(st, "non-expert gradient sum over the expert-parallel group (at %zu)", c0);
        }
    }
    return CLLM_OK;
}

cllm_status train_zero_reduce_grads(train_zero *z, float *grads) {
    cllm_status pst = train_zero_presum(z, grads, 0, z->n);
    if (pst) return pst;
    if (z->size == 1) return CLLM_OK;
    for (size_t b0 = 0; b0 < z->n; b0 += z->bucket) {
        size_t b1 = z->n - b0 > z->bucket ? b0 + z->bucket : z->n;
        cllm_status st;
        if (z->stage < 2) {
            st = z->grp ? cllm_dist_g_allreduce_sum_f32(z->grp, grads + b0, b1 - b0)
                        : cllm_dist_allreduce_sum_f32_as(grads + b0, b1 - b0, z->comm);
        } else {
            /* in place: only this rank's part of the bucket comes back, at
             * the bucket's start; it moves to its place in the slice (the
             * other ranks' parts of the bucket are dead from here on) */
            bucket_parts(z, b0, b1);
            st = z->grp ? cllm_dist_g_reduce_scatter_sum_f32(z->grp, grads + b0, grads + b0, z->bucket_counts)
                        : cllm_dist_reduce_scatter_sum_f32_as(grads + b0, grads + b0, z->bucket_counts, z->comm);
            size_t k = z->bucket_counts[z->rank];
            if (!st && k) memmove(grads + (z->begin > b0 ? z->begin : b0), grads + b0, k * sizeof(float));
        }
        if (st) return cllm_fail_context(st, "gradient reduction (bucket at %zu)", b0);
    }
    return CLLM_OK;
}

double train_zero_norm_sq(const train_zero *z, const float *slice) {
    const size_t k = z->end - z->begin;
    double s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
    for (size_t i = 0; i < k; i++) s += (double)slice[i] * slice[i];
    for (int j = 0; j < z->n_norm_skip; j++) { /* counted by another tensor rank */
        size_t b = z->norm_skip[j].begin > z->begin ? z->norm_skip[j].begin : z->begin;
        size_t e = z->norm_skip[j].end < z->end ? z->norm_skip[j].end : z->end;
        for (size_t i = b; i < e; i++) s -= (double)slice[i - z->begin] * slice[i - z->begin];
    }
    return s < 0 ? 0 : s;
}

cllm_status train_zero_clip(train_zero *z, float *grads, double max_norm, double *norm) {
    if (z->stage == 0 && !z->norm_grp) {
        /* the reduced gradient is whole on every rank: the one-process code */
        *norm = cllm_grad_clip(grads, z->n, max_norm);
        return CLLM_OK;
    }
    float *g = grads + z->begin;
    const size_t k = z->end - z->begin;
    double s = train_zero_norm_sq(z, g);
    /* stage 0: every data rank holds its stage's whole gradient, the pipe
     * group holds the model once; sliced: the world holds it once */
    cllm_status st = z->stage == 0 ? cllm_dist_g_allreduce_sum_f64(z->norm_grp, &s, 1) : cllm_dist_allreduce_sum_f64(&s, 1);
    if (st) return cllm_fail_context(st, "gradient norm");
    *norm = sqrt(s);
    if (max_norm > 0) {
        double coef = max_norm / (*norm + 1e-6);
        if (coef < 1.0) {
            const float cf = (float)coef;
#pragma omp parallel for simd schedule(static)
            for (size_t i = 0; i < k; i++) g[i] *= cf;
        }
    }
    return CLLM_OK;
}

cllm_status train_zero_step(train_zero *z, cllm_optimizer *opt, float *params, const float *grads, double lr) {
    if (z->offload) {
        cllm_status st = train_offload_step(z->offload, opt, params + z->begin, grads + z->begin, z->ranges,
                                            z->n_ranges, lr);
        if (st) return st;
    } else {
        cllm_optim_step(opt, params + z->begin, grads + z->begin, z->ranges, z->n_ranges, lr);
    }
    if (z->stage < 3 || z->size == 1) return train_zero_gather_params(z, params);
    cllm_mem_release(params, z->begin * sizeof(float)); /* reads as zeros until the gather */
    cllm_mem_release(params + z->end, (z->n - z->end) * sizeof(float));
    z->scattered = true;
    return CLLM_OK;
}

cllm_status train_zero_gather_values(train_zero *z, float *params) {
    if (!z->scattered) return CLLM_OK;
    z->scattered = false;
    return train_zero_gather_params(z, params);
}

cllm_status train_zero_gather_params(train_zero *z, float *params) {
    if (z->stage == 0 || z->size == 1) return CLLM_OK;
    for (size_t b0 = 0; b0 < z->n; b0 += z->gather_bucket) {
        size_t b1 = z->n - b0 > z->gather_bucket ? b0 + z->gather_bucket : z->n;
        bucket_parts(z, b0, b1);
        cllm_status st = cllm_dist_g_allgather_f32(z->grp, params + b0, z->bucket_counts);
        if (st) return cllm_fail_context(st, "parameter all-gather (bucket at %zu)", b0);
    }
    return CLLM_OK;
}

cllm_status train_zero_agree(const train_zero *z, bool *flag) {
    if (z->size == 1) return CLLM_OK;
    int64_t v = *flag;
    cllm_status st = cllm_dist_allreduce_max_i64(&v, 1);
    *flag = v != 0;
    return st;
}
