#!/usr/bin/env python3
"""GPT-2 small under --dp 2: no pass over the gradients around the data-parallel
collectives (passes/dp_grads.c; passes/bufplan.h, Assembled concats and
Sub-range views).

usage: dp_buckets.py PARC EXAMPLES_DIR WORK_DIR

- --dp 2: every bucket is assembled where its weight gradients are written
  (train.c and train_cuda.c say "is assembled" once a bucket, and run no concat
  kernel), but the tied embedding table's, alone in its bucket (larger than a
  bucket): the collective reads its gradient where it is, the head's onto
  which the embedding gradient's call added its rows (codegen/grad_onto.h);
  each other parameter's gradient is a view of its range of the collective's
  sum (one "a view" note a parameter);
- --dp 2 --zero 1: the pieces are views likewise; the rank-major bucket is
  copied (its parts are not contiguous in it), but each all-gather's input
  (the rank's updated pieces, one row) is assembled where the optimizer writes
  them;
- plan.json's predicted step counts no call for a skipped kernel.
"""
import json, os, re, subprocess, sys

parc, examples, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)


def compile_(tag, *flags):
    out = os.path.join(work, tag)
    r = subprocess.run([parc, os.path.join(examples, "gpt2.dsl"), "-o", out, *flags],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"FAIL {tag}: parc exited {r.returncode}:\n{r.stderr}")
    code = {f: open(os.path.join(out, f)).read() for f in ("train.c", "train_cuda.c")
            if os.path.exists(os.path.join(out, f))}
    return json.load(open(os.path.join(out, "plan.json"))), code


notes = []
for tag, flags, assembled in (("dp2", ["--dp", "2"], True),
                              ("dp2_zero", ["--dp", "2", "--zero", "1"], False)):
    plan, code = compile_(tag, *flags)
    nparams = len(plan["params"])
    for name, text in code.items():
        buckets = len(re.findall(r"dp bucket \d+: started now", text)) or \
            len(set(re.findall(r"%(\d+) = (?:all_reduce|reduce_scatter) ", text)))
        got = set(re.findall(r"/\* %(\d+) is assembled: its parts were written in its bytes", text))
        dims = dict(re.findall(r"/\* %(\d+) = concat [^:]*: f32\[([^\]]*)\]", text))
        concats = len(dims)
        # ZeRO: the gather buffers (one row, the optimizer's) assembled, the
        # rank-major buckets (a row a rank) copied
        gathers = {i for i, d in dims.items() if d.startswith("1, ")}
        if not assembled and got != gathers:
            sys.exit(f"FAIL {tag} {name}: assembled {sorted(got)}, wanted the one-row gather "
                     f"buffers {sorted(gathers)}")
        got = len(got) if assembled else 0
        # views of a collective's sum: a range of it, or (a bucket of one) all of it
        ops = dict(re.findall(r"/\* %(\d+) = (\w+) ", text))
        views = sum(ops.get(src) in ("all_reduce", "reduce_scatter") for src in
                    re.findall(r"/\* a view: %\d+ is (?:written over )?%(\d+)", text))
        # (a parameter alone in its bucket, the tied table: no concat, its sum its gradient)
        alone = buckets - concats if assembled else 0
        want = concats if assembled else 0
        if buckets < 10 or got != want or alone != (1 if assembled else 0):
            sys.exit(f"FAIL {tag} {name}: {got} of {buckets} dp buckets assembled ({concats} "
                     f"concats), wanted {want} and the tied table's alone")
        if views != nparams - alone:
            sys.exit(f"FAIL {tag} {name}: {views} gradients views of a sum, wanted one for "
                     f"each of the {nparams} parameters but {alone} alone in a bucket")
    concats = [k for k in plan["kernels"] if "_concat" in k["name"]]
    skipped = [k for k in concats if k.get("view")]
    if assembled and (not concats or len(skipped) != len(concats)):
        sys.exit(f"FAIL {tag}: plan.json: {len(skipped)} of {len(concats)} concat kernels "
                 f"skipped")
    if not assembled and len(skipped) != len(gathers):
        sys.exit(f"FAIL {tag}: plan.json: {len(skipped)} concat kernels skipped, wanted the "
                 f"{len(gathers)} gather buffers'")
    notes.append(f"{tag}: {buckets} buckets, {len(skipped)} concats assembled, {views} gradient views, "
                 f"predicted step {plan['predicted_step']['seconds'] * 1e3:.2f} ms")
print("GPT-2 small, no copy around the dp collectives: " + "; ".join(notes))
