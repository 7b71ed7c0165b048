#!/bin/sh
# tests/kir/print.sh KIR_GEN GOLDEN -- the printed test kernels must match
# GOLDEN.  KIR_UPDATE=1 rewrites GOLDEN instead (review the diff).
gen=$1
golden=$2
if [ "${KIR_UPDATE:-}" = 1 ]; then
  "$gen" --print > "$golden"
  exit
fi
"$gen" --print | diff -u "$golden" -
