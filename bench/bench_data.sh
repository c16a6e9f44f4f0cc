#!/usr/bin/env bash
# Throughput and peak memory of `cllm data prepare` (not a test).
#   bench/bench_data.sh [MB] [TOKENIZER_DIR...]
# Generates MB megabytes of mixed JSONL (pretrain, instruct, conversation
# records of English text with some Chinese), then prepares it with 1 and 2
# workers for each tokenizer (default: the gpt2 and tinyllama fixtures) and
# prints MB/s and peak RSS. Needs a built build/cllm and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-50}
shift || true
FIX=${CLLM_FIXTURES:-../shared/fixtures}/hf
TOKS=("$@")
[ ${#TOKS[@]} -eq 0 ] && TOKS=("$FIX/gpt2" "$FIX/tinyllama-1.1b-chat-v1.0")
WORK=${BENCH_DIR:-$(mktemp -d)}
trap 'rm -f "$WORK"/bench.jsonl "$WORK"/out.*' EXIT
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
for tok in "${TOKS[@]}"; do
  for w in 1 2; do
    /usr/bin/time -f "%M" -o "$WORK/rss" build/cllm data prepare --input "$WORK/bench.jsonl" --tokenizer "$tok" \
      --out "$WORK/out" --workers "$w" --seq-len 2048 >"$WORK/report" 2>/dev/null
    python3 - "$WORK/report" "$WORK/rss" "$(basename "$tok")" "$w" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); rss = int(open(sys.argv[2]).read().split()[-1])
print(f"{sys.argv[3]:28s} workers {sys.argv[4]}: {r['mb_per_s']:7.2f} MB/s  {r['tokens'] / r['seconds'] / 1e6:6.2f} "
      f"Mtok/s  {r['records']} records  peak RSS {rss / 1024:.0f} MB")
PY
  done
done
