#!/usr/bin/env python3
"""tests/pipeline/timeline_check.py PARC MODEL.dsl -- `--emit timeline` is a
well-formed SVG and `--emit trace` well-formed Chrome trace JSON, for every
schedule: one complete ("X") event per action of every stage's list, each
action (kind, microbatch, chunk) exactly once, one F/B/W box per compute
action in the picture, events of a stage never overlapping."""
import collections
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

parc, model = sys.argv[1], sys.argv[2]
SVG = "{http://www.w3.org/2000/svg}"
failures = 0


def fail(what):
    global failures
    failures += 1
    print("FAIL", what)


def run(args):
    r = subprocess.run([parc, model] + args, capture_output=True, text=True)
    if r.returncode != 0:
        fail("%s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


# (args, stages P, chunks P*V, microbatches M, W split)
cases = [
    (["--pp", "2", "--schedule", "gpipe", "--microbatches", "4"], 2, 2, 4, False),
    (["--pp", "4", "--schedule", "1f1b", "--microbatches", "8"], 4, 4, 8, False),
    (["--pp", "2", "--schedule", "interleaved", "--microbatches", "4"], 2, 4, 4, False),
    (["--pp", "4", "--schedule", "zb", "--microbatches", "16"], 4, 4, 16, True),
]
for args, P, C, M, split in cases:
    what = " ".join(args)
    compute = M * C * (3 if split else 2)
    comm = 4 * M * (C - 1)  # SEND and RECV of activations and of gradients per boundary
    trace = json.loads(run(args + ["--emit", "trace"]))
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    if len(events) != compute + comm:
        fail("%s: %d events, want %d actions" % (what, len(events), compute + comm))
    if len(meta) != P:
        fail("%s: %d process names, want %d" % (what, len(meta), P))
    seen = collections.Counter((e["cat"], e["args"]["mb"], e["args"]["chunk"]) for e in events)
    if any(n != 1 for n in seen.values()):
        fail("%s: an action appears twice" % what)
    for kind in ["F", "B"] + (["W"] if split else []):
        for mb in range(M):
            for c in range(C):
                if seen[(kind, mb, c)] != 1:
                    fail("%s: no event for %s mb %d chunk %d" % (what, kind, mb, c))
    by_stage = collections.defaultdict(list)
    for e in events:
        for key in ("name", "pid", "tid", "ts", "dur"):
            if key not in e:
                fail("%s: event without %s" % (what, key))
        if e["args"]["chunk"] % P != e["pid"]:
            fail("%s: %s on stage %d" % (what, e["name"], e["pid"]))
        by_stage[e["pid"]].append((e["ts"], e["ts"] + e["dur"]))
    for s, spans in by_stage.items():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            if b0 < a1 - 1e-6:
                fail("%s: stage %d runs two actions at once (%g < %g)" % (what, s, b0, a1))
    other = trace["otherData"]
    if not 0 <= other["bubble_simulated"] or other["microbatches"] != M:
        fail("%s: otherData %s" % (what, other))
    svg = ET.fromstring(run(args + ["--emit", "timeline"]))
    if svg.tag != SVG + "svg":
        fail("%s: root is %s" % (what, svg.tag))
    boxes = [g for g in svg.iter(SVG + "g") if g.find(SVG + "rect") is not None
             and g.find(SVG + "title") is not None]
    if len(boxes) != compute:
        fail("%s: %d boxes, want %d compute actions" % (what, len(boxes), compute))
    labels = [t.text for t in svg.iter(SVG + "text")]
    if "time (ms)" not in labels or not any(l == "stage %d" % (P - 1) for l in labels):
        fail("%s: no time axis or stage rows" % what)
    print("ok %s: %d events, %d boxes, bubble %.4f" % (what, len(events), len(boxes),
                                                      other["bubble_simulated"]))
sys.exit(1 if failures else 0)
