cllm_add_c_test(test_io LABELS io)
