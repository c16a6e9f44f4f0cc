# The benchmark drivers' own logic (bench/machine.py's CPU and oneDNN ISA
# report, train_step.py's OpenBLAS core-type probe surviving a SIGILL, bf16
# rows skipped with a reason); no timing is asserted.
cllm_add_py_test(bench_drivers bench_test.py LABELS bench cli)
