# The per-token loss interface (token losses out, token gradient scales in)
# that training objectives build on, and the language-modelling objective.
cllm_add_c_test(test_objective LABELS model train)
