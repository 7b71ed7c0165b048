#!/usr/bin/env python3
"""Parses the JSON-lines log written by rt_log (through rt_tool) with Python's json
module and checks every record. usage: check_log.py RT_TOOL WORKDIR"""
import json
import math
import os
import subprocess
import sys

tool, work = sys.argv[1], sys.argv[2]
path = os.path.join(work, "py_train.jsonl")
subprocess.run([tool, "log-write", path], check=True)
lines = open(path).read().split("\n")
errors = []
if lines[-1] != "":
    errors.append("log does not end with a newline")
records = [json.loads(line) for line in lines[:-1]]
if len(records) != 6:
    errors.append(f"{len(records)} records, want 6")
if records[0] != {"config": {"d": 768, "lr": 6e-4, "model": "gpt2", "tp": 2}}:
    errors.append(f"config record {records[0]}")
for s, rec in enumerate(records[1:]):
    want = {"step": s, "loss": 5.0 - 0.5 * s, "lr": 6e-4 * (s + 1) / 5,
            "grad_norm": 1.0 / (s + 1), "tokens_per_s": 12345.5 + s, "ms": 40.25 + s}
    if s == 3:
        want["loss"] = None   # NaN is written as null
    if s == 4:
        want["mfu"] = 0.375
    if s % 2:
        want["ce_loss"] = 4.5 - 0.5 * s
        want["aux_loss"] = 0.01 * s
    if list(rec)[:6] != ["step", "loss", "lr", "grad_norm", "tokens_per_s", "ms"]:
        errors.append(f"step {s}: field order {list(rec)}")
    for k, v in want.items():
        got = rec.get(k, "missing")
        ok = got == v if v is None or isinstance(v, int) else (
            isinstance(got, (int, float)) and math.isclose(got, v, rel_tol=1e-15))
        if not ok:
            errors.append(f"step {s}: {k} = {got!r}, want {v!r}")
    if set(rec) - set(want):
        errors.append(f"step {s}: unexpected fields {set(rec) - set(want)}")
if errors:
    print("\n".join(errors[:10]))
    sys.exit(f"check_log: {len(errors)} failure(s)")
