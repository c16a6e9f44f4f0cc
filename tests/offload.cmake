# Optimizer-state offload to a file (label: train): bit-identical to the
# in-memory optimizer for AdamW, Lion and SGD with momentum over several
# buffer sizes, checkpoints written from and resumed into the offloaded
# state, and errors for bad nvme_path / buffer settings.
foreach(case equal checkpoint errors)
  cllm_add_py_test(offload_${case} offload_test.py LABELS train ARGS --case ${case})
  set_tests_properties(offload_${case} PROPERTIES TIMEOUT 120)
endforeach()
# the same under mpirun (ZeRO-2 slices, with fp16 loss scaling), and ZeRO-3
# parameter slices in files (offload_param, 1 and 2 ranks); label mpi as
# the other mpirun tests
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case dp params)
    cllm_add_py_test(offload_${case} offload_test.py LABELS train mpi ARGS --case ${case})
    set_tests_properties(offload_${case} PROPERTIES TIMEOUT 180)
  endforeach()
endif()
