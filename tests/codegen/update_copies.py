#!/usr/bin/env python3
"""The generated trainers' end-of-step update copies (cg_kernels.h, In-place updates).

usage: update_copies.py PARC SOURCE_DIR WORK_DIR

For gpt2_tiny under AdamW at one rank, tp 2, dp 2 with --zero 1, pp 2 (the
pipelined stage programs), --no-fuse, and under SGD with and without momentum,
parc -o writes train.c and train_cuda.c.  Every update must be written in
place: plan.json counts in_place = one per parameter and state tensor of the
rank program (params + state, every parameter being trained) and copied = 0;
neither step copies into P or S (memcpy / rt_cuda_copy), and each says in a
comment how many of its updates its kernels wrote in place (the one-rank
train.c: all of them).  No optimizer moment keeps an arena buffer
(plan.json's buffers: no adam_moment or sgd_momentum node; without ZeRO, no
adam_update or sgd_update either: its value is the parameter itself).  The
pipelined trainers leave the summed gradients in the accumulator G: no copy out
of it, the optimizer reads G, and a weight gradient's GEMM adds into G itself
(RT_MM_ACCUMULATE).
"""
import json, os, re, shutil, subprocess, sys

parc, src, work = sys.argv[1:4]
work = os.path.join(work, "update_copies")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
TINY = ["-D", "layers=2", "-D", "d=32", "-D", "heads=2", "-D", "seq=16", "-D", "batch=4"]

def dsl(name, optimizer):
    """gpt2_tiny.dsl with its optimizer line replaced (None: as it is)."""
    text = open(os.path.join(src, "examples", "gpt2_tiny.dsl")).read()
    if optimizer:
        text, n = re.subn(r"optimizer = adamw\([^)]*\)", "optimizer = " + optimizer, text)
        if n != 1:
            sys.exit("FAIL: gpt2_tiny.dsl has no adamw(...) line to replace")
    path = os.path.join(work, "gpt2_tiny_%s.dsl" % name)
    open(path, "w").write(text)
    return path

CASES = [  # name, optimizer, parc flags, extra defines
    ("r1", None, [], []),
    ("tp2", None, ["--tp", "2"], []),
    ("dp2_zero1", None, ["--dp", "2", "--zero", "1"], []),
    ("pp2", None, ["--pp", "2"], ["-D", "microbatches=2"]),
    ("nofuse", None, ["--no-fuse"], []),
    ("sgd_momentum", "sgd(momentum = 0.9, wd = 0.1)", [], []),
    ("sgd", "sgd(momentum = 0.0)", [], []),
]
COPY_C = re.compile(r"^\s*memcpy\((P|S) \+ \d+,", re.M)
COPY_CU = re.compile(r"rt_cuda_copy\(dev, (P|S) \+ \d+,")
NOTE = re.compile(r"/\* (\d+) of (\d+) updates were stored into their parameter or state")

fails = []
for name, opt, flags, defines in CASES:
    out = os.path.join(work, name)
    r = subprocess.run([parc, dsl(name, opt), "-o", out, *TINY, *defines, *flags],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"FAIL {name}: parc exited {r.returncode}\n{r.stderr[-2000:]}")
    plan = json.load(open(os.path.join(out, "plan.json")))
    train_c = open(os.path.join(out, "train.c")).read()
    train_cu = open(os.path.join(out, "train_cuda.c")).read()
    tensors = len(plan["params"]) + len(plan["state"])
    upd = plan.get("updates")
    notes = [(int(a), int(b)) for a, b in NOTE.findall(train_c)]
    bad = []
    if upd != {"in_place": tensors, "copied": 0}:
        bad.append(f"plan.json updates {upd}, expected {tensors} in place, 0 copied")
    if COPY_C.search(train_c):
        bad.append(f"train.c copies {len(COPY_C.findall(train_c))} updates")
    if COPY_CU.search(train_cu):
        bad.append(f"train_cuda.c copies {len(COPY_CU.findall(train_cu))} updates")
    if not notes or any(a != b for a, b in notes):
        bad.append(f"train.c's in-place notes {notes}")
    if not flags and (notes != [(tensors, tensors)] or
                      len(NOTE.findall(train_cu)) != 1 or NOTE.findall(train_cu)[0] != (str(tensors),) * 2):
        bad.append(f"one-rank notes {notes} / {NOTE.findall(train_cu)}, expected {tensors} of {tensors}")
    kept = {"adam_moment", "sgd_momentum"}
    if "--zero" not in flags:
        kept |= {"adam_update", "sgd_update"}
    held = [b for b in plan["buffers"] if b["op"] in kept]
    if held:
        bad.append(f"{len(held)} optimizer values keep arena buffers, e.g. {held[0]}")
    if "--pp" in flags:  # the gradients stay in the accumulator G (codegen/host.h)
        for fname, text, call in (("train.c", train_c, r"rt_matmul_ta\("),
                                  ("train_cuda.c", train_cu, r"rt_cuda_matmul_ta\(dev, ")):
            if re.search(r"(memcpy\(|rt_cuda_copy\(dev, )F\(\d+\), G \+ \d+", text):
                bad.append(f"{fname} copies gradients out of G for the optimizer")
            opt = text[text.find("static int optimizer_0("):].split("\n}\n")[0]
            if not any("G + " in ln and "memcpy" not in ln and "rt_cuda_copy" not in ln
                       for ln in opt.splitlines()):
                bad.append(f"{fname}: optimizer_0 reads no gradient from G")
            if not re.search(call + r"G \+ \d+, [^;]*RT_MM_ACCUMULATE", text):
                bad.append(f"{fname}: no weight-gradient GEMM adds into G")
    print(f"{'FAIL' if bad else 'ok  '} {name}: {tensors} tensors, updates {upd}, "
          f"train.c notes {notes}, arena {plan['cost']['arena_bytes']} bytes")
    for b in bad:
        print("     " + b)
    if bad:
        fails.append(name)
sys.exit(f"FAIL: {', '.join(fails)}" if fails else 0)
