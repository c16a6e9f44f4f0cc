cllm_add_c_test(test_core LABELS core)
