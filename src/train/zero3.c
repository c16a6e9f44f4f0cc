/*
 * Per-layer gradient reduction (ZeRO stage 2) and partitioned parameters
 * (ZeRO stage 3), through the model's layer hooks (cllm_model_hooks).
 *
 * Both stages keep, per rank, only the slice [begin, end) of the summed
 * gradient (train_zero's slices of the flat buffer). The backward pass
 * writes each parameter group (embeddings, one block, final norm + head)
 * into a group-sized working gradient buffer; when the group is done
 * (grads_ready) the buffer is reduce-scattered in reduce_bucket_size chunks
 * and this rank's part is added into its slice. Micro-batches accumulate
 * into the slice (DeepSpeed's reduction per micro-batch), so no full-size
 * gradient exists.
 *
 * Stage 3 also partitions the parameters: the rank keeps its slice of the
 * flat fp32 parameters, and before a group is used the forward/backward
 * passes get it all-gathered (allgather_bucket_size chunks) into a working
 * buffer: one for group 0, one for the last group, two for blocks (so the
 * last block survives from forward to backward, and the next block can be
 * gathered while one computes). Gathered groups stay valid until the next
 * optimizer step. Tensors with fewer than
 * stage3_param_persistence_threshold elements (DeepSpeed's default 1e5) are
 * replicated instead: every rank keeps them whole in a compact buffer, adds
 * their gradients into a compact buffer that is all-reduced once per step,
 * and updates them with its own optimizer state (the same on every rank).
 *
 * The gradient norm is the sum of the slices' squares (every element of the
 * flat buffer, persistent ones included, is in exactly one slice; a tensor
 * rank > 0 leaves out the tensors replicated over the tensor group).
 *
 * With pipeline or tensor parallelism the slices, gathers and reductions
 * are those of the data group z->grp (the ranks holding the same layers),
 * blocking; a pipeline stage's part starts at z->base of the flat buffer
 * and holds the stage's groups only (the stage pass runs the hooks around
 * them), group and tensor offsets here being relative to it.
 *
 * With bf16/fp16 compute (train_shard_set_precision) each gathered group
 * also gets its low-precision copy, made from the gathered fp32 values the
 * first time the passes fetch it after the gather (fetch_params_lp) and kept
 * with it until the next optimizer step, so the matmuls read exactly the
 * operands of the unpartitioned run's whole-buffer copy. With
 * communication_data_type bf16/fp16 the reduce-scatters (and the replicated
 * tensors' all-reduce) sum in that type (blocking: MPI has no nonblocking
 * form of the user-defined 16-bit sum here).
 *
 * ZeRO++ (zeropp.c): with zero_quantized_weights the gathers, with
 * zero_quantized_gradients the reduce-scatters move int8 blocks (blocking);
 * the final gather of the model stays exact. The bytes each collective
 * delivers to this rank are counted per step (train_shard_take_bytes).
 *
 * With overlap_comm the per-group collectives are nonblocking: a group's
 * reduce-scatter is waited for only when its gradient buffer is needed
 * again (blocks alternate between two), and fetching a group at stage 3
 * starts gathering the next one into a free working buffer. Each
 * collective's time from start to completion, and the time the computation
 * waited for it, are measured (comm_hidden_fraction).
 *
 * Checkpoints of the partitioned state: train_shard_ckpt_fill / _load below,
 * written and read per rank by ckpt_shard.c.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED): glibc ignores posix_madvise's DONTNEED */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/checkpoint.h"
#include "cllm/dist.h"
#include "offload.h"
#include "train_impl.h"

#define N_PSLOTS 4                   /* group 0, last group, two blocks */
#define N_GSLOTS 4                   /* group 0, last group, two blocks (the second one with overlap_comm) */

/* The collectives of one group in flight: one request per bucket. */
typedef struct {
    cllm_dist_request **req;
    int n;
    bool pending;
    double start;
} inflight;

typedef struct {
    size_t flat, compact, numel; /* offset in the part of the flat buffer (foreign: in group 0), in the compact one */
    size_t abs;                  /* offset in the whole flat buffer */
    int group;
    bool decay;
    bool tied;    /* a pipeline's tied embedding: its gradient adds up over the first and the last stage */
    bool foreign; /* ... held by the last stage, outside its part (group 0 is the first stage's) */
} persistent;

struct train_shard {
    train_zero *z;
    cllm_model *m;
    int stage, n_groups;
    size_t *gb, *ge;        /* [n_groups] group ranges */
    size_t max_block;       /* floats of the largest block group */
    size_t len0;            /* floats of group 0's working buffers (the whole group 0 on a tied last stage) */
    int tied;               /* the pipeline's tied embedding in pers[], or -1 */
    float *gslice;          /* [slice] summed gradient of this rank's slice */
    float *gwork[N_GSLOTS]; /* working gradients: group 0, last group, blocks */
    int gwork_group[N_GSLOTS];
    inflight gfly[N_GSLOTS];  /* reduce-scatters in flight (overlap_comm) */
    bool overlap;             /* overlap_comm: nonblocking collectives */
    int max_chunks;           /* requests per group at most */
    /* stage 3 */
    float *pslice;          /* [slice] this rank's parameters (a file mapping with offload_param) */
    size_t pmap_bytes;      /* offload_param: bytes of the mapping (0: pslice is ordinary memory) */
    float *pwork[N_PSLOTS]; /* working parameters */
    void *plp[N_PSLOTS];    /* bf16/fp16: their low-precision copies (NULL for fp32) */
    bool lp_ok[N_PSLOTS];   /* plp[k] matches pwork[k] */
    cllm_precision prec;
    int slot_group[N_PSLOTS];
    inflight pfly[N_PSLOTS];  /* gathers in flight (prefetches) */
    bool slot_busy[N_PSLOTS];
    long slot_used[N_PSLOTS], clock;
    cllm_param_range *ranges; /* decayed/updated ranges of the slice, slice-relative, persistent tensors left out */
    int n_ranges;
    persistent *pers;
    int n_pers;
    size_t n_compact;
    float *pparams, *pgrads;  /* [n_compact] replicated persistent tensors and their gradient */
    cllm_param_range *pranges;
    cllm_optimizer *popt;
    size_t *counts;           /* [size] scratch */
    bool reduced;             /* this step's reductions are finished (finish_reduction) */
    train_zpp *zpp;           /* ZeRO++ quantized gathers / reductions (zeropp.c), or NULL */
    bool gather_exact;        /* the final gather of the model: never quantized */
    bool *sec_ok;             /* hpZ: [n_groups] the secondary copy holds the group since the last step */
    size_t bytes_params, bytes_grads; /* received since train_shard_take_bytes */
    double comm_seconds;      /* collectives from start to completion */
    double wait_seconds;      /* of which the computation waited */
};

static void drop_pages(train_shard *s, size_t b, size_t e);

/* ------------------------------------------------------------ helpers */

static size_t gsize(const train_shard *s, int g) { return s->ge[g] - s->gb[g]; }
/* floats of group g's working buffers */
static size_t wsize(const train_shard *s, int g) { return g == 0 ? s->len0 : gsize(s, g); }
static bool foreign0(const train_shard *s) { return s->tied >= 0 && s->pers[s->tied].foreign; }

/* counts[r] <- floats of rank r's slice inside [c0, c1) */
static void parts(train_shard *s, size_t c0, size_t c1) {
    const train_zero *z = s->z;
    size_t off = 0;
    for (int r = 0; r < z->size; r++) {
        size_t b = off > c0 ? off : c0, e = off + z->counts[r] < c1 ? off + z->counts[r] : c1;
        s->counts[r] = e > b ? e - b : 0;
        off += z->counts[r];
    }
}

/* Starts gathering flat range [b, e) into buf[e - b]: this rank's slice
 * part is copied in, every other part comes from its owner, one call per
 * allgather_bucket_size chunk. Blocking (and finished on return) without
 * overlap_comm. */
static cllm_status gather_start(train_shard *s, inflight *f, float *buf, size_t b, size_t e) {
    const train_zero *z = s->z;
    size_t ob = z->begin > b ? z->begin : b, oe = z->end < e ? z->end : e;
    if (ob < oe) {
        memcpy(buf + (ob - b), s->pslice + (ob - z->begin), (oe - ob) * sizeof(float));
        drop_pages(s, ob - z->begin, oe - z->begin);
    }
    double t0 = cllm_time_sec();
    f->n = 0;
    f->start = t0;
    for (size_t c0 = b; c0 < e; c0 += z->gather_bucket) {
        size_t c1 = e - c0 > z->gather_bucket ? c0 + z->gather_bucket : e;
        parts(s, c0, c1);
        cllm_status st;
        if (train_zpp_weights(s->zpp) && !s->gather_exact) {
            st = train_zpp_gather(s->zpp, buf + (c0 - b), s->counts, &s->bytes_params);
        } else {
            st = s->overlap && f->req ? cllm_dist_iallgather_f32(buf + (c0 - b), s->counts, &f->req[f->n++])
                 : z->grp             ? cllm_dist_g_allgather_f32(z->grp, buf + (c0 - b), s->counts)
                                      : cllm_dist_allgather_f32(buf + (c0 - b), s->counts); /* (watched) */
            s->bytes_params += (c1 - c0 - s->counts[z->rank]) * sizeof(float);
        }
        if (st) return cllm_fail_context(st, "parameter all-gather at %zu", c0);
    }
    f->pending = f->n > 0;
    if (!f->pending) {
        double dt = cllm_time_sec() - t0;
        s->comm_seconds += dt;
        s->wait_seconds += dt;
    }
    return CLLM_OK;
}

/* Waits for a gather started by gather_start (if it is in flight) and
 * copies the replicated tensors in: the whole copy, not the stale slice
 * values. */
static cllm_status gather_finish(train_shard *s, inflight *f, float *buf, size_t b, size_t e) {
    if (f->pending) {
        double t0 = cllm_time_sec(), last = f->start;
        cllm_status st = CLLM_OK;
        for (int i = 0; i < f->n; i++) {
            double done = 0;
            cllm_status sti = cllm_dist_wait(f->req[i], &done);
            if (!st) st = sti;
            if (done > last) last = done;
        }
        f->pending = false;
        f->n = 0;
        double t1 = cllm_time_sec();
        s->wait_seconds += t1 - t0;
        s->comm_seconds += last - f->start; /* completion as seen by the progress thread */
        if (st) return cllm_fail_context(st, "parameter all-gather");
    }
    for (int i = 0; i < s->n_pers; i++) {
        const persistent *p = &s->pers[i];
        if (!p->foreign && p->flat >= b && p->flat + p->numel <= e)
            memcpy(buf + (p->flat - b), s->pparams + p->compact, p->numel * sizeof(float));
    }
    return CLLM_OK;
}

static cllm_status gather_range(train_shard *s, float *buf, size_t b, size_t e) {
    inflight f = {NULL, 0, false, 0};
    cllm_status st = gather_start(s, &f, buf, b, e);
    return st ? st : gather_finish(s, &f, buf, b, e);
}

/* -------------------------------------------------------------- hooks */

static int pslot_of(const train_shard *s, int g) {
    if (g == 0) return 0;
    if (g == s->n_groups - 1) return 1;
    return -1; /* a block: slot 2 or 3 */
}

/* The parameter slot that holds or will hold group g (current: the slot
 * the passes are using, not to be taken). */
static int pslot_pick(const train_shard *s, int g, int current) {
    int k = pslot_of(s, g);
    if (k >= 0) return k;
    if (s->slot_group[2] == g) return 2;
    if (s->slot_group[3] == g) return 3;
    bool free2 = !s->slot_busy[2] && current != 2, free3 = !s->slot_busy[3] && current != 3;
    if (free2 && free3) return s->slot_used[2] <= s->slot_used[3] ? 2 : 3; /* least recently used */
    return free2 ? 2 : free3 ? 3 : -1;
}

/* Slot k is to hold group g: finishes a gather in flight there, and starts
 * gathering g unless the slot holds it already. */
static cllm_status pslot_load(train_shard *s, int k, int g) {
    if (s->slot_group[k] == g) return CLLM_OK;
    int old = s->slot_group[k];
    if (s->pfly[k].pending) {
        cllm_status st = gather_finish(s, &s->pfly[k], s->pwork[k], s->gb[old], s->ge[old]);
        if (st) return st;
    }
    s->slot_group[k] = -1;
    s->lp_ok[k] = false;
    cllm_status st;
    if (train_zpp_hpz(s->zpp) && s->sec_ok[g]) { /* within the hpZ group, from the secondary copies */
        double t0 = cllm_time_sec();
        st = train_zpp_hpz_gather(s->zpp, s->pwork[k], s->gb[g], s->ge[g], s->z->gather_bucket, &s->bytes_params);
        s->comm_seconds += cllm_time_sec() - t0;
        s->wait_seconds += cllm_time_sec() - t0;
    } else {
        st = gather_start(s, &s->pfly[k], s->pwork[k], s->gb[g], s->ge[g]);
    }
    if (st) return st;
    s->slot_group[k] = g;
    return CLLM_OK;
}

/* A tied last stage's group 0: its embedding, from the whole copy this
 * stage keeps (nothing is gathered: the rest of the group is not read). */
static cllm_status fetch_foreign(train_shard *s, float **out) {
    const persistent *p = &s->pers[s->tied];
    if (s->slot_busy[0]) return CLLM_FAIL(CLLM_ERR_INTERNAL, "the tied embedding fetched while it is in use");
    if (s->slot_group[0] != 0) { /* once per optimizer step */
        memcpy(s->pwork[0] + p->flat, s->pparams + p->compact, p->numel * sizeof(float));
        s->slot_group[0] = 0;
        s->lp_ok[0] = false;
    }
    s->slot_busy[0] = true;
    s->slot_used[0] = ++s->clock;
    *out = s->pwork[0];
    return CLLM_OK;
}

static cllm_status hook_fetch_params(void *ctx, int g, int next, float **out) {
    train_shard *s = ctx;
    if (g == 0 && foreign0(s)) return fetch_foreign(s, out);
    int k = pslot_pick(s, g, -1);
    if (k < 0 || s->slot_busy[k])
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "parameter group %d fetched while its working buffer is in use", g);
    cllm_status st = pslot_load(s, k, g);
    if (!st) st = gather_finish(s, &s->pfly[k], s->pwork[k], s->gb[g], s->ge[g]);
    if (st) return st;
    if (train_zpp_hpz(s->zpp) && !s->sec_ok[g]) { /* the first gather since the step: keep the secondary part */
        train_zpp_hpz_keep(s->zpp, s->pwork[k], s->gb[g], s->ge[g]);
        s->sec_ok[g] = true;
    }
    s->slot_busy[k] = true;
    s->slot_used[k] = ++s->clock;
    *out = s->pwork[k];
    /* overlap_comm: prefetch the next group while this one computes */
    if (s->overlap && next >= 0 && next != g) {
        int j = pslot_pick(s, next, k);
        if (j >= 0 && !s->slot_busy[j] && (st = pslot_load(s, j, next))) return st;
    }
    return CLLM_OK;
}

/* The low-precision copy of a fetched group, made once per gather. */
static cllm_status hook_fetch_params_lp(void *ctx, int g, const void **lp) {
    train_shard *s = ctx;
    for (int k = 0; k < N_PSLOTS; k++) {
        if (s->slot_group[k] != g || !s->slot_busy[k] || !s->plp[k]) continue;
        if (!s->lp_ok[k]) cllm_model_lp_copy(s->prec, s->plp[k], s->pwork[k], wsize(s, g));
        s->lp_ok[k] = true;
        *lp = s->plp[k];
        return CLLM_OK;
    }
    return CLLM_FAIL(CLLM_ERR_INTERNAL, "low-precision copy of parameter group %d asked for while it is not fetched "
                     "(or without train_shard_set_precision)", g);
}

static cllm_status hook_release_params(void *ctx, int g) {
    train_shard *s = ctx;
    for (int k = 0; k < N_PSLOTS; k++)
        if (s->slot_group[k] == g) s->slot_busy[k] = false;
    return CLLM_OK;
}

/* The group's gradient of this micro-batch is in gwork[i]: replicated
 * tensors go into the compact buffer, then the reduce-scatter starts (one
 * call per reduce_bucket_size chunk; blocking and finished on return
 * without overlap_comm). */
static cllm_status reduce_start(train_shard *s, int i, int g) {
    const train_zero *z = s->z;
    float *w = s->gwork[i];
    inflight *f = &s->gfly[i];
    size_t b = s->gb[g], e = s->ge[g];
    for (int t = 0; t < s->n_pers; t++) {
        const persistent *p = &s->pers[t];
        if (p->group != g) continue;
        float *d = s->pgrads + p->compact;
        float *x = w + (p->foreign ? p->flat : p->flat - b);
        for (size_t j = 0; j < p->numel; j++) d[j] += x[j];
        /* the tied embedding's norm is counted from its whole summed
         * gradient (train_shard_clip), not from the slices */
        if (p->tied) memset(x, 0, p->numel * sizeof(float));
    }
    double t0 = cllm_time_sec();
    f->n = 0;
    f->start = t0;
    s->gwork_group[i] = g;
    cllm_status pst = train_zero_presum(z, w, b, e); /* sliced experts: the non-expert tensors first */
    if (pst) return pst;
    for (size_t c0 = b; c0 < e; c0 += z->bucket) {
        size_t c1 = e - c0 > z->bucket ? c0 + z->bucket : e;
        parts(s, c0, c1);
        float *buf = w + (c0 - b);
        cllm_status st;
        if (train_zpp_grads(s->zpp)) {
            st = train_zpp_reduce_scatter(s->zpp, buf, s->counts, &s->bytes_grads);
        } else {
            st = s->overlap && f->req && z->comm == CLLM_F32
                     ? cllm_dist_ireduce_scatter_sum_f32(buf, s->counts, &f->req[f->n++])
                     : z->grp ? cllm_dist_g_reduce_scatter_sum_f32(z->grp, buf, buf, s->counts)
                              : cllm_dist_reduce_scatter_sum_f32_as(buf, buf, s->counts, z->comm);
            s->bytes_grads += (size_t)(z->size - 1) * s->counts[z->rank] * (z->comm == CLLM_F32 ? 4 : 2);
        }
        if (st) return cllm_fail_context(st, "gradient reduce-scatter of group %d at %zu", g, c0);
    }
    f->pending = true;
    if (!f->n) {
        double dt = cllm_time_sec() - t0;
        s->comm_seconds += dt;
        s->wait_seconds += dt;
    }
    return CLLM_OK;
}

/* Waits for gwork[i]'s reduce-scatter and adds this rank's parts into its
 * slice. */
static cllm_status reduce_finish(train_shard *s, int i) {
    const train_zero *z = s->z;
    inflight *f = &s->gfly[i];
    if (!f->pending) return CLLM_OK;
    if (f->n) {
        double t0 = cllm_time_sec(), last = f->start;
        cllm_status st = CLLM_OK;
        for (int r = 0; r < f->n; r++) {
            double done = 0;
            cllm_status str = cllm_dist_wait(f->req[r], &done);
            if (!st) st = str;
            if (done > last) last = done;
        }
        f->n = 0;
        s->wait_seconds += cllm_time_sec() - t0;
        s->comm_seconds += last - f->start; /* completion as seen by the progress thread */
        if (st) {
            f->pending = false;
            return cllm_fail_context(st, "gradient reduce-scatter");
        }
    }
    f->pending = false;
    int g = s->gwork_group[i];
    size_t b = s->gb[g], e = s->ge[g];
    for (size_t c0 = b; c0 < e; c0 += z->bucket) {
        size_t c1 = e - c0 > z->bucket ? c0 + z->bucket : e;
        parts(s, c0, c1);
        size_t k = s->counts[z->rank];
        if (!k) continue;
        const float *buf = s->gwork[i] + (c0 - b);
        float *d = s->gslice + ((z->begin > c0 ? z->begin : c0) - z->begin);
        for (size_t j = 0; j < k; j++) d[j] += buf[j];
    }
    return CLLM_OK;
}

/* Blocks alternate between two buffers with overlap_comm, so that block
 * l's reduction runs while block l - 1's backward writes the other. */
static int gslot_of(const train_shard *s, int g) {
    if (g == 0) return 0;
    if (g == s->n_groups - 1) return 1;
    return s->overlap ? 2 + (g & 1) : 2;
}

static cllm_status hook_fetch_grads(void *ctx, int g, float **out) {
    train_shard *s = ctx;
    int i = gslot_of(s, g);
    cllm_status st = reduce_finish(s, i);
    if (st) return st;
    memset(s->gwork[i], 0, wsize(s, g) * sizeof(float));
    *out = s->gwork[i];
    return CLLM_OK;
}

static cllm_status hook_grads_ready(void *ctx, int g) {
    train_shard *s = ctx;
    int i = gslot_of(s, g);
    cllm_status st = reduce_start(s, i, g);
    return st ? st : s->overlap ? CLLM_OK : reduce_finish(s, i);
}

/* Everything in flight, finished (before the optimizer step reads the
 * slices, and before buffers go away). */
static cllm_status finish_all(train_shard *s) {
    cllm_status st = CLLM_OK;
    for (int i = 0; i < N_GSLOTS; i++) {
        cllm_status sti = reduce_finish(s, i);
        if (!st) st = sti;
    }
    for (int k = 0; k < N_PSLOTS; k++) {
        int g = s->slot_group[k];
        if (!s->pfly[k].pending) continue;
        cllm_status stk = gather_finish(s, &s->pfly[k], s->pwork[k], s->gb[g], s->ge[g]);
        if (!st) st = stk;
    }
    return st;
}

/* -------------------------------------------------- parameter offload */

/* zero_optimization.offload_param {"device": "nvme", "nvme_path": DIR}: the
 * parameter slice lives in a file under DIR, mapped into memory. The file is
 * unlinked as soon as it is mapped (it disappears with the process, however
 * that ends). Pages come in when a group's part is copied into a gather or
 * updated, and are dropped from the process right after (madvise
 * MADV_DONTNEED on a shared mapping keeps their contents in the file), so
 * the resident share of the slice stays small and the kernel can write it
 * back and evict it under memory pressure. The config parser has checked
 * that nvme_path is given with device "nvme". */
static cllm_status map_slice(train_shard *s, const char *dir, size_t n) {
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/cllm-params-%ld-rank%d.bin", dir, (long)getpid(), cllm_dist_rank());
    if (len < 0 || len >= (int)sizeof path) return CLLM_FAIL(CLLM_ERR_ARG, "offload_param.nvme_path too long: %s", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return CLLM_FAIL(CLLM_ERR_IO, "zero_optimization.offload_param.nvme_path: cannot create %s: %s", path,
                         strerror(errno));
    unlink(path);
    size_t bytes = n * sizeof(float);
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0) p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return CLLM_FAIL(CLLM_ERR_IO, "zero_optimization.offload_param: cannot map %zu bytes in %s: %s", bytes, dir,
                         strerror(e));
    s->pslice = p;
    s->pmap_bytes = bytes;
    return CLLM_OK;
}

/* Drops the mapped pages of pslice[b, e) from the process (whole pages). */
static void drop_pages(train_shard *s, size_t b, size_t e) {
    if (!s->pmap_bytes || b >= e) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)(s->pslice + b) + page - 1) / page * page, hi = (uintptr_t)(s->pslice + e) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* --------------------------------------------------------------- init */

static void *alloc_floats(size_t n, const char *what) { return cllm_calloc(n ? n : 1, sizeof(float), what); }

/* Whether the tensor at part offset `at` decays: the range holding it. */
static bool decay_at(const cllm_param_range *ranges, int n, size_t at) {
    for (int i = 0; i < n; i++)
        if (at >= ranges[i].begin && at < ranges[i].end) return ranges[i].decay;
    return false;
}

static cllm_status init_stage3(train_shard *s, const cllm_train_config *c, const cllm_param_range *ranges,
                               int n_ranges) {
    train_zero *z = s->z;
    cllm_model *m = s->m;
    const double thr = c->zero.stage3_param_persistence_threshold;
    cllm_status st = CLLM_OK;
    int nt = cllm_model_n_tensors(m);
    s->pers = calloc((size_t)nt, sizeof *s->pers);
    s->pranges = calloc((size_t)nt, sizeof *s->pranges);
    s->ranges = calloc((size_t)nt, sizeof *s->ranges);
    if (!s->pers || !s->pranges || !s->ranges) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    size_t g0b, g0e; /* group 0 in the whole flat buffer */
    cllm_model_group_range(m, 0, &g0b, &g0e);
    for (int i = 0; i < nt; i++) {
        const cllm_tensor_info *t = cllm_model_tensor(m, i);
        /* a pipeline's tied embedding stays whole on the first and the last stage */
        const bool tied = z->tied_grp && t->offset == z->tied_at && t->numel == z->tied_len;
        const bool foreign = t->offset < z->base || t->offset >= z->base + z->n;
        if (foreign && !tied) continue; /* another pipeline stage's */
        const size_t at = foreign ? 0 : t->offset - z->base;
        if (tied || (double)t->numel < thr) {
            persistent *p = &s->pers[s->n_pers++];
            p->flat = foreign ? t->offset - g0b : at;
            p->abs = t->offset;
            p->numel = t->numel;
            p->compact = s->n_compact;
            p->decay = tied ? z->tied_decay : decay_at(ranges, n_ranges, at);
            p->tied = tied;
            p->foreign = foreign;
            if (tied) s->tied = s->n_pers - 1;
            if (foreign) s->len0 = g0e - g0b;
            p->group = 0;
            for (int g = 0; g < s->n_groups && !foreign; g++)
                if (at >= s->gb[g] && at < s->ge[g]) p->group = g;
            s->pranges[s->n_pers - 1] = (cllm_param_range){p->compact, p->compact + p->numel, p->decay};
            s->n_compact += (t->numel + 15) & ~(size_t)15;
        } else {
            size_t b = at > z->begin ? at : z->begin;
            size_t e = at + t->numel < z->end ? at + t->numel : z->end;
            if (b < e)
                s->ranges[s->n_ranges++] = (cllm_param_range){b - z->begin, e - z->begin, decay_at(ranges, n_ranges, at)};
        }
    }
    size_t slice = z->end - z->begin;
    const float *full = cllm_model_params(m);
    const cllm_offload_config *op = &c->zero.offload_param;
    const char *pdir = op->device == CLLM_OFFLOAD_NVME ? op->nvme_path : NULL;
    if (pdir && slice) {
        if ((st = map_slice(s, pdir, slice))) return st;
    } else {
        s->pslice = alloc_floats(slice, "parameter slice");
    }
    s->pparams = alloc_floats(s->n_compact, "replicated parameters");
    s->pgrads = alloc_floats(s->n_compact, "replicated gradients");
    if (!s->pslice || !s->pparams || !s->pgrads) return CLLM_ERR_NOMEM;
    if (slice) memcpy(s->pslice, full + z->base + z->begin, slice * sizeof(float));
    drop_pages(s, 0, slice);
    for (int i = 0; i < s->n_pers; i++)
        memcpy(s->pparams + s->pers[i].compact, full + s->pers[i].abs, s->pers[i].numel * sizeof(float));
    /* from here on the rank holds only its slice (freed before the working
     * buffers are allocated, so that the start-up peak stays lower) */
    cllm_model_drop_params(m);
    size_t len[N_PSLOTS] = {wsize(s, 0), gsize(s, s->n_groups - 1), s->max_block, s->max_block};
    for (int k = 0; k < N_PSLOTS; k++) {
        if (!(s->pwork[k] = alloc_floats(len[k], "gathered parameters"))) return CLLM_ERR_NOMEM;
        s->slot_group[k] = -1;
    }
    if (s->n_pers && (st = cllm_optim_init(&s->popt, &c->optim, s->n_compact))) return st;
    return CLLM_OK;
}

static size_t work_floats(const train_shard *s) {
    size_t g = wsize(s, 0) + gsize(s, s->n_groups - 1);
    size_t blocks = s->overlap ? 2 : 1;
    return s->stage == 3 ? 2 * g + (blocks + 2) * s->max_block : g + blocks * s->max_block;
}

cllm_status train_shard_init(train_shard **out, train_zero *z, cllm_model *m, const cllm_train_config *c,
                             const cllm_param_range *ranges, int n_ranges) {
    *out = NULL;
    train_shard *s = calloc(1, sizeof *s);
    if (!s) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    *out = s;
    s->z = z;
    s->m = m;
    s->stage = z->stage;
    s->n_groups = cllm_model_n_groups(m);
    s->gb = calloc(2 * (size_t)s->n_groups, sizeof *s->gb);
    s->counts = calloc((size_t)z->size, sizeof *s->counts);
    if (!s->gb || !s->counts) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    s->ge = s->gb + s->n_groups;
    for (int g = 0; g < s->n_groups; g++) { /* relative to the part; empty outside it (other pipeline stages') */
        size_t b, e;
        cllm_model_group_range(m, g, &b, &e);
        bool in = b >= z->base && e <= z->base + z->n;
        s->gb[g] = in ? b - z->base : 0;
        s->ge[g] = in ? e - z->base : 0;
        if (g > 0 && g + 1 < s->n_groups && gsize(s, g) > s->max_block) s->max_block = gsize(s, g);
    }
    s->len0 = gsize(s, 0);
    s->tied = -1;
    size_t slice = z->end - z->begin;
    /* a data group (pipeline, tensor parallelism) has blocking collectives only */
    s->overlap = c->zero.overlap_comm && z->size > 1 && !z->grp;
    if (c->zero.overlap_comm && z->size > 1 && z->grp && c->log != CLLM_LOG_MODE_QUIET && cllm_dist_rank() == 0)
        fprintf(stderr, "cllm train: overlap_comm: no effect inside a pipeline stage's or tensor rank's data group "
                "(its per-layer collectives are blocking)\n");
    size_t chunk = z->bucket < z->gather_bucket ? z->bucket : z->gather_bucket, longest = s->max_block;
    if (gsize(s, 0) > longest) longest = gsize(s, 0);
    if (gsize(s, s->n_groups - 1) > longest) longest = gsize(s, s->n_groups - 1);
    s->max_chunks = (int)((longest + chunk - 1) / chunk) + 1;
    if (s->overlap) {
        for (int i = 0; i < N_GSLOTS; i++)
            if (!(s->gfly[i].req = calloc((size_t)s->max_chunks, sizeof *s->gfly[i].req)))
                return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        for (int k = 0; k < N_PSLOTS; k++)
            if (!(s->pfly[k].req = calloc((size_t)s->max_chunks, sizeof *s->pfly[k].req)))
                return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
        cllm_dist_progress_start(); /* without it, the collectives advance only inside MPI calls */
    }
    cllm_status st = s->stage == 3 ? init_stage3(s, c, ranges, n_ranges) : CLLM_OK;
    if (st) return st;
    bool qw = false, qg = false;
    size_t widest = z->bucket > z->gather_bucket ? z->bucket : z->gather_bucket; /* values per call at most */
    if (train_zpp_active(c, z, &qw, &qg) && (st = train_zpp_init(&s->zpp, z, c, longest < widest ? longest : widest)))
        return st;
    if (!(s->sec_ok = calloc((size_t)s->n_groups, sizeof *s->sec_ok))) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    size_t glen[N_GSLOTS] = {wsize(s, 0), gsize(s, s->n_groups - 1), s->max_block, s->overlap ? s->max_block : 0};
    s->gslice = alloc_floats(slice, "gradient slice");
    if (!s->gslice) return CLLM_ERR_NOMEM;
    for (int k = 0; k < N_GSLOTS; k++)
        if (!(s->gwork[k] = alloc_floats(glen[k], "working gradients"))) return CLLM_ERR_NOMEM;
    z->mem.work = work_floats(s) * sizeof(float);
    z->mem.grads = z->mem.grads_reduced = (slice + s->n_compact) * sizeof(float);
    if (s->stage == 3) z->mem.params = (slice + s->n_compact) * sizeof(float) + train_zpp_hpz_bytes(s->zpp);
    cllm_model_hooks h = {.ctx = s, .fetch_grads = hook_fetch_grads, .grads_ready = hook_grads_ready};
    if (s->stage == 3) {
        h.fetch_params = hook_fetch_params;
        h.release_params = hook_release_params;
        h.fetch_params_lp = hook_fetch_params_lp;
    }
    cllm_model_set_hooks(m, &h);
    return CLLM_OK;
}

void train_shard_free(train_shard *s) {
    if (!s) return;
    cllm_model_set_hooks(s->m, NULL);
    cllm_dist_progress_stop();
    /* Collectives still in flight mean a failed step: another rank may
     * never join them, so they are not waited for (the front end ends the
     * world with MPI_Abort), and their buffers are left to MPI rather than
     * freed under it. After a complete step nothing is in flight. */
    bool abandoned = false;
    for (int k = 0; k < N_GSLOTS; k++) abandoned |= s->gfly[k].pending && s->gfly[k].n > 0;
    for (int k = 0; k < N_PSLOTS; k++) abandoned |= s->pfly[k].pending;
    if (!abandoned) {
        for (int k = 0; k < N_GSLOTS; k++) cllm_free(s->gwork[k]);
        for (int k = 0; k < N_PSLOTS; k++) cllm_free(s->pwork[k]);
    }
    for (int k = 0; k < N_PSLOTS; k++) cllm_free(s->plp[k]);
    for (int k = 0; k < N_GSLOTS; k++) free(s->gfly[k].req);
    for (int k = 0; k < N_PSLOTS; k++) free(s->pfly[k].req);
    cllm_free(s->gslice);
    train_zpp_free(s->zpp);
    free(s->sec_ok);
    if (s->pmap_bytes)
        munmap(s->pslice, s->pmap_bytes);
    else
        cllm_free(s->pslice);
    cllm_free(s->pparams);
    cllm_free(s->pgrads);
    cllm_optim_free(s->popt);
    free(s->pers);
    free(s->pranges);
    free(s->ranges);
    free(s->gb);
    free(s->counts);
    free(s);
}

cllm_status train_shard_set_precision(train_shard *s, cllm_precision p) {
    size_t es = cllm_precision_copy_bytes(p);
    if (s->stage < 3 || !es || s->plp[0]) return CLLM_OK;
    s->prec = p;
    size_t len[N_PSLOTS] = {wsize(s, 0), gsize(s, s->n_groups - 1), s->max_block, s->max_block}, total = 0;
    for (int k = 0; k < N_PSLOTS; k++) {
        if (!(s->plp[k] = cllm_alloc((len[k] ? len[k] : 1) * es, "low-precision gathered parameters")))
            return CLLM_ERR_NOMEM;
        total += len[k] * es;
    }
    s->z->mem.work += total;
    return CLLM_OK;
}

void train_shard_count_optim(train_shard *s, cllm_optimizer *opt) {
    size_t k = (cllm_optim_state(opt, 0) != NULL) + (cllm_optim_state(opt, 1) != NULL);
    s->z->mem.optim = k * (s->z->end - s->z->begin + s->n_compact) * sizeof(float);
}

/* --------------------------------------------------------------- step */

void train_shard_zero_grads(train_shard *s) {
    size_t slice = s->z->end - s->z->begin;
    if (slice) memset(s->gslice, 0, slice * sizeof(float));
    if (s->n_compact) memset(s->pgrads, 0, s->n_compact * sizeof(float));
    s->reduced = false;
    s->bytes_params = s->bytes_grads = 0; /* a step's bytes: not those of an evaluation before it */
}

float *train_shard_grads(train_shard *s) { return s->z->end > s->z->begin ? s->gslice : NULL; }

/* Completes the step's reductions once: collectives in flight and the
 * replicated tensors' all-reduce. */
static cllm_status finish_reduction(train_shard *s) {
    if (s->reduced) return CLLM_OK;
    cllm_status st = finish_all(s);
    if (st) return st;
    double t0 = cllm_time_sec();
    if (s->tied >= 0) { /* the tied embedding: the first and the last stage's gradients, before the data group's sum */
        const persistent *p = &s->pers[s->tied];
        if ((st = cllm_dist_g_allreduce_sum_f32(s->z->tied_grp, s->pgrads + p->compact, p->numel)))
            return cllm_fail_context(st, "tied embedding gradients");
        s->bytes_grads += p->numel * sizeof(float);
    }
    st = !s->n_compact ? CLLM_OK
         : s->z->grp   ? cllm_dist_g_allreduce_sum_f32(s->z->grp, s->pgrads, s->n_compact)
                       : cllm_dist_allreduce_sum_f32_as(s->pgrads, s->n_compact, s->z->comm);
    s->bytes_grads += 2 * (size_t)(s->z->size - 1) * s->n_compact * (s->z->comm == CLLM_F32 ? 4 : 2) / (size_t)s->z->size;
    s->comm_seconds += cllm_time_sec() - t0;
    s->wait_seconds += cllm_time_sec() - t0;
    if (st) return cllm_fail_context(st, "replicated gradients");
    s->reduced = true;
    return CLLM_OK;
}

cllm_status train_shard_unscale(train_shard *s, double scale, bool *overflow) {
    cllm_status st = finish_reduction(s);
    if (st) return st;
    const size_t k = s->z->end - s->z->begin;
    float *g = s->gslice;
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (size_t i = 0; i < k; i++) bad |= !isfinite(g[i]);
    for (size_t i = 0; i < s->n_compact; i++) bad |= !isfinite(s->pgrads[i]);
    bool flag = bad != 0;
    if ((st = train_zero_agree(s->z, &flag))) return cllm_fail_context(st, "gradient overflow check");
    *overflow = flag;
    if (flag) return CLLM_OK;
    const float inv = (float)(1.0 / scale);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < k; i++) g[i] *= inv;
    for (size_t i = 0; i < s->n_compact; i++) s->pgrads[i] *= inv;
    return CLLM_OK;
}

cllm_status train_shard_clip(train_shard *s, double max_norm, double *norm) {
    const size_t k = s->z->end - s->z->begin;
    cllm_status st = finish_reduction(s);
    if (st) return st;
    float *g = s->gslice;
    double sum = train_zero_norm_sq(s->z, g);
    if (s->tied >= 0 && !s->pers[s->tied].foreign && s->z->rank == 0) { /* once: the first stage's data rank 0 */
        const persistent *p = &s->pers[s->tied];
        double t = 0;
        for (size_t i = 0; i < p->numel; i++) t += (double)s->pgrads[p->compact + i] * s->pgrads[p->compact + i];
        sum += t;
    }
    if ((st = cllm_dist_allreduce_sum_f64(&sum, 1))) return cllm_fail_context(st, "gradient norm");
    *norm = sqrt(sum);
    if (max_norm > 0) {
        double coef = max_norm / (*norm + 1e-6);
        if (coef < 1.0) {
            const float cf = (float)coef;
#pragma omp parallel for simd schedule(static)
            for (size_t i = 0; i < k; i++) g[i] *= cf;
            for (size_t i = 0; i < s->n_compact; i++) s->pgrads[i] *= cf;
        }
    }
    return CLLM_OK;
}

/* The slice's optimizer update, through the offload stream when the state
 * lives in a file. */
static cllm_status update(train_zero *z, cllm_optimizer *opt, float *p, const float *g, const cllm_param_range *r,
                          int n, double lr) {
    if (z->offload) return train_offload_step(z->offload, opt, p, g, r, n, lr);
    cllm_optim_step(opt, p, g, r, n, lr);
    return CLLM_OK;
}

cllm_status train_shard_step(train_shard *s, cllm_optimizer *opt, double lr) {
    train_zero *z = s->z;
    if (s->stage < 3) {
        float *params = cllm_model_params(s->m) + z->base;
        cllm_status so = update(z, opt, params + z->begin, s->gslice, z->ranges, z->n_ranges, lr);
        if (so) return so;
        double t0 = cllm_time_sec();
        cllm_status st = train_zero_gather_params(z, params);
        s->bytes_params += (z->n - (z->end - z->begin)) * sizeof(float) * (z->size > 1);
        s->comm_seconds += cllm_time_sec() - t0;
        s->wait_seconds += cllm_time_sec() - t0;
        return st;
    }
    cllm_status st = finish_all(s);
    if (st) return st;
    if ((st = update(z, opt, s->pslice, s->gslice, s->ranges, s->n_ranges, lr))) return st;
    drop_pages(s, 0, z->end - z->begin);
    if (s->popt) cllm_optim_step(s->popt, s->pparams, s->pgrads, s->pranges, s->n_pers, lr);
    for (int k = 0; k < N_PSLOTS; k++) s->slot_group[k] = -1; /* gathered copies are stale now */
    memset(s->sec_ok, 0, (size_t)s->n_groups * sizeof *s->sec_ok); /* and the hpZ secondary copy */
    return CLLM_OK;
}

double train_shard_comm_seconds(const train_shard *s) { return s->comm_seconds; }

cllm_status train_shard_tied_check(train_shard *s, bool *differ) {
    *differ = false;
    if (s->tied < 0) return CLLM_OK;
    const persistent *p = &s->pers[s->tied];
    uint64_t h[2] = {1469598103934665603ULL, 0}; /* FNV-1a of the bytes: [0] this copy's, [1] the first stage's */
    const unsigned char *b = (const unsigned char *)(s->pparams + p->compact);
    for (size_t i = 0; i < p->numel * sizeof(float); i++) h[0] = (h[0] ^ b[i]) * 1099511628211ULL;
    h[1] = h[0];
    cllm_status st = cllm_dist_g_bcast(s->z->tied_grp, &h[1], sizeof h[1], 0);
    *differ = h[0] != h[1];
    return st;
}

void train_shard_take_bytes(train_shard *s, uint64_t *params, uint64_t *grads) {
    *params = s->bytes_params;
    *grads = s->bytes_grads;
    s->bytes_params = s->bytes_grads = 0;
}
double train_shard_wait_seconds(const train_shard *s) { return s->wait_seconds; }

float *train_shard_param_slice(train_shard *s) { return s->stage == 3 ? s->pslice : NULL; }

float *train_shard_replicated(train_shard *s, size_t *n, cllm_optimizer **opt) {
    *n = s->n_compact;
    if (opt) *opt = s->popt;
    return s->n_compact ? s->pparams : NULL;
}

cllm_status train_shard_gather_model(train_shard *s) {
    if (s->stage < 3 || cllm_model_params(s->m)) return CLLM_OK;
    /* training is over: the working buffers go first, to lower the peak */
    cllm_status st = finish_all(s);
    if (st) return st;
    cllm_model_set_hooks(s->m, NULL);
    for (int k = 0; k < N_PSLOTS; k++) {
        cllm_free(s->pwork[k]);
        cllm_free(s->plp[k]);
        s->pwork[k] = NULL;
        s->plp[k] = NULL;
        s->slot_group[k] = -1;
    }
    for (int k = 0; k < N_GSLOTS; k++) {
        cllm_free(s->gwork[k]);
        s->gwork[k] = NULL;
    }
    /* a pipeline stage gathers its range of the whole buffer (the stages
     * then gather theirs to the first: pipe_train.c) */
    size_t n = s->z->n, total = cllm_model_buffer_len(s->m);
    float *full = cllm_calloc(total, sizeof(float), "gathered model");
    if (!full) return CLLM_ERR_NOMEM;
    s->gather_exact = true; /* the trained weights as they are, not quantized */
    st = gather_range(s, full + s->z->base, 0, n);
    if (st) {
        cllm_free(full);
        return st;
    }
    cllm_model_set_params(s->m, full);
    return CLLM_OK;
}

cllm_status train_shard_lend_params(train_shard *s, bool on) {
    if (s->stage < 3) return CLLM_OK;
    if (!on) {
        cllm_model_set_params(s->m, NULL);
        return CLLM_OK;
    }
    if (cllm_model_params(s->m)) return CLLM_OK;
    cllm_status st = finish_all(s);
    float *full = st ? NULL : cllm_alloc(s->z->n * sizeof(float), "parameters lent for generation");
    if (!st && !full) return CLLM_ERR_NOMEM;
    const bool exact = s->gather_exact;
    s->gather_exact = true;
    if (!st) st = gather_range(s, full, 0, s->z->n);
    s->gather_exact = exact;
    if (st) cllm_free(full);
    else cllm_model_set_params(s->m, full);
    return st;
}

/* ---------------------------------------------------------- checkpoints */

void train_shard_ckpt_fill(train_shard *s, float *state0, float *state1) {
    if (s->stage != 3) return;
    const size_t b = s->z->begin, e = s->z->end;
    float *ps0 = s->popt ? cllm_optim_state(s->popt, 0) : NULL, *ps1 = s->popt ? cllm_optim_state(s->popt, 1) : NULL;
    for (int i = 0; i < s->n_pers; i++) {
        const persistent *p = &s->pers[i];
        if (p->foreign) continue; /* the first stage's copy is the one written */
        size_t lo = p->flat > b ? p->flat : b, hi = p->flat + p->numel < e ? p->flat + p->numel : e;
        if (lo >= hi) continue;
        size_t from = p->compact + (lo - p->flat), n = hi - lo;
        memcpy(s->pslice + (lo - b), s->pparams + from, n * sizeof(float));
        if (state0 && ps0) memcpy(state0 + (lo - b), ps0 + from, n * sizeof(float));
        if (state1 && ps1) memcpy(state1 + (lo - b), ps1 + from, n * sizeof(float));
    }
}

void train_shard_set_replicated_state(train_shard *s, int k, const float *flat) {
    float *ps = s->stage == 3 && s->popt ? cllm_optim_state(s->popt, k) : NULL;
    for (int i = 0; ps && i < s->n_pers; i++)
        memcpy(ps + s->pers[i].compact, flat + s->pers[i].abs, s->pers[i].numel * sizeof(float));
}

cllm_status train_shard_ckpt_load(train_shard *s, const char *dir, long optim_step) {
    if (s->stage != 3 || !s->popt) return CLLM_OK;
    if (!dir) {
        cllm_optim_set_step_count(s->popt, optim_step);
        return CLLM_OK;
    }
    float *ps[2] = {cllm_optim_state(s->popt, 0), cllm_optim_state(s->popt, 1)};
    const cllm_ckpt_buffer which[2] = {CLLM_CKPT_STATE0, CLLM_CKPT_STATE1};
    for (int i = 0; i < s->n_pers; i++) {
        const persistent *p = &s->pers[i];
        for (int k = 0; k < 2; k++) {
            if (!ps[k]) continue;
            size_t at = p->abs;
            cllm_status st = cllm_ckpt_read_range(dir, s->m, which[k], at, at + p->numel, ps[k] + p->compact);
            if (st) return cllm_fail_context(st, "replicated tensor state");
        }
    }
    cllm_optim_set_step_count(s->popt, optim_step);
    return CLLM_OK;
}
