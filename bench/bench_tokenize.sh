#!/usr/bin/env bash
# Tokenizer encode throughput, single thread, in one run: cllm, tiktoken's
# npm build (GPT-2 encoding) and transformers.js, on English and Chinese
# text, alternating the implementations (A B C A B C) so a change in this
# machine's CPU share hits all of them alike. Text comes from the machine's
# own documentation (English) and the seed notes plus generated Chinese
# sentences (Chinese); 100 KB documents. The report starts with
# bench/machine.py's line (CPU model, cores, ISA flags) and node's version.
# Usage: bash bench/bench_tokenize.sh [MB per language, default 8] [rounds, default 2]
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-8}
ROUNDS=${2:-2}
FIX=$(realpath "${CLLM_FIXTURES:-../shared/fixtures}/hf")
work=build/bench-tokenize
mkdir -p "$work"
cmake --build build --target tokenizer_bench >/dev/null
if [ ! -d build/oracle/node_modules/tiktoken ]; then
  rm -rf build/oracle && cp -r "${FIX}/../../tools" build/oracle && chmod -R u+w build/oracle
  (cd build/oracle && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
fi
cp bench/tokenize_js.mjs build/oracle/
/usr/bin/python3 bench/machine.py --cllm build/cllm
echo "node $(node --version)"

# English: plain-text docs of this machine, repeated to size
# (head ends the pipes early on purpose: pipefail is off for these lines).
# iconv -c drops invalid sequences, and a character cut by head -c, but then
# exits 1 all the same: clean_utf8 keeps its output and fails only if it is empty.
clean_utf8() { iconv -f utf-8 -t utf-8 -c >"$1" || [ -s "$1" ]; }
set +o pipefail
find /usr/share/doc -name '*.txt' -o -name 'README*' -o -name 'copyright' 2>/dev/null | head -3000 |
  xargs cat 2>/dev/null | clean_utf8 "$work/en-base.txt"
: > "$work/en-all.txt"
[ -s "$work/en-base.txt" ] || { echo "bench_tokenize: no English text found under /usr/share/doc" >&2; exit 1; }
while [ "$(stat -c %s "$work/en-all.txt")" -lt $((MB * 1000000)) ]; do cat "$work/en-base.txt" >> "$work/en-all.txt"; done
head -c $((MB * 1000000)) "$work/en-all.txt" | clean_utf8 "$work/en.txt"
# Chinese: the seed notes' Chinese lines and sentences assembled from them
cat ../shared/seeds/*.txt 2>/dev/null | grep -P '[\x{4e00}-\x{9fff}]' > "$work/zh-base.txt" || true
[ -s "$work/zh-base.txt" ] || { echo "bench_tokenize: no Chinese lines in ../shared/seeds/*.txt" >&2; exit 1; }
: > "$work/zh.txt"
while [ "$(stat -c %s "$work/zh.txt")" -lt $((MB * 1000000)) ]; do
  shuf --random-source=<(yes) "$work/zh-base.txt" >> "$work/zh.txt"
done
head -c $((MB * 1000000)) "$work/zh.txt" | clean_utf8 "$work/zh-cut.txt"
set -o pipefail

for lang in en zh-cut; do
  for r in $(seq "$ROUNDS"); do
    echo "== $lang round $r"
    for model in gpt2 tinyllama-1.1b-chat-v1.0; do
      OMP_NUM_THREADS=1 build/tests/tokenizer_bench "$FIX/$model" "$work/$lang.txt" 100000 1
      (cd build/oracle && node tokenize_js.mjs "$FIX/$model" "../bench-tokenize/$lang.txt" 100000)
    done
    (cd build/oracle && node tokenize_js.mjs "$FIX/gpt2" "../bench-tokenize/$lang.txt" 100000 tiktoken)
  done
done
