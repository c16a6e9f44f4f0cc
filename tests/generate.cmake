# Generation (label: generate).
#   test_generate        KV-cache forward vs the full forward for gpt2/llama/bloom
#                        (GQA, MQA, non-power-of-two ALiBi), cached attention vs a
#                        float64 reference, sampler distributions, streaming
#                        detokenization (C, also run under ASan/UBSan)
#   test_decode          the library decode loop (cllm_generation): tokens and
#                        log-probs against a plain cache loop, EOS lists, length,
#                        context limit, cancel, stop strings with hold-back on real
#                        tokenizers, bad arguments (C, also run under ASan/UBSan)
#   test_sampler         sampler refusals (every bad value named), zero-valued new
#                        fields change nothing, top-n bounds (C, also under ASan)
#   sampler_torch        logit bias, frequency/presence penalties (generated tokens
#                        only), typical-p with every other processor: distributions
#                        against a PyTorch implementation of the definitions
#                        (1e-6), top-n against torch.topk of log_softmax, seeded
#                        draws (runs test_sampler on the cases it writes)
#   generate_torch       greedy continuations of tiny random models compared token
#                        by token with a plain-PyTorch reference of each family
#   generate_cli         the cllm generate command: streamed UTF-8 text, EOS,
#                        context limit, error paths and exit codes
#   generate_sampling_cli  cllm generate --top-n / --frequency-penalty /
#                        --presence-penalty / --logit-bias / --typical-p against a
#                        float64 PyTorch forward of the same weights; usage errors
#   generate_stop_cli    cllm generate --stop: output cut before the first stop
#                        string of the same run's text, usage errors
cllm_add_c_test(test_generate LABELS generate ARGS ${CLLM_FIXTURES}/hf)
cllm_add_c_test(test_decode LABELS generate ARGS ${CLLM_FIXTURES}/hf)
cllm_add_c_test(test_sampler LABELS generate)
cllm_add_py_test(sampler_torch ref/sampler_ref.py LABELS generate)
cllm_add_py_test(generate_torch ref/generate_ref.py LABELS generate)
cllm_add_py_test(generate_cli generate_cli.py LABELS generate cli ARGS --fixtures ${CLLM_FIXTURES}/hf)
cllm_add_py_test(generate_sampling_cli generate_sampling_cli.py LABELS generate cli)
cllm_add_py_test(generate_stop_cli generate_stop_cli.py LABELS generate cli ARGS --fixtures ${CLLM_FIXTURES}/hf)
# Many tiny parallel regions: with spinning waits, a loaded machine turns
# each barrier into a scheduler time slice.
set_tests_properties(test_generate test_decode PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
#   test_weights_threads one model set to bf16/fp16 shared by threads: a greedy
#                        request per pthread, each with its own cache, gives the
#                        tokens and logits of the same requests run one after
#                        another (C, also run under ASan/UBSan)
cllm_add_c_test(test_weights_threads LABELS generate)
#   test_infer_layout    cllm_model_set_inference: GPT-2's Conv1D matrices held
#                        [out, in] give the file layout's logits and greedy tokens
#                        (prefill and decode rows), save and train preparation get
#                        the file layout back, no-ops left alone (C, also under ASan)
cllm_add_c_test(test_infer_layout LABELS generate)
set_tests_properties(test_weights_threads PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
