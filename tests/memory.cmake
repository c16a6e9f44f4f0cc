# Memory estimates (label: model): `cllm estimate` totals within 10% of the
# peak RSS of short `cllm train` runs (gpt2/llama/bloom, B, T, optimizers,
# checkpointing), with the process overhead measured on a tiny model.
# Sanitizer builds keep only the exact activation-bytes check: shadow
# memory and the allocation quarantine are not what the estimate models.
if(CLLM_SANITIZE)
  cllm_add_py_test(memory_estimate memory_test.py LABELS model ARGS --no-rss)
else()
  cllm_add_py_test(memory_estimate memory_test.py LABELS model)
endif()
# nine short training runs: about 70-100 s under ASan+UBSan on an idle
# 2-core machine, slower when it is shared
if(CLLM_SANITIZE)
  set_tests_properties(memory_estimate PROPERTIES TIMEOUT 400)
else()
  set_tests_properties(memory_estimate PROPERTIES TIMEOUT 180)
endif()
# The same for pipeline and tensor ranks under mpirun (per-rank peak RSS);
# nosan: a sanitizer's shadow memory makes RSS meaningless.
find_program(CLLM_MPIRUN_MEM mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN_MEM)
  cllm_add_py_test(memory_parallel memory_parallel_test.py LABELS mpi nosan)
  set_tests_properties(memory_parallel PROPERTIES TIMEOUT 240)
endif()
# cllm_matmul_workspace against the peak RSS rise of single GEMMs
# (label kernel). Not under sanitizers: shadow memory is resident too.
if(NOT CLLM_SANITIZE)
  cllm_add_c_test(test_gemm_work LABELS kernel)
endif()
