/*
 * --tensor N for cllm generate and cllm serve: under mpirun -np N every rank
 * loads its tensor-parallel part of the model (only its slice is ever
 * held), rank 0 runs the command and the other ranks follow its cache calls
 * (cllm_kv_cache_follow) until rank 0 is done.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cllm/dist.h"
#include "cllm/generate.h"
#include "cllm/quant.h"
#include "cllm/split.h"
#include "commands.h"

static cllm_dist_group *world;

cllm_status tool_tp_load(cllm_model **m, const char *dir, int tensor, const char *weights, const char *cmd) {
    *m = NULL;
    if (tensor < 1) return CLLM_FAIL(CLLM_ERR_ARG, "--tensor %d: a positive number of ranks", tensor);
    if (tensor == 1) return CLLM_OK; /* the caller loads the whole model its usual way */
    /* Every layer synchronises the ranks twice per token: a rank waiting in
     * a collective gives its core away rather than polling, so that on a
     * host shared with other work (or with more ranks than cores) the rank
     * it waits for can run. Before MPI starts; an explicit setting (mpirun
     * --mca mpi_yield_when_idle 0) wins. */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    cllm_status st = cllm_dist_init();
    if (st) return st;
    if (cllm_dist_size() != tensor) {
        st = CLLM_FAIL(CLLM_ERR_ARG, "--tensor %d needs exactly %d ranks (mpirun -np %d cllm %s ...); this job has %d",
                       tensor, tensor, tensor, cmd, cllm_dist_size());
        cllm_dist_finalize();
        return st;
    }
    int ranks[256];
    if (tensor > 256) return CLLM_FAIL(CLLM_ERR_ARG, "--tensor %d: at most 256 ranks", tensor);
    for (int i = 0; i < tensor; i++) ranks[i] = i;
    if (!(st = cllm_dist_group_init(&world, ranks, tensor)) &&
        !(st = cllm_tp_model_load_weights(m, dir, tensor, cllm_dist_rank(), weights)))
        st = cllm_model_set_tensor_parallel(*m, world, cllm_dist_rank(), tensor);
    if (st) {
        /* the others may be waiting for this rank: end them all */
        fprintf(stderr, "cllm %s: rank %d of %d: %s\n", cmd, cllm_dist_rank(), tensor, cllm_last_error());
        cllm_dist_abort(1);
        cllm_model_free(*m);
        *m = NULL;
        return st;
    }
    if (cllm_dist_rank() == 0)
        fprintf(stderr, "cllm %s: tensor parallel over %d ranks: %.1f MiB of weights per rank (%s)\n", cmd, tensor,
                (double)cllm_model_held_bytes(*m) / (1 << 20), cllm_wfmt_name(cllm_model_weights(*m)));
    return CLLM_OK;
}

bool tool_tp_follower(const cllm_model *m) { return m && cllm_model_tensor_size(m) > 1 && cllm_model_tensor_rank(m) > 0; }

int tool_tp_follow(cllm_model *m, const char *cmd) {
    /* rank 0 decides when to stop: a SIGTERM or SIGINT that mpirun forwards
     * here waits for rank 0's stop */
    tool_signals_ignore();
    cllm_status st = cllm_kv_cache_follow(m);
    if (st) {
        fprintf(stderr, "cllm %s: rank %d: %s\n", cmd, cllm_model_tensor_rank(m), cllm_last_error());
        cllm_dist_abort(1);
    }
    cllm_model_free(m);
    cllm_dist_group_free(world);
    world = NULL;
    cllm_dist_finalize();
    return st ? 1 : 0;
}

void tool_tp_end(const cllm_model *m) {
    if (!m || cllm_model_tensor_size(m) <= 1) return;
    cllm_kv_cache_stop_followers(m);
    cllm_dist_group_free(world);
    world = NULL;
}
