#!/bin/bash
# The alignment pipeline end to end on a task it makes itself (no downloads,
# about a minute on 2 cores): a preference for responses that end in token
# 7 over those that end in token 9.
#   1. a small random LLaMA (the "SFT" model) and preference pairs
#   2. a reward model trained on the pairs (cllm train --task reward)
#   3. DPO on the same pairs (cllm train --task dpo): the implicit reward
#      margin and accuracy before and after
#   4. PPO against the reward model (cllm train --task ppo): the mean reward
#      of the policy's own samples in the first and last PPO batch, and the
#      KL to the reference
#   5. step times of the three against the SFT (language-modelling) step
# Output under build/alignment-demo/. See docs/alignment.md.
set -euo pipefail
cd "$(dirname "$0")/.."
CLLM=${CLLM:-build/cllm}
D=${OUT:-build/alignment-demo}
[ -x "$CLLM" ] || { echo "build cllm first (cmake --build build)" >&2; exit 1; }
rm -rf "$D"
mkdir -p "$D"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

"$CLLM" init --arch llama --preset tiny --seed 1 --out "$D/sft" >/dev/null
# 64 pairs: a 3-token prompt, then [x, 7] (chosen) or [x, 9] (rejected);
# 64 prompts of 3 tokens for PPO; 64 plain rows for the SFT timing
awk 'BEGIN { srand(3); for (i = 0; i < 64; i++) {
    p = sprintf("%d, %d, %d", 10 + int(rand() * 400), 10 + int(rand() * 400), 10 + int(rand() * 400))
    x = 10 + int(rand() * 400)
    printf "{\"prompt_input_ids\": [%s], \"chosen_input_ids\": [%d, 7], \"rejected_input_ids\": [%d, 9]}\n", p, x, x > "'"$D/pairs.jsonl"'"
    printf "{\"input_ids\": [%s]}\n", p > "'"$D/prompts.jsonl"'"
    printf "{\"input_ids\": [%s, %d, 7, %d, 7, %d, 7]}\n", p, x, x, x > "'"$D/sft.jsonl"'" } }'

metric() { # metric FILE KEY [first|last]: a key of the first or last step record
    awk -v k="\"$2\": " -v w="${3:-last}" 'index($0, "\"loss\"") && index($0, k) {
        s = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", s); v = s; if (w == "first" && !n) f = v; n++ }
        END { print (w == "first" ? f : v) }' "$1/metrics.jsonl"
}
median_step() { # the median step_time of a run
    awk -v k='"step_time": ' 'index($0, k) { s = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", s); print s }' \
        "$1/metrics.jsonl" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}
COMMON=(--seq-len 16 --log quiet --optimizer adamw --no-shuffle)

echo "== reward model (40 steps of 8 pairs)"
"$CLLM" train --task reward --model "$D/sft" --data "$D/pairs.jsonl" --out "$D/rm" --steps 40 --batch-size 8 \
    --lr 1e-2 "${COMMON[@]}"
echo "   accuracy: first step $(metric "$D/rm" accuracy first), last step $(metric "$D/rm" accuracy)"

echo "== DPO (40 steps of 8 pairs, beta 0.1)"
"$CLLM" train --task dpo --model "$D/sft" --data "$D/pairs.jsonl" --out "$D/dpo" --steps 40 --batch-size 8 \
    --lr 1e-2 --beta 0.1 "${COMMON[@]}"
echo "   rewards/margins: first step $(metric "$D/dpo" rewards/margins first), last $(metric "$D/dpo" rewards/margins)"
echo "   rewards/accuracies: first step $(metric "$D/dpo" rewards/accuracies first), last $(metric "$D/dpo" rewards/accuracies)"

echo "== PPO against the reward model (8 batches of 16 rollouts, 4 epochs of 2 minibatches: 64 steps)"
cat > "$D/ppo.json" <<'EOF'
{"task": "ppo", "ppo": {"init_kl_coef": 0.05, "ppo_epochs": 4, "batch_size": 16,
                        "generation_kwargs": {"max_new_tokens": 2, "top_k": 0, "top_p": 1.0}}}
EOF
"$CLLM" train --config "$D/ppo.json" --model "$D/sft" --reward-model "$D/rm" --data "$D/prompts.jsonl" \
    --out "$D/ppo" --steps 64 --batch-size 8 --lr 1e-2 --seq-len 16 --log quiet --optimizer adamw
echo "   env/reward_mean: first batch $(metric "$D/ppo" env/reward_mean first), last batch $(metric "$D/ppo" env/reward_mean)"
echo "   objective/kl to the reference: last batch $(metric "$D/ppo" objective/kl), kl_coef $(metric "$D/ppo" objective/kl_coef)"

# The mean reward of a model's own samples and their KL to the SFT model:
# the statistics of a first PPO batch (64 prompts, sampled before any update)
cat > "$D/eval.json" <<'EOF'
{"task": "ppo", "ppo": {"ppo_epochs": 1, "batch_size": 64, "adap_kl_ctrl": false,
                        "generation_kwargs": {"max_new_tokens": 2}}}
EOF
evaluate() {
    "$CLLM" train --config "$D/eval.json" --model "$1" --ref-model "$D/sft" --reward-model "$D/rm" \
        --data "$D/prompts.jsonl" --out "$D/eval-$2" --steps 1 --batch-size 64 --micro-batch-size 8 --lr 1e-30 \
        --seq-len 16 --log quiet --optimizer sgd --no-shuffle
    printf "   %-4s mean reward of its samples %8.4f   KL to the SFT model %8.4f\n" "$2" \
        "$(metric "$D/eval-$2" env/reward_mean)" "$(metric "$D/eval-$2" objective/kl)"
}
echo "== the reward model's score of each model's samples (64 prompts, 2 new tokens)"
evaluate "$D/sft" sft
evaluate "$D/dpo" dpo
evaluate "$D/ppo" ppo

echo "== SFT step for comparison (8 rows of 16 tokens)"
"$CLLM" train --model "$D/sft" --data "$D/sft.jsonl" --out "$D/lm" --steps 20 --batch-size 8 --lr 1e-3 "${COMMON[@]}"
LM=$(median_step "$D/lm")
for run in rm dpo ppo; do
    T=$(median_step "$D/$run")
    awk -v r="$run" -v t="$T" -v l="$LM" 'BEGIN { printf "   median step %-4s %.4f s = %.2f x the SFT step (%.4f s)\n", r, t, t / l, l }'
done
echo "   (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
