# Optimizer-state offload to a file (label: train): bit-identical to the
# in-memory optimizer for AdamW, Lion and SGD with momentum over several
# buffer sizes, checkpoints written from and resumed into the offloaded
# state, and errors for bad nvme_path / buffer settings.
foreach(case equal checkpoint errors)
  cllm_add_py_test(offload_${case} offload_test.py LABELS train ARGS --case ${case})
  set_tests_properties(offload_${case} PROPERTIES TIMEOUT 120)
endforeach()
