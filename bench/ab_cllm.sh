#!/bin/bash
# Two cllm builds against each other (a change against its base): median
# training step time and greedy generation wall time on one LLaMA "small"
# model, interleaved A B A B, load average after each round.
#   bash bench/ab_cllm.sh A_CLLM B_CLLM [ROUNDS=5]
# Train: `cllm train` B=4 T=64, 6 AdamW steps, step_time of metrics.jsonl
# (first step dropped), median per run. Generate: wall time of `cllm
# generate --greedy` of 64 tokens after an 8-token prompt (loading included).
set -e
A=$1; B=$2; R=${3:-5}
[ -x "$A" ] && [ -x "$B" ] || { echo "usage: bash bench/ab_cllm.sh A_CLLM B_CLLM [ROUNDS]" >&2; exit 2; }
W=$(mktemp -d /tmp/cllm-ab-XXXXXX); trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
echo "machine: $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), OMP_NUM_THREADS=$OMP_NUM_THREADS"
"$B" init --arch llama --preset small --seed 1 --out "$W/m" >/dev/null 2>&1
/usr/bin/python3 - "$W/d.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for _ in range(48):
        f.write(json.dumps({"input_ids": [random.randrange(1000) for _ in range(65)]}) + "\n")
PY
for r in $(seq "$R"); do
  for k in A B; do
    bin=${!k}; rm -rf "$W/o"
    "$bin" train --model "$W/m" --data "$W/d.jsonl" --out "$W/o" --steps 6 --batch-size 4 --seq-len 64 --no-shuffle \
        --log quiet >/dev/null 2>&1
    /usr/bin/python3 -c "
import json, statistics
t = [json.loads(l)['step_time'] for l in open('$W/o/metrics.jsonl') if 'step_time' in l][1:]
print('train %s %.4f' % ('$k', statistics.median(t)))"
    s=$(date +%s.%N)
    "$bin" generate --model "$W/m" --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 64 --greedy >/dev/null 2>&1
    e=$(date +%s.%N)
    echo "gen $k $(echo "$e - $s" | bc)"
  done
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
done | tee "$W/log"
/usr/bin/python3 - "$W/log" <<'PY'
import statistics as st, sys
d, loads = {}, []
for line in open(sys.argv[1]):
    p = line.split()
    if p[0] == "load":
        loads.append(float(p[1]))
    else:
        d.setdefault((p[0], p[1]), []).append(float(p[2]))
for what in ("train", "gen"):
    a, b = st.median(d[(what, "A")]), st.median(d[(what, "B")])
    print("%-5s median A %.4f s, B %.4f s, B/A %.3f (%d rounds)" % (what, a, b, b / a, len(d[(what, "A")])))
print("load average (1 min) %.1f-%.1f" % (min(loads), max(loads)))
PY
