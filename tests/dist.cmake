# Data-parallel and ZeRO tests (label: mpi): `cllm train` under mpirun with
# 2 and 4 ranks against the one-process run (dist_test.py). Registered only
# when libcllm was built on MPI and mpirun is installed. Each mpirun runs
# under `timeout` inside the script, so a stuck collective fails the test
# instead of hanging it. Every mpi-labelled test also runs in the sanitizer
# pass, with leak detection off (tests/CMakeLists.txt): OpenMPI keeps memory
# from MPI_Init until exit in plugins it unloads, which LeakSanitizer can
# neither attribute nor suppress.
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case llama bloom zero3 errors commtype bf16 fp16 zeropp)
    cllm_add_py_test(dist_${case} dist_test.py LABELS mpi ARGS --case ${case})
    set_tests_properties(dist_${case} PROPERTIES TIMEOUT 300)
  endforeach()
  # pipeline parallelism (pipe_test.py): equivalence per family, and errors
  foreach(case llama llama-tied bloom gpt2 errors ckpt zero2 zero3)
    cllm_add_py_test(pipe_${case} pipe_test.py LABELS mpi ARGS --case ${case})
    set_tests_properties(pipe_${case} PROPERTIES TIMEOUT 180)
  endforeach()
  # tensor parallelism (tp_test.py): equivalence per family, and errors
  foreach(case llama bloom gpt2 errors ckpt vocab zero)
    cllm_add_py_test(tp_${case} tp_test.py LABELS mpi ARGS --case ${case})
    set_tests_properties(tp_${case} PROPERTIES TIMEOUT 180)
  endforeach()
  # sequence parallelism over the tensor ranks (seqpar_test.py): equivalence
  # per family, checkpoints across it, refusals, activation memory
  foreach(case gpt2 llama bloom ckpt errors memory)
    cllm_add_py_test(seqpar_${case} seqpar_test.py LABELS mpi ARGS --case ${case})
    set_tests_properties(seqpar_${case} PROPERTIES TIMEOUT 180)
  endforeach()
  # tensor-parallel inference (tp_infer_test.py): generate and serve against one process
  cllm_add_py_test(tp_infer_generate tp_infer_test.py LABELS mpi generate ARGS --case generate)
  cllm_add_py_test(tp_infer_weights tp_infer_test.py LABELS mpi generate ARGS --case weights)
  cllm_add_py_test(tp_infer_serve tp_infer_test.py LABELS mpi serve ARGS --case serve --fixtures ${CLLM_FIXTURES}/hf)
  set_tests_properties(tp_infer_generate tp_infer_weights tp_infer_serve PROPERTIES TIMEOUT 180)
endif()
