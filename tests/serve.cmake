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
# serve_lora_test   cllm serve --lora-adapters: two PEFT adapters written by
#                   the test (different r, alpha, targets, patterns) on a tiny
#                   GPT-2: each request's greedy tokens equal cllm generate
#                   --adapter, alone and in a batch mixing the base and both
#                   adapters; OpenAI's model / TGI's adapter_id, 404
#                   model_not_found / 422, listings, metrics, bf16/int8/q4
#                   bases, start-up refusals naming file and tensor, and the
#                   `openai` npm client (tests/serve_lora_clients.mjs).
cllm_add_py_test(serve_lora_test serve_lora_test.py LABELS serve lora ARGS --fixtures ${CLLM_FIXTURES}/hf)
set_tests_properties(serve_lora_test PROPERTIES TIMEOUT 600)
# test_serve_pool   the pool-size rule against the free memory
#                   (cllm_server_fit_pool), on synthetic sizes.
cllm_add_c_test(test_serve_pool LABELS serve quick)
