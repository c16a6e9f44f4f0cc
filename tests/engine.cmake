# Continuous batching (cllm/engine.h) against each request run alone.
cllm_add_c_test(test_engine LABELS generate)
