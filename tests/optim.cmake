cllm_add_c_test(test_optim LABELS optim)
cllm_add_py_test(test_optim_vs_torch ref/optim_ref.py LABELS optim)
