#!/bin/sh
# tests/gpu/check.sh -- the GPU checks of issue 7, in one run on a lent GPU
# machine (one H200: well under 8 minutes).  From the repository root:
#
#   sh tests/gpu/check.sh            # work in $WORK (default /tmp/parc_gpu_check)
#
# Builds parc (Release, libparcrt_cuda for $ARCH only), then:
#   1. ops      runtime/cuda's ops against the CPU runtime's (gpu_ops_check:
#               GEMMs, flash attention forward and backward, embedding,
#               cross-entropy, their gradients, vocab-parallel at 2 members),
#               with each one's time and achieved TFLOP/s or GB/s;
#   2. fp32     for gpt2_tiny, llama_tiny, moe_tiny: train (CPU) and train_cuda
#               (GPU) from the same seed for $STEPS steps, losses within 1e-4
#               relative at every step; the step-1 gradients (--save-grads)
#               per tensor within 1e-4 relative L2 (this localises a wrong
#               fused kernel to the parameters it feeds);
#   3. tp=2     gpt2_tiny and llama_tiny at --tp 2 on the device-local backend
#               (2 ranks as threads sharing the one GPU, host-staged exact
#               collectives) against the one-rank CPU losses;
#   3b. pp=2    gpt2_tiny, llama_tiny and moe_tiny at --tp 2 --pp 2 (moe_tiny
#               with its 2 microbatches): train_cuda on the device-local backend
#               (4 ranks as threads on the one GPU, host-staged collectives and
#               pipeline transfers) against train, the CPU trainer of the same
#               layout, $STEPS steps, 1e-4 relative;
#   4. bf16     GPT-2 small (examples/gpt2.dsl, precision = bf16) for
#               $BENCH_STEPS steps: tokens/s and MFU against $PEAK_TFLOPS.
# Prints a table at the end; the logs are in $WORK (and copied to $OUT when the
# device runner sets it).  Exit 0 iff every check passed.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/parc_gpu_check}
ARCH=${ARCH:-90}                 # H100/H200: 90; A100: 80
STEPS=${STEPS:-20}
BENCH_STEPS=${BENCH_STEPS:-30}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}  # H200 SXM dense bf16
JOBS=$(nproc 2>/dev/null || echo 8)
T0=$(date +%s)
rm -rf "$WORK"
mkdir -p "$WORK"
TABLE=$WORK/table.txt
: > "$TABLE"
STATUS=0

say() { printf '\n== %s  [%ds]\n' "$*" $(($(date +%s) - T0)); }
row() { printf '%-34s %-5s %s\n' "$1" "$2" "$3" >> "$TABLE"; }
# result NAME LOGFILE: the RESULT line of compare.py into the table
result() {
  line=$(grep '^RESULT ' "$2" | tail -1 || true)
  verdict=$(echo "$line" | cut -d' ' -f2)
  [ -n "$verdict" ] || verdict=FAIL
  row "$1" "$verdict" "$(echo "$line" | cut -d' ' -f3-)"
  [ "$verdict" = FAIL ] && STATUS=1
  return 0
}
finish() {
  say "summary"
  echo "parc GPU checks, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,driver_version \
    --format=csv,noheader 2>/dev/null | head -1 || echo 'GPU unknown')"
  printf '%-34s %-5s %s\n' check result detail
  cat "$TABLE"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$TABLE" "$OUT/" 2>/dev/null || true
    find "$WORK" -maxdepth 2 \( -name '*.log' -o -name '*.jsonl' -o -name 'ptxas_report.txt' \) \
      -exec cp {} "$OUT/" \; 2>/dev/null || true
  fi
  echo "total $(($(date +%s) - T0)) s; $( [ $STATUS = 0 ] && echo ALL PASSED || echo SOME FAILED)"
}
trap finish EXIT

command -v python3 > /dev/null || { echo "python3 is needed (tests/gpu/compare.py)"; exit 2; }
nvidia-smi -L || echo "nvidia-smi not found; going on"

say "build parc (Release, libparcrt_cuda for sm_$ARCH)"
if ! { cmake -S "$ROOT" -B "$WORK/parc" -DCMAKE_BUILD_TYPE=Release \
         -DPARC_CUDA_ARCHITECTURES="$ARCH" > "$WORK/parc_cmake.log" 2>&1 &&
       cmake --build "$WORK/parc" -j "$JOBS" --target parc gpu_ops_check \
         > "$WORK/parc_build.log" 2>&1; }; then
  tail -40 "$WORK/parc_cmake.log" "$WORK/parc_build.log"
  row "build parc + libparcrt_cuda" FAIL "see parc_build.log"
  STATUS=1
  exit 1
fi
row "build parc + libparcrt_cuda" PASS "$(($(date +%s) - T0)) s"
PARC=$WORK/parc/parc

say "1. runtime ops against the CPU"
if "$WORK/parc/gpu_ops_check" > "$WORK/ops.log" 2>&1; then v=PASS; else v=FAIL; STATUS=1; fi
cat "$WORK/ops.log"
row "ops: gemm/attention/xent vs CPU" "$v" "$(grep -c ' ok ' "$WORK/ops.log" || true) cases ok"

# build_project NAME DSL TARGETS [parc options]: parc -o $WORK/NAME, then make TARGETS
build_project() {
  name=$1 dsl=$2 targets=$3
  shift 3
  d=$WORK/$name
  "$PARC" "$ROOT/examples/$dsl" --target all --cuda-arch "$ARCH" -o "$d" "$@" \
    > "$WORK/$name.parc.log" 2>&1 &&
  cmake -S "$d" -B "$d/build" -DPARC_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    > "$WORK/$name.cmake.log" 2>&1 &&
  for t in $targets; do
    cmake --build "$d/build" -j "$JOBS" --target "$t" >> "$WORK/$name.build.log" 2>&1 || return 1
  done
}

for model in gpt2_tiny llama_tiny moe_tiny; do
  say "2. fp32 $model: CPU vs GPU, $STEPS steps"
  if ! build_project "$model" "$model.dsl" "train train_cuda"; then
    tail -30 "$WORK/$model.parc.log" "$WORK/$model.cmake.log" "$WORK/$model.build.log" 2>/dev/null
    row "fp32 $model" FAIL "build failed"
    STATUS=1
    continue
  fi
  b=$WORK/$model/build
  "$b/train" --steps "$STEPS" --log "$WORK/$model.cpu.jsonl" --save-grads "$WORK/$model.cpu_grads.safetensors" \
    --quiet > "$WORK/$model.cpu.log" 2>&1 || { cat "$WORK/$model.cpu.log"; }
  PARC_CUDA_GEMM=fp32 "$b/train_cuda" --steps "$STEPS" --log "$WORK/$model.gpu.jsonl" \
    --save-grads "$WORK/$model.gpu_grads.safetensors" --quiet > "$WORK/$model.gpu.log" 2>&1 ||
    { cat "$WORK/$model.gpu.log"; }
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/$model.cpu.jsonl" "$WORK/$model.gpu.jsonl" 1e-4 \
    > "$WORK/$model.cmp.log" 2>&1 || true
  cat "$WORK/$model.cmp.log"
  result "fp32 $model losses" "$WORK/$model.cmp.log"
  python3 "$ROOT/tests/gpu/compare.py" grads "$WORK/$model.cpu_grads.safetensors" \
    "$WORK/$model.gpu_grads.safetensors" 1e-4 > "$WORK/$model.grads.log" 2>&1 || true
  cat "$WORK/$model.grads.log"
  result "fp32 $model step-1 gradients" "$WORK/$model.grads.log"
done

for model in gpt2_tiny llama_tiny; do
  say "3. fp32 $model at tp=2 on the device-local backend"
  name=${model}_tp2
  if ! build_project "$name" "$model.dsl" "train_cuda" --tp 2; then
    tail -30 "$WORK/$name.parc.log" "$WORK/$name.build.log" 2>/dev/null
    row "tp=2 $model" FAIL "build failed"
    STATUS=1
    continue
  fi
  PARC_CUDA_COMM=host PARC_CUDA_GEMM=fp32 "$WORK/$name/build/train_cuda" --steps "$STEPS" \
    --log "$WORK/$name.gpu.jsonl" --quiet > "$WORK/$name.gpu.log" 2>&1 || cat "$WORK/$name.gpu.log"
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/$model.cpu.jsonl" "$WORK/$name.gpu.jsonl" 1e-4 \
    > "$WORK/$name.cmp.log" 2>&1 || true
  cat "$WORK/$name.cmp.log"
  result "tp=2 $model vs 1-rank CPU" "$WORK/$name.cmp.log"
done

for cfg in gpt2_tiny llama_tiny moe_tiny:--microbatches:2; do
  model=${cfg%%:*}
  extra=$(echo "$cfg" | cut -s -d: -f2- | tr ':' ' ')
  name=${model}_tp2_pp2
  say "3b. fp32 $model at tp=2 pp=2 on the device-local backend"
  # shellcheck disable=SC2086
  if ! build_project "$name" "$model.dsl" "train train_cuda" --tp 2 --pp 2 $extra; then
    tail -30 "$WORK/$name.parc.log" "$WORK/$name.build.log" 2>/dev/null
    row "tp=2 pp=2 $model" FAIL "build failed"
    STATUS=1
    continue
  fi
  b=$WORK/$name/build
  "$b/train" --steps "$STEPS" --log "$WORK/$name.cpu.jsonl" --quiet > "$WORK/$name.cpu.log" 2>&1 ||
    cat "$WORK/$name.cpu.log"
  PARC_CUDA_COMM=host PARC_CUDA_GEMM=fp32 "$b/train_cuda" --steps "$STEPS" \
    --log "$WORK/$name.gpu.jsonl" --quiet > "$WORK/$name.gpu.log" 2>&1 || cat "$WORK/$name.gpu.log"
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/$name.cpu.jsonl" "$WORK/$name.gpu.jsonl" 1e-4 \
    > "$WORK/$name.cmp.log" 2>&1 || true
  cat "$WORK/$name.cmp.log"
  result "tp=2 pp=2 $model vs CPU tp=2 pp=2" "$WORK/$name.cmp.log"
done

say "4. bf16 GPT-2 small: $BENCH_STEPS steps"
if build_project gpt2 gpt2.dsl "train_cuda"; then
  "$WORK/gpt2/build/train_cuda" --steps "$BENCH_STEPS" --log "$WORK/gpt2.bf16.jsonl" \
    > "$WORK/gpt2.bf16.log" 2>&1 || cat "$WORK/gpt2.bf16.log"
  tail -3 "$WORK/gpt2.bf16.log"
  python3 "$ROOT/tests/gpu/compare.py" bench "$WORK/gpt2.bf16.jsonl" "$WORK/gpt2/plan.json" \
    "$PEAK_TFLOPS" 5 > "$WORK/gpt2.bench.log" 2>&1 || true
  cat "$WORK/gpt2.bench.log"
  result "bf16 gpt2 (124M) B8xT1024" "$WORK/gpt2.bench.log"
else
  tail -30 "$WORK/gpt2.parc.log" "$WORK/gpt2.build.log" 2>/dev/null
  row "bf16 gpt2" FAIL "build failed"
  STATUS=1
fi
exit $STATUS
