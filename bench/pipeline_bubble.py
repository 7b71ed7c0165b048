#!/usr/bin/env python3
"""The measured pipeline bubble of every schedule against the compiler's prediction.

usage: bench/pipeline_bubble.py [--build build] [--steps 8] [--d 64] [--seq 64]
For pp 4 and M in {4, 8, 16} microbatches, each schedule (gpipe, 1f1b,
interleaved with 2 virtual stages, zb = ZB-H1), compiles GPT-2 tiny (8 layers,
d D, 4 heads, seq SEQ, global batch 16, so a microbatch is 16 / M rows), trains it
STEPS steps with `train --trace` (the 4 stages as threads) and measures from the
trace, per step after the first, the bubble with the simulator's definition
(passes/schedule_check.c):

    window = [the step's first event on any rank, its last F/B/W end on any rank]
    busy_r = the F, B, W time of rank r in the step
    bubble = sum_r (window - busy_r) / sum_r busy_r

summed over the measured steps.  Printed beside it, from each trainer's
report.txt: the compiler's simulated bubble (its fixed 100 TFLOP/s and 5 us per
transfer model: for a model this small the transfer latency dominates it) and the
analytic value ((P-1)/M, (P-1)/(V M), about a third of 1F1B's for ZB-H1).  Then the
ZB-H1 over 1F1B median step time (the log's ms, steps after the first) per M.
Nothing here is a test: absolute times depend on the machine and its load."""
import argparse, json, os, re, shutil, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
COMPUTE = ("F", "B", "W")


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def measured_bubble(trace, skip=1):
    """(bubble, mean window in ms) over the steps after the first `skip` ones."""
    ev = [e for e in json.load(open(trace))["traceEvents"] if e["ph"] == "X"]
    ranks = sorted({e["pid"] for e in ev})
    steps = sorted({e["args"]["step"] for e in ev})[skip:]
    idle = busy = span_sum = 0.0
    for s in steps:
        mine = [e for e in ev if e["args"]["step"] == s and e["cat"] != "idle"]
        comp = [e for e in mine if e["cat"] in COMPUTE]
        lo = min(e["ts"] for e in mine)
        hi = max(e["ts"] + e["dur"] for e in comp)
        span_sum += hi - lo
        for r in ranks:
            b = sum(e["dur"] for e in comp if e["pid"] == r)
            busy += b
            idle += (hi - lo) - b
    return idle / busy, span_sum / len(steps) / 1e3


def predicted(report):
    m = re.search(r"bubble \(idle / busy\): simulated ([0-9.eE+-]+), analytic ([0-9.eE+-]+)",
                  open(report).read())
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args()
    work = os.path.join(a.build, "bench-pipeline")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join("abcdefghij"[i % 10] * (1 + i % 7) for i in range(200000)))
    P = 4
    print(f"GPT-2 tiny: 8 layers, d {a.d}, 4 heads, seq {a.seq}, global batch 16; pp {P} "
          f"(ranks as threads); {a.steps} steps, the first not measured")
    print(f"{'schedule':12s} {'M':>3s} {'measured':>9s} {'simulated':>10s} {'analytic':>9s} "
          f"{'window ms':>10s} {'step ms':>8s}")
    step_ms = {}
    for M in (4, 8, 16):
        for sched in SCHEDULES:
            out = os.path.join(work, f"{sched}_m{M}")
            sh([os.path.join(a.build, "parc"), os.path.join(ROOT, "examples", "gpt2_tiny.dsl"),
                "-o", out, "-D", "layers=8", "-D", f"d={a.d}", "-D", "heads=4", "-D",
                f"seq={a.seq}", "-D", "batch=16", "--pp", str(P), "--schedule", sched,
                "--microbatches", str(M)])
            sh(["cmake", "-S", out, "-B", out + "/build"])
            sh(["cmake", "--build", out + "/build"])
            log, trace = os.path.join(out, "log.jsonl"), os.path.join(out, "trace.json")
            sh([out + "/build/train", "--quiet", "--data", data, "--steps", str(a.steps),
                "--lr", "1e-4", "--log", log, "--trace", trace])
            ms = statistics.median(json.loads(l)["ms"] for l in list(open(log))[2:])
            step_ms[(sched, M)] = ms
            got, window = measured_bubble(trace)
            sim, ana = predicted(os.path.join(out, "report.txt"))
            print(f"{sched:12s} {M:3d} {got:9.3f} {sim:10.3f} {ana:9.3f} {window:10.2f} "
                  f"{ms:8.2f}", flush=True)
    for M in (4, 8, 16):
        print(f"ZB-H1 / 1F1B step time, M {M}: "
              f"{step_ms[('zb', M)] / step_ms[('1f1b', M)]:.3f}")


if __name__ == "__main__":
    main()
