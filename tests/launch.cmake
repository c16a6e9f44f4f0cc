# `cllm launch` (label: launch): hostfile, include/exclude and .cllm_env
# parsing in C (test_launch.c); the launcher's command lines through the
# binary, and runs over two network namespaces, are in launch_test.py.
cllm_add_c_test(test_launch LABELS launch)
