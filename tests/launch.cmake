# `cllm launch` (label: launch): hostfile, include/exclude and .cllm_env
# parsing in C (test_launch.c); the launcher's command lines through the
# binary, and runs over two network namespaces, are in launch_test.py.
cllm_add_c_test(test_launch LABELS launch)
# test_launch_slurm.c: Slurm's host lists (node[01-03,07]) and counts
# (2(x3),1) expanded, malformed values named in errors.
cllm_add_c_test(test_launch_slurm LABELS launch)
# launch_test.py: `cli` checks printed mpirun commands and usage errors and
# runs 2 local ranks; `fail` hangs and kills ranks (collective timeout,
# checkpoint + resume); `netns` runs 2 ranks on two network namespaces over
# TCP, and `partition` cuts that link mid-run (both need root: skipped with
# exit 77 otherwise). MPI runs: label mpi
# (see dist.cmake).
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case cli fail netns partition)
    cllm_add_py_test(launch_${case} launch_test.py LABELS launch mpi ARGS --case ${case})
    set_tests_properties(launch_${case} PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
  endforeach()
endif()
# heartbeat_test.py: a rank stopped with SIGSTOP (of 2, and of 4) ends the
# job within the heartbeat limit, named, with the last checkpoint resumable;
# a rank asleep inside a step past the limit does not; `settings` checks the
# config key, flags and variable.
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case stop2 stop4 slow settings)
    cllm_add_py_test(heartbeat_${case} heartbeat_test.py LABELS launch mpi ARGS --case ${case})
    set_tests_properties(heartbeat_${case} PROPERTIES TIMEOUT 180)
  endforeach()
endif()
# slurm_test.py: `cli` checks the mpirun commands `cllm launch` builds from a
# Slurm allocation's variables (set by hand) and their errors; `cluster`
# starts a one-node Slurm (slurmctld + slurmd, private slurm.conf) and runs
# salloc + cllm launch, sbatch + srun --mpi=pmix, and srun without PMIx
# (refused). `cluster` needs root and Slurm: skipped with exit 77 otherwise.
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case cli cluster)
    cllm_add_py_test(slurm_${case} slurm_test.py LABELS launch mpi ARGS --case ${case})
    set_tests_properties(slurm_${case} PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
  endforeach()
endif()
