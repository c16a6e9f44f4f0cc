/*
 * ZeRO++'s quantized collectives at stage 3 (DeepSpeed's keys in
 * zero_optimization; the paper: Wang et al., "ZeRO++: Extremely Efficient
 * Collective Communication for Giant Model Training", 2023):
 *
 *   zero_quantized_weights (qwZ): a parameter all-gather moves int8 blocks
 *     instead of fp32 values. Each rank quantizes its part of the chunk with
 *     src/quant's Q8_0 blocks (32 values, an fp16 scale d = max|x| / 127,
 *     codes round(x / d): 34 bytes per 32 values, 1.06 bytes per value
 *     instead of 4), the byte parts are all-gathered, and every part,
 *     this rank's own included, is dequantized, so every rank computes
 *     with the same weights. DeepSpeed quantizes groups of up to about 8000
 *     values with an fp32 scale; the smaller blocks cost 6% more bytes and
 *     bound each value's error by half a step of its own block's scale.
 *   zero_quantized_gradients (qgZ): a gradient reduce-scatter becomes an
 *     all-to-all of int8 blocks: each rank quantizes the part of its
 *     gradient chunk that each other rank owns (blocks of QG_BLOCK values
 *     with an fp32 scale, which a gradient needs: an fp16 scale flushes
 *     blocks of values below 1e-5 to zero), sends it to that rank, and the
 *     owner dequantizes the ranks' parts and adds them in fp32, in rank
 *     order. 1.03 bytes per value instead of 4. DeepSpeed's qgZ quantizes
 *     to int4 and reduces in two all-to-all hops (within, then across
 *     nodes); one hop of int8 here keeps the sum closer to the fp32 one.
 *     A block holding inf or NaN (an fp16 overflow) gets a NaN scale, so
 *     the overflow reaches the owner and the step is skipped.
 *   zero_hpz_partition_size H (hpZ): consecutive groups of H ranks (a node's
 *     ranks under mpirun's by-slot placement) each hold a secondary copy of
 *     all the parameters, partitioned over the group's H ranks (slices of
 *     roundup(N / H, 16) floats). The first gather of a parameter group
 *     after an optimizer step spans every rank (the forward pass) and fills
 *     this rank's secondary part of it from the gathered values; the later
 *     gathers of that group before the next step (the backward pass,
 *     recomputation, evaluation) all-gather from the secondary copies within
 *     the H ranks only. The values are the same either way (with qwZ, the
 *     dequantized ones the forward used), so hpZ alone changes no result.
 *     H must divide the number of ranks; H = 1 or H = ranks changes nothing.
 *
 * All of them run blocking (also with overlap_comm). The final gather of
 * the trained model stays exact (zero3.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/quant.h"
#include "train_impl.h"

#define QG_BLOCK 128 /* gradient values per fp32 scale */

struct train_zpp {
    int rank, size;
    bool weights, grads;
    unsigned char *send, *recv;
    size_t cap, rcap;      /* bytes of each */
    size_t *qb;            /* [size] byte parts */
    size_t *qb2;           /* [size] */
    /* hpZ */
    int hpz, hidx;           /* H > 1, or 0 when off; this rank's index in its group */
    cllm_dist_group *hgrp;   /* this rank's group of H */
    size_t n, slen, sbegin, send_; /* flat floats; secondary slice length; this rank's [sbegin, send_) */
    float *sec;              /* [slen] the secondary part */
    size_t *hcounts;         /* [H] scratch */
};

static size_t qw_bytes(size_t n) { return cllm_wfmt_row_bytes(CLLM_WFMT_INT8, (int64_t)n); }
static size_t qg_bytes(size_t n) { return (n + QG_BLOCK - 1) / QG_BLOCK * sizeof(float) + n; }

static bool hpz_on(const cllm_train_config *c, const train_zero *z) {
    long h = c->zero.hpz_partition_size;
    /* above the ranks: refused by hpz_init; a data group (pipeline, tensor
     * parallelism): the quantized collectives run over the world only */
    return z->stage == 3 && z->size > 1 && !z->grp && h > 1 && h != z->size;
}

bool train_zpp_active(const cllm_train_config *c, const train_zero *z, bool *weights, bool *grads) {
    bool on = z->stage == 3 && z->size > 1 && !z->grp;
    *weights = on && c->zero.quantized_weights;
    *grads = on && c->zero.quantized_gradients;
    return *weights || *grads || hpz_on(c, z);
}

void train_zpp_log(const cllm_train_config *c, const train_zero *z) {
    const cllm_zero_config *zc = &c->zero;
    if (!zc->quantized_weights && !zc->quantized_gradients && zc->hpz_partition_size <= 1) return;
    const char *why = z->stage < 3    ? "ZeRO++ works at stage 3"
                      : z->size == 1 ? "one rank sends nothing"
                      : z->grp       ? "its collectives span the world, not the data group of a pipeline stage or "
                                       "tensor rank"
                                     : NULL;
    if (zc->quantized_weights) {
        if (why)
            fprintf(stderr, "cllm train: zero_quantized_weights: no effect (%s)\n", why);
        else
            fprintf(stderr, "cllm train: zero_quantized_weights: active, parameter all-gathers in int8 blocks of %d "
                    "with an fp16 scale (%.4f bytes per value instead of 4)\n", CLLM_QBLOCK,
                    (double)CLLM_Q8_BLOCK_BYTES / CLLM_QBLOCK);
    }
    if (zc->quantized_gradients) {
        if (why)
            fprintf(stderr, "cllm train: zero_quantized_gradients: no effect (%s)\n", why);
        else
            fprintf(stderr, "cllm train: zero_quantized_gradients: active, gradient reduce-scatters as an all-to-all "
                    "of int8 blocks of %d with an fp32 scale (%.4f bytes per value instead of %d), summed in fp32\n",
                    QG_BLOCK, (double)qg_bytes(QG_BLOCK) / QG_BLOCK, c->comm_dtype == CLLM_F32 ? 4 : 2);
    }
    if (zc->hpz_partition_size > 1 && hpz_on(c, z)) {
        long h = zc->hpz_partition_size;
        fprintf(stderr, "cllm train: zero_hpz_partition_size %ld: active, a secondary copy of the parameters "
                "partitioned within each group of %ld ranks (%.2f MiB per rank); gathers after the first since the "
                "last step stay inside the group\n", h, h,
                (double)(((z->n_total + (size_t)h - 1) / (size_t)h + 15) / 16 * 16) * 4.0 / 1048576.0);
    } else if (zc->hpz_partition_size > 1) {
        fprintf(stderr, "cllm train: zero_hpz_partition_size %ld: no effect (%s)\n", zc->hpz_partition_size,
                why ? why : "the group would be every rank");
    }
}

/* The group of H consecutive ranks and this rank's secondary slice. */
static cllm_status hpz_init(train_zpp *q, const train_zero *z, long h) {
    if (z->size % h != 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "zero_optimization.zero_hpz_partition_size %ld does not divide the %d ranks "
                         "(use the ranks per host, or 1)", h, z->size);
    int H = (int)h, ranks[1024];
    if (H > 1024) return CLLM_FAIL(CLLM_ERR_ARG, "zero_optimization.zero_hpz_partition_size %ld: at most 1024", h);
    for (int i = 0; i < H; i++) ranks[i] = z->rank / H * H + i;
    cllm_status st = cllm_dist_group_init(&q->hgrp, ranks, H);
    if (st) return cllm_fail_context(st, "zero_hpz_partition_size group");
    q->hpz = H;
    q->n = z->n;
    q->slen = ((z->n + (size_t)H - 1) / (size_t)H + 15) / 16 * 16;
    int j = q->hidx = z->rank % H;
    q->sbegin = (size_t)j * q->slen < z->n ? (size_t)j * q->slen : z->n;
    q->send_ = q->sbegin + q->slen < z->n ? q->sbegin + q->slen : z->n;
    q->sec = cllm_alloc((q->slen ? q->slen : 1) * sizeof(float), "hpZ secondary parameters");
    q->hcounts = calloc((size_t)H, sizeof *q->hcounts);
    return q->sec && q->hcounts ? CLLM_OK : CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
}

size_t train_zpp_hpz_bytes(const train_zpp *q) { return q && q->hpz ? q->slen * sizeof(float) : 0; }
bool train_zpp_hpz(const train_zpp *q) { return q && q->hpz; }

void train_zpp_hpz_keep(train_zpp *q, const float *buf, size_t b, size_t e) {
    size_t lo = b > q->sbegin ? b : q->sbegin, hi = e < q->send_ ? e : q->send_;
    if (lo < hi) memcpy(q->sec + (lo - q->sbegin), buf + (lo - b), (hi - lo) * sizeof(float));
}

cllm_status train_zpp_hpz_gather(train_zpp *q, float *buf, size_t b, size_t e, size_t chunk, size_t *bytes) {
    size_t lo = b > q->sbegin ? b : q->sbegin, hi = e < q->send_ ? e : q->send_;
    if (lo < hi) memcpy(buf + (lo - b), q->sec + (lo - q->sbegin), (hi - lo) * sizeof(float));
    for (size_t c0 = b; c0 < e; c0 += chunk) {
        size_t c1 = e - c0 > chunk ? c0 + chunk : e, mine = 0;
        for (int j = 0; j < q->hpz; j++) {
            size_t sb = (size_t)j * q->slen < q->n ? (size_t)j * q->slen : q->n;
            size_t se = sb + q->slen < q->n ? sb + q->slen : q->n;
            size_t x = c0 > sb ? c0 : sb, y = c1 < se ? c1 : se;
            q->hcounts[j] = y > x ? y - x : 0;
            if (j == q->hidx) mine = q->hcounts[j];
        }
        cllm_status st = cllm_dist_g_allgather_f32(q->hgrp, buf + (c0 - b), q->hcounts);
        if (st) return cllm_fail_context(st, "hpZ parameter all-gather at %zu", c0);
        *bytes += (c1 - c0 - mine) * sizeof(float);
    }
    return CLLM_OK;
}

cllm_status train_zpp_init(train_zpp **out, const train_zero *z, const cllm_train_config *c, size_t max_chunk) {
    train_zpp *q = calloc(1, sizeof *q);
    *out = q;
    if (!q) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    bool weights = false, grads = false;
    train_zpp_active(c, z, &weights, &grads);
    if (hpz_on(c, z)) {
        cllm_status st = hpz_init(q, z, c->zero.hpz_partition_size);
        if (st) return st;
    }
    q->rank = z->rank;
    q->size = z->size;
    q->weights = weights;
    q->grads = grads;
    /* a chunk cut into size parts: each part adds at most one partial block */
    size_t per = qg_bytes(max_chunk) + (size_t)z->size * (sizeof(float) + 1);
    size_t pw = qw_bytes(max_chunk) + (size_t)z->size * CLLM_Q8_BLOCK_BYTES;
    q->cap = per > pw ? per : pw;
    /* qgZ receives every rank's copy of this rank's part: at most a slice */
    size_t part = z->counts[0] < max_chunk ? z->counts[0] : max_chunk;
    q->rcap = grads ? (size_t)z->size * qg_bytes(part) : 1;
    q->qb = calloc(2 * (size_t)z->size, sizeof *q->qb);
    if (!q->qb) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    if (!weights && !grads) return CLLM_OK; /* hpZ alone */
    q->send = cllm_alloc(q->cap, "quantized collective buffers");
    q->recv = cllm_alloc(q->rcap, "quantized collective buffers");
    if (!q->send || !q->recv) return CLLM_ERR_NOMEM;
    q->qb2 = q->qb + z->size;
    return CLLM_OK;
}

void train_zpp_free(train_zpp *q) {
    if (!q) return;
    cllm_dist_group_free(q->hgrp);
    cllm_free(q->sec);
    free(q->hcounts);
    cllm_free(q->send);
    cllm_free(q->recv);
    free(q->qb);
    free(q);
}

bool train_zpp_weights(const train_zpp *q) { return q && q->weights; }
bool train_zpp_grads(const train_zpp *q) { return q && q->grads; }

cllm_status train_zpp_gather(train_zpp *q, float *buf, const size_t *counts, size_t *bytes) {
    size_t off = 0, qoff = 0;
    for (int r = 0; r < q->size; r++) {
        q->qb[r] = qw_bytes(counts[r]);
        if (r == q->rank && counts[r] && qoff + q->qb[r] <= q->cap)
            cllm_quant_q8_0_row(q->send + qoff, buf + off, (int64_t)counts[r]);
        off += counts[r];
        qoff += q->qb[r];
    }
    const size_t total = qoff;
    if (total > q->cap) return CLLM_FAIL(CLLM_ERR_INTERNAL, "quantized gather of %zu bytes, buffer %zu", total, q->cap);
    cllm_status st = cllm_dist_allgather_bytes(q->send, q->qb);
    if (st) return cllm_fail_context(st, "quantized parameter all-gather");
    off = qoff = 0;
    for (int r = 0; r < q->size; r++) {
        if (counts[r]) cllm_quant_dequant_row(buf + off, q->send + qoff, CLLM_WFMT_INT8, (int64_t)counts[r]);
        off += counts[r];
        qoff += q->qb[r];
    }
    *bytes += total - q->qb[q->rank];
    return CLLM_OK;
}

/* dst[qg_bytes(n)] <- n values as int8 blocks: the fp32 scales first, then
 * the codes. A block with a non-finite value gets a NaN scale. */
static void qg_put(unsigned char *dst, const float *x, size_t n) {
    size_t nb = (n + QG_BLOCK - 1) / QG_BLOCK;
    int8_t *codes = (int8_t *)(dst + nb * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * QG_BLOCK, i1 = i0 + QG_BLOCK < n ? i0 + QG_BLOCK : n;
        float amax = 0;
        bool finite = true;
        for (size_t i = i0; i < i1; i++) {
            float a = fabsf(x[i]);
            finite &= isfinite(a);
            if (a > amax) amax = a;
        }
        float d = finite ? amax / 127.0f : NAN, inv = finite && amax > 0 ? 127.0f / amax : 0.0f;
        memcpy(dst + b * sizeof(float), &d, sizeof d);
        for (size_t i = i0; i < i1; i++) codes[i] = finite ? cllm_quant_code8(x[i] * inv) : 0;
    }
}

/* acc[n] += the values of qg_put's blocks. */
static void qg_add(float *acc, const unsigned char *src, size_t n) {
    size_t nb = (n + QG_BLOCK - 1) / QG_BLOCK;
    const int8_t *codes = (const int8_t *)(src + nb * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        float d;
        memcpy(&d, src + b * sizeof(float), sizeof d);
        size_t i0 = b * QG_BLOCK, i1 = i0 + QG_BLOCK < n ? i0 + QG_BLOCK : n;
        for (size_t i = i0; i < i1; i++) acc[i] += d * (float)codes[i];
    }
}

cllm_status train_zpp_reduce_scatter(train_zpp *q, float *buf, const size_t *counts, size_t *bytes) {
    size_t off = 0, qoff = 0, k = counts[q->rank];
    for (int r = 0; r < q->size; r++) {
        q->qb[r] = qg_bytes(counts[r]);
        q->qb2[r] = qg_bytes(k);
        qoff += q->qb[r];
    }
    if (qoff > q->cap || q->qb2[0] * (size_t)q->size > q->rcap)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "quantized reduction of %zu / %zu bytes, buffers %zu / %zu", qoff,
                         q->qb2[0] * (size_t)q->size, q->cap, q->rcap);
    qoff = 0;
    for (int r = 0; r < q->size; r++) {
        if (counts[r]) qg_put(q->send + qoff, buf + off, counts[r]);
        off += counts[r];
        qoff += q->qb[r];
    }
    cllm_status st = cllm_dist_alltoall_bytes(q->send, q->qb, q->recv, q->qb2);
    if (st) return cllm_fail_context(st, "quantized gradient reduce-scatter");
    /* buf's first k values become this rank's sum (its parts were read above) */
    if (k) memset(buf, 0, k * sizeof(float));
    for (int r = 0; r < q->size && k; r++) qg_add(buf, q->recv + (size_t)r * q->qb2[r], k);
    *bytes += (size_t)(q->size - 1) * q->qb2[0];
    return CLLM_OK;
}
