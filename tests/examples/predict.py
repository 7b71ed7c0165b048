#!/usr/bin/env python3
"""The predicted step time follows its model (codegen/step_model.h,
codegen/report.h cg_predict_step) on machines made up to isolate each part.

usage: predict.py PARC EXAMPLES_DIR WORK_DIR

- GEMM and attention FLOPs: with memory and calls free, gemm_s * rate is the
  forward matmul FLOPs x 3 (cost.c's flops_per_step less its attention) and
  attention_s * rate is the attention forward, halved (causal), x 3.5
  (forward + a 2.5x backward); doubling the GEMM rate halves gemm_s only.
- calls: with every rate unbounded, the step is calls x kernel_s.
- communication: each plan.json collective at its bytes over the link its
  group spans (tp 2 within a node of 2 ranks, dp between nodes) plus the
  latency; the dp part hidden behind the backward only without --no-overlap;
  in bf16, the GPU trainer's all-reduces of sums it stores as bf16 as a
  reduce-scatter and an all-gather, and its all-gathers of bf16 values at 2
  bytes an element; the loss's gathers it does not run, the loss computed in
  its gradient's call (gpu_communication, from train_cuda.c).
- the parts add up to the total; MFU is the model FLOPs a rank over the total
  and the peak; bf16 models use the bf16 rates, move 2 bytes an element of
  the values the GPU trainer stores as bf16 and copy the GEMM operands it
  converts; the pipeline simulation runs by its chunks' kernels (bf16 stores
  there too: fewer bytes than --bf16-store off, and a GPU arena a stage
  smaller than train.c's), then the optimizer.
"""
import json, os, re, subprocess, sys

parc, examples, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
BIG = 1e30
B, H, T, HD, LAYERS = 4, 4, 64, 16, 4  # gpt2_tiny: batch 4, heads 4, seq 64, d 64, 4 layers


def machine(name, **kw):
    m = {"name": name, "peak_flops": 1e12, "gemm_flops": BIG, "attention_flops": BIG,
         "memory_bytes_per_s": BIG, "kernel_s": 0, "intra_node_bytes_per_s": BIG,
         "inter_node_bytes_per_s": BIG, "latency_s": 0, "ranks_per_node": 8}
    m.update(kw)
    path = os.path.join(work, name + ".json")
    json.dump(m, open(path, "w"))
    return path


def compile_(tag, mc, *flags, model="gpt2_tiny", target="cpu"):
    out = os.path.join(work, tag)
    r = subprocess.run([parc, os.path.join(examples, model + ".dsl"), "-o", out, "--target",
                        target, "--machine", mc, *flags], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"FAIL {tag}: parc exited {r.returncode}:\n{r.stderr}")
    return json.load(open(os.path.join(out, "plan.json"))), r.stdout


def near(a, b, what, tol=1e-9):
    if abs(a - b) > tol * max(abs(a), abs(b), 1e-300):
        sys.exit(f"FAIL {what}: {a!r} != {b!r}")


def parts_add_up(ps, tag):
    near(ps["compute_s"], ps["gemm_s"] + ps["attention_s"] + ps["memory_bound_s"],
         f"{tag}: compute = GEMM + attention + memory-bound")
    near(ps["seconds"], ps["compute_s"] + ps["communication_s"] - ps["hidden_s"],
         f"{tag}: total = compute + communication - hidden")


# FLOPs: GEMMs and attention at their rates, nothing else costs
plan, _ = compile_("flops", machine("flops", gemm_flops=1e12, attention_flops=1e11))
ps = plan["predicted_step"]
attn_fwd = 4.0 * B * H * T * T * HD * LAYERS
near(ps["gemm_s"] * 1e12, plan["cost"]["flops_per_step"] - 3 * attn_fwd,
     "GEMM FLOPs = 3 x the forward's matmuls", 1e-6)
near(ps["attention_s"] * 1e11, attn_fwd * 0.5 * 3.5, "attention FLOPs", 1e-6)
if ps["memory_bound_s"] > 1e-15:
    sys.exit(f"FAIL memory-bound time with free memory: {ps['memory_bound_s']}")
parts_add_up(ps, "flops")
fast, _ = compile_("flops2", machine("flops2", gemm_flops=2e12, attention_flops=1e11))
near(fast["predicted_step"]["gemm_s"], ps["gemm_s"] / 2, "doubling the GEMM rate halves gemm_s")
near(fast["predicted_step"]["attention_s"], ps["attention_s"], "attention_s unchanged")
near(ps["mfu"], plan["cost"]["flops_per_step"] / ps["seconds"] / 1e12, "MFU")

# calls: each costs kernel_s
plan, _ = compile_("calls", machine("calls", kernel_s=1e-3))
ps = plan["predicted_step"]
if ps["calls"] < 50:
    sys.exit(f"FAIL calls: {ps['calls']} calls a step")
near(ps["seconds"], ps["calls"] * 1e-3, "calls x kernel_s")
# a call split over threads (largest value >= parallel_min_elements) costs parallel_call_s more
every, _ = compile_("split_all", machine("split_all", parallel_call_s=1e-3, parallel_min_elements=0))
none, _ = compile_("split_none", machine("split_none", parallel_call_s=1e-3,
                                         parallel_min_elements=1e12))
some, _ = compile_("split_some", machine("split_some", parallel_call_s=1e-3,
                                         parallel_min_elements=16384))
near(every["predicted_step"]["seconds"], ps["calls"] * 1e-3, "every call split")
if none["predicted_step"]["seconds"] > 1e-15:
    sys.exit(f"FAIL no call split: {none['predicted_step']['seconds']}")
k = some["predicted_step"]["seconds"] / 1e-3
if not 0 < k < ps["calls"] or abs(k - round(k)) > 1e-6:
    sys.exit(f"FAIL split at 16384 elements: {k} of {ps['calls']} calls")

# communication: tp 2 within a node of 2 ranks, dp 2 spans 4 ranks: between nodes
mc = machine("links", intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e6, latency_s=1e-4,
             ranks_per_node=2, memory_bytes_per_s=1e9)
def gpu_fused(plan, path, dp=1):
    """The tp group's loss gathers the GPU trainer does not run (its loss computed in
    its gradient's call: one rt_cuda_cross_entropy_fused call over the tp group in
    train_cuda.c, two gathers fewer), checked against plan.json's gpu_communication;
    how many, and the bytes a rank
    sends less, as passes/comm_cost.c counts a vocab cross-entropy's gathers: 4
    floats a row (the rank's B T / dp) from each of the tp 2 members, (n - 1) / n of
    them sent."""
    with open(path) as f:
        calls = len(re.findall(r"rt_cuda_cross_entropy_fused\(dev, RT_CUDA_TP,", f.read()))
    got = sum(g["loss_gathers_fused"] for g in plan["gpu_communication"] if g["group"] == "tp")
    if calls != 1 or got != 2 * calls:  # the row maxima, then the sums (rt_route.h)
        sys.exit(f"FAIL fused loss: {calls} fused calls in {path}, plan.json {got} gathers")
    return got, calls * 16.0 * B * T / dp * 2 / 2


for tag, flags in (("overlap", []), ("blocking", ["--no-overlap"])):
    plan, _ = compile_("comm_" + tag, mc, "--tp", "2", "--dp", "2", *flags, target="all")
    ps = plan["predicted_step"]
    want = {"tp": 0.0, "dp": 0.0}
    for e in plan["communication"]:
        link = 1e9 if e["group"] == "tp" else 1e6
        want[e["group"]] += e["sent_bytes_per_rank"] / link + e["count"] * 1e-4
    fused, fused_bytes = gpu_fused(plan, os.path.join(work, "comm_" + tag, "train_cuda.c"), dp=2)
    want["tp"] -= fused * 1e-4 + fused_bytes / 1e9
    if not want["tp"] or not want["dp"]:
        sys.exit(f"FAIL comm {tag}: expected tp and dp collectives: {plan['communication']}")
    near(ps["communication_s"], want["tp"] + want["dp"], f"comm {tag}: bytes / link + latency")
    parts_add_up(ps, "comm " + tag)
    if tag == "blocking" and ps["hidden_s"] != 0:
        sys.exit(f"FAIL --no-overlap hides {ps['hidden_s']} s of dp")
    if tag == "overlap" and not 0 < ps["hidden_s"] <= want["dp"] * (1 + 1e-12):
        sys.exit(f"FAIL overlap hides {ps['hidden_s']} s of a dp part of {want['dp']} s")
    near(ps["mfu"], plan["cost"]["flops_per_step"] / 4 / ps["seconds"] / 1e12, f"MFU {tag}")

# bf16 at tp 2: the all-reduces whose sums the GPU trainer stores as bf16
# (train_cuda.c's rt_cuda_all_reduce_bf16 calls and their counts) run as a
# reduce-scatter and an all-gather: a collective more each, and (n-1)/n of 2
# bytes an element less sent a rank -- plan.json's gpu_communication, and the
# predicted communication time with them
plan, _ = compile_("comm_bf16", mc, "--tp", "2", "-D", "precision=bf16", target="all")
with open(os.path.join(work, "comm_bf16", "train_cuda.c")) as f:
    sums = [int(n) for n in re.findall(r"rt_cuda_all_reduce_bf16\(dev, RT_CUDA_TP, [^,]+, [^,]+, "
                                       r"(\d+), 0\)", f.read())]
g = plan["gpu_communication"]
fused, fused_bytes = gpu_fused(plan, os.path.join(work, "comm_bf16", "train_cuda.c"))
if not sums or len(g) != 1 or g[0]["group"] != "tp" or \
        g[0]["extra_collectives"] != len(sums) - fused:
    sys.exit(f"FAIL comm bf16: {len(sums)} bf16 all-reduces in train_cuda.c, plan.json {g}")
near(g[0]["saved_bytes_per_rank"], sum(2.0 * n / 2 for n in sums) + fused_bytes,
     "comm bf16: bytes saved")
want = sum(e["sent_bytes_per_rank"] / 1e9 + e["count"] * 1e-4 for e in plan["communication"])
near(plan["predicted_step"]["communication_s"],
     want - g[0]["saved_bytes_per_rank"] / 1e9 + (len(sums) - fused) * 1e-4, "comm bf16: time")
plan, _ = compile_("comm_bf16_off", mc, "--tp", "2", "-D", "precision=bf16", "--bf16-store", "off",
                   target="all")
g = plan["gpu_communication"]
if len(g) != 1 or g[0]["all_reduces_stored_bf16"] or g[0]["all_gathers_bf16"] or \
        g[0]["sends_bf16"] or gpu_fused(plan, os.path.join(work, "comm_bf16_off", "train_cuda.c"))[0] != 2:
    sys.exit(f"FAIL comm bf16 off: {g}")
# a pipeline's stages run each chunk's collectives once a microbatch (M 4): the
# stages' bf16 all-reduces are M x train_cuda.c's calls (each chunk's code once),
# and each stage's communication time (its tp collectives; the pp transfers are
# the simulation's) takes its own differences, the step the busiest stage's
plan, _ = compile_("comm_bf16_pp", mc, "--tp", "2", "--pp", "2", "--microbatches", "4",
                   "-D", "precision=bf16", target="all")
with open(os.path.join(work, "comm_bf16_pp", "train_cuda.c")) as f:
    sums = [int(n) for n in re.findall(r"rt_cuda_all_reduce_bf16\(dev, RT_CUDA_TP, [^,]+, [^,]+, "
                                       r"(\d+), 0\)", f.read())]
with open(os.path.join(work, "comm_bf16_pp", "train_cuda.c")) as f:
    src = f.read()
# the boundary values it stores as bf16 (act_0 sent by stage 0, grad_0 by stage 1,
# a microbatch each): M x 2 bytes an element less sent, and 4-byte words of two
# elements each in their tables
sent = {}
for name, stage in (("act_0", 0), ("grad_0", 1)):
    table = re.search(r"RtPipeValue " + name + r"\[\] = \{(.*?)\n\};", src, re.S).group(1)
    for words, dims in re.findall(r"\{\d+, (\d+)\}, /\* %\d+ : f32\[([\d, ]+)\], bf16 \*/", table):
        numel = 1
        for d in dims.split(","):
            numel *= int(d)
        if int(words) != (numel + 1) // 2:
            sys.exit(f"FAIL comm bf16 pp: {name} sends {words} words of {numel} bf16 elements")
        n, saved = sent.get(stage, (0, 0))
        sent[stage] = (n + 4, saved + 4 * 2.0 * numel)
gp = {e["stage"]: (e["sends_bf16"], e["saved_bytes_per_rank"])
      for e in plan["gpu_communication"] if e["group"] == "pp"}
if sorted(sent) != [0, 1] or gp != sent:
    sys.exit(f"FAIL comm bf16 pp: bf16 boundary values in train_cuda.c {sent}, plan.json {gp}")
g = [e for e in plan["gpu_communication"] if e["group"] != "pp"]
if not sums or sorted(e["stage"] for e in g) != [0, 1] or \
        sum(e["all_reduces_stored_bf16"] for e in g) != 4 * len(sums):
    sys.exit(f"FAIL comm bf16 pp: {len(sums)} bf16 all-reduces in train_cuda.c, plan.json {g}")
near(sum(e["saved_bytes_per_rank"] for e in g), 4 * sum(2.0 * n / 2 for n in sums),
     "comm bf16 pp: bytes saved")
stage_s = [sum(e["sent_bytes_per_rank"] / 1e9 + e["count"] * 1e-4 for e in plan["communication"]
               if e["stage"] == s and e["group"] != "pp") for s in (0, 1)]
for e in g:
    stage_s[e["stage"]] += e["extra_collectives"] * 1e-4 - e["saved_bytes_per_rank"] / 1e9
near(plan["predicted_step"]["communication_s"], max(stage_s), "comm bf16 pp: time")
# with --sp, all-gathers of bf16 values (two elements a float: each element's 2 bytes
# less, (n-1)/n of them sent) and no collective more
plan, _ = compile_("comm_bf16_sp", mc, "--tp", "2", "--sp", "-D", "precision=bf16", target="all")
with open(os.path.join(work, "comm_bf16_sp", "train_cuda.c")) as f:
    src = f.read()
dims = re.findall(r"rt_cuda_all_gather_dim\(dev, RT_CUDA_TP, [^,]+, [^,]+, (\d+), (\d+), (\d+)\)\); "
                  r"/\* bf16: 2 elements a float \*/", src)
flat = re.findall(r"rt_cuda_all_gather\(dev, RT_CUDA_TP, [^,]+, [^,]+, (\d+)\)\); "
                  r"/\* bf16: 2 elements a float \*/", src)
numel = [int(o) * int(n) * int(i) * 2 for o, n, i in dims] + [int(c) * 2 * 2 for c in flat]
g = plan["gpu_communication"]
fused, fused_bytes = gpu_fused(plan, os.path.join(work, "comm_bf16_sp", "train_cuda.c"))
if not numel or len(g) != 1 or g[0]["all_gathers_bf16"] != len(numel) or \
        g[0]["extra_collectives"] != -fused:
    sys.exit(f"FAIL comm bf16 sp: {len(numel)} bf16 all-gathers in train_cuda.c, plan.json {g}")
near(g[0]["saved_bytes_per_rank"], sum(2.0 * n / 2 for n in numel) + fused_bytes,
     "comm bf16 sp: bytes saved")
want = sum(e["sent_bytes_per_rank"] / 1e9 + e["count"] * 1e-4 for e in plan["communication"])
near(plan["predicted_step"]["communication_s"],
     want - g[0]["saved_bytes_per_rank"] / 1e9 - fused * 1e-4, "comm bf16 sp: time")

# precision: a bf16 model takes the bf16 rates
mc = machine("prec", gemm_flops={"fp32": 1e12, "bf16": 4e12}, attention_flops=1e11)
fp32, _ = compile_("fp32", mc)
bf16, rep = compile_("bf16", mc, "-D", "precision=bf16")
if bf16["predicted_step"]["precision"] != "bf16" or "(bf16 mixed)" not in rep:
    sys.exit(f"FAIL bf16: {bf16['predicted_step']}")
near(bf16["predicted_step"]["gemm_s"], fp32["predicted_step"]["gemm_s"] / 4, "bf16 GEMM rate")

# bf16: the GPU trainer's GEMM operand copies are memory-bound calls (6 bytes
# an element); bf16 values (codegen/cuda_store.h) move 2 bytes an element and
# need no copy: less memory-bound time and fewer calls than with --bf16-store
# off (or round: fp32 buffers, modelled alike), which has more than fp32; no
# fewer than fp32 (which converts nothing), as many where every GEMM operand
# is stored bf16 and the params' copy is the optimizer's (cuda_store.h mirror),
# less the GELUs and GELU gradients that bf16's GEMMs compute in their epilogues
# (passes/gelu_epilogue.c; plan.json's kernels with gpu_epilogue gelu, gelu_grad)
mc = machine("bytes", memory_bytes_per_s=1e9)
plans = {tag: compile_("bytes_" + tag, mc, "-D", "precision=" + p, *f)[0]
         for tag, p, f in (("fp32", "fp32", ()), ("bf16", "bf16", ()),
                           ("off", "bf16", ("--bf16-store", "off")),
                           ("round", "bf16", ("--bf16-store", "round")))}
ps = {tag: plan["predicted_step"] for tag, plan in plans.items()}
mem = {tag: p["memory_bound_s"] for tag, p in ps.items()}
calls = {tag: p["calls"] for tag, p in ps.items()}
gelus = sum(k.get("gpu_epilogue") in ("gelu", "gelu_grad") for k in plans["bf16"]["kernels"])
if not 0 < mem["bf16"] < 0.9 * mem["fp32"] < 0.9 * mem["off"]:
    sys.exit(f"FAIL bf16 stores: memory-bound {mem} s")
if not gelus or not calls["fp32"] - gelus <= calls["bf16"] < calls["off"]:
    sys.exit(f"FAIL bf16 copies: calls {calls}, {gelus} GELUs in GEMM epilogues")
near(mem["round"], mem["off"], "--bf16-store round: off's bytes")

# a file based on a preset changing one precision keeps the other's rate
part = os.path.join(work, "partial.json")
json.dump({"base": "h200", "gemm_flops": {"bf16": 8e12}}, open(part, "w"))
_, rep32 = compile_("part32", part)
_, rep16 = compile_("part16", part, "-D", "precision=bf16")
if "at 50 TFLOP/s" not in rep32 or "at 8 TFLOP/s" not in rep16:
    sys.exit(f"FAIL partial precision: fp32 report\n{rep32}\nbf16 report\n{rep16}")

# pipelines: chunks timed by their kernels (each call kernel_s here), the
# optimizer after the schedule, transfers and collectives free
plan, rep = compile_("pp", machine("pp", kernel_s=1e-3), "--pp", "2", "--dp", "2")
ps = plan["predicted_step"]
if "simulated with each chunk's kernels" not in rep:
    sys.exit("FAIL pp: the simulation does not time chunks by their kernels:\n" + rep)
near(ps["compute_s"], ps["pipeline_s"] + ps["optimizer_s"], "pp: compute = pipeline + optimizer")
near(ps["seconds"], ps["compute_s"] + ps["communication_s"], "pp: total")
for part in ("pipeline_s", "optimizer_s"):
    calls = ps[part] / 1e-3
    if calls < 10 or abs(calls - round(calls)) > 1e-6:
        sys.exit(f"FAIL pp: {part} {ps[part]} is not a whole number of 1 ms calls")
near(ps["mfu"], plan["cost"]["flops_per_step"] / 4 / ps["seconds"] / 1e12, "MFU pp")
# a pipeline's bf16 stores (codegen/cuda_store.h: stage programs too) move fewer
# bytes than --bf16-store off (round: off's bytes), and its GPU arena is planned
# with them at 2 bytes an element: smaller than train.c's, a device total a stage
pipe = {tag: compile_("pp_bytes_" + tag, mc, "--pp", "2", "-D", "precision=bf16", *f)[0]
        for tag, f in (("bf16", ()), ("off", ("--bf16-store", "off")),
                       ("round", ("--bf16-store", "round")))}
pmem = {tag: p["predicted_step"]["pipeline_s"] for tag, p in pipe.items()}
if not 0 < pmem["bf16"] < 0.9 * pmem["off"]:
    sys.exit(f"FAIL pp bf16 stores: pipeline {pmem} s")
near(pmem["round"], pmem["off"], "pp --bf16-store round: off's bytes")
c16, coff = pipe["bf16"]["cost"], pipe["off"]["cost"]
dev = c16.get("gpu_device_bytes_per_stage", [])
with open(os.path.join(work, "pp_bytes_off", "train.c")) as f:  # the slots, accumulator ...
    train_arena = int(re.search(r"^#define ARENA_BYTES (\d+)$", f.read(), re.M).group(1))
if not (0 < c16.get("gpu_arena_bytes", 0) < 0.9 * train_arena and len(dev) == 2 and
        max(dev) == c16["gpu_device_bytes"] and "gpu_arena_bytes" not in coff and
        c16["gpu_device_bytes"] < coff["gpu_device_bytes"]):
    sys.exit(f"FAIL pp bf16 arena: {c16} against --bf16-store off {coff}")
# a routed model's microbatches at pp 1: accumulated on one stage, timed the same way
plan, rep = compile_("accum", machine("accum", kernel_s=1e-3), "-D", "microbatches=2",
                     model="moe_tiny")
ps = plan["predicted_step"]
if "the microbatches (kernel by kernel)" not in rep or "pipeline_s" not in ps:
    sys.exit("FAIL accum: the microbatches are not timed by their kernels:\n" + rep)
near(ps["compute_s"], ps["pipeline_s"] + ps["optimizer_s"], "accum: compute")
if ps["pipeline_s"] / 1e-3 < 20 or abs(ps["pipeline_s"] / 1e-3 - round(ps["pipeline_s"] / 1e-3)) > 1e-6:
    sys.exit(f"FAIL accum: {ps['pipeline_s']} s is not a whole number of 1 ms calls")
print("ok: predicted step time follows its model (FLOPs, calls, links, overlap, precision, pp, accumulation)")
