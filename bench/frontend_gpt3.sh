#!/bin/sh
# Times parc's frontend (parse + lower + passes) on
# GPT-3 175B: 96 layers, d 12288, 96 heads, seq 2048, written as
# examples/gpt2.dsl with -D overrides.  Prints the median of RUNS runs, the
# phases of the median run, and the ratio to the 100 ms goal (issue 2).
# usage: bench/frontend_gpt3.sh [BUILD_DIR] [RUNS]
set -eu
build=${1:-build} runs=${2:-21}
cd "$(dirname "$0")/.."
[ -x "$build/parc" ] || { echo "build parc first (scripts/test.sh or cmake --build $build)"; exit 1; }
args="examples/gpt2.dsl -D vocab=50257 -D seq=2048 -D d=12288 -D heads=96 -D layers=96"
# shellcheck disable=SC2086
"$build/parc" $args | grep -E "^(model|parameters|flops per token)"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
i=0
while [ $i -lt "$runs" ]; do
  # shellcheck disable=SC2086
  "$build/parc" $args --time 2>&1 >/dev/null | grep '^time:' >>"$tmp"
  i=$((i + 1))
done
sort -t, -k4 -n "$tmp" >/dev/null
python3 - "$tmp" <<'PY'
import re, statistics, sys
rows = [list(map(float, re.findall(r"([\d.]+) ms", l))) for l in open(sys.argv[1])]
# the goal is the frontend: parse + lower + passes (the report's per-rank kernel and
# buffer plan is codegen, timed beside it)
rows.sort(key=lambda r: r[0] + r[1] + r[2])
med = rows[len(rows) // 2]
front = med[0] + med[1] + med[2]
print(f"median of {len(rows)} runs: parse {med[0]:.2f} ms, lower {med[1]:.2f} ms, "
      f"passes {med[2]:.2f} ms: {front:.2f} ms; whole command {med[3]:.2f} ms, of it the "
      f"per-rank kernel and buffer plan {med[4]:.2f} ms")
print(f"ratio to the 100 ms goal: {front / 100:.3f}")
PY
