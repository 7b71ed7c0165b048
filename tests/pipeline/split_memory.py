#!/usr/bin/env python3
"""tests/pipeline/split_memory.py -- --stage-layers memory against every split.

usage: split_memory.py PARC EXAMPLES_DIR OUTDIR

For small pipelines of the example models (GPT-2 small with fewer layers,
llama_tiny; 1f1b, zero-bubble, interleaved), runs parc once with
--stage-layers memory and once per possible split with --stage-layers
given, and checks:
  - the split chosen is reported as planned for that split given by hand:
    the same device bytes per stage, the same predicted step (the search
    plans each split as the trainer would), and the steps it states, the
    chosen split's and the split by FLOPs's, are those reports' own;
  - its largest rank is no more than the split balanced by FLOPs (the
    default), and within 1% (PP_SPLIT_SLACK) of the least over every split;
  - -o writes the chosen split into plan.json's layout (chunk_layers, by
    memory), and bad values of the flag are refused.
"""
import itertools
import json
import os
import re
import subprocess
import sys

PARC, EXAMPLES, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
SLACK = 0.01
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


def run(args, rc_want=0):
    p = subprocess.run([PARC] + args, capture_output=True, text=True)
    if p.returncode != rc_want:
        fail("parc %s: exit %d, wanted %d\n%s" % (" ".join(args), p.returncode, rc_want, p.stderr))
    return p


def plan(args):
    """(device bytes per stage, predicted step in ms, the report)"""
    out = run(args).stdout
    stages = [int(x) for x in re.findall(r"^    stage \d+: .*?\((\d+) bytes\)", out, re.M)]
    m = re.search(r"predicted step time on \S+ \(.*?\): ([\d.]+) (ms|s)", out)
    step = float(m.group(1)) * (1e3 if m.group(2) == "s" else 1) if m else None
    return stages, step, out


def splits(layers, chunks):
    for cut in itertools.combinations(range(1, layers), chunks - 1):
        b = (0,) + cut + (layers,)
        yield [b[i + 1] - b[i] for i in range(chunks)]


CASES = [
    ("gpt2.dsl", ["-D", "layers=8", "--pp", "3"], 8, 3),
    ("gpt2.dsl", ["-D", "layers=8", "--pp", "3", "--schedule", "zb"], 8, 3),
    ("gpt2.dsl", ["-D", "layers=8", "--pp", "2", "--schedule", "interleaved"], 8, 4),
    ("llama_tiny.dsl", ["-D", "layers=6", "-D", "batch=6", "--pp", "3"], 6, 3),
    ("llama_tiny.dsl", ["-D", "layers=6", "--tp", "2", "--pp", "2"], 6, 2),
]

for model, args, layers, chunks in CASES:
    base = [os.path.join(EXAMPLES, model), "-D", "precision=bf16"] + args
    name = "%s %s" % (model, " ".join(args))
    stages, step, report = plan(base + ["--stage-layers", "memory"])
    m = re.search(r"layers per (?:stage|chunk) chosen for memory \(--stage-layers memory\): "
                  r"([\d,]+), the largest rank", report)
    if not m or not stages:
        fail("%s: no chosen split in the report" % name)
        continue
    chosen = [int(x) for x in m.group(1).split(",")]
    got = plan(base + ["--stage-layers", m.group(1)])
    if (got[0], got[1]) != (stages, step):
        fail("%s: split %s reported %s %s ms, given by hand %s %s ms" %
             (name, chosen, stages, step, got[0], got[1]))
    time_stages, _, time_report = plan(base)
    said = re.search(r"predicted step (\S+ \S+) against (\S+ \S+);", report)
    steps = [re.search(r"predicted step time on \S+ \(.*?\): (\S+ \S+),", r)
             for r in (report, time_report)]
    if not said or not all(steps) or said.groups() != (steps[0].group(1), steps[1].group(1)):
        fail("%s: the report's steps %s, the reports' own %s" %
             (name, said and said.groups(), [x and x.group(1) for x in steps]))
    every = [(max(plan(base + ["--stage-layers", ",".join(map(str, c))])[0]), c)
             for c in splits(layers, chunks)]
    least = min(b for b, _ in every)
    if max(stages) > max(time_stages):
        fail("%s: chosen %s needs %d, more than the split by FLOPs's %d" %
             (name, chosen, max(stages), max(time_stages)))
    if max(stages) > least * (1 + SLACK):
        fail("%s: chosen %s needs %d; the least of %d splits is %d" %
             (name, chosen, max(stages), len(every), least))
    print("%s: chose %s, largest rank %d (by FLOPs %d, least of %d splits %d)" %
          (name, chosen, max(stages), max(time_stages), len(every), least))

# -o: plan.json says which split the trainer runs, and why
outdir = os.path.join(OUT, "split_memory")
p = run([os.path.join(EXAMPLES, "gpt2.dsl"), "-D", "layers=8", "--pp", "3",
         "--stage-layers", "memory", "-o", outdir])
m = re.search(r"chosen for memory \(--stage-layers memory\): ([\d,]+),", p.stdout)
try:
    lay = json.load(open(os.path.join(outdir, "plan.json")))["layout"]
    want = [int(x) for x in m.group(1).split(",")] if m else None
    if lay.get("chunk_layers") != want or lay.get("chunk_layers_by") != "memory":
        fail("plan.json layout %s, the report's split %s" % (lay, want))
except (OSError, ValueError, KeyError) as e:
    fail("plan.json: %s" % e)

# bad values and places
for args, text in [(["--pp", "2", "--stage-layers", "memroy"], "or time, or memory"),
                   (["--stage-layers", "memory"], "--stage-layers needs a pipeline")]:
    p = run([os.path.join(EXAMPLES, "gpt2_tiny.dsl")] + args, rc_want=1)
    if text not in p.stderr:
        fail("%s: stderr %r lacks %r" % (args, p.stderr, text))

print("split_memory: %d failures" % failures)
sys.exit(1 if failures else 0)
