#!/usr/bin/env bash
# The built-in demo: the whole pipeline on a task generated here, no downloads.
#
#   1. data       scripts/demo_data.awk writes a corpus in the seed-003 formats
#                 (pretrain, instruct, conversation) for a parity task, "Is 4731
#                 even or odd?" -> "odd", and 100 held-out numbers it never uses
#   2. tokenizer  cllm tokenizer train (SentencePiece-style BPE, 512 tokens)
#   3. prepare    cllm data prepare (train/valid split 950,50,0)
#   4. train      cllm init (small LLaMA: GQA, RoPE, SwiGLU) + cllm train with
#                 examples/configs/demo.json (AdamW, warmup + cosine, eval, checkpoints)
#   5. evaluate   cllm eval before/after, the loss curve, cllm plot -> SVG
#   6. answer     cllm generate --greedy on the held-out prompts, rendered with the
#                 same Alpaca template as training; prints accuracy against chance
#
# Output under build/demo (DEMO_DIR overrides). DEMO_QUICK=1 runs every stage at
# a toy size in a few seconds (a smoke test: no accuracy threshold).
# DEMO_CLLM=PATH uses an existing binary instead of building build/cllm.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=${DEMO_QUICK:-0}
work=${DEMO_DIR:-build/demo}
export OMP_WAIT_POLICY=PASSIVE
. scripts/demo_lib.sh
demo_start demo.sh

if [ "$quick" = 1 ]; then
  sizes=(-v n_instruct=300 -v n_conv=30 -v n_pretrain=30 -v n_heldout=8)
  model=(--set hidden_size=64 --set intermediate_size=172 --set num_hidden_layers=2
         --set num_attention_heads=4 --set num_key_value_heads=2)
  steps=(--steps 12)
  # the same config with a warmup that fits in 12 steps
  config=$work/demo-quick.json
else
  sizes=()
  model=(--set hidden_size=128 --set intermediate_size=344 --set num_hidden_layers=4
         --set num_attention_heads=4 --set num_key_value_heads=2)
  steps=()
  config=examples/configs/demo.json
fi
vocab=512
seed=${DEMO_SEED:-1}   # data, held-out set and initial weights
rm -rf "$work" && mkdir -p "$work"
[ "$quick" = 1 ] && sed 's/"warmup_num_steps": [0-9]*/"warmup_num_steps": 3/; s/"\(eval\|save\)_interval": [0-9]*/"\1_interval": 6/' \
  examples/configs/demo.json > "$config"

section "1/6 data: a parity task in the seed-003 formats (scripts/demo_data.awk, seed $seed)"
awk -v seed="$seed" -v out="$work" "${sizes[@]}" -f scripts/demo_data.awk
held=$(wc -l < "$work/heldout.tsv")
echo "$work/corpus.json: $(grep -c '"type": "pretrain"' "$work/corpus.json") pretrain," \
     "$(grep -c '"type": "instruct"' "$work/corpus.json") instruct," \
     "$(grep -c '"type": "conversation"' "$work/corpus.json") conversation records"
echo "examples:"; sed -n '2p' "$work/corpus.json"; grep -m 2 '"type": "instruct"' "$work/corpus.json"
grep -m 1 '"type": "conversation"' "$work/corpus.json"
echo "$work/heldout.tsv: $held numbers that appear nowhere in the corpus (half even, half odd)"

section "2/6 tokenizer: cllm tokenizer train --type sp-bpe --vocab-size $vocab"
"$cllm" tokenizer train --input "$work/tokenizer.txt" --vocab-size "$vocab" --type sp-bpe \
  --out "$work/tokenizer"

section "3/6 data prepare: tokenize, mask the prompts, split 950,50,0"
"$cllm" data prepare --input "$work/corpus.json" --tokenizer "$work/tokenizer" --out "$work/data/parity" \
  --seq-len 64 --split 950,50,0 >/dev/null

section "4/6 train: a small LLaMA-style model with examples/configs/demo.json"
"$cllm" init --arch llama --preset tiny --set vocab_size="$vocab" --set max_position_embeddings=128 \
  "${model[@]}" --seed "$seed" --out "$work/init"
cp "$work/tokenizer/"* "$work/init/"
echo "before training, loss on the valid split (records held out of training):"
"$cllm" eval --model "$work/init" --data "$work/data/parity" --split valid --seq-len 64 --batch-size 32
echo
"$cllm" train --config "$config" --model "$work/init" --data "$work/data/parity" \
  --tokenizer "$work/tokenizer" --out "$work/run" --log plain "${steps[@]}"
cp "$work/tokenizer/"* "$work/run/"

section "5/6 evaluate: valid-split loss, the loss curve, cllm plot"
echo "after training, loss on the valid split:"
"$cllm" eval --model "$work/run" --data "$work/data/parity" --split valid --seq-len 64 --batch-size 32
echo
echo "loss curve (metrics.jsonl: training loss averaged over windows, and every evaluation):"
awk -F'[,:{} ]+' '
  function val(k,   i) { for (i = 1; i < NF; i++) if ($i == "\"" k "\"") return $(i + 1); return "" }
  /"eval_loss"/ { printf "  eval   step %4d  eval_loss %.4f\n", val("step"), val("eval_loss"); next }
  /"loss"/ { s = val("step"); sum += val("loss"); n++
             if (s == 1 || s % 50 == 0) { printf "  train  step %4d  loss %.4f  lr %.2e\n", s, sum / n, val("lr"); sum = 0; n = 0 } }' \
  "$work/run/metrics.jsonl"
"$cllm" plot "$work/run"

section "6/6 answer the $held held-out prompts: cllm generate --greedy"
heldout_accuracy "$cllm" "$work/heldout.tsv" 6 --model "$work/run"
k=$asked
[ "$k" = "$held" ] || { echo "demo.sh: answered $k of $held prompts" >&2; exit 1; }
pct=$(awk -v r="$right" -v n="$k" 'BEGIN { printf "%.1f", 100 * r / n }')
echo
echo "held-out accuracy: $right/$k = $pct% (chance: 50%; numbers never seen in training)"
echo "output in $work: corpus, tokenizer/, data/, run/ (model, checkpoints, metrics.jsonl, plot.svg)"
section "done"
if [ "$quick" != 1 ] && [ $(( right * 100 )) -lt $(( k * 90 )) ]; then
  echo "demo.sh: accuracy below 90%" >&2; exit 1
fi
