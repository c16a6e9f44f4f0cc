# Data pipeline tests (label data): formats, templates, masks, bad records,
# loader sampling and blends in C; `cllm data prepare` read back by an
# independent MMIDIDX reader, and train/eval on prepared, raw and blended
# data, in Python.
cllm_add_c_test(test_data LABELS data
                ARGS ${CLLM_FIXTURES}/hf ${CMAKE_CURRENT_SOURCE_DIR}/data ${PROJECT_BINARY_DIR}/test_data_tmp)
cllm_add_py_test(data_prepare data_prepare.py LABELS data
                 ARGS --fixtures ${CLLM_FIXTURES}/hf --data ${CMAKE_CURRENT_SOURCE_DIR}/data)

# Preference pairs through the loader: pairs kept whole by shuffles and splits.
cllm_add_c_test(test_pairs LABELS data ARGS ${PROJECT_BINARY_DIR}/test_pairs_tmp)
