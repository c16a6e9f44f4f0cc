# GGML block formats (label: generate): Q4_0 / Q8_0 codes by hand and
# their error bounds on random rows.
cllm_add_c_test(test_ggml_blocks LABELS generate)
# GGUF export (label: generate).
#   gguf_test   `cllm convert --to gguf` of tiny LLaMA (TinyLlama tokenizer,
#               GQA; tied head with biases), GPT-2 and BLOOM (GPT-2 tokenizer)
#               models, f32, f16, q8_0 and q4_0: the file read back by an independent
#               reader (header, keys, tensor infos, alignment, every tensor's
#               data against the safetensors as llama.cpp's converter lays it
#               out), then run by llama.cpp (node-llama-cpp, pinned in
#               tests/npm-llama): the same tokenization as `cllm tokenize`
#               and the same 16 greedy tokens as `cllm generate --greedy`.
#               Labelled nosan: it runs in the Release pass only (the export is
#               plain C the C tests cover under the sanitizers, and the llama.cpp
#               package is a 700 MB install per build folder).
cllm_add_py_test(gguf_test gguf_test.py LABELS generate nosan ARGS --fixtures ${CLLM_FIXTURES}/hf)
set_tests_properties(gguf_test PROPERTIES TIMEOUT 1200)
