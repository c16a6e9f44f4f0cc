# Causal attention (forward/backward, GQA, ALiBi) and ALiBi slopes: a naive
# float64 check in C, and the PyTorch comparison for the three model layouts.
cllm_add_c_test(test_attention LABELS kernel)
cllm_add_py_test(test_attention_torch ref/attention_ref.py LABELS kernel)
