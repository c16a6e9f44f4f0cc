# Tokenizer tests (label: tokenizer).
#   test_tokenizer    fixed expectations: llama.cpp vectors, oracle-samples.json,
#                     edge cases and broken files (C, also run under ASan/UBSan)
#   tokenizer_cli     the cllm tokenize/detokenize commands: format, exit codes
#   tokenizer_oracle  cllm vs transformers.js on a generated multilingual corpus
#                     (installs the oracle with npm ci into build/oracle)
cllm_add_c_test(test_tokenizer LABELS tokenizer ARGS ${CLLM_FIXTURES}/hf)

add_executable(tokenizer_batch ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_batch.c)
target_link_libraries(tokenizer_batch PRIVATE cllm)
target_compile_options(tokenizer_batch PRIVATE ${CLLM_WARNINGS})
target_compile_definitions(tokenizer_batch PRIVATE _POSIX_C_SOURCE=200809L)

cllm_add_py_test(tokenizer_cli tokenizer_oracle.py LABELS tokenizer
                 ARGS --mode cli --fixtures ${CLLM_FIXTURES}/hf)
cllm_add_py_test(tokenizer_oracle tokenizer_oracle.py LABELS tokenizer
                 ARGS --mode oracle --fixtures ${CLLM_FIXTURES}/hf --batch $<TARGET_FILE:tokenizer_batch>
                      --oracle-tools ${CLLM_FIXTURES}/../tools)
set_tests_properties(tokenizer_oracle PROPERTIES TIMEOUT 300)

# Throughput benchmark (not a test): tokenizer_bench <model dir> <text> [chunk] [repeats]
add_executable(tokenizer_bench ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_bench.c)
target_link_libraries(tokenizer_bench PRIVATE cllm)
target_compile_options(tokenizer_bench PRIVATE ${CLLM_WARNINGS})
target_compile_definitions(tokenizer_bench PRIVATE _POSIX_C_SOURCE=200809L)
