/*
 * Checkpoints of runs whose ranks hold parts of the model (see
 * engine_impl.h): tensor-parallel parts and sliced experts. Both write the
 * whole model's one-process checkpoint, gathered to rank 0, so that any
 * layout resumes it, and both read it back by cutting each rank's part out
 * of the whole state and keeping the rank's ZeRO slice of that part.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/checkpoint.h"
#include "cllm/dist.h"
#include "cllm/model.h"
#include "cllm/split.h"
#include "engine_impl.h"

/* Tensor parallelism: checkpoints hold the whole model's flat layout. A
 * rank reads the whole state, cuts its part, and keeps its ZeRO slice. */
cllm_status train_tp_read_optim(trainer *tr, const char *dir, float *s0, float *s1) {
    const cllm_model *whole = train_tp_whole(tr->tp);
    size_t nf = cllm_model_buffer_len(whole), nl = cllm_model_buffer_len(tr->m);
    float *full = cllm_alloc(nf * sizeof(float), "checkpoint state"), *part = cllm_alloc(nl * sizeof(float), "state");
    cllm_status st = full && part ? CLLM_OK : CLLM_ERR_NOMEM;
    float *dst[2] = {s0, s1};
    const cllm_ckpt_buffer which[2] = {CLLM_CKPT_STATE0, CLLM_CKPT_STATE1};
    for (int k = 0; k < 2 && !st; k++) {
        if (!dst[k]) continue;
        if ((st = cllm_ckpt_read_range(dir, whole, which[k], 0, nf, full))) break;
        cllm_tp_cut_buffer(whole, tr->m, tr->topo.dims[CLLM_AXIS_TENSOR], tr->topo.coord[CLLM_AXIS_TENSOR], full, part);
        memcpy(dst[k], part + tr->base + tr->zero.begin, (tr->zero.end - tr->zero.begin) * sizeof(float));
        if (tr->shard) train_shard_set_replicated_state(tr->shard, k, part); /* ZeRO-3's whole small tensors */
    }
    cllm_free(full);
    cllm_free(part);
    return st;
}

/* The part's whole buffer in loc[part length] from this rank's ZeRO slice
 * of it and the data group's (collective over the group). */
static cllm_status tp_part_of(trainer *tr, const float *slice, float *loc) {
    const train_zero *z = &tr->zero;
    memset(loc, 0, cllm_model_buffer_len(tr->m) * sizeof(float));
    memcpy(loc + tr->base + z->begin, slice, (z->end - z->begin) * sizeof(float));
    return z->stage >= 1 && z->size > 1 ? cllm_dist_g_allgather_f32(z->grp, loc + tr->base, z->counts) : CLLM_OK;
}

/* Tensor parallelism: the parts of the parameters and of the optimizer
 * state are gathered into the whole model's layout (collective over every
 * rank) and rank 0 writes a one-process checkpoint, which any layout
 * resumes. */
cllm_status train_save_tp(trainer *tr) {
    cllm_model *whole = (cllm_model *)train_tp_whole(tr->tp); /* the trainer's copy, refilled here */
    size_t nl = cllm_model_buffer_len(tr->m), nf = cllm_model_buffer_len(whole);
    float *loc = cllm_alloc(nl * sizeof(float), "checkpoint state");
    if (!loc) return CLLM_ERR_NOMEM;
    float *s[2] = {cllm_optim_state(tr->opt, 0), cllm_optim_state(tr->opt, 1)};
    cllm_status st = tr->offload ? train_offload_map(tr->offload, false, &s[0], &s[1]) : CLLM_OK;
    /* ZeRO-3: the part's parameters are slices too (the replicated small
     * tensors copied into their places first) */
    float *pslice = tr->shard ? train_shard_param_slice(tr->shard) : NULL;
    if (tr->shard) train_shard_ckpt_fill(tr->shard, s[0], s[1]);
    if (!st && pslice) {
        if (!(st = tp_part_of(tr, pslice, loc)))
            st = cllm_tp_gather_buffer(whole, tr->m, train_tp_group(tr->tp), loc, cllm_model_params(whole), NULL);
    } else if (!st) {
        st = train_tp_gather(tr->tp, tr->m, &whole, NULL);
    }
    /* with a pipeline each tensor group gathered its stage: the stages next */
    if (!st && tr->pipe) st = train_pipe_gather_layout(tr->pipe, whole, cllm_model_params(whole));
    float *full[2] = {NULL, NULL};
    for (int k = 0; k < 2 && !st; k++) {
        if (!s[k]) continue;
        /* the whole part's state: this rank's ZeRO slice, then the data group's */
        if ((st = tp_part_of(tr, s[k], loc))) break;
        if (!(full[k] = cllm_alloc(nf * sizeof(float), "checkpoint state"))) {
            st = CLLM_ERR_NOMEM;
            break;
        }
        st = cllm_tp_gather_buffer(whole, tr->m, train_tp_group(tr->tp), loc, full[k], NULL);
        if (!st && tr->pipe) st = train_pipe_gather_layout(tr->pipe, whole, full[k]);
    }
    train_offload_unmap(tr->offload);
    if (!st && tr->output_dir && cllm_dist_rank() == 0) {
        tr->state.optim_step = cllm_optim_step_count(tr->opt);
        cllm_ckpt_tensors t = {cllm_model_params(whole), full[0], full[1], nf};
        st = cllm_ckpt_write(tr->output_dir, whole, &t, &tr->state, tr->cfg->max_shard_bytes, tr->cfg->save_total_limit);
    }
    cllm_free(loc);
    cllm_free(full[0]);
    cllm_free(full[1]);
    return st;
}

/* Sliced experts: the checkpoint holds every expert; this rank's part of
 * each state is cut out of it, then its ZeRO slice kept. */
cllm_status train_ep_read_optim(trainer *tr, const char *dir, float *s0, float *s1) {
    cllm_model *whole = NULL;
    cllm_status st = cllm_moe_model_whole(&whole, tr->m);
    if (st) return st;
    size_t nf = cllm_model_buffer_len(whole), nl = cllm_model_buffer_len(tr->m);
    float *full = cllm_model_params(whole), *part = cllm_alloc(nl * sizeof(float), "state");
    if (!part) st = CLLM_ERR_NOMEM;
    float *dst[2] = {s0, s1};
    const cllm_ckpt_buffer which[2] = {CLLM_CKPT_STATE0, CLLM_CKPT_STATE1};
    for (int k = 0; k < 2 && !st; k++) {
        if (!dst[k]) continue;
        if ((st = cllm_ckpt_read_range(dir, whole, which[k], 0, nf, full))) break;
        cllm_moe_cut_buffer(whole, tr->m, full, part);
        memcpy(dst[k], part + tr->zero.begin, (tr->zero.end - tr->zero.begin) * sizeof(float));
    }
    cllm_free(part);
    cllm_model_free(whole);
    return st;
}

/* Sliced experts: every rank's part of the parameters and of the optimizer
 * state gathered into the whole model's layout on rank 0 (ZeRO-1's slices
 * first within the expert-data group), which writes a one-process
 * checkpoint: any expert-parallel size, or none, resumes it. */
cllm_status train_save_ep(trainer *tr) {
    size_t nl = cllm_model_buffer_len(tr->m);
    float *loc = cllm_alloc(nl * sizeof(float), "checkpoint state");
    if (!loc) return CLLM_ERR_NOMEM;
    float *s[2] = {cllm_optim_state(tr->opt, 0), cllm_optim_state(tr->opt, 1)};
    cllm_model *whole = NULL;
    float *fullp = NULL, *full[2] = {NULL, NULL};
    cllm_status st = train_moe_gather(tr, cllm_model_params(tr->m), &whole, &fullp);
    for (int k = 0; k < 2 && !st; k++) {
        if (!s[k]) continue;
        if ((st = tp_part_of(tr, s[k], loc))) break; /* the ZeRO slices of the expert-data group */
        if (whole && !(full[k] = cllm_alloc(cllm_model_buffer_len(whole) * sizeof(float), "checkpoint state"))) {
            st = CLLM_ERR_NOMEM;
            break;
        }
        if (cllm_dist_rank() < cllm_model_expert_parallel_size(tr->m))
            st = cllm_moe_gather_buffer(whole, tr->m, tr->ep_grp, loc, full[k]);
    }
    if (!st && tr->output_dir && cllm_dist_rank() == 0) {
        tr->state.optim_step = cllm_optim_step_count(tr->opt);
        cllm_ckpt_tensors t = {fullp, full[0], full[1], cllm_model_buffer_len(whole)};
        st = cllm_ckpt_write(tr->output_dir, whole, &t, &tr->state, tr->cfg->max_shard_bytes, tr->cfg->save_total_limit);
    }
    cllm_free(loc);
    cllm_free(full[0]);
    cllm_free(full[1]);
    cllm_model_free(whole);
    return st;
}
