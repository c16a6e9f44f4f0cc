# DPO tests (label train): `cllm train --task dpo` against a float64 torch
# implementation of trl's losses on tiny gpt2, llama and bloom models
# (losses), text records against their pre-tokenized form (text), bad
# preference records naming FILE:LINE (errors), resume and held-out
# evaluation (eval_loss, trl's eval_rewards/*, eval_logps/*) (resume),
# precompute_ref_log_probs and LoRA's base reference (precompute).
foreach(case losses text errors resume precompute)
  cllm_add_py_test(dpo_${case} dpo_test.py LABELS train ARGS --case ${case} --fixtures ${CLLM_FIXTURES}/hf)
  set_tests_properties(dpo_${case} PROPERTIES TIMEOUT 300)
endforeach()
# data parallelism (label mpi): 2 ranks at ZeRO 1 and 3 against one process
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  cllm_add_py_test(dpo_mpi dpo_test.py LABELS mpi ARGS --case mpi)
  set_tests_properties(dpo_mpi PROPERTIES TIMEOUT 300)
endif()
# conversational preference records (message lists) against Jinja2 + trl's
# apply_chat_template rules: token ids, DPO and reward training, errors
cllm_add_py_test(dpo_chat dpo_chat_test.py LABELS train ARGS --fixtures ${CLLM_FIXTURES}/hf)
set_tests_properties(dpo_chat PROPERTIES TIMEOUT 300)
