#!/usr/bin/env python3
"""Step time of the same model and layout compiled by two parc binaries (a
change against the code before it), CPU trainers, in one run.

usage: bench/versions_cpu.py OLD_PARC NEW_PARC [--steps 6] [--rounds 2]
                             [--threads 2] [--work DIR] [-- PARC FLAGS...]
Compiles GPT-2 (examples/gpt2.dsl, d 768, 2 layers, seq 128, batch 4) with each
binary and the flags after "--" (default: --dp 2), builds both trainers, then
trains them alternately ROUNDS times for STEPS steps each (--threads THREADS:
ranks as threads share them) and prints each binary's median step (after the
first of each run) and the ratio new / old (below 1: the new code is faster).
The two trainers' losses must agree to 1e-5 relative (bit for bit where the
change keeps the arithmetic), which is printed too."""
import argparse, json, os, shutil, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mesh_cpu import ROOT, sh  # noqa: E402 (the bench scripts' shared helpers)


def main():
    argv = sys.argv[1:]
    flags = ["--dp", "2"]
    if "--" in argv:
        flags = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/parc-bench-versions")
    a = ap.parse_args(argv)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    data = os.path.join(a.work, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join("abcdefghij"[i % 10] * (1 + i % 7) for i in range(200000)))
    exes = {}
    for tag, parc in (("old", a.old), ("new", a.new)):
        out = os.path.join(a.work, tag)
        sh([parc, os.path.join(ROOT, "examples", "gpt2.dsl"), "-o", out, "--target", "cpu",
            "-D", "layers=2", "-D", "seq=128", "-D", "batch=4", "-D", "microbatches=1", *flags])
        sh(["cmake", "-S", out, "-B", out + "/build", "-DCMAKE_BUILD_TYPE=Release"])
        sh(["cmake", "--build", out + "/build"])
        exes[tag] = out + "/build/train"
    steps = {"old": [], "new": []}
    losses = {}
    for r in range(a.rounds):
        for tag in ("old", "new") if r % 2 == 0 else ("new", "old"):
            log = os.path.join(a.work, f"{tag}-{r}.jsonl")
            sh([exes[tag], "--quiet", "--data", data, "--steps", str(a.steps), "--threads",
                str(a.threads), "--lr", "1e-4", "--log", log])
            rows = [json.loads(l) for l in open(log)]
            rows = [x for x in rows if "ms" in x]
            steps[tag] += [x["ms"] for x in rows[1:]]
            losses[tag] = [x["loss"] for x in rows]
    worst = max(abs(p - q) / max(abs(q), 1e-30) for p, q in zip(losses["new"], losses["old"]))
    old, new = statistics.median(steps["old"]), statistics.median(steps["new"])
    print(f"GPT-2 d 768, 2 layers, seq 128, batch 4, {' '.join(flags)}; --threads {a.threads}; "
          f"{a.rounds} alternating runs of {a.steps} steps")
    print(f"  old {a.old}: {old:8.1f} ms/step (median of {len(steps['old'])})")
    print(f"  new {a.new}: {new:8.1f} ms/step (median of {len(steps['new'])})")
    print(f"  new / old: {new / old:.3f}; losses within {worst:.1e} relative")
    if worst > 1e-5:
        sys.exit("bench: the two trainers' losses differ")


if __name__ == "__main__":
    main()
