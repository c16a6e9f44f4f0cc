#!/usr/bin/env bash
# The built-in demo: builds cllm, creates a small LLaMA-style model, makes a
# synthetic pre-tokenized data set (arithmetic progressions of token ids, a
# pattern a model can learn in a few dozen steps), trains it and shows the
# loss falling, then evaluates on held-out sequences.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
export OMP_WAIT_POLICY=PASSIVE
work=${DEMO_DIR:-build/demo}
rm -rf "$work" && mkdir -p "$work"

# sample: {"input_ids": [s, s+k, s+2k, ...]} modulo 2000, k in 1..7
gen() { # seed count
  awk -v seed="$1" -v n="$2" 'BEGIN { srand(seed)
    for (i = 0; i < n; i++) { s = int(rand() * 2000); k = 1 + int(rand() * 7); line = "{\"input_ids\": ["
      for (t = 0; t < 65; t++) line = line (t ? ", " : "") (s + t * k) % 2000
      print line "]}" } }'
}
gen 1 4000 > "$work/train.jsonl"
gen 2 200 > "$work/valid.jsonl"

build/cllm init --arch llama --preset small --seed 1 --out "$work/init"
echo "== before training:"; build/cllm eval --model "$work/init" --data "$work/valid.jsonl" --seq-len 64 --batch-size 20
build/cllm train --model "$work/init" --data "$work/train.jsonl" --out "$work/trained" \
  --optimizer adamw --lr 3e-3 --steps 60 --batch-size 16 --seq-len 64 --grad-clip 1.0 --log-every 5
echo "== after training:"; build/cllm eval --model "$work/trained" --data "$work/valid.jsonl" --seq-len 64 --batch-size 20
