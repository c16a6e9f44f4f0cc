# `cllm launch` (label: launch): hostfile, include/exclude and .cllm_env
# parsing in C (test_launch.c); the launcher's command lines through the
# binary, and runs over two network namespaces, are in launch_test.py.
cllm_add_c_test(test_launch LABELS launch)
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
