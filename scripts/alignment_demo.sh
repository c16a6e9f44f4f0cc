#!/bin/bash
# The alignment pipeline end to end on a task it makes itself (no downloads,
# about a minute on 2 cores): a preference for responses that end in token
# 7 over those that end in token 9.
#   1. a small random LLaMA (the "SFT" model) and preference pairs
#   2. a reward model trained on the pairs (cllm train --task reward)
#   3. DPO on the same pairs (cllm train --task dpo): the implicit reward
#      margin and accuracy in training, and on the 32 held-out pairs
#      (eval_rewards/accuracies, eval_rewards/margins) before and after
#   4. PPO against the reward model (cllm train --task ppo): the mean reward
#      of the policy's own samples in the first and last PPO batch, and the
#      KL to the reference
#   5. step times of the three against the SFT (language-modelling) step
#   6. docs/alignment_demo.svg: the reward model's and DPO's held-out
#      preference accuracy (32 pairs) before and after training, the reward
#      model's mean margin, and the mean reward of the SFT, DPO and PPO models' samples (SVG=FILE
#      elsewhere, SVG= none)
# Output under build/alignment-demo/. See docs/alignment.md.
set -euo pipefail
cd "$(dirname "$0")/.."
CLLM=${CLLM:-build/cllm}
D=${OUT:-build/alignment-demo}
SVG=${SVG-docs/alignment_demo.svg}
[ -x "$CLLM" ] || { echo "build cllm first (cmake --build build)" >&2; exit 1; }
rm -rf "$D"
mkdir -p "$D"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

"$CLLM" init --arch llama --preset tiny --seed 1 --out "$D/sft" >/dev/null
# 64 pairs: a 3-token prompt, then [x, 7] (chosen) or [x, 9] (rejected);
# 64 prompts of 3 tokens for PPO; 64 plain rows for the SFT timing; 32
# held-out pairs drawn the same way
awk 'BEGIN { srand(3); for (i = 0; i < 96; i++) {
    p = sprintf("%d, %d, %d", 10 + int(rand() * 400), 10 + int(rand() * 400), 10 + int(rand() * 400))
    x = 10 + int(rand() * 400)
    pairs = i < 64 ? "'"$D/pairs.jsonl"'" : "'"$D/heldout.jsonl"'"
    printf "{\"prompt_input_ids\": [%s], \"chosen_input_ids\": [%d, 7], \"rejected_input_ids\": [%d, 9]}\n", p, x, x > pairs
    if (i >= 64) continue
    printf "{\"input_ids\": [%s]}\n", p > "'"$D/prompts.jsonl"'"
    printf "{\"input_ids\": [%s, %d, 7, %d, 7, %d, 7]}\n", p, x, x, x > "'"$D/sft.jsonl"'" } }'

metric() { # metric FILE KEY [first|last]: a key of the first or last step record
    awk -v k="\"$2\": " -v w="${3:-last}" 'index($0, "\"loss\"") && index($0, k) {
        s = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", s); v = s; if (w == "first" && !n) f = v; n++ }
        END { print (w == "first" ? f : v) }' "$1/metrics.jsonl"
}
evmetric() { # evmetric FILE KEY: a key of the last evaluation record
    awk -v k="\"$2\": " 'index($0, "\"eval_loss\"") && index($0, k) {
        s = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", s); v = s } END { print v }' "$1/metrics.jsonl"
}
median_step() { # the median step_time of a run
    awk -v k='"step_time": ' 'index($0, k) { s = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", s); print s }' \
        "$1/metrics.jsonl" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}
COMMON=(--seq-len 16 --log quiet --optimizer adamw --no-shuffle)

echo "== reward model (40 steps of 8 pairs)"
"$CLLM" train --task reward --model "$D/sft" --data "$D/pairs.jsonl" --out "$D/rm" --steps 40 --batch-size 8 \
    --lr 1e-2 --eval-data "$D/heldout.jsonl" --eval-interval 40 "${COMMON[@]}"
# the same start (same seed: the same score head) evaluated after a step at lr 0
"$CLLM" train --task reward --model "$D/sft" --data "$D/pairs.jsonl" --out "$D/rm0" --steps 1 --batch-size 8 \
    --lr 0 --eval-data "$D/heldout.jsonl" --eval-interval 1 "${COMMON[@]}"
RM_BEFORE=$(evmetric "$D/rm0" eval_accuracy) RM_AFTER=$(evmetric "$D/rm" eval_accuracy)
MARGIN_BEFORE=$(evmetric "$D/rm0" eval_rewards/margins) MARGIN_AFTER=$(evmetric "$D/rm" eval_rewards/margins)
echo "   accuracy: first step $(metric "$D/rm" accuracy first), last step $(metric "$D/rm" accuracy)"
echo "   held-out (32 pairs): accuracy before $RM_BEFORE, after $RM_AFTER;" \
    "mean margin r_c - r_r before $MARGIN_BEFORE, after $MARGIN_AFTER"

echo "== DPO (40 steps of 8 pairs, beta 0.1)"
"$CLLM" train --task dpo --model "$D/sft" --data "$D/pairs.jsonl" --out "$D/dpo" --steps 40 --batch-size 8 \
    --lr 1e-2 --beta 0.1 --eval-data "$D/heldout.jsonl" --eval-interval 40 "${COMMON[@]}"
# before: a step at lr 0, the policy still the reference (every implicit reward 0)
"$CLLM" train --task dpo --model "$D/sft" --data "$D/pairs.jsonl" --out "$D/dpo0" --steps 1 --batch-size 8 \
    --lr 0 --beta 0.1 --eval-data "$D/heldout.jsonl" --eval-interval 1 "${COMMON[@]}"
DPO_BEFORE=$(evmetric "$D/dpo0" eval_rewards/accuracies) DPO_AFTER=$(evmetric "$D/dpo" eval_rewards/accuracies)
echo "   rewards/margins: first step $(metric "$D/dpo" rewards/margins first), last $(metric "$D/dpo" rewards/margins)"
echo "   rewards/accuracies: first step $(metric "$D/dpo" rewards/accuracies first), last $(metric "$D/dpo" rewards/accuracies)"
echo "   held-out (32 pairs): eval_rewards/accuracies before $DPO_BEFORE, after $DPO_AFTER;" \
    "eval_rewards/margins before $(evmetric "$D/dpo0" eval_rewards/margins), after $(evmetric "$D/dpo" eval_rewards/margins)"

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
# bars.svg PANEL...: a hand-written SVG of bar panels, each "TITLE|LABEL=VALUE|LABEL=VALUE..."
bars_svg() {
    printf '%s\n' "$@" | awk -F'|' '
    function y(v) { return top + h - (v - lo) / (hi - lo) * h }
    { n = NF - 1; lo = 0; hi = 0
      for (i = 2; i <= NF; i++) { split($i, kv, "="); lab[i] = kv[1]; val[i] = kv[2] + 0
                                  if (val[i] > hi) hi = val[i]; if (val[i] < lo) lo = val[i] }
      hi = hi > lo ? hi * 1.15 : lo + 1; x0 = 70 + (NR - 1) * 420; top = 60; h = 300; w = 340
      out = out sprintf("<text x=\"%.1f\" y=\"35\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n", x0 + w / 2, $1)
      out = out sprintf("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", x0, top, w, h)
      out = out sprintf("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#888\"/>\n", x0, y(0), x0 + w, y(0))
      for (i = 2; i <= NF; i++) {
          bw = w / n * 0.6; bx = x0 + (i - 1.5) * w / n - bw / 2; yt = y(val[i] > 0 ? val[i] : 0)
          out = out sprintf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", bx, yt, bw, \
                            (y(0) > y(val[i]) ? y(0) - y(val[i]) : y(val[i]) - y(0)), i == 2 ? "#7f7f7f" : "#1f77b4")
          out = out sprintf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">%.3g</text>\n", bx + bw / 2, yt - 6, val[i])
          out = out sprintf("<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", bx + bw / 2, top + h + 18, lab[i]) } }
    END { printf "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"420\" viewBox=\"0 0 %d 420\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n%s</svg>\n", 60 + NR * 420, 60 + NR * 420, out }'
}
echo "== the reward model's score of each model's samples (64 prompts, 2 new tokens)"
evaluate "$D/sft" sft
evaluate "$D/dpo" dpo
evaluate "$D/ppo" ppo
if [ -n "$SVG" ]; then
    bars_svg "reward model: held-out preference accuracy|before=$RM_BEFORE|after 40 steps=$RM_AFTER" \
        "reward model: held-out mean margin r_c - r_r|before=$MARGIN_BEFORE|after 40 steps=$MARGIN_AFTER" \
        "DPO: held-out preference accuracy|before=$DPO_BEFORE|after 40 steps=$DPO_AFTER" \
        "mean reward of 64 sampled responses|SFT=$(metric "$D/eval-sft" env/reward_mean)|DPO=$(metric "$D/eval-dpo" env/reward_mean)|PPO=$(metric "$D/eval-ppo" env/reward_mean)" \
        > "$SVG.tmp" && mv "$SVG.tmp" "$SVG"
    echo "   wrote $SVG"
fi

echo "== SFT step for comparison (8 rows of 16 tokens)"
"$CLLM" train --model "$D/sft" --data "$D/sft.jsonl" --out "$D/lm" --steps 20 --batch-size 8 --lr 1e-3 "${COMMON[@]}"
LM=$(median_step "$D/lm")
for run in rm dpo ppo; do
    T=$(median_step "$D/$run")
    awk -v r="$run" -v t="$T" -v l="$LM" 'BEGIN { printf "   median step %-4s %.4f s = %.2f x the SFT step (%.4f s)\n", r, t, t / l, l }'
done
echo "   (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
