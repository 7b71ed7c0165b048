#!/usr/bin/env python3
"""Black-box tests of rt_train_main on several ranks (tp x dp meshes, ranks as threads)
through the hand-written bigram trainer (train_bigram.c with TRAIN_TP / TRAIN_DP: its
[V, V] table column-sharded over tp). Every layout must train the one-rank model:
same logged losses (within 1e-6 relative), same weights files and checkpoints (byte
for byte: the trainer keeps the one-rank summation order), and checkpoints must move
between layouts.
mpi_start: under mpirun (2x2, a process per rank; skipped without mpirun or MPI), a
start hook's setup refusal (TRAIN_START=setup) is one line from world rank 0 and exit
1 with every process finalising MPI (Open MPI: its btl verbose lines), its internal
failure (=internal) exit 3.
usage: train_mesh_check.py CASE TRAINER WORKDIR
       (CASE: layouts, resume, init, errors, mpi_start)"""
import json
import os
import re
import shutil
import subprocess
import sys

CASE, TRAINER, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
WORK = os.path.join(ROOT, "train_mesh_" + CASE)
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
errors = []


def fail(msg):
    errors.append(msg)


def path(name):
    return os.path.join(WORK, name)


def run(mesh, *args, env=None, want=0):
    """Runs the trainer on a tp x dp mesh; checks its exit code; returns (stdout, stderr)."""
    e = dict(os.environ)
    for k in ("TRAIN_SCHEDULE", "TRAIN_AUX", "TRAIN_FAIL_AT", "TRAIN_STALL", "TRAIN_BREAK",
              "TRAIN_START", "TRAIN_TP", "TRAIN_DP"):
        e.pop(k, None)
    e.update(env or {})
    e["TRAIN_TP"], e["TRAIN_DP"] = str(mesh[0]), str(mesh[1])
    p = subprocess.run([TRAINER, "--threads", "2", *args], env=e, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != want:
        fail(f"{mesh} {' '.join(args)}: exit {p.returncode}, want {want}; "
             f"stderr: {p.stderr.strip()}")
    return p.stdout, p.stderr


def read_bytes(p):
    with open(p, "rb") as f:
        return f.read()


def same_file(a, b, what):
    if read_bytes(a) != read_bytes(b):
        fail(f"{what}: {a} and {b} differ")


def losses(p):
    """(loss, ce_loss or None) of each step record."""
    recs = [json.loads(line) for line in read_bytes(p).decode().splitlines()]
    return [(r["loss"], r.get("ce_loss")) for r in recs if "step" in r]


def close(a, b, what):
    if len(a) != len(b):
        fail(f"{what}: {len(a)} steps vs {len(b)}")
        return
    for i, (x, y) in enumerate(zip(a, b)):
        for u, v in zip(x, y):
            if (u is None) != (v is None) or (u is not None and abs(u - v) > 1e-6 * abs(v)):
                fail(f"{what}: step {i}: {x} vs {y}")
                return


def tag(mesh):
    return f"{mesh[0]}x{mesh[1]}"


# ---- cases ----

def case_layouts():
    """10 steps on every layout == 10 steps on one rank: losses, weights, checkpoint."""
    env = {"TRAIN_AUX": "1"}
    for mesh in LAYOUTS:
        t = tag(mesh)
        out, err = run(mesh, "--steps", "10", "--log", path(f"{t}.jsonl"), "--save-weights",
                       path(f"{t}.st"), "--save", path(f"{t}.ckpt"), "--save-every", "4",
                       env=env)
        if out.count("bigram: ") != 1 or out.count("done: step 10") != 1:
            fail(f"{t}: the start and done lines are not printed once: {out!r}")
        if mesh != (1, 1) and f"mesh: tp {mesh[0]} x dp {mesh[1]}" not in out:
            fail(f"{t}: no mesh line: {out!r}")
        if err:
            fail(f"{t}: stderr {err!r}")
    base = losses(path("1x1.jsonl"))
    for mesh in LAYOUTS[1:]:
        t = tag(mesh)
        close(losses(path(f"{t}.jsonl")), base, f"{t} losses")
        same_file(path("1x1.st"), path(f"{t}.st"), f"{t} weights")
        for f in ("model.safetensors", "optimizer.safetensors"):
            same_file(os.path.join(path("1x1.ckpt"), f), os.path.join(path(f"{t}.ckpt"), f),
                      f"{t} checkpoint {f}")
        a = json.loads(read_bytes(os.path.join(path("1x1.ckpt"), "trainer.json")))
        b = json.loads(read_bytes(os.path.join(path(f"{t}.ckpt"), "trainer.json")))
        for d in (a, b):
            for k in ("params_numel", "state_numel"):
                d["model"].pop(k)
        if a != b:
            fail(f"{t}: trainer.json {b}\n  want {a}")
        recs = [json.loads(line) for line in read_bytes(path(f"{t}.jsonl")).decode().splitlines()]
        cfg = recs[0].get("config", {})
        if cfg.get("tp") != mesh[0] or cfg.get("dp") != mesh[1] or cfg.get("params") != 65792:
            fail(f"{t}: config record {cfg}")


def case_resume():
    """A checkpoint saved on one layout continues on another exactly like the
    uninterrupted run (constant --lr): 2x2 -> 1x1, 1x1 -> 2x2, 2x1 -> 1x2."""
    env = {"TRAIN_AUX": "1"}
    lr = ("--lr", "0.01")
    run((1, 1), "--steps", "20", *lr, "--log", path("a.jsonl"), "--save-weights", path("a.st"),
        "--save", path("a.ckpt"), env=env)
    for first, second in (((2, 2), (1, 1)), ((1, 1), (2, 2)), ((2, 1), (1, 2))):
        t = f"{tag(first)}_{tag(second)}"
        run(first, "--steps", "10", *lr, "--log", path(f"{t}.jsonl"), "--save",
            path(f"{t}.ckpt"), env=env)
        out, _ = run(second, "--steps", "20", "--resume", path(f"{t}.ckpt"), "--log",
                     path(f"{t}.jsonl"), "--save-weights", path(f"{t}.st"), "--save",
                     path(f"{t}.ckpt"), env=env)
        if "resumed from" not in out or "steps 10..20" not in out:
            fail(f"{t}: the start lines do not show the resume: {out!r}")
        same_file(path("a.st"), path(f"{t}.st"), f"{t}: weights")
        for f in ("model.safetensors", "optimizer.safetensors"):
            same_file(os.path.join(path("a.ckpt"), f), os.path.join(path(f"{t}.ckpt"), f),
                      f"{t}: checkpoint {f}")
        close(losses(path(f"{t}.jsonl")), losses(path("a.jsonl")), f"{t}: losses")


def case_init():
    """--init from an unsharded weights file (also under a "transformer." prefix) on
    2x1 and 2x2 continues like one rank; a wrong global shape is refused."""
    run((1, 1), "--steps", "5", "--save-weights", path("w.st"))
    run((1, 1), "--steps", "5", "--init", path("w.st"), "--save-weights", path("w1.st"),
        "--log", path("w1.jsonl"))
    for mesh in ((2, 1), (2, 2)):
        t = tag(mesh)
        run(mesh, "--steps", "5", "--init", path("w.st"), "--save-weights", path(f"w{t}.st"),
            "--log", path(f"w{t}.jsonl"))
        same_file(path("w1.st"), path(f"w{t}.st"), f"{t}: --init then 5 steps")
        close(losses(path(f"w{t}.jsonl")), losses(path("w1.jsonl")), f"{t}: --init losses")
    # zero steps: the file round-trips through the shards
    run((2, 1), "--steps", "0", "--init", path("w.st"), "--save-weights", path("w0.st"))
    same_file(path("w.st"), path("w0.st"), "2x1: --init round trip")
    # a wrong global shape: one line naming the tensor
    data = read_bytes(path("w.st"))
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["wte.weight"]["shape"] = [256, 255]
    header["wte.weight"]["data_offsets"][1] -= 256 * 4
    header["bias"]["data_offsets"] = [x - 256 * 4 for x in header["bias"]["data_offsets"]]
    body = data[8 + n:]
    body = body[:256 * 255 * 4] + body[256 * 256 * 4:]
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path("bad.st"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + body)
    _, err = run((2, 1), "--steps", "1", "--init", path("bad.st"), want=1)
    if err.count("\n") != 1 or "wte.weight" not in err or "[256, 256]" not in err:
        fail(f"2x1: --init with a wrong shape: {err!r}")


def one_line(mesh, args, want, needles, env=None):
    _, err = run(mesh, *args, env=env, want=want)
    if err.count("\n") != 1:
        fail(f"{tag(mesh)} {' '.join(args)}: not one line: {err!r}")
    for s in needles:
        if s not in err:
            fail(f"{tag(mesh)} {' '.join(args)}: {err!r} lacks {s!r}")


def case_errors():
    """On a mesh, each failure is one line, with the one-rank exit codes."""
    one_line((1, 3), ["--steps", "1"], 3, ["batch 4 is not divisible by dp 3"])
    one_line((2, 2), ["--steps", "3"], 3, ["step 2/3 (log step 1)", "injected failure"],
             env={"TRAIN_FAIL_AT": "2"})
    # a start hook (a GPU trainer's device) on every rank, before the first step: a
    # refused setup is one line and exit 1, its failure internal (exit 3)
    run((2, 2), "--steps", "2", env={"TRAIN_START": "ok"})
    one_line((2, 2), ["--steps", "2"], 1, ["injected setup refusal"], env={"TRAIN_START": "setup"})
    _, err = run((2, 1), "--steps", "2", env={"TRAIN_START": "setup"}, want=1)
    if "internal error" in err:
        fail(f"2x1 TRAIN_START=setup: {err!r} calls a setup refusal an internal error")
    one_line((1, 2), ["--steps", "2"], 3, ["internal error", "starting the device"],
             env={"TRAIN_START": "internal"})
    one_line((2, 2), ["--save-weights", path("no/dir/w.st")], 1, ["--save-weights", "no/dir"])
    one_line((2, 2), ["--resume", path("nope.ckpt")], 1, ["--resume", "nope.ckpt"])
    one_line((2, 1), ["--log", path("no/dir/l.jsonl")], 1, ["--log", "no/dir"])
    run((1, 1), "--steps", "2", "--save", path("good.ckpt"))
    one_line((2, 2), ["--resume", path("good.ckpt"), "--steps", "1"], 1, ["step 2", "--steps 1"])
    # a stuck rank: the others' collectives give up after --comm-timeout and the run
    # ends with one line naming the waiting rank, its group and op
    one_line((2, 2), ["--steps", "3", "--comm-timeout", "0.5"], 3,
             ["timed out", "rank"], env={"TRAIN_STALL": "3"})
    one_line((2, 1), ["--comm-timeout", "0"], 1, ["--comm-timeout", "(0, 1e+06]"])
    # a failure after a periodic checkpoint leaves the checkpoint of the last good step
    run((2, 2), "--steps", "9", "--save", path("every.ckpt"), "--save-every", "3",
        env={"TRAIN_FAIL_AT": "8"}, want=3)
    st = json.loads(read_bytes(os.path.join(path("every.ckpt"), "trainer.json")))
    if st.get("step") != 6:
        fail(f"2x2: periodic checkpoint at step {st.get('step')}, want 6")


def case_mpi_start():
    """A start hook's outcome under mpirun -np 4 (2x2): a setup refusal agreed by every
    rank leaves MPI cleanly (every process finalises) with one line and exit 1."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("SKIP: mpirun not found")
        sys.exit(77)
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    ompi = "Open MPI" in version.stdout + version.stderr
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             TRAIN_TP="2", TRAIN_DP="2")
    for k in ("TRAIN_SCHEDULE", "TRAIN_AUX", "TRAIN_FAIL_AT", "TRAIN_STALL", "TRAIN_BREAK"):
        e.pop(k, None)
    # under AddressSanitizer: Open MPI's own allocations outlive MPI_Finalize
    asan = e.get("ASAN_OPTIONS", "")
    e["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0"

    def mpi(how, want):
        # --quiet: without it Open MPI adds its notice about a nonzero exit status
        cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--quiet", "-np", "4",
               "-x", "TRAIN_START=" + how] + \
            (["--mca", "btl_base_verbose", "10"] if ompi else []) + \
            [TRAINER, "--threads", "4", "--steps", "2", "--quiet"]
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        if "has no MPI" in out or "built without MPI" in out:
            print("SKIP: libparcrt was built without MPI")
            sys.exit(77)
        fin = len(set(re.findall(r"^\[([^\]]+)\] mca: base: close: component self closed$",
                                 out, re.M)))
        lines = [x for x in out.splitlines() if x.strip() and not re.match(r"\[[^\]\s]+:\d+\] ", x)]
        if p.returncode != want:
            fail(f"mpirun TRAIN_START={how}: exit {p.returncode}, want {want}: {lines}")
        return lines, fin

    lines, fin = mpi("setup", 1)
    if len(lines) != 1 or "injected setup refusal" not in lines[0] or "internal" in lines[0]:
        fail(f"mpirun TRAIN_START=setup: not the refusal's one line: {lines}")
    if ompi and fin != 4:
        fail(f"mpirun TRAIN_START=setup: {fin} of the 4 processes finalised MPI")
    lines, _ = mpi("internal", 3)
    if not any("internal error" in x and "starting the device" in x for x in lines):
        fail(f"mpirun TRAIN_START=internal: no internal error line: {lines}")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
globals()["case_" + CASE]()
if errors:
    print("\n".join(errors[:20]))
    sys.exit(f"train_mesh_check {CASE}: {len(errors)} failure(s)")
print(f"train_mesh_check {CASE}: ok")
