#!/usr/bin/env python3
"""Step time of pipelined ZeRO-1 trainers against the same pipeline without
ZeRO, in one run, for one or more parc builds side by side.

usage: bench/zero_pipe_cpu.py [--builds build [build-base ...]] [--threads 2]
                              [--steps 6] [--tiny-steps 40] [--rounds 3]
                              [--only tiny|big] [--mpi]
Compiles gpt2_tiny (d 64, 4 layers, seq 64, batch 4) and GPT-2 (d 768, 2
layers, vocab 50257, seq 128, batch 4) at --pp 2 --dp 2 (1F1B, 2
microbatches of one sequence per rank) twice per build: --zero 1 and
without ZeRO.  The trainers of every build are run in turn, ROUNDS times
(alternating, so that the shared machine's load falls on all of them alike),
each round STEPS steps (TINY_STEPS for gpt2_tiny); prints each trainer's
median step time (the steps after the first of each round), the ratio
zero / no zero per build, the dp reduce-scatters a step per stage that
plan.json counts, and, from one `train --trace` run of each --zero 1
trainer, the median over steps of the ranks' mean time in the end-of-step
reduce-scatter event (which includes waiting for the slowest dp peer).
--mpi runs every trainer as 4 MPI processes (mpirun --oversubscribe -np 4,
--threads 1 each) instead of 4 threads of one process.  With two builds (the compiler before and after a change)
the ratios side by side are the comparison: each build's runtime is the one
its generated trainers link."""
import argparse, json, os, shutil, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = [
    ("gpt2_tiny (d 64, 4 layers, seq 64, batch 4)", "gpt2_tiny.dsl", [], "tiny"),
    ("gpt2 d 768, 2 layers (vocab 50257, seq 128, batch 4)", "gpt2.dsl",
     ["-D", "layers=2", "-D", "seq=128", "-D", "batch=4", "-D", "microbatches=1"], "big"),
]
LAYOUT = ["--pp", "2", "--dp", "2", "--microbatches", "2", "--schedule", "1f1b"]


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def compile_trainer(build, dsl, defines, out, extra):
    sh([os.path.join(build, "parc"), os.path.join(ROOT, "examples", dsl), "-o", out, *defines,
        *LAYOUT, *extra])
    sh(["cmake", "-S", out, "-B", out + "/build"])
    sh(["cmake", "--build", out + "/build"])
    plan = json.load(open(os.path.join(out, "plan.json")))
    rs = [sum(c["count"] for c in plan["communication"]
              if c.get("stage") == s and c["group"] == "dp" and c["kind"] == "reduce_scatter")
          for s in range(2)]
    return out + "/build/train", rs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", nargs="+", default=[os.path.join(ROOT, "build")])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tiny-steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["tiny", "big"], help="one of the two models")
    ap.add_argument("--mpi", action="store_true", help="ranks as MPI processes")
    a = ap.parse_args()
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"] if a.mpi else []
    threads = "1" if a.mpi else str(a.threads)
    builds = [os.path.abspath(b) for b in a.builds]
    work = os.path.join(builds[0], "bench-zero-pipe")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join("abcdefghij"[i % 10] * (1 + i % 7) for i in range(200000)))
    ranks = ("4 MPI processes, --threads 1" if a.mpi
             else f"--threads {a.threads} (4 ranks as threads)")
    print(f"--pp 2 --dp 2, 1F1B, 2 microbatches; {ranks}; "
          f"{a.rounds} rounds alternating the trainers, median step after each round's first")
    for title, dsl, defines, key in MODELS:
        if a.only and key != a.only:
            continue
        steps = a.tiny_steps if key == "tiny" else a.steps
        exes = {}
        for bi, build in enumerate(builds):
            for zero in (0, 1):
                out = os.path.join(work, f"{key}_b{bi}_z{zero}")
                exes[(bi, zero)] = compile_trainer(build, dsl, defines, out,
                                                   ["--zero", "1"] if zero else [])
        ms = {k: [] for k in exes}
        for r in range(a.rounds):
            for k, (exe, _) in exes.items():
                log = os.path.join(work, f"{key}_b{k[0]}_z{k[1]}_r{r}.jsonl")
                sh([*mpi, exe, "--quiet", "--data", data, "--steps", str(steps), "--threads",
                    threads, "--lr", "1e-4", "--log", log])
                ms[k] += [json.loads(l)["ms"] for l in list(open(log))[2:]]
        # one traced run of each --zero 1 trainer: the end-of-step reduce-scatter event
        # (waiting for the slowest dp peer included), mean over the ranks a step
        scatter = {}
        for bi in range(len(builds)):
            tr = os.path.join(work, f"{key}_b{bi}_trace.json")
            sh([*mpi, exes[(bi, 1)][0], "--quiet", "--data", data, "--steps", str(steps),
                "--threads", threads, "--lr", "1e-4", "--trace", tr])
            ev = [e for e in json.load(open(tr))["traceEvents"] if e.get("ph") == "X" and
                  e["cat"] == "reduce-scatter gradients (dp)" and e["args"]["step"] > 0]
            per_step = {}
            for e in ev:
                per_step.setdefault(e["args"]["step"], []).append(e["dur"] / 1000.0)
            scatter[bi] = statistics.median(statistics.mean(v) for v in per_step.values())
        print(f"{title}: {steps} steps a round")
        for bi, build in enumerate(builds):
            t0, t1 = statistics.median(ms[(bi, 0)]), statistics.median(ms[(bi, 1)])
            rs = exes[(bi, 1)][1]
            print(f"  {a.builds[bi]:12s} no zero {t0:9.2f} ms   --zero 1 {t1:9.2f} ms"
                  f"   zero / no zero {t1 / t0:.3f}   dp reduce-scatters a step: stage 0 "
                  f"{rs[0]}, stage 1 {rs[1]}; their event {scatter[bi]:.2f} ms")


if __name__ == "__main__":
    main()
