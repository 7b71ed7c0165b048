#!/bin/sh
# tests/gpu/check.sh -- the GPU checks of issue 7, in one run on a lent GPU
# machine (one H200: well under 8 minutes).  From the repository root:
#
#   sh tests/gpu/check.sh [all|build|run]     # work in $WORK (default /tmp/parc_gpu_check)
#
#   all    (default) build and run here: the machine needs the whole toolchain
#          (flex, bison, LLVM, OpenBLAS, cJSON, CUDA with NCCL) and a GPU;
#   build  everything that needs no GPU, on a machine with the toolchain: parc,
#          the generated projects, and the CPU reference runs; then bundles the
#          run's binaries, logs and the shared libraries they need that are not
#          CUDA's into $WORK.tar.xz (tens of MiB), so that
#   run    on the GPU machine (CUDA runtime, cuBLASLt and NCCL found there, in
#          /usr/local or a Python package's lib folder) runs only the GPU part:
#            tar -C /tmp -xJf parc_gpu_check.tar.xz && sh tests/gpu/check.sh run
#
# The checks:
#   0. build    parc (Release, libparcrt_cuda for $ARCH only, no MPI);
#   1. ops      bench/gemm_gpu.cu (cuBLASLt on GPT-2's GEMM shapes: fp32 operands
#               as parc stores them against bf16 ones) and runtime/cuda's ops against the CPU runtime's (gpu_ops_check:
#               GEMMs, flash attention forward and backward, embedding,
#               cross-entropy, their gradients, vocab-parallel at 2 members;
#               the cross-entropy gradients also in place, bit for bit),
#               with each one's time and achieved TFLOP/s or GB/s; the
#               device-local collectives (gpu_local_check: PARC_CUDA_LOCAL=device
#               against the thread communicator, bit for bit);
#   2. fp32     for gpt2_tiny, llama_tiny, moe_tiny (and with z-loss and a
#               shared expert): train (CPU) and train_cuda
#               (GPU) from the same seed for $STEPS steps, losses within 1e-4
#               relative at every step; the step-1 gradients (--save-grads)
#               per tensor within 1e-4 relative L2 (this localises a wrong
#               fused kernel to the parameters it feeds);
#   2g. graph   gpt2_tiny and llama_tiny fp32 with PARC_CUDA_GRAPH=1 (the step
#               captured on step 2, replayed after) against =0, $STEPS steps,
#               losses bit for bit, and no fallback notice; moe_tiny with =1
#               prints the routing notice once and equals =0 bit for bit; each
#               with =auto (the trainers' default) too: the same bits, no notice;
#   3. tp=2     gpt2_tiny and llama_tiny at --tp 2 on the device-local backend
#               (2 ranks as threads sharing the one GPU, host-staged exact
#               collectives) against the one-rank CPU losses;
#   3b. pp=2    gpt2_tiny, llama_tiny and moe_tiny at --tp 2 --pp 2 (moe_tiny
#               with its 2 microbatches): train_cuda on the device-local backend
#               (4 ranks as threads on the one GPU, host-staged collectives and
#               pipeline transfers) against train, the CPU trainer of the same
#               layout, $STEPS steps, 1e-4 relative;
#   3c. more    moe_tiny at pp=2 x dp=2 ep=2 (2 microbatches), at dp=2 ep=2 with
#               2 microbatches (gradient accumulation), at dp=4 ep=2 --zero 1, and
#               gpt2_tiny at dp=2 --zero 1: train_cuda against train of the same
#               layout, $STEPS steps, 1e-4 relative;
#   3d. device  the layouts of 3, 3b and 3c again with PARC_CUDA_LOCAL=device (the
#               device-local collectives: device copies and reduction kernels, no
#               host staging): against the same CPU references at 1e-4, and the
#               losses bit for bit equal to the host-staged run's;
#   3n. nccl    only where the machine has 2 (4) GPUs or more: the tp=2 (tp=2
#               pp=2) layouts of 3 and 3b with PARC_CUDA_COMM=nccl, a thread per
#               GPU, against the same CPU references at 1e-4; the pipelines also
#               with PARC_CUDA_PIPE_STREAM=0 (NCCL's transfers on the compute
#               stream instead of their own): losses bit for bit the default's;
#   3e. bf16 pp gpt2_tiny at --tp 2 --pp 2 in precision bf16 (the stage programs
#               store activations as bf16, the stages' GEMMs read their own
#               params' bf16 copy) against the same layout generated with
#               --bf16-store round (fp32 buffers holding the same rounded
#               values): losses bit for bit; and within 2e-4 relative of 3b's
#               CPU trainer (the emulated store check's bound);
#   4. bf16     GPT-2 small (examples/gpt2.dsl, precision = bf16) for
#               $BENCH_STEPS steps: tokens/s and MFU against $PEAK_TFLOPS;
#   4g. the same with PARC_CUDA_GRAPH=1: tokens/s next to 4's, losses bit for
#               bit equal to 4's;
#   4s. the same trainer generated with --no-bf16-store (every value in fp32,
#               the GEMMs copying their operands to bf16: what the bf16
#               activations of codegen/cuda_store.h buy), 15 steps; step 4's
#               losses within 1e-2 relative of its over those steps;
#   4a. 4s's trainer with PARC_CUDA_GEMM_OPERANDS=fp32 (what the GEMMs' bf16
#               operand copies buy where values are fp32; step 4's GEMMs read
#               bf16 values and weights, which that setting does not change);
#   4w. 4s's trainer with PARC_CUDA_ATTN=wmma (the WMMA attention kernels of
#               rt_cuda_attn_tc.cu instead of rt_cuda_attn_mma.cu's: what the
#               register-resident mma.sync kernels buy; they read no bf16
#               tensor, so not step 4's trainer, whose attention does);
#   4x. step 4's trainer with PARC_CUDA_XENT=gathered (the cross-entropy's
#               statistics by separate passes: what one pass a row buys);
#   4b. step 4's trainer with PARC_CUDA_BGRAD=0 (each linear layer's bias
#               gradient by its sum kernel after the weight gradient's GEMM
#               instead of cuBLASLt's BGRADA epilogue: what the epilogue buys);
#               losses within 1e-3 relative of 4's (the same sums, another order);
#   4e. step 4's trainer with PARC_CUDA_GELU=0 (the MLP's GELU and its
#               gradient by kernels after their GEMMs instead of cuBLASLt's
#               GELU_AUX_BIAS and DGELU epilogues: what the epilogues buy);
#               losses within 1e-2 relative of 4's (other roundings);
#   4m. step 4's trainer with PARC_CUDA_ATTN=mma4 (the mma.sync attention in
#               4-warp blocks, two an SM, instead of 8-warp blocks: which is
#               faster was never measured); losses within 1e-3 relative of 4's
#               (dq's fp32 sums over key blocks of 64, not 128, round otherwise);
#   4t. step 4's trainer with PARC_CUDA_ATTN=split (the attention backward as
#               two kernels, dq's products computed again, instead of the fused
#               kernel and its dq sums: what the fusion buys); losses within
#               1e-3 relative of 4's (dq's sums in another order);
#   4u. step 4's trainer with PARC_CUDA_GEMM_TUNE=FILE (each GEMM plan runs the
#               fastest of cuBLASLt's heuristic candidates, timed at its first
#               call, instead of the first one): a run that times and writes
#               FILE, then one that reads it (its tokens/s: what tuning buys);
#               their losses bit for bit, within 1e-2 relative of 4's;
#   4n. GPT-2 small generated with --no-batch (every kernel launched on its
#               own: what codegen/cuda_batch.h's batched launches buy), 15
#               steps; its losses bit for bit equal to step 4's;
#   4h. GPT-2 small generated with --head-major-attn (split_heads and
#               merge_heads copies around attention: passes/attn_layout.c
#               off, what token-major attention buys), 15 steps; its losses
#               bit for bit equal to step 4's;
#   4r. GPT-2 small generated with --recompute all (the backward recomputes
#               each layer's norm outputs and gelu(h): what that costs a
#               step), 15 steps; its losses within 1e-2 relative of step 4's;
#   4b. profile the same, 6 steps, PARC_CUDA_PROFILE: per kernel and op the
#               time, share of the step and achieved GB/s or TFLOP/s against
#               the chip's ceilings (compare.py profile);
#   4L. llama   a Llama-shaped model (examples/llama.dsl, 2 layers, seq 2048,
#               batch 4: 1.49 B parameters, GEMMs 4096-14336 wide) in bf16, 12
#               steps: tokens/s, MFU and measured / predicted; then its
#               per-kernel profile (4 steps), as 4b's;
#   5. torch    the same GPT-2 small step in PyTorch (bench/gpt2_torch_gpu.py:
#               eager, bf16 autocast, flash SDPA, fused AdamW) as the named
#               competitor, when the machine's python3 has torch with CUDA;
#   5a.         attention alone at GPT-2's shape in PyTorch's SDPA backends
#               (bench/attn_torch_gpu.py: flash, efficient, cudnn), INFO rows
#               beside the ops table's "sdpa (bf16 io, all in)" B8 H12 rows.
# Prints a table at the end; the logs are in $WORK (and copied to $OUT when the
# device runner sets it).  Exit 0 iff every check passed.
set -eu

PHASE=${1:-all}
case "$PHASE" in
  all|build|run) ;;
  *) echo "usage: sh tests/gpu/check.sh [all|build|run]" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/parc_gpu_check}
ARCH=${ARCH:-90}                 # H100/H200: 90; A100: 80
STEPS=${STEPS:-20}
BENCH_STEPS=${BENCH_STEPS:-30}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}  # H200 SXM dense bf16
PEAK_GBS=${PEAK_GBS:-4800}       # H200 HBM3e, GB/s (the per-kernel profile)
PEAK_FP32_TFLOPS=${PEAK_FP32_TFLOPS:-67} # H200 fp32 without tensor cores
JOBS=$(nproc 2>/dev/null || echo 8)
LIMIT=${LIMIT:-90}               # seconds any one GPU program may run (a hang is a FAIL)
T0=$(date +%s)
TABLE=$WORK/table.txt
STATUS=0
# every run plain launches unless it says otherwise (the trainers' default,
# auto, captures one rank's step into a CUDA graph: 2g and 4g check that), so
# that the rows compare with earlier runs'
PARC_CUDA_GRAPH=${PARC_CUDA_GRAPH:-0}
export PARC_CUDA_GRAPH
building() { [ "$PHASE" != run ]; }
running() { [ "$PHASE" != build ]; }

if building; then
  rm -rf "$WORK"
  mkdir -p "$WORK"
  : > "$TABLE"
elif [ ! -x "$WORK/parc/gpu_ops_check" ]; then
  echo "check.sh run: nothing built in $WORK; run 'sh tests/gpu/check.sh build' on a machine" \
    "with the toolchain and unpack its $(basename "$WORK").tar.xz in $(dirname "$WORK")" >&2
  exit 2
fi

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
# bundle: the files the run phase reads, and the shared libraries the binaries
# need that are neither the C library's nor CUDA's, into $WORK.tar.xz.  Each
# train_cuda holds the same ~8 MiB of runtime code: a dictionary larger than
# all of them together lets xz store it once (16 MiB in all, not 100+, which
# the device tool's 64 MiB working tree would not carry)
bundle() {
  mkdir -p "$WORK/lib"
  find "$WORK" -type f \( -name train_cuda -o -name gpu_ops_check -o -name gpu_local_check \
      -o -name gemm_gpu \) | while read -r exe; do
    ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
  done | sort -u | while read -r so; do
    case $(basename "$so") in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcublas*|libnccl*) ;;  # hundreds of MiB: the GPU machine's own
      *) cp -L "$so" "$WORK/lib/" ;;
    esac
  done
  (cd "$(dirname "$WORK")" && find "$(basename "$WORK")" -type f \( -name train_cuda \
      -o -name gpu_ops_check -o -name gpu_local_check -o -name gemm_gpu -o -name plan.json -o -name '*.log' -o -name '*.jsonl' \
      -o -name '*.safetensors' -o -name '*.built' -o -name table.txt -o -path '*/lib/*' \) |
    XZ_OPT="-6 --lzma2=dict=512MiB" tar -cJf "$WORK.tar.xz" -T -)
  echo "bundle: $WORK.tar.xz, $(du -h "$WORK.tar.xz" | cut -f1) (libraries: $(ls "$WORK/lib" | tr '\n' ' '))"
}
# gpu_env: the CUDA libraries of this machine on LD_LIBRARY_PATH, the bundle's first
gpu_env() {
  dirs=$WORK/lib
  for so in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
    f=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$so" 2>/dev/null | head -1 || true)
    [ -n "$f" ] && dirs="$dirs:$(dirname "$f")"
  done
  LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$WORK/parc/gpu_ops_check" | grep 'not found' || true
}
finish() {
  say "summary ($PHASE)"
  echo "parc GPU checks, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,driver_version \
    --format=csv,noheader 2>/dev/null | head -1 || echo 'GPU unknown')"
  printf '%-34s %-5s %s\n' check result detail
  cat "$TABLE"
  if [ "$PHASE" = build ] && [ $STATUS = 0 ]; then bundle; fi
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$TABLE" "$OUT/" 2>/dev/null || true
    (cd "$WORK" && tar -czf "$OUT/logs.tar.gz" $(find . -maxdepth 2 \( -name '*.log' \
      -o -name '*.jsonl' -o -name '*.txt' \) | sort)) 2>/dev/null || true
  fi
  echo "total $(($(date +%s) - T0)) s; $( [ $STATUS = 0 ] && echo ALL PASSED || echo SOME FAILED)"
}
trap finish EXIT

command -v python3 > /dev/null || { echo "python3 is needed (tests/gpu/compare.py)"; exit 2; }
if running; then
  nvidia-smi -L || echo "nvidia-smi not found; going on"
  [ "$PHASE" = run ] && gpu_env
  # the machine's cuDNN (through its torch), for weighing cuDNN's fused attention
  # (SDPA operation descriptors from cuDNN 9.13, its backward from 9.17) against parc's
  python3 -c 'import torch; print("cudnn", torch.backends.cudnn.version())' 2>/dev/null ||
    echo "cudnn: no torch to ask"
fi

if building; then
  say "build parc (Release, libparcrt_cuda for sm_$ARCH)"
  if ! { cmake -S "$ROOT" -B "$WORK/parc" -DCMAKE_BUILD_TYPE=Release \
           -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DPARC_CUDA_ARCHITECTURES="$ARCH" \
           > "$WORK/parc_cmake.log" 2>&1 &&
         cmake --build "$WORK/parc" -j "$JOBS" --target parc gpu_ops_check gpu_local_check \
           > "$WORK/parc_build.log" 2>&1; }; then
    tail -40 "$WORK/parc_cmake.log" "$WORK/parc_build.log"
    row "build parc + libparcrt_cuda" FAIL "see parc_build.log"
    STATUS=1
    exit 1
  fi
  row "build parc + libparcrt_cuda" PASS "$(($(date +%s) - T0)) s"
  nvcc -O2 -arch=sm_"$ARCH" "$ROOT/bench/gemm_gpu.cu" -lcublasLt -o "$WORK/parc/gemm_gpu" \
    > "$WORK/gemm_gpu.build.log" 2>&1 || { row "build bench/gemm_gpu.cu" FAIL "see gemm_gpu.build.log"; STATUS=1; }
fi
PARC=$WORK/parc/parc

if running; then
  say "1. runtime ops against the CPU"
  if timeout "$LIMIT" "$WORK/parc/gpu_ops_check" > "$WORK/ops.log" 2>&1; then v=PASS; else v=FAIL; STATUS=1; fi
  cat "$WORK/ops.log"
  row "ops: gemm/attention/xent vs CPU" "$v" "$(grep -c ' ok ' "$WORK/ops.log" || true) cases ok"
  # the bf16 GEMM cases again with every unbatched GEMM on bf16 operands (the
  # padded-row and padded-result paths, which the default takes only where aligned)
  if PARC_CUDA_GEMM_OPERANDS=bf16 timeout "$LIMIT" "$WORK/parc/gpu_ops_check" > "$WORK/ops_bf16.log" 2>&1
  then v=PASS; else v=FAIL; STATUS=1; fi
  grep 'matmul.*(bf16)' "$WORK/ops_bf16.log" || tail -5 "$WORK/ops_bf16.log"
  row "ops, bf16 operands everywhere" "$v" "$(grep -c '(bf16).* ok ' "$WORK/ops_bf16.log" || true) bf16 cases ok"
  # the device-local collectives (PARC_CUDA_LOCAL=device) against the thread
  # communicator, bit for bit: tp 3, tp 2 x dp 2, tp 10 as threads on the one GPU
  if timeout "$LIMIT" "$WORK/parc/gpu_local_check" > "$WORK/local.log" 2>&1; then v=PASS; else v=FAIL; STATUS=1; fi
  cat "$WORK/local.log"
  row "device-local collectives, bits" "$v" "$(grep -c '^tp .*: ok$' "$WORK/local.log" || true) of 3 meshes equal"
  if [ -x "$WORK/parc/gemm_gpu" ]; then
    timeout "$LIMIT" "$WORK/parc/gemm_gpu" > "$WORK/gemm_gpu.log" 2>&1 || true
    cat "$WORK/gemm_gpu.log"
    result "cuBLASLt GEMMs by precision" "$WORK/gemm_gpu.log"
  fi
fi

# build_targets BUILD_DIR LOG TARGET...: cmake --build each target
build_targets() {
  b=$1 log=$2
  shift 2
  for t in "$@"; do
    cmake --build "$b" -j "$JOBS" --target "$t" >> "$log" 2>&1 || return 1
  done
}
# project NAME DSL TARGETS [parc options]: in the build phase, parc -o $WORK/NAME
# and make TARGETS (NAME.built marks success); in the run phase, whether it was
# built.  A failure is a FAIL row either way.
project() {
  name=$1 dsl=$2 targets=$3
  shift 3
  d=$WORK/$name
  if building; then
    if "$PARC" "$ROOT/examples/$dsl" --target all --cuda-arch "$ARCH" -o "$d" "$@" \
         > "$WORK/$name.parc.log" 2>&1 &&
       cmake -S "$d" -B "$d/build" -DPARC_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
         > "$WORK/$name.cmake.log" 2>&1 &&
       build_targets "$d/build" "$WORK/$name.build.log" $targets; then
      touch "$WORK/$name.built"
    else
      tail -30 "$WORK/$name.parc.log" "$WORK/$name.cmake.log" "$WORK/$name.build.log" 2>/dev/null
    fi
  fi
  [ -f "$WORK/$name.built" ] && return 0
  row "$name" FAIL "build failed (see $name.*.log)"
  STATUS=1
  return 1
}
# cpu NAME [train options]: the CPU trainer's reference run (build phase)
cpu() {
  name=$1
  shift
  building || return 0
  "$WORK/$name/build/train" --steps "$STEPS" --log "$WORK/$name.cpu.jsonl" --quiet "$@" \
    > "$WORK/$name.cpu.log" 2>&1 || cat "$WORK/$name.cpu.log"
}
# gpu NAME [train_cuda options]: the GPU trainer in fp32 (run phase); with
# PARC_CUDA_COMM=host the ranks of a layout are threads sharing the one GPU,
# their collectives host-staged (logs NAME.gpu.*), or with LOCAL=device device
# copies and reduction kernels (PARC_CUDA_LOCAL=device; logs NAME.dev.*)
gpu() {
  name=$1
  shift
  lmode=${LOCAL:-host}
  tag=gpu
  [ "$lmode" = device ] && tag=dev
  PARC_CUDA_COMM=host PARC_CUDA_LOCAL=$lmode PARC_CUDA_GEMM=fp32 timeout "$LIMIT" \
    "$WORK/$name/build/train_cuda" --steps "$STEPS" --log "$WORK/$name.$tag.jsonl" --quiet "$@" \
    > "$WORK/$name.$tag.log" 2>&1 || cat "$WORK/$name.$tag.log"
}
# bench NAME ROWNAME [PROJECT]: tokens/s and MFU of $WORK/NAME.jsonl (the FLOPs
# from PROJECT's plan.json, gpt2's unless given; steps after the fifth) into the table
bench() {
  python3 "$ROOT/tests/gpu/compare.py" bench "$WORK/$1.jsonl" "$WORK/${3:-gpt2}/plan.json" \
    "$PEAK_TFLOPS" 5 > "$WORK/$1.bench.log" 2>&1 || true
  cat "$WORK/$1.bench.log"
  result "$2" "$WORK/$1.bench.log"
}
# compare KIND REF GOT ROWNAME LOG: compare.py at 1e-4 into the table
compare() {
  python3 "$ROOT/tests/gpu/compare.py" "$1" "$2" "$3" 1e-4 > "$5" 2>&1 || true
  cat "$5"
  result "$4" "$5"
}

for name in gpt2_tiny llama_tiny moe_tiny moe_tiny_zloss; do
  model=${name%_zloss}
  say "2. fp32 $name: CPU vs GPU, $STEPS steps"
  # moe_tiny_zloss: the router z-loss (the log op) and a shared expert
  [ "$name" = moe_tiny_zloss ] && set -- -D z_loss=1e-3 -D shared_ffn=64 || set --
  project "$name" "$model.dsl" "train train_cuda" "$@" || continue
  model=$name
  cpu "$model" --save-grads "$WORK/$model.cpu_grads.safetensors"
  running || continue
  gpu "$model" --save-grads "$WORK/$model.gpu_grads.safetensors"
  compare losses "$WORK/$model.cpu.jsonl" "$WORK/$model.gpu.jsonl" "fp32 $model losses" \
    "$WORK/$model.cmp.log"
  compare grads "$WORK/$model.cpu_grads.safetensors" "$WORK/$model.gpu_grads.safetensors" \
    "fp32 $model step-1 gradients" "$WORK/$model.grads.log"
done

# 2g. the step as a CUDA graph (PARC_CUDA_GRAPH=1): one rank, no --save-grads, so
# step 1 runs plainly, step 2 is captured and launched, the rest replay; the
# same kernels with the same arguments in the same order: bit for bit (0).
# moe_tiny's routing is staged through the host: one notice, plain launches.
# graph_run NAME G: train_cuda fp32 with PARC_CUDA_GRAPH=G (logs NAME.graphG.*)
graph_run() {
  PARC_CUDA_GRAPH=$2 PARC_CUDA_GEMM=fp32 timeout "$LIMIT" "$WORK/$1/build/train_cuda" \
    --steps "$STEPS" --log "$WORK/$1.graph$2.jsonl" --quiet > "$WORK/$1.graph$2.log" 2>&1 ||
    cat "$WORK/$1.graph$2.log"
}
# graph_bits NAME G ROWNAME: NAME's losses with PARC_CUDA_GRAPH=G bit for bit =0's
graph_bits() {
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/$1.graph0.jsonl" \
    "$WORK/$1.graph$2.jsonl" 0 > "$WORK/$1.graph$2.bits.log" 2>&1 || true
  cat "$WORK/$1.graph$2.bits.log"
  result "$3" "$WORK/$1.graph$2.bits.log"
}
for model in gpt2_tiny llama_tiny moe_tiny; do
  running && [ -f "$WORK/$model.built" ] || continue # a build failure has its row already
  say "2g. fp32 $model: PARC_CUDA_GRAPH=1 and auto vs 0, $STEPS steps"
  graph_run "$model" 0
  graph_run "$model" 1
  graph_run "$model" auto
  if grep -q 'PARC_CUDA_GRAPH' "$WORK/$model.graphauto.log"; then
    row "$model graph auto" FAIL "a notice by default (see $model.graphauto.log)"
    STATUS=1
  fi
  graph_bits "$model" auto "fp32 $model graph auto = plain bits"
  notices=$(grep -c 'PARC_CUDA_GRAPH=1: ' "$WORK/$model.graph1.log" || true)
  want=0
  [ "$model" = moe_tiny ] && want=1
  if [ "$notices" != "$want" ]; then
    row "$model graph notice" FAIL "$notices fallback notices, expected $want (see $model.graph1.log)"
    STATUS=1
  fi
  graph_bits "$model" 1 "fp32 $model graph = plain bits"
done

for model in gpt2_tiny llama_tiny; do
  say "3. fp32 $model at tp=2 on the device-local backend"
  name=${model}_tp2
  project "$name" "$model.dsl" "train_cuda" --tp 2 || continue
  running || continue
  gpu "$name"
  compare losses "$WORK/$model.cpu.jsonl" "$WORK/$name.gpu.jsonl" "tp=2 $model vs 1-rank CPU" \
    "$WORK/$name.cmp.log"
done

for cfg in gpt2_tiny llama_tiny moe_tiny:--microbatches:2; do
  model=${cfg%%:*}
  extra=$(echo "$cfg" | cut -s -d: -f2- | tr ':' ' ')
  name=${model}_tp2_pp2
  say "3b. fp32 $model at tp=2 pp=2 on the device-local backend"
  # shellcheck disable=SC2086
  project "$name" "$model.dsl" "train train_cuda" --tp 2 --pp 2 $extra || continue
  cpu "$name"
  running || continue
  gpu "$name"
  compare losses "$WORK/$name.cpu.jsonl" "$WORK/$name.gpu.jsonl" \
    "tp=2 pp=2 $model vs CPU tp=2 pp=2" "$WORK/$name.cmp.log"
done

# 3c. more layouts against the CPU trainer of the same layout (4 ranks as threads
# on the one GPU): experts summed over ep_dp inside a pipeline and with gradient
# accumulation, and ZeRO-1 (dense, and with experts sharded over ep_dp)
for cfg in moe_tiny_pp2_dp2_ep2:--pp:2:--dp:2:--ep:2:--microbatches:2 \
           moe_tiny_dp2_ep2_mb2:--dp:2:--ep:2:--microbatches:2 \
           moe_tiny_dp4_ep2_zero:--dp:4:--ep:2:--zero:1 gpt2_tiny_dp2_zero:--dp:2:--zero:1; do
  name=${cfg%%:*}
  model=${name%%_[pd][pd]*}
  extra=$(echo "$cfg" | cut -s -d: -f2- | tr ':' ' ')
  say "3c. fp32 $name on the device-local backend"
  # shellcheck disable=SC2086
  project "$name" "$model.dsl" "train train_cuda" $extra || continue
  cpu "$name"
  running || continue
  gpu "$name"
  compare losses "$WORK/$name.cpu.jsonl" "$WORK/$name.gpu.jsonl" "$name vs CPU, same layout" \
    "$WORK/$name.cmp.log"
done

# 3d. the layouts of 3, 3b and 3c again with the device-local collectives
# (PARC_CUDA_LOCAL=device: the ranks' streams wait on each other's events, sums
# by a reduction kernel in rank order, gathers and pipeline transfers by device
# copies; no host staging but the expert all-to-all's): against the same CPU
# reference at the same tolerance, and against the host-staged run of 3 to 3c
# bit for bit (tolerance 0: both sum in the CPU communicator's order, and every
# kernel is reproducible run to run)
for pair in gpt2_tiny_tp2:gpt2_tiny llama_tiny_tp2:llama_tiny gpt2_tiny_tp2_pp2 \
            llama_tiny_tp2_pp2 moe_tiny_tp2_pp2 moe_tiny_pp2_dp2_ep2 moe_tiny_dp2_ep2_mb2 \
            moe_tiny_dp4_ep2_zero gpt2_tiny_dp2_zero; do
  name=${pair%%:*}
  ref=${pair#*:}
  running && [ -f "$WORK/$name.built" ] || continue # a build failure has its row already
  say "3d. fp32 $name, device-local collectives (device copies and reduction kernels)"
  LOCAL=device
  gpu "$name"
  LOCAL=host
  if ! grep -q 'collectives device-local (device copies' "$WORK/$name.dev.log"; then
    row "$name device-local" FAIL "the start-up line does not name the device-local collectives"
    STATUS=1
    continue
  fi
  compare losses "$WORK/$ref.cpu.jsonl" "$WORK/$name.dev.jsonl" "$name device vs CPU" \
    "$WORK/$name.dev.cmp.log"
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/$name.gpu.jsonl" "$WORK/$name.dev.jsonl" 0 \
    > "$WORK/$name.dev.bits.log" 2>&1 || true
  result "$name device = host bits" "$WORK/$name.dev.bits.log"
done

# 3n. NCCL where there is a GPU a rank (the lent machines have had one: then a
# SKIP row); the projects of 3 and 3b, run with PARC_CUDA_COMM=nccl
if running; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  say "3n. fp32 layouts over NCCL ($ngpu GPUs)"
  [ "${ngpu:-0}" -ge 2 ] || row "nccl tp=2 / tp=2 pp=2" SKIP "$ngpu GPU(s): needs 2 (4)"
  for name in gpt2_tiny_tp2 llama_tiny_tp2 gpt2_tiny_tp2_pp2 llama_tiny_tp2_pp2 \
              moe_tiny_tp2_pp2; do
    case $name in *_pp2) need=4 ref=$name ;; *) need=2 ref=${name%_tp2} ;; esac
    [ "${ngpu:-0}" -ge "$need" ] && [ -f "$WORK/$name.built" ] || continue
    for ps in 1 0; do
      PARC_CUDA_COMM=nccl PARC_CUDA_PIPE_STREAM=$ps PARC_CUDA_GEMM=fp32 timeout "$LIMIT" \
        "$WORK/$name/build/train_cuda" --steps "$STEPS" --log "$WORK/$name.nccl$ps.jsonl" \
        --quiet > "$WORK/$name.nccl$ps.log" 2>&1 || cat "$WORK/$name.nccl$ps.log"
    done
    compare losses "$WORK/$ref.cpu.jsonl" "$WORK/$name.nccl1.jsonl" "nccl $name vs CPU" \
      "$WORK/$name.nccl.cmp.log"
    case $name in *_pp2) ;; *) continue ;; esac
    python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/$name.nccl1.jsonl" \
      "$WORK/$name.nccl0.jsonl" 0 > "$WORK/$name.nccl.bits.log" 2>&1 || true
    cat "$WORK/$name.nccl.bits.log"
    result "nccl $name stream = compute bits" "$WORK/$name.nccl.bits.log"
  done
fi

# 3e. a bf16 pipeline on the GPU's bf16 paths (tensor-core attention, cuBLASLt
# bf16), 4 ranks as threads: bf16 stores = the round trainer's bits, and near
# the fp32 CPU trainer of the layout (3b's reference)
say "3e. bf16 gpt2_tiny at tp=2 pp=2: bf16 stores against --bf16-store round"
pp16=gpt2_tiny_tp2_pp2_bf16
if project $pp16 gpt2_tiny.dsl "train_cuda" --tp 2 --pp 2 -D precision=bf16 &&
   project ${pp16}r gpt2_tiny.dsl "train_cuda" --tp 2 --pp 2 -D precision=bf16 \
     --bf16-store round && running; then
  for name in $pp16 ${pp16}r; do
    PARC_CUDA_COMM=host timeout "$LIMIT" "$WORK/$name/build/train_cuda" --steps "$STEPS" \
      --log "$WORK/$name.gpu.jsonl" --quiet > "$WORK/$name.gpu.log" 2>&1 ||
      cat "$WORK/$name.gpu.log"
  done
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/${pp16}r.gpu.jsonl" \
    "$WORK/$pp16.gpu.jsonl" 0 > "$WORK/$pp16.bits.log" 2>&1 || true
  cat "$WORK/$pp16.bits.log"
  result "bf16 tp=2 pp=2 stores = round bits" "$WORK/$pp16.bits.log"
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/gpt2_tiny_tp2_pp2.cpu.jsonl" \
    "$WORK/$pp16.gpu.jsonl" 2e-4 > "$WORK/$pp16.cmp.log" 2>&1 || true
  cat "$WORK/$pp16.cmp.log"
  result "bf16 tp=2 pp=2 gpt2_tiny vs fp32 CPU" "$WORK/$pp16.cmp.log"
fi

say "4. bf16 GPT-2 small: $BENCH_STEPS steps"
if project gpt2 gpt2.dsl "train_cuda" && running; then
  timeout $((2 * LIMIT)) "$WORK/gpt2/build/train_cuda" --steps "$BENCH_STEPS" --log "$WORK/gpt2.bf16.jsonl" \
    > "$WORK/gpt2.bf16.log" 2>&1 || cat "$WORK/gpt2.bf16.log"
  tail -3 "$WORK/gpt2.bf16.log"
  bench gpt2.bf16 "bf16 gpt2 (124M) B8xT1024"
fi

say "4g. bf16 GPT-2 small as a CUDA graph (PARC_CUDA_GRAPH=1): $BENCH_STEPS steps"
if [ -f "$WORK/gpt2.built" ] && running; then
  PARC_CUDA_GRAPH=1 timeout $((2 * LIMIT)) "$WORK/gpt2/build/train_cuda" --steps "$BENCH_STEPS" \
    --log "$WORK/gpt2.bf16_graph.jsonl" > "$WORK/gpt2.bf16_graph.log" 2>&1 ||
    cat "$WORK/gpt2.bf16_graph.log"
  tail -3 "$WORK/gpt2.bf16_graph.log"
  if grep -q 'PARC_CUDA_GRAPH=1: ' "$WORK/gpt2.bf16_graph.log"; then
    row "bf16 gpt2 graph" FAIL "fell back to plain launches (see gpt2.bf16_graph.log)"
    STATUS=1
  fi
  bench gpt2.bf16_graph "bf16 gpt2 (124M) B8xT1024 graph"
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/gpt2.bf16.jsonl" \
    "$WORK/gpt2.bf16_graph.jsonl" 0 > "$WORK/gpt2.bf16_graph.bits.log" 2>&1 || true
  cat "$WORK/gpt2.bf16_graph.bits.log"
  result "bf16 gpt2 graph = plain bits" "$WORK/gpt2.bf16_graph.bits.log"
fi

# variant TAG ROWNAME VAR=VALUE [PROJECT]: the bf16 GPT-2 trainer (PROJECT's:
# gpt2 unless given) for 15 steps with one environment setting, tokens/s and MFU
# as a row beside step 4's
variant() {
  if [ -f "$WORK/${4:-gpt2}.built" ] && running; then
    env "$3" timeout $((2 * LIMIT)) "$WORK/${4:-gpt2}/build/train_cuda" --steps 15 \
      --log "$WORK/gpt2.$1.jsonl" --quiet > "$WORK/gpt2.$1.log" 2>&1 || cat "$WORK/gpt2.$1.log"
    bench "gpt2.$1" "$2"
  fi
}

# variant_vs_bf16 NAME TOL RESULT: variant NAME's losses within TOL relative of
# step 4's (0: bit for bit), as RESULT
variant_vs_bf16() {
  if [ -f "$WORK/gpt2.$1.jsonl" ]; then
    python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/gpt2.$1.jsonl" "$WORK/gpt2.bf16.jsonl" \
      "$2" --common > "$WORK/gpt2.$1.cmp.log" 2>&1 || true
    cat "$WORK/gpt2.$1.cmp.log"
    result "$3" "$WORK/gpt2.$1.cmp.log"
  fi
}

say "4s. bf16 GPT-2 small generated with --no-bf16-store, 15 steps"
if project gpt2_nostore gpt2.dsl "train_cuda" --no-bf16-store && running; then
  timeout $((2 * LIMIT)) "$WORK/gpt2_nostore/build/train_cuda" --steps 15 \
    --log "$WORK/gpt2.nostore.jsonl" --quiet > "$WORK/gpt2.nostore.log" 2>&1 ||
    cat "$WORK/gpt2.nostore.log"
  bench gpt2.nostore "bf16 gpt2, no bf16 stores"
  # the same model with fp32 activations: the bf16 ones may move the loss by their
  # rounding only (the emulation: 1e-4 over 60 steps of gpt2_tiny, RESULTS.md)
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/gpt2.nostore.jsonl" "$WORK/gpt2.bf16.jsonl" \
    1e-2 --common > "$WORK/gpt2.nostore.cmp.log" 2>&1 || true
  cat "$WORK/gpt2.nostore.cmp.log"
  result "bf16 gpt2 stores ~ fp32 buffers" "$WORK/gpt2.nostore.cmp.log"
fi

say "4a. 4s's trainer with fp32 GEMM operands (cuBLASLt rounding them), 15 steps"
variant nostore_fp32ops "bf16 gpt2, no stores, fp32 GEMM operands" PARC_CUDA_GEMM_OPERANDS=fp32 \
  gpt2_nostore

say "4w. 4s's trainer with the WMMA attention kernels (PARC_CUDA_ATTN=wmma), 15 steps"
if [ -f "$WORK/gpt2_nostore.built" ] && running; then
  PARC_CUDA_ATTN=wmma timeout $((2 * LIMIT)) "$WORK/gpt2_nostore/build/train_cuda" --steps 15 \
    --log "$WORK/gpt2.nostore_wmma.jsonl" --quiet > "$WORK/gpt2.nostore_wmma.log" 2>&1 ||
    cat "$WORK/gpt2.nostore_wmma.log"
  bench gpt2.nostore_wmma "bf16 gpt2, no stores, WMMA attention"
fi

say "4x. step 4's trainer with the gathered cross-entropy (PARC_CUDA_XENT=gathered), 15 steps"
variant xent_gathered "bf16 gpt2, gathered cross-entropy" PARC_CUDA_XENT=gathered

say "4b. step 4's trainer with the bias sums as kernels after their GEMMs (PARC_CUDA_BGRAD=0), 15 steps"
variant nobgrad "bf16 gpt2, bias sums not in GEMM epilogues" PARC_CUDA_BGRAD=0
# the same sums in another order: the losses within rounding of step 4's
variant_vs_bf16 nobgrad 1e-3 "bf16 gpt2 bias epilogue ~ kernels"

say "4e. step 4's trainer with the GELUs as kernels after their GEMMs (PARC_CUDA_GELU=0), 15 steps"
variant nogelu "bf16 gpt2, GELU not in GEMM epilogues" PARC_CUDA_GELU=0
# h rounded to bf16 once (epilogue) or h's product and dg rounded first
# (kernels): the losses within rounding of step 4's
variant_vs_bf16 nogelu 1e-2 "bf16 gpt2 GELU epilogue ~ kernels"

say "4m. step 4's trainer with the attention in 4-warp blocks (PARC_CUDA_ATTN=mma4), 15 steps"
variant attn_mma4 "bf16 gpt2, attention in 4-warp blocks" PARC_CUDA_ATTN=mma4
# each row's sums in the same order in either block size but dq's (its shares
# of 64 keys, not 128): within rounding
variant_vs_bf16 attn_mma4 1e-3 "bf16 gpt2 mma4 attention ~ default"

say "4t. step 4's trainer with the two-kernel attention backward (PARC_CUDA_ATTN=split), 15 steps"
variant attn_split "bf16 gpt2, attention backward split" PARC_CUDA_ATTN=split
variant_vs_bf16 attn_split 1e-3 "bf16 gpt2 split attention backward ~ fused"

say "4u. step 4's trainer with its GEMMs tuned (PARC_CUDA_GEMM_TUNE=FILE), 15 steps twice"
rm -f "$WORK/gpt2.tune.txt"
variant gemm_tuning "bf16 gpt2, GEMMs being tuned" PARC_CUDA_GEMM_TUNE="$WORK/gpt2.tune.txt"
variant gemm_tuned "bf16 gpt2, GEMMs tuned (file read)" PARC_CUDA_GEMM_TUNE="$WORK/gpt2.tune.txt"
grep -h 'GEMM tuning' "$WORK/gpt2.gemm_tuning.log" "$WORK/gpt2.gemm_tuned.log" 2>/dev/null || true
if [ -f "$WORK/gpt2.gemm_tuned.jsonl" ]; then
  python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/gpt2.gemm_tuned.jsonl" \
    "$WORK/gpt2.gemm_tuning.jsonl" 0 > "$WORK/gpt2.gemm_tuned.bits.log" 2>&1 || true
  cat "$WORK/gpt2.gemm_tuned.bits.log"
  result "bf16 gpt2 tuned = tuning run bits" "$WORK/gpt2.gemm_tuned.bits.log"
fi
variant_vs_bf16 gemm_tuned 1e-2 "bf16 gpt2 tuned GEMMs ~ default"

# GPT-2 small generated again with the parc flag $3 (project gpt2_$1, logs
# gpt2.$1.*), 15 steps: its tokens/s as $2, and its losses bit for bit step 4's
# (result $4)
same_bits() {
  tol=${5:-0}
  if project "gpt2_$1" gpt2.dsl "train_cuda" "$3" && running; then
    timeout $((2 * LIMIT)) "$WORK/gpt2_$1/build/train_cuda" --steps 15 \
      --log "$WORK/gpt2.$1.jsonl" --quiet > "$WORK/gpt2.$1.log" 2>&1 || cat "$WORK/gpt2.$1.log"
    bench "gpt2.$1" "$2"
    python3 "$ROOT/tests/gpu/compare.py" losses "$WORK/gpt2.$1.jsonl" "$WORK/gpt2.bf16.jsonl" \
      "$tol" --common > "$WORK/gpt2.$1.bits.log" 2>&1 || true
    cat "$WORK/gpt2.$1.bits.log"
    result "$4" "$WORK/gpt2.$1.bits.log"
  fi
}

say "4n. bf16 GPT-2 small generated with --no-batch, 15 steps"
# a batch's members compute what their own launches would: the same bits
same_bits nobatch "bf16 gpt2, no batched launches" --no-batch "bf16 gpt2 batched = unbatched bits"

say "4h. bf16 GPT-2 small generated with --head-major-attn, 15 steps"
# token-major attention moves elements, not values: the same bits
same_bits headmajor "bf16 gpt2, head-major attention" --head-major-attn \
  "bf16 gpt2 token-major = head-major bits"

say "4r. bf16 GPT-2 small generated with --recompute all, 15 steps"
# the backward recomputes the norms and gelu(h) (passes/remat_norm.c, remat_act.c):
# what that costs a step (planned on the h200 preset: 23.45 -> 24.75 ms; measured
# 22.9 -> 24.6, bench/RESULTS.md, sixth run); the forward's norms lose
# their fused residual add, so rounding, not bits
same_bits recompute "bf16 gpt2, norms and gelu recomputed" --recompute=all \
  "bf16 gpt2 recomputed norms and gelu vs kept" 1e-2

say "4b. per-kernel profile: GPT-2 small bf16, 6 steps (PARC_CUDA_PROFILE)"
if [ -f "$WORK/gpt2.built" ] && running; then
  PARC_CUDA_PROFILE="$WORK/gpt2.profile.jsonl" timeout $((2 * LIMIT)) "$WORK/gpt2/build/train_cuda" \
    --steps 6 --quiet > "$WORK/gpt2.profile.log" 2>&1 || cat "$WORK/gpt2.profile.log"
  python3 "$ROOT/tests/gpu/compare.py" profile "$WORK/gpt2.profile.jsonl" "$PEAK_TFLOPS" \
    "$PEAK_GBS" --fp32 "$PEAK_FP32_TFLOPS" > "$WORK/gpt2.profile.cmp.log" 2>&1 || true
  cat "$WORK/gpt2.profile.cmp.log"
  result "profile gpt2 (124M) per kernel" "$WORK/gpt2.profile.cmp.log"
fi

say "4L. bf16 Llama shape (2 layers of Llama 3 8B, 1.49 B parameters): 12 steps, then a profile"
# a model whose GEMMs are 4096 to 14336 wide (GPT-2's are 768 to 3072): the step
# against the prediction and its own per-kernel table (start-up initialises the
# 1.49 B parameters on the host's cores: rt_init_normal_runs)
if project llama2l llama.dsl "train_cuda" -D layers=2 -D seq=2048 -D batch=4 \
     -D microbatches=1 && running; then
  timeout $((2 * LIMIT)) "$WORK/llama2l/build/train_cuda" --steps 12 \
    --log "$WORK/llama2l.bf16.jsonl" > "$WORK/llama2l.bf16.log" 2>&1 || cat "$WORK/llama2l.bf16.log"
  tail -3 "$WORK/llama2l.bf16.log"
  bench llama2l.bf16 "bf16 llama 2 layers (1.49B) B4xT2048" llama2l
  PARC_CUDA_PROFILE="$WORK/llama2l.profile.jsonl" timeout $((2 * LIMIT)) \
    "$WORK/llama2l/build/train_cuda" --steps 4 --quiet > "$WORK/llama2l.profile.log" 2>&1 ||
    cat "$WORK/llama2l.profile.log"
  python3 "$ROOT/tests/gpu/compare.py" profile "$WORK/llama2l.profile.jsonl" "$PEAK_TFLOPS" \
    "$PEAK_GBS" --fp32 "$PEAK_FP32_TFLOPS" > "$WORK/llama2l.profile.cmp.log" 2>&1 || true
  cat "$WORK/llama2l.profile.cmp.log"
  result "profile llama 2 layers per kernel" "$WORK/llama2l.profile.cmp.log"
fi

if running; then
  say "5. the competitor: GPT-2 small in PyTorch, bf16"
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    timeout $((2 * LIMIT)) python3 "$ROOT/bench/gpt2_torch_gpu.py" --steps "$BENCH_STEPS" --log "$WORK/gpt2.torch.jsonl" \
      > "$WORK/gpt2.torch.log" 2>&1 || cat "$WORK/gpt2.torch.log"
    tail -3 "$WORK/gpt2.torch.log"
    bench gpt2.torch "torch gpt2 (124M) B8xT1024"
    say "5a. attention at GPT-2's shape in PyTorch's SDPA backends"
    timeout "$LIMIT" python3 "$ROOT/bench/attn_torch_gpu.py" > "$WORK/attn.torch.log" 2>&1 || true
    cat "$WORK/attn.torch.log"
    grep '^attn torch [a-z]' "$WORK/attn.torch.log" | while read -r _ _ name what rest; do
      row "attn torch $name $what" INFO "$rest"
    done
  else
    row "torch gpt2 (124M) B8xT1024" INFO "no torch with CUDA here"
  fi
fi
exit $STATUS
