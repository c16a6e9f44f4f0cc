# Reward-model tests (label train): `cllm train --task reward` and `cllm
# score` against a float64 torch implementation of trl's RewardTrainer on
# tiny gpt2, llama and bloom *ForSequenceClassification models (losses),
# learning a separable preference from a causal LM and scoring it (learn),
# resume (resume), bad models and records (errors), preference pairs through
# `cllm data prepare --pairs` (prepared).
foreach(case losses learn resume errors prepared)
  cllm_add_py_test(reward_${case} reward_test.py LABELS train ARGS --case ${case} --fixtures ${CLLM_FIXTURES}/hf)
  set_tests_properties(reward_${case} PROPERTIES TIMEOUT 300)
endforeach()
# LoRA on a reward model (PEFT's task_type SEQ_CLS, labels lora train): one
# SGD step's loss and every lora_A / lora_B / score.weight gradient against
# float64 torch on tiny gpt2, llama and bloom (grads), learning from a causal
# LM, score --adapter = lora merge = torch (learn), exact resume (resume),
# PPO with a reward adapter folder as --reward-model (ppo), refusals (errors).
foreach(case grads learn resume ppo errors)
  cllm_add_py_test(reward_lora_${case} reward_lora_test.py LABELS lora train ARGS --case ${case})
  set_tests_properties(reward_lora_${case} PROPERTIES TIMEOUT 300)
endforeach()
# data parallelism (label mpi): 2 ranks at ZeRO 1 and 3 against one process
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(reward_mpi reward_test.py LABELS mpi ARGS --case mpi)
  set_tests_properties(reward_mpi PROPERTIES TIMEOUT 300)
endif()
