# The HTTP server (label: serve).
#   serve_test   cllm serve end to end on a tiny GPT-2 with the real GPT-2
#                tokenizer: TGI and OpenAI routes against cllm generate and each
#                other, every error status, disconnects, stalled clients,
#                SIGTERM, 16 concurrent requests equal to each alone, a
#                200-request mixed load test with the memory back to its
#                baseline, and the npm clients `openai` and
#                `@huggingface/inference` (tests/serve_clients.mjs, pinned in
#                tests/npm). Also run by the ASan/UBSan build (leaks checked
#                at exit of the server).
cllm_add_py_test(serve_test serve_test.py LABELS serve ARGS --fixtures ${CLLM_FIXTURES}/hf)
set_tests_properties(serve_test PROPERTIES TIMEOUT 600)
