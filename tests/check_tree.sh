#!/usr/bin/env bash
# Repository hygiene: every shell script parses, and no tracked file holds a
# leftover merge-conflict marker. Prints "N passed, N failed".
cd "$(dirname "$0")/.." || exit 1
pass=0 fail=0
for f in scripts/*.sh bench/*.sh .ci/run tests/*.sh; do
  [ -f "$f" ] || continue
  if bash -n "$f"; then pass=$((pass + 1)); else echo "syntax error: $f"; fail=$((fail + 1)); fi
done
if git rev-parse --git-dir >/dev/null 2>&1; then
  markers=$(git grep -n -I -E '^(<<<<<<< |>>>>>>> |=======$)' -- . ':!tests/check_tree.sh' || true)
  if [ -n "$markers" ]; then echo "conflict markers:"; echo "$markers"; fail=$((fail + 1)); else pass=$((pass + 1)); fi
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
