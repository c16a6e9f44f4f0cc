# Sourced by scripts/demo.sh and scripts/lora_demo.sh.
#
#   demo_start NAME
#
# starts the clock of `section` (which prints "== TITLE  [Ns]") and sets
# `cllm`: DEMO_CLLM when given, else a Release build of the tree in build/.
demo_start() {
  t0=$(date +%s)
  if [ -n "${DEMO_CLLM:-}" ]; then
    cllm=$DEMO_CLLM
  else
    section "build"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j"$(nproc)" >/dev/null
    cllm=build/cllm
  fi
  [ -x "$cllm" ] || { echo "$1: $cllm is not an executable" >&2; exit 1; }
}
section() { printf '\n== %s  [%ds]\n' "$*" $(( $(date +%s) - t0 )); }

#   heldout_accuracy CLLM HELDOUT.tsv SHOW [generate flags...]
#
# asks every held-out number of a parity demo with `cllm generate
# --greedy`, rendered with the Alpaca template exactly as training rendered
# it (half the prompts with the number as "input"), and counts exact
# "even"/"odd" answers.
#
# prints the first SHOW answers; sets `right` and `asked`.
heldout_accuracy() {
  local cllm=$1 tsv=$2 show=$3 num want q prompt got ok
  shift 3
  local hdr=$'Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n### Instruction:\n'
  local hdri=$'Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.\n\n### Instruction:\n'
  right=0; asked=0
  while IFS=$'\t' read -r num want; do
    if [ $(( asked / 2 % 2 )) = 0 ]; then
      q="Is $num even or odd?"; prompt="$hdr$q"$'\n\n### Response:\n'
    else
      q="Is this number even or odd? [input: $num]"
      prompt="$hdri"$'Is this number even or odd?\n\n### Input:\n'"$num"$'\n\n### Response:\n'
    fi
    got=$("$cllm" generate "$@" --prompt "$prompt" --greedy --max-new-tokens 8 2>/dev/null)
    got=$(printf '%s' "$got" | tr -d '[:space:]')
    ok=no; [ "$got" = "$want" ] && { ok=yes; right=$((right + 1)); }
    [ "$asked" -lt "$show" ] && printf '  %-42s -> %-6s (expected %s: %s)\n' "$q" "$got" "$want" "$ok"
    asked=$((asked + 1))
  done < "$tsv"
  [ "$asked" -gt "$show" ] && echo "  ... ($((asked - show)) more)"
  return 0
}
