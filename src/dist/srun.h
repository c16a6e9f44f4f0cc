/*
 * Tasks started by Slurm's srun (private to src/dist/). srun starts every
 * task itself; OpenMPI's ranks find each other only through the PMIx server
 * of `srun --mpi=pmix` (Debian's OpenMPI 4.1 has no PMI-1/PMI-2 support).
 * Without it each task would train alone as rank 0 of 1 on the same output
 * folder, so such a start is refused with the fix in the message.
 */
#ifndef CLLM_DIST_SRUN_H
#define CLLM_DIST_SRUN_H

#include <stdbool.h>

#include "cllm/core.h"

/* CLLM_OK unless this process is one of several tasks of an srun step that
 * it cannot join: no PMIx (srun --mpi=none or --mpi=pmi2), or `have_mpi`
 * false (a build without MPI). */
cllm_status dist_srun_check(bool have_mpi);

#endif
