#!/usr/bin/env bash
# Builds cllm and runs the whole test suite twice: a Release build with
# warnings as errors, then an AddressSanitizer + UndefinedBehaviorSanitizer
# build running the suite again: every test but those labelled "nosan"
# (memory measurements, which shadow memory would distort), the mpirun tests
# included (with leak detection off for them: tests/CMakeLists.txt says
# why), then a third build with clang 14 and ASan + UBSan +
# float-cast-overflow (the float to integer overflow GCC does not check)
# running the same tests as the GCC sanitizer pass, the mpirun tests
# included, then the fuzz targets of tests/fuzz/ (scripts/fuzz.sh: clang build, each
# target over its seed corpus plus a fresh FUZZ_SECONDS run, default 20 s per
# target). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export OMP_WAIT_POLICY=PASSIVE

echo "== release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCLLM_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS" ${CTEST_ARGS:-}

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLLM_SANITIZE=ON -DCLLM_WERROR=ON >/dev/null
cmake --build build-asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$JOBS" -LE nosan ${CTEST_ARGS:-}

echo "== sanitizer build with clang (ASan + UBSan + float-cast-overflow)"
CC_SAN=${CC_SAN:-$(command -v clang-14 || command -v clang || true)}
if [ -z "$CC_SAN" ]; then
  echo "test.sh: clang not found (install clang-14, libclang-rt-14-dev and libomp-14-dev: scripts/install-deps.sh)" >&2
  exit 1
fi
CC="$CC_SAN" cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLLM_SANITIZE=ON -DCLLM_WERROR=ON >/dev/null
cmake --build build-clang -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-clang --output-on-failure -j"$JOBS" -LE nosan ${CTEST_ARGS:-}

echo "== fuzz targets (clang, libFuzzer + ASan/UBSan)"
scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
