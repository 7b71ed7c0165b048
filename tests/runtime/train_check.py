#!/usr/bin/env python3
"""Black-box tests of rt_train_main through the hand-written bigram trainer
(train_bigram.c): options, logs, weights files, checkpoints and learning, read back
with Python's own safetensors and JSON readers.
usage: train_check.py CASE TRAINER WORKDIR   (CASE: resume, save_every, log, weights,
errors, data, learns; see the functions below)"""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

CASE, TRAINER, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
WORK = os.path.join(ROOT, "train_" + CASE)
V, B, T = 256, 4, 32
NPARAM = V * V + V
errors = []


def fail(msg):
    errors.append(msg)


def path(name):
    return os.path.join(WORK, name)


def run(*args, env=None, want=0):
    """Runs the trainer; checks its exit code; returns (stdout, stderr)."""
    e = dict(os.environ)
    for k in ("TRAIN_SCHEDULE", "TRAIN_AUX", "TRAIN_FAIL_AT", "TRAIN_BREAK", "TRAIN_START"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run([TRAINER, "--threads", "1", *args], env=e, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != want:
        fail(f"{' '.join(args)}: exit {p.returncode}, want {want}; stderr: {p.stderr.strip()}")
    return p.stdout, p.stderr


def read_bytes(p):
    with open(p, "rb") as f:
        return f.read()


def read_st(p):
    """{name: (shape, raw bytes)}, metadata: an independent safetensors reader."""
    data = read_bytes(p)
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = data[8 + hlen:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        b, e = info["data_offsets"]
        assert e - b == 4 * math.prod(info["shape"]), name
        out[name] = (info["shape"], body[b:e])
    return out, meta


def write_st(p, tensors):
    """tensors: [(name, shape, raw bytes)] -> a safetensors file."""
    header, body = {}, b""
    for name, shape, blob in tensors:
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(body), len(body) + len(blob)]}
        body += blob
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)


def floats(blob):
    return struct.unpack(f"<{len(blob) // 4}f", blob)


def log_records(p):
    text = read_bytes(p).decode()
    if not text.endswith("\n"):
        fail(f"{p}: does not end with a newline")
    return [json.loads(line) for line in text.splitlines()]


def loss_texts(p):
    """The "loss" values of the step records exactly as written."""
    return [m.group(1) for line in read_bytes(p).decode().splitlines()
            for m in [re.search(r'"loss":([^,}]*)', line)] if m]


def same_file(a, b, what):
    if read_bytes(a) != read_bytes(b):
        fail(f"{what}: {a} and {b} differ")


# ---- cases ----

def case_resume():
    """20 steps straight == 10 steps + --save + --resume + 10 steps, bit for bit: the
    weights, the optimizer state and the logged losses. Once with a schedule that does
    not depend on the horizon (--steps 10 then 20), once with the cosine schedule where
    the first run is stopped by a failure after a --save-every checkpoint."""
    for sched in ("warmup", "cosine"):
        env = {"TRAIN_SCHEDULE": sched, "TRAIN_AUX": "1"}
        s = sched
        run("--steps", "20", "--save-weights", path(f"{s}_a.st"), "--log", path(f"{s}_a.jsonl"),
            "--save", path(f"{s}_a.ckpt"), env=env)
        if sched == "warmup":
            run("--steps", "10", "--save", path(f"{s}_b.ckpt"), "--log", path(f"{s}_b.jsonl"),
                env=env)
        else:
            _, err = run("--steps", "20", "--save", path(f"{s}_b.ckpt"), "--save-every", "5",
                         "--log", path(f"{s}_b.jsonl"), env={**env, "TRAIN_FAIL_AT": "13"},
                         want=3)
            if "injected failure" not in err:
                fail(f"cosine: the failing step's message is missing: {err!r}")
            # the log holds steps 0..11; keep those before the checkpoint's step 10
            lines = read_bytes(path(f"{s}_b.jsonl")).decode().splitlines(True)
            with open(path(f"{s}_b.jsonl"), "w") as f:
                f.writelines(lines[:11])
        state = json.loads(read_bytes(os.path.join(path(f"{s}_b.ckpt"), "trainer.json")))
        if state.get("step") != 10 or state.get("next_sequence") != 10 * B:
            fail(f"{s}: checkpoint at step {state.get('step')}, want 10")
        out, _ = run("--steps", "20", "--resume", path(f"{s}_b.ckpt"), "--save-weights",
                     path(f"{s}_b.st"), "--log", path(f"{s}_b.jsonl"), "--save",
                     path(f"{s}_b.ckpt"), env=env)
        if "resumed from" not in out or "steps 10..20" not in out:
            fail(f"{s}: the start lines do not show the resume: {out!r}")
        same_file(path(f"{s}_a.st"), path(f"{s}_b.st"), f"{s}: weights")
        for f in ("model.safetensors", "optimizer.safetensors"):
            same_file(os.path.join(path(f"{s}_a.ckpt"), f), os.path.join(path(f"{s}_b.ckpt"), f),
                      f"{s}: checkpoint {f}")
        a, b = loss_texts(path(f"{s}_a.jsonl")), loss_texts(path(f"{s}_b.jsonl"))
        if len(a) != 20 or a != b:
            fail(f"{s}: logged losses differ:\n  {a}\n  {b}")
        steps = [r["step"] for r in log_records(path(f"{s}_b.jsonl")) if "step" in r]
        if steps != list(range(20)):
            fail(f"{s}: resumed log steps {steps}")
        # resuming at the end trains nothing and changes nothing
        run("--steps", "20", "--resume", path(f"{s}_b.ckpt"), "--save-weights",
            path(f"{s}_c.st"), env=env)
        same_file(path(f"{s}_a.st"), path(f"{s}_c.st"), f"{s}: resume at the end")
    # a constant --lr is part of the state: the resumed run keeps it
    run("--steps", "6", "--lr", "0.01", "--save-weights", path("lr_a.st"))
    run("--steps", "3", "--lr", "0.01", "--save", path("lr_b.ckpt"))
    run("--steps", "6", "--resume", path("lr_b.ckpt"), "--save-weights", path("lr_b.st"))
    same_file(path("lr_a.st"), path("lr_b.st"), "--lr kept across resume")


def case_save_every():
    """--save-every N writes a complete checkpoint after every N steps (the last one
    survives a failing step), and the final --save holds the last step."""
    ck = path("every.ckpt")
    run("--steps", "9", "--save", ck, "--save-every", "3", env={"TRAIN_FAIL_AT": "8"}, want=3)
    manifest = json.loads(read_bytes(os.path.join(ck, "manifest.json")))
    names = sorted(f["name"] for f in manifest["files"])
    if names != ["model.safetensors", "optimizer.safetensors", "trainer.json"]:
        fail(f"checkpoint files {names}")
    for f in manifest["files"]:
        if os.path.getsize(os.path.join(ck, f["name"])) != f["bytes"]:
            fail(f"{f['name']}: size differs from the manifest")
    st = json.loads(read_bytes(os.path.join(ck, "trainer.json")))
    want = {"format": "parc-train-state", "version": 1, "step": 6, "next_sequence": 24,
            "steps": 9, "seed": "1337", "lr_override": None,
            "data": {"name": "<builtin corpus>", "tokens": 2 << 20},
            "model": {"name": "bigram", "vocab": V, "batch": B, "seq": T, "optimizer": "adamw",
                      "nparams": 2, "params_numel": V * V + 16 + V, "nstate": 4,
                      "state_numel": 2 * V * V + 2 * V}}
    if st != want:
        fail(f"trainer.json {st}\n  want {want}")
    model, _ = read_st(os.path.join(ck, "model.safetensors"))
    optim, _ = read_st(os.path.join(ck, "optimizer.safetensors"))
    if {k: v[0] for k, v in model.items()} != {"wte.weight": [V, V], "bias": [V]}:
        fail(f"model.safetensors tensors {list(model)}")
    if {k: v[0] for k, v in optim.items()} != {
            "wte.weight.exp_avg": [V * V], "wte.weight.exp_avg_sq": [V * V],
            "bias.exp_avg": [V], "bias.exp_avg_sq": [V]}:
        fail(f"optimizer.safetensors tensors {list(optim)}")
    if not any(floats(optim["bias.exp_avg_sq"][1])):
        fail("optimizer state is all zero after 6 steps")
    run("--steps", "9", "--save", ck, "--save-every", "3")
    st = json.loads(read_bytes(os.path.join(ck, "trainer.json")))
    if st["step"] != 9:
        fail(f"final checkpoint at step {st['step']}, want 9")
    left = sorted(os.listdir(WORK))
    if left != ["every.ckpt"]:
        fail(f"staging directories left behind: {left}")


CONFIG_KEYS = ["batch", "seq", "vocab", "params", "lr", "beta1", "beta2", "adam_eps",
               "weight_decay", "momentum", "grad_clip", "optimizer", "schedule", "warmup",
               "min_lr", "steps", "seed", "d"]
STEP_KEYS = ["step", "loss", "lr", "grad_norm", "tokens_per_s", "ms"]


def case_log():
    """The config record holds the model's dimensions and every hyper-parameter in
    force; step records have the fields, numbering and lr they should."""
    run("--steps", "5", "--log", path("a.jsonl"), env={"TRAIN_AUX": "1"})
    recs = log_records(path("a.jsonl"))
    cfg = recs[0].get("config", {})
    for k in CONFIG_KEYS:
        if k not in cfg:
            fail(f"config lacks {k}: {cfg}")
    want = {"batch": B, "seq": T, "vocab": V, "params": NPARAM, "d": V, "lr": 0.03,
            "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8, "weight_decay": 0.01, "momentum": 0,
            "grad_clip": 1, "optimizer": "adamw", "schedule": "cosine", "warmup": 10,
            "min_lr": 0.003, "steps": 5, "seed": 1337, "model": "bigram"}
    for k, v in want.items():
        if cfg.get(k) != v:
            fail(f"config {k} = {cfg.get(k)!r}, want {v!r}")
    if len(recs) != 6 or [r.get("step") for r in recs[1:]] != list(range(5)):
        fail(f"step records {[r.get('step') for r in recs[1:]]}")
    for r in recs[1:]:
        if list(r)[:6] != STEP_KEYS or "ce_loss" not in r:
            fail(f"step record fields {list(r)}")
        elif not (r["ce_loss"] < r["loss"] and r["grad_norm"] > 0 and r["ms"] >= 0 and
                  r["tokens_per_s"] > 0 and 0 < r["lr"] <= 0.03):
            fail(f"step record values {r}")
    if abs(recs[1]["ce_loss"] - math.log(V)) > 0.05:
        fail(f"first loss {recs[1]['ce_loss']}, want about ln {V}")
    # without an auxiliary term there is no ce_loss; --lr is constant, schedule "constant"
    run("--steps", "3", "--lr", "0.005", "--log", path("b.jsonl"))
    recs = log_records(path("b.jsonl"))
    if recs[0]["config"]["lr"] != 0.005 or recs[0]["config"]["schedule"] != "constant":
        fail(f"--lr config {recs[0]['config']}")
    for r in recs[1:]:
        if "ce_loss" in r or r["lr"] != 0.005 or list(r) != STEP_KEYS:
            fail(f"--lr step record {r}")
    # a resumed run appends: a second config record with its start step
    run("--steps", "2", "--save", path("c.ckpt"), "--log", path("c.jsonl"))
    run("--steps", "4", "--resume", path("c.ckpt"), "--log", path("c.jsonl"))
    recs = log_records(path("c.jsonl"))
    kinds = ["config" if "config" in r else r["step"] for r in recs]
    if kinds != ["config", 0, 1, "config", 2, 3] or recs[3]["config"].get("start_step") != 2:
        fail(f"appended log {kinds}")


def case_weights():
    """--save-weights writes every parameter by name and shape; --init reads them back
    exactly (also under a "transformer." prefix); the seed decides the init."""
    run("--steps", "5", "--save-weights", path("w1.st"))
    w, meta = read_st(path("w1.st"))
    if {k: v[0] for k, v in w.items()} != {"wte.weight": [V, V], "bias": [V]}:
        fail(f"weights file tensors {[(k, v[0]) for k, v in w.items()]}")
    if meta != {"format": "pt"}:
        fail(f"weights metadata {meta}")
    if not any(floats(w["bias"][1])):
        fail("bias still zero after 5 steps")
    run("--init", path("w1.st"), "--steps", "0", "--save-weights", path("w2.st"))
    same_file(path("w1.st"), path("w2.st"), "--init round trip")
    # prefixed names, other order, an extra tensor the model does not have
    write_st(path("w3.st"), [("transformer.bias", [V], w["bias"][1]),
                             ("transformer.h.0.attn.bias", [2], b"\0" * 8),
                             ("transformer.wte.weight", [V, V], w["wte.weight"][1])])
    run("--init", path("w3.st"), "--steps", "0", "--save-weights", path("w4.st"))
    same_file(path("w1.st"), path("w4.st"), "--init with a transformer. prefix")
    # training from loaded weights continues like training straight through
    run("--steps", "0", "--save-weights", path("s1.st"))
    run("--steps", "0", "--save-weights", path("s1b.st"))
    run("--steps", "0", "--seed", "7", "--save-weights", path("s7.st"))
    same_file(path("s1.st"), path("s1b.st"), "init is deterministic")
    s1, s7 = read_st(path("s1.st"))[0], read_st(path("s7.st"))[0]
    if s1["wte.weight"][1] == s7["wte.weight"][1]:
        fail("--seed does not change the init")
    vals = floats(s1["wte.weight"][1])
    std = math.sqrt(sum(x * x for x in vals) / len(vals))
    if abs(std - 0.02) > 0.0005 or any(floats(s1["bias"][1])):
        fail(f"init: wte std {std} (want 0.02), bias must be zeros")
    # --save-grads: the first step's gradients, named and shaped like the weights; the
    # bias gradient of softmax cross-entropy (mean of p - onehot) sums to zero
    run("--steps", "3", "--save-grads", path("g1.st"))
    run("--steps", "1", "--save-grads", path("g2.st"))
    same_file(path("g1.st"), path("g2.st"), "--save-grads is the first step's")
    g, _ = read_st(path("g1.st"))
    if {k: v[0] for k, v in g.items()} != {"wte.weight": [V, V], "bias": [V]}:
        fail(f"gradients file tensors {[(k, v[0]) for k, v in g.items()]}")
    gb = floats(g["bias"][1])
    if not any(gb) or abs(sum(gb)) > 1e-5 * sum(abs(x) for x in gb):
        fail(f"bias gradient sums to {sum(gb)} (want 0, not all zero)")
    # from a checkpoint: the gradient of the step the run starts with
    run("--steps", "1", "--save", path("g.ckpt"))
    run("--steps", "2", "--resume", path("g.ckpt"), "--save-grads", path("g3.st"))
    if read_bytes(path("g3.st")) == read_bytes(path("g1.st")):
        fail("--save-grads after --resume wrote the first step's gradients, not step 2's")


def check_error(args, want, needles, env=None, usage=False):
    out, err = run(*args, env=env, want=want)
    text = err.strip()
    first = text.split("\n")[0]
    if not usage and "\n" in text:
        fail(f"{' '.join(args)}: more than one line: {text!r}")
    if usage and "usage:" not in text:
        fail(f"{' '.join(args)}: no usage after the error: {text!r}")
    for n in needles:
        if n not in first:
            fail(f"{' '.join(args)}: message {first!r} lacks {n!r}")


def case_errors():
    """Each bad option, input or model gives its exit code and one line naming it."""
    with open(path("short.bin"), "wb") as f:
        f.write(b"hello")
    run("--steps", "1", "--save-weights", path("good.st"), "--save", path("good.ckpt"))
    good, _ = read_st(path("good.st"))
    write_st(path("shape.st"), [("wte.weight", [V, V - 1], b"\0" * (4 * V * (V - 1))),
                                ("bias", [V], good["bias"][1])])
    write_st(path("missing.st"), [("wte.weight", [V, V], good["wte.weight"][1])])
    cases = [
        (["--data", path("nope.bin")], 1, ["nope.bin", "cannot open"]),
        (["--data", path("short.bin")], 1, ["short.bin", "5 tokens"]),
        (["--save-grads", path("nodir/g.st")], 1, ["--save-grads", "nodir"]),
        (["--init", path("shape.st")], 1, ["'wte.weight'", "[256, 255]", "[256, 256]"]),
        (["--init", path("missing.st")], 1, ["'bias'", "[256]"]),
        (["--init", path("nope.st")], 1, ["nope.st"]),
        (["--steps", "abc"], 1, ["--steps", "'abc'", "0..1000000000000"]),
        (["--steps", "-1"], 1, ["--steps", "'-1'", "0.."]),
        (["--steps", "10x"], 1, ["--steps", "'10x'"]),
        (["--steps", "99999999999999999999"], 1, ["--steps"]),
        (["--save-every", "0", "--save", path("x")], 1, ["--save-every", "'0'", "1.."]),
        (["--threads", "0"], 1, ["--threads", "'0'", "1..256"]),
        (["--lr", "-0.1"], 1, ["--lr", "'-0.1'", "0..1000"]),
        (["--lr", "nan"], 1, ["--lr", "'nan'"]),
        (["--seed", "-3"], 1, ["--seed", "'-3'", "18446744073709551615"]),
        (["--seed", "18446744073709551616"], 1, ["--seed"]),
        (["--data", ""], 1, ["--data", "non-empty"]),
        (["--save-every", "5"], 1, ["--save-every", "--save"]),
        (["--init", path("good.st"), "--resume", path("good.ckpt")], 1, ["--init", "--resume"]),
        (["--resume", path("nope.ckpt")], 1, ["--resume", "nope.ckpt"]),
        (["--resume", path("good.ckpt"), "--steps", "0"], 1, ["step 1", "--steps 0"]),
        (["--save-weights", path("no/such/dir/w.st")], 1, ["--save-weights", "no/such/dir"]),
        (["--log", path("no/such/dir/log.jsonl")], 1, ["--log", "no/such/dir"]),
        (["--save", path("short.bin/ck")], 1, ["--save", "short.bin"]),
    ]
    for args, code, needles in cases:
        check_error(args, code, needles)
    # a checkpoint of another model is refused
    tj = os.path.join(path("good.ckpt"), "trainer.json")
    st = json.loads(read_bytes(tj))
    st["model"]["batch"] = 8
    with open(tj, "w") as f:
        json.dump(st, f)
    # keep the manifest's size right so that only the model check can object
    man = os.path.join(path("good.ckpt"), "manifest.json")
    m = json.loads(read_bytes(man))
    for e in m["files"]:
        if e["name"] == "trainer.json":
            e["bytes"] = os.path.getsize(tj)
    with open(man, "w") as f:
        json.dump(m, f)
    check_error(["--resume", path("good.ckpt")], 1, ["batch is 8 there but 4 here"])
    # malformed command lines: exit 2 with the usage
    check_error(["--bogus"], 2, ["unknown", "--bogus"], usage=True)
    check_error(["--steps"], 2, ["'--steps' needs a value"], usage=True)
    check_error(["stray"], 2, ["unexpected argument", "stray"], usage=True)
    # internal errors: exit 3, one line
    for brk, needle in (("overlap", "before the end"), ("numel", "numel 257"),
                        ("dup", "appears twice"), ("state", "exceeds")):
        check_error([], 3, ["internal error", needle], env={"TRAIN_BREAK": brk})
    check_error(["--steps", "3"], 3, ["internal error", "step 2/3 (log step 1)",
                                       "injected failure"],
                env={"TRAIN_FAIL_AT": "2"})
    # a start hook (RtModelDesc.start, a GPU trainer's device): it runs once, before the
    # first step (the step checks); a setup it refuses is one line and exit 1 before any
    # step (the log has its config record, no step record); its failure is internal
    run("--steps", "2", env={"TRAIN_START": "ok"})
    log = path("refused.jsonl")
    _, err = run("--steps", "2", "--log", log, env={"TRAIN_START": "setup"}, want=1)
    recs = [json.loads(line) for line in read_bytes(log).decode().splitlines()]
    if (err.count("\n") != 1 or "injected setup refusal" not in err or "use a bigger" not in err
            or "internal error" in err):
        fail(f"TRAIN_START=setup: not the one-line setup refusal: {err!r}")
    if not recs or "config" not in recs[0] or any("step" in r for r in recs):
        fail(f"TRAIN_START=setup: the log is not one config record: {recs!r}")
    check_error([], 3, ["internal error", "starting the device", "injected start failure"],
                env={"TRAIN_START": "internal"})
    # no step to run (resumed at its end): no start, so nothing to refuse
    run("--steps", "1", "--save", path("end.ckpt"))
    run("--resume", path("end.ckpt"), "--steps", "1", env={"TRAIN_START": "setup"})
    # --help: exit 0, every option with its default from the model
    out, _ = run("--help")
    for opt in ("--steps N", "default 300", "--data FILE", "built-in corpus", "--init",
                "--save-weights", "--lr X", "cosine: lr 0.03, warmup 10, min_lr 0.003",
                "--seed S", "default 1337", "--log FILE", "--save DIR", "--save-every N",
                "--resume DIR", "--threads N", "--quiet", "--help"):
        if opt not in out:
            fail(f"--help lacks {opt!r}")


def write_bin(p, tokens):
    """An llm.c token file: 256 int32 header (magic, version, count), uint16 tokens."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(p, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens))


def case_data():
    """--data reads llm.c .bin files and raw bytes, reports them on the start line, and
    learns a deterministic sequence; bad tokens and too-short files are refused."""
    write_bin(path("cycle.bin"), [i % 10 for i in range(5000)])
    out, _ = run("--data", path("cycle.bin"), "--steps", "150", "--lr", "0.05", "--log",
                 path("cycle.jsonl"))
    if f"data {path('cycle.bin')}: 5000 tokens, unigram entropy 2.3026 nats" not in out:
        fail(f".bin start line: {out[:300]!r}")
    losses = [r["loss"] for r in log_records(path("cycle.jsonl")) if "step" in r]
    if not losses[-1] < 0.3:
        fail(f"a cycle of 10 tokens is not learnt: final loss {losses[-1]}")
    text = b"the cat sat on the mat. " * 2
    with open(path("raw.txt"), "wb") as f:
        f.write(text[:T + 1])   # exactly one sequence and its last target
    out, _ = run("--data", path("raw.txt"), "--steps", "2")
    if f"data {path('raw.txt')}: {T + 1} tokens" not in out:
        fail(f"raw bytes start line: {out[:300]!r}")
    with open(path("raw32.txt"), "wb") as f:
        f.write(text[:T])
    check_error(["--data", path("raw32.txt")], 1, ["raw32.txt", f"{T} tokens"])
    write_bin(path("big.bin"), [1, 2, 300] + [1] * 100)
    check_error(["--data", path("big.bin"), "--steps", "3"], 1, ["big.bin", "300"])


def case_learns():
    """On the built-in corpus the bigram model's loss goes below the printed unigram
    entropy within 300 steps (a model that ignores context cannot)."""
    out, _ = run("--log", path("learn.jsonl"))
    m = re.search(r"data <builtin corpus>: (\d+) tokens, unigram entropy ([0-9.]+) nats", out)
    if not m:
        fail(f"start line lacks the data source and entropy: {out[:300]!r}")
        return
    entropy = float(m.group(2))
    losses = [r["loss"] for r in log_records(path("learn.jsonl")) if "step" in r]
    tail = sum(losses[-20:]) / 20
    if len(losses) != 300 or not tail < entropy - 0.1:
        fail(f"{len(losses)} steps, final loss {tail:.4f}, unigram entropy {entropy:.4f}")
    print(f"first loss {losses[0]:.4f}, last 20 mean {tail:.4f}, unigram entropy {entropy:.4f}")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
globals()["case_" + CASE]()
if errors:
    print("\n".join(errors[:20]))
    sys.exit(f"train_check {CASE}: {len(errors)} failure(s)")
print(f"train_check {CASE}: ok")
