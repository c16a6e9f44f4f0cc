/* Tasks of an srun step that cannot form one job (src/dist/srun.h). */
#include <stdlib.h>
#include <string.h>

#include "dist/srun.h"

cllm_status dist_srun_check(bool have_mpi) {
    const char *rank = getenv("SLURM_PROCID"), *tasks = getenv("SLURM_STEP_NUM_TASKS");
    char *end = NULL;
    long n = tasks ? strtol(tasks, &end, 10) : 0;
    /* not an srun task (a batch script has SLURM_PROCID but no step tasks),
     * one task alone, or a rank that mpirun started (its variables win) */
    if (!rank || !tasks || end == tasks || *end || n <= 1 || getenv("OMPI_COMM_WORLD_SIZE")) return CLLM_OK;
    if (!have_mpi)
        return CLLM_FAIL(CLLM_ERR_ARG,
                         "srun started %ld tasks of a cllm built without MPI: each would train alone. Build with "
                         "OpenMPI (libopenmpi-dev) or run one task",
                         n);
    if (getenv("PMIX_RANK")) return CLLM_OK;
    const char *how = getenv("PMI_FD") || getenv("PMI_RANK") ? "PMI-2 (srun --mpi=pmi2)"
                                                              : "no process-management interface (srun --mpi=none)";
    return CLLM_FAIL(CLLM_ERR_ARG,
                     "task %s of %ld started by srun with %s: OpenMPI finds its ranks only through PMIx. Run "
                     "`srun --mpi=pmix ...` (or set MpiDefault=pmix in slurm.conf, or SLURM_MPI_TYPE=pmix), or "
                     "`cllm launch -- ...` inside the allocation (docs/distributed.md#slurm)",
                     rank, n, how);
}
