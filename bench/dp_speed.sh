#!/usr/bin/env bash
# Data-parallel speed on one machine: 2 ranks x 1 OpenMP thread (cllm launch)
# against 1 process x 2 threads, same model, same global batch, same
# micro-batch shape (one config: train_batch_size = micro x accumulation x dp,
# so the single process accumulates the 2 micro-batches that the ranks
# compute side by side), for each ZeRO stage given.
#
#   bash bench/dp_speed.sh [--cllm build/cllm] [--stages "0 1 2"] [--reps 3]
#                          [--steps 8] [--skip 3] [--layers 6] [--embd 512]
#                          [--vocab 8192] [--seq 256] [--micro 4]
#
# Runs are interleaved (single, dp, single, dp, ... per stage) because the CPU
# share of this machine fluctuates; each run's tokens/s is the median of its
# metrics.jsonl records after the first --skip steps, and the table reports
# the median over runs and the ratio dp / single. The load average is
# printed before and after: figures taken under load are provisional. The
# report starts with bench/machine.py's line: CPU model, cores, ISA flags,
# oneDNN's effective ISA and cllm's GEMM kernels.
set -euo pipefail

CLLM=build/cllm
STAGES="0 1 2"
REPS=3
STEPS=8
SKIP=3
LAYERS=6
EMBD=512
VOCAB=8192
SEQ=256
MICRO=4
while [ $# -gt 0 ]; do
  case "$1" in
    --cllm) CLLM=$2 ;;
    --stages) STAGES=$2 ;;
    --reps) REPS=$2 ;;
    --steps) STEPS=$2 ;;
    --skip) SKIP=$2 ;;
    --layers) LAYERS=$2 ;;
    --embd) EMBD=$2 ;;
    --vocab) VOCAB=$2 ;;
    --seq) SEQ=$2 ;;
    --micro) MICRO=$2 ;;
    *) echo "dp_speed.sh: unknown flag $1 (see the header of this script)" >&2; exit 2 ;;
  esac
  shift 2
done
CLLM=$(realpath "$CLLM")
[ -x "$CLLM" ] || { echo "dp_speed.sh: $CLLM is not built" >&2; exit 1; }
[ "$SKIP" -lt "$STEPS" ] || { echo "dp_speed.sh: --skip must be below --steps" >&2; exit 2; }

WORK=$(mktemp -d -t cllm_dp_speed.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
/usr/bin/python3 "$(dirname "$0")/machine.py" --cllm "$CLLM"
echo "load before: $(uptime)"

"$CLLM" init --arch gpt2 --preset tiny --set n_layer="$LAYERS" --set n_embd="$EMBD" --set n_head=8 \
  --set vocab_size="$VOCAB" --set n_positions="$SEQ" --seed 1 --out "$WORK/model" >/dev/null
# random full-length rows: every position is a target
/usr/bin/python3 - "$WORK/train.jsonl" "$VOCAB" "$SEQ" $((2 * MICRO * STEPS)) <<'EOF'
import json, random, sys
path, vocab, seq, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = random.Random(1)
with open(path, "w") as f:
    for _ in range(n):
        f.write(json.dumps({"input_ids": [r.randrange(vocab) for _ in range(seq)]}) + "\n")
EOF

config() { # stage -> config path
  cat >"$WORK/s$1.json" <<EOF
{"model": "$WORK/model", "data": {"train": "$WORK/train.jsonl", "seq_len": $SEQ}, "shuffle": false,
 "train_batch_size": $((2 * MICRO)), "train_micro_batch_size_per_gpu": $MICRO, "train_iters": $STEPS,
 "log": "quiet", "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
 "zero_optimization": {"stage": $1}}
EOF
  echo "$WORK/s$1.json"
}

median_tps() { # metrics.jsonl -> median tokens/s after SKIP steps
  /usr/bin/python3 -c '
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [x["tokens_per_sec"] for x in r if "tokens_per_sec" in x and x["step"] > int(sys.argv[2])]
print(statistics.median(v))' "$1" "$SKIP"
}

params=$(/usr/bin/python3 -c '
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
import math
print(sum(math.prod(v["shape"]) for k, v in h.items() if k != "__metadata__"))' "$WORK/model/model.safetensors")
echo "model: gpt2 n_layer=$LAYERS n_embd=$EMBD vocab=$VOCAB ($params parameters), seq $SEQ, global batch $((2 * MICRO)) (micro $MICRO), AdamW fp32"
echo "runs: $REPS x (1 process x 2 threads, 2 ranks x 1 thread) per stage, $STEPS steps each, first $SKIP skipped"

declare -A RES
for stage in $STAGES; do
  cfg=$(config "$stage")
  for rep in $(seq "$REPS"); do
    out="$WORK/single_${stage}_$rep"
    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE "$CLLM" train --config "$cfg" --out "$out" >"$WORK/log" 2>&1 || { cat "$WORK/log" >&2; exit 1; }
    RES[single_$stage]+="$(median_tps "$out/metrics.jsonl") "
    out="$WORK/dp_${stage}_$rep"
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE "$CLLM" launch -n 2 -- train --config "$cfg" --out "$out" \
      >"$WORK/log" 2>&1 || { cat "$WORK/log" >&2; exit 1; }
    RES[dp_$stage]+="$(median_tps "$out/metrics.jsonl") "
  done
done

echo
echo "| ZeRO stage | 1 process x 2 threads tokens/s | 2 ranks x 1 thread tokens/s | dp / single | runs (single; dp) |"
echo "|---|---:|---:|---:|---|"
for stage in $STAGES; do
  /usr/bin/python3 -c '
import statistics, sys
s = [float(x) for x in sys.argv[2].split()]; d = [float(x) for x in sys.argv[3].split()]
ms, md = statistics.median(s), statistics.median(d)
runs = ", ".join("%.0f" % x for x in s) + "; " + ", ".join("%.0f" % x for x in d)
print("| %s | %.0f | %.0f | %.2fx | %s |" % (sys.argv[1], ms, md, md / ms, runs))
' "$stage" "${RES[single_$stage]}" "${RES[dp_$stage]}"
done
echo
echo "load after: $(uptime)"
