/*
 * Private to src/dist: the collective watchdog and the heartbeat, shared by
 * dist_mpi.c, watchdog_mpi.c (the arrival protocol, MPI builds only),
 * heartbeat_mpi.c (liveness pings, MPI builds only) and watch.c (the
 * settings, every build). See docs/distributed.md, "Failures and timeouts",
 * and docs/reliability.md, "Dead and hung ranks".
 */
#ifndef CLLM_DIST_WATCHDOG_H
#define CLLM_DIST_WATCHDOG_H

#include <stddef.h>

#include "cllm/core.h"

/* watch.c: the timeout in seconds (CLLM_DIST_TIMEOUT, else the value of
 * cllm_dist_set_timeout, else 600) and the step set by cllm_dist_set_step. */
double dist_watch_timeout(void);
long dist_watch_step(void);
/* watch.c: the heartbeat timeout in seconds (CLLM_HEARTBEAT_TIMEOUT, else
 * the value of cllm_dist_set_heartbeat_timeout, else 30); 0 = off. */
double dist_heartbeat_timeout(void);
/* Fails when CLLM_DIST_TIMEOUT is set but not a number of seconds > 0, or
 * CLLM_HEARTBEAT_TIMEOUT is set but not a number of seconds >= 0. */
cllm_status dist_watch_check_env(void);

/* watchdog_mpi.c. init after MPI_Init (world rank and size known; starts the
 * watchdog thread when size > 1), finalize before MPI_Finalize. */
cllm_status dist_watch_init(int rank, int size);
void dist_watch_finalize(void);
/* Before a collective: counts it, tells rank 0 this rank arrived and waits
 * until every rank has (rank 0) or until rank 0 has (other ranks). On
 * timeout prints which ranks did not arrive and ends the job (MPI_Abort);
 * does not return then. `what` is e.g. "allreduce", `n` and `unit` its size
 * ("floats"). */
cllm_status dist_watch_enter(const char *what, size_t n, const char *unit);
/* After the collective returned. */
void dist_watch_leave(void);

/* watchdog_mpi.c: MPI_Abort on the world, and _exit(1) if it has not ended
 * this process within DIST_ABORT_GRACE_S seconds: an abort must reach the
 * launcher, and one cut off by the network never answers. Does not return. */
#define DIST_ABORT_GRACE_S 10
_Noreturn void dist_abort_job(int rank);

/* heartbeat_mpi.c. init after MPI_Init and dist_watch_init (collective over
 * the world: duplicates it and gathers each rank's host name and pid);
 * starts the heartbeat thread when size > 1, the timeout is > 0 and MPI
 * provides MPI_THREAD_MULTIPLE (otherwise rank 0 says why there is none).
 * finalize before MPI_Finalize: says goodbye to the watching ranks, stops
 * and joins the thread. */
cllm_status dist_heartbeat_init(int rank, int size);
void dist_heartbeat_finalize(void);

#endif
