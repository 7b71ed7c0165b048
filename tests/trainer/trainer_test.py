#!/usr/bin/env python3
"""End-to-end: parc -> generated project -> built trainer -> training run.

usage: trainer_test.py CASE PARC SOURCE_DIR WORK_DIR
CASE is one of:
  oracle_gpt2, oracle_llama  20 steps from the same safetensors weights as the
                             PyTorch oracle (tests/oracle/torch_ref.py, float64):
                             every step's loss within 1e-4 relative, grad norm
                             within 1e-3 relative
  resume                     20 steps straight == 10 + --save + --resume + 10,
                             bit for bit (weights file and logged losses), at a
                             constant --lr
  nofuse                     --no-fuse gives the same losses as fused kernels
                             (1e-5 relative) over 10 steps
  attn_delta                 the attention backward from lse and D (passes/attn_delta.c)
                             equals the one from sdpa's out (--keep-attn-out) bit for
                             bit: 10-step losses and --save-weights of GPT-2 and Llama
                             (GQA) tiny at one rank, tp 2 and pp 2; the trainer calls
                             rt_sdpa_grad_stats (token-major where
                             passes/attn_layout.c rewrote it: so this also holds the
                             token-major attention to the head-major one), the
                             other rt_sdpa_grad, and its
                             plan holds fewer bytes live at once (plan.json
                             arena_live_peak_bytes; the report's arena too, but at
                             pp 2, whose best-fit arena fragments by 2% more on
                             this tiny model)
  recompute_norms            --recompute norms (passes/remat_norm.c) gives the same losses
                             over 10 steps within 1e-6 relative and step-1 gradients
                             within 1e-5 relative L2 (its forward norms take no fused
                             prologue: other sum orders; Adam's updates of gradients
                             that are rounding noise, a key bias's, part further),
                             GPT-2 and Llama tiny at one rank, tp 2, pp 2 and tp 2 --sp;
                             the report counts
                             each layer's two norms (none with --sp, whose backward reads
                             the gathered values) and plan.json's live peak is smaller
  recompute_pointwise        --recompute pointwise (passes/remat_act.c) gives the same
                             losses over 10 steps and step-1 gradients bit for bit (the
                             copies compute the forward's formula on the same operands),
                             GPT-2 and Llama tiny at one rank, tp 2, pp 2 (1f1b, zb) and
                             tp 2 --sp, MoE tiny at one rank and dp 2 ep 2; the report
                             counts gelu(h) a layer (GPT-2), silu(g)
                             and silu(g) * u (Llama) and plan.json's live peak is smaller
                             (but under zb: no larger)
  moe                        the MoE model trains: loss falls over 30 steps
  mesh_sp                    --sp trainers of GPT-2 and Llama tiny at tp x dp in 2x1,
                             4x1, 2x2, 4x2 equal the one-rank trainer over 20 steps
                             (losses within 1e-4 relative), with the sequence-parallel
                             collectives plan.json counts; at 2x2 train --trace holds
                             every collective plan.json counts (the vocab-parallel
                             loss's gathers included); GPT-2 with vocab 257 at tp 2
                             (padded to 258) equals one rank and saves [257, d] weights
  mesh_pad                   --pad-vocab (default 64) with vocab 257: the one-rank
                             trainer's [320, d] table gives the unpadded trainer's
                             losses and step-1 gradients (1e-6 relative; GPT-2 tied,
                             Llama untied head) and files of the same shapes; GPT-2 at
                             tp 2 (384 rows), tp 2 x dp 2, dp 2 --zero 1, pp 2 and
                             pp 2 x tp 2 equals the unpadded one rank (1e-4 losses, 1e-5
                             gradients); checkpoints resume padded <-> unpadded, tp 2 -> 1,
                             dp 2 --zero 1 -> 1, 1 -> pp 2
  mesh_pp                    pipelined trainers (--pp 2, 4; every schedule; M = P, 2P; with
                             tp, dp) equal one rank: 20-step losses within 1e-4 relative,
                             step-1 gradients within 1e-5 relative L2; a pp 2 x tp 2
                             checkpoint resumes on one rank and a one-rank one under
                             pp 4; a pp 2 rank allocates its stage's parameters only
                             (the report's count, about half); mpirun equals threads;
                             train --trace gives Chrome trace JSON with one event per
                             schedule action per rank and step, compute never
                             overlapping on a rank (threads and mpirun); every
                             pipelined trainer fuses (plan.json: fewer than 3/4 as many
                             kernels as computed nodes), and pp 2 1f1b, pp 4 zb,
                             interleaved and pp 2 x tp 2 equal their --no-fuse twins
                             (losses 1e-6 relative, step-1 gradients 2e-6 relative L2)
  mesh_overlap               dp 2 trainers with several gradient buckets (all-reduce,
                             and reduce-scatter under --zero 1): train.c starts every
                             bucket's collective and waits for it after the backward
                             pass; a --no-overlap build calls the blocking ones; both
                             give bit-identical losses and step-1 gradients, and the
                             asynchronous one under mpirun -np 2 equals 2 threads
  mesh_moe                   moe_tiny at tp x dp in 2x1 1x2 2x2 1x4 2x4 and with experts
                             split over ep (dp 2 ep 2, dp 4 ep 2, dp 4 ep 4, tp 2 dp 2
                             ep 2, tp 2 dp 4 ep 4), dropless and at capacity 1.0, equals
                             one rank (dropless: 20-step losses 1e-4, step-1 gradients
                             1e-5 relative L2; capacity 1.0, here and below: tie-aware,
                             see mesh_moe_ties); under tp each expert's MLP is split: plan.json
                             gives a rank 1/(tp ep) of every expert tensor; GELU experts
                             and a shared expert at tp 2 and tp 2 x dp 2 ep 2 equal one
                             rank; checkpoints resume tp 2 dp 2 ep 2 -> 1x1, 1x1 -> tp 2,
                             tp 2 -> 1x1 and 1x1 -> ep 4; --init / --save-weights under
                             ep and tp 2 x ep 2; mpirun equals threads;
                             with microbatches = 2 (routing per microbatch), pp 2,
                             pp 2 x dp 2, pp 2 x tp 2 and dp 2 equal the one-rank
                             trainer with the same microbatches (which differs from
                             microbatches = 1), and so do pipelined trainers with
                             experts over ep (pp 2 x dp 2 ep 2, pp 2 x tp 2 x dp 2
                             ep 2, dp 2 ep 2; at batch 8 pp 2 x dp 4 ep 2 and ep 4),
                             whose checkpoints resume on one rank and back and whose
                             --save-weights are whole (mpirun equals threads at
                             pp 2 x dp 4 ep 2); --pp 2 without microbatches
                             is refused; --target all writes the GPU pipelined
                             trainer with experts (pp 2 and pp 1 x dp 2 ep 2);
                             the log's per-layer routing (kept choices per expert,
                             dropped, aux loss) adds up to tokens * top_k and equals
                             one rank's on every layout at step 0
  mesh_zero_ep               --zero 1 with experts over ep (moe_tiny; dp 2 ep 2, dp 4 ep 2,
                             dp 4 ep 4, tp 2 dp 2 ep 2, tp 2 dp 4 ep 2; dropless and at
                             capacity 1.0): dense state in pieces over dp, the experts'
                             over their ep_dp group (whole where ep == dp); equals one
                             rank (20-step losses 1e-4, step-1 gradients 1e-5 relative
                             L2, grad norm 1e-3; at capacity 1.0 tie-aware as
                             mesh_moe_ties, grad norm 1e-6 too), a rank keeps 1/dp of
                             the one-rank state (plus padding), ep_dp reduce-scatters and all-gathers in
                             plan.json iff ep < dp; checkpoints move zero dp 4 ep 2 ->
                             1x1 (its tensors equal one rank's after 10 steps) and 1x1
                             -> zero tp 2 dp 4 ep 2; mpirun equals threads
  mesh_pp_zero               --zero 1 in pipelined trainers: gpt2_tiny (its tied
                             embedding held by the first and last stage) and llama_tiny
                             at pp 2 x dp 2, pp 2 x tp 2 x dp 2, pp 2 x dp 4 (1f1b and
                             gpipe), zb, interleaved, pp 4 x dp 2, with several gather
                             buckets per stage, and SGD with momentum at pp 2 x dp 2,
                             equal one rank (20-step losses 1e-4, step-1 gradients 1e-5
                             relative L2, grad norm 1e-3); a rank's optimizer state per
                             stage is the --zero 0 trainer's / dp (plus padding); per
                             stage one dp reduce-scatter per gradient held and several
                             all-gathers in plan.json, and train --trace's
                             reduce-scatters move what plan.json counts; checkpoints
                             pp 2 x dp 2 zero -> one rank and one rank -> pp 2 x tp 2 x
                             dp 2 zero resume; --save-weights after 20 steps within
                             1e-3 of one rank's (AdamW on near-zero biases amplifies
                             rounding: the --zero 0 pipeline is 4e-4 away); moe_tiny
                             (microbatches 2, dropless) at dp 2 (a one-stage
                             pipeline), pp 2 x dp 2, pp 2 x dp 4 ep 2 and pp 2 x tp 2 x
                             dp 2 ep 2 equals one rank; mpirun equals threads
  mesh_moe_ties              moe_tiny at capacity 1.0, batch 8, microbatches 2 under
                             dp 2, dp 2 ep 2, dp 2 --zero 1 and dp 2 ep 2 --zero 1
                             against one rank, tie-aware (equals_one_rank_ties, also
                             mesh_moe's and mesh_zero_ep's capacity 1.0): router
                             probabilities dumped (scripts/moe_route_diff.py), every
                             row routed on both, step 0's within ROUTE_ULP = 8 ulp;
                             until the first top-k flip (if any), which must be a near
                             tie (the traded experts within 16 ulp on both layouts),
                             losses within 1e-6 relative and step-1 gradients within
                             1e-6 relative L2, nothing compared after it (said in the
                             output); the check rejects a trainer that drops
                             differently (capacity 0 vs 1.0) and wrong logs and dumps
                             (a loss 1e-5 off, a flip at a large margin or at 17 ulp,
                             a row missing, step 0 100 ulp off), and stops at a
                             fabricated 16-ulp tie
  mesh_zero                  --zero 1 (dense: gpt2_tiny d 34, llama_tiny d 36, pieces
                             ending in padding, several buckets) at tp x dp 2x1, 1x2,
                             2x2, 1x4, 2x4 equals one rank (20-step losses 1e-4, step-1
                             gradients 1e-5 relative L2, grad norm 1e-3); at tp 2 dp 1
                             it writes the --tp 2 project byte for byte (nothing to
                             shard); a rank keeps 1/dp of the state; checkpoints
                             resume zero 1x2 -> 1x1 and 1x1 -> zero 2x4; mpirun equals
                             threads
  mesh_gpt2, mesh_llama      trainers for every tp x dp with tp, dp in {1, 2, 4} and
                             tp*dp <= 8 train the same model as one rank from the
                             same seed: 20 steps, losses within 1e-4 relative,
                             step-1 gradients (--save-grads, gathered) within
                             1e-5 relative L2 per tensor; a
                             checkpoint saved under 2x2 resumes under 1x1 like the
                             one-rank run; under mpirun, 4 processes equal 4 threads
The generated project is built with TRAIN_WERROR=ON: it must compile without
a warning.  Exit 77 (skip) where /usr/bin/python3 has no torch.
"""
import json, os, re, shutil, struct, subprocess, sys

case, parc, src, work = sys.argv[1:5]
sys.path.insert(0, os.path.join(src, "scripts"))
import moe_route_diff  # noqa: E402 (scripts/, found from SOURCE_DIR)
work = os.path.join(work, case)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ORACLE_PY = "/usr/bin/python3"

GPT2 = ["-D", "layers=2", "-D", "d=32", "-D", "heads=2", "-D", "seq=16", "-D", "batch=4",
        "-D", "steps=20", "-D", "lr=3e-3"]
LLAMA = ["-D", "layers=2", "-D", "d=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=64",
         "-D", "seq=16", "-D", "batch=4", "-D", "steps=20", "-D", "lr=3e-3"]
MOE = ["-D", "layers=2", "-D", "d=32", "-D", "heads=4", "-D", "kv_heads=2", "-D", "ffn=32",
       "-D", "seq=16", "-D", "batch=4", "-D", "experts=4", "-D", "top_k=2", "-D", "lr=3e-3"]

def run(cmd, **kw):
    """Runs cmd; on failure exits with its output."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r

def build(model, defines, name, extra=(), path=None, routes=False):
    """Compiles examples/MODEL.dsl (or the file at path) into work/NAME and builds it;
    with routes, its router's choices can be dumped (train_routed)."""
    out = os.path.join(work, name)
    path = path or os.path.join(src, "examples", model + ".dsl")
    run([parc, path, "-o", out, *defines, *extra])
    if routes:
        moe_route_diff.patch_project(out)
    run(["cmake", "-S", out, "-B", out + "/build", "-DTRAIN_WERROR=ON"])
    r = run(["cmake", "--build", out + "/build"])
    if "warning" in r.stdout + r.stderr:
        sys.exit("FAIL: the generated project compiled with warnings:\n" + r.stdout[-3000:])
    return out + "/build/train"

def data_file():
    path = os.path.join(work, "data.txt")
    words = ("the model reads bytes and learns which one comes next ; a small corpus with "
             "repeated words makes the loss fall quickly .").split()
    text, x = [], 12345
    for _ in range(4000):
        x = (x * 1103515245 + 12345) % (1 << 31)
        text.append(words[x % len(words)])
    open(path, "w").write(" ".join(text))
    return path

def train(exe, *args, env=None):
    log = os.path.join(work, "log-%d.jsonl" % len(os.listdir(work)))
    run([exe, "--quiet", "--threads", "2", "--log", log, *args], env=env)
    rows = [json.loads(l) for l in open(log)]
    return [r for r in rows if "step" in r]

def train_routed(exe, *args):
    """train of a build(..., routes=True): (its log's steps, every router choice:
    scripts/moe_route_diff.py's load of the run's dump)."""
    dump = os.path.join(work, "routes-%d" % len(os.listdir(work)))
    os.makedirs(dump)
    rows = train(exe, *args, env=dict(os.environ, MOE_ROUTE_DIR=dump))
    return rows, moe_route_diff.load(dump)[0]

# Capacity drops make routing discontinuous: a layout whose sums run in another order
# (tp's partial sums, dp's gradient all-reduce; OpenBLAS rounds a row of an NT sgemm
# differently once the call's M x N reaches 2048, so 32 rows a rank and 64 on one rank
# differ in the last bits from step 0) can tip a near tie of two experts' router
# probabilities, after which the two models legitimately differ by more than rounding.
# ROUTE_ULP bounds what rounding does to a router probability: at step 0, whose
# parameters are the same bits on every layout, measured at most 2 ulp (every layout of
# mesh_moe, mesh_moe_ties, mesh_zero_ep), and up to 7 ulp by step 19 as the layouts'
# parameters part by rounding; so a flip that rounding explains trades two experts at
# most 2 ROUTE_ULP apart, on either layout.  A wrong row, expert, logit or drop order
# moves probabilities by thousands of ulp (capacity 0 against 1.0, or capacity_drop
# filling the dp ranks in reverse order: 9e4 ulp at step 0).
ROUTE_ULP = 8
TIES_TOL = 1e-6  # losses and the first step's gradients before a flip (measured 1.2e-7, 4.4e-7)

def ties_verdict(got, ref, grads_ref, grads, tol, norm=False):
    """equals_one_rank_ties's check: (why it fails or None, worst loss difference,
    gradient difference or None, moe_route_diff.Routes, the comparison's last lines)."""
    (rows, routes), (ref_rows, ref_routes) = got, ref
    said = []
    res = moe_route_diff.compare(ref_routes, routes, ROUTE_ULP, say=said.append)
    if len(rows) != len(ref_rows):
        return f"{len(rows)} steps logged, one rank {len(ref_rows)}", 0.0, None, res, said
    if res.bad:
        return (f"routing differs from one rank's beyond a near tie: {res.bad}", 0.0, None,
                res, said)
    until = len(ref_rows) if res.first is None else res.first
    e = None
    if until > 0 and grads:
        e, name = grads_rel_l2(grads_ref, grads)
        if e > tol:
            return (f"step-1 gradient of {name} differs by {e:.2e} (relative L2) from one "
                    f"rank's (no top-k flip at step 0)", 0.0, e, res, said)
    worst = 0.0
    for r, g in zip(ref_rows[:until], rows[:until]):
        worst = max(worst, rel(g["loss"], r["loss"]))
        if rel(g["loss"], r["loss"]) > tol:
            return (f"step {r['step']}: loss {g['loss']}, one rank {r['loss']} (relative "
                    f"{rel(g['loss'], r['loss']):.1e} > {tol:g}; no top-k flip before step "
                    f"{until})", worst, e, res, said)
        if norm and rel(g["grad_norm"], r["grad_norm"]) > tol:
            return (f"step {r['step']}: grad norm {g['grad_norm']}, one rank "
                    f"{r['grad_norm']} (relative > {tol:g})", worst, e, res, said)
    return None, worst, e, res, said

def equals_one_rank_ties(tag, got, ref, grads_ref=None, grads=None, tol=TIES_TOL, norm=False):
    """A routed model with a finite capacity against one rank: got and ref are
    train_routed's (steps, routes).  moe_route_diff.compare's check at ROUTE_ULP
    (every row routed on both, step 0's probabilities within ROUTE_ULP ulp, every
    first flip a near tie: within 2 ROUTE_ULP ulp on both layouts); until the first
    flip every loss within tol relative (with norm, every gradient norm too), and
    the first step's gradients (grads, against grads_ref) within tol relative L2
    unless the flip is at step 0 (grads None: none compared); from the flip on
    nothing is compared (the line printed says so).  Returns (worst loss
    difference, gradient difference or None, moe_route_diff.Routes)."""
    bad, worst, e, res, said = ties_verdict(got, ref, grads_ref, grads, tol, norm)
    if bad:
        sys.exit(f"FAIL {tag}: {bad}\n" + "\n".join(said[-12:]))
    if res.first is not None:
        print(f"{tag}: a near tie (margin {res.margin} ulp) flips a top-k choice at step "
              f"{res.first}: losses compared up to it only, not after")
    return worst, e, res

def load_safetensors(path):
    """{name: tuple of floats} of an F32 safetensors file (no torch needed)."""
    import struct
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head, base, out = json.loads(raw[8:8 + n]), 8 + n, {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"FAIL: {path}: {name} is {t['dtype']}, expected F32")
        s, e = t["data_offsets"]
        out[name] = struct.unpack(f"<{(e - s) // 4}f", raw[base + s:base + e])
    return out

def grads_rel_l2(ref_path, got_path):
    """The largest relative L2 difference over the tensors of two gradient files
    (same names and sizes required), and its tensor."""
    ref, got = load_safetensors(ref_path), load_safetensors(got_path)
    if ref.keys() != got.keys():
        sys.exit(f"FAIL: {got_path} holds {sorted(got)} , {ref_path} {sorted(ref)}")
    worst, where = 0.0, None
    for name, r in ref.items():
        g = got[name]
        if len(g) != len(r):
            sys.exit(f"FAIL: {got_path}: {name} has {len(g)} values, expected {len(r)}")
        den = sum(x * x for x in r) ** 0.5
        num = sum((x - y) ** 2 for x, y in zip(r, g)) ** 0.5
        e = num / den if den > 0 else num
        if e > worst or where is None:
            worst, where = e, name
    return worst, where

def equals_one_rank(tag, got, ref, grads_ref, grads, check_norm=True):
    """A run's log `got` and step-1 gradients file `grads` against the one-rank run's
    (ref, grads_ref): as many steps, every gradient tensor within 1e-5 relative L2,
    every loss within 1e-4 relative (and grad norm within 1e-3 when check_norm).
    Returns the worst loss and gradient differences."""
    if len(got) != len(ref):
        sys.exit(f"FAIL {tag}: {len(got)} steps logged")
    e, name = grads_rel_l2(grads_ref, grads)
    if e > 1e-5:
        sys.exit(f"FAIL {tag}: step-1 gradient of {name} differs by {e:.2e} (relative L2) "
                 f"from one rank's")
    worst = 0.0
    for r, g in zip(ref, got):
        worst = max(worst, rel(g["loss"], r["loss"]))
        if rel(g["loss"], r["loss"]) > 1e-4 or \
                (check_norm and rel(g["grad_norm"], r["grad_norm"]) > 1e-3):
            sys.exit(f"FAIL {tag} step {r['step']}: loss {g['loss']} grad_norm "
                     f"{g['grad_norm']}, one rank {r['loss']} {r['grad_norm']}")
    return worst, e

MPI_RUNS = [0]

def mpi_equals_threads(tag, exe, np, args, threads=None, extra=()):
    """Runs exe as np MPI processes (mpirun) with args (+ extra) and requires the losses
    of `threads`, a run of exe with args on the thread backend (made here when None),
    bit for bit.  Returns False, having run nothing, where there is no mpirun.
    OpenMPI's own allocations are not LeakSanitizer-clean: under an ASan build of parc,
    leak checking is off for the MPI processes (ours are checked elsewhere)."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return False
    if threads is None:
        threads = train(exe, *args)
    MPI_RUNS[0] += 1
    log = os.path.join(work, f"mpi_{MPI_RUNS[0]}.jsonl")
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), exe, "--quiet",
         "--log", log, *extra, *args], env=env)
    mpi = [r["loss"] for r in (json.loads(l) for l in open(log)) if "step" in r]
    if not mpi or mpi != [r["loss"] for r in threads]:
        sys.exit(f"FAIL {tag}: mpirun -np {np} losses {mpi} differ from the threads "
                 f"backend's {[r['loss'] for r in threads]}")
    return True

def resumes_like(tag, first, then, args, ref, ck, routed=False):
    """10 steps of trainer `first` saved to checkpoint ck, then `then` resuming it up to
    the end of args (which end with --steps N): every loss within 1e-4 relative of the
    straight run ref.  routed: first and then are build(..., routes=True)'s, ref is
    train_routed's, and the two halves are compared with it tie-aware
    (equals_one_rank_ties, no gradients).  Returns the first flip's step or None."""
    shutil.rmtree(ck, ignore_errors=True)
    if routed:
        half = train_routed(first, *args[:-1], "10", "--save", ck)
        rest = train_routed(then, *args, "--resume", ck)
        return equals_one_rank_ties(f"resume {tag}", (half[0] + rest[0], {**half[1], **rest[1]}),
                                    ref)[2].first
    half = train(first, *args[:-1], "10", "--save", ck)
    rest = train(then, *args, "--resume", ck)
    if len(half + rest) != len(ref):
        sys.exit(f"FAIL resume {tag}: {len(half)} + {len(rest)} steps, {len(ref)} straight")
    for r, g in zip(ref, half + rest):
        if rel(g["loss"], r["loss"]) > 1e-4:
            sys.exit(f"FAIL resume {tag} step {r['step']}: {g['loss']} vs {r['loss']}")

def check_comm_trace(path, plan, steps, ranks, tag):
    """train --trace of a trainer without a pipeline: per rank and step, inside its
    "step" event, one event per collective, as many of each (group, kind) as
    plan.json's communication counts, their floats adding up to its payload_bytes / 4
    (all_to_all: at most sent_bytes_per_rank / 4, only filled rows travel), an
    asynchronous one as a start and a wait.  Returns rank 0's events of step 1."""
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    want = {(c["group"], c["kind"]): c for c in plan["communication"]}
    nasync = plan.get("dp_overlapped_collectives", 0)
    for r in range(ranks):
        for t in range(steps):
            mine = [e for e in ev if e["pid"] == r and e["args"].get("step") == t]
            step = [e for e in mine if e["cat"] == "step"]
            if len(step) != 1:
                sys.exit(f"FAIL {tag}: rank {r} step {t} has {len(step)} step events")
            lo, hi = step[0]["ts"], step[0]["ts"] + step[0]["dur"]
            got, floats, starts, waits = {}, {}, 0, 0
            for e in mine:
                if e["tid"] != 1:
                    continue
                if not lo - 1 <= e["ts"] <= e["ts"] + e["dur"] <= hi + 1:
                    sys.exit(f"FAIL {tag}: collective {e} outside its step {step[0]}")
                a = e["args"]
                if e["cat"] == "async_start":
                    starts += 1
                    continue
                waits += a.get("async") == "wait"
                k = (a["group"], e["cat"])
                got[k] = got.get(k, 0) + 1
                floats[k] = floats.get(k, 0) + a["floats"]
            counts = {k: c["count"] for k, c in want.items()}
            if got != counts or (starts, waits) != (nasync, nasync):
                sys.exit(f"FAIL {tag}: rank {r} step {t} traced collectives {got} "
                         f"({starts} starts, {waits} waits) against plan.json's {counts} "
                         f"({nasync} overlapped)")
            for k, c in want.items():
                if k[1] == "all_to_all":
                    if not 0 < floats[k] <= c["sent_bytes_per_rank"] // 4:
                        sys.exit(f"FAIL {tag}: rank {r} step {t} all_to_all floats "
                                 f"{floats[k]}, plan.json bound {c['sent_bytes_per_rank'] // 4}")
                elif floats[k] * 4 != c["payload_bytes"]:
                    sys.exit(f"FAIL {tag}: rank {r} step {t} {k} moved {floats[k]} floats, "
                             f"plan.json {c['payload_bytes'] // 4}")
    return [e for e in ev if e["pid"] == 0 and e["args"].get("step") == 1]

def check_pipe_comm_trace(path, train_c, plan, steps, ranks, tag):
    """train --trace of a one-stage pipelined trainer (pp 1, M > 1 microbatches; tp 1):
    its trace holds the schedule's actions, not each collective, so the collectives
    run are counted as the collective calls of train.c's chunk functions (fwd_c, bwd_c,
    wgt_c) times the traced F, B, W actions that ran them, plus optimizer_0's per
    traced optimizer event, plus the gradients' reduction (one traced event, its
    floats).  Per rank and step that must give plan.json's communication: every
    (group, kind) count but dp's and ep_dp's exactly, all-reduce floats exactly, and
    the dp and ep_dp all-reduces as the calls plus at least one for the reduction,
    their floats adding up to the calls' plus the reduction's."""
    import re
    src = open(train_c).read()
    calls = {}  # function name -> [(group, kind, floats or None)]
    for fn, body in re.findall(r"^static int ((?:fwd|bwd|wgt|optimizer)_\d+)\(RtStepIO \*io\) "
                               r"\{\n(.*?)^\}", src, re.M | re.S):
        got = []
        for cond, call, group, args in re.findall(
                r"(if \(io->pp_group\) )?CHECK\((rt_\w+)\(io->(\w+)_group, ([^;]*)\)\);", body):
            if cond:  # pp 1: no pp group, never runs
                continue
            if call == "rt_comm_all_reduce":
                got.append((group, "all_reduce", int(args.split(",")[-1])))
            elif call.startswith("rt_expert_all_to_all"):
                got.append((group, "all_to_all", None))
            elif call.startswith("rt_comm_"):
                sys.exit(f"FAIL {tag}: {fn} calls {call}, which this check does not count")
        calls[fn] = got
    if not any(calls.values()):
        sys.exit(f"FAIL {tag}: no collective calls found in {train_c}")
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    want = {(c["group"], c["kind"]): c for c in plan["communication"]}
    for r in range(ranks):
        for t in range(steps):
            mine = [e for e in ev if e["pid"] == r and e["args"].get("step") == t]
            split_w = any(e["cat"] == "W" for e in mine)
            count, floats, reduced, nmb = {}, {}, 0, 0
            for e in mine:
                c = e["args"].get("chunk")
                fns = {"F": [f"fwd_{c}"], "W": [f"wgt_{c}"], "optimizer": ["optimizer_0"],
                       "B": [f"bwd_{c}"] + ([] if split_w else [f"wgt_{c}"])}.get(e["cat"], [])
                nmb += e["cat"] == "F"
                if e["cat"].startswith("all-reduce gradients"):
                    reduced += e["args"].get("floats", 0)
                for fn in fns:
                    for g, k, n in calls.get(fn, []):
                        count[(g, k)] = count.get((g, k), 0) + 1
                        floats[(g, k)] = floats.get((g, k), 0) + (n or 0)
            if nmb != plan["moe"][0]["microbatches"]:
                sys.exit(f"FAIL {tag}: rank {r} step {t} traced {nmb} forward actions, plan.json "
                         f"{plan['moe'][0]['microbatches']} microbatches")
            grads = [("dp", "all_reduce"), ("ep_dp", "all_reduce")]
            for k in set(want) | set(count):
                if k in grads:
                    continue
                c = want.get(k, {})
                if c.get("count", 0) != count.get(k, 0) or \
                        (k[1] == "all_reduce" and c["payload_bytes"] != 4 * floats[k]):
                    sys.exit(f"FAIL {tag}: rank {r} step {t} ran {count.get(k, 0)} {k} "
                             f"({floats.get(k, 0)} floats), plan.json {c}")
            ran = sum(count.get(k, 0) for k in grads)
            planned = sum(want[k]["count"] for k in grads if k in want)
            bytes_ = sum(want[k]["payload_bytes"] for k in grads if k in want)
            moved = sum(floats.get(k, 0) for k in grads) + reduced
            if not (reduced > 0 and planned > ran and bytes_ == 4 * moved):
                sys.exit(f"FAIL {tag}: rank {r} step {t}: dp/ep_dp all-reduces: {ran} calls "
                         f"and the reduction of {reduced} floats ran, plan.json {planned} of "
                         f"{bytes_} bytes")
    return count

def torch_ok():
    return os.path.exists(ORACLE_PY) and subprocess.run(
        [ORACLE_PY, "-c", "import torch"], capture_output=True).returncode == 0

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)

def recompute_runs(model, defs, lay, what, data):
    """Trainers of examples/MODEL.dsl at layout lay without and with --recompute
    WHAT, 10 steps each: (tag, [losses], [step-1 gradient files], [plan.json live
    peaks], [the report's count of recomputed values])."""
    tag = model + "".join(lay).replace("--", "_").replace(" ", "")
    losses, files, peak, made = [], [], [], []
    for rec in ([], ["--recompute", what]):
        name = tag + "_" + what + ("_rec" if rec else "")
        exe = build(model, defs, name, lay + rec)
        out = os.path.join(work, name)
        files.append(os.path.join(work, name + "_grads.safetensors"))
        losses.append([r["loss"] for r in train(exe, "--data", data, "--steps", "10",
                                                "--save-grads", files[-1])])
        peak.append(json.load(open(os.path.join(out, "plan.json")))["cost"]
                    ["arena_live_peak_bytes"])
        rep = open(os.path.join(out, "report.txt")).read()
        m = re.search(r"recomputed in the backward \(--recompute %s\): (\d+) " % what, rep)
        made.append(int(m.group(1)) if m else 0)
    return tag, losses, files, peak, made

def near_runs(tag, what, losses, files):
    """recompute_runs' two runs agree to rounding: losses within 1e-6 relative,
    step-1 gradients within 1e-5 relative L2 (else FAIL).  Returns both."""
    worst = max(rel(a, b) for a, b in zip(*losses))
    w, where = grads_rel_l2(*files)
    if worst > 1e-6 or w > 1e-5:
        sys.exit(f"FAIL {tag}: with --recompute {what} losses differ by {worst:.2e} "
                 f"relative, step-1 gradients by {w:.2e} (rel L2, {where}):\n"
                 f"{losses[0]}\n{losses[1]}")
    return worst, w

def fused_kernels(tag, name):
    """The kernels and computed nodes of the project work/NAME (plan.json): a
    trainer without fusion has one kernel a node (and statistics kernels of none),
    so fusion must have left fewer than 3/4 as many kernels as nodes (GPT-2 tiny
    pipelines: about 0.55)."""
    ks = json.load(open(os.path.join(work, name, "plan.json")))["kernels"]
    nodes = sum(len(k["nodes"]) for k in ks)
    if not len(ks) < 0.75 * nodes:
        sys.exit(f"FAIL {tag}: {len(ks)} kernels for {nodes} computed nodes: not fused")
    return len(ks), nodes

if case.startswith("oracle_"):
    if not torch_ok():
        print("SKIP: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
        sys.exit(77)
    family = case[len("oracle_"):]
    model, defines = ("gpt2_tiny", GPT2) if family == "gpt2" else ("llama_tiny", LLAMA)
    exe = build(model, defines, "project")
    dims = {defines[i + 1].split("=")[0]: defines[i + 1].split("=")[1] for i in range(0, len(defines), 2)}
    mflags = ["--family", family, "--vocab", "256", "--seq", dims["seq"], "--d", dims["d"],
              "--heads", dims["heads"], "--layers", dims["layers"]]
    if family == "llama":
        mflags += ["--kv-heads", dims["kv_heads"], "--ffn", dims["ffn"], "--theta", "10000"]
    init = os.path.join(work, "init.safetensors")
    oracle = os.path.join(src, "tests", "oracle")
    run([ORACLE_PY, os.path.join(oracle, "make_init.py"), *mflags, "--seed", "1", "-o", init])
    data = data_file()
    ref = run([ORACLE_PY, os.path.join(oracle, "torch_ref.py"), *mflags, "--init", init,
               "--data", data, "--batch", dims["batch"], "--steps", "20", "--lr", dims["lr"],
               "--beta1", "0.9", "--beta2", "0.95", "--wd", "0.1", "--clip", "1.0",
               "--schedule", "cosine", "--warmup", "10", "--min-lr", "1e-4",
               "--dtype", "float64"]).stdout
    ref = [json.loads(l) for l in ref.splitlines() if l.strip()]
    got = train(exe, "--init", init, "--data", data)
    worst = 0.0
    for r, g in zip(ref, got):
        e = rel(g["loss"], r["loss"])
        worst = max(worst, e)
        if e > 1e-4 or rel(g["grad_norm"], r["grad_norm"]) > 1e-3 or rel(g["lr"], r["lr"]) > 1e-6:
            sys.exit(f"FAIL step {r['step']}: parc loss {g['loss']} grad_norm {g['grad_norm']} "
                     f"lr {g['lr']}, torch {r['loss']} {r['grad_norm']} {r['lr']}")
    if len(got) != 20 or got[-1]["loss"] > got[0]["loss"] - 0.5:
        sys.exit(f"FAIL: {len(got)} steps, loss {got[0]['loss']} -> {got[-1]['loss']}")
    print(f"{family}: 20 steps, loss {got[0]['loss']:.4f} -> {got[-1]['loss']:.4f}, "
          f"worst relative difference from torch {worst:.2e}")
elif case == "resume":
    # A constant --lr, so that a 10-step run and a 20-step run share their
    # schedule (a schedule spans --steps).
    exe = build("gpt2_tiny", GPT2, "project")
    data = data_file()
    a, b = os.path.join(work, "a.safetensors"), os.path.join(work, "b.safetensors")
    ck = os.path.join(work, "ckpt")
    const = ["--data", data, "--lr", "3e-3"]
    straight = train(exe, *const, "--steps", "20", "--save-weights", a)
    half = train(exe, *const, "--steps", "10", "--save", ck)
    rest = train(exe, *const, "--steps", "20", "--resume", ck, "--save-weights", b)
    if open(a, "rb").read() != open(b, "rb").read():
        sys.exit("FAIL: resumed weights differ from the straight run's")
    losses = [r["loss"] for r in half + rest]
    if losses != [r["loss"] for r in straight]:
        sys.exit(f"FAIL: losses differ:\n{losses}\n{[r['loss'] for r in straight]}")
    print("resume: 10 + 10 steps equal 20 straight, bit for bit")
elif case == "nofuse":
    fused = build("llama_tiny", LLAMA, "fused")
    plain = build("llama_tiny", LLAMA, "plain", ["--no-fuse"])
    data = data_file()
    x = train(fused, "--data", data, "--steps", "10")
    y = train(plain, "--data", data, "--steps", "10")
    for r, s in zip(x, y):
        if rel(r["loss"], s["loss"]) > 1e-5:
            sys.exit(f"FAIL step {r['step']}: fused {r['loss']} unfused {s['loss']}")
    kf = json.load(open(os.path.join(work, "fused", "plan.json")))["kernels"]
    nu = len(json.load(open(os.path.join(work, "plain", "plan.json")))["kernels"])
    distinct = sum("code" not in k for k in kf)
    if not distinct < len(kf):
        sys.exit("FAIL: the two layers' kernels were not compiled once (no shared code)")
    print(f"fused and unfused agree over 10 steps; kernels {len(kf)} fused ({distinct} "
          f"distinct codes), {nu} unfused")
elif case == "attn_delta":
    data, shown = data_file(), []
    for model, defs in (("gpt2_tiny", GPT2), ("llama_tiny", LLAMA)):
        for lay in ([], ["--tp", "2"], ["--pp", "2"]):
            tag = model + "".join(lay).replace("--", "_").replace(" ", "")
            runs, arena = [], []
            for keep in ([], ["--keep-attn-out"]):
                name = tag + ("_keep" if keep else "")
                exe = build(model, defs, name, lay + keep)
                out = os.path.join(work, name)
                c = open(os.path.join(out, "train.c")).read()
                calls = (c.count("rt_sdpa_grad_stats(") + c.count("rt_sdpa_grad_stats_layout("),
                         c.count("rt_sdpa_grad("))
                if (calls[0] == 0) == (not keep) or (calls[1] == 0) == bool(keep):
                    sys.exit(f"FAIL {name}: train.c calls rt_sdpa_grad_stats {calls[0]}, "
                             f"rt_sdpa_grad {calls[1]} times")
                w = os.path.join(work, name + ".safetensors")
                losses = [r["loss"] for r in train(exe, "--data", data, "--steps", "10",
                                                   "--save-weights", w)]
                runs.append((losses, open(w, "rb").read()))
                rep = open(os.path.join(out, "report.txt")).read()
                cost = json.load(open(os.path.join(out, "plan.json")))["cost"]
                arena.append((cost["arena_live_peak_bytes"],
                              int(rep.split("activation arena")[1].split("(")[2].split()[0])))
            if runs[0] != runs[1]:
                sys.exit(f"FAIL {tag}: losses or weights differ with --keep-attn-out:\n"
                         f"{runs[0][0]}\n{runs[1][0]}")
            smaller = arena[0][1] < arena[1][1] or "--pp" in lay
            if not arena[0][0] < arena[1][0] or not smaller:
                sys.exit(f"FAIL {tag}: live peak and arena {arena[0]} bytes, {arena[1]} with "
                         "--keep-attn-out")
            shown.append(f"{tag} {arena[0][0]}/{arena[1][0]} ({arena[0][1]}/{arena[1][1]})")
    print("attn_delta: losses and weights equal --keep-attn-out's bit for bit; live peak "
          "(report arena) bytes with/without: " + ", ".join(shown))
elif case == "recompute_norms":
    data, shown = data_file(), []
    for model, defs in (("gpt2_tiny", GPT2), ("llama_tiny", LLAMA)):
        for lay in ([], ["--tp", "2"], ["--pp", "2"], ["--tp", "2", "--sp"],
                    ["--tp", "2", "--sp", "--pp", "2", "--schedule", "zb"]):
            tag, losses, files, peak, norms = recompute_runs(model, defs, lay, "norms", data)
            # the forward's norms no longer fuse the residual add before them (so that
            # the recomputation stores the same bits): their sums run in another order
            worst, w = near_runs(tag, "norms", losses, files)
            # each layer's two norms, where the backward reads them (--sp: their
            # gathers, which it runs again)
            if norms != [0, 2 * 2] or not peak[1] < peak[0]:
                sys.exit(f"FAIL {tag}: {norms} norms recomputed, live peak {peak} bytes")
            shown.append(f"{tag} {peak[0]}->{peak[1]} ({worst:.1e}, {w:.1e})")
    print("recompute_norms: live peak bytes (losses, step-1 gradients rel. difference): " +
          ", ".join(shown))
elif case == "recompute_pointwise":
    data, shown = data_file(), []
    every = ([], ["--tp", "2"], ["--pp", "2"], ["--pp", "2", "--schedule", "zb"],
             ["--tp", "2", "--sp"])
    for model, defs, lays in (("gpt2_tiny", GPT2, every), ("llama_tiny", LLAMA, every),
                              ("moe_tiny", MOE, ([], ["--dp", "2", "--ep", "2"]))):
        for lay in lays:
            tag, losses, files, peak, made = recompute_runs(model, defs, lay, "pointwise", data)
            # the copies compute each element by the forward's formula from the
            # same operands: the same bits
            w, where = grads_rel_l2(*files)
            if losses[0] != losses[1] or w != 0:
                sys.exit(f"FAIL {tag}: with --recompute pointwise losses or step-1 gradients "
                         f"differ ({w:.2e} rel L2, {where}):\n{losses[0]}\n{losses[1]}")
            # GPT-2: gelu(h) a layer; Llama: silu(g) and silu(g) * u a layer (2 layers);
            # the MoE model: its experts' (and shared MLP's) likewise.  A zero-bubble
            # stage holds its microbatches' W inputs to the end, where the copies
            # (made in B) are live as the originals were: no smaller there
            want = {"gpt2_tiny": 2, "llama_tiny": 4}.get(model, made[1])
            smaller = peak[1] < peak[0] if "zb" not in lay else peak[1] <= peak[0]
            if made != [0, want] or not want or not smaller:
                sys.exit(f"FAIL {tag}: {made} pointwise values recomputed, live peak {peak} "
                         "bytes")
            shown.append(f"{tag} {peak[0]}->{peak[1]}")
    print("recompute_pointwise: losses and step-1 gradients equal bit for bit; live peak "
          "bytes: " + ", ".join(shown))
elif case == "recompute_layers":
    data, shown = data_file(), []
    every = ([], ["--tp", "2"], ["--tp", "2", "--sp"], ["--pp", "2"],
             ["--pp", "2", "--schedule", "zb"], ["--dp", "2", "--zero", "1"])
    for model, defs, lays in (("gpt2_tiny", GPT2, every), ("llama_tiny", LLAMA, every),
                              ("moe_tiny", MOE, ([], ["--tp", "2", "--sp"],
                                                 ["--dp", "2", "--ep", "2"]))):
        for lay in lays:
            tag, losses, files, peak, layers = recompute_runs(model, defs, lay, "layers", data)
            # the copies compute the forward's values from the same operands; the
            # forward norms lose their fused prologue (they have twins now), so their
            # sums may run in another order
            worst, w = near_runs(tag, "layers", losses, files)
            # both layers of the test configs; a zero-bubble stage holds its W inputs to
            # the end, where the copies (made in B) live as the originals did (no
            # smaller, a little larger at llama_tiny's defaults); ZeRO-1's peak at these
            # sizes is the gradients at the step's end, after every activation died
            want = 2
            smaller = True if "zb" in lay else \
                peak[1] <= peak[0] if "--zero" in lay else peak[1] < peak[0]
            if layers != [0, want] or not smaller:
                sys.exit(f"FAIL {tag}: {layers} layers recomputed, live peak {peak} bytes")
            shown.append(f"{tag} {peak[0]}->{peak[1]} ({worst:.1e}, {w:.1e})")
    print("recompute_layers: live peak bytes (losses, step-1 gradients rel. difference): " +
          ", ".join(shown))
elif case == "moe":
    exe = build("moe_tiny", MOE, "project")
    got = train(exe, "--data", data_file(), "--steps", "30")
    if got[-1]["loss"] > got[0]["loss"] - 1.0:
        sys.exit(f"FAIL: MoE loss {got[0]['loss']} -> {got[-1]['loss']}")
    print(f"moe: loss {got[0]['loss']:.4f} -> {got[-1]['loss']:.4f}")
    # the log reports the router z-loss apart from the load-balancing term ("z" only
    # in a model with one), and a dp 2 ep 2 trainer's --trace holds its collectives
    if any("z" in l for row in got for l in row.get("moe", [])):
        sys.exit("FAIL: a MoE log without z_loss has \"z\"")
    exe = build("moe_tiny", MOE + ["-D", "z_loss=1e-3"], "ep_z", ["--dp", "2", "--ep", "2"])
    tr = os.path.join(work, "trace_ep_z.json")
    got = train(exe, "--data", data_file(), "--steps", "3", "--trace", tr)
    for row in got:
        for l in row["moe"]:
            if not (l.get("z", 0) > 0 and 0 < l["aux"] < 0.1):
                sys.exit(f"FAIL: dp 2 ep 2 z_loss 1e-3: moe log layer {l} lacks aux, z")
    plan = json.load(open(os.path.join(work, "ep_z", "plan.json")))
    ev = check_comm_trace(tr, plan, 3, 2, "dp 2 ep 2 --trace")
    # with microbatches = 2 the trainer is a one-stage pipeline: the expert all-to-alls
    # and routing statistics run per microbatch, and plan.json counts them so
    exe = build("moe_tiny", MOE + ["-D", "microbatches=2"], "ep_m2",
                ["--dp", "2", "--ep", "2", "--target", "cpu"])
    tr = os.path.join(work, "trace_ep_m2.json")
    train(exe, "--data", data_file(), "--steps", "3", "--trace", tr)
    plan2 = json.load(open(os.path.join(work, "ep_m2", "plan.json")))
    ran = check_pipe_comm_trace(tr, os.path.join(work, "ep_m2", "train.c"), plan2, 3, 2,
                                "dp 2 ep 2 microbatches 2 --trace")
    a2a1 = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
    print(f"moe: the log has aux and z apart at z_loss 1e-3; dp 2 ep 2 --trace has plan.json's "
          f"collectives ({len([e for e in ev if e['tid'] == 1])} a step on rank 0); with "
          f"microbatches 2 the traced actions run plan.json's collectives "
          f"({ran.get(('ep', 'all_to_all'), 0)} all-to-alls a step, "
          f"{a2a1.get(('ep', 'all_to_all'))} at 1)")
elif case == "mesh_moe":
    def check_moe_log(rows, ref, tag, choices=4 * 16 * 2, step0=True):
        """Every step logs each MoE layer's routing: kept choices per expert
        adding up to tokens * top_k minus the dropped ones; step 0 equals the
        one-rank run's (the counts exactly, the aux loss to 1e-5) where step0
        (False: a near tie flipped a choice at step 0)."""
        for r in rows:
            if len(r.get("moe", [])) != 2:
                sys.exit(f"FAIL {tag} step {r['step']}: moe record {r.get('moe')}")
            for l in r["moe"]:
                if len(l["tokens"]) != 4 or sum(l["tokens"]) + l["dropped"] != choices:
                    sys.exit(f"FAIL {tag} step {r['step']} layer {l['layer']}: kept "
                             f"{l['tokens']} + dropped {l['dropped']} != {choices} choices")
        for a, b in zip(rows[0]["moe"], ref[0]["moe"] if step0 else []):
            if a["tokens"] != b["tokens"] or a["dropped"] != b["dropped"] or \
                    rel(a["aux"], b["aux"]) > 1e-5:
                sys.exit(f"FAIL {tag} step 0 layer {a['layer']}: routing {a}, one rank {b}")
    def experts_split(tag, tp, ep):
        """plan.json of build `tag`: a rank holds 1/(tp ep) of every expert tensor
        (each expert's MLP split over tp, the experts over ep), and the MoE block's
        output is all-reduced over tp (its tp all-reduces outnumber attention's)."""
        plan = json.load(open(os.path.join(work, tag, "plan.json")))
        n = 0
        for p in plan["params"]:
            if p.get("shard") != "expert":
                continue
            n += 1
            local, whole = 1, 1
            for a, b in zip(p["shape"], p.get("global_shape", p["shape"])):
                local, whole = local * a, whole * b
            if local * tp * ep != whole:
                sys.exit(f"FAIL {tag}: {p['name']} holds {local} of {whole} floats a rank, "
                         f"not 1/{tp * ep}")
        if n == 0:
            sys.exit(f"FAIL {tag}: plan.json has no expert tensors")
        if tp > 1:
            comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
            # per layer and direction: attention's and the MoE block's
            if comm.get(("tp", "all_reduce"), 0) < 2 * 2 * 2:
                sys.exit(f"FAIL {tag}: tp collectives {comm}")
    # MoE under dp, tp and ep (routing statistics all-reduced over dp, each expert's
    # MLP split over tp, the experts split over ep consecutive dp ranks, dispatched slots
    # moved to their experts' ranks and back by all-to-all; with a capacity
    # factor, drops decided in global token order): 20 steps and the step-1
    # gradients equal the one-rank trainer's, dropless and at capacity factor 1.0
    # (at capacity 1.0 a change of rounding alone can tip a near tie of two experts
    # and fail a layout here: scripts/moe_route_diff.py tells a tie from a bug)
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    worst = worst_grad = 0.0
    layouts = [(2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 4, 1), (2, 4, 1),
               (1, 2, 2), (1, 4, 2), (1, 4, 4), (2, 2, 2), (2, 4, 4)]
    exes = {}
    ties = []  # capacity 1.0: (tag, moe_route_diff.Routes, loss and gradient differences)
    refs = {}  # the one-rank runs' train_routed (capacity 0: log, None)
    unflipped = []  # capacity 1.0 comparisons (resumes, --init, weights) stopped at a flip
    for cap in ("0.0", "1.0"):
        routed = cap != "0.0"  # a finite capacity: compared tie-aware
        defines = MOE + ["-D", f"capacity={cap}"]
        grads1 = os.path.join(work, f"grads_r1_{cap}.safetensors")
        exes[(1, 1, 1, cap)] = build("moe_tiny", defines, f"r1_{cap}", routes=routed)
        ref_r = train_routed(exes[(1, 1, 1, cap)], *const, "--save-grads", grads1) \
            if routed else (train(exes[(1, 1, 1, cap)], *const, "--save-grads", grads1), None)
        ref, refs[(1, 1, 1, cap)] = ref_r[0], ref_r
        check_moe_log(ref, ref, f"r1_{cap}")
        if cap == "1.0" and not any(l["dropped"] for r in ref for l in r["moe"]):
            sys.exit("FAIL: capacity 1.0 dropped no choice in 20 steps (the test sees no drops)")
        for tp, dp, ep in layouts:
            tag = f"r{tp}x{dp}" + (f"_ep{ep}" if ep > 1 else "") + f"_{cap}"
            flags = ["--tp", str(tp), "--dp", str(dp)] + (["--ep", str(ep)] if ep > 1 else [])
            grads = os.path.join(work, f"grads_{tag}.safetensors")
            exes[(tp, dp, ep, cap)] = exe = build("moe_tiny", defines, tag, flags, routes=routed)
            if routed:
                got_r = train_routed(exe, *const, "--save-grads", grads)
                wl, wg, res = equals_one_rank_ties(tag, got_r, ref_r, grads1, grads, norm=True)
                check_moe_log(got_r[0], ref, tag, step0=res.first != 0)
                ties.append((tag, res, wl, wg))
            else:
                got = train(exe, *const, "--save-grads", grads)
                if len(got) != len(ref):
                    sys.exit(f"FAIL {tag}: {len(got)} steps logged")
                check_moe_log(got, ref, tag)
                wl, wg = equals_one_rank(tag, got, ref, grads1, grads)
                worst, worst_grad = max(worst, wl), max(worst_grad, wg)
            experts_split(tag, tp, ep)
    # the experts' variants split over tp the same way: GELU experts (w1, w2) and a
    # shared SwiGLU expert (its partial sum joining the routed experts' before their
    # one all-reduce) at tp 2 and tp 2 x dp 2 ep 2 equal one rank
    for var, extra in (("gelu", ["-D", "gelu_experts=1"]), ("shared", ["-D", "shared_ffn=32"])):
        defines = MOE + ["-D", "capacity=1.0"] + extra
        grads_v = os.path.join(work, f"grads_{var}_r1.safetensors")
        ref_v = train_routed(build("moe_tiny", defines, f"{var}_r1", routes=True), *const,
                             "--save-grads", grads_v)
        for tp, dp, ep in ((2, 1, 1), (2, 2, 2)):
            tag = f"{var}_r{tp}x{dp}_ep{ep}"
            grads = os.path.join(work, f"grads_{tag}.safetensors")
            exe = build("moe_tiny", defines, tag, ["--tp", str(tp), "--dp", str(dp), "--ep", str(ep)],
                        routes=True)
            got = train_routed(exe, *const, "--save-grads", grads)
            wl, wg, res = equals_one_rank_ties(tag, got, ref_v, grads_v, grads, norm=True)
            check_moe_log(got[0], ref_v[0], tag, step0=res.first != 0)
            ties.append((tag, res, wl, wg))
            experts_split(tag, tp, ep)
    # microbatches are part of a routed model (aux statistics and capacity per
    # microbatch): with microbatches = 2 the one-rank trainer accumulates over two
    # routed halves, and pipelines (pp 2, pp 2 x dp 2, pp 2 x tp 2) and dp 2 with
    # the same microbatches equal it, each microbatch being the same global rows;
    # so do pipelined trainers with experts split over ep (their gradients summed
    # over the ep_dp group, not dp): pp 2 x dp 2 ep 2, pp 2 x tp 2 x dp 2 ep 2, the
    # one-stage pipeline dp 2 ep 2, and at batch 8 pp 2 x dp 4 ep 2 (ep_dp groups of
    # two) and pp 2 x dp 4 ep 4
    worst_pp = worst_pp_grad = 0.0
    worst_ep = worst_ep_grad = 0.0
    mb_layouts = {4: ((2, 1, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1), (1, 1, 2, 1),
                      (2, 1, 2, 2), (2, 2, 2, 2), (1, 1, 2, 2)),
                  8: ((2, 1, 4, 2), (2, 1, 4, 4))}
    for cap in ("0.0", "1.0"):
        for batch, layouts_m in mb_layouts.items():
            defines = MOE + ["-D", f"capacity={cap}", "-D", "microbatches=2", "-D",
                             f"batch={batch}"]
            grads_m = os.path.join(work, f"grads_m2_b{batch}_{cap}.safetensors")
            routed = cap != "0.0"
            exes[("m2", batch, cap)] = build("moe_tiny", defines, f"m2_b{batch}_{cap}",
                                             routes=routed)
            ref_r = train_routed(exes[("m2", batch, cap)], *const, "--save-grads", grads_m) \
                if routed else (train(exes[("m2", batch, cap)], *const, "--save-grads", grads_m),
                                None)
            ref, refs[("m2", batch, cap)] = ref_r[0], ref_r
            if batch == 4:
                one = train(exes[(1, 1, 1, cap)], *const)
                if max(rel(a["loss"], b["loss"]) for a, b in zip(ref, one)) < 1e-6:
                    sys.exit(f"FAIL: capacity {cap}: microbatches = 2 trains the same losses "
                             "as 1 (the one-rank trainer ignores them)")
            for pp, tp, dp, ep in layouts_m:
                tag = f"pp{pp}_tp{tp}_dp{dp}" + (f"_ep{ep}" if ep > 1 else "") + \
                    f"_m2_b{batch}_{cap}"
                grads = os.path.join(work, f"grads_{tag}.safetensors")
                flags = ["--pp", str(pp), "--tp", str(tp), "--dp", str(dp)] + \
                    (["--ep", str(ep), "--target", "cpu"] if ep > 1 else [])
                exes[(pp, tp, dp, ep, batch, cap)] = exe = build("moe_tiny", defines, tag, flags,
                                                                 routes=routed)
                fused_kernels(tag, tag)
                if routed:
                    got_r = train_routed(exe, *const, "--save-grads", grads)
                    wl, wg, res = equals_one_rank_ties(tag, got_r, ref_r, grads_m, grads)
                    check_moe_log(got_r[0], ref, tag, choices=batch * 16 * 2,
                                  step0=res.first != 0)
                    ties.append((tag, res, wl, wg))
                    continue
                got = train(exe, *const, "--save-grads", grads)
                if len(got) != len(ref):
                    sys.exit(f"FAIL {tag}: {len(got)} steps logged")
                check_moe_log(got, ref, tag, choices=batch * 16 * 2)
                # (against one rank with microbatches = 2; losses and gradients only)
                wl, wg = equals_one_rank(tag, got, ref, grads_m, grads, check_norm=False)
                if ep > 1:
                    worst_ep, worst_ep_grad = max(worst_ep, wl), max(worst_ep_grad, wg)
                else:
                    worst_pp, worst_pp_grad = max(worst_pp, wl), max(worst_pp_grad, wg)
    # pipelined expert-parallel checkpoints and weights are whole tensors: 10 steps
    # under pp 2 x dp 4 ep 2 resume on one rank, 10 on one rank resume under
    # pp 2 x dp 4 ep 4, and the weights pp 2 x dp 4 ep 4 saves after 20 steps equal
    # one rank's
    # (capacity 1.0, so tie-aware: the weights are compared where no near tie flipped)
    cap = "1.0"
    ref = refs[("m2", 8, cap)]
    ck = os.path.join(work, "ckpt_pp_ep")
    for what, first, then in (("pp 2 dp 4 ep 2 -> 1x1", (2, 1, 4, 2, 8, cap), ("m2", 8, cap)),
                              ("1x1 -> pp 2 dp 4 ep 4", ("m2", 8, cap), (2, 1, 4, 4, 8, cap))):
        if resumes_like(what, exes[first], exes[then], const, ref, ck, routed=True) is not None:
            unflipped.append(f"resume {what}")
    w1, wp = os.path.join(work, "w_m2.safetensors"), os.path.join(work, "w_pp_ep.safetensors")
    train(exes[("m2", 8, cap)], *const, "--save-weights", w1)
    got = train_routed(exes[(2, 1, 4, 4, 8, cap)], *const, "--save-weights", wp)
    if equals_one_rank_ties("pp 2 dp 4 ep 4", got, ref)[2].first is None:
        e, name = grads_rel_l2(w1, wp)
        if e > 1e-4:
            sys.exit(f"FAIL --save-weights under pp 2 dp 4 ep 4: {name} differs by {e:.2e} "
                     "(relative L2)")
    else:
        unflipped.append("--save-weights under pp 2 dp 4 ep 4")
    # and as 8 MPI processes it gives the bits of 8 threads
    note_pp = "no mpirun: MPI run skipped"
    if mpi_equals_threads("pp 2 dp 4 ep 2", exes[(2, 1, 4, 2, 8, cap)], 8, const):
        note_pp = "mpirun -np 8 equals 8 threads bit for bit (pp 2 dp 4 ep 2)"
    # the GPU pipelined trainer splits experts too (rt_cuda_pipe_step): --target all
    # writes train_cuda.c with the expert regions (built by tests/cuda's
    # cuda/trainer/moe_tiny_pp2_dp2_ep2, run by tests/gpu/check.sh)
    for pp_opts in (["--pp", "2"], []):
        out = os.path.join(work, "gpu_pipe_ep" + "".join(pp_opts))
        r = subprocess.run([parc, os.path.join(src, "examples", "moe_tiny.dsl"), *pp_opts,
                            "--dp", "2", "--ep", "2", "--target", "all", "-o", out, *MOE,
                            "-D", "microbatches=2"], capture_output=True, text=True)
        cu = os.path.join(out, "train_cuda.c")
        text = open(cu).read() if os.path.exists(cu) else ""
        if r.returncode != 0 or r.stderr or ".nexpert = " not in text or \
                ".nexpert = 0," in text:
            sys.exit(f"FAIL: moe_tiny {' '.join(pp_opts)} --dp 2 --ep 2 microbatches 2 "
                     f"--target all: exit {r.returncode}, {r.stderr}")
    # a routed model's microbatches are never defaulted to --pp
    r = subprocess.run([parc, os.path.join(src, "examples", "moe_tiny.dsl"), "--pp", "2",
                        "-o", os.path.join(work, "refused"), *MOE], capture_output=True, text=True)
    if r.returncode != 1 or "microbatches" not in r.stderr or len(r.stderr.splitlines()) != 1:
        sys.exit(f"FAIL: moe_tiny --pp 2 with microbatches = 1: exit {r.returncode}, {r.stderr}")
    # the report counts the expert all-to-alls for ep 2 (after the ep group's small
    # all-reduces, if any): per MoE layer the dispatch and the combine, each way
    # (2 layers: 8)
    import re
    report = open(os.path.join(work, "r1x2_ep2_1.0", "report.txt")).read()
    if not re.search(r"ep group of 2 ranks:\s*\n(\s*all-reduce .*\n)?\s*all-to-all\s+8 x", report):
        sys.exit(f"FAIL: report.txt for dp 2 ep 2 does not count 8 ep all-to-alls:\n{report}")
    # layout-free checkpoints and weights: 10 steps under tp 2 x dp 2, ep 2, then 10
    # under 1x1; 10 under 1x1, then 10 under dp 4 ep 4; the weights one rank saves
    # after 20 steps, as --init, train under dp 4 ep 2 as on one rank
    # (capacity 1.0: tie-aware, the weights compared where no near tie flipped)
    cap = "1.0"
    ref = refs[(1, 1, 1, cap)]
    ck = os.path.join(work, "ckpt")
    for first, then, what in (((2, 2, 2), (1, 1, 1), "tp 2 dp 2 ep 2 -> 1x1"),
                              ((1, 1, 1), (2, 1, 1), "1x1 -> tp 2"),
                              ((2, 1, 1), (1, 1, 1), "tp 2 -> 1x1"),
                              ((1, 1, 1), (1, 4, 4), "1x1 -> dp 4 ep 4")):
        if resumes_like(what, exes[(*first, cap)], exes[(*then, cap)], const, ref, ck,
                        routed=True) is not None:
            unflipped.append(f"resume {what}")
    w1 = os.path.join(work, "w_r1.safetensors")
    train(exes[(1, 1, 1, cap)], *const, "--save-weights", w1)
    a = train_routed(exes[(1, 1, 1, cap)], *const, "--init", w1, "--save-weights", w1 + ".again")
    # and with the experts split over tp and ep (gathered over tp, then over ep)
    for lay, what in (((1, 4, 2), "dp 4 ep 2"), ((2, 2, 2), "tp 2 dp 2 ep 2")):
        w = os.path.join(work, f"w_{'_'.join(map(str, lay))}.safetensors")
        b = train_routed(exes[(*lay, cap)], *const, "--init", w1, "--save-weights", w)
        if equals_one_rank_ties(f"--init under {what}", b, a)[2].first is None:
            e, name = grads_rel_l2(w1 + ".again", w)
            if e > 1e-4:
                sys.exit(f"FAIL --save-weights under {what}: {name} differs by {e:.2e} "
                         "(relative L2)")
        else:
            unflipped.append(f"--init / --save-weights under {what}")
    # the dp 4 ep 2 trainer as 4 MPI processes gives the same bits as 4 threads
    note = "no mpirun: MPI run skipped"
    if mpi_equals_threads("dp 4 ep 2", exes[(1, 4, 2, cap)], 4, const) and \
            mpi_equals_threads("tp 2 dp 2 ep 2", exes[(2, 2, 2, cap)], 4, const):
        note = "mpirun -np 4 equals 4 threads bit for bit (dp 4 ep 2, tp 2 dp 2 ep 2)"
    print(f"moe_tiny at tp x dp 2x1 1x2 2x2 1x4 2x4 and with ep (dp 2 ep 2, dp 4 ep 2, dp 4 "
          f"ep 4, tp 2 dp 2 ep 2, tp 2 dp 4 ep 4), dropless (capacity 1.0: below), equals one "
          f"rank over 20 steps (worst loss difference {worst:.1e}, step-1 gradients "
          f"{worst_grad:.1e} relative L2; each expert split over tp, a rank holding 1/(tp ep) "
          f"of every expert tensor; GELU and shared experts at tp 2, tp 2 dp 2 ep 2 too); "
          f"resumes tp 2 dp 2 ep 2 -> 1x1, 1x1 -> tp 2 -> 1x1 and 1x1 -> dp 4 "
          f"ep 4; --init / --save-weights under dp 4 ep 2 and tp 2 dp 2 ep 2; {note}; "
          f"with microbatches = 2, "
          f"pp 2, pp 2 x dp 2, pp 2 x tp 2 and dp 2 equal one rank (losses {worst_pp:.1e}, "
          f"step-1 gradients {worst_pp_grad:.1e}), and with experts over ep pp 2 x dp 2 ep 2, "
          f"pp 2 x tp 2 x dp 2 ep 2, dp 2 ep 2, pp 2 x dp 4 ep 2 and pp 2 x dp 4 ep 4 "
          f"(losses {worst_ep:.1e}, step-1 gradients {worst_ep_grad:.1e}); checkpoints "
          f"resume pp 2 dp 4 ep 2 -> 1x1 and 1x1 -> pp 2 dp 4 ep 4; --save-weights under "
          f"pp 2 dp 4 ep 4; {note_pp}")
    flips = [f"{t} at step {r.first} ({r.margin} ulp)" for t, r, _, _ in ties if r.first is not None]
    flips += [f"{w} (compared up to the flip)" for w in unflipped]
    print(f"capacity 1.0, tie-aware ({len(ties)} layouts above): step-0 router probabilities "
          f"within {max(r.step0_ulp for _, r, _, _ in ties)} ulp of one rank's (bound "
          f"{ROUTE_ULP}), later steps' before any flip {max(r.ulp for _, r, _, _ in ties)} ulp; "
          f"top-k flips: {', '.join(flips) or 'none'}; before any flip losses "
          f"within {max(l for _, _, l, _ in ties):.1e} relative, step-1 gradients "
          f"{max(g or 0.0 for _, _, _, g in ties):.1e} relative L2 (bound {TIES_TOL:g})")
elif case == "mesh_sp":
    # sequence parallelism: --sp trainers equal the one-rank trainer; a vocabulary
    # tp does not divide is padded (masked logits) and saved unpadded
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    worst = 0.0
    counts = {}
    for model, defines in (("gpt2_tiny", GPT2 + ["-D", "heads=4"]),
                           ("llama_tiny", LLAMA + ["-D", "heads=8", "-D", "kv_heads=4"])):
        ref = train(build(model, defines, model + "_r1"), *const)
        for tp, dp in ((2, 1), (4, 1), (2, 2), (4, 2)):
            name = f"{model}_sp{tp}x{dp}"
            exe = build(model, defines, name, ["--tp", str(tp), "--dp", str(dp), "--sp"])
            got = train(exe, *const)
            if len(got) != len(ref):
                sys.exit(f"FAIL {name}: {len(got)} steps logged")
            for r, g in zip(ref, got):
                worst = max(worst, rel(g["loss"], r["loss"]))
                if rel(g["loss"], r["loss"]) > 1e-4:
                    sys.exit(f"FAIL {name} step {r['step']}: loss {g['loss']}, one rank "
                             f"{r['loss']}")
            plan = json.load(open(os.path.join(work, name, "plan.json")))
            counts[name] = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
            if (tp, dp) == (2, 2):  # every collective traced, the loss's inside gathers too
                tr = os.path.join(work, f"trace_{name}.json")
                train(exe, *const[:-1], "3", "--trace", tr)
                check_comm_trace(tr, plan, 3, tp * dp, f"{name} --trace")
    # GPT-2 --sp at 2x1: per layer a reduce_scatter after attention and after the MLP
    # (plus the embedding's) forward, an all_gather before each column region (plus the
    # head's); backward the adjoints (and the positions' local_slice's all_gather)
    layers = int([d.split("=")[1] for d in GPT2 if d.startswith("layers=")][0])
    c = counts["gpt2_tiny_sp2x1"]
    want = {("tp", "reduce_scatter"): 2 * (2 * layers + 1),
            ("tp", "all_gather"): 2 * (2 * layers + 1) + 1 + 4}  # + wpe, + the loss's two
    # calls, two gathers each (the rows' maxima, then their sums: rt_route.h)
    for key, n in want.items():
        if c.get(key) != n:
            sys.exit(f"FAIL: gpt2 --sp 2x1 plan.json communication {key}: {c.get(key)}, "
                     f"expected {n}")
    # padding: vocab 257 under tp 2 with --pad-vocab 1 (129 rows a rank, one of
    # padding: only what tp needs; case mesh_pad tests the default, 64)
    pad = ["-D", "vocab=257", "--pad-vocab", "1"]
    ref = train(build("gpt2_tiny", GPT2 + ["-D", "heads=4"] + pad, "pad_r1"), *const)
    wfile = os.path.join(work, "pad.safetensors")
    got = train(build("gpt2_tiny", GPT2 + ["-D", "heads=4"] + pad, "pad_tp2", ["--tp", "2"]),
                *const, "--save-weights", wfile)
    for r, g in zip(ref, got):
        worst = max(worst, rel(g["loss"], r["loss"]))
        if rel(g["loss"], r["loss"]) > 1e-4:
            sys.exit(f"FAIL vocab 257 tp 2 step {r['step']}: loss {g['loss']}, one rank "
                     f"{r['loss']}")
    report = open(os.path.join(work, "pad_tp2", "report.txt")).read()
    if "(--pad-vocab 1, --tp 2): 257 -> 258 rows" not in report:
        sys.exit("FAIL: report.txt does not state the vocab padding:\n" + report)
    raw = open(wfile, "rb").read()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    if header["wte.weight"]["shape"] != [257, 32]:
        sys.exit(f"FAIL: saved wte.weight has shape {header['wte.weight']['shape']}, not [257, 32]")
    print(f"--sp: gpt2_tiny and llama_tiny at 2x1 4x1 2x2 4x2 equal one rank over 20 steps; "
          f"vocab 257 at tp 2 equals one rank, saved [257, 32] (worst loss difference "
          f"{worst:.1e}); gpt2 --sp 2x1 communication {sorted(c.items())}")
elif case == "mesh_zero":
    # --zero 1: optimizer state sharded over dp (reduce-scatter, piece update,
    # all-gather), small buckets so that each model has several; GPT-2's d 34
    # makes tensors whose sizes dp 4 does not divide (pieces end in padding).  At
    # tp 2 without dp (dp 1) there is nothing to shard: --zero 1 must write the
    # --tp 2 project byte for byte, and it trains as one rank like the others
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    notes = []
    for model, defines in (("gpt2_tiny", GPT2 + ["-D", "d=34", "-D", "heads=2"]),
                           ("llama_tiny", LLAMA + ["-D", "d=36", "-D", "heads=2",
                                                   "-D", "kv_heads=2", "-D", "ffn=62"])):
        one = build(model, defines, f"{model}_r1")
        grads1 = os.path.join(work, f"grads_{model}_r1.safetensors")
        ref = train(one, *const, "--save-grads", grads1)
        worst = worst_grad = 0.0
        for tp, dp in ((2, 1), (1, 2), (2, 2), (1, 4), (2, 4)):
            name = f"{model}_z{tp}x{dp}"
            flags = ["--tp", str(tp), "--dp", str(dp), "--zero", "1", "--bucket-mb", "0.02"]
            exe = build(model, defines, name, flags)
            grads = os.path.join(work, f"grads_{name}.safetensors")
            got = train(exe, *const, "--save-grads", grads)
            wl, wg = equals_one_rank(f"{model} zero tp {tp} dp {dp}", got, ref, grads1, grads)
            worst, worst_grad = max(worst, wl), max(worst_grad, wg)
            # the state each rank keeps: 1/dp of the one-rank trainer's (plus padding)
            plan = json.load(open(os.path.join(work, name, "plan.json")))
            plan1 = json.load(open(os.path.join(work, f"{model}_r1", "plan.json")))
            s, s1 = plan["cost"]["state_numel"], plan1["cost"]["state_numel"]
            if not s1 / tp / dp <= s <= s1 / dp + 16 * len(plan["state"]):
                sys.exit(f"FAIL {model} zero tp {tp} dp {dp}: {s} state floats per rank, one "
                         f"rank {s1}")
            comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
            if dp == 1:
                # no dp group: the project is the plain --tp 2 one, file for file
                plain = os.path.join(work, f"{model}_t{tp}")
                run([parc, os.path.join(src, "examples", model + ".dsl"), "-o", plain, *defines,
                     "--tp", str(tp), "--dp", "1", "--bucket-mb", "0.02"])
                files = sorted(f for f in os.listdir(plain))
                if files != sorted(f for f in os.listdir(os.path.join(work, name)) if f != "build"):
                    sys.exit(f"FAIL {model} zero tp {tp} dp 1: files {files} differ from --tp {tp}'s")
                for f in files:
                    if open(os.path.join(plain, f), "rb").read() != \
                            open(os.path.join(work, name, f), "rb").read():
                        sys.exit(f"FAIL {model}: --tp {tp} --zero 1 wrote another {f} than --tp {tp}")
                if any(g == "dp" for g, _ in comm):
                    sys.exit(f"FAIL {model} zero tp {tp} dp 1: dp collectives {comm}")
            elif not (1 < comm.get(("dp", "reduce_scatter"), 0) < len(plan["params"])
                      and comm.get(("dp", "all_gather"), 0) > 1):
                sys.exit(f"FAIL {model} zero tp {tp} dp {dp}: dp collectives {comm}")
        # layout-free checkpoints: 10 steps under zero 1 x dp 2, then 10 more on one rank
        ck = os.path.join(work, f"{model}_ckpt")
        resumes_like(f"{model} zero 1x2 -> 1x1",
                     os.path.join(work, f"{model}_z1x2", "build", "train"), one, const, ref, ck)
        # and the other way: saved on one rank, resumed under zero 2x4
        resumes_like(f"{model} 1x1 -> zero 2x4", one,
                     os.path.join(work, f"{model}_z2x4", "build", "train"), const, ref, ck)
        notes.append(f"{model} worst loss difference {worst:.1e}, step-1 gradients "
                     f"{worst_grad:.1e} relative L2")
    # one zero trainer as 4 MPI processes gives the same bits as 4 threads
    note = "no mpirun: MPI run skipped"
    if mpi_equals_threads("zero 1x4", os.path.join(work, "gpt2_tiny_z1x4", "build", "train"),
                          4, const):
        note = "mpirun -np 4 equals 4 threads bit for bit"
    print(f"--zero 1 at 2x1 (the --tp 2 project byte for byte) 1x2 2x2 1x4 2x4 equals one rank "
          f"over 20 steps ({'; '.join(notes)}); zero 1x2 -> 1x1 and 1x1 -> zero 2x4 resume; "
          f"{note}")
elif case == "mesh_zero_ep":
    # --zero 1 with expert parallelism: dense parameters' gradients reduce-scattered
    # over dp and their state in pieces over dp; each expert tensor's gradient
    # reduce-scattered over its ep_dp group (the dp / ep ranks holding the same
    # experts) and its state in pieces over that group (whole on the rank where
    # ep == dp); the norm counts every element once.  Small buckets: several of each.
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    layouts = [(1, 2, 2), (1, 4, 2), (1, 4, 4), (2, 2, 2), (2, 4, 2)]
    worst = worst_grad = 0.0
    exes = {}
    ties, refs = [], {}  # capacity 1.0: compared tie-aware (equals_one_rank_ties)
    for cap in ("0.0", "1.0"):
        routed = cap != "0.0"
        defines = MOE + ["-D", f"capacity={cap}"]
        grads1 = os.path.join(work, f"grads_r1_{cap}.safetensors")
        exes[(1, 1, 1, cap)] = one = build("moe_tiny", defines, f"r1_{cap}", routes=routed)
        refs[cap] = train_routed(one, *const, "--save-grads", grads1) if routed else \
            (train(one, *const, "--save-grads", grads1), None)
        ref = refs[cap][0]
        if cap == "1.0" and not any(l["dropped"] for r in ref for l in r["moe"]):
            sys.exit("FAIL: capacity 1.0 dropped no choice in 20 steps (the test sees no drops)")
        plan1 = json.load(open(os.path.join(work, f"r1_{cap}", "plan.json")))
        nexpert = sum(1 for p in plan1["params"] if p.get("shard") == "expert")
        for tp, dp, ep in layouts:
            tag = f"z_r{tp}x{dp}_ep{ep}_{cap}"
            flags = ["--tp", str(tp), "--dp", str(dp), "--ep", str(ep), "--zero", "1",
                     "--bucket-mb", "0.02"]
            grads = os.path.join(work, f"grads_{tag}.safetensors")
            exes[(tp, dp, ep, cap)] = exe = build("moe_tiny", defines, tag, flags, routes=routed)
            if routed:
                wl, wg, res = equals_one_rank_ties(
                    tag, train_routed(exe, *const, "--save-grads", grads), refs[cap], grads1, grads,
                    norm=True)
                ties.append((tag, res, wl, wg))
            else:
                wl, wg = equals_one_rank(tag, train(exe, *const, "--save-grads", grads), ref,
                                         grads1, grads)
                worst, worst_grad = max(worst, wl), max(worst_grad, wg)
            # the state a rank keeps: every element of the one-rank state is held by one
            # dp rank (dense pieces over dp, expert pieces over ep_dp of the rank's
            # experts), so 1/dp of it over tp 1, plus padding
            plan = json.load(open(os.path.join(work, tag, "plan.json")))
            st, st1 = plan["cost"]["state_numel"], plan1["cost"]["state_numel"]
            if not st1 / tp / dp <= st <= st1 / dp + 16 * len(plan["state"]):
                sys.exit(f"FAIL {tag}: {st} state floats per rank, one rank {st1}")
            comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
            want_e = (nexpert, True) if ep < dp else (0, False)
            if comm.get(("dp", "reduce_scatter"), 0) < 2 or comm.get(("dp", "all_gather"), 0) < 2 \
                    or comm.get(("ep_dp", "reduce_scatter"), 0) != want_e[0] \
                    or (comm.get(("ep_dp", "all_gather"), 0) > 0) != want_e[1] \
                    or comm.get(("ep_dp", "all_reduce"), 0) or comm.get(("ep", "all_reduce"), 0):
                sys.exit(f"FAIL {tag}: collectives {comm}")
    # layout-free checkpoints: 10 steps under zero dp 4 ep 2 (expert pieces over ep_dp)
    # resume on one rank, and 10 on one rank resume under zero tp 2 dp 4 ep 2
    # (capacity 1.0: tie-aware, the checkpoint's tensors compared where no near tie
    # flipped in its 10 steps)
    cap = "1.0"
    ck = os.path.join(work, "ckpt")
    flip = resumes_like("zero dp 4 ep 2 -> 1x1", exes[(1, 4, 2, cap)], exes[(1, 1, 1, cap)],
                        const, refs[cap], ck, routed=True)
    unflipped = [] if flip is None else ["resume zero dp 4 ep 2 -> 1x1"]
    # that checkpoint holds whole tensors: its weights and optimizer state equal the
    # one-rank trainer's after the same 10 steps
    ck1 = os.path.join(work, "ckpt_r1")
    train(exes[(1, 1, 1, cap)], *const[:-1], "10", "--save", ck1)
    for f in ("model.safetensors", "optimizer.safetensors") if flip is None or flip >= 10 else ():
        e, name = grads_rel_l2(os.path.join(ck1, f), os.path.join(ck, f))
        if e > 1e-4:
            sys.exit(f"FAIL checkpoint zero dp 4 ep 2: {f} {name} differs by {e:.2e} "
                     "(relative L2) from one rank's")
    if resumes_like("1x1 -> zero tp 2 dp 4 ep 2", exes[(1, 1, 1, cap)], exes[(2, 4, 2, cap)],
                    const, refs[cap], ck, routed=True) is not None:
        unflipped.append("resume 1x1 -> zero tp 2 dp 4 ep 2")
    note = "no mpirun: MPI run skipped"
    if mpi_equals_threads("zero dp 4 ep 2", exes[(1, 4, 2, cap)], 4, const):
        note = "mpirun -np 4 equals 4 threads bit for bit (zero dp 4 ep 2)"
    flips = [f"{t} at step {r.first} ({r.margin} ulp)" for t, r, _, _ in ties
             if r.first is not None] + [f"{w} (compared up to the flip)" for w in unflipped]
    print(f"--zero 1 with --ep at {', '.join(f'{t}x{d} ep {e}' for t, d, e in layouts)}, "
          f"dropless, equals one rank (worst loss difference {worst:.1e}, step-1 gradients "
          f"{worst_grad:.1e} relative L2); at capacity 1.0 tie-aware: step-0 router "
          f"probabilities within {max(r.step0_ulp for _, r, _, _ in ties)} ulp (bound "
          f"{ROUTE_ULP}), later steps' before any flip {max(r.ulp for _, r, _, _ in ties)} ulp, "
          f"top-k flips: {', '.join(flips) or 'none'}, before any flip losses within "
          f"{max(l for _, _, l, _ in ties):.1e} and step-1 gradients "
          f"{max(g or 0.0 for _, _, _, g in ties):.1e} (bound {TIES_TOL:g}); checkpoints zero "
          f"dp 4 ep 2 -> 1x1 and 1x1 -> zero tp 2 dp 4 ep 2 resume; {note}")
elif case == "mesh_overlap":
    # the dp buckets' collectives run asynchronously (started in backward, waited for
    # where their result is first read); --no-overlap emits the blocking calls.  The
    # same sums in the same order: the two trainers must agree bit for bit.
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    defines = GPT2 + ["-D", "heads=4"]
    notes = []
    for zero in (0, 1):
        kind = "reduce_scatter" if zero else "all_reduce"
        flags = ["--dp", "2", "--bucket-mb", "0.01"] + (["--zero", "1"] if zero else [])
        runs = {}
        for mode, extra in (("async", []), ("blocking", ["--no-overlap"])):
            name = f"ov_{mode}_z{zero}"
            exe = build("gpt2_tiny", defines, name, flags + extra)
            code = open(os.path.join(work, name, "train.c")).read()
            plan = json.load(open(os.path.join(work, name, "plan.json")))
            comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
            buckets = comm.get(("dp", kind), 0)
            starts = code.count(f"rt_comm_{kind}_start(io->dp_group")
            waits = code.count("rt_comm_wait(&dp_req[")
            blocking = code.count(f"rt_comm_{kind}(io->dp_group")
            if buckets < 3:
                sys.exit(f"FAIL {name}: {buckets} dp {kind} buckets, wanted several")
            if plan["dp_overlapped_collectives"] != (buckets if mode == "async" else 0):
                sys.exit(f"FAIL {name}: plan.json dp_overlapped_collectives "
                         f"{plan['dp_overlapped_collectives']}")
            want = (buckets, buckets, 0) if mode == "async" else (0, 0, buckets)
            if (starts, waits, blocking) != want:
                sys.exit(f"FAIL {name}: train.c has {starts} starts, {waits} waits and "
                         f"{blocking} blocking dp {kind} calls; wanted {want}")
            # every wait after the last start: the whole backward pass overlaps
            if mode == "async" and code.index("rt_comm_wait(&dp_req[") < \
                    code.rindex(f"rt_comm_{kind}_start("):
                sys.exit(f"FAIL {name}: a bucket is waited for inside the backward pass")
            # --trace: every collective of the step, the buckets as start + wait
            tr = os.path.join(work, f"trace_{name}.json")
            train(exe, *const[:-1], "3", "--trace", tr)
            check_comm_trace(tr, plan, 3, 2, f"{name} --trace")
            grads = os.path.join(work, f"grads_{name}.safetensors")
            runs[mode] = (exe, train(exe, *const, "--save-grads", grads), grads, plan)
        a, b = runs["async"], runs["blocking"]
        if [(r["loss"], r["grad_norm"]) for r in a[1]] != \
                [(r["loss"], r["grad_norm"]) for r in b[1]] or len(a[1]) != 20:
            sys.exit(f"FAIL zero {zero}: asynchronous losses {[r['loss'] for r in a[1]]} differ "
                     f"from blocking {[r['loss'] for r in b[1]]}")
        if open(a[2], "rb").read() != open(b[2], "rb").read():
            sys.exit(f"FAIL zero {zero}: asynchronous step-1 gradients differ from blocking")
        arena_a, arena_b = a[3]["cost"]["arena_bytes"], b[3]["cost"]["arena_bytes"]
        notes.append(f"{kind} x {buckets}: arena {arena_a} bytes async, {arena_b} blocking")
        # the asynchronous trainer as 2 MPI processes: the same bits as 2 threads
        if mpi_equals_threads(f"zero {zero}", a[0], 2, const, threads=a[1]):
            notes.append("mpirun -np 2 equals 2 threads")
    print(f"dp 2 asynchronous bucket collectives equal blocking ones bit for bit over 20 "
          f"steps ({'; '.join(notes)})")
elif case == "mesh_pp":
    def check_trace(path, exe_dir, steps, tag):
        """train --trace: well-formed Chrome trace JSON; per rank and step one event per
        action of the rank's stage list (train.c's nactions), each (kind, mb, chunk)
        once; compute events (tid 0) of one rank never overlap.  Returns the trace."""
        import re
        try:
            d = json.load(open(path))
        except ValueError as e:
            sys.exit(f"FAIL {tag}: --trace {path} is not JSON: {e}")
        ev = d.get("traceEvents")
        if not isinstance(ev, list) or not ev:
            sys.exit(f"FAIL {tag}: --trace {path} has no traceEvents")
        for e in ev:
            if e.get("ph") not in ("X", "M") or not isinstance(e.get("pid"), int) or \
                    not isinstance(e.get("tid"), int) or not isinstance(e.get("name"), str):
                sys.exit(f"FAIL {tag}: malformed trace event {e}")
            if e["ph"] == "X" and not (e["dur"] >= 0 and e["ts"] >= 0):
                sys.exit(f"FAIL {tag}: trace event with negative time {e}")
        src = open(os.path.join(exe_dir, "train.c")).read()
        m = re.search(r"static const int nactions\[\] = \{([0-9, ]*)\};", src)
        nact = [int(x) for x in m.group(1).split(",")]
        kinds = ("F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD")
        od = d.get("otherData", {})
        pp, tp, dp = od.get("pp"), od.get("tp"), od.get("dp")
        if len(nact) != pp or od.get("ranks") != tp * dp * pp:
            sys.exit(f"FAIL {tag}: trace otherData {od} against train.c's {nact}")
        for rank in range(tp * dp * pp):
            stage = rank // (tp * dp)
            mine = [e for e in ev if e["ph"] == "X" and e["pid"] == rank]
            for step in range(steps):
                acts = [(e["cat"], e["args"]["mb"], e["args"]["chunk"]) for e in mine
                        if e["args"]["step"] == step and e["cat"] in kinds]
                if len(acts) != nact[stage] or len(set(acts)) != len(acts):
                    sys.exit(f"FAIL {tag}: rank {rank} step {step}: {len(acts)} action events "
                             f"({len(set(acts))} distinct), stage {stage} has {nact[stage]}")
            comp = sorted((e for e in mine if e["tid"] == 0), key=lambda e: e["ts"])
            for a, b in zip(comp, comp[1:]):
                if a["ts"] + a["dur"] > b["ts"] + 0.002:  # printed to 0.001 us
                    sys.exit(f"FAIL {tag}: rank {rank}: compute events overlap: {a} {b}")
        return d

    def check_pp_comm(d, plan, steps, tag):
        """plan.json's per-stage communication against what each rank's trace moved a
        step: the pp sends (receives) are the boundary sends (receives) plus the
        shared gradients exchanged, floats for floats; the dp (and ep_dp)
        all-reduces are the accumulated gradients' reduction (a dense model has no
        dp collective inside its chunks)."""
        ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
        od = d["otherData"]
        for rank in range(od["ranks"]):
            st = rank // (od["tp"] * od["dp"])
            mine = {(c["group"], c["kind"]): c for c in plan["communication"]
                    if c.get("stage") == st}
            for step in range(steps):
                f = {}
                for e in ev:
                    if e["pid"] == rank and e["args"]["step"] == step:
                        f[e["cat"]] = f.get(e["cat"], 0) + e["args"].get("floats", 0)
                shared = f.get("shared gradients (pp)", 0)
                sends = f.get("SEND_ACT", 0) + f.get("SEND_GRAD", 0) + shared
                recvs = f.get("RECV_ACT", 0) + f.get("RECV_GRAD", 0) + shared
                grads = f.get("all-reduce gradients (dp)", 0)
                want = [(k, mine.get(k, {}).get("payload_bytes", 0)) for k in
                        (("pp", "send"), ("pp", "recv"))]
                want.append((("dp+ep_dp", "all_reduce"),
                             sum(mine.get((g, "all_reduce"), {}).get("payload_bytes", 0)
                                 for g in ("dp", "ep_dp"))))
                for (k, planned), moved in zip(want, (sends, recvs, grads)):
                    if planned != 4 * moved:
                        sys.exit(f"FAIL {tag}: rank {rank} (stage {st}) step {step}: {k} moved "
                                 f"{moved} floats, plan.json {planned} bytes")
                # a boundary's gradient crosses it once, as one value the size of the
                # activation (the residual stream's two gradient terms are summed on
                # the later stage before they are sent: pp_split.c hoist_grad_sums)
                if f.get("SEND_ACT", 0) != f.get("RECV_GRAD", 0) or \
                        f.get("RECV_ACT", 0) != f.get("SEND_GRAD", 0):
                    sys.exit(f"FAIL {tag}: rank {rank} (stage {st}) step {step}: activations "
                             f"sent/received {f.get('SEND_ACT', 0)}/{f.get('RECV_ACT', 0)} "
                             f"floats, their gradients received/sent "
                             f"{f.get('RECV_GRAD', 0)}/{f.get('SEND_GRAD', 0)}")

    # pipeline parallelism: 4 layers at pp 2 and 4, every schedule, M in {P, 2P}, with
    # tp and dp beside it (tp*dp*pp <= 8), against the one-rank trainer: 20-step
    # losses and step-1 gradients; a checkpoint saved under pp 2 resumed on one rank;
    # one trainer under mpirun
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    only = os.environ.get("PARC_PP_ONLY")  # a substring of a layout's tag, for debugging
    worst = worst_grad = 0.0
    nruns = 0
    pp_dims = ["-D", "layers=4", "-D", "batch=8"]  # 4 stages; 2P = 8 microbatches
    # layouts also built with --no-fuse: fused kernels keep to one chunk and phase
    NOFUSE_TWINS = {(2, "1f1b", 4, 1, 1, 0), (4, "zb", 4, 1, 1, 0),
                    (2, "interleaved", 4, 1, 1, 0), (2, "1f1b", 2, 2, 1, 0)}
    twins = []
    for model, defines in (("gpt2_tiny", GPT2 + pp_dims + ["-D", "heads=4"]),
                           ("llama_tiny", LLAMA + pp_dims)):
        one = build(model, defines, f"{model}_r1")
        grads1 = os.path.join(work, f"{model}_grads_r1.safetensors")
        ref = train(one, *const, "--save-grads", grads1)
        layouts = []
        for pp in (2, 4):
            for sched in ("gpipe", "1f1b", "interleaved", "zb"):
                if sched == "interleaved" and pp == 4:
                    continue  # 4 layers make 4 chunks: no second virtual stage
                for mb in (pp, 2 * pp):
                    layouts.append((pp, sched, mb, 1, 1, 0))
        layouts += [(2, "1f1b", 2, 2, 1, 0), (2, "1f1b", 4, 1, 2, 0), (2, "1f1b", 2, 2, 2, 0),
                    (2, "zb", 4, 2, 2, 0), (2, "interleaved", 2, 2, 1, 0),
                    (4, "gpipe", 4, 2, 1, 0),
                    # sequence parallel inside the stages (the boundary tensor sharded)
                    (2, "1f1b", 2, 2, 1, 1), (2, "zb", 4, 2, 2, 1)]
        for pp, sched, mb, tp, dp, sp in layouts:
            tag = f"{model}_pp{pp}_{sched}_m{mb}_t{tp}_d{dp}" + ("_sp" if sp else "")
            if only and only not in tag:
                continue
            exe = build(model, defines, tag, ["--pp", str(pp), "--schedule", sched,
                                              "--microbatches", str(mb), "--tp", str(tp),
                                              "--dp", str(dp)] + (["--sp"] if sp else []))
            grads = os.path.join(work, f"grads_{tag}.safetensors")
            got = train(exe, *const, "--save-grads", grads)
            nruns += 1
            wl, wg = equals_one_rank(tag, got, ref, grads1, grads)
            worst, worst_grad = max(worst, wl), max(worst_grad, wg)
            nk, nn = fused_kernels(tag, tag)
            if (pp, sched, mb, tp, dp, sp) not in NOFUSE_TWINS:
                continue
            # the same pipeline with one kernel a node: fusion reorders float work
            # (one rank's fused and unfused trainers differ in the last bits too), so
            # as close as the one-rank nofuse case, closer than to one rank
            exe = build(model, defines, tag + "_nofuse",
                        ["--pp", str(pp), "--schedule", sched, "--microbatches", str(mb),
                         "--tp", str(tp), "--dp", str(dp), "--no-fuse"])
            g0 = os.path.join(work, f"grads_{tag}_nofuse.safetensors")
            plain = train(exe, *const, "--save-grads", g0)
            wl = max(rel(a["loss"], b["loss"]) for a, b in zip(got, plain))
            wg = grads_rel_l2(g0, grads)[0]
            if len(plain) != len(got) or wl > 1e-6 or wg > 2e-6:
                sys.exit(f"FAIL {tag}: fused and --no-fuse pipelines differ: losses {wl:.1e} "
                         f"relative, step-1 gradients {wg:.1e} relative L2")
            nk0 = len(json.load(open(os.path.join(work, tag + "_nofuse", "plan.json")))
                      ["kernels"])
            if nk0 < nn:
                sys.exit(f"FAIL {tag}: --no-fuse has {nk0} kernels for {nn} nodes")
            twins.append(f"{tag} {nk}/{nk0} kernels, losses {wl:.0e}, gradients {wg:.0e}")
        if only:
            continue
        # train --trace: a 1F1B and a ZB-H1 (W actions) trainer, 3 steps; one rank: one
        # step event per step
        for tag in (f"{model}_pp4_1f1b_m8_t1_d1", f"{model}_pp2_zb_m4_t2_d2"):
            tr = os.path.join(work, f"trace_{tag}.json")
            train(os.path.join(work, tag, "build", "train"), *const[:-1], "3", "--trace", tr)
            d = check_trace(tr, os.path.join(work, tag), 3, tag)
            check_pp_comm(d, json.load(open(os.path.join(work, tag, "plan.json"))), 3, tag)
        tr = os.path.join(work, f"trace_{model}_r1.json")
        train(one, *const[:-1], "3", "--trace", tr)
        steps1 = [e for e in json.load(open(tr))["traceEvents"] if e.get("cat") == "step"]
        if len(steps1) != 3:
            sys.exit(f"FAIL {model} one rank: --trace has {len(steps1)} step events, not 3")
        # layout-free checkpoints: 10 steps under pp 2 x tp 2, 10 more on one rank
        ck = os.path.join(work, f"{model}_ckpt")
        resumes_like(f"{model} pp 2 x tp 2 -> 1 rank",
                     os.path.join(work, f"{model}_pp2_1f1b_m2_t2_d1", "build", "train"), one,
                     const, ref, ck)
        # and back: 10 steps on one rank, 10 more under pp 4 (each stage keeps its part)
        resumes_like(f"{model} 1 rank -> pp 4", one,
                     os.path.join(work, f"{model}_pp4_1f1b_m4_t1_d1", "build", "train"),
                     const, ref, ck)
        # stage-local parameters: each pp 2 rank allocates its stage's parameters alone,
        # as many floats as the report gives that stage (about half the model's)
        import re
        d2 = os.path.join(work, f"{model}_pp2_1f1b_m2_t1_d1")
        out = run([os.path.join(d2, "build", "train"), "--steps", "1", "--data", data]).stdout
        m = re.search(r"stage parameter buffers \(floats per rank\): ([0-9, ]+)", out)
        whole = int(re.search(r": ([0-9]+) parameters", out).group(1))
        rep = [int(x) for x in re.findall(r"stage \d+: layers [^\n]*?, ([0-9]+) parameters",
                                          open(os.path.join(d2, "report.txt")).read())]
        got = [int(x) for x in m.group(1).split(",")] if m else None
        if not got or got != rep or max(got) > 0.6 * whole:
            sys.exit(f"FAIL {model} pp 2: stage parameter buffers {got}, the report's stages "
                     f"{rep}, the whole model {whole}: want the report's, each about half")
    # one pipelined trainer as 4 MPI processes gives the same bits as 4 threads
    note = "no mpirun: MPI run skipped"
    exe = os.path.join(work, "gpt2_tiny_pp2_1f1b_m2_t2_d1", "build", "train")
    tr = os.path.join(work, "trace_mpi.json")
    if not only and mpi_equals_threads("pp 2 x tp 2", exe, 4, const, extra=["--trace", tr]):
        check_trace(tr, os.path.dirname(os.path.dirname(exe)), 20, "mpirun --trace")
        note = "mpirun -np 4 equals 4 threads bit for bit (pp 2 x tp 2), its --trace merged"
    print(f"--pp: {nruns} layouts (gpt2_tiny, llama_tiny; pp 2, 4; gpipe 1f1b interleaved zb; "
          f"M = P, 2P; with tp, dp) equal one rank over 20 steps (worst loss difference "
          f"{worst:.1e}, step-1 gradients {worst_grad:.1e} relative L2); pp 2 x tp 2 -> 1 rank "
          f"and 1 rank -> pp 4 resume; pp 2 stages hold about half the parameters each; --trace "
          f"well-formed, one event per action; {note}; fused against --no-fuse: "
          f"{'; '.join(twins)}")
elif case == "mesh_pp_zero":
    # --zero 1 in pipelined trainers: after the microbatches each stage reduce-scatters
    # its accumulated gradients in buckets (several parameters of one stage and group a
    # collective, passes/pp_zero.c), its optimizer takes the rank's piece of every
    # gradient it holds, updates it with state in pieces over dp (an expert's over
    # ep_dp) and all-gathers the stage's parameters in buckets that never hold another
    # stage's; small buckets (several per stage); sizes dp 4 does not divide (pieces end
    # in padding)
    import math
    import re

    def grad_buckets(code, P, s):
        """Stage s's reduce-scatter buckets in a generated train.c's pp_grads table:
        {bucket: [(numel, group), ...]} and the rows the stage holds."""
        rows = re.search(r"static const int64_t pp_grads\[\] = \{(.*?)\};", code,
                         re.S).group(1).strip().split("\n")
        buckets, held = {}, []
        for row in rows:
            v = [int(x) for x in row.split("/*")[0].split(",") if x.strip()]
            if len(v) != 2 + 2 * P:
                sys.exit(f"FAIL: pp_grads row {row!r}: {len(v)} values, expected {2 + 2 * P}")
            if v[2 + s] >= 0:
                held.append((v[0], v[1]))
            if v[2 + P + s] >= 0:
                if v[2 + s] < 0:
                    sys.exit(f"FAIL: pp_grads row {row!r}: a bucket on stage {s}, not held")
                buckets.setdefault(v[2 + P + s], []).append((v[0], v[1]))
        return buckets, held

    def check_buckets(tag, code, P, s, dp, cap, ep=1):
        """Stage s's buckets of a trainer with --bucket-mb cap / 2^20: each of one group,
        one of several parameters within cap bytes of pieces (4 z ceil(n / z) each, z dp
        or an expert's dp / ep), every held gradient cut in pieces (z > 1) in one.
        Returns (dp buckets, those gradients)."""
        buckets, held = grad_buckets(code, P, s)
        for b, rows in buckets.items():
            if len({g for _, g in rows}) != 1:
                sys.exit(f"FAIL {tag}: stage {s} bucket {b} mixes groups {rows}")
            z = dp if rows[0][1] == 1 else dp // ep
            if len(rows) > 1 and sum(4 * math.ceil(n / z) * z for n, _ in rows) > cap:
                sys.exit(f"FAIL {tag}: stage {s} bucket {b} {rows} holds more than {cap} bytes")
        held = [r for r in held if (dp if r[1] == 1 else dp // ep) > 1]  # (z 1: no pieces)
        if sum(len(r) for r in buckets.values()) != len(held):
            sys.exit(f"FAIL {tag}: stage {s} holds {len(held)} gradients, its buckets "
                     f"{sum(len(r) for r in buckets.values())}")
        return sum(1 for r in buckets.values() if r[0][1] == 1), len(held)

    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    pp_dims = ["-D", "layers=4", "-D", "batch=8"]
    layouts = [(2, "1f1b", 2, 1, 2), (2, "1f1b", 2, 2, 2), (2, "1f1b", 2, 1, 4),
               (2, "gpipe", 2, 1, 4), (2, "zb", 4, 1, 2), (2, "interleaved", 2, 1, 2),
               (4, "1f1b", 4, 1, 2)]
    worst = worst_grad = worst_w = 0.0
    notes = []
    runs = {}
    for model, defines in (("gpt2_tiny", GPT2 + pp_dims + ["-D", "d=34", "-D", "heads=2"]),
                           ("llama_tiny", LLAMA + pp_dims + ["-D", "d=36", "-D", "heads=2",
                                                             "-D", "kv_heads=2",
                                                             "-D", "ffn=62"])):
        one = build(model, defines, f"{model}_r1")
        grads1 = os.path.join(work, f"{model}_grads_r1.safetensors")
        w1 = os.path.join(work, f"{model}_w_r1.safetensors")
        ref = train(one, *const, "--save-grads", grads1, "--save-weights", w1)
        for pp, sched, mb, tp, dp in layouts:
            tag = f"{model}_pp{pp}_{sched}_m{mb}_t{tp}_d{dp}"
            flags = ["--pp", str(pp), "--schedule", sched, "--microbatches", str(mb),
                     "--tp", str(tp), "--dp", str(dp), "--bucket-mb", "0.01"]
            exe = build(model, defines, tag + "_z", flags + ["--zero", "1"])
            grads = os.path.join(work, f"grads_{tag}_z.safetensors")
            got = train(exe, *const, "--save-grads", grads)
            runs[tag] = (got, grads)
            wl, wg = equals_one_rank(tag + " zero", got, ref, grads1, grads)
            worst, worst_grad = max(worst, wl), max(worst_grad, wg)
            fused_kernels(tag + " zero", tag + "_z")
            if (pp, sched, tp, dp) != (2, "1f1b", 1, 2):
                continue
            # what a rank holds and moves, against the same pipeline without ZeRO: per
            # stage, the state of the stage's parameters / dp (plus padding), and its
            # dp all-gathers (several buckets, none across stages)
            build(model, defines, tag, flags)
            plan_z = [[c for c in json.load(open(os.path.join(work, tag + "_z", "plan.json")))
                       ["communication"] if c.get("stage") == s] for s in range(pp)]
            for s in range(pp):
                rep = {z: open(os.path.join(work, tag + z, "report.txt")).read()
                       for z in ("", "_z")}
                adam = {z: re.findall(r"fp32 +weights .*? adam +([0-9.]+ [KM]?i?B)", r)
                        for z, r in rep.items()}
                code = {z: open(os.path.join(work, tag + z, "train.c")).read()
                       for z in ("", "_z")}
                held = {z: [int(x) for x in re.search(
                    r"static const int64_t pp_state_numel\[\] = \{([0-9, ]+)\}",
                    code[z]).group(1).split(",")] for z in code}
                nstate = code["_z"].count(".exp_avg")
                if not held[""][s] / dp <= held["_z"][s] <= held[""][s] / dp + 16 * nstate:
                    sys.exit(f"FAIL {tag}: stage {s} holds {held['_z'][s]} state floats under "
                             f"--zero 1, {held[''][s]} without (dp {dp})")
                if adam[""] == adam["_z"]:
                    sys.exit(f"FAIL {tag}: the report's optimizer state {adam['_z']} is the "
                             f"--zero 0 trainer's")
                # dp: one reduce-scatter per bucket, several buckets, each of several
                # gradients the stage holds (none reduced whole), the all-gathers, and
                # the global norm's one float
                plan = json.load(open(os.path.join(work, tag + "_z", "plan.json")))
                comm = {(c["group"], c["kind"]): c for c in plan["communication"]
                        if c.get("stage") == s}
                nb, held_grads = check_buckets(tag, code["_z"], pp, s, dp, int(0.01 * 2**20))
                rs = comm.get(("dp", "reduce_scatter"), {}).get("count", 0)
                ag = comm.get(("dp", "all_gather"), {}).get("count", 0)
                ar = comm.get(("dp", "all_reduce"), {})
                if rs != nb or not 2 <= rs < held_grads or not 2 <= ag < held_grads or \
                        (ar.get("count"), ar.get("payload_bytes")) != (1, 4):
                    sys.exit(f"FAIL {tag}: stage {s} holds {held_grads} gradients in {nb} "
                             f"buckets, dp collectives {comm}")
            # train --trace: each rank's reduce-scatters move its stage's gradients, as
            # plan.json counts them, and nothing is all-reduced whole over dp
            tr = os.path.join(work, f"trace_{tag}.json")
            train(exe, *const[:-1], "2", "--trace", tr)
            ev = [e for e in json.load(open(tr))["traceEvents"] if e.get("ph") == "X"]
            for rank in range(pp * tp * dp):
                st = rank // (tp * dp)
                want = sum(c["payload_bytes"] for c in plan_z[st]
                           if c["kind"] == "reduce_scatter" and c["group"] in ("dp", "ep_dp"))
                for step in range(2):
                    mine = [e for e in ev if e["pid"] == rank and e["args"]["step"] == step]
                    got = sum(e["args"].get("floats", 0) for e in mine
                              if e["cat"] == "reduce-scatter gradients (dp)")
                    whole = [e for e in mine if e["cat"] == "all-reduce gradients (dp)"]
                    if 4 * got != want or whole:
                        sys.exit(f"FAIL {tag} --trace: rank {rank} step {step} reduce-scattered "
                                 f"{got} floats, plan.json {want} bytes; {len(whole)} "
                                 "whole all-reduces")
            notes.append(f"{model} stage state {held['_z']} floats a rank under --zero 1, "
                         f"{held['']} without")
        # the bucket size changes the collectives, never a bit (each sum is over the ranks
        # in order): every gradient alone (--bucket-mb of 4 bytes) and one bucket per
        # stage (1000 MiB) give the 0.01 MiB trainer's losses, grad norms and step-1
        # gradients exactly, at pp 2 x dp 2 and pp 2 x dp 4
        for pp, sched, mb, tp, dp in ((2, "1f1b", 2, 1, 2), (2, "1f1b", 2, 1, 4)):
            tag = f"{model}_pp{pp}_{sched}_m{mb}_t{tp}_d{dp}"
            for mib, cap in (("0.000001", 4), ("1000", 1000 * 2**20)):
                btag = f"{tag}_b{mib}"
                exe = build(model, defines, btag, ["--pp", str(pp), "--schedule", sched,
                                                   "--microbatches", str(mb), "--tp", str(tp),
                                                   "--dp", str(dp), "--zero", "1",
                                                   "--bucket-mb", mib])
                grads = os.path.join(work, f"grads_{btag}.safetensors")
                got = train(exe, *const, "--save-grads", grads)
                want, want_grads = runs[tag]
                same = [(g["loss"], g["grad_norm"]) for g in got] == \
                    [(g["loss"], g["grad_norm"]) for g in want]
                if not same or open(grads, "rb").read() != open(want_grads, "rb").read():
                    sys.exit(f"FAIL {btag}: losses or gradients differ from --bucket-mb "
                             f"0.01's (same {same})")
                code = open(os.path.join(work, btag, "train.c")).read()
                plan = json.load(open(os.path.join(work, btag, "plan.json")))
                for s in range(pp):
                    nb, held_grads = check_buckets(btag, code, pp, s, dp, cap)
                    rs = sum(c["count"] for c in plan["communication"] if c.get("stage") == s
                             and (c["group"], c["kind"]) == ("dp", "reduce_scatter"))
                    if rs != nb or nb != (held_grads if cap == 4 else 1):
                        sys.exit(f"FAIL {btag}: stage {s} holds {held_grads} gradients, "
                                 f"{nb} buckets, {rs} dp reduce-scatters in plan.json")
        # layout-free checkpoints: 10 steps under pp 2 x dp 2 zero, 10 more on one rank;
        # 10 on one rank, 10 more under pp 2 x tp 2 x dp 2 zero
        ck = os.path.join(work, f"{model}_ckpt")
        z22 = os.path.join(work, f"{model}_pp2_1f1b_m2_t1_d2_z", "build", "train")
        z222 = os.path.join(work, f"{model}_pp2_1f1b_m2_t2_d2_z", "build", "train")
        resumes_like(f"{model} pp 2 x dp 2 zero -> 1 rank", z22, one, const, ref, ck)
        resumes_like(f"{model} 1 rank -> pp 2 x tp 2 x dp 2 zero", one, z222, const, ref, ck)
        # the weights after 20 steps (gathered over pp and dp) equal one rank's to
        # float rounding: 1e-3 relative L2 (AdamW's steps on the near-zero biases
        # amplify it: the --zero 0 pipeline of this layout is 4e-4 from one rank)
        wz = os.path.join(work, f"{model}_w_z.safetensors")
        train(os.path.join(work, f"{model}_pp2_1f1b_m2_t1_d4_z", "build", "train"), *const,
              "--save-weights", wz)
        e, name = grads_rel_l2(w1, wz)
        worst_w = max(worst_w, e)
        if e > 1e-3:
            sys.exit(f"FAIL {model} --save-weights under pp 2 x dp 4 zero: {name} differs by "
                     f"{e:.2e} (relative L2) from one rank's")
    # SGD with momentum (its momentum_buffer in pieces): gpt2_tiny at pp 2 x dp 2
    sgd = os.path.join(work, "gpt2_sgd.dsl")
    text = open(os.path.join(src, "examples", "gpt2_tiny.dsl")).read()
    adamw = "optimizer = adamw(beta1 = 0.9, beta2 = 0.95, wd = 0.1)"
    if adamw not in text:
        sys.exit("FAIL: examples/gpt2_tiny.dsl's optimizer line changed; update this test")
    open(sgd, "w").write(text.replace(adamw, "optimizer = sgd(momentum = 0.9, wd = 0.1)"))
    defines = GPT2 + pp_dims + ["-D", "d=34", "-D", "heads=2"]
    one = build("gpt2_sgd", defines, "sgd_r1", path=sgd)
    gs1 = os.path.join(work, "sgd_grads_r1.safetensors")
    ref = train(one, *const, "--save-grads", gs1)
    exe = build("gpt2_sgd", defines, "sgd_pp2_d2_z", ["--pp", "2", "--dp", "2", "--zero", "1",
                                                      "--bucket-mb", "0.01"], path=sgd)
    if "momentum_buffer" not in open(os.path.join(work, "sgd_pp2_d2_z", "train.c")).read():
        sys.exit("FAIL: the SGD trainer keeps no momentum buffer")
    gs = os.path.join(work, "sgd_grads_z.safetensors")
    wl, wg = equals_one_rank("sgd pp 2 x dp 2 zero", train(exe, *const, "--save-grads", gs), ref,
                             gs1, gs)
    worst, worst_grad = max(worst, wl), max(worst_grad, wg)
    # MoE (microbatches 2, dropless): the one-stage pipeline at dp 2, pp 2 x dp 2, and
    # experts over ep (their pieces over ep_dp; whole where ep == dp)
    defines = MOE + ["-D", "capacity=0.0", "-D", "microbatches=2", "-D", "batch=8"]
    m2 = build("moe_tiny", defines, "moe_m2")
    gm = os.path.join(work, "moe_grads_m2.safetensors")
    ref = train(m2, *const, "--save-grads", gm)
    for pp, tp, dp, ep in ((1, 1, 2, 1), (2, 1, 2, 1), (2, 1, 4, 2), (2, 2, 2, 2)):
        tag = f"moe_pp{pp}_t{tp}_d{dp}_ep{ep}_z"
        exe = build("moe_tiny", defines, tag, ["--pp", str(pp), "--tp", str(tp), "--dp",
                                               str(dp), "--ep", str(ep), "--zero", "1",
                                               "--target", "cpu", "--bucket-mb", "0.01"])
        grads = os.path.join(work, f"grads_{tag}.safetensors")
        got = train(exe, *const, "--save-grads", grads)
        wl, wg = equals_one_rank(tag, got, ref, gm, grads)
        worst, worst_grad = max(worst, wl), max(worst_grad, wg)
        fused_kernels(tag, tag)
        if (pp, tp, dp, ep) != (2, 1, 4, 2):
            continue
        # the experts' pieces over ep_dp in buckets of their own: 0.01 MiB gives several
        # of each group a stage, 1000 MiB one dp and one ep_dp bucket a stage, with the
        # same losses and gradients bit for bit
        one_each = build("moe_tiny", defines, tag + "_b1000",
                         ["--pp", "2", "--dp", "4", "--ep", "2", "--zero", "1", "--target",
                          "cpu", "--bucket-mb", "1000"])
        grads_b = os.path.join(work, f"grads_{tag}_b1000.safetensors")
        got_b = train(one_each, *const, "--save-grads", grads_b)
        if [(g["loss"], g["grad_norm"]) for g in got_b] != \
                [(g["loss"], g["grad_norm"]) for g in got] or \
                open(grads_b, "rb").read() != open(grads, "rb").read():
            sys.exit(f"FAIL {tag}: --bucket-mb 1000 differs from 0.01")
        for btag, cap in ((tag, int(0.01 * 2**20)), (tag + "_b1000", 1000 * 2**20)):
            code = open(os.path.join(work, btag, "train.c")).read()
            plan = json.load(open(os.path.join(work, btag, "plan.json")))
            for s in range(2):
                check_buckets(btag, code, 2, s, 4, cap, ep=2)
                buckets, _ = grad_buckets(code, 2, s)
                n = {g: sum(1 for r in buckets.values() if r[0][1] == g) for g in (1, 3)}
                rs = {g: sum(c["count"] for c in plan["communication"] if c.get("stage") == s
                             and (c["group"], c["kind"]) == (g, "reduce_scatter"))
                      for g in ("dp", "ep_dp")}
                if (rs["dp"], rs["ep_dp"]) != (n[1], n[3]) or \
                        (cap > 2**20 and (n[1], n[3]) != (1, 1)) or \
                        (cap < 2**20 and min(n.values()) < 2):
                    sys.exit(f"FAIL {btag}: stage {s} buckets {n}, reduce-scatters {rs}")
    note = "no mpirun: MPI run skipped"
    if mpi_equals_threads("gpt2 pp 2 x dp 2 zero", os.path.join(
            work, "gpt2_tiny_pp2_1f1b_m2_t1_d2_z", "build", "train"), 4, const):
        note = "mpirun -np 4 equals 4 threads bit for bit (pp 2 x dp 2 zero)"
    print(f"--zero 1 in pipelines: {2 * len(layouts)} gpt2/llama layouts, SGD at pp 2 x dp 2 "
          f"and 4 MoE layouts equal "
          f"one rank (worst loss difference {worst:.1e}, step-1 gradients {worst_grad:.1e} "
          f"relative L2); {'; '.join(notes)}; checkpoints pp 2 x dp 2 zero -> 1 and 1 -> "
          f"pp 2 x tp 2 x dp 2 zero resume; --save-weights within {worst_w:.1e} of one rank's; "
          f"{note}")
elif case == "mesh_moe_ties":
    # Capacity 1.0 with microbatches under dp, ep and --zero 1 against one rank, tie
    # aware (equals_one_rank_ties, ROUTE_ULP): the losses one rank's to TIES_TOL up to
    # the first top-k flip, which must be a near tie
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    defines = MOE + ["-D", "capacity=1.0", "-D", "microbatches=2", "-D", "batch=8"]
    one = build("moe_tiny", defines, "r1", routes=True)
    grads1 = os.path.join(work, "grads_r1.safetensors")
    ref = train_routed(one, *const, "--save-grads", grads1)
    if not any(l["dropped"] for r in ref[0] for l in r["moe"]):
        sys.exit("FAIL: capacity 1.0 dropped no choice in 20 steps (the test sees no drops)")
    notes, worst, worst_grad, worst_ulp = [], 0.0, 0.0, 0
    for tag, flags in (("dp2", ["--dp", "2"]), ("dp2_ep2", ["--dp", "2", "--ep", "2"]),
                       ("dp2_z", ["--dp", "2", "--zero", "1", "--bucket-mb", "0.01"]),
                       ("dp2_ep2_z", ["--dp", "2", "--ep", "2", "--zero", "1",
                                      "--bucket-mb", "0.01"])):
        exe = build("moe_tiny", defines, tag, flags + ["--target", "cpu"], routes=True)
        grads = os.path.join(work, f"grads_{tag}.safetensors")
        got = train_routed(exe, *const, "--save-grads", grads)
        wl, wg, res = equals_one_rank_ties(tag, got, ref, grads1, grads)
        worst, worst_grad = max(worst, wl), max(worst_grad, wg or 0.0)
        worst_ulp = max(worst_ulp, res.step0_ulp)
        notes.append(f"{tag} no flip" if res.first is None else
                     f"{tag} a near tie flips at step {res.first}")
    # the check can fail: a trainer that drops differently (dropless) routes layer 1's
    # rows on other inputs from step 0
    dropless = build("moe_tiny", MOE + ["-D", "capacity=0.0", "-D", "microbatches=2", "-D",
                                        "batch=8"], "r1_dropless", routes=True)
    res = moe_route_diff.compare(ref[1], train_routed(dropless, *const)[1], ROUTE_ULP,
                                 say=lambda line: None)
    if not res.bad or "ulp apart" not in res.bad:
        sys.exit(f"FAIL: the route check passes capacity 0 against capacity 1.0: {res.bad}")
    # and the tie-aware comparison can fail (wrong logs and dumps fed to it; dumps count
    # steps from 1, the log from 0): against the last layout's run (dp 2 ep 2 --zero 1)
    def mutated(step, row=0, probs=None, choice=None, drop=False):
        """dp 2 ep 2 --zero 1's dump with row (layer 0, microbatch 0) of log step `step` given
        other probabilities and choices (or removed)."""
        routes = dict(got[1])
        k = (step + 1, 0, 0, row)
        p, i = routes.pop(k)
        if not drop:
            routes[k] = (probs or p, choice or i)
        return routes
    def loss_moved(rows, step, by):
        return [dict(r, loss=r["loss"] * (1 + by)) if r["step"] == step else r for r in rows]
    def verdict(rows, routes):
        return ties_verdict((rows, routes), ref, grads1, grads, TIES_TOL)
    p, i = got[1][(4, 0, 0, 0)]
    rest = sorted((e for e in range(len(p)) if e not in i), key=lambda e: -p[e])
    far = [rest[-1]] + i[1:]  # the row's least likely expert for its first choice
    def tied(gap):
        """(the dump, one rank's) with that row's probabilities p on both but expert
        rest[0] `gap` ulp below i[0], and the choice swapped on the layout."""
        tie = list(p)
        tie[rest[0]] = struct.unpack("<f", struct.pack("<i", struct.unpack(
            "<i", struct.pack("<f", p[i[0]]))[0] - gap))[0]
        ref_tie = dict(ref[1])
        ref_tie[(4, 0, 0, 0)] = (tie, ref[1][(4, 0, 0, 0)][1])
        return mutated(3, probs=tie, choice=[rest[0]] + i[1:]), ref_tie
    cases = [("a loss 1e-5 off at step 2", verdict(loss_moved(got[0], 2, 1e-5), got[1]),
              "loss"),
             ("a flip at a large margin at step 3", verdict(got[0], mutated(3, choice=far)),
              "margin"),
             ("a row not routed at step 3", verdict(got[0], mutated(3, drop=True)),
              "routed on one layout only"),
             ("step 0's probabilities 100 ulp off", verdict(got[0], mutated(
                 0, probs=[x * (1 + 100 * 2 ** -23) for x in got[1][(1, 0, 0, 0)][0]])),
              "ulp apart"),
             (f"a flip at a margin of {2 * ROUTE_ULP + 1} ulp at step 3", ties_verdict(
                 (got[0], tied(2 * ROUTE_ULP + 1)[0]), (ref[0], tied(2 * ROUTE_ULP + 1)[1]),
                 grads1, grads, TIES_TOL), "margin")]
    for what, (bad, *_), want in cases:
        if not bad or want not in bad:
            sys.exit(f"FAIL: the tie-aware check passes {what}: {bad}")
    # a near tie flipped at step 3 stops the comparison there: a loss 1e-5 off at
    # step 10 passes (a tie 2 ROUTE_ULP apart), one at step 2 does not
    late = ties_verdict((loss_moved(got[0], 10, 1e-5), tied(2 * ROUTE_ULP)[0]),
                        (ref[0], tied(2 * ROUTE_ULP)[1]), grads1, grads, TIES_TOL)
    early = ties_verdict((loss_moved(got[0], 2, 1e-5), tied(1)[0]), (ref[0], tied(1)[1]),
                         grads1, grads, TIES_TOL)
    if late[0] or late[3].first != 3 or not early[0] or "loss" not in early[0]:
        sys.exit(f"FAIL: a near tie ({2 * ROUTE_ULP} ulp) flipped at step 3: {late[0]}, first "
                 f"flip {late[3].first}; a loss off at step 2: {early[0]}")
    print(f"moe_tiny capacity 1.0, batch 8, microbatches 2 ({'; '.join(notes)}): losses "
          f"within {worst:.1e} of one rank's up to any flip, step-1 gradients {worst_grad:.1e} "
          f"relative L2; step-0 router probabilities within {worst_ulp} ulp (bound "
          f"{ROUTE_ULP}); capacity 0 vs 1.0 rejected ({res.bad}); so are "
          f"{', '.join(c[0] for c in cases)}; a near tie flipped at step 3 stops the "
          f"comparison there")
elif case == "mesh_pad":
    # --pad-vocab (default 64): vocab 257 padded to a multiple of 64 * tp rows, at tp 1
    # too; every trainer equals the unpadded one-rank trainer (--pad-vocab 1)
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    pad = ["-D", "vocab=257"]

    def st_header(path):
        raw = open(path, "rb").read()
        return json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])

    def shapes(path):
        return {k: v["shape"] for k, v in st_header(path).items() if k != "__metadata__"}

    notes = []
    # a model reading the vocabulary dimension whole (a z-loss over the logits): the
    # default padding is dropped, so its trainer is exactly the --pad-vocab 1 one
    zsrc = open(os.path.join(src, "examples", "gpt2_tiny.dsl")).read().replace(
        "  loss = cross_entropy(logits, targets)",
        "  z = logsumexp(logits)\n  add_loss(mean(mean(sum(z * z, -1), 1), 0), 0.0001)\n"
        "  loss = cross_entropy(logits, targets)")
    zdsl = os.path.join(work, "gpt2_tiny_zloss.dsl")
    open(zdsl, "w").write(zsrc)
    gen = {}
    for tag, flags in (("default", []), ("pad1", ["--pad-vocab", "1"])):
        d = os.path.join(work, "zloss_" + tag)
        run([parc, zdsl, "-o", d, "--target", "cpu", *pad, *flags])
        gen[tag] = (open(os.path.join(d, "train.c")).read(),
                    open(os.path.join(d, "report.txt")).read())
    if gen["default"][0] != gen["pad1"][0] or "the default --pad-vocab was dropped" not in \
            gen["default"][1]:
        sys.exit("FAIL: a z-loss over the logits at the default --pad-vocab: train.c differs "
                 "from --pad-vocab 1's, or the report does not say the padding was dropped")
    for model, defines, table in (("gpt2_tiny", GPT2 + ["-D", "heads=4"] + pad, "wte.weight"),
                                  ("llama_tiny", LLAMA + pad, "lm_head.weight")):
        def out(name):
            return os.path.join(work, f"{model}_{name}.safetensors")
        one = build(model, defines, f"{model}_r1_nopad", ["--pad-vocab", "1"])
        ref = train(one, *const, "--save-grads", out("g_nopad"), "--save-weights", out("w_nopad"))
        # the one-rank trainer with the padded table: the same model, to 1e-6 relative
        padded = build(model, defines, f"{model}_r1_pad")
        train_c = open(os.path.join(work, f"{model}_r1_pad", "train.c")).read()
        if f'{{"{table}", 2, {{320, 32}}' not in train_c:
            sys.exit(f"FAIL {model}: the one-rank trainer's {table} is not [320, 32]")
        report = open(os.path.join(work, f"{model}_r1_pad", "report.txt")).read()
        if "(--pad-vocab 64, --tp 1): 257 -> 320 rows" not in report:
            sys.exit(f"FAIL {model}: report.txt does not state the padding:\n{report}")
        plan = json.load(open(os.path.join(work, f"{model}_r1_pad", "plan.json")))
        pt = [p for p in plan["params"] if p["name"] == table]
        if (plan["cost"].get("vocab"), plan["cost"].get("padded_vocab")) != (257, 320) or \
                not pt or pt[0]["shape"] != [320, 32] or pt[0].get("global_shape") != [257, 32]:
            sys.exit(f"FAIL {model}: plan.json cost {plan['cost']}, {table} {pt}")
        got = train(padded, *const, "--save-grads", out("g_pad"), "--save-weights", out("w_pad"))
        wl = max(rel(g["loss"], r["loss"]) for g, r in zip(got, ref))
        if len(got) != len(ref) or wl > 1e-6:
            sys.exit(f"FAIL {model} padded one rank: losses differ by {wl:.1e} (relative) from "
                     f"the unpadded trainer's")
        wg, name = grads_rel_l2(out("g_nopad"), out("g_pad"))
        if wg > 1e-6:
            sys.exit(f"FAIL {model} padded one rank: step-1 gradient of {name} differs by "
                     f"{wg:.1e}")
        for kind in ("g", "w"):
            if shapes(out(kind + "_pad")) != shapes(out(kind + "_nopad")):
                sys.exit(f"FAIL {model}: padded {kind} file shapes {shapes(out(kind + '_pad'))}")
        if shapes(out("w_pad"))[table] != [257, 32]:
            sys.exit(f"FAIL {model}: saved {table} is {shapes(out('w_pad'))[table]}")
        note = f"{model}: one rank padded 257 -> 320 equals unpadded (losses {wl:.1e}, " \
               f"gradients {wg:.1e}"
        if model == "gpt2_tiny":
            # tp 2 (384 rows, 192 a rank), tp 2 x dp 2, pp 2 (tp 1, padded), pp 2 x tp 2
            worst = worst_grad = 0.0
            for tag, flags in (("tp2", ["--tp", "2"]), ("tp2dp2", ["--tp", "2", "--dp", "2"]),
                               ("dp2zero", ["--dp", "2", "--zero", "1"]),
                               ("pp2", ["--pp", "2"]), ("pp2tp2", ["--pp", "2", "--tp", "2"])):
                exe = build(model, defines, f"{model}_{tag}", flags)
                got = train(exe, *const, "--save-grads", out("g_" + tag))
                a, b = equals_one_rank(f"{model} pad {tag}", got, ref, out("g_nopad"),
                                       out("g_" + tag))
                worst, worst_grad = max(worst, a), max(worst_grad, b)
            if "(--pad-vocab 64, --tp 2): 257 -> 384 rows" not in \
                    open(os.path.join(work, f"{model}_tp2", "report.txt")).read():
                sys.exit("FAIL: the tp 2 report does not pad to 384 rows")
            # pp 2: each stage allocates its parameters with the padded rows, as many floats
            # as the report's pipeline section gives that stage (its per-rank lines too)
            import re
            d2 = os.path.join(work, f"{model}_pp2")
            run_out = run([os.path.join(d2, "build", "train"), "--steps", "1", "--data",
                           data]).stdout
            m = re.search(r"stage parameter buffers \(floats per rank\): ([0-9, ]+)", run_out)
            rep = open(os.path.join(d2, "report.txt")).read()
            pipe = [int(x) for x in re.findall(r"stage \d+: layers [^\n]*?, ([0-9]+) parameters",
                                               rep)]
            per_rank = [int(x) for x in re.findall(r"stage \d+, layers [^\n]*?per rank: ([0-9]+) "
                                                   r"parameters", rep)]
            got = [int(x) for x in m.group(1).split(",")] if m else None
            if not got or got != pipe or got != per_rank:
                sys.exit(f"FAIL {model} pp 2 padded: stage parameter buffers {got}, the report's "
                         f"pipeline stages {pipe}, its per-rank stages {per_rank}")
            # checkpoints hold the true shapes: padded -> unpadded and back, tp 2 -> one rank
            ck = os.path.join(work, "ckpt")
            tp2 = os.path.join(work, f"{model}_tp2", "build", "train")
            pp2 = os.path.join(work, f"{model}_pp2", "build", "train")
            zero = os.path.join(work, f"{model}_dp2zero", "build", "train")
            for first, then, what in ((padded, one, "padded -> unpadded"),
                                      (one, padded, "unpadded -> padded"),
                                      (tp2, one, "tp 2 padded -> unpadded one rank"),
                                      (zero, one, "dp 2 --zero 1 padded -> unpadded one rank"),
                                      (one, pp2, "unpadded -> pp 2 padded")):
                resumes_like(f"{model} {what}", first, then, const, ref, ck)
            note += f"; tp 2, tp 2 x dp 2, dp 2 --zero 1, pp 2, pp 2 x tp 2 equal it (losses " \
                    f"{worst:.1e}, gradients {worst_grad:.1e}); checkpoints resume padded <-> " \
                    f"unpadded, tp 2 -> 1, dp 2 zero -> 1, 1 -> pp 2"
        notes.append(note + ")")
    print("; ".join(notes))
elif case.startswith("mesh_"):
    # heads and KV heads divisible by 4, so tp can be 4
    if case == "mesh_gpt2":
        model, defines = "gpt2_tiny", GPT2 + ["-D", "heads=4"]
    else:
        model, defines = "llama_tiny", LLAMA + ["-D", "heads=8", "-D", "kv_heads=4"]
    data = data_file()
    const = ["--data", data, "--lr", "3e-3", "--steps", "20"]
    one = build(model, defines, "r1")
    grads1 = os.path.join(work, "grads_r1.safetensors")
    ref = train(one, *const, "--save-grads", grads1)
    worst = worst_grad = 0.0
    # every tp, dp in {1, 2, 4} with tp*dp <= 8, with --sp on and off and --zero 1 on
    # and off; --sp with tp 1 and --zero 1 with dp 1 build the same trainer as without
    # (a no-op by definition), so those are not built twice
    runs = []
    for tp, dp in ((2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (1, 4), (2, 4)):
        for sp in ((0, 1) if tp > 1 else (0,)):
            for zero in ((0, 1) if dp > 1 else (0,)):
                runs.append((tp, dp, sp, zero))
    for tp, dp, sp, zero in runs:
        tag = f"r{tp}x{dp}" + ("_sp" if sp else "") + ("_zero" if zero else "")
        flags = ["--tp", str(tp), "--dp", str(dp)] + (["--sp"] if sp else []) + \
            (["--zero", "1"] if zero else [])
        exe = build(model, defines, tag, flags)
        grads = os.path.join(work, f"grads_{tag}.safetensors")
        got = train(exe, *const, "--save-grads", grads)
        # step-1 gradients, gathered to whole tensors, against the one-rank trainer's
        wl, wg = equals_one_rank(" ".join(flags), got, ref, grads1, grads)
        worst, worst_grad = max(worst, wl), max(worst_grad, wg)
    # the communication plan.json reports for 2x2: per layer one tp all-reduce after
    # attention and one after the MLP, each way, plus the vocab-parallel embedding
    # (forward) and head input (backward), plus the optimizer's norm; one dp
    # all-reduce per gradient bucket (passes/dp_grads.c): 25 MiB, so one here
    plan = json.load(open(os.path.join(work, "r2x2", "plan.json")))
    comm = {(c["group"], c["kind"]): c["count"] for c in plan["communication"]}
    layers = int([d.split("=")[1] for d in defines if d.startswith("layers=")][0])
    want = {("tp", "all_reduce"): 4 * layers + 3, ("dp", "all_reduce"): 1}
    for key, n in want.items():
        if comm.get(key) != n:
            sys.exit(f"FAIL: plan.json communication {key}: {comm.get(key)}, expected {n}")
    # layout-free checkpoints: 10 steps under 2x2 (plain, and --sp --zero 1), then 10
    # more under 1x1; 10 under 1x1, then 10 under 2x4 --sp --zero 1
    ck = os.path.join(work, "ckpt")
    exe22 = os.path.join(work, "r2x2", "build", "train")
    exe22sz = os.path.join(work, "r2x2_sp_zero", "build", "train")
    exe24sz = os.path.join(work, "r2x4_sp_zero", "build", "train")
    for first, then, what in ((exe22, one, "2x2 -> 1x1"),
                              (exe22sz, one, "2x2 --sp --zero 1 -> 1x1"),
                              (one, exe24sz, "1x1 -> 2x4 --sp --zero 1")):
        resumes_like(what, first, then, const, ref, ck)
    # the same 2x2 trainers as 4 MPI processes give the same bits as 4 threads
    note = "no mpirun: MPI runs skipped"
    if all([mpi_equals_threads(f"{model} 2x2", exe22, 4, const),
            mpi_equals_threads(f"{model} 2x2 --sp --zero 1", exe22sz, 4, const)]):
        note = "mpirun -np 4 equals 4 threads bit for bit (2x2, and 2x2 --sp --zero 1)"
    print(f"{model}: {len(runs)} layouts (tp x dp in 2x1 4x1 1x2 2x2 4x2 1x4 2x4, with and "
          f"without --sp and --zero 1) equal one rank over 20 steps "
          f"(worst loss difference {worst:.1e}, step-1 gradients {worst_grad:.1e} relative "
          f"L2); resumes 2x2 -> 1x1, 2x2 sp zero -> 1x1, 1x1 -> 2x4 sp zero; {note}")
else:
    sys.exit("unknown case " + case)
print("1 passed, 0 failed")
