/*
 * Tensor-parallel inference: rank 0 drives, the other ranks follow.
 *
 * Every rank holds its part of the model (cllm_tp_model_load) and a key/value
 * cache over it with its own heads. Rank 0 runs the ordinary generation code
 * (cllm_generation, the serving engine); each call that changes one of its
 * caches (open, forward, rewind, free) first sends a command over the tensor
 * group, and the other ranks, sitting in cllm_kv_cache_follow, run the same
 * call on their cache. The forward itself is collective (the reductions of
 * the row-parallel layers and the gathered logits), so all ranks step
 * together; block tables need not travel because every cache makes the same
 * choices from the same calls (each forward's command carries a digest of
 * rank 0's positions and free blocks, which every follower checks).
 *
 * Commands go by a broadcast the followers wait in without spinning
 * (cllm_dist_g_bcast_wait): an idle server costs no CPU on any rank. A
 * command that cannot be sent, or a follower whose call fails, leaves the
 * caches out of step: the job is ended (cllm_dist_abort) rather than left
 * hanging; a rank that dies is caught by the heartbeat (cllm/dist.h).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "cllm/generate.h"
#include "model_impl.h"

int model_tp_next_id(void) {
    static atomic_int next = 1;
    return atomic_fetch_add(&next, 1);
}

cllm_status model_tp_announce(const cllm_model *m, const int32_t *cmd, int32_t *payload, size_t n) {
    if (m->tp_size <= 1 || m->tp_rank != 0) return CLLM_OK;
    int32_t h[TP_CMD_LEN];
    memcpy(h, cmd, sizeof h);
    cllm_status st = cllm_dist_g_bcast_wait(m->tp_grp, h, sizeof h, 0);
    if (!st && n) st = cllm_dist_g_bcast(m->tp_grp, payload, n * sizeof *payload, 0);
    if (st) {
        fprintf(stderr, "cllm: rank 0 cannot reach the other tensor ranks (%s); ending the job\n", cllm_last_error());
        cllm_dist_abort(1);
    }
    return st;
}

cllm_status cllm_kv_cache_stop_followers(const cllm_model *m) {
    int32_t cmd[TP_CMD_LEN] = {TP_OP_STOP};
    return model_tp_announce(m, cmd, NULL, 0);
}

typedef struct {
    int id;
    cllm_kv_cache *kv;
} followed;

static cllm_status follow_loop(const cllm_model *m, followed **list, int *n_list, int32_t **msg, size_t *msg_cap) {
    for (;;) {
        int32_t h[TP_CMD_LEN];
        cllm_status st = cllm_dist_g_bcast_wait(m->tp_grp, h, sizeof h, 0);
        if (st) return st;
        int op = h[0], id = h[1], k = -1;
        if (op == TP_OP_STOP) return CLLM_OK;
        for (int i = 0; i < *n_list; i++)
            if ((*list)[i].id == id) k = i;
        if (op != TP_OP_INIT && k < 0)
            return CLLM_FAIL(CLLM_ERR_INTERNAL, "tensor rank %d: command %d for unknown cache %d", m->tp_rank, op, id);
        switch (op) {
        case TP_OP_INIT: {
            cllm_kv_cache_params p = {.max_seqs = h[2], .max_pos = h[3], .max_rows = h[4], .block_size = h[5],
                                      .n_blocks = h[6], .kv_dtype = (cllm_kv_dtype)(h[7] & 255),
                                      .prefault = (h[7] & 256) != 0};
            followed *nl = realloc(*list, (size_t)(*n_list + 1) * sizeof *nl);
            if (!nl) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
            *list = nl;
            nl[*n_list].id = id;
            if ((st = cllm_kv_cache_init_paged(&nl[*n_list].kv, m, &p))) return st;
            (*n_list)++;
            break;
        }
        case TP_OP_FREE:
            cllm_kv_cache_free((*list)[k].kv);
            (*list)[k] = (*list)[--(*n_list)];
            break;
        case TP_OP_REWIND:
            if ((st = cllm_kv_cache_seq_rewind((*list)[k].kv, h[2], h[3]))) return st;
            break;
        case TP_OP_FORWARD: {
            size_t n = (size_t)h[2];
            int ns = cllm_kv_cache_max_seqs((*list)[k].kv);
            if (h[2] < ns) return CLLM_FAIL(CLLM_ERR_INTERNAL, "tensor rank %d: forward of %d ids", m->tp_rank, h[2]);
            if (model_kv_state((*list)[k].kv) != h[3])
                return CLLM_FAIL(CLLM_ERR_INTERNAL, "tensor rank %d: cache %d no longer matches rank 0's (positions "
                                 "or free blocks differ)", m->tp_rank, id);
            if (n > *msg_cap) {
                int32_t *nm = realloc(*msg, n * sizeof *nm);
                if (!nm) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
                *msg = nm;
                *msg_cap = n;
            }
            if ((st = cllm_dist_g_bcast(m->tp_grp, *msg, n * sizeof **msg, 0))) return st;
            /* the n_new counts, then the tokens (int32_t is int here) */
            if ((st = cllm_kv_cache_forward_ragged((*list)[k].kv, *msg + ns, *msg, NULL))) return st;
            break;
        }
        default:
            return CLLM_FAIL(CLLM_ERR_INTERNAL, "tensor rank %d: unknown command %d", m->tp_rank, op);
        }
    }
}

cllm_status cllm_kv_cache_follow(const cllm_model *m) {
    if (m->tp_size <= 1 || m->tp_rank == 0)
        return CLLM_FAIL(CLLM_ERR_ARG, "only tensor ranks other than 0 follow (this is rank %d of %d)",
                         m->tp_size > 1 ? m->tp_rank : 0, m->tp_size > 1 ? m->tp_size : 1);
    followed *list = NULL;
    int n_list = 0;
    int32_t *msg = NULL;
    size_t cap = 0;
    cllm_status st = follow_loop(m, &list, &n_list, &msg, &cap);
    for (int i = 0; i < n_list; i++) cllm_kv_cache_free(list[i].kv);
    free(list);
    free(msg);
    return st;
}
