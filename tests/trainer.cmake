# Trainer tests (label: train): `cllm train` end to end on a tiny llama and
# generated pre-tokenized JSONL; one ctest entry per case of
# trainer_test.py (config, schedules, accum, clip, nonfinite, checkpoint,
# resume, sigterm, eval, plot, zero, metrics).
foreach(case config schedules accum clip nonfinite checkpoint resume sigterm eval plot zero metrics)
  cllm_add_py_test(train_${case} trainer_test.py LABELS train ARGS --case ${case})
  set_tests_properties(train_${case} PROPERTIES TIMEOUT 120)
endforeach()
