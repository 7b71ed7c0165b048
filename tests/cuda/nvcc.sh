#!/bin/sh
# tests/cuda/nvcc.sh -- compile generated CUDA with nvcc, no GPU needed.
#
#   nvcc.sh project PARC MODEL.dsl WORK [parc options...]
#       parc --target cuda -o WORK/proj, then the generated CMakeLists.txt with
#       -DPARC_CUDA=ON builds parc_kernels_cuda (sm_80 and sm_90, nvcc warnings
#       as errors), and its saved report WORK/build/ptxas_report.txt is checked.
#   nvcc.sh source KERNELS.cu WORK
#       nvcc compiles one kernels.cu the same way (its header beside it).
#   nvcc.sh kernels PARC MODEL.dsl WORK [parc options...]
#       parc --target cuda --cuda-arch 90 -o WORK/proj, then nvcc compiles its
#       kernels.cu alone for sm_90 (a full-size model's kernels, without
#       building its project).
#   nvcc.sh trainer PARC MODEL.dsl WORK [parc options...]
#       parc --target all --cuda-arch 90 -o WORK/proj, then the generated
#       CMakeLists.txt with -DPARC_CUDA=ON -DTRAIN_WERROR=ON builds the GPU
#       trainer train_cuda (train_cuda.c, kernels.cu, libparcrt_cuda), warnings as
#       errors for gcc and nvcc; the binary must link and print its --help
#       without a GPU (no CUDA call happens before the first step); the saved
#       report WORK/build/ptxas_report.txt is checked for sm_90.
#
# The ptxas -v report must show every kernel instantiation compiled for each
# architecture built (sm_80 and sm_90; sm_90 alone for trainer) with 0 bytes
# of spill stores and loads.  Exit 77 (skipped)
# when there is no nvcc.  Prints the kernel count, register range and time.
set -eu
NVCC=${CUDACXX:-}
[ -n "$NVCC" ] || NVCC=$(command -v nvcc 2>/dev/null || true)
[ -n "$NVCC" ] || NVCC=/usr/local/cuda/bin/nvcc
if [ ! -x "$NVCC" ]; then
  echo "nvcc not found (CUDACXX, PATH, /usr/local/cuda/bin): skipped"
  exit 77
fi
mode=$1
shift
archs="sm_80 sm_90"

if [ "$mode" = trainer ]; then
  parc=$1 model=$2 work=$3
  shift 3
  rm -rf "$work"
  mkdir -p "$work"
  "$parc" "$model" --target all --cuda-arch 90 -o "$work/proj" "$@" > "$work/parc.log" 2>&1 ||
    { cat "$work/parc.log"; exit 1; }
  [ -f "$work/proj/train_cuda.c" ] || { echo "parc wrote no train_cuda.c:"; cat "$work/parc.log"; exit 1; }
  CUDACXX=$NVCC cmake -S "$work/proj" -B "$work/build" -DPARC_CUDA=ON -DTRAIN_WERROR=ON \
    > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
  t0=$(date +%s)
  cmake --build "$work/build" --target train_cuda > "$work/build.log" 2>&1 ||
    { cat "$work/build.log"; exit 1; }
  t1=$(date +%s)
  [ -x "$work/build/train_cuda" ] || { echo "no train_cuda"; exit 1; }
  "$work/build/train_cuda" --help > "$work/help.log" 2>&1 ||
    { echo "train_cuda --help failed:"; cat "$work/help.log"; exit 1; }
  grep -q '^usage: train_cuda' "$work/help.log" || { cat "$work/help.log"; exit 1; }
  echo "train_cuda built and linked ($(grep -c '_launch(' "$work/proj/train_cuda.c") kernel" \
    "launches, $(grep -c 'CHECK(rt_cuda_' "$work/proj/train_cuda.c") runtime calls), $((t1 - t0)) s"
  cu=$work/proj/kernels.cu
  report=$work/build/ptxas_report.txt
  archs=sm_90
elif [ "$mode" = project ]; then
  parc=$1 model=$2 work=$3
  shift 3
  rm -rf "$work"
  mkdir -p "$work"
  "$parc" "$model" --target cuda --cuda-arch 80,90 -o "$work/proj" "$@" > "$work/parc.log" 2>&1 ||
    { cat "$work/parc.log"; exit 1; }
  cu=$work/proj/kernels.cu
  CUDACXX=$NVCC cmake -S "$work/proj" -B "$work/build" -DPARC_CUDA=ON > "$work/cmake.log" 2>&1 ||
    { cat "$work/cmake.log"; exit 1; }
  t0=$(date +%s)
  cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
  t1=$(date +%s)
  report=$work/build/ptxas_report.txt
  [ -f "$work/build/libparc_kernels_cuda.a" ] || { echo "no libparc_kernels_cuda.a"; exit 1; }
elif [ "$mode" = kernels ]; then
  parc=$1 model=$2 work=$3
  shift 3
  rm -rf "$work"
  mkdir -p "$work"
  "$parc" "$model" --target cuda --cuda-arch 90 -o "$work/proj" "$@" > "$work/parc.log" 2>&1 ||
    { cat "$work/parc.log"; exit 1; }
  cu=$work/proj/kernels.cu
  report=$work/ptxas_report.txt
  archs=sm_90
  t0=$(date +%s)
  "$NVCC" -std=c++17 -c "$cu" -o "$work/kernels_cuda.o" --Werror=all-warnings --ptxas-options=-v \
    -gencode arch=compute_90,code=sm_90 2> "$report" || { cat "$report"; exit 1; }
  t1=$(date +%s)
elif [ "$mode" = source ]; then
  cu=$1 work=$2
  mkdir -p "$work"
  report=$work/ptxas_report.txt
  t0=$(date +%s)
  "$NVCC" -std=c++17 -c "$cu" -o "$work/kernels_cuda.o" --Werror=all-warnings --ptxas-options=-v \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 2> "$report" ||
    { cat "$report"; exit 1; }
  t1=$(date +%s)
else
  echo "usage: nvcc.sh project|trainer|kernels PARC MODEL.dsl WORK [parc options] |" \
    "source KERNELS.cu WORK" >&2
  exit 2
fi

[ -s "$report" ] || { echo "empty ptxas report $report"; exit 1; }
# instantiations: every __global__, twice for templates on VEC
n=$(grep -c '^__global__ void __launch_bounds__(' "$cu" || true)
nt=$(grep -c '^template <bool VEC>$' "$cu" || true)
want=$((n + nt))
status=0
for arch in $archs; do
  got=$(grep -c "Compiling entry function .* for '$arch'" "$report" || true)
  if [ "$got" != "$want" ]; then
    echo "FAIL: ptxas compiled $got kernels for $arch, expected $want"
    status=1
  fi
done
spills=$(grep 'bytes spill stores' "$report" | grep -v ' 0 bytes spill stores, 0 bytes spill loads' || true)
if [ -n "$spills" ]; then
  echo "FAIL: register spills:"
  # each spilling instantiation: its entry line, then its spill line
  awk '/Compiling entry function/ { entry = $0 }
       /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ { print entry; print }' \
    "$report"
  status=1
fi
regs=$(sed -n 's/.*Used \([0-9]*\) registers.*/\1/p' "$report" | sort -n)
echo "$n kernels ($nt templates on VEC, $want instantiations per arch), registers" \
  "$(echo "$regs" | head -1)..$(echo "$regs" | tail -1), spills: ${spills:-none}," \
  "nvcc $((t1 - t0)) s; report: $report"
exit $status
