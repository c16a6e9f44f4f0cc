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
# busy with other work can exceed). Ends with a table of each target's
# executions, executions per second, edges covered and result.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     e.g. scripts/fuzz.sh 30 safetensors tokenizer
#   scripts/fuzz.sh 0                                     builds the targets and runs nothing
#
# Environment:
#   FUZZ_PARALLEL=N   run N targets at once (default 1: one after another);
#                     each target is one process, so N cores are busy.
#   FUZZ_FORK=M       each target runs M libFuzzer worker processes
#                     (-fork=M) sharing one corpus (default 0: no fork mode);
#                     FUZZ_PARALLEL x FUZZ_FORK cores are busy.
#   FUZZ_RUNS=N       also stop a target after N executions (-runs=N, not
#                     in fork mode): FUZZ_RUNS=10000000 with a long time.
#   FUZZ_NO_BUILD=1   skip the build and run the binaries already in
#                     FUZZ_BUILD_DIR/fuzz/ (default build-fuzz): build here,
#                     copy the checkout with build-fuzz/ to another x86-64
#                     machine with the same packages (scripts/install-deps.sh)
#                     and run there.
#   FUZZ_TIMEOUT=S    the per-input limit (default 1 s).
#   CLLM_FUZZ_GPT2    the GPT-2 tokenizer folder serve_request loads (default:
#                     the fixtures path compiled in).
#   CLLM_FUZZ_TMPDIR  where targets write the files of an input (default
#                     /dev/shm, i.e. memory, where it exists); each target
#                     gets a folder of its own there, removed when it ends,
#                     also when a finding aborted it.
#
# New inputs found in a fresh run stay in build-fuzz/corpus/TARGET/ (not the
# checked-in corpus); copy an input there by hand when it should become a
# seed or a regression.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-600}
shift || true
JOBS=${JOBS:-$(nproc)}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
PARALLEL=${FUZZ_PARALLEL:-1}
FORK=${FUZZ_FORK:-0}
RUNS=${FUZZ_RUNS:-}

if [ "${FUZZ_NO_BUILD:-0}" = 1 ]; then
  echo "== fuzz targets prebuilt in $BUILD/fuzz (FUZZ_NO_BUILD=1)"
  if ! ls "$BUILD"/fuzz/fuzz_* >/dev/null 2>&1; then
    echo "fuzz.sh: no fuzz targets in $BUILD/fuzz/ (build them first: scripts/fuzz.sh 0)" >&2
    exit 1
  fi
else
  CC_FUZZ=${CC_FUZZ:-$(command -v clang || command -v clang-14 || true)}
  if [ -z "$CC_FUZZ" ]; then
    echo "fuzz.sh: clang not found (install clang-14 and libclang-rt-14-dev: scripts/install-deps.sh)" >&2
    exit 1
  fi
  echo "== fuzz build ($CC_FUZZ)"
  CC="$CC_FUZZ" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLLM_FUZZ=ON -DCLLM_MPI=OFF \
    -DCLLM_WERROR=ON >/dev/null
  cmake --build "$BUILD" -j"$JOBS"
fi

if [ "$SECONDS_PER_TARGET" = 0 ]; then
  echo "== built in $BUILD/fuzz (0 seconds per target: nothing run)"
  exit 0
fi

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
MODE=()
# fork mode would otherwise go on past timeouts and out-of-memory inputs
[ "$FORK" -gt 0 ] && MODE+=(-fork="$FORK" -ignore_crashes=0 -ignore_timeouts=0 -ignore_ooms=0)
[ -n "$RUNS" ] && [ "$FORK" -eq 0 ] && MODE+=(-runs="$RUNS")
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

# Where the targets' input folders go (memory where /dev/shm exists).
TMP_BASE=${CLLM_FUZZ_TMPDIR:-}
if [ -z "$TMP_BASE" ]; then
  if [ -w /dev/shm ] && [ -x /dev/shm ]; then TMP_BASE=/dev/shm; else TMP_BASE=${TMPDIR:-/tmp}; fi
fi

# Runs one target (run_target_in) with its input files in a folder of its
# own, removed afterwards: a process aborted by a finding runs no exit
# handlers and would leave its files behind.
run_target() {
  local -x CLLM_FUZZ_TMPDIR
  CLLM_FUZZ_TMPDIR=$(mktemp -d "$TMP_BASE/cllm-fuzz-$1.XXXXXX")
  run_target_in "$1"
  rm -rf "$CLLM_FUZZ_TMPDIR"
}

# Runs one target; its table row goes to $BUILD/fuzz-TARGET.result
# (columns: target, executions, exec/s, edges, slowest input in s, result).
run_target_in() {
  local t=$1 bin=$BUILD/fuzz/fuzz_$1 seeds=tests/fuzz/corpus/$1 work=$BUILD/corpus/$1
  local found=$BUILD/findings/$1 log=$BUILD/fuzz-$1.log res=$BUILD/fuzz-$1.result
  local dict=() ok execs cov slow t0 t1 secs
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "fuzz.sh: no target '$t' (expected $bin and $seeds)" >&2
    printf '%s\t-\t-\t-\t-\tFAILED (no target)\n' "$t" >"$res"
    return
  fi
  rm -rf "$found"
  mkdir -p "$work" "$found"
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=(-dict="tests/fuzz/dict/$t.dict")
  echo "== $t: seed corpus ($(ls "$seeds" | wc -l) inputs)"
  if ! "$bin" "${FLAGS[@]}" -artifact_prefix="$found/" -runs=0 "$seeds" >"$log.seeds" 2>&1; then
    tail -40 "$log.seeds"
    printf '%s\t-\t-\t-\t-\tFAILED (seed corpus)\n' "$t" >"$res"
    return
  fi
  echo "== $t: fresh run, ${SECONDS_PER_TARGET}s${RUNS:+ or $RUNS executions}${MODE[*]:+ (${MODE[*]})}"
  t0=$(date +%s.%N)
  if "$bin" "${FLAGS[@]}" "${MODE[@]}" "${dict[@]}" -artifact_prefix="$found/" \
      -max_total_time="$SECONDS_PER_TARGET" "$work" "$seeds" >"$log" 2>&1; then
    ok=ok
  elif only_slow_when_busy "$bin" "$found"; then
    ok="ok (a timeout that did not recur when run again alone: the machine was busy)"
  else
    echo "== $t: FAILED" >&2
    tail -60 "$log" >&2
    ok=FAILED
  fi
  t1=$(date +%s.%N)
  # the final statistics; in fork mode the last status line (#EXECUTIONS ...)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  slow=$(grep -o 'stat::slowest_unit_time_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { s = b - a; printf "%.1f", (s > 0 ? s : 1) }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${execs:-?}" \
    "$(awk -v n="${execs:-0}" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')" "${cov:-?}" "${slow:-?}" "$ok" >"$res"
}

echo "== fuzzing ${#targets[@]} targets, $PARALLEL at a time"
for t in "${targets[@]}"; do
  rm -f "$BUILD/fuzz-$t.result"
  if [ "$PARALLEL" -gt 1 ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n || true; done
    run_target "$t" &
  else
    run_target "$t"
  fi
done
wait

failed=()
echo "== fuzz summary (${SECONDS_PER_TARGET}s per target${RUNS:+ or $RUNS executions}, $PARALLEL at a time${MODE[*]:+, ${MODE[*]}}, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo ?))"
printf '%-14s %12s %9s %7s %9s  %s\n' target executions exec/s edges slowest/s result
for t in "${targets[@]}"; do
  res=$BUILD/fuzz-$t.result
  if [ ! -f "$res" ]; then
    printf '%-14s %12s %9s %7s %9s  %s\n' "$t" - - - - "FAILED (no result)"
    failed+=("$t")
    continue
  fi
  IFS=$'\t' read -r name execs rate cov slow ok <"$res"
  printf '%-14s %12s %9s %7s %9s  %s\n' "$name" "$execs" "$rate" "$cov" "$slow" "$ok"
  case $ok in ok*) ;; *) failed+=("$t") ;; esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs in $BUILD/findings/)" >&2
  exit 1
fi
