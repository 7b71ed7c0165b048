#!/usr/bin/env python3
"""bench/bf16_numerics_emu.py -- what bf16 does to training, on the CPU.

Trains gpt2_tiny for STEPS steps four ways, all from the same seed and data,
and prints each loss curve against the fp32 CPU trainer's (`train`, the
reference):
  fp32 GPU      train_cuda (fp32 buffers, fp32 GEMMs)
  bf16 GEMMs    the same trainer with PARC_CUDA_GEMM=bf16 (operands rounded)
  bf16 round    -D precision=bf16 --bf16-store round (activations rounded to
                bf16 values in fp32 buffers: the reference of the next)
  bf16 stored   -D precision=bf16 (activations stored as bf16,
                codegen/cuda_store.h)
The GPU trainers run on the CUDA emulation (tests/cuda/emu), so this measures
numerics, not speed.  It reuses what `ctest -R cuda/emu_trainer/gpt2_tiny$`
built (run that first).

usage: bench/bf16_numerics_emu.py [BUILD_DIR] [STEPS]   (build, 60)
"""
import json
import os
import subprocess
import sys

build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
work = os.path.join(build, "tests", "cuda", "emu_trainer")
out = os.path.join(work, "numerics")
os.makedirs(out, exist_ok=True)
env = dict(os.environ, PARC_CUDA_COMM="host", PARC_CUDA_LOCAL="host", PARC_CUDA_GRAPH="0")
runs = [  # (name, binary, GEMM mode)
    ("fp32 CPU", "gpt2_tiny/build/train", None),
    ("fp32 GPU", "gpt2_tiny/build/train_cuda_emu", "fp32"),
    ("bf16 GEMMs", "gpt2_tiny/build/train_cuda_emu", "bf16"),
    ("bf16 round", "gpt2_tiny_bf16r/build/train_cuda_emu", "bf16"),
    ("bf16 stored", "gpt2_tiny_bf16/build/train_cuda_emu", "bf16"),
]
losses = {}
for name, binary, gemm in runs:
    path = os.path.join(work, binary)
    if not os.path.exists(path):
        sys.exit("%s is missing: run `ctest -R 'cuda/emu_trainer/gpt2_tiny$'` in %s first"
                 % (path, build))
    log = os.path.join(out, name.replace(" ", "_") + ".jsonl")
    e = dict(env, PARC_CUDA_GEMM=gemm) if gemm else env
    sys.stderr.write("%s: %d steps ...\n" % (name, steps))
    subprocess.run([path, "--steps", str(steps), "--quiet", "--log", log], env=e, check=True,
                   stdout=subprocess.DEVNULL)
    with open(log) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    losses[name] = [r["loss"] for r in recs if "step" in r and "loss" in r]

ref = losses["fp32 CPU"]
marks = sorted({0, 9, 19, 29, 39, 49, steps - 1} & set(range(steps)))
print("gpt2_tiny, %d steps: loss at step (1-based), and the largest relative difference from"
      " fp32 CPU over all steps" % steps)
print("%-12s " % "" + " ".join("%9d" % (s + 1) for s in marks) + "   max |rel|")
for name, _, _ in runs:
    l = losses[name]
    worst = max(abs(a - b) / abs(b) for a, b in zip(l, ref))
    print("%-12s " % name + " ".join("%9.5f" % l[s] for s in marks) + "   %.2e" % worst)
same = losses["bf16 round"] == losses["bf16 stored"]
print("bf16 stored = bf16 round, every step bit for bit: %s" % ("yes" if same else "NO"))
