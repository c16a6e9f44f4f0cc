# Memory estimates (label: model): `cllm estimate` totals within 10% of the
# peak RSS of short `cllm train` runs (gpt2/llama/bloom, B, T, optimizers,
# checkpointing), with the process overhead measured on a tiny model.
cllm_add_py_test(memory_estimate memory_test.py LABELS model)
set_tests_properties(memory_estimate PROPERTIES TIMEOUT 120)
