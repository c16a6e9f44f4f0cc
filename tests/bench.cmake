# The benchmark drivers' own logic (bench/machine.py's CPU and oneDNN ISA
# report, train_step.py's OpenBLAS core-type probe surviving a SIGILL, bf16
# rows skipped with a reason); no timing is asserted.
cllm_add_py_test(bench_drivers bench_test.py LABELS bench cli)
# bench/qmatmul_bench.c: the small-batch kernels vs oneDNN (run by hand)
add_executable(qmatmul_bench ${PROJECT_SOURCE_DIR}/bench/qmatmul_bench.c)
target_link_libraries(qmatmul_bench PRIVATE cllm)
target_compile_options(qmatmul_bench PRIVATE ${CLLM_WARNINGS})
target_compile_definitions(qmatmul_bench PRIVATE _POSIX_C_SOURCE=200809L)
set_target_properties(qmatmul_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
