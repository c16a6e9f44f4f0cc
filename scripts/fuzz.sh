#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan +
# float-cast-overflow, in build-fuzz/) and runs each one: first over its
# checked-in seed corpus (tests/fuzz/corpus/TARGET/, every file once), then a
# fresh run of SECONDS_PER_TARGET seconds (default 600) mutating from that
# corpus, with the keywords of tests/fuzz/dict/TARGET.dict (key names, type
# names, magics) offered to the mutator. Any crash, sanitizer report, leak,
# input taking over a second (-timeout=1) or over 2 GB (-rss_limit_mb,
# -malloc_limit_mb) fails the script; the offending input is left in
# build-fuzz/findings/TARGET/ and the run goes on with the next target. A
# timeout whose input runs within the second when run again alone is
# reported but does not fail (the limit is wall-clock time, which a machine
# busy with other work can exceed). Prints the executions of each target.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     e.g. scripts/fuzz.sh 30 safetensors tokenizer
#
# New inputs found in a fresh run stay in build-fuzz/corpus/TARGET/ (not the
# checked-in corpus); copy an input there by hand when it should become a
# seed or a regression.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-600}
shift || true
JOBS=${JOBS:-$(nproc)}
CC_FUZZ=${CC_FUZZ:-$(command -v clang || command -v clang-14 || true)}
if [ -z "$CC_FUZZ" ]; then
  echo "fuzz.sh: clang not found (install clang-14 and libclang-rt-14-dev: scripts/install-deps.sh)" >&2
  exit 1
fi

echo "== fuzz build ($CC_FUZZ)"
CC="$CC_FUZZ" cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLLM_FUZZ=ON -DCLLM_MPI=OFF \
  -DCLLM_WERROR=ON >/dev/null
cmake --build build-fuzz -j"$JOBS"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do
    [ "$f" = tests/fuzz/fuzz_util.c ] && continue
    n=$(basename "$f" .c)
    targets+=("${n#fuzz_}")
  done
fi

# One thread: a fuzz input is small, and an OpenMP team per input would only
# slow the run down (and make leak checks see the runtime's threads).
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# FUZZ_TIMEOUT (seconds, default 1): the per-input limit; raise it for a
# long run at low priority (nice) beside other work, where a starved process
# would otherwise stop at a wall-clock "timeout" that is the machine's.
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-1}
FLAGS=(-rss_limit_mb=2048 -timeout="$FUZZ_TIMEOUT" -malloc_limit_mb=2048 -print_final_stats=1)
# True when every finding in $2 is a timeout and each input runs within the
# limit when run again: -timeout is wall-clock time, which a loaded machine
# (other builds on few cores) can exceed for an input that is not slow.
# Such inputs are kept in $2/slow-when-busy/ for a look.
only_slow_when_busy() {
  local bin=$1 found=$2 f any=0
  for f in "$found"/*; do
    [ -f "$f" ] || continue
    any=1
    case $(basename "$f") in timeout-*) ;; *) return 1 ;; esac
    "$bin" -timeout=1 -rss_limit_mb=2048 "$f" >/dev/null 2>&1 || return 1
  done
  [ "$any" = 1 ] || return 1
  mkdir -p "$found/slow-when-busy"
  mv "$found"/timeout-* "$found/slow-when-busy/"
}

failed=()
summary=()
for t in "${targets[@]}"; do
  bin=build-fuzz/fuzz/fuzz_$t
  seeds=tests/fuzz/corpus/$t
  work=build-fuzz/corpus/$t
  found=build-fuzz/findings/$t
  log=build-fuzz/fuzz-$t.log
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "fuzz.sh: no target '$t' (expected $bin and $seeds)" >&2
    failed+=("$t")
    continue
  fi
  rm -rf "$found"
  mkdir -p "$work" "$found"
  dict=()
  [ -f tests/fuzz/dict/$t.dict ] && dict=(-dict=tests/fuzz/dict/$t.dict)
  echo "== $t: seed corpus ($(ls "$seeds" | wc -l) inputs)"
  if ! "$bin" "${FLAGS[@]}" -artifact_prefix="$found/" -runs=0 "$seeds" >"$log.seeds" 2>&1; then
    tail -40 "$log.seeds"
    failed+=("$t (seed corpus)")
    continue
  fi
  echo "== $t: fresh run, ${SECONDS_PER_TARGET}s"
  if "$bin" "${FLAGS[@]}" "${dict[@]}" -artifact_prefix="$found/" -max_total_time="$SECONDS_PER_TARGET" \
      "$work" "$seeds" >"$log" 2>&1; then
    ok=ok
  elif only_slow_when_busy "$bin" "$found"; then
    ok="ok (a timeout that did not recur when run again alone: the machine was busy)"
  else
    tail -60 "$log"
    failed+=("$t")
    ok=FAILED
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  slow=$(grep -o 'stat::slowest_unit_time_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo "?")
  summary+=("$(printf '%-14s %10s execs  %6s edges  slowest %3s s  %s' "$t" "$execs" "$cov" "$slow" "$ok")")
done

echo "== fuzz summary (${SECONDS_PER_TARGET}s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs in build-fuzz/findings/)" >&2
  exit 1
fi
