# Activation checkpointing (label: model): `cllm grad --grad-ckpt` and
# `cllm train --grad-ckpt` give byte-identical gradients and models on tiny
# gpt2/llama/bloom; the activation buffer shrinks by the per-block part;
# use_grad_ckpt and DeepSpeed's activation_checkpointing turn it on.
foreach(case grad train bytes config)
  cllm_add_py_test(ckpt_${case} ckpt_test.py LABELS model ARGS --case ${case})
  set_tests_properties(ckpt_${case} PROPERTIES TIMEOUT 120)
endforeach()
cllm_add_c_test(test_ckpt LABELS model)
