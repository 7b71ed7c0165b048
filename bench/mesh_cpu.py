#!/usr/bin/env python3
"""Step time of tensor- and data-parallel trainers against one rank, on the
same total thread count, in one run.

usage: bench/mesh_cpu.py [--build build] [--threads 2] [--steps 6]
Compiles GPT-2 (d 768, 2 layers, vocab 50257, seq 128, batch 4) for tp x dp in
1x1, 2x1, 1x2, trains each for STEPS steps with --threads THREADS (ranks run
as threads; each rank gets THREADS / ranks) and prints the median step time
after the first and its ratio to one rank.  dp 2 is built twice: with the
gradient buckets' collectives asynchronous (the default: each started when its
bucket is complete, overlapping the rest of the backward pass) and with
--no-overlap (blocking calls); their step-time ratio async / blocking is printed
(below 1: the overlap pays).  Last, pp 2 (1F1B, 4 microbatches of one sequence)
fused and with --no-fuse (one kernel a node, as pipelined trainers were before
they fused): the ratio fused / unfused."""
import argparse, json, os, shutil, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    work = os.path.join(a.build, "bench-mesh")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join("abcdefghij"[i % 10] * (1 + i % 7) for i in range(200000)))
    base = None
    print(f"GPT-2 d 768, 2 layers, seq 128, batch 4; --threads {a.threads}; median of "
          f"{a.steps - 1} steps")
    times = {}
    pp2 = ["--pp", "2", "--microbatches", "4"]
    for tp, dp, name, extra in ((1, 1, "", []), (2, 1, "", []), (1, 2, "", []),
                                (1, 2, "_blocking", ["--no-overlap"]), (1, 1, "_pp2", pp2),
                                (1, 1, "_pp2_nofuse", pp2 + ["--no-fuse"])):
        out = os.path.join(work, f"r{tp}x{dp}" + name)
        sh([os.path.join(a.build, "parc"), os.path.join(ROOT, "examples", "gpt2.dsl"), "-o", out,
            "-D", "layers=2", "-D", "seq=128", "-D", "batch=4", "-D", "microbatches=1",
            "--tp", str(tp), "--dp", str(dp), *extra])
        sh(["cmake", "-S", out, "-B", out + "/build"])
        sh(["cmake", "--build", out + "/build"])
        log = os.path.join(out, "log.jsonl")
        sh([out + "/build/train", "--quiet", "--data", data, "--steps", str(a.steps),
            "--threads", str(a.threads), "--lr", "1e-4", "--log", log])
        ms = statistics.median(json.loads(l)["ms"] for l in list(open(log))[2:])
        base = base or ms
        times[(tp, dp, name)] = ms
        what = "".join(" " + x for x in extra if x not in ("--microbatches", "4"))
        print(f"  tp {tp} dp {dp}{what:17s}: {ms:8.1f} ms/step   ratio to one rank {ms / base:.2f}")
    print(f"  dp 2 asynchronous / blocking bucket collectives: "
          f"{times[(1, 2, '')] / times[(1, 2, '_blocking')]:.3f}")
    print(f"  pp 2 fused / --no-fuse: {times[(1, 1, '_pp2')] / times[(1, 1, '_pp2_nofuse')]:.3f}")


if __name__ == "__main__":
    main()
