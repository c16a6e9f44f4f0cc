# QLoRA: the bitsandbytes formats (nf4, fp4 with and without double
# quantization, LLM.int8() row-wise) against an independent PyTorch
# implementation bit for bit, and LoRA gradients on a quantized base
# against torch on the same dequantized weights, plus bad keys and flags.
cllm_add_c_test(test_bnb LABELS kernel lora)
cllm_add_py_test(test_bnb_torch ref/bnb_ref.py LABELS kernel lora)
cllm_add_py_test(qlora qlora_test.py LABELS lora train cli)
set_tests_properties(qlora PROPERTIES TIMEOUT 300)
