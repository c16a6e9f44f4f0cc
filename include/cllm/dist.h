/*
 * cllm dist: the collectives the trainer needs between data-parallel ranks.
 *
 * One process group (the world). Under mpirun the calls map onto MPI over
 * MPI_COMM_WORLD; in a build without MPI, or in a process that was not
 * started by an MPI launcher, the process is rank 0 of 1 and every
 * collective is the identity (a reduce-scatter copies, the others return at
 * once). Callers write the same code for both and never #ifdef.
 *
 * Buffers are split into rank parts with `counts` (one entry per rank, in
 * rank order, summing to the buffer length): rank r's part starts at
 * counts[0] + ... + counts[r-1]. Sums are element-wise; their order of
 * accumulation is MPI's, so results may differ from a one-process sum in the
 * last bits, but every rank receives the same values.
 *
 * Not thread-safe: call from one thread (the one that called init). Failures
 * of MPI calls return CLLM_ERR_INTERNAL with MPI's error string.
 */
#ifndef CLLM_DIST_H
#define CLLM_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the world: MPI_Init when the process was started by an MPI
 * launcher (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK set), otherwise
 * nothing (rank 0 of 1). Idempotent. */
cllm_status cllm_dist_init(void);
/* Leaves the world (MPI_Finalize if init started MPI). Idempotent. */
void cllm_dist_finalize(void);
/* Kills every rank (MPI_Abort) with exit code `code`; for front ends after a
 * failure on one rank, so that the others do not wait forever in a
 * collective. Without MPI it returns and the caller exits normally. */
void cllm_dist_abort(int code);

int cllm_dist_rank(void); /* 0 without MPI */
int cllm_dist_size(void); /* 1 without MPI */
/* True when this process runs under MPI with more than one rank. */
bool cllm_dist_active(void);
/* "MPI" when libcllm was built with MPI, "none" otherwise. */
const char *cllm_dist_backend(void);

/* In place: buf[n] <- sum over ranks of buf[n]. */
cllm_status cllm_dist_allreduce_sum_f32(float *buf, size_t n);
cllm_status cllm_dist_allreduce_sum_f64(double *buf, size_t n);
cllm_status cllm_dist_allreduce_sum_i64(int64_t *buf, size_t n);
cllm_status cllm_dist_allreduce_max_i64(int64_t *buf, size_t n);

/* send[sum(counts)] is split into rank parts; recv[counts[rank]] gets the
 * element-wise sum over ranks of this rank's part. send == recv reduces in
 * place (no second buffer): the input is the whole of recv[sum(counts)] and
 * the result lands at its start. Otherwise the buffers must not overlap.
 * Each count must fit in an int. */
cllm_status cllm_dist_reduce_scatter_sum_f32(const float *send, float *recv, const size_t *counts);

/* The same two sums with 16-bit values on the wire (DeepSpeed's
 * communication_data_type): each rank rounds its fp32 input to `wire`
 * (CLLM_BF16 or CLLM_F16, round to nearest even, fp16 overflow -> inf),
 * every partial sum of the reduction is rounded to `wire` again (a
 * user-defined MPI_Op on 16-bit words: widen, add in fp32, round), and the
 * result is widened back to fp32 into buf / recv. CLLM_F32 is the plain
 * fp32 call; other dtypes are CLLM_ERR_ARG. With one rank nothing is sent
 * and nothing is rounded. A temporary 16-bit copy of the buffer is
 * allocated per call. */
cllm_status cllm_dist_allreduce_sum_f32_as(float *buf, size_t n, cllm_dtype wire);
cllm_status cllm_dist_reduce_scatter_sum_f32_as(const float *send, float *recv, const size_t *counts,
                                                cllm_dtype wire);

/* In place: buf[sum(counts)] holds this rank's part at its offset; on
 * return every part holds its owner's values. */
cllm_status cllm_dist_allgather_f32(float *buf, const size_t *counts);

/* The same for bytes: buf[sum(bytes)], rank r's part bytes[r] long (ZeRO++'s
 * quantized parameter gather). */
cllm_status cllm_dist_allgather_bytes(void *buf, const size_t *bytes);
/* All-to-all of byte parts: send holds the part for rank r (send_bytes[r]
 * long) after those for ranks < r; recv receives rank r's part for this
 * rank (recv_bytes[r] long) in rank order (ZeRO++'s quantized gradient
 * reduction). One process: its own part is copied. */
cllm_status cllm_dist_alltoall_bytes(const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes);

/* all[size * n] <- the n values of every rank, rank by rank. */
cllm_status cllm_dist_allgather_u64(const uint64_t *mine, size_t n, uint64_t *all);

/* bytes of buf from rank `root` to every rank. */
cllm_status cllm_dist_bcast(void *buf, size_t bytes, int root);
cllm_status cllm_dist_barrier(void);

/* ---- nonblocking collectives (src/dist/async_mpi.c, async_none.c) ----
 * Started by the calling thread, which must not touch the buffer until
 * cllm_dist_wait returns. Other collectives may be called in between (the
 * order of all collective calls must be the same on every rank). With a
 * progress thread running (cllm_dist_progress_start: needs an MPI with
 * MPI_THREAD_MULTIPLE), the operations advance while the caller computes;
 * without one, only inside cllm_dist_test / cllm_dist_wait calls. Without
 * MPI or with one rank the operations complete at once (*req = NULL). */
typedef struct cllm_dist_request cllm_dist_request;

/* As cllm_dist_allgather_f32, nonblocking; counts are copied. */
cllm_status cllm_dist_iallgather_f32(float *buf, const size_t *counts, cllm_dist_request **req);
/* As cllm_dist_reduce_scatter_sum_f32 in place (result at buf's start). */
cllm_status cllm_dist_ireduce_scatter_sum_f32(float *buf, const size_t *counts, cllm_dist_request **req);
/* In place: buf[n] <- the sum over ranks, nonblocking (n <= INT_MAX). */
cllm_status cllm_dist_iallreduce_sum_f32(float *buf, size_t n, cllm_dist_request **req);
/* *done <- whether the operation has finished (advancing it). NULL: done. */
cllm_status cllm_dist_test(cllm_dist_request *req, bool *done);
/* Waits for the operation and frees req (NULL: nothing). *finished (may
 * be NULL) receives the cllm_time_sec() at which it was seen complete:
 * by the progress thread, or on return. */
cllm_status cllm_dist_wait(cllm_dist_request *req, double *finished);
/* Starts the progress thread; false (and nothing started) when MPI does not
 * provide MPI_THREAD_MULTIPLE, without MPI, or with one rank. */
bool cllm_dist_progress_start(void);
/* Stops and joins it (no operation may be outstanding). Idempotent. */
void cllm_dist_progress_stop(void);

/* ---- groups: the data, pipe and tensor groups of a topology ----
 * A group is a subset of the world with its own ranks 0..n-1. The world
 * collectives above are those of the group of every rank; the g_ ones run
 * over one group (NULL means the world). Creating a group is collective over
 * the WORLD: every rank calls it at the same point, each with the world ranks
 * of its own group (groups must partition the world; a rank's position in
 * `ranks` is its group rank). Without MPI, or with one rank, a group of one
 * behaves as the world does. */
typedef struct cllm_dist_group cllm_dist_group;
cllm_status cllm_dist_group_init(cllm_dist_group **out, const int *ranks, int n);
void cllm_dist_group_free(cllm_dist_group *g); /* NULL is a no-op */
int cllm_dist_group_rank(const cllm_dist_group *g);
int cllm_dist_group_size(const cllm_dist_group *g);

cllm_status cllm_dist_g_allreduce_sum_f32(const cllm_dist_group *g, float *buf, size_t n);
cllm_status cllm_dist_g_allreduce_sum_f64(const cllm_dist_group *g, double *buf, size_t n);
/* counts[group size]: as cllm_dist_reduce_scatter_sum_f32 / allgather_f32. */
cllm_status cllm_dist_g_reduce_scatter_sum_f32(const cllm_dist_group *g, const float *send, float *recv,
                                               const size_t *counts);
cllm_status cllm_dist_g_allgather_f32(const cllm_dist_group *g, float *buf, const size_t *counts);
/* As g_allgather_f32, but only group rank `root` receives the other parts. */
cllm_status cllm_dist_g_gather_f32(const cllm_dist_group *g, float *buf, const size_t *counts, int root);
/* root is a group rank. */
cllm_status cllm_dist_g_bcast(const cllm_dist_group *g, void *buf, size_t bytes, int root);
/* A broadcast (at most INT_MAX bytes) that the other ranks may wait in for
 * as long as root takes to send it (a rank following rank 0's commands
 * while a server idles): they poll, sleeping between polls after a few
 * milliseconds, so waiting costs no CPU. Group collectives have no
 * collective timeout; a root that dies is caught by the heartbeat. */
cllm_status cllm_dist_g_bcast_wait(const cllm_dist_group *g, void *buf, size_t bytes, int root);

/* ---- point to point (world ranks) ----
 * Sends are nonblocking: the buffer must stay untouched until
 * cllm_dist_send_wait on its request returns. Receives block until the message
 * (same tag, exactly n floats) has arrived. Messages between two ranks with
 * the same tag arrive in the order they were sent. */
typedef struct {
    uint64_t handle;
    bool active;
} cllm_dist_req;
cllm_status cllm_dist_isend_f32(const float *buf, size_t n, int dest, int tag, cllm_dist_req *req);
cllm_status cllm_dist_recv_f32(float *buf, size_t n, int src, int tag);
/* Completes a send; an inactive request returns at once. */
cllm_status cllm_dist_send_wait(cllm_dist_req *req);

/* Collective timeout, in seconds (default 600; the environment variable
 * CLLM_DIST_TIMEOUT, when set, wins). Every collective first waits until all
 * ranks have reached it; past the timeout the job ends with a message naming
 * the ranks that did not arrive and the operation (docs/distributed.md).
 * Takes effect at cllm_dist_init; values <= 0 restore the default. */
void cllm_dist_set_timeout(double seconds);
/* Heartbeat timeout, in seconds (default 30; the environment variable
 * CLLM_HEARTBEAT_TIMEOUT, when set, wins; 0 turns the heartbeat off; a
 * negative value restores the default). Under MPI with more than one rank, a
 * thread in every rank exchanges small pings with the others (rank 0 with
 * every rank, every rank with rank 0) on a communicator of their own; a rank
 * from which nothing arrives for this long (stopped, frozen, cut off from the
 * network) ends the job with a message naming it, its host and pid
 * (docs/reliability.md, "Dead and hung ranks"). The pings come from that
 * thread, not from the training loop, so a rank that is busy or slow in a
 * step of any length keeps answering. Takes effect at cllm_dist_init. */
void cllm_dist_set_heartbeat_timeout(double seconds);
/* The training step that the next collectives belong to, for those messages
 * (0: before the first step). */
void cllm_dist_set_step(long step);

/* In place over group g (NULL: the world): buf[n] <- element-wise maximum
 * over its ranks of buf[n]. Exact, so every rank gets the same bits. */
cllm_status cllm_dist_g_allreduce_max_f32(const cllm_dist_group *g, float *buf, size_t n);

/* All-to-all over group g (NULL: the world), in bytes: this rank sends
 * scounts[q] bytes to group rank q and receives rcounts[q] bytes from it,
 * parts back to back in group-rank order in send and recv (each count and
 * each buffer under INT_MAX bytes; the buffers must not overlap). With one
 * rank the own part is copied. Mixture-of-experts dispatch and combine
 * (src/model/moe_ep.c) run through it. */
cllm_status cllm_dist_g_alltoallv(const cllm_dist_group *g, const void *send, const size_t *scounts, void *recv,
                                  const size_t *rcounts);
/* Bytes this process has sent to other ranks through cllm_dist_g_alltoallv
 * (its own part excluded) and seconds spent in it, since the start. */
uint64_t cllm_dist_alltoallv_sent_bytes(void);
double cllm_dist_alltoallv_seconds(void);

#ifdef __cplusplus
}
#endif
#endif
