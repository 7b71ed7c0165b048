#!/usr/bin/env python3
"""tests/optim/torch_oracle.py -- parc's optimizer step against PyTorch.

    torch_oracle.py OPTIM_TEST WORKDIR

Runs `OPTIM_TEST dump WORKDIR/optim_cases.json`: for every case, the initial
parameters, the gradient the interpreter computed at each of five steps, the
learning rate of each step, the gradient norm the interpreter logged, and the
parameters after each step (float64, printed with 17 digits).  Then replays
the same gradients through torch.nn.utils.clip_grad_norm_ and
torch.optim.AdamW / torch.optim.SGD in float64 and compares:

  - the gradient norm clip_grad_norm_ returns (or, with clip = 0, the same
    norm computed without clipping) with the interpreter's grad_norm;
  - every parameter after every step, to 1e-10 relative.

parc decays tensors of rank >= 2 only, so the torch run uses two parameter
groups: rank >= 2 with the case's weight decay, the rest with 0.  A
parameter with no gradient (grad None in torch) must stay unchanged.

Exits 77 (ctest: skipped) when torch cannot be imported.
"""
import json
import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("torch is not installed for", sys.executable, "- skipped")
    sys.exit(77)

RTOL = 1e-10


def close(a, b):
    return abs(a - b) <= RTOL * max(abs(a), abs(b), 1e-12)


def run_case(case):
    torch.set_default_dtype(torch.float64)
    params, decay, no_decay = [], [], []
    for p in case["params"]:
        t = torch.tensor(p["init"], dtype=torch.float64).reshape(p["shape"])
        t.requires_grad_(True)
        params.append(t)
        (decay if len(p["shape"]) >= 2 else no_decay).append(t)
    wd = case["wd"]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    lr0 = case["steps"][0]["lr"]
    if case["optimizer"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=lr0, betas=(case["beta1"], case["beta2"]),
                                eps=case["eps"], foreach=False)
    else:
        opt = torch.optim.SGD(groups, lr=lr0, momentum=case["momentum"], dampening=0,
                              nesterov=False, foreach=False)
    worst, bad = 0.0, []
    for t, step in enumerate(case["steps"]):
        for p, g in zip(params, step["grads"]):
            p.grad = None if g is None else torch.tensor(g, dtype=torch.float64).reshape(p.shape)
        with_grad = [p for p in params if p.grad is not None]
        if case["clip"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(with_grad, case["clip"]))
        else:
            norm = float(torch.norm(torch.stack([torch.norm(p.grad, 2) for p in with_grad]), 2))
        if not close(norm, step["grad_norm"]):
            bad.append(f"step {t + 1}: grad norm {step['grad_norm']!r}, torch {norm!r}")
        for grp in opt.param_groups:
            grp["lr"] = step["lr"]
        opt.step()
        for k, (p, want) in enumerate(zip(params, step["after"])):
            got = p.detach().reshape(-1).tolist()
            for e, (a, b) in enumerate(zip(got, want)):
                worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-300))
                if not close(a, b) and len(bad) < 5:
                    bad.append(f"step {t + 1}: {case['params'][k]['name']}[{e}] = {b!r}, "
                               f"torch {a!r}")
    for k, p in enumerate(params):
        if all(s["grads"][k] is None for s in case["steps"]):
            if p.detach().reshape(-1).tolist() != case["params"][k]["init"]:
                bad.append(f"{case['params'][k]['name']} has no gradient but torch moved it")
    return worst, bad


def main():
    exe, work = sys.argv[1], sys.argv[2]
    path = os.path.join(work, "optim_cases.json")
    subprocess.run([exe, "dump", path], check=True)
    with open(path) as f:
        cases = json.load(f)
    fails = 0
    for case in cases:
        worst, bad = run_case(case)
        ok = not bad
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case['name']}: {len(case['steps'])} steps match "
              f"torch {torch.__version__} (max rel {worst:.2e})")
        for line in bad:
            print("    " + line)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
