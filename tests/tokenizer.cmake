# Tokenizer tests (label: tokenizer). test_tokenizer checks fixed
# expectations (llama.cpp vectors, oracle-samples.json, edge cases);
# tokenizer_oracle compares cllm with transformers.js on a generated corpus.
cllm_add_c_test(test_tokenizer LABELS tokenizer ARGS ${CLLM_FIXTURES}/hf)
