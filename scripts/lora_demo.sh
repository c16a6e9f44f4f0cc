#!/usr/bin/env bash
# LoRA on the built-in demo task (scripts/demo.sh): full fine-tuning and LoRA
# from the same base, each judged by held-out accuracy.
#
#   1. data       scripts/demo_data.awk (the parity task), split by record type:
#                 base.json = the pretrain paragraphs and conversations,
#                 sft.json = the instruct records (the Alpaca template the
#                 held-out prompts use); 100 held-out numbers in neither
#   2. tokenizer  cllm tokenizer train (512 tokens), cllm data prepare of both
#   3. base       cllm init (demo.sh's small LLaMA) + cllm train on base.json
#   4. full       cllm train --model base on sft.json: every weight trains
#   5. lora       the same data, steps and schedule with --lora-r 8
#                 --lora-target all-linear: the base frozen, 8.6% of the weights train
#   6. answer     held-out accuracy (cllm generate --greedy, demo.sh's check)
#                 of the base, the full fine-tune and base + adapter
#
# Output under build/lora-demo (DEMO_DIR overrides). DEMO_QUICK=1 runs every
# stage at a toy size in seconds (a smoke test: no accuracy threshold).
# DEMO_CLLM=PATH uses an existing binary instead of building build/cllm.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=${DEMO_QUICK:-0}
work=${DEMO_DIR:-build/lora-demo}
export OMP_WAIT_POLICY=PASSIVE
. scripts/demo_lib.sh
demo_start lora_demo.sh

if [ "$quick" = 1 ]; then
  sizes=(-v n_instruct=200 -v n_conv=60 -v n_pretrain=30 -v n_heldout=8)
  model=(--set hidden_size=64 --set intermediate_size=172 --set num_hidden_layers=2
         --set num_attention_heads=4 --set num_key_value_heads=2)
  base_steps=12; ft_steps=6; warmup=2
else
  sizes=(-v n_conv=1500)
  model=(--set hidden_size=128 --set intermediate_size=344 --set num_hidden_layers=4
         --set num_attention_heads=4 --set num_key_value_heads=2)
  base_steps=${LORA_DEMO_BASE_STEPS:-600}; ft_steps=${LORA_DEMO_FT_STEPS:-150}; warmup=15
fi
vocab=512
seed=${DEMO_SEED:-1}
rm -rf "$work" && mkdir -p "$work"

section "1/6 data: the parity task, split into a base part and a fine-tuning part"
awk -v seed="$seed" -v out="$work" "${sizes[@]}" -f scripts/demo_data.awk
# one record a line between "[" and "]" (demo_data.awk's layout)
split_corpus() { # PATTERN OUT: the records whose type matches
  awk -v pat="$1" 'BEGIN { print "[" } $0 ~ pat { sub(/,$/, ""); if (n++) print prev ","; prev = $0 }
                   END { if (n) print prev; print "]" }' "$work/corpus.json" > "$2"
}
split_corpus '"type": "(pretrain|conversation)"' "$work/base.json"
split_corpus '"type": "instruct"' "$work/sft.json"
echo "base.json: $(grep -c '"type": "pretrain"' "$work/base.json") pretrain paragraphs and" \
     "$(grep -c '"type": "conversation"' "$work/base.json") conversations (### Human / ### Assistant)"
echo "sft.json:  $(grep -c '"type": "instruct"' "$work/sft.json") instruct records (the Alpaca template)"
echo "heldout.tsv: $(wc -l < "$work/heldout.tsv") numbers in neither"

section "2/6 tokenizer and data prepare"
"$cllm" tokenizer train --input "$work/tokenizer.txt" --vocab-size "$vocab" --type sp-bpe --out "$work/tokenizer"
for part in base sft; do
  "$cllm" data prepare --input "$work/$part.json" --tokenizer "$work/tokenizer" --out "$work/data/$part" \
    --seq-len 64 --split 950,50,0 >/dev/null
done

# demo.sh's config with this run's length and warmup
conf() { # STEPS WARMUP LR OUT
  sed "s/\"train_iters\": [0-9]*/\"train_iters\": $1/; s/\"warmup_num_steps\": [0-9]*/\"warmup_num_steps\": $2/;
       s/\"lr\": [0-9.e-]*/\"lr\": $3/; s/\"\(eval\|save\)_interval\": [0-9]*/\"\1_interval\": 0/" \
    examples/configs/demo.json > "$4"
}
last_eval() { "$cllm" eval "$@" --data "$work/data/sft" --split valid --seq-len 64 --batch-size 32 2>&1 |
              awk '/loss/ { print; exit }'; }

section "3/6 base: cllm init + $base_steps steps on base.json"
"$cllm" init --arch llama --preset tiny --set vocab_size="$vocab" --set max_position_embeddings=128 \
  "${model[@]}" --seed "$seed" --out "$work/init"
cp "$work/tokenizer/"* "$work/init/"
conf "$base_steps" $(( base_steps < 50 ? 2 : 50 )) 3e-3 "$work/base.conf.json"
"$cllm" train --config "$work/base.conf.json" --model "$work/init" --data "$work/data/base" \
  --tokenizer "$work/tokenizer" --out "$work/base" --log quiet
cp "$work/tokenizer/"* "$work/base/"

section "4/6 full fine-tuning: $ft_steps steps on sft.json, every weight"
conf "$ft_steps" "$warmup" 1e-3 "$work/full.conf.json"
"$cllm" train --config "$work/full.conf.json" --model "$work/base" --data "$work/data/sft" \
  --out "$work/full" --log quiet
cp "$work/tokenizer/"* "$work/full/"

section "5/6 LoRA: the same $ft_steps steps, r 8 on every linear layer, the base frozen"
conf "$ft_steps" "$warmup" 3e-3 "$work/lora.conf.json"
"$cllm" train --config "$work/lora.conf.json" --model "$work/base" --data "$work/data/sft" \
  --out "$work/lora" --log quiet --lora-r 8 --lora-alpha 16 --lora-target all-linear

section "6/6 held-out accuracy (cllm generate --greedy, as demo.sh)"
declare -A acc
for run in base full lora; do
  case $run in
    base) args=(--model "$work/base") ;;
    full) args=(--model "$work/full") ;;
    lora) args=(--model "$work/base" --adapter "$work/lora") ;;
  esac
  echo "$run: valid loss on sft.json's held-out records: $(last_eval "${args[@]}")"
  heldout_accuracy "$cllm" "$work/heldout.tsv" 2 "${args[@]}"
  acc[$run]=$right
  echo "$run: held-out accuracy $right/$asked"
done
echo
printf '%-28s %s\n' "run" "held-out accuracy (chance 50%)"
printf '%-28s %d/%d\n' "base (no fine-tuning)" "${acc[base]}" "$asked" \
  "full fine-tuning" "${acc[full]}" "$asked" "LoRA r=8, all-linear" "${acc[lora]}" "$asked"
section "done"
if [ "$quick" != 1 ] && { [ $(( acc[lora] * 100 )) -lt $(( asked * 90 )) ] || [ "${acc[lora]}" -lt "${acc[full]}" ]; }; then
  echo "lora_demo.sh: LoRA below 90% or below full fine-tuning" >&2; exit 1
fi
