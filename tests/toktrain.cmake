# Tokenizer training, extension and vocabulary resizing (label: tokenizer).
#   test_toktrain    library: sizes, special ids, round trips, determinism,
#                    extension keeps ids, resize keeps rows (also under ASan)
#   toktrain_oracle  the cllm tokenizer/model commands end to end, the trained
#                    and extended files checked against transformers.js, and
#                    `cllm eval` on ids in the grown range
cllm_add_c_test(test_toktrain LABELS tokenizer)
cllm_add_py_test(toktrain_oracle toktrain_oracle.py LABELS tokenizer
                 ARGS --fixtures ${CLLM_FIXTURES}/hf --batch $<TARGET_FILE:tokenizer_batch>
                      --oracle-tools ${CLLM_FIXTURES}/../tools)
set_tests_properties(toktrain_oracle PROPERTIES TIMEOUT 300)
# both oracle tests install into build/oracle: never run them at the same time
set_tests_properties(toktrain_oracle tokenizer_oracle PROPERTIES RESOURCE_LOCK cllm_oracle_install)
