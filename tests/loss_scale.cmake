# fp16 loss scaling (label: train): the scaler against an independent
# Python version of DeepSpeed's documented algorithm (test_loss_scale is
# also its driver), and `cllm train` with fp16 enabled: overflows injected
# at chosen steps, the scale trajectory in metrics.jsonl, resume, and the
# weights of a run without overflows equal to those of an fp32 run.
cllm_add_c_test(test_loss_scale LABELS train)
foreach(case sequences train)
  cllm_add_py_test(loss_scale_${case} loss_scale_test.py LABELS train ARGS --case ${case})
  set_tests_properties(loss_scale_${case} PROPERTIES TIMEOUT 120)
endforeach()
