# Sharded ZeRO checkpoints (label: mpi): save on one world size and ZeRO
# stage, resume on another, convert to an HF folder, corrupted and
# interrupted saves (shard_test.py). Registered like dist.cmake: only with
# MPI and mpirun (label mpi: see dist.cmake).
find_program(CLLM_MPIRUN mpirun)
if(CLLM_HAVE_MPI AND CLLM_MPIRUN)
  foreach(case resume convert errors)
    cllm_add_py_test(shard_${case} shard_test.py LABELS mpi ARGS --case ${case})
    set_tests_properties(shard_${case} PROPERTIES TIMEOUT 120)
  endforeach()
endif()
# The file format without MPI (one shard), also under the sanitizers.
cllm_add_c_test(test_ckpt_shard LABELS train)
