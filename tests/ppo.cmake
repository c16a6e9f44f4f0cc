# PPO tests (label train): `cllm train --task ppo` against a float64 torch
# implementation of trl's PPOTrainer formulas on tiny gpt2, llama and bloom
# policies with a value head, from fixed rollouts (losses); generated
# rollouts scored by a reward model (generate); bad rollouts, keys and
# values named (errors); LoRA with the base as reference, kl_penalty "full"
# included (lora); kl_penalty variants, score scaling/norm/clip and the ppo
# section's config hash (shaping); cllm estimate --task ppo against peak RSS,
# at ZeRO 3 with the sampling copy (estimate).
foreach(case losses generate lora errors shaping)
  cllm_add_py_test(ppo_${case} ppo_test.py LABELS train ARGS --case ${case})
  set_tests_properties(ppo_${case} PROPERTIES TIMEOUT 300)
endforeach()
# peak RSS means nothing under a sanitizer's shadow memory: not in those builds
if(NOT CLLM_SANITIZE)
  cllm_add_py_test(ppo_estimate ppo_test.py LABELS model ARGS --case estimate)
  set_tests_properties(ppo_estimate PROPERTIES TIMEOUT 300 LABELS "model;nosan")
endif()
# data parallelism (label mpi): 2 ranks at ZeRO 1, 2 and 3 against torch
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(ppo_mpi ppo_test.py LABELS mpi ARGS --case mpi)
  set_tests_properties(ppo_mpi PROPERTIES TIMEOUT 300)
  # generated rollouts at ZeRO 3 (parameters gathered for sampling) = ZeRO 1
  cllm_add_py_test(ppo_mpi_generate ppo_test.py LABELS mpi ARGS --case mpi_generate)
  set_tests_properties(ppo_mpi_generate PROPERTIES TIMEOUT 300)
endif()
