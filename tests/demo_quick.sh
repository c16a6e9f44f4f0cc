#!/usr/bin/env bash
# Smoke test of scripts/demo.sh: DEMO_QUICK=1 runs every stage at toy size
# with the given cllm binary; checks that each stage ran and left its output
# and that the accuracy line was printed (no threshold at this size).
# usage: demo_quick.sh CLLM_BINARY WORK_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log=$2.log
mkdir -p "$(dirname "$2")"
DEMO_QUICK=1 DEMO_CLLM=$1 DEMO_DIR=$2 bash "$root/scripts/demo.sh" > "$log" 2>&1
rc=$?
cat "$log"
fail=0
[ "$rc" = 0 ] || { echo "FAIL: demo.sh exited with $rc"; fail=1; }
for s in "1/6 data" "2/6 tokenizer" "3/6 data prepare" "4/6 train" "5/6 evaluate" "6/6 answer" "done"; do
  grep -q "^== $s" "$log" || { echo "FAIL: no section '$s'"; fail=1; }
done
grep -Eq '^held-out accuracy: [0-9]+/[0-9]+ = [0-9.]+% \(chance: 50%' "$log" || { echo "FAIL: no accuracy line"; fail=1; }
for f in corpus.json heldout.tsv tokenizer/tokenizer.json data/parity.bin data/parity.idx data/parity.mask \
         run/config.json run/model.safetensors run/metrics.jsonl run/plot.svg; do
  [ -s "$2/$f" ] || { echo "FAIL: $2/$f missing or empty"; fail=1; }
done
grep -q '"eval_loss"' "$2/run/metrics.jsonl" || { echo "FAIL: no evaluation in metrics.jsonl"; fail=1; }
[ "$fail" = 0 ] && echo "demo quick: ok"
exit "$fail"
