#!/usr/bin/env python3
"""The report's predicted step time against the measured one, on this CPU.

usage: bench/predict_cpu.py [--build build] [--threads 2] [--steps 8]

For each configuration: compiles and builds its trainer; measures this
machine's rates with bench_machine_cpu (GEMM, attention, memory bandwidth,
cost of a call, the thread backend's all_reduce) into a --machine JSON file,
with THREADS pool threads for a one-rank trainer and THREADS / 2 for each rank
of a two-rank one; compiles it again with that --machine and reads plan.json's
predicted_step; trains it for STEPS steps with --threads THREADS right after
(the machine may be shared: calibration and training close in time); prints
the median measured step (after the first two) next to the prediction, their
ratio measured / predicted (1: exact), the prediction's parts (GEMMs,
attention, memory-bound calls, communication) and the rates it used.
"""
import argparse, json, os, shutil, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = [
    # name, DSL, -D overrides, layout flags, ranks
    ("gpt2_tiny", "gpt2_tiny", [], [], 1),
    ("llama_tiny", "llama_tiny", [], [], 1),
    ("gpt2 d 768, 2 layers, seq 128, batch 4", "gpt2",
     ["layers=2", "seq=128", "batch=4", "microbatches=1", "precision=fp32"], [], 1),
    ("gpt2_tiny tp 2", "gpt2_tiny", [], ["--tp", "2"], 2),
    ("gpt2_tiny dp 2", "gpt2_tiny", [], ["--dp", "2"], 2),
    ("gpt2 d 768, 2 layers, tp 2", "gpt2",
     ["layers=2", "seq=128", "batch=4", "microbatches=1", "precision=fp32"], ["--tp", "2"], 2),
]


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    work = os.path.join(a.build, "bench-predict")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write(" ".join("abcdefghij"[i % 10] * (1 + i % 7) for i in range(200000)))
    sh(["cmake", "--build", a.build, "--target", "bench_machine_cpu"])

    def calibrate(ranks, tag):
        """this CPU's rates now, for ranks ranks sharing --threads"""
        threads = max(1, a.threads // ranks)
        path = os.path.join(work, f"machine_{tag}.json")
        with open(path, "w") as f:
            f.write(sh([os.path.join(a.build, "bench_machine_cpu"), str(threads)]))
        return path, json.load(open(path)), threads

    print(f"--threads {a.threads}; each configuration: built, then this machine measured "
          f"(bench_machine_cpu), then predicted on it and trained right after (the machine is "
          f"shared: calibration and training close in time); measured: median of "
          f"{a.steps - 2} steps after the first two\n")
    print(f"{'configuration':40s} {'predicted':>10s} {'measured':>10s} {'ratio':>6s}   "
          f"predicted parts (ms): GEMM attention memory comm | machine: GEMM GFLOP/s, "
          f"GB/s, us a call")
    ratios = []
    for name, dsl, defines, flags, ranks in CONFIGS:
        tag = name.replace(" ", "_").replace(",", "")
        out = os.path.join(work, tag)
        cmd = [os.path.join(a.build, "parc"), os.path.join(ROOT, "examples", dsl + ".dsl"),
               "--target", "cpu", *flags]
        for d in defines:
            cmd += ["-D", d]
        sh(cmd + ["-o", out])
        sh(["cmake", "-S", out, "-B", out + "/build"])
        sh(["cmake", "--build", out + "/build"])
        mpath, m, threads = calibrate(ranks, tag)
        sh(cmd + ["-o", out + "_predicted", "--machine", mpath])
        ps = json.load(open(os.path.join(out + "_predicted", "plan.json")))["predicted_step"]
        log = os.path.join(out, "log.jsonl")
        sh([out + "/build/train", "--quiet", "--data", data, "--steps", str(a.steps),
            "--threads", str(a.threads), "--lr", "1e-4", "--log", log])
        ms = statistics.median(json.loads(l)["ms"] for l in list(open(log))[3:])
        pred = ps["seconds"] * 1e3
        ratios.append(ms / pred)
        print(f"{name:40s} {pred:8.2f}ms {ms:8.2f}ms {ms / pred:6.2f}   "
              f"{ps['gemm_s'] * 1e3:.2f} {ps['attention_s'] * 1e3:.2f} "
              f"{ps['memory_bound_s'] * 1e3:.2f} {ps['communication_s'] * 1e3:.2f} | "
              f"{m['gemm_flops'] / 1e9:.0f}, {m['memory_bytes_per_s'] / 1e9:.1f}, "
              f"{m['kernel_s'] * 1e6:.1f} + {m.get('parallel_call_s', 0) * 1e6:.1f} split")
    print(f"\nmeasured / predicted: {min(ratios):.2f} to {max(ratios):.2f} "
          f"(median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
