#!/usr/bin/env python3
"""Expert parallelism against data parallelism on the same 4 ranks: step time and
the all-to-all's share of it, in one run.

usage: bench/moe_ep.py [--build build] [--steps 8] [--rounds 2] [--threads 2]
                       [-D NAME=VALUE ...]
Compiles examples/moe_tiny.dsl, enlarged by default (d 128, ffn 256, 8 experts,
2 layers, seq 64, batch 8: 128 tokens a rank; override with -D), for dp 4 with
ep 1, 2 and 4 (ep 1 is the competitor: plain data parallelism, every rank holds
every expert; ep 2 and 4 split the experts over 2 or 4 of the dp ranks and move
the dispatch buffers by all-to-all), trains each STEPS steps with the 4 ranks as
threads of one process (--threads THREADS in all), ROUNDS times in turn
(ep 1, 2, 4, ep 1, 2, 4, ...) so that the machine's load falls on all alike, and
prints per ep:

  step ms     median of the log's ms over the steps after the first, all rounds
  / ep 1      that median over ep 1's
  a2a ms      time a rank spends in the experts' all-to-all a step (mean over
              ranks and steps after the first), from the run's `train --trace`
              (its "all_to_all" events: rt_expert_all_to_all calls)
  a2a share   a2a ms / step ms (summed over the same steps); 0 for ep 1
  the compiler's plan.json beside it: a rank's parameters (each also has its
  gradient and Adam state: the optimizer's work), all-to-alls a step, bytes a
  rank sends at most, and the dispatch buffer a rank holds per layer.

The time in an all-to-all includes waiting for the slowest rank of the group
(with more ranks than cores, for a rank to be scheduled at all).  Nothing here is a test."""
import argparse, json, os, shutil, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 4
EPS = (1, 2, 4)
DEFINES = ["d=128", "ffn=256", "experts=8", "layers=2", "seq=64", "batch=8", "heads=4",
           "kv_heads=2", "microbatches=1"]


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def fmt_bytes(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1024


def build(a, work, ep):
    out = os.path.join(work, f"dp{RANKS}_ep{ep}")
    defs = [x for d in DEFINES + a.define for x in ("-D", d)]
    sh([os.path.join(a.build, "parc"), os.path.join(ROOT, "examples", "moe_tiny.dsl"), "-o", out,
        *defs, "--dp", str(RANKS), "--ep", str(ep), "--target", "cpu"])
    sh(["cmake", "-S", out, "-B", out + "/build"])
    sh(["cmake", "--build", out + "/build"])
    plan = json.load(open(os.path.join(out, "plan.json")))
    return out, plan


def run(a, out, data, rnd):
    log = os.path.join(out, f"log{rnd}.jsonl")
    trace = os.path.join(out, f"trace{rnd}.json")
    sh([out + "/build/train", "--quiet", "--data", data, "--steps", str(a.steps), "--threads",
        str(a.threads), "--lr", "1e-4", "--log", log, "--trace", trace])
    ms = [json.loads(l)["ms"] for l in list(open(log))[2:]]  # config, step 0: not measured
    a2a = [0.0] * RANKS  # per rank: seconds in all-to-alls over the measured steps
    for e in json.load(open(trace))["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "all_to_all" and e["args"]["step"] >= 1:
            a2a[e["pid"]] += e["dur"] * 1e-6
    return ms, a2a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-D", dest="define", action="append", default=[],
                    help="a config override for parc, after the bench's own")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("bench: --steps must be at least 2 (the first is not measured)")
    a.build = os.path.abspath(a.build)
    work = os.path.join(a.build, "bench-moe-ep")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join("abcdefghij"[i % 10] * (1 + i % 7) for i in range(200000)))
    outs = {ep: build(a, work, ep) for ep in EPS}
    moe = outs[1][1]["moe"][0]
    print(f"moe_tiny {' '.join(DEFINES + a.define)}: {moe['experts']} experts, top-"
          f"{moe['top_k']}, {moe['tokens_per_rank']} tokens a rank, "
          f"{'dropless' if moe['dropless'] else 'capacity ' + str(moe['capacity'])}")
    print(f"dp {RANKS} (ranks as threads), --threads {a.threads}; {a.rounds} rounds of {a.steps} "
          f"steps, the first of each not measured")
    ms = {ep: [] for ep in EPS}
    a2a = {ep: [] for ep in EPS}
    for rnd in range(a.rounds):
        for ep in EPS:
            m, c = run(a, outs[ep][0], data, rnd)
            ms[ep] += m
            a2a[ep].append((sum(m), c))
    base = statistics.median(ms[1])
    print(f"{'ep':>3s} {'experts/rank':>12s} {'params/rank':>11s} {'step ms':>9s} {'/ ep 1':>7s} "
          f"{'a2a ms':>8s} {'a2a share':>9s} {'a2a/step':>8s} {'a2a sent/step':>14s} "
          f"{'dispatch/layer':>15s}")
    for ep in EPS:
        plan = outs[ep][1]
        comm = {(c["group"], c["kind"]): c for c in plan["communication"]}
        ep_c = comm.get(("ep", "all_to_all"), {"count": 0, "sent_bytes_per_rank": 0})
        steps_ms = sum(t for t, _ in a2a[ep])
        # mean over ranks of a rank's all-to-all seconds, summed over the rounds
        rank_s = sum(sum(c) / len(c) for _, c in a2a[ep] if c)
        share = rank_s * 1e3 / steps_ms
        nmeasured = len(ms[ep])
        med = statistics.median(ms[ep])
        print(f"{ep:3d} {plan['moe'][0]['experts'] // ep:12d} "
              f"{plan['cost']['params_numel']:11.0f} {med:9.2f} {med / base:7.3f} "
              f"{rank_s * 1e3 / nmeasured:8.2f} {share:9.3f} {ep_c['count']:8d} "
              f"{fmt_bytes(ep_c['sent_bytes_per_rank']):>14s} "
              f"{fmt_bytes(plan['moe'][0]['dispatch_bytes_per_rank']):>15s}", flush=True)
    for ep in EPS[1:]:
        print(f"step time ep {ep} / ep 1: {statistics.median(ms[ep]) / base:.3f}")


if __name__ == "__main__":
    main()
