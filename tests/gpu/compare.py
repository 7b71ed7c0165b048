#!/usr/bin/env python3
"""tests/gpu/compare.py -- comparisons for tests/gpu/check.sh (standard library only).

  compare.py losses REF.jsonl GOT.jsonl TOL   per-step loss, relative error <= TOL
  compare.py grads REF.safetensors GOT.safetensors TOL
                                              per-tensor relative L2 error <= TOL
  compare.py bench LOG.jsonl PLAN.json PEAK_TFLOPS SKIP
                                              tokens/s, ms/step and MFU (model FLOPs
                                              of plan.json over the peak), steps
                                              after the first SKIP
Prints one line "RESULT <PASS|FAIL|INFO> <summary>" last; exit 0 on PASS/INFO.
"""
import json
import math
import struct
import sys


def steps(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if "loss" in rec and "ms" in rec and "step" in rec:
                out[int(rec["step"])] = rec
    return out


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        out[name] = struct.unpack(f"<{(b - a) // 4}f", data[base + a:base + b])
    return out


def losses(ref_path, got_path, tol):
    ref, got = steps(ref_path), steps(got_path)
    if not ref or set(ref) != set(got):
        print(f"RESULT FAIL steps differ: {sorted(ref)[:3]}... vs {sorted(got)[:3]}...")
        return 1
    worst, at = 0.0, None
    for s in sorted(ref):
        r, g = ref[s]["loss"], got[s]["loss"]
        e = abs(g - r) / max(abs(r), 1e-30) if not (math.isnan(r) or math.isnan(g)) else math.inf
        if e > worst or math.isnan(e):
            worst, at = e, s
    last = max(ref)
    ok = worst <= tol
    print(f"RESULT {'PASS' if ok else 'FAIL'} {len(ref)} steps, max rel loss error "
          f"{worst:.2e} (step {at}), loss {ref[0]['loss']:.4f} -> cpu {ref[last]['loss']:.6f} "
          f"gpu {got[last]['loss']:.6f}")
    return 0 if ok else 1


def grads(ref_path, got_path, tol):
    ref, got = load_safetensors(ref_path), load_safetensors(got_path)
    if set(ref) != set(got):
        print(f"RESULT FAIL tensor names differ: {sorted(set(ref) ^ set(got))[:4]}")
        return 1
    worst, at = 0.0, None
    for name in ref:
        r, g = ref[name], got[name]
        num = sum((a - b) ** 2 for a, b in zip(g, r))
        den = sum(b * b for b in r)
        e = math.sqrt(num / den) if den > 0 else math.sqrt(num)
        if e > worst or math.isnan(e):
            worst, at = e, name
    ok = worst <= tol
    print(f"RESULT {'PASS' if ok else 'FAIL'} {len(ref)} gradients, max rel L2 error "
          f"{worst:.2e} ({at})")
    return 0 if ok else 1


def bench(log_path, plan_path, peak_tflops, skip):
    recs = steps(log_path)
    with open(plan_path) as f:
        plan = json.load(f)
    flops = plan["cost"]["flops_per_step"]
    keep = [recs[s] for s in sorted(recs) if s >= skip]
    if not keep:
        print("RESULT FAIL no timed steps")
        return 1
    ms = sorted(r["ms"] for r in keep)[len(keep) // 2]
    tps = sorted(r["tokens_per_s"] for r in keep)[len(keep) // 2]
    mfu = flops / (ms * 1e-3) / (peak_tflops * 1e12)
    print(f"RESULT INFO median of {len(keep)} steps: {ms:.1f} ms/step, {tps:,.0f} tokens/s, "
          f"{flops / 1e12:.2f} TFLOP/step -> {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s, "
          f"MFU {100 * mfu:.1f}% of {peak_tflops:g} TFLOP/s; loss {keep[-1]['loss']:.4f}")
    return 0


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    if argv[1] == "losses":
        return losses(argv[2], argv[3], float(argv[4]))
    if argv[1] == "grads":
        return grads(argv[2], argv[3], float(argv[4]))
    if argv[1] == "bench":
        return bench(argv[2], argv[3], float(argv[4]), int(argv[5]))
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
