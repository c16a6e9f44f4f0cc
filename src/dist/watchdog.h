/*
 * Private to src/dist: the collective watchdog shared by dist_mpi.c,
 * watchdog_mpi.c (the arrival protocol, MPI builds only) and watch.c (the
 * settings, every build). See docs/distributed.md, "Failures and timeouts".
 */
#ifndef CLLM_DIST_WATCHDOG_H
#define CLLM_DIST_WATCHDOG_H

#include <stddef.h>

#include "cllm/core.h"

/* watch.c: the timeout in seconds (CLLM_DIST_TIMEOUT, else the value of
 * cllm_dist_set_timeout, else 600) and the step set by cllm_dist_set_step. */
double dist_watch_timeout(void);
long dist_watch_step(void);
/* Fails when CLLM_DIST_TIMEOUT is set but not a number of seconds > 0. */
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

#endif
