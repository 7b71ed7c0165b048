#!/usr/bin/env python3
"""tests/gpu/compare_fit_test.py -- compare.py's two-term fit of a profile's
memory-bound rows recovers a call's cost and a bandwidth that generated the
rows' times (time = calls x cost + bytes / bandwidth, noise-free and with
+-5% noise), ignores GEMM and attention rows, and declines rows that cannot
separate the two terms."""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

COST, BW = 3.5e-6, 3.1e12
random.seed(7)


def rows(noise):
    out = []
    for i in range(40):
        calls = random.choice((1, 2, 12, 24, 48))
        nbytes = calls * random.uniform(1e4, 2e8)
        t = (calls * COST + nbytes / BW) * (1 + random.uniform(-noise, noise))
        out.append({"kind": random.choice(("kernel", "op")), "calls": calls, "bytes": nbytes,
                    "ms": t * 1e3, "flops": 0})
    # rows of other kinds: far off the model, left out of the fit
    out.append({"kind": "gemm", "calls": 48, "bytes": 1e9, "ms": 9.0, "flops": 6e12})
    out.append({"kind": "attention", "calls": 12, "bytes": 1e8, "ms": 5.9, "flops": 5e11})
    return out


fails = 0
for noise, tol in ((0.0, 1e-9), (0.05, 0.15)):
    fit = compare.two_term_fit(rows(noise))
    ok = fit is not None and abs(fit[0] / COST - 1) <= tol and abs(fit[1] / BW - 1) <= tol
    print(f"noise {noise:.2f}: fit {fit} against ({COST}, {BW}): {'ok' if ok else 'FAIL'}")
    fails += not ok
# one shape only (every row the same bytes a call): the two terms are not separable
same = [{"kind": "kernel", "calls": c, "bytes": c * 1e6, "ms": c * 1.0, "flops": 0}
        for c in (1, 2, 4)]
if compare.two_term_fit(same) is not None:
    print("FAIL: a fit from rows of one shape")
    fails += 1
print("FAIL" if fails else "ok")
sys.exit(1 if fails else 0)
