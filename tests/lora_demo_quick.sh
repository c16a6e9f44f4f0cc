#!/usr/bin/env bash
# Smoke test of scripts/lora_demo.sh: DEMO_QUICK=1 runs every stage at toy
# size with the given cllm binary; checks that each stage ran and left its
# output, that the LoRA run wrote an adapter folder (and no full model), and
# that the accuracy table was printed (no threshold at this size).
# usage: lora_demo_quick.sh CLLM_BINARY WORK_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log=$2.log
mkdir -p "$(dirname "$2")"
DEMO_QUICK=1 DEMO_CLLM=$1 DEMO_DIR=$2 bash "$root/scripts/lora_demo.sh" > "$log" 2>&1
rc=$?
cat "$log"
fail=0
[ "$rc" = 0 ] || { echo "FAIL: lora_demo.sh exited with $rc"; fail=1; }
for s in "1/6 data" "2/6 tokenizer" "3/6 base" "4/6 full" "5/6 LoRA" "6/6 held-out" "done"; do
  grep -q "^== $s" "$log" || { echo "FAIL: no section '$s'"; fail=1; }
done
for r in "base (no fine-tuning)" "full fine-tuning" "LoRA r=8, all-linear"; do
  grep -F "$r" "$log" | grep -Eq ' [0-9]+/[0-9]+$' || { echo "FAIL: no accuracy row '$r'"; fail=1; }
done
for f in base.json sft.json heldout.tsv data/base.bin data/sft.bin base/model.safetensors full/model.safetensors \
         lora/adapter_model.safetensors lora/adapter_config.json; do
  [ -s "$2/$f" ] || { echo "FAIL: $2/$f missing or empty"; fail=1; }
done
[ -e "$2/lora/model.safetensors" ] && { echo "FAIL: the LoRA run wrote a whole model"; fail=1; }
grep -q '"type": "instruct"' "$2/base.json" && { echo "FAIL: instruct records in the base's data"; fail=1; }
[ "$fail" = 0 ] && echo "lora demo quick: ok"
exit "$fail"
