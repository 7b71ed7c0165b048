#!/usr/bin/env python3
"""Checks plan.json's "moe" array against its "communication" entries.

parc examples/moe_tiny.dsl --dp 2 --ep 2 -o DIR writes plan.json with one
"moe" entry per MoE layer (capacity, dispatch and dropless bytes, the expert
all-to-alls a step) and an ep "all_to_all" entry under "communication".  The
two come from different code (codegen/report.c's per-layer figures, the
collectives passes/comm_cost.c counts in the sharded module), so they must
agree: the ep all-to-all count and bytes are the sums over the layers.
Also: a dispatch buffer never exceeds the dropless one, and with a capacity
factor of 0.5 it is strictly smaller; under --dp 4 --ep 2 the expert
gradients reduce over ep_dp and the router's over ep; with --pp 2 --zero 1
every gradient is reduce-scattered once, by its stage, over dp or ep_dp, in
buckets (one per gradient with --bucket-mb of 4 bytes, one per stage and
group at the default 25 MiB).
usage: moe_plan.py PARC EXAMPLES_DIR
"""
import json, os, re, subprocess, sys, tempfile

parc, ex = sys.argv[1], sys.argv[2]
model = os.path.join(ex, "moe_tiny.dsl")
failures = []

def check(cond, what):
    if not cond:
        failures.append(what)

def config_layers(path):
    block = re.search(r"config\s*{(.*?)}", open(path).read(), re.S).group(1)
    return int(re.search(r"\blayers\s*=\s*(\d+)", block).group(1))

def plan(tmp, *args):
    out = os.path.join(tmp, "out_" + "_".join(a.replace("=", "").replace("-", "") for a in args))
    cmd = [parc, model, *args, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr}")
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f)

def entries(p, group, kind):
    return [c for c in p["communication"] if c["group"] == group and c["kind"] == kind]

def check_moe(p, tag, layers, ep):
    moe = p["moe"]
    check(len(moe) == layers, f"{tag}: {len(moe)} moe entries, want {layers} (one per layer)")
    check(sorted(m["layer"] for m in moe) == list(range(layers)),
          f"{tag}: moe layers {[m['layer'] for m in moe]}, want 0..{layers - 1}")
    for m in moe:
        l = m["layer"]
        check(m["ep"] == ep, f"{tag}: layer {l} ep {m['ep']}, want {ep}")
        check(m["capacity_per_rank"] <= m["capacity"],
              f"{tag}: layer {l} capacity_per_rank {m['capacity_per_rank']} > capacity")
        check(m["capacity_per_rank"] <= m["tokens_per_rank"],
              f"{tag}: layer {l} capacity_per_rank above the rank's tokens")
        check(m["dispatch_bytes_per_rank"] == 4 * m["experts"] * m["capacity_per_rank"] * m["d_model"],
              f"{tag}: layer {l} dispatch bytes are not experts x slots x d_model fp32")
        check(m["dropless_bytes_per_rank"] == 4 * m["experts"] * m["tokens_per_rank"] * m["d_model"],
              f"{tag}: layer {l} dropless bytes are not experts x tokens x d_model fp32")
        check(m["dispatch_bytes_per_rank"] <= m["dropless_bytes_per_rank"],
              f"{tag}: layer {l} dispatch bytes {m['dispatch_bytes_per_rank']} > dropless "
              f"{m['dropless_bytes_per_rank']}")
    a2a = entries(p, "ep", "all_to_all")
    if ep > 1:
        check(len(a2a) == 1, f"{tag}: {len(a2a)} ep all_to_all entries in communication, want 1")
        check(all(m["all_to_all_count"] > 0 for m in moe), f"{tag}: a layer without all-to-alls")
    if len(a2a) == 1:
        e = a2a[0]
        check(e["ranks"] == ep, f"{tag}: all_to_all over {e['ranks']} ranks, want ep {ep}")
        for key, mkey in (("count", "all_to_all_count"), ("payload_bytes", "all_to_all_payload_bytes"),
                          ("sent_bytes_per_rank", "all_to_all_sent_bytes_per_rank")):
            total = sum(m[mkey] for m in moe)
            check(e[key] == total, f"{tag}: communication all_to_all {key} {e[key]} != sum of the "
                  f"moe entries' {mkey} {total}")
    return moe

layers = config_layers(model)
with tempfile.TemporaryDirectory(prefix="parc_moe_plan_") as tmp:
    p = plan(tmp, "--dp", "2", "--ep", "2")
    moe = check_moe(p, "--dp 2 --ep 2", layers, 2)
    check(all(m["dropless"] for m in moe), "--dp 2 --ep 2: capacity 0 should be dropless")

    p = plan(tmp, "--dp", "2", "--ep", "2", "-D", "capacity=0.5")
    moe = check_moe(p, "--dp 2 --ep 2 -D capacity=0.5", layers, 2)
    for m in moe:
        check(not m["dropless"], f"capacity=0.5: layer {m['layer']} dropless")
        check(m["dispatch_bytes_per_rank"] < m["dropless_bytes_per_rank"],
              f"capacity=0.5: layer {m['layer']} dispatch bytes {m['dispatch_bytes_per_rank']} not "
              f"below dropless {m['dropless_bytes_per_rank']}")

    p = plan(tmp, "--dp", "2", "--ep", "2", "-D", "layers=3")
    check_moe(p, "--dp 2 --ep 2 -D layers=3", 3, 2)

    p = plan(tmp, "--dp", "4", "--ep", "2")
    check_moe(p, "--dp 4 --ep 2", layers, 2)
    for group, ranks in (("ep", 2), ("ep_dp", 2)):
        ar = entries(p, group, "all_reduce")
        check(len(ar) >= 1 and all(e["count"] > 0 for e in ar),
              f"--dp 4 --ep 2: no {group} all_reduce in communication")
        check(all(e["ranks"] == ranks for e in ar),
              f"--dp 4 --ep 2: {group} all_reduce over {[e['ranks'] for e in ar]} ranks, want {ranks}")

    # microbatches = 2 (a one-stage pipeline accumulating over two routed halves):
    # the expert all-to-alls and the routing statistics' all-reduces run once per
    # microbatch, the gradients' reduction and the clip norm's once a step; the
    # communication entries count what the trainer runs, as the moe entries do
    m1 = p = plan(tmp, "--dp", "2", "--ep", "2")
    m2 = plan(tmp, "--dp", "2", "--ep", "2", "-D", "microbatches=2")
    check_moe(m2, "--dp 2 --ep 2 microbatches=2", layers, 2)
    a1, a2 = entries(m1, "ep", "all_to_all")[0], entries(m2, "ep", "all_to_all")[0]
    check(a2["count"] == 2 * a1["count"], f"microbatches=2: {a2['count']} all-to-alls a step, "
          f"want twice microbatches=1's {a1['count']}")
    e1, e2 = entries(m1, "ep", "all_reduce"), entries(m2, "ep", "all_reduce")
    check(len(e1) == len(e2) == 1 and e1[0]["count"] == e2[0]["count"],
          "microbatches=2: the clip norm's ep all-reduces are not once a step like at 1")
    d1, d2 = entries(m1, "dp", "all_reduce")[0], entries(m2, "dp", "all_reduce")[0]
    check(d2["count"] > d1["count"] and d2["payload_bytes"] > d1["payload_bytes"],
          f"microbatches=2: dp all-reduces {d2['count']} ({d2['payload_bytes']} B) not above "
          f"microbatches=1's {d1['count']} ({d1['payload_bytes']} B): routing statistics "
          "counted once a step")
    check(all("stage" not in c for c in m2["communication"]), "pp 1: entries with a stage")

    # pp 2 (layers split 2 + rest): each stage's entries count its own layers' all-to-alls
    half = layers // 2
    p = plan(tmp, "--pp", "2", "--dp", "2", "--ep", "2", "-D", "microbatches=2",
             "--stage-layers", f"{half},{layers - half}")
    for st, (lo, hi) in enumerate(((0, half), (half, layers))):
        a = [c for c in p["communication"] if c.get("stage") == st and c["kind"] == "all_to_all"]
        want = sum(m["all_to_all_count"] for m in p["moe"] if lo <= m["layer"] < hi)
        check(len(a) == 1 and a[0]["count"] == want,
              f"--pp 2 stage {st}: all_to_all entries {a}, want one of {want} (its layers' moe "
              "entries)")
        pp = [c for c in p["communication"] if c.get("stage") == st and c["group"] == "pp"]
        check({c["kind"] for c in pp} >= {"send", "recv", "all_reduce"},
              f"--pp 2 stage {st}: pp entries {[c['kind'] for c in pp]}, want send, recv, "
              "all_reduce")
    sends = [c for c in p["communication"] if c["group"] == "pp" and c["kind"] == "send"]
    recvs = [c for c in p["communication"] if c["group"] == "pp" and c["kind"] == "recv"]
    check(sum(c["count"] for c in sends) == sum(c["count"] for c in recvs) and
          sum(c["payload_bytes"] for c in sends) == sum(c["payload_bytes"] for c in recvs),
          "--pp 2: the stages' sends and receives do not pair up")

    # --zero 1 in that pipeline (pp 2 x dp 4 ep 2): every gradient is reduce-scattered
    # once, by the stage holding it (moe_tiny ties nothing), dense ones over dp, the
    # experts over ep_dp, their whole floats, in buckets of one group: one per gradient
    # at --bucket-mb 4 bytes, one per stage and group at the default (the model is far
    # below 25 MiB); each stage all-gathers its own pieces over both groups; nothing is
    # all-reduced over ep_dp
    for bucket in (["--bucket-mb", "0.000001"], []):
        p = plan(tmp, "--pp", "2", "--dp", "4", "--ep", "2", "--zero", "1", "-D",
                 "microbatches=2", "-D", "batch=8", *bucket)
        numel = 0
        for t in p["params"]:
            n = 1
            for d in t["shape"]:
                n *= d
            numel += n
        nexp = sum(1 for t in p["params"] if t.get("shard") == "expert")
        rs = [c for c in p["communication"] if c["kind"] == "reduce_scatter"]
        want = (len(p["params"]), nexp) if bucket else (4, 2)
        check(sum(c["count"] for c in rs) == want[0] and
              sum(c["payload_bytes"] for c in rs) == 4 * numel,
              f"--pp 2 --zero 1 {bucket}: reduce-scatters {rs}, want {want[0]} of "
              f"{4 * numel} bytes in all")
        check(sum(c["count"] for c in rs if c["group"] == "ep_dp") == want[1] and nexp > 0,
              f"--pp 2 --zero 1 {bucket}: ep_dp reduce-scatters {rs}, want {want[1]} "
              f"({nexp} expert tensors)")
    for st in (0, 1):
        for g in ("dp", "ep_dp"):
            ag = [c for c in p["communication"] if c.get("stage") == st and c["group"] == g and
                  c["kind"] == "all_gather"]
            check(len(ag) == 1 and ag[0]["count"] >= 1,
                  f"--pp 2 --zero 1 stage {st}: {g} all_gather entries {ag}")
    check(not entries(p, "ep_dp", "all_reduce"), "--pp 2 --zero 1: an ep_dp all_reduce")

    p = plan(tmp, "--dp", "2")  # ep 1: the experts stay whole, nothing to exchange
    check_moe(p, "--dp 2", layers, 1)
    check(not entries(p, "ep", "all_to_all"), "--dp 2 (ep 1): an ep all_to_all in communication")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("ok: plan.json moe entries agree with communication")
