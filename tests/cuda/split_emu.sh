#!/bin/sh
# tests/cuda/split_emu.sh -- cu_split's kernels.cu on the CPU (no GPU, no nvcc).
#
#   split_emu.sh CU_SPLIT CXX SRCDIR WORK
#
# cu_split writes WORK/kernels.cu; this rewrites it for kcu_emu.h (the
# include, and every `K<<<grid, block, 0, stream>>>(` launch to
# `kcu_emu_launch(grid, block, K, `), compiles cu_split_emu.cpp with it
# (C++17, no FP contraction) and runs it.  Exit 77 (skipped) without a C++
# compiler or <ucontext.h>.
set -eu
gen=$1 cxx=$2 src=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
"$gen" "$work" > "$work/gen.log" 2>&1 || { cat "$work/gen.log"; exit 1; }
command -v "$cxx" > /dev/null 2>&1 || { echo "no C++ compiler '$cxx': skipped"; exit 77; }
printf '#include <ucontext.h>\nint main(void) { ucontext_t c; return getcontext(&c); }\n' > "$work/uc.cpp"
"$cxx" "$work/uc.cpp" -o "$work/uc" > /dev/null 2>&1 || { echo "no <ucontext.h>: skipped"; exit 77; }
sed -E -e 's|^#include <cuda_runtime.h>$|#include "kcu_emu.h"|' \
  -e 's/^( *)([A-Za-z_][A-Za-z0-9_]*(<true>|<false>)?)<<<([^,]*), ([0-9]+), 0, stream>>>\(/\1kcu_emu_launch(\4, \5, \2, /' \
  "$work/kernels.cu" > "$work/kernels_emu.cu"
if grep -n '<<<' "$work/kernels_emu.cu"; then
  echo "a launch was not rewritten"
  exit 1
fi
"$cxx" -std=c++17 -O1 -g -ffp-contract=off -Wall -Wno-unknown-pragmas -Wno-unused-function \
  -I"$work" -I"$src" "$src/cu_split_emu.cpp" -o "$work/emu" 2> "$work/cxx.log" ||
  { cat "$work/cxx.log"; exit 1; }
"$work/emu"
