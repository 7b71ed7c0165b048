#!/usr/bin/env python3
"""Where do two layouts of a routed (MoE) model route differently, and why?

usage: scripts/moe_route_diff.py [--max-ulp N] REF_DIR OTHER_DIR [train options...]

REF_DIR and OTHER_DIR are CPU trainer projects `parc -o DIR --target cpu` wrote
for the same model (typically one rank and a --dp/--ep/--zero layout).  Each is
copied to a scratch directory, its train.c patched so that every top-k call
(the router's choice of experts) also writes its input rows (the router's
probabilities, as exact hex floats) and chosen experts to a file per rank (in
$MOE_ROUTE_DIR), built against the same parc runtime, and run with the given
options (e.g. --steps 20 --data FILE --lr 3e-3).  Rows are matched by (step, layer, microbatch, row of the
microbatch's global batch): dp rank d's local row r of a microbatch is global row
d * (rows per rank) + r, the order in which the trainer hands out the batch
(rt_train.c mb_major).

Printed per step: how many rows' probabilities are bit-identical, the largest
difference in units in the last place (ulp), and every row whose top-k choice
differs, with both layouts' probabilities and the margin between the competing
experts.  A flip at a margin of a few ulp is a near tie tipped by rounding; a flip
at a large margin, or a step-0 difference larger than a few ulp, points at a real
mismatch (rows, microbatches or parameters that are not the same).  The last
line is `first flip: step S` or `first flip: none` (steps counted from 0, as the
log's); nothing is printed past the first step with a flip.

--max-ulp N: a check, exit status 1 unless every row is routed on both layouts,
step 0's probabilities differ by at most N ulp, and the first flip (if any) is a
near tie: the traded experts' probabilities at most 2N ulp apart on each layout
(rounding moves each of the two by at most N, so it can reorder only two that
close).

As a module (tests/trainer/trainer_test.py): patch_project patches a project in
place, whose trainer then dumps where the environment names MOE_ROUTE_DIR (and
nowhere else), load reads a dump and compare is the check above.

Supported: pp 1 (with or without microbatches) and non-interleaved pipelines
(each stage's layers in order); tp ranks route alike, tp rank 0 is read.
Nothing of the projects given is modified.  Exit status 0, or 1 on a failed
build, run or --max-ulp check."""
import collections
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HOOK = r'''
#include <stdio.h>
#include <stdlib.h>
/* moe_route_diff.py: rt_topk, and (where the environment names a directory
 * MOE_ROUTE_DIR) its input rows and choices appended to
 * $MOE_ROUTE_DIR/route_dp<D>_tp<T>_pp<P>.txt (step, layer, row, n probabilities,
 * k experts); the choices are rt_topk's whatever the dump does */
static int route_dump_topk(RtStepIO *io, int layer, int32_t *out, const float *x,
                           int64_t rows, int64_t n, int64_t k) {
  int rc = rt_topk(out, x, rows, n, k);
  const char *dir = getenv("MOE_ROUTE_DIR");
  if (!dir) return rc;
  char name[4096];
  snprintf(name, sizeof name, "%s/route_dp%d_tp%d_pp%d.txt", dir, io->dp_rank, io->tp_rank,
           io->pp_rank);
  FILE *f = fopen(name, "a");
  if (!f) return rc;
  for (int64_t r = 0; r < rows; r++) {
    fprintf(f, "%d %d %lld", (int)io->step, layer, (long long)r);
    for (int64_t j = 0; j < n; j++) fprintf(f, " %a", x[r * n + j]);
    for (int64_t j = 0; j < k; j++) fprintf(f, " %d", out[r * k + j]);
    fputc('\n', f);
  }
  fclose(f);
  return rc;
}
'''


def patch_project(path):
    """Rewrites the project at path so that its trainer dumps every top-k call (see
    HOOK; nothing is written unless MOE_ROUTE_DIR is set), once however often it is
    called; returns the routed layer count (its rt_topk calls), exits where there is
    none."""
    c = os.path.join(path, "train.c")
    text = open(c).read()
    if "route_dump_topk(" in text:  # patched before (a project of the trainer tests)
        return len(re.findall(r"\broute_dump_topk\(io, ", text))
    count = [0]

    def hook(_):
        count[0] += 1
        return f"route_dump_topk(io, {count[0] - 1}, "
    text = re.sub(r"\brt_topk\(", hook, text)
    if count[0] == 0:
        sys.exit(f"{path}/train.c calls no rt_topk: not a routed model's CPU trainer")
    at = text.index("\nstatic ")
    open(c, "w").write(text[:at] + HOOK + text[at:])
    return count[0]


def patch(src, dst):
    """Copies project src to dst with its top-k calls dumped; returns the layer count."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build"))
    return patch_project(dst)


def run(cmd, cwd, dump=None):
    env = dict(os.environ, MOE_ROUTE_DIR=dump) if dump else None
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        sys.exit(1)


def load(dirname):
    """{(step, layer, microbatch, global row): (probabilities, choices)} of a run."""
    files = [f for f in os.listdir(dirname) if f.startswith("route_dp") and "_tp0_" in f]
    by_rank = collections.defaultdict(list)
    for f in files:
        by_rank[int(re.match(r"route_dp(\d+)_", f).group(1))].append(f)
    dp = len(by_rank)
    raw = []
    if not files:
        return {}, 0
    for d, names in by_rank.items():
        for name in names:
            seen = collections.Counter()
            for line in open(os.path.join(dirname, name)):
                t = line.split()
                step, layer, r = int(t[0]), int(t[1]), int(t[2])
                if r == 0:
                    seen[(step, layer)] += 1
                raw.append((step, layer, seen[(step, layer)] - 1, d, r, t[3:]))
    rows_per_rank = max(x[4] for x in raw) + 1
    out = {}
    for step, layer, mb, d, r, vals in raw:
        # n probabilities (hex floats) then k experts (decimal)
        probs = [float.fromhex(v) for v in vals if "x" in v]
        idx = [int(v) for v in vals[len(probs):]]
        out[(step, layer, mb, d * rows_per_rank + r)] = (probs, idx)
    return out, dp


def ulps(a, b):
    ia = struct.unpack("<i", struct.pack("<f", a))[0]
    ib = struct.unpack("<i", struct.pack("<f", b))[0]
    return abs(ia - ib)


def flip_pair(p1, i1, p2, i2):
    """The two experts a top-k flip trades, (a chosen on the first layout, b on the
    second): of the pairs traded (or, with the same experts in another order, swapped
    in position), the one farthest from a tie on the first layout."""
    pairs = [(a, b) for a in i1 if a not in i2 for b in i2 if b not in i1] or \
        [(a, b) for a, b in zip(i1, i2) if a != b]
    return max(pairs, key=lambda ab: ulps(p1[ab[0]], p1[ab[1]]))


class Routes:
    """What compare found: first (the first step with a top-k flip, counted from 0 as
    the log's, or None), bad (why the --max-ulp check fails, or None), step0_ulp (the
    largest difference of step 0's probabilities on rows both route from the same
    inputs), ulp (the largest difference of any step compared) and margin (the largest
    checked flip's, ulp, on either layout)."""
    def __init__(self):
        self.first, self.bad, self.step0_ulp, self.ulp, self.margin = None, None, 0, 0, 0


def compare(ref, other, max_ulp=None, say=print):
    """Compares two runs' dumps (load's first result), saying per step how many rows
    are bit-identical, the largest ulp difference and each flip (see the module's
    doc), up to the first step with a flip.  With max_ulp, a check: every row routed
    on both, step 0's probabilities at most max_ulp apart, and every first flip of a
    microbatch a near tie on both layouts (the traded experts' probabilities at most
    2 max_ulp apart on each).  Returns a Routes."""
    res = Routes()
    if not ref or not other:
        res.bad = "no routing dumped (is MOE_ROUTE_DIR set, the trainer patched?)"
        return res
    first0 = min(k[0] for k in ref)
    for step in sorted({k[0] for k in ref}):
        keys = sorted(k for k in ref if k[0] == step)
        okeys = sorted(k for k in other if k[0] == step)
        if keys != okeys:
            odd = sorted(set(keys) ^ set(okeys))
            res.bad = (f"step {step - 1}: {len(odd)} rows routed on one layout only, e.g. "
                       f"(step, layer, microbatch, row) {odd[0]}: the layouts route "
                       f"different rows")
            return res
        same = sum(1 for k in keys if ref[k][0] == other[k][0])
        worst = max(ulps(a, b) for k in keys for a, b in zip(ref[k][0], other[k][0]))
        flips = [k for k in keys if ref[k][1] != other[k][1]]
        res.ulp = max(res.ulp, worst)
        say(f"step {step - 1}: {same}/{len(keys)} rows' router probabilities bit-identical, "
            f"largest difference {worst} ulp, {len(flips)} top-k flips")
        # a flip changes its microbatch's later layers: what must be a near tie (and,
        # at the first step, within max_ulp) is each microbatch's first flipped layer
        first_layer = {}
        for k in flips:
            first_layer.setdefault(k[2], k[1])
        for k in flips:
            (p1, i1), (p2, i2) = ref[k], other[k]
            a, b = flip_pair(p1, i1, p2, i2)
            m1, m2 = ulps(p1[a], p1[b]), ulps(p2[a], p2[b])
            say(f"  layer {k[1]} microbatch {k[2]} row {k[3]}: experts {i1} vs {i2}; "
                f"p[{a}] - p[{b}] = {p1[a] - p1[b]:.3g} ({m1} ulp) vs "
                f"{p2[a] - p2[b]:.3g} ({m2} ulp); p {p1[a].hex()} "
                f"{p1[b].hex()} vs {p2[a].hex()} {p2[b].hex()}; every expert's p differs by "
                f"{[ulps(x, y) for x, y in zip(p1, p2)]} ulp")
            if k[1] == first_layer[k[2]]:
                res.margin = max(res.margin, m1, m2)
                if max_ulp is not None and max(m1, m2) > 2 * max_ulp and res.bad is None:
                    res.bad = (f"step {step - 1}: layer {k[1]} row {k[3]} flips at a margin "
                               f"of {m1} ulp (one layout) and {m2} (the other), > "
                               f"{2 * max_ulp}")
        if step == first0:
            res.step0_ulp = max((ulps(a, b) for k in keys if k[1] <= first_layer.get(k[2], k[1])
                                 for a, b in zip(ref[k][0], other[k][0])), default=0)
            if max_ulp is not None and res.step0_ulp > max_ulp and res.bad is None:
                res.bad = (f"step {step - 1}: router probabilities {res.step0_ulp} ulp apart "
                           f"(> {max_ulp})")
        if flips:
            res.first = step - 1
            break  # later steps follow from a different model
    return res


def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    argv, max_ulp = sys.argv[1:], None
    if argv[0] == "--max-ulp":
        if len(argv) < 4 or not argv[1].isdigit():
            sys.exit("--max-ulp N: N a count of ulp, then REF_DIR OTHER_DIR")
        max_ulp, argv = int(argv[1]), argv[2:]
    ref_dir, other_dir, args = argv[0], argv[1], argv[2:]
    args = [os.path.abspath(a) if os.path.exists(a) else a for a in args]
    scratch = tempfile.mkdtemp(prefix="moe_route_diff_")
    try:
        runs = []
        for tag, src in (("ref", ref_dir), ("other", other_dir)):
            dst = os.path.join(scratch, tag)
            layers = patch(src, dst)
            run(["cmake", "-S", dst, "-B", dst + "/build"], dst)
            run(["cmake", "--build", dst + "/build"], dst)
            run([dst + "/build/train", "--quiet", *args], dst, dump=dst)
            runs.append(load(dst))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (ref, _), (other, dp) = runs
    print(f"{ref_dir} vs {other_dir} ({dp} dp ranks, {layers} routed layers)")
    res = compare(ref, other, max_ulp)
    print(f"first flip: {'none' if res.first is None else f'step {res.first}'}")
    if res.bad:
        sys.exit(f"FAIL: {res.bad}")


if __name__ == "__main__":
    main()
