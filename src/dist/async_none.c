/*
 * The nonblocking collectives of cllm/dist.h without MPI: one rank, so every
 * operation is complete when it starts (a reduce-scatter in place leaves the
 * buffer as it is) and there is nothing to progress.
 */
#include "cllm/dist.h"

cllm_status cllm_dist_iallgather_f32(float *buf, const size_t *counts, cllm_dist_request **req) {
    (void)buf, (void)counts;
    *req = NULL;
    return CLLM_OK;
}

cllm_status cllm_dist_ireduce_scatter_sum_f32(float *buf, const size_t *counts, cllm_dist_request **req) {
    (void)buf, (void)counts;
    *req = NULL;
    return CLLM_OK;
}

cllm_status cllm_dist_iallreduce_sum_f32(float *buf, size_t n, cllm_dist_request **req) {
    (void)buf, (void)n;
    *req = NULL;
    return CLLM_OK;
}

cllm_status cllm_dist_test(cllm_dist_request *req, bool *done) {
    (void)req;
    *done = true;
    return CLLM_OK;
}

cllm_status cllm_dist_wait(cllm_dist_request *req, double *finished) {
    (void)req;
    if (finished) *finished = cllm_time_sec();
    return CLLM_OK;
}

bool cllm_dist_progress_start(void) { return false; }
void cllm_dist_progress_stop(void) {}
