# Chat templates (label: serve).
#   test_chat_template     syntax errors with line:column, raise_exception, the
#                          render bounds, load_dir on the fixture folders and on
#                          written ones, NULL/empty inputs, threads, and the
#                          training format's template against cllm_sample_parse
#                          (C, also under ASan)
#   chat_template_oracle   cllm vs Jinja2 (as transformers sets it up) and vs
#                          @huggingface/jinja on the fixture and public chat
#                          formats, and on the template a one-step `cllm train`
#                          writes, with generated conversations
cllm_add_c_test(test_chat_template LABELS serve ARGS ${CLLM_FIXTURES}/hf ${CMAKE_CURRENT_SOURCE_DIR}/data/chat_templates)

add_executable(chat_template_render ${CMAKE_CURRENT_SOURCE_DIR}/chat_template_render.c)
target_link_libraries(chat_template_render PRIVATE cllm)
target_compile_options(chat_template_render PRIVATE ${CLLM_WARNINGS})
target_compile_definitions(chat_template_render PRIVATE _POSIX_C_SOURCE=200809L)

cllm_add_py_test(chat_template_oracle chat_template_oracle.py LABELS serve
                 ARGS --driver $<TARGET_FILE:chat_template_render> --fixtures ${CLLM_FIXTURES}/hf)
set_tests_properties(chat_template_oracle PROPERTIES TIMEOUT 300)
