# End-to-end model tests against the PyTorch references in tests/ref/.
# selfcheck_hf_models checks the references themselves (no cllm needed);
# test_model_vs_torch runs `cllm grad` / `cllm train` on tiny models.
cllm_add_py_test(selfcheck_hf_models ref/selfcheck_hf_models.py LABELS model)
cllm_add_py_test(test_model_vs_torch test_model_vs_torch.py LABELS model)
cllm_add_c_test(test_split LABELS model)
cllm_add_py_test(split_convert split_test.py LABELS model)
cllm_add_c_test(test_stage LABELS model)
cllm_add_py_test(test_mixtral_vs_torch test_mixtral_vs_torch.py LABELS model)
# folders, values and adapters written by transformers 5.17 and PEFT 0.21 themselves
cllm_add_py_test(transformers_fixtures transformers_test.py LABELS model)
# transformers 5.x's fused expert tensors: loaded, written and converted bit for bit
cllm_add_py_test(moe_layout moe_layout_test.py LABELS model)
# again on the portable kernels (the windowed attention, SwiGLU) and oneDNN capped at AVX2
cllm_add_py_fallback(test_mixtral_vs_torch test_mixtral_vs_torch.py LABELS model)
# Mixtral under mpirun: ZeRO-3 over 2 ranks against one accumulating process
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(test_mixtral_dp test_mixtral_vs_torch.py LABELS mpi ARGS --case dp)
  set_tests_properties(test_mixtral_dp PROPERTIES TIMEOUT 300)
endif()
# Mixture-of-experts capacity (one process) and expert parallelism over 2 and 4 ranks
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(test_moe_ep test_moe_ep.py LABELS mpi)
  set_tests_properties(test_moe_ep PROPERTIES TIMEOUT 300)
endif()
# Weights apart from run state: two runs over one cllm_weights on two threads
# against a model owning the same weights (losses, logits, LoRA gradients bit
# for bit), the weights' checksum unchanged, no copy per run, refusals
cllm_add_c_test(test_shared_weights LABELS model)
set_tests_properties(test_shared_weights PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
