# `cllm launch` (label: launch): hostfile, include/exclude and .cllm_env
# parsing in C (test_launch.c); the launcher's command lines through the
# binary, and runs over two network namespaces, are in launch_test.py.
cllm_add_c_test(test_launch LABELS launch)
# launch_test.py: `cli` checks printed mpirun commands and usage errors and
# runs 2 local ranks; `fail` hangs and kills ranks (collective timeout,
# checkpoint + resume); `netns` runs 2 ranks on two network namespaces over
# TCP (needs root: skipped with exit 77 otherwise). MPI runs: label mpi
# (see dist.cmake).
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case cli fail netns)
    cllm_add_py_test(launch_${case} launch_test.py LABELS launch mpi ARGS --case ${case})
    set_tests_properties(launch_${case} PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
  endforeach()
endif()
