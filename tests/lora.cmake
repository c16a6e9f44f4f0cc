# LoRA tests: `cllm grad --adapter`, `cllm train` with adapters, resume,
# merge and generation against an independent float64 torch LoRA on tiny
# gpt2, llama and bloom models (label lora); 2 ranks at ZeRO 1-2 (label mpi).
cllm_add_py_test(lora lora_test.py LABELS lora train)
set_tests_properties(lora PROPERTIES TIMEOUT 300)
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(lora_mpi lora_test.py LABELS mpi ARGS --case mpi)
  set_tests_properties(lora_mpi PROPERTIES TIMEOUT 300)
endif()
cllm_add_c_test(test_trainable LABELS model train)
# Frozen tensors by name ("freeze"): the trained tensors' gradients equal full
# training's, frozen tensors unchanged by an update, bad patterns named
cllm_add_c_test(test_freeze LABELS model train)
# `cllm train --freeze`: SGD against torch with requires_grad off, exact
# resume, the checkpoint's tensors, `cllm estimate --freeze`, errors
cllm_add_py_test(freeze freeze_test.py LABELS train)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(freeze_mpi freeze_test.py LABELS mpi ARGS --case mpi)
  set_tests_properties(freeze_mpi PROPERTIES TIMEOUT 300)
endif()
