# Weight formats and their small-batch kernels (cllm/quant.h): the C checks,
# the PyTorch reference (stored bytes and outputs through every variant the
# CPU runs), and both again with the portable paths forced.
cllm_add_c_test(test_quant LABELS kernel)
cllm_add_py_test(test_quant_torch ref/quant_ref.py LABELS kernel)
cllm_add_c_fallback(test_quant LABELS kernel)
cllm_add_py_fallback(test_quant_torch ref/quant_ref.py LABELS kernel)
# The formats inside the three model families (cllm_model_set_weights).
cllm_add_c_test(test_quant_model LABELS model kernel)
cllm_add_c_fallback(test_quant_model LABELS model kernel)
# --weights for generate and eval, convert --quantize, bad input.
cllm_add_py_test(quant_cli quant_cli.py LABELS generate cli ARGS --fixtures ${CLLM_FIXTURES}/hf)
