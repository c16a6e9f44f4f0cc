/*
 * cllm/dist.h without MPI: the process is rank 0 of 1 and every collective
 * is the identity. Built instead of dist_mpi.c when CMake does not find MPI
 * (or CLLM_MPI is OFF), so callers never #ifdef.
 */
#include <stdlib.h>
#include <string.h>

#include "cllm/dist.h"
#include "dist/srun.h"

cllm_status cllm_dist_init(void) { return dist_srun_check(false); }
void cllm_dist_finalize(void) {}
void cllm_dist_abort(int code) { (void)code; }
int cllm_dist_rank(void) { return 0; }
int cllm_dist_size(void) { return 1; }
bool cllm_dist_active(void) { return false; }
const char *cllm_dist_backend(void) { return "none"; }

cllm_status cllm_dist_allreduce_sum_f32(float *buf, size_t n) { (void)buf, (void)n; return CLLM_OK; }
cllm_status cllm_dist_allreduce_sum_f64(double *buf, size_t n) { (void)buf, (void)n; return CLLM_OK; }
cllm_status cllm_dist_allreduce_sum_i64(int64_t *buf, size_t n) { (void)buf, (void)n; return CLLM_OK; }
cllm_status cllm_dist_allreduce_max_i64(int64_t *buf, size_t n) { (void)buf, (void)n; return CLLM_OK; }

cllm_status cllm_dist_reduce_scatter_sum_f32(const float *send, float *recv, const size_t *counts) {
    if (counts[0] && send != recv) memmove(recv, send, counts[0] * sizeof *recv);
    return CLLM_OK;
}

cllm_status cllm_dist_allreduce_sum_f32_as(float *buf, size_t n, cllm_dtype wire) {
    (void)buf, (void)n;
    if (wire != CLLM_F32 && wire != CLLM_BF16 && wire != CLLM_F16)
        return CLLM_FAIL(CLLM_ERR_ARG, "communication type must be F32, BF16 or F16");
    return CLLM_OK;
}

cllm_status cllm_dist_reduce_scatter_sum_f32_as(const float *send, float *recv, const size_t *counts,
                                                cllm_dtype wire) {
    if (wire != CLLM_F32 && wire != CLLM_BF16 && wire != CLLM_F16)
        return CLLM_FAIL(CLLM_ERR_ARG, "communication type must be F32, BF16 or F16");
    return cllm_dist_reduce_scatter_sum_f32(send, recv, counts);
}

cllm_status cllm_dist_allgather_f32(float *buf, const size_t *counts) { (void)buf, (void)counts; return CLLM_OK; }
cllm_status cllm_dist_allgather_bytes(void *buf, const size_t *bytes) { (void)buf, (void)bytes; return CLLM_OK; }
cllm_status cllm_dist_alltoall_bytes(const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes) {
    (void)send_bytes;
    if (recv_bytes[0] && recv != send) memmove(recv, send, recv_bytes[0]);
    return CLLM_OK;
}

cllm_status cllm_dist_allgather_u64(const uint64_t *mine, size_t n, uint64_t *all) {
    if (n && all != mine) memmove(all, mine, n * sizeof *all);
    return CLLM_OK;
}

cllm_status cllm_dist_bcast(void *buf, size_t bytes, int root) { (void)buf, (void)bytes, (void)root; return CLLM_OK; }
cllm_status cllm_dist_barrier(void) { return CLLM_OK; }

/* ---- groups and point to point: one rank, so every group is {0} and no
 * message can have a peer. */
struct cllm_dist_group {
    int n;
};

cllm_status cllm_dist_group_init(cllm_dist_group **out, const int *ranks, int n) {
    *out = NULL;
    if (n != 1 || ranks[0] != 0) return CLLM_FAIL(CLLM_ERR_ARG, "a group of %d ranks in a world of 1", n);
    *out = calloc(1, sizeof **out);
    if (!*out) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    (*out)->n = 1;
    return CLLM_OK;
}
void cllm_dist_group_free(cllm_dist_group *g) { free(g); }
int cllm_dist_group_rank(const cllm_dist_group *g) { (void)g; return 0; }
int cllm_dist_group_size(const cllm_dist_group *g) { (void)g; return 1; }
cllm_status cllm_dist_g_allreduce_sum_f32(const cllm_dist_group *g, float *buf, size_t n) { (void)g, (void)buf, (void)n; return CLLM_OK; }
cllm_status cllm_dist_g_allreduce_sum_f64(const cllm_dist_group *g, double *buf, size_t n) { (void)g, (void)buf, (void)n; return CLLM_OK; }
cllm_status cllm_dist_g_reduce_scatter_sum_f32(const cllm_dist_group *g, const float *send, float *recv, const size_t *counts) {
    (void)g;
    return cllm_dist_reduce_scatter_sum_f32(send, recv, counts);
}
cllm_status cllm_dist_g_allgather_f32(const cllm_dist_group *g, float *buf, const size_t *counts) { (void)g, (void)buf, (void)counts; return CLLM_OK; }
cllm_status cllm_dist_g_gather_f32(const cllm_dist_group *g, float *buf, const size_t *counts, int root) { (void)g, (void)buf, (void)counts, (void)root; return CLLM_OK; }
cllm_status cllm_dist_g_bcast(const cllm_dist_group *g, void *buf, size_t bytes, int root) { (void)g, (void)buf, (void)bytes, (void)root; return CLLM_OK; }
cllm_status cllm_dist_g_bcast_wait(const cllm_dist_group *g, void *buf, size_t bytes, int root) { return cllm_dist_g_bcast(g, buf, bytes, root); }

cllm_status cllm_dist_isend_f32(const float *buf, size_t n, int dest, int tag, cllm_dist_req *req) {
    (void)buf, (void)n, (void)tag;
    req->active = false;
    return CLLM_FAIL(CLLM_ERR_ARG, "send to rank %d in a world of 1", dest);
}
cllm_status cllm_dist_recv_f32(float *buf, size_t n, int src, int tag) {
    (void)buf, (void)n, (void)tag;
    return CLLM_FAIL(CLLM_ERR_ARG, "receive from rank %d in a world of 1", src);
}
cllm_status cllm_dist_send_wait(cllm_dist_req *req) {
    req->active = false;
    return CLLM_OK;
}
cllm_status cllm_dist_g_allreduce_max_f32(const cllm_dist_group *g, float *buf, size_t n) {
    (void)g, (void)buf, (void)n;
    return CLLM_OK;
}

cllm_status cllm_dist_g_alltoallv(const cllm_dist_group *g, const void *send, const size_t *scounts, void *recv,
                                  const size_t *rcounts) {
    (void)g;
    if (scounts[0] != rcounts[0])
        return CLLM_FAIL(CLLM_ERR_ARG, "all-to-all of one rank sends %zu bytes but receives %zu", scounts[0], rcounts[0]);
    if (scounts[0]) memmove(recv, send, scounts[0]);
    return CLLM_OK;
}
uint64_t cllm_dist_alltoallv_sent_bytes(void) { return 0; }
double cllm_dist_alltoallv_seconds(void) { return 0; }
