#!/usr/bin/env python3
"""tests/gpu/compare.py -- comparisons for tests/gpu/check.sh (standard library only).

  compare.py losses REF.jsonl GOT.jsonl TOL [--common]
                                              per-step loss, relative error <= TOL
                                              (--common: over the steps both ran)
  compare.py grads REF.safetensors GOT.safetensors TOL
                                              per-tensor relative L2 error <= TOL
  compare.py bench LOG.jsonl PLAN.json PEAK_TFLOPS SKIP
                                              tokens/s, ms/step and MFU (model FLOPs
                                              of plan.json over the peak), steps
                                              after the first SKIP
  compare.py profile PROFILE.jsonl PEAK_TFLOPS PEAK_GBS [--fp32 TFLOPS] [--top N]
                                              train_cuda's per-kernel profile
                                              (PARC_CUDA_PROFILE=FILE.jsonl) as a
                                              table per rank, each op against its
                                              ceiling: GEMMs and attention on tensor
                                              cores against PEAK_TFLOPS, fp32 ones
                                              against --fp32 (CUDA cores; "-" without
                                              it), kernels and memory ops against
                                              PEAK_GBS (GB/s); collectives and host-
                                              staged ops have none
Prints one line "RESULT <PASS|FAIL|INFO> <summary>" last; exit 0 on PASS/INFO.
"""
import json
import math
import struct
import sys


def records(path):
    """The JSON object of every non-empty line of a JSON-lines file."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def steps(path):
    out = {}
    for rec in records(path):
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


def losses(ref_path, got_path, tol, common=False):
    ref, got = steps(ref_path), steps(got_path)
    if common:
        ref = {s: r for s, r in ref.items() if s in got}
        got = {s: g for s, g in got.items() if s in ref}
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
    ps = plan.get("predicted_step")
    if ps:  # parc's prediction before launch (--machine, default h200) against the run
        print(f"  predicted on {ps['machine']} ({ps['precision']}): "
              f"{ps['seconds'] * 1e3:.1f} ms/step (GEMM {ps['gemm_s'] * 1e3:.1f}, attention "
              f"{ps['attention_s'] * 1e3:.1f}, memory-bound {ps['memory_bound_s'] * 1e3:.1f} ms); "
              f"measured / predicted {ms * 1e-3 / ps['seconds']:.2f}")
    return 0


def machine_from_profile(st, ops):
    """The sustained rates this profile shows, as a parc --machine JSON line
    (passes/machine.h): GEMMs' and attention's FLOPs over their time, the
    generated kernels' and memory ops' bytes over theirs, and what a call of
    the fastest tenth of the generated kernels takes (a call's cost beyond its
    bytes).  Only the profile's GEMM precision is measured; the other and the
    links stay the base preset's."""
    def rate(kinds, what):
        sel = [o for o in ops if o["kind"] in kinds and o[what]]
        t = sum(o["ms"] for o in sel) * 1e-3
        return sum(o[what] for o in sel) / t if t else None
    prec = "bf16" if "bf16" in str(st.get("gemm", "")) else "fp32"
    m = {"name": f"{st['device']} (measured)", "base": "h200"}
    for key, kinds in (("gemm_flops", ("gemm", "gemm_fp32")),
                       ("attention_flops", ("attention", "attention_tc"))):
        r = rate(kinds, "flops")
        if r:
            m[key] = {"fp32": r, "bf16": r} if prec == "fp32" else {"bf16": r}
    mem = rate(("kernel", "op"), "bytes")
    if mem:
        m["memory_bytes_per_s"] = mem
    calls = sorted(o["ms"] * 1e-3 / o["calls"] for o in ops if o["kind"] == "kernel" and o["calls"])
    if calls:
        m["kernel_s"] = calls[max(1, len(calls) // 10) - 1]
    print("  machine (parc --machine FILE; a precision left out keeps the base's): " +
          json.dumps(m))
    fit = two_term_fit(ops)
    if fit:
        call_s, bw = fit
        m2 = dict(m, name=f"{st['device']} (measured, two-term)", kernel_s=call_s,
                  memory_bytes_per_s=bw)
        print(f"  two-term fit of the memory-bound rows (time = calls x {call_s * 1e6:.2f} us + "
              f"bytes / {bw / 1e12:.3f} TB/s, least squares): " + json.dumps(m2))
    else:
        print("  two-term fit: too few memory-bound rows of different shapes")


def two_term_fit(ops):
    """The memory-bound rows' (generated kernels, memory ops) time per step as
    a least-squares fit of calls x a call's cost + bytes / bandwidth: the form
    of parc's step model (codegen/step_model.c), where the one-term rate above
    divides bytes into a time that holds the calls' cost too.  (call_s, bytes
    per second), or None where the rows do not determine both (or give a
    negative cost: then the cost is 0 and the bandwidth bytes over time)."""
    rows = [(o["calls"], o["bytes"], o["ms"] * 1e-3) for o in ops
            if o["kind"] in ("kernel", "op") and o["calls"] and o["bytes"] and o["ms"]]
    scc = sum(c * c for c, _, _ in rows)
    scb = sum(c * b for c, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sct = sum(c * t for c, _, t in rows)
    sbt = sum(b * t for _, b, t in rows)
    det = scc * sbb - scb * scb
    if len(rows) < 2 or det <= 1e-12 * scc * sbb:
        return None
    call_s = (sct * sbb - sbt * scb) / det
    inv_bw = (scc * sbt - scb * sct) / det
    if call_s < 0:  # the bytes explain the times alone
        call_s, inv_bw = 0.0, sbt / sbb
    return (call_s, 1.0 / inv_bw) if inv_bw > 0 else None


def profile(path, peak_tflops, peak_gbs, fp32_tflops=None, top=30):
    ranks = {}
    for rec in records(path):
        r = ranks.setdefault(int(rec.get("rank", 0)), {"step": None, "ops": []})
        if rec.get("profile") == "step":
            r["step"] = rec
        elif rec.get("profile") == "op":
            r["ops"].append(rec)
    if not ranks or any(r["step"] is None for r in ranks.values()):
        print(f"RESULT FAIL {path}: no profile step record")
        return 1
    ceiling = {"tensor": ("TFLOP/s", peak_tflops), "fp32": ("TFLOP/s", fp32_tflops),
               "hbm": ("GB/s", peak_gbs)}

    def of_ceiling(op):
        unit, peak = ceiling.get(op["ceiling"], (None, None))
        if not peak:
            return None
        got = op["tflop_s"] if unit == "TFLOP/s" else op["gb_s"]
        return 100.0 * got / peak if got else None

    summary = []
    for rank in sorted(ranks):
        st, ops = ranks[rank]["step"], sorted(ranks[rank]["ops"], key=lambda o: -o["ms"])
        steps = st["steps"]
        print(f"profile rank {rank} of {st['ranks']}: {st['device']}, model {st['model']}, "
              f"GEMM {st['gemm']}: {steps} steps after the first, {st['step_ms']:.3f} ms per "
              f"step on the device ({st['wall_ms']:.3f} ms on the host), ops "
              f"{100 * st['ops_ms'] / st['step_ms'] if st['step_ms'] else 0:.1f}% of it"
              + (f"; stopped early: {st['stopped']}" if "stopped" in st else ""))
        if not steps:
            print("  no step after the first was recorded")
            summary.append(f"rank {rank}: no steps")
            continue
        print(f"  {'ms/step':>10} {'%step':>6} {'calls':>7} {'GB/s':>9} {'TFLOP/s':>8} "
              f"{'%ceil':>6} {'ceiling':>14}  {'kind':<9} name")
        weighted, covered = 0.0, 0.0
        for i, op in enumerate(ops):
            pct = of_ceiling(op)
            if pct is not None:
                weighted += pct * op["ms_per_step"]
                covered += op["ms_per_step"]
            if i >= top:
                continue
            unit, peak = ceiling.get(op["ceiling"], (None, None))
            ceil = f"{peak:g} {unit}" if peak else "-"
            gbs = f"{op['gb_s']:.1f}" if op["bytes"] else "-"
            tfs = f"{op['tflop_s']:.2f}" if op["flops"] else "-"
            calls = op["calls"] / steps
            calls = f"{calls:.0f}" if calls == int(calls) else f"{calls:.2f}"
            print(f"  {op['ms_per_step']:10.4f} {op['pct_step']:6.2f} {calls:>7} {gbs:>9} "
                  f"{tfs:>8} {'-' if pct is None else f'{pct:.1f}':>6} {ceil:>14}  "
                  f"{op['kind']:<9} {op['name']}")
        if len(ops) > top:
            rest = ops[top:]
            ms = sum(o["ms_per_step"] for o in rest)
            print(f"  {ms:10.4f} {100 * ms / st['step_ms'] if st['step_ms'] else 0:6.2f} "
                  f"{'':>7} {'':>9} {'':>8} {'':>6} {'':>14}  {'-':<9} ({len(rest)} more ops)")
        gap = max(st["step_ms"] - st["ops_ms"], 0.0)
        print(f"  {gap:10.4f} {100 * gap / st['step_ms'] if st['step_ms'] else 0:6.2f} "
              f"{'':>7} {'':>9} {'':>8} {'':>6} {'':>14}  {'-':<9} (outside the ops)")
        eff = weighted / covered if covered else 0.0
        print(f"  time-weighted: {eff:.1f}% of the ceilings over the {covered:.3f} ms per step "
              f"of ops that have one ({100 * covered / st['step_ms'] if st['step_ms'] else 0:.1f}% "
              f"of the step)")
        machine_from_profile(st, ops)
        top3 = ", ".join(f"{o['name']} {o['pct_step']:.0f}%" for o in ops[:3])
        summary.append(f"rank {rank}: {st['step_ms']:.2f} ms/step, {eff:.0f}% of ceilings "
                       f"time-weighted; top {top3}")
    print(f"RESULT INFO profile: {'; '.join(summary)}")
    return 0


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    if argv[1] == "losses":
        return losses(argv[2], argv[3], float(argv[4]), argv[5:] == ["--common"])
    if argv[1] == "grads":
        return grads(argv[2], argv[3], float(argv[4]))
    if argv[1] == "bench":
        return bench(argv[2], argv[3], float(argv[4]), int(argv[5]))
    if argv[1] == "profile":
        args, opts = [], {"--fp32": None, "--top": "30"}
        rest = argv[2:]
        while rest:
            a = rest.pop(0)
            if a in opts and rest:
                opts[a] = rest.pop(0)
            else:
                args.append(a)
        if len(args) != 3:
            raise SystemExit(__doc__)
        fp32 = float(opts["--fp32"]) if opts["--fp32"] else None
        return profile(args[0], float(args[1]), float(args[2]), fp32, int(opts["--top"]))
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
