/*
 * cllm/dist.h on MPI (OpenMPI from Debian). Built only when CMake finds MPI;
 * src/dist/dist_none.c is the one-rank build of the same header.
 *
 * MPI_Init runs only when a launcher started the process, so a plain
 * `cllm train` never touches MPI (no singleton runtime, no network probing)
 * and behaves exactly as a build without MPI. Counts larger than INT_MAX
 * are refused: callers bucket their buffers (reduce_bucket_size) well below.
 * Every world collective is announced to the watchdog first (watchdog_mpi.c:
 * the collective timeout). Not here: nonblocking collectives (async_mpi.c).
 * Group collectives and point-to-point messages (at the end) are not
 * covered by the watchdog.
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cllm/dist.h"
#include "dist/srun.h"
#include "dist/watchdog.h"

static bool started;  /* we called MPI_Init */
static int w_rank, w_size = 1;
static MPI_Op op_sum16[2] = {MPI_OP_NULL, MPI_OP_NULL}; /* bf16, fp16 sums (created on first use) */

static bool launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

static cllm_status mpi_fail(int rc, const char *func, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return cllm_fail(CLLM_ERR_INTERNAL, func, "%s failed on rank %d of %d: %s", what, w_rank, w_size, msg);
}
#define MPI_TRY(call)                                                                                          \
    do {                                                                                                       \
        int rc_ = (call);                                                                                      \
        if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, __func__, #call);                                          \
    } while (0)

cllm_status cllm_dist_init(void) {
    if (started) return CLLM_OK;
    cllm_status st = dist_srun_check(true);
    if (st) return st;
    if (!launched_by_mpi()) return CLLM_OK;
    int already = 0;
    MPI_Initialized(&already);
    /* threads: a progress thread may test nonblocking collectives (async_mpi.c) */
    int provided = 0;
    if (!already) MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
    started = true;
    /* errors come back as codes, turned into cllm statuses above */
    MPI_TRY(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &w_rank));
    MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &w_size));
    /* every collective below is announced to the watchdog (watchdog_mpi.c);
     * a thread pings the other ranks (heartbeat_mpi.c) */
    st = dist_watch_init(w_rank, w_size);
    return st ? st : dist_heartbeat_init(w_rank, w_size);
}

void cllm_dist_finalize(void) {
    if (!started) return;
    int done = 0;
    MPI_Finalized(&done);
    for (int i = 0; i < 2; i++) {
        if (!done && op_sum16[i] != MPI_OP_NULL) MPI_Op_free(&op_sum16[i]);
        op_sum16[i] = MPI_OP_NULL;
    }
    if (!done) {
        dist_heartbeat_finalize();
        dist_watch_finalize();
        MPI_Finalize();
    }
    started = false;
    w_rank = 0;
    w_size = 1;
}

void cllm_dist_abort(int code) {
    if (started && w_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

int cllm_dist_rank(void) { return w_rank; }
int cllm_dist_size(void) { return w_size; }
bool cllm_dist_active(void) { return started && w_size > 1; }
const char *cllm_dist_backend(void) { return "MPI"; }

/* Buffers are split into <= INT_MAX-element calls so that any n works. */
static cllm_status allreduce(void *buf, size_t n, size_t elem, MPI_Datatype t, MPI_Op op, const char *what,
                             const char *unit) {
    if (!cllm_dist_active()) return CLLM_OK;
    char *p = buf;
    while (n > 0) {
        int k = n > (size_t)INT_MAX ? INT_MAX : (int)n;
        cllm_status st = dist_watch_enter(what, (size_t)k, unit);
        if (st) return st;
        int rc = MPI_Allreduce(MPI_IN_PLACE, p, k, t, op, MPI_COMM_WORLD);
        dist_watch_leave();
        if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Allreduce");
        p += (size_t)k * elem;
        n -= (size_t)k;
    }
    return CLLM_OK;
}

cllm_status cllm_dist_allreduce_sum_f32(float *buf, size_t n) { return allreduce(buf, n, sizeof *buf, MPI_FLOAT, MPI_SUM, "allreduce", "floats"); }
cllm_status cllm_dist_allreduce_sum_f64(double *buf, size_t n) { return allreduce(buf, n, sizeof *buf, MPI_DOUBLE, MPI_SUM, "allreduce", "doubles"); }
cllm_status cllm_dist_allreduce_sum_i64(int64_t *buf, size_t n) { return allreduce(buf, n, sizeof *buf, MPI_INT64_T, MPI_SUM, "allreduce", "int64s"); }
cllm_status cllm_dist_allreduce_max_i64(int64_t *buf, size_t n) { return allreduce(buf, n, sizeof *buf, MPI_INT64_T, MPI_MAX, "allreduce (max)", "int64s"); }

/* counts as ints, and their prefix sums as displacements */
static cllm_status int_counts(const size_t *counts, int *ic, int *displs, const char *func) {
    size_t off = 0;
    for (int r = 0; r < w_size; r++) {
        if (counts[r] > (size_t)INT_MAX || off > (size_t)INT_MAX)
            return cllm_fail(CLLM_ERR_ARG, func, "part %d (%zu floats at %zu) exceeds MPI's int counts; use smaller "
                             "buckets (zero_optimization.reduce_bucket_size)", r, counts[r], off);
        ic[r] = (int)counts[r];
        if (displs) displs[r] = (int)off;
        off += counts[r];
    }
    return CLLM_OK;
}

cllm_status cllm_dist_reduce_scatter_sum_f32(const float *send, float *recv, const size_t *counts) {
    if (!cllm_dist_active()) {
        if (counts[0] && send != recv) memmove(recv, send, counts[0] * sizeof *recv);
        return CLLM_OK;
    }
    int *ic = malloc((size_t)w_size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = int_counts(counts, ic, NULL, __func__);
    size_t total = 0;
    for (int r = 0; r < w_size; r++) total += counts[r];
    if (!st) st = dist_watch_enter("reduce-scatter", total, "floats");
    int rc = st ? MPI_SUCCESS : MPI_Reduce_scatter(send == recv ? MPI_IN_PLACE : send, recv, ic, MPI_FLOAT,
                                                        MPI_SUM, MPI_COMM_WORLD);
    dist_watch_leave();
    free(ic);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(rc, __func__, "MPI_Reduce_scatter");
    return st;
}

/* ---- sums of 16-bit floats: MPI has no bf16/fp16 type, so the words
 * travel as MPI_UINT16_T and a user-defined op adds them */
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = cllm_f32_to_bf16(cllm_bf16_to_f32(a[i]) + cllm_bf16_to_f32(b[i]));
}

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = cllm_f32_to_f16(cllm_f16_to_f32(a[i]) + cllm_f16_to_f32(b[i]));
}

static cllm_status wire_op(cllm_dtype wire, MPI_Op *op, const char *func) {
    if (wire != CLLM_BF16 && wire != CLLM_F16)
        return cllm_fail(CLLM_ERR_ARG, func, "communication type must be F32, BF16 or F16");
    int i = wire == CLLM_BF16 ? 0 : 1;
    if (op_sum16[i] == MPI_OP_NULL) {
        int rc = MPI_Op_create(i == 0 ? sum_bf16 : sum_f16, 1, &op_sum16[i]);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, func, "MPI_Op_create");
    }
    *op = op_sum16[i];
    return CLLM_OK;
}

static void to_wire(uint16_t *dst, const float *src, size_t n, cllm_dtype wire) {
    for (size_t i = 0; i < n; i++) dst[i] = wire == CLLM_BF16 ? cllm_f32_to_bf16(src[i]) : cllm_f32_to_f16(src[i]);
}

static void from_wire(float *dst, const uint16_t *src, size_t n, cllm_dtype wire) {
    for (size_t i = 0; i < n; i++) dst[i] = wire == CLLM_BF16 ? cllm_bf16_to_f32(src[i]) : cllm_f16_to_f32(src[i]);
}

cllm_status cllm_dist_allreduce_sum_f32_as(float *buf, size_t n, cllm_dtype wire) {
    if (wire == CLLM_F32) return cllm_dist_allreduce_sum_f32(buf, n);
    MPI_Op op;
    cllm_status st = wire_op(wire, &op, __func__);
    if (st || !cllm_dist_active() || n == 0) return st;
    uint16_t *w = malloc(n * sizeof *w);
    if (!w) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory for %zu 16-bit values", n);
    to_wire(w, buf, n, wire);
    st = allreduce(w, n, sizeof *w, MPI_UINT16_T, op, wire == CLLM_BF16 ? "bf16 all-reduce" : "fp16 all-reduce", "values");
    if (!st) from_wire(buf, w, n, wire);
    free(w);
    return st;
}

cllm_status cllm_dist_reduce_scatter_sum_f32_as(const float *send, float *recv, const size_t *counts,
                                                cllm_dtype wire) {
    if (wire == CLLM_F32) return cllm_dist_reduce_scatter_sum_f32(send, recv, counts);
    MPI_Op op;
    cllm_status st = wire_op(wire, &op, __func__);
    if (st) return st;
    if (!cllm_dist_active()) return cllm_dist_reduce_scatter_sum_f32(send, recv, counts);
    size_t total = 0;
    for (int r = 0; r < w_size; r++) total += counts[r];
    int *ic = malloc((size_t)w_size * sizeof *ic);
    uint16_t *w = malloc((total ? total : 1) * sizeof *w);
    if (!ic || !w) {
        free(ic);
        free(w);
        return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    }
    st = int_counts(counts, ic, NULL, __func__);
    if (!st) {
        to_wire(w, send, total, wire);
        st = dist_watch_enter(wire == CLLM_BF16 ? "bf16 reduce-scatter" : "fp16 reduce-scatter", total, "values");
        if (!st) {
            int rc = MPI_Reduce_scatter(MPI_IN_PLACE, w, ic, MPI_UINT16_T, op, MPI_COMM_WORLD);
            dist_watch_leave();
            if (rc != MPI_SUCCESS) st = mpi_fail(rc, __func__, "MPI_Reduce_scatter");
            else from_wire(recv, w, counts[w_rank], wire);
        }
    }
    free(ic);
    free(w);
    return st;
}

/* In-place all-gather of counts[r] elements of type t from each rank r
 * (unit names them in the watchdog's messages); caller names the API call. */
static cllm_status allgather_in_place(void *buf, const size_t *counts, MPI_Datatype t, const char *unit,
                                      const char *caller) {
    if (!cllm_dist_active()) return CLLM_OK;
    int *ic = malloc(2 * (size_t)w_size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = int_counts(counts, ic, ic + w_size, caller);
    size_t total = 0;
    for (int r = 0; r < w_size; r++) total += counts[r];
    if (!st) st = dist_watch_enter("allgather", total, unit);
    int rc = st ? MPI_SUCCESS
                : MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, ic, ic + w_size, t, MPI_COMM_WORLD);
    dist_watch_leave();
    free(ic);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(rc, caller, "MPI_Allgatherv");
    return st;
}

cllm_status cllm_dist_allgather_f32(float *buf, const size_t *counts) {
    return allgather_in_place(buf, counts, MPI_FLOAT, "floats", __func__);
}

cllm_status cllm_dist_allgather_bytes(void *buf, const size_t *bytes) {
    return allgather_in_place(buf, bytes, MPI_BYTE, "bytes", __func__);
}

cllm_status cllm_dist_alltoall_bytes(const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes) {
    if (!cllm_dist_active()) {
        if (recv_bytes[0] && recv != send) memmove(recv, send, recv_bytes[0]);
        return CLLM_OK;
    }
    int *ic = malloc(4 * (size_t)w_size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    int *sc = ic, *sd = ic + w_size, *rc_ = ic + 2 * w_size, *rd = ic + 3 * w_size;
    cllm_status st = int_counts(send_bytes, sc, sd, __func__);
    if (!st) st = int_counts(recv_bytes, rc_, rd, __func__);
    size_t total = 0;
    for (int r = 0; r < w_size; r++) total += recv_bytes[r];
    if (!st) st = dist_watch_enter("all-to-all", total, "bytes");
    int rc = st ? MPI_SUCCESS : MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, MPI_COMM_WORLD);
    dist_watch_leave();
    free(ic);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(rc, __func__, "MPI_Alltoallv");
    return st;
}

cllm_status cllm_dist_allgather_u64(const uint64_t *mine, size_t n, uint64_t *all) {
    if (!cllm_dist_active()) {
        if (n && all != mine) memmove(all, mine, n * sizeof *all);
        return CLLM_OK;
    }
    if (n > (size_t)INT_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "%zu values exceed MPI's int counts", n);
    cllm_status st = dist_watch_enter("allgather", n * (size_t)w_size, "uint64s");
    if (st) return st;
    int rc = MPI_Allgather(mine, (int)n, MPI_UINT64_T, all, (int)n, MPI_UINT64_T, MPI_COMM_WORLD);
    dist_watch_leave();
    if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Allgather");
    return CLLM_OK;
}

cllm_status cllm_dist_bcast(void *buf, size_t bytes, int root) {
    if (!cllm_dist_active()) return CLLM_OK;
    if (root < 0 || root >= w_size) return CLLM_FAIL(CLLM_ERR_ARG, "root %d outside 0..%d", root, w_size - 1);
    char *p = buf;
    while (bytes > 0) {
        int k = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        cllm_status st = dist_watch_enter("broadcast", (size_t)k, "bytes");
        if (st) return st;
        int rc = MPI_Bcast(p, k, MPI_BYTE, root, MPI_COMM_WORLD);
        dist_watch_leave();
        if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Bcast");
        p += k;
        bytes -= (size_t)k;
    }
    return CLLM_OK;
}

cllm_status cllm_dist_barrier(void) {
    if (!cllm_dist_active()) return CLLM_OK;
    cllm_status st = dist_watch_enter("barrier", 0, "bytes");
    if (st) return st;
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    dist_watch_leave();
    if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Barrier");
    return CLLM_OK;
}

/* ------------------------------------------------------------- groups */

struct cllm_dist_group {
    MPI_Comm comm; /* MPI_COMM_NULL: not started (one rank) */
    int rank, size;
};

cllm_status cllm_dist_group_init(cllm_dist_group **out, const int *ranks, int n) {
    *out = NULL;
    int me = -1, color = INT_MAX;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= w_size)
            return CLLM_FAIL(CLLM_ERR_ARG, "group member %d outside the world of %d ranks", ranks[i], w_size);
        if (ranks[i] == w_rank) me = i;
        if (ranks[i] < color) color = ranks[i];
    }
    if (me < 0) return CLLM_FAIL(CLLM_ERR_ARG, "rank %d is not in the group it asked for", w_rank);
    cllm_dist_group *g = calloc(1, sizeof *g);
    if (!g) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    g->comm = MPI_COMM_NULL;
    g->rank = me;
    g->size = n;
    if (cllm_dist_active()) {
        /* the smallest member names the group; the position orders it */
        int rc = MPI_Comm_split(MPI_COMM_WORLD, color, me, &g->comm);
        if (rc != MPI_SUCCESS) {
            free(g);
            return mpi_fail(rc, __func__, "MPI_Comm_split");
        }
        int size = 0;
        MPI_Comm_size(g->comm, &size);
        MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
        if (size != n) {
            MPI_Comm_free(&g->comm);
            free(g);
            return CLLM_FAIL(CLLM_ERR_ARG, "rank %d asked for a group of %d ranks but %d joined it: the groups do not "
                             "partition the world", w_rank, n, size);
        }
    } else if (n != 1) {
        free(g);
        return CLLM_FAIL(CLLM_ERR_ARG, "a group of %d ranks in a world of 1", n);
    }
    *out = g;
    return CLLM_OK;
}

void cllm_dist_group_free(cllm_dist_group *g) {
    if (!g) return;
    int done = 0;
    MPI_Finalized(&done);
    if (g->comm != MPI_COMM_NULL && !done) MPI_Comm_free(&g->comm);
    free(g);
}

int cllm_dist_group_rank(const cllm_dist_group *g) { return g ? g->rank : w_rank; }
int cllm_dist_group_size(const cllm_dist_group *g) { return g ? g->size : w_size; }

/* The communicator of g, or MPI_COMM_NULL when it has one rank (nothing to do). */
static MPI_Comm comm_of(const cllm_dist_group *g) {
    if (!g) return cllm_dist_active() ? MPI_COMM_WORLD : MPI_COMM_NULL;
    return g->size > 1 ? g->comm : MPI_COMM_NULL;
}

static cllm_status g_allreduce(const cllm_dist_group *g, void *buf, size_t n, size_t elem, MPI_Datatype t) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) return CLLM_OK;
    char *p = buf;
    while (n > 0) {
        int k = n > (size_t)INT_MAX ? INT_MAX : (int)n;
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, p, k, t, MPI_SUM, c));
        p += (size_t)k * elem;
        n -= (size_t)k;
    }
    return CLLM_OK;
}

cllm_status cllm_dist_g_allreduce_sum_f32(const cllm_dist_group *g, float *buf, size_t n) {
    return g_allreduce(g, buf, n, sizeof *buf, MPI_FLOAT);
}
cllm_status cllm_dist_g_allreduce_sum_f64(const cllm_dist_group *g, double *buf, size_t n) {
    return g_allreduce(g, buf, n, sizeof *buf, MPI_DOUBLE);
}

/* int counts and displacements for a group of `size` ranks */
static cllm_status g_counts(const size_t *counts, int size, int *ic, int *displs, const char *func) {
    size_t off = 0;
    for (int r = 0; r < size; r++) {
        if (counts[r] > (size_t)INT_MAX || off > (size_t)INT_MAX)
            return cllm_fail(CLLM_ERR_ARG, func, "part %d (%zu floats at %zu) exceeds MPI's int counts", r, counts[r],
                             off);
        ic[r] = (int)counts[r];
        if (displs) displs[r] = (int)off;
        off += counts[r];
    }
    return CLLM_OK;
}

cllm_status cllm_dist_g_reduce_scatter_sum_f32(const cllm_dist_group *g, const float *send, float *recv,
                                               const size_t *counts) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) {
        if (counts[0] && send != recv) memmove(recv, send, counts[0] * sizeof *recv);
        return CLLM_OK;
    }
    int size = cllm_dist_group_size(g);
    int *ic = malloc((size_t)size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = g_counts(counts, size, ic, NULL, __func__);
    int rc = st ? MPI_SUCCESS : MPI_Reduce_scatter(send == recv ? MPI_IN_PLACE : send, recv, ic, MPI_FLOAT, MPI_SUM, c);
    free(ic);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(rc, __func__, "MPI_Reduce_scatter");
    return st;
}

cllm_status cllm_dist_g_allgather_f32(const cllm_dist_group *g, float *buf, const size_t *counts) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) return CLLM_OK;
    int size = cllm_dist_group_size(g);
    int *ic = malloc(2 * (size_t)size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = g_counts(counts, size, ic, ic + size, __func__);
    int rc = st ? MPI_SUCCESS : MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, ic, ic + size, MPI_FLOAT, c);
    free(ic);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(rc, __func__, "MPI_Allgatherv");
    return st;
}

cllm_status cllm_dist_g_gather_f32(const cllm_dist_group *g, float *buf, const size_t *counts, int root) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) return CLLM_OK;
    int size = cllm_dist_group_size(g), me = cllm_dist_group_rank(g);
    int *ic = malloc(2 * (size_t)size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = g_counts(counts, size, ic, ic + size, __func__);
    int rc = MPI_SUCCESS;
    if (!st && me == root)
        rc = MPI_Gatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, ic, ic + size, MPI_FLOAT, root, c);
    else if (!st)
        rc = MPI_Gatherv(buf + ic[size + me], ic[me], MPI_FLOAT, NULL, NULL, NULL, MPI_FLOAT, root, c);
    free(ic);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(rc, __func__, "MPI_Gatherv");
    return st;
}

cllm_status cllm_dist_g_bcast(const cllm_dist_group *g, void *buf, size_t bytes, int root) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) return CLLM_OK;
    if (root < 0 || root >= cllm_dist_group_size(g)) return CLLM_FAIL(CLLM_ERR_ARG, "root %d outside the group", root);
    char *p = buf;
    while (bytes > 0) {
        int k = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        MPI_TRY(MPI_Bcast(p, k, MPI_BYTE, root, c));
        p += k;
        bytes -= (size_t)k;
    }
    return CLLM_OK;
}

cllm_status cllm_dist_g_bcast_wait(const cllm_dist_group *g, void *buf, size_t bytes, int root) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) return CLLM_OK;
    if (root < 0 || root >= cllm_dist_group_size(g)) return CLLM_FAIL(CLLM_ERR_ARG, "root %d outside the group", root);
    if (bytes > (size_t)INT_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "a waiting broadcast of %zu bytes", bytes);
    MPI_Request r;
    MPI_TRY(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c, &r));
    if (cllm_dist_group_rank(g) == root) {
        MPI_TRY(MPI_Wait(&r, MPI_STATUS_IGNORE));
        return CLLM_OK;
    }
    /* poll: spin for a few milliseconds (back-to-back decode steps), then
     * sleep between tests so that an idle rank costs no CPU */
    double t0 = cllm_time_sec();
    long nap_ns = 0;
    for (;;) {
        int done = 0;
        MPI_TRY(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
        if (done) return CLLM_OK;
        if (cllm_time_sec() - t0 < 0.005) continue;
        nap_ns = nap_ns < 1000000 ? nap_ns + 20000 : 1000000;
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
    }
}

/* ------------------------------------------------------ point to point */

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request must fit a cllm_dist_req handle");

cllm_status cllm_dist_isend_f32(const float *buf, size_t n, int dest, int tag, cllm_dist_req *req) {
    req->active = false;
    if (!cllm_dist_active() || dest < 0 || dest >= w_size || dest == w_rank)
        return CLLM_FAIL(CLLM_ERR_ARG, "send from rank %d to rank %d in a world of %d", w_rank, dest, w_size);
    if (n > (size_t)INT_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "message of %zu floats exceeds MPI's int counts", n);
    MPI_Request r;
    MPI_TRY(MPI_Isend(buf, (int)n, MPI_FLOAT, dest, tag, MPI_COMM_WORLD, &r));
    req->handle = 0;
    memcpy(&req->handle, &r, sizeof r);
    req->active = true;
    return CLLM_OK;
}

cllm_status cllm_dist_recv_f32(float *buf, size_t n, int src, int tag) {
    if (!cllm_dist_active() || src < 0 || src >= w_size || src == w_rank)
        return CLLM_FAIL(CLLM_ERR_ARG, "receive on rank %d from rank %d in a world of %d", w_rank, src, w_size);
    if (n > (size_t)INT_MAX) return CLLM_FAIL(CLLM_ERR_ARG, "message of %zu floats exceeds MPI's int counts", n);
    MPI_Status s;
    MPI_TRY(MPI_Recv(buf, (int)n, MPI_FLOAT, src, tag, MPI_COMM_WORLD, &s));
    int got = 0;
    MPI_Get_count(&s, MPI_FLOAT, &got);
    if ((size_t)got != n)
        return CLLM_FAIL(CLLM_ERR_INTERNAL, "rank %d expected %zu floats from rank %d (tag %d), got %d", w_rank, n, src,
                         tag, got);
    return CLLM_OK;
}

cllm_status cllm_dist_send_wait(cllm_dist_req *req) {
    if (!req->active) return CLLM_OK;
    MPI_Request r;
    memcpy(&r, &req->handle, sizeof r);
    req->active = false;
    MPI_TRY(MPI_Wait(&r, MPI_STATUS_IGNORE));
    return CLLM_OK;
}

cllm_status cllm_dist_g_allreduce_max_f32(const cllm_dist_group *g, float *buf, size_t n) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) return CLLM_OK;
    while (n > 0) {
        int k = n > (size_t)INT_MAX ? INT_MAX : (int)n;
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf, k, MPI_FLOAT, MPI_MAX, c));
        buf += k;
        n -= (size_t)k;
    }
    return CLLM_OK;
}

/* ---------------------------------------------------------- all-to-all */

static uint64_t a2a_bytes;
static double a2a_seconds;

uint64_t cllm_dist_alltoallv_sent_bytes(void) { return a2a_bytes; }
double cllm_dist_alltoallv_seconds(void) { return a2a_seconds; }

cllm_status cllm_dist_g_alltoallv(const cllm_dist_group *g, const void *send, const size_t *scounts, void *recv,
                                  const size_t *rcounts) {
    MPI_Comm c = comm_of(g);
    if (c == MPI_COMM_NULL) {
        if (scounts[0] != rcounts[0])
            return CLLM_FAIL(CLLM_ERR_ARG, "all-to-all of one rank sends %zu bytes but receives %zu", scounts[0],
                             rcounts[0]);
        if (scounts[0]) memmove(recv, send, scounts[0]);
        return CLLM_OK;
    }
    int size = cllm_dist_group_size(g), me = cllm_dist_group_rank(g);
    int *ic = malloc(4 * (size_t)size * sizeof *ic);
    if (!ic) return CLLM_FAIL(CLLM_ERR_NOMEM, "out of memory");
    cllm_status st = g_counts(scounts, size, ic, ic + size, __func__);
    if (!st) st = g_counts(rcounts, size, ic + 2 * size, ic + 3 * size, __func__);
    double t0 = cllm_time_sec();
    int rc = st ? MPI_SUCCESS
                : MPI_Alltoallv(send, ic, ic + size, MPI_BYTE, recv, ic + 2 * size, ic + 3 * size, MPI_BYTE, c);
    a2a_seconds += cllm_time_sec() - t0;
    free(ic);
    if (!st && rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Alltoallv");
    if (!st)
        for (int q = 0; q < size; q++) a2a_bytes += q == me ? 0 : scounts[q];
    return st;
}
