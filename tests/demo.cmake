# The built-in demo (label: demo).
#   demo_quick   scripts/demo.sh with DEMO_QUICK=1: generated data, tokenizer
#                training, data prepare, training with examples/configs/demo.json,
#                eval, plot and generation on held-out prompts, at toy size
#                (a few seconds); checks each stage's output and the accuracy
#                line, not the accuracy itself
add_test(NAME demo_quick
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/demo_quick.sh ${CLLM_BIN} ${PROJECT_BINARY_DIR}/demo-quick)
set_tests_properties(demo_quick PROPERTIES LABELS "demo;cli" TIMEOUT 60
                     ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
#   lora_demo_quick  scripts/lora_demo.sh with DEMO_QUICK=1: the demo task split
#                into a base part and a fine-tuning part, base training, full
#                fine-tuning and LoRA from that base, held-out accuracy of
#                each, at toy size; checks the stages, files and table
add_test(NAME lora_demo_quick
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/lora_demo_quick.sh ${CLLM_BIN} ${PROJECT_BINARY_DIR}/lora-demo-quick)
set_tests_properties(lora_demo_quick PROPERTIES LABELS "demo;lora;cli" TIMEOUT 120
                     ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
