#!/usr/bin/env bash
# Throughput and peak memory of `cllm data prepare` (not a test).
#   bench/bench_data.sh [MB] [TOKENIZER_DIR...]
# Generates MB megabytes of mixed JSONL (pretrain, instruct, conversation
# records of English text with some Chinese), then prepares it with 1 and 2
# workers for each tokenizer (default: the gpt2 and tinyllama fixtures),
# BENCH_ROUNDS times (default 3) interleaved (every setting once per round,
# since this machine's CPU share drifts), and prints each run, then the
# median MB/s, Mtokens/s and peak RSS per setting and the median over rounds
# of the 2-worker / 1-worker ratio. The report starts with bench/machine.py's line (CPU
# model, cores, ISA flags, oneDNN's ISA). Needs a built build/cllm and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-50}
shift || true
FIX=${CLLM_FIXTURES:-../shared/fixtures}/hf
TOKS=("$@")
ROUNDS=${BENCH_ROUNDS:-3}
[ ${#TOKS[@]} -eq 0 ] && TOKS=("$FIX/gpt2" "$FIX/tinyllama-1.1b-chat-v1.0")
# A folder of our own (mktemp) goes entirely; a BENCH_DIR given by the
# caller keeps everything but this script's files.
if [ -n "${BENCH_DIR:-}" ]; then
  WORK=$BENCH_DIR
  trap 'rm -f "$WORK"/bench.jsonl "$WORK"/out.* "$WORK"/runs.jsonl' EXIT
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
/usr/bin/python3 bench/machine.py --cllm build/cllm
: >"$WORK/runs.jsonl"
python3 - "$WORK/bench.jsonl" "$MB" <<'PY'
import json, random, sys
path, mb = sys.argv[1], float(sys.argv[2])
rng = random.Random(0)
words = ("the of and to in is was for on that with as by at from his her an were are which this be "
         "river model data token train weight layer vector paper result value system time year "
         "数据 模型 训练 你好 今天").split()
def text(n): return " ".join(rng.choice(words) for _ in range(n))
target, size = int(mb * 1e6), 0
with open(path, "w", encoding="utf-8") as f:
    while size < target:
        k = rng.random()
        if k < 0.5:
            r = {"text": text(rng.randint(50, 600))}
        elif k < 0.8:
            r = {"instruction": text(12), "input": text(rng.randint(0, 40)), "output": text(rng.randint(20, 200))}
        else:
            r = {"type": "conversation", "rounds": [["ask", text(15)], ["ans", text(60)], ["ask", text(10)],
                                                    ["ask", text(8)], ["ans", text(40)]]}
        line = json.dumps(r, ensure_ascii=False) + "\n"
        f.write(line)
        size += len(line.encode())
PY
echo "input: $(du -m "$WORK/bench.jsonl" | cut -f1) MB of JSONL"
for round in $(seq "$ROUNDS"); do
  for tok in "${TOKS[@]}"; do
    for w in 1 2; do
      /usr/bin/time -f "%M" -o "$WORK/rss" build/cllm data prepare --input "$WORK/bench.jsonl" --tokenizer "$tok" \
        --out "$WORK/out" --workers "$w" --seq-len 2048 >"$WORK/report" 2>/dev/null
      python3 - "$WORK/report" "$WORK/rss" "$(basename "$tok")" "$w" "$round" "$WORK/runs.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); rss = int(open(sys.argv[2]).read().split()[-1])
run = {"tok": sys.argv[3], "workers": int(sys.argv[4]), "round": int(sys.argv[5]), "mb_s": r["mb_per_s"],
       "mtok_s": r["tokens"] / r["seconds"] / 1e6, "records": r["records"], "rss_mb": rss / 1024}
print(f"round {sys.argv[5]} {run['tok']:28s} workers {run['workers']}: {run['mb_s']:7.2f} MB/s  "
      f"{run['mtok_s']:6.2f} Mtok/s  {run['records']} records  peak RSS {run['rss_mb']:.0f} MB")
with open(sys.argv[6], "a") as f:
    f.write(json.dumps(run) + "\n")
PY
    done
  done
done
python3 - "$WORK/runs.jsonl" "$ROUNDS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print(f"\nmedians of {sys.argv[2]} interleaved rounds:\n")
print("| tokenizer | workers | MB/s | Mtokens/s | peak RSS | 2 workers / 1 worker |")
print("|---|---:|---:|---:|---:|---:|")
med = {}
for run in runs:
    med.setdefault((run["tok"], run["workers"]), []).append(run)
for (tok, w), rs in med.items():
    mb = statistics.median(r["mb_s"] for r in rs)
    # ratio round by round (the two ran a few seconds apart), then its median
    one = {r["round"]: r["mb_s"] for r in med.get((tok, 1), [])}
    pairs = [r["mb_s"] / one[r["round"]] for r in rs if r["round"] in one]
    ratio = f"{statistics.median(pairs):.2f}x" if w == 2 and pairs else ""
    print(f"| {tok} | {w} | {mb:.1f} | {statistics.median(r['mtok_s'] for r in rs):.2f} | "
          f"{max(r['rss_mb'] for r in rs):.0f} MB | {ratio} |")
PY
