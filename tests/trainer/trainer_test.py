#!/usr/bin/env python3
"""End-to-end: parc -> generated project -> built trainer -> training run.

usage: trainer_test.py CASE PARC SOURCE_DIR WORK_DIR
CASE is one of:
  oracle_gpt2, oracle_llama  20 steps from the same safetensors weights as the
                             PyTorch oracle (tests/oracle/torch_ref.py, float64):
                             every step's loss within 1e-4 relative, grad norm
                             within 1e-3 relative
  resume                     20 steps straight == 10 + --save + --resume + 10,
                             bit for bit (weights file and logged losses), at a
                             constant --lr
  nofuse                     --no-fuse gives the same losses as fused kernels
                             (1e-5 relative) over 10 steps
  moe                        the MoE model trains: loss falls over 30 steps
  mesh_sp                    --sp trainers of GPT-2 and Llama tiny at tp x dp in 2x1,
                             4x1, 2x2, 4x2 equal the one-rank trainer over 20 steps
                             (losses within 1e-4 relative), with the sequence-parallel
                             collectives plan.json counts; GPT-2 with vocab 257 at tp 2
                             (padded to 258) equals one rank and saves [257, d] weights
  mesh_gpt2, mesh_llama      trainers for every tp x dp with tp, dp in {1, 2, 4} and
                             tp*dp <= 8 train the same model as one rank from the
                             same seed: 20 steps, losses within 1e-4 relative,
                             step-1 gradients (--save-grads, gathered) within
                             1e-5 relative L2 per tensor; a
                             checkpoint saved under 2x2 resumes under 1x1 like the
                             one-rank run; under mpirun, 4 processes equal 4 threads
The generated project is built with TRAIN_WERROR=ON: it must compile without
a warning.  Exit 77 (skip) where /usr/bin/python3 has no torch.
"""
import json, os, shutil, subprocess, sys

case, parc, src, work = sys.argv[1:5]
work = os.path.join(work, case)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ORACLE_PY = "/usr/bin/python3"

GPT2 = ["-D", "layers=2", "-D", "d=32", "-D", "heads=2", "-D", "seq=16", "-D", "batch=4",
        "-D", "steps=20", "-D", "lr=3e-3"]
LLAMA = ["-D", "layers=2", "-D", "d=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=64",
         "-D", "seq=16", "-D", "batch=4", "-D", "steps=20", "-D", "lr=3e-3"]
MOE = ["-D", "layers=2", "-D", "d=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=32",
       "-D", "seq=16", "-D", "batch=4", "-D", "experts=4", "-D", "top_k=2", "-D", "lr=3e-3"]

def run(cmd, **kw):
    """Runs cmd; on failure exits with its output."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r

def build(model, defines, name, extra=()):
    out = os.path.join(work, name)
    run([parc, os.path.join(src, "examples", model + ".dsl"), "-o", out, *defines, *extra])
    run(["cmake", "-S", out, "-B", out + "/build", "-DTRAIN_WERROR=ON"])
    r = run(["cmake", "--build", out + "/build"])
    if "warning" in r.stdout + r.stderr:
        sys.exit("FAIL: the generated project compiled with warnings:\n" + r.stdout[-3000:])
    return out + "/build/train"

def data_file():
    path = os.path.join(work, "data.txt")
    words = ("the model reads bytes and learns which one comes next ; a small corpus with "
             "repeated words makes the loss fall quickly .").split()
    text, x = [], 12345
    for _ in range(4000):
        x = (x * 1103515245 + 12345) % (1 << 31)
        text.append(words[x % len(words)])
    open(path, "w").write(" ".join(text))
    return path

def train(exe, *args):
    log = os.path.join(work, "log-%d.jsonl" % len(os.listdir(work)))
    run([exe, "--quiet", "--threads", "2", "--log", log, *args])
    rows = [json.loads(l) for l in open(log)]
    return [r for r in rows if "step" in r]

def load_safetensors(path):
    """{name: tuple of floats} of an F32 safetensors file (no torch needed)."""
    import struct
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head, base, out = json.loads(raw[8:8 + n]), 8 + n, {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"FAIL: {path}: {name} is {t['dtype']}, expected F32")
        s, e = t["data_offsets"]
        out[name] = struct.unpack(f"<{(e - s) // 4}f", raw[base + s:base + e])
    return out

def grads_rel_l2(ref_path, got_path):
    """The largest relative L2 difference over the tensors of two gradient files
    (same names and sizes required), and its tensor."""
    ref, got = load_safetensors(ref_path), load_safetensors(got_path)
    if ref.keys() != got.keys():
        sys.exit(f"FAIL: {got_path} holds {sorted(got)} , {ref_path} {sorted(ref)}")
    worst, where = 0.0, None
    for name, r in ref.items():
        g = got[name]
        if len(g) != len(r):
            sys.exit(f"FAIL: {got_path}: {name} has {len(g)} values, expected {len(r)}")
        den = sum(x * x for x in r) ** 0.5
        num = sum((x - y) ** 2 for x, y in zip(r, g)) ** 0.5
        e = num / den if den > 0 else num
        if e > worst or where is None:
            worst, where = e, name
    return worst, where

def torch_ok():
    return os.path.exists(ORACLE_PY) and subprocess.run(
        [ORACLE_PY, "-c", "import torch"], capture_output=True).returncode == 0

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)

if case.startswith("oracle_"):
    if not torch_ok():
        print("SKIP: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
        sys.exit(77)
    family = case[len("oracle_"):]
    model, defines = ("gpt2_tiny", GPT2) if family == "gpt2" else ("llama_tiny", LLAMA)
    exe = build(model, defines, "project")
    dims = {defines[i + 1].split("=")[0]: defines[i + 1].split("=")[1] for i in range(0, len(defines), 2)}
    mflags = ["--family", family, "--vocab", "256", "--seq", dims["seq"], "--d", dims["d"],
              "--heads", dims["heads"], "--layers", dims["layers"]]
    if family == "llama":
        mflags += ["--kv-heads", dims["kv_heads"], "--ffn", dims["ffn"], "--theta", "10000"]
    init = os.path.join(work, "init.safetensors")
    oracle = os.path.join(src, "tests", "oracle")
    run([ORACLE_PY, os.path.join(oracle, "make_init.py"), *mflags, "--seed", "1", "-o", init])
    data = data_file()
    ref = run([ORACLE_PY, os.path.join(oracle, "torch_ref.py"), *mflags, "--init", init,
               "--data", data, "--batch", dims["batch"], "--steps", "20", "--lr", dims["lr"],
               "--beta1", "0.9", "--beta2", "0.95", "--wd", "0.1", "--clip", "1.0",
               "--schedule", "cosine", "--warmup", "10", "--min-lr", "1e-4",
               "--dtype", "float64"]).stdout
    ref = [json.loads(l) for l in ref.splitlines() if l.strip()]
    got = train(exe, "--init", init, "--data", data)
    worst = 0.0
    for r, g in zip(ref, got):
        e = rel(g["loss"], r["loss"])
        worst = max(worst, e)
        if e > 1e-4 or rel(g["grad_norm"], r["grad_norm"]) > 1e-3 or rel(g["lr"], r["lr"]) > 1e-6:
            sys.exit(f"FAIL step {r['step']}: parc loss {g['loss']} grad_norm {g['grad_norm']} "
                     f"lr {g['lr']}, torch {r['loss']} {r['grad_norm']} {r['lr']}")
    if len(got) != 20 or got[-1]["loss"] > got[0]["loss"] - 0.5:
        sys.exit(f"FAIL: {len(got)} steps, loss {got[0]['loss']} -> {got[-1]['loss']}")
    print(f"{family}: 20 steps, loss {got[0]['loss']:.4f} -> {got[-1]['loss']:.4f}, "
          f"worst relative difference from torch {worst:.2e}")
elif case == "resume":
    # A constant --lr, so that a 10-step run and a 20-step run share their
    # schedule (a schedule spans --steps).
    exe = build("gpt2_tiny", GPT2, "project")
    data = data_file()
    a, b = os.path.join(work, "a.safetensors"), os.path.join(work, "b.safetensors")
    ck = os.path.join(work, "ckpt")
    const = ["--data", data, "--lr", "3e-3"]
    straight = train(exe, *const, "--steps", "20", "--save-weights", a)
    half = train(exe, *const, "--steps", "10", "--save", ck)
    rest = train(exe, *const, "--steps", "20", "--resume", ck, "--save-weights", b)
    if open(a, "rb").read() != open(b, "rb").read():
        sys.exit("FAIL: resumed weights differ from the straight run's")
    losses = [r["loss"] for r in half + rest]
    if losses != [r["loss"] for r in straight]:
        sys.exit(f"FAIL: losses differ:\n{losses}\n{[r['loss'] for r in straight]}")
    print("resume: 10 + 10 steps equal 20 straight, bit for bit")
elif case == "nofuse":
    fused = build("llama_tiny", LLAMA, "fused")
    plain = build("llama_tiny", LLAMA, "plain", ["--no-fuse"])
    data = data_file()
    x = train(fused, "--data", data, "--steps", "10")
    y = train(plain, "--data", data, "--steps", "10")
    for r, s in zip(x, y):
        if rel(r["loss"], s["loss"]) > 1e-5:
            sys.exit(f"FAIL step {r['step']}: fused {r['loss']} unfused {s['loss']}")
    kf = json.load(open(os.path.join(work, "fused", "plan.json")))["kernels"]
    nu = len(json.load(open(os.path.join(work, "plain", "plan.json")))["kernels"])
    distinct = sum("code" not in k for k in kf)
    if not distinct < len(kf):
        sys.exit("FAIL: the two layers' kernels were not compiled once (no shared code)")
    print(f"fused and unfused agree over 10 steps; kernels {len(kf)} fused ({distinct} "
          f"distinct codes), {nu} unfused")
elif case == "moe":
    exe = build("moe_tiny", MOE, "project")
    got = train(exe, "--data", data_file(), "--steps", "30")
    if got[-1]["loss"] > got[0]["loss"] - 1.0:
        sys.exit(f"FAIL: MoE loss {got[0]['loss']} -> {got[-1]['loss']}")
    print(f"moe: loss {got[0]['loss']:.4f} -> {got[-1]['loss']:.4f}")
elif case == "mesh_sp":
    # sequence parallelism: --sp trainers equal the one-rank trainer; a vocabulary
    # tp does not divide is padded (masked logits) and saved unpadded
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    worst = 0.0
    counts = {}
    for model, defines in (("gpt2_tiny", GPT2 + ["-D", "heads=4"]),
                           ("llama_tiny", LLAMA + ["-D", "heads=8", "-D", "kv_heads=4"])):
        ref = train(build(model, defines, model + "_r1"), *const)
        for tp, dp in ((2, 1), (4, 1), (2, 2), (4, 2)):
            name = f"{model}_sp{tp}x{dp}"
            got = train(build(model, defines, name, ["--tp", str(tp), "--dp", str(dp), "--sp"]),
                        *const)
            if len(got) != len(ref):
                sys.exit(f"FAIL {name}: {len(got)} steps logged")
            for r, g in zip(ref, got):
                worst = max(worst, rel(g["loss"], r["loss"]))
                if rel(g["loss"], r["loss"]) > 1e-4:
                    sys.exit(f"FAIL {name} step {r['step']}: loss {g['loss']}, one rank "
                             f"{r['loss']}")
            plan = json.load(open(os.path.join(work, name, "plan.json")))
            counts[name] = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
    # GPT-2 --sp at 2x1: per layer a reduce_scatter after attention and after the MLP
    # (plus the embedding's) forward, an all_gather before each column region (plus the
    # head's); backward the adjoints (and the positions' local_slice's all_gather)
    layers = int([d.split("=")[1] for d in GPT2 if d.startswith("layers=")][0])
    c = counts["gpt2_tiny_sp2x1"]
    want = {("tp", "reduce_scatter"): 2 * (2 * layers + 1),
            ("tp", "all_gather"): 2 * (2 * layers + 1) + 1 + 2}  # + wpe, + the loss's two
    for key, n in want.items():
        if c.get(key) != n:
            sys.exit(f"FAIL: gpt2 --sp 2x1 plan.json communication {key}: {c.get(key)}, "
                     f"expected {n}")
    # padding: vocab 257 under tp 2 (129 rows a rank, one of padding)
    pad = ["-D", "vocab=257"]
    ref = train(build("gpt2_tiny", GPT2 + ["-D", "heads=4"] + pad, "pad_r1"), *const)
    wfile = os.path.join(work, "pad.safetensors")
    got = train(build("gpt2_tiny", GPT2 + ["-D", "heads=4"] + pad, "pad_tp2", ["--tp", "2"]),
                *const, "--save-weights", wfile)
    for r, g in zip(ref, got):
        worst = max(worst, rel(g["loss"], r["loss"]))
        if rel(g["loss"], r["loss"]) > 1e-4:
            sys.exit(f"FAIL vocab 257 tp 2 step {r['step']}: loss {g['loss']}, one rank "
                     f"{r['loss']}")
    report = open(os.path.join(work, "pad_tp2", "report.txt")).read()
    if "vocab padding for --tp 2: 257 -> 258 rows" not in report:
        sys.exit("FAIL: report.txt does not state the vocab padding:\n" + report)
    raw = open(wfile, "rb").read()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    if header["wte.weight"]["shape"] != [257, 32]:
        sys.exit(f"FAIL: saved wte.weight has shape {header['wte.weight']['shape']}, not [257, 32]")
    print(f"--sp: gpt2_tiny and llama_tiny at 2x1 4x1 2x2 4x2 equal one rank over 20 steps; "
          f"vocab 257 at tp 2 equals one rank, saved [257, 32] (worst loss difference "
          f"{worst:.1e}); gpt2 --sp 2x1 communication {sorted(c.items())}")
elif case == "mesh_zero":
    # --zero 1: optimizer state sharded over dp (reduce-scatter, piece update,
    # all-gather), small buckets so that each model has several; GPT-2's d 34
    # makes tensors whose sizes dp 4 does not divide (pieces end in padding)
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    notes = []
    for model, defines in (("gpt2_tiny", GPT2 + ["-D", "d=34", "-D", "heads=2"]),
                           ("llama_tiny", LLAMA + ["-D", "d=36", "-D", "heads=2",
                                                   "-D", "kv_heads=2", "-D", "ffn=62"])):
        one = build(model, defines, f"{model}_r1")
        ref = train(one, *const)
        worst = 0.0
        for tp, dp in ((1, 2), (2, 2), (1, 4), (2, 4)):
            name = f"{model}_z{tp}x{dp}"
            exe = build(model, defines, name, ["--tp", str(tp), "--dp", str(dp), "--zero", "1",
                                               "--bucket-mb", "0.02"])
            got = train(exe, *const)
            if len(got) != len(ref):
                sys.exit(f"FAIL {model} zero tp {tp} dp {dp}: {len(got)} steps logged")
            for r, g in zip(ref, got):
                worst = max(worst, rel(g["loss"], r["loss"]))
                if rel(g["loss"], r["loss"]) > 1e-4 or rel(g["grad_norm"], r["grad_norm"]) > 1e-3:
                    sys.exit(f"FAIL {model} zero tp {tp} dp {dp} step {r['step']}: loss "
                             f"{g['loss']} grad_norm {g['grad_norm']}, one rank {r['loss']} "
                             f"{r['grad_norm']}")
            # the state each rank keeps: 1/dp of the one-rank trainer's (plus padding)
            plan = json.load(open(os.path.join(work, name, "plan.json")))
            plan1 = json.load(open(os.path.join(work, f"{model}_r1", "plan.json")))
            s, s1 = plan["cost"]["state_numel"], plan1["cost"]["state_numel"]
            if not s1 / tp / dp <= s <= s1 / dp + 16 * len(plan["state"]):
                sys.exit(f"FAIL {model} zero tp {tp} dp {dp}: {s} state floats per rank, one "
                         f"rank {s1}")
            comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
            if not (1 < comm.get(("dp", "reduce_scatter"), 0) < len(plan["params"])
                    and comm.get(("dp", "all_gather"), 0) > 1):
                sys.exit(f"FAIL {model} zero tp {tp} dp {dp}: dp collectives {comm}")
        # layout-free checkpoints: 10 steps under zero 1 x dp 2, then 10 more on one rank
        ck = os.path.join(work, f"{model}_ckpt")
        half = train(os.path.join(work, f"{model}_z1x2", "build", "train"), *const[:-1], "10",
                     "--save", ck)
        rest = train(one, *const, "--resume", ck)
        for r, g in zip(ref, half + rest):
            if rel(g["loss"], r["loss"]) > 1e-4:
                sys.exit(f"FAIL {model} resume zero 1x2 -> 1x1 step {r['step']}: {g['loss']} "
                         f"vs {r['loss']}")
        # and the other way: saved on one rank, resumed under zero 2x4
        ck1 = os.path.join(work, f"{model}_ckpt1")
        half = train(one, *const[:-1], "10", "--save", ck1)
        rest = train(os.path.join(work, f"{model}_z2x4", "build", "train"), *const,
                     "--resume", ck1)
        for r, g in zip(ref, half + rest):
            if rel(g["loss"], r["loss"]) > 1e-4:
                sys.exit(f"FAIL {model} resume 1x1 -> zero 2x4 step {r['step']}: {g['loss']} "
                         f"vs {r['loss']}")
        notes.append(f"{model} worst loss difference {worst:.1e}")
    # one zero trainer as 4 MPI processes gives the same bits as 4 threads
    mpirun = shutil.which("mpirun")
    note = "no mpirun: MPI run skipped"
    if mpirun:
        exe = os.path.join(work, "gpt2_tiny_z1x4", "build", "train")
        threads = train(exe, *const)
        log = os.path.join(work, "mpi.jsonl")
        # OpenMPI's own allocations are not LeakSanitizer-clean (see mesh_gpt2)
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
        run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", exe, "--quiet",
             "--log", log, *const], env=env)
        mpi = [json.loads(l) for l in open(log) if '"step"' in l]
        if [r["loss"] for r in mpi] != [r["loss"] for r in threads]:
            sys.exit(f"FAIL: zero 1x4 under mpirun -np 4: losses {[r['loss'] for r in mpi]} "
                     f"differ from the threads backend's {[r['loss'] for r in threads]}")
        note = "mpirun -np 4 equals 4 threads bit for bit"
    print(f"--zero 1 at 1x2 2x2 1x4 2x4 equals one rank over 20 steps ({'; '.join(notes)}); "
          f"zero 1x2 -> 1x1 and 1x1 -> zero 2x4 resume; {note}")
elif case.startswith("mesh_"):
    # heads and KV heads divisible by 4, so tp can be 4
    if case == "mesh_gpt2":
        model, defines = "gpt2_tiny", GPT2 + ["-D", "heads=4"]
    else:
        model, defines = "llama_tiny", LLAMA + ["-D", "heads=8", "-D", "kv_heads=4"]
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    one = build(model, defines, "r1")
    grads1 = os.path.join(work, "grads_r1.safetensors")
    ref = train(one, *const, "--save-grads", grads1)
    worst = worst_grad = 0.0
    # every tp, dp in {1, 2, 4} with tp*dp <= 8, with --sp on and off and --zero 1 on
    # and off; --sp with tp 1 and --zero 1 with dp 1 build the same trainer as without
    # (a no-op by definition), so those are not built twice
    runs = []
    for tp, dp in ((2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (1, 4), (2, 4)):
        for sp in ((0, 1) if tp > 1 else (0,)):
            for zero in ((0, 1) if dp > 1 else (0,)):
                runs.append((tp, dp, sp, zero))
    for tp, dp, sp, zero in runs:
        tag = f"r{tp}x{dp}" + ("_sp" if sp else "") + ("_zero" if zero else "")
        flags = ["--tp", str(tp), "--dp", str(dp)] + (["--sp"] if sp else []) + \
            (["--zero", "1"] if zero else [])
        exe = build(model, defines, tag, flags)
        grads = os.path.join(work, f"grads_{tag}.safetensors")
        got = train(exe, *const, "--save-grads", grads)
        tp_dp = f"{' '.join(flags)}:"
        if len(got) != len(ref):
            sys.exit(f"FAIL {tp_dp} {len(got)} steps logged")
        # step-1 gradients, gathered to whole tensors, against the one-rank trainer's
        e, name = grads_rel_l2(grads1, grads)
        worst_grad = max(worst_grad, e)
        if e > 1e-5:
            sys.exit(f"FAIL {tp_dp} step-1 gradient of {name} differs by {e:.2e} "
                     f"(relative L2) from one rank's")
        for r, g in zip(ref, got):
            worst = max(worst, rel(g["loss"], r["loss"]))
            if rel(g["loss"], r["loss"]) > 1e-4 or rel(g["grad_norm"], r["grad_norm"]) > 1e-3:
                sys.exit(f"FAIL {tp_dp} step {r['step']}: loss {g['loss']} grad_norm "
                         f"{g['grad_norm']}, one rank {r['loss']} {r['grad_norm']}")
    # the communication plan.json reports for 2x2: per layer one tp all-reduce after
    # attention and one after the MLP, each way, plus the vocab-parallel embedding
    # (forward) and head input (backward), plus the optimizer's norm; one dp
    # all-reduce per gradient bucket (passes/dp_grads.c): 25 MiB, so one here
    plan = json.load(open(os.path.join(work, "r2x2", "plan.json")))
    comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
    layers = int([d.split("=")[1] for d in defines if d.startswith("layers=")][0])
    want = {("tp", "all_reduce"): 4 * layers + 3, ("dp", "all_reduce"): 1}
    for key, n in want.items():
        if comm.get(key) != n:
            sys.exit(f"FAIL: plan.json communication {key}: {comm.get(key)}, expected {n}")
    # layout-free checkpoints: 10 steps under 2x2 (plain, and --sp --zero 1), then 10
    # more under 1x1; 10 under 1x1, then 10 under 2x4 --sp --zero 1
    ck = os.path.join(work, "ckpt")
    exe22 = os.path.join(work, "r2x2", "build", "train")
    exe22sz = os.path.join(work, "r2x2_sp_zero", "build", "train")
    exe24sz = os.path.join(work, "r2x4_sp_zero", "build", "train")
    for first, then, what in ((exe22, one, "2x2 -> 1x1"),
                              (exe22sz, one, "2x2 --sp --zero 1 -> 1x1"),
                              (one, exe24sz, "1x1 -> 2x4 --sp --zero 1")):
        shutil.rmtree(ck, ignore_errors=True)
        half = train(first, *const[:-1], "10", "--save", ck)
        rest = train(then, *const, "--resume", ck)
        for r, g in zip(ref, half + rest):
            if rel(g["loss"], r["loss"]) > 1e-4:
                sys.exit(f"FAIL resume {what} step {r['step']}: {g['loss']} vs {r['loss']}")
    # the same 2x2 trainers as 4 MPI processes give the same bits as 4 threads
    mpirun = shutil.which("mpirun")
    note = "no mpirun: MPI runs skipped"
    for exe in (exe22, exe22sz) if mpirun else ():
        threads = train(exe, *const)
        log = os.path.join(work, "mpi.jsonl")
        # OpenMPI's own allocations are not LeakSanitizer-clean: under an ASan build of
        # parc, leak checking is off for the MPI processes (ours are checked elsewhere)
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
        if os.path.exists(log):
            os.remove(log)
        run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", exe, "--quiet",
             "--log", log, *const], env=env)
        mpi = [json.loads(l) for l in open(log) if '"step"' in l]
        if [r["loss"] for r in mpi] != [r["loss"] for r in threads]:
            sys.exit(f"FAIL: {exe}: mpirun -np 4 losses {[r['loss'] for r in mpi]} differ "
                     f"from the threads backend's {[r['loss'] for r in threads]}")
        note = "mpirun -np 4 equals 4 threads bit for bit (2x2, and 2x2 --sp --zero 1)"
    print(f"{model}: {len(runs)} layouts (tp x dp in 2x1 4x1 1x2 2x2 4x2 1x4 2x4, with and "
          f"without --sp and --zero 1) equal one rank over 20 steps "
          f"(worst loss difference {worst:.1e}, step-1 gradients {worst_grad:.1e} relative "
          f"L2); resumes 2x2 -> 1x1, 2x2 sp zero -> 1x1, 1x1 -> 2x4 sp zero; {note}")
else:
    sys.exit("unknown case " + case)
print("1 passed, 0 failed")
