#!/usr/bin/env python3
"""The attention backward from the forward's out and lse (sdpa keeps lse after its
output; what parc generates) against the same trainer recomputing them (the
statistics pass parc's trainers ran before), on the CPU, in one run.

For each case: compile with parc, copy the project, and in the copy's train.c pass
NULL, NULL for the forward's out and lse to every rt_sdpa_grad call (the runtime
then recomputes them: the old backward, same runtime build).  Build both, train
STEPS steps from the same seed and data, and print
  - whether the logged losses and grad norms are bit-identical (and the largest
    relative difference when they are not);
  - the median step time of each (after the first step) and the ratio new / old,
    the two trainers run alternately ROUNDS times so machine noise hits both.
The arena of the new trainer is larger by out + lse of every attention layer;
report.txt gives both figures (the old one from --arena-old, if given).

usage: bench/attn_stats_cpu.py [--build build] [--steps 20] [--rounds 3] [--out DIR]
                               [--timing-only | --layouts-only] [--only SUBSTRING]
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SMALL = ["-D", "layers=2", "-D", "d=32", "-D", "seq=16", "-D", "batch=4", "-D", "lr=3e-3"]
# name, model, defines, layout flags, timed
CASES = [
    ("gpt2_tiny (example size: d 64, 4 layers, seq 64, batch 4)", "gpt2_tiny", [], [], True),
    ("gpt2 d 768, 2 layers, seq 256, batch 2", "gpt2",
     ["-D", "layers=2", "-D", "seq=256", "-D", "batch=2", "-D", "microbatches=1",
      "-D", "precision=fp32"], [], True),
    ("gpt2_tiny, seq 512 (attention-heavy: T^2 d against T d^2)", "gpt2_tiny", ["-D", "seq=512"],
     [], True),
    ("llama_tiny (example size)", "llama_tiny", [], [], False),
    ("moe_tiny (example size)", "moe_tiny", [], [], False),
    ("gpt2_tiny small tp 2", "gpt2_tiny", SMALL + ["-D", "heads=2"], ["--tp", "2"], False),
    ("gpt2_tiny small pp 2", "gpt2_tiny", SMALL + ["-D", "heads=2"], ["--pp", "2"], False),
    ("gpt2_tiny small tp 2 --sp", "gpt2_tiny", SMALL + ["-D", "heads=2"], ["--tp", "2", "--sp"],
     False),
    ("llama_tiny small tp 2 (GQA)", "llama_tiny",
     SMALL + ["-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=64"], ["--tp", "2"], False),
]


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"attn_stats_cpu: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def old_variant(src, dst):
    """dst: src's project whose rt_sdpa_grad calls recompute the statistics."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "train.c")
    text = open(path).read()
    new, n = re.subn(r"(rt_sdpa_grad\((?:[^,()]+(?:\([^()]*\))?, ){5})F\(\d+\), F\(\d+\) \+ \d+, ",
                     r"\1NULL, NULL, ", text)
    if n == 0 or n != text.count("rt_sdpa_grad("):
        sys.exit(f"attn_stats_cpu: patched {n} of {text.count('rt_sdpa_grad(')} rt_sdpa_grad calls")
    open(path, "w").write(new)
    return n


def build(out):
    sh(["cmake", "-S", out, "-B", out + "/build", "-DCMAKE_BUILD_TYPE=Release"])
    sh(["cmake", "--build", out + "/build"])
    return out + "/build/train"


def train(exe, data, steps, log):
    if os.path.exists(log):
        os.remove(log)
    sh([exe, "--quiet", "--threads", "2", "--data", data, "--steps", str(steps), "--log", log])
    rows = [json.loads(l) for l in open(log)]
    return [r for r in rows if "step" in r]


def arena(out):
    m = re.search(r"activation arena \(planned, fp32\): .*?\((\d+) bytes\)",
                  open(os.path.join(out, "report.txt")).read())
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--timing-only", action="store_true")
    ap.add_argument("--layouts-only", action="store_true")
    ap.add_argument("--only", default=None, help="cases whose name contains this")
    a = ap.parse_args()
    parc = os.path.join(os.path.abspath(a.build), "parc")
    work = a.out or os.path.join(os.path.abspath(a.build), "bench-attn-stats")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write(open(os.path.join(ROOT, "README.md")).read() * 4)
    for name, model, defines, layout, timed in CASES:
        if (a.timing_only and not timed) or (a.layouts_only and timed):
            continue
        if a.only and a.only not in name:
            continue
        tag = re.sub(r"[^a-z0-9]+", "_", name.lower())[:40]
        new = os.path.join(work, tag + "_new")
        sh([parc, os.path.join(ROOT, "examples", model + ".dsl"), "-o", new, "--target", "cpu",
            *defines, *layout])
        n = old_variant(new, os.path.join(work, tag + "_old"))
        exe = {"new": build(new), "old": build(os.path.join(work, tag + "_old"))}
        logs, ms = {}, {"new": [], "old": []}
        for r in range(a.rounds if timed else 1):
            for k in ("old", "new") if r % 2 else ("new", "old"):
                rows = train(exe[k], data, a.steps, os.path.join(work, f"{tag}_{k}.jsonl"))
                logs[k] = rows
                ms[k] += [x["ms"] for x in rows[1:]]
        diff = 0.0
        same = True
        for u, v in zip(logs["new"], logs["old"]):
            for key in ("loss", "grad_norm"):
                if key in u and u[key] != v[key]:
                    same = False
                    diff = max(diff, abs(u[key] - v[key]) / max(abs(v[key]), 1e-30))
        print(f"{name} [{' '.join(layout) or 'one rank'}]: {n} sdpa_grad calls; "
              f"{a.steps}-step losses and grad norms "
              + ("bit-identical" if same else f"differ, worst relative {diff:.2e}")
              + f"; loss {logs['new'][0]['loss']:.6f} -> {logs['new'][-1]['loss']:.6f}"
              + f"; arena {arena(new)} bytes")
        if timed:
            mn, mo = statistics.median(ms["new"]), statistics.median(ms["old"])
            print(f"  median step: new {mn:.2f} ms, old {mo:.2f} ms, ratio new/old {mn / mo:.3f} "
                  f"({len(ms['new'])} steps each)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
