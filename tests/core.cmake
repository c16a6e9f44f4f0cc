cllm_add_c_test(test_core LABELS core)
cllm_add_c_test(test_headers LABELS core)
cllm_add_c_test(test_model LABELS model)
