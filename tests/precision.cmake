# Mixed-precision compute (bf16, emulated fp16) against PyTorch fp32 and
# bf16 autocast, and bf16 vs fp32 training quality over 200 steps.
cllm_add_py_test(precision_compute precision_test.py LABELS precision model ARGS --part compute)
cllm_add_py_test(precision_train precision_test.py LABELS precision model ARGS --part train)
# The same with the portable paths forced: bf16 on the widened fp32 GEMM
# must meet the same tolerances as oneDNN's native bf16 kernels.
cllm_add_py_fallback(precision_compute precision_test.py LABELS precision model ARGS --part compute)
cllm_add_py_fallback(precision_train precision_test.py LABELS precision model ARGS --part train)
