#!/usr/bin/env python3
"""`parc --explain` against the plan it explains (codegen/explain.h).

usage: explain.py PARC EXAMPLES_DIR WORK_DIR

For a few layouts, parc MODEL --explain all, with and without -o:
- the explanation is the same text both ways (without -o, the report's
  per-rank module; with -o, the trainer's);
- each arena it explains has plan.json's size (cost.arena_bytes, and
  cost.gpu_arena_bytes for the GPU trainer's own), and its peak is at most
  that and at least plan.json's arena_live_peak_bytes for train.c's;
- the step it explains has plan.json's calls and compute time (to the printed
  digits), and its rows' shares add up to 100% (to their rounding);
- every row names a source location that exists: a line of the model or the
  prelude, its text printed beside it.
For pipelines (--pp 2, and a routed model's microbatches at pp 1), the same
both ways (and the report's arena and device lines the same with and without -o), each stage's calls sum to the report's "busy" time of that stage
(pp 2), each stage's values (its arena's) peak within the slot, and are
the report's pipeline section's (with the GPU trainer's slot and each stage's
slots), the table is the largest stage's, whose peak for train.c is plan.json's
arena_live_peak_bytes, train.c's slots are plan.json's arena_stage_slots
(arena_slots the most), each stage's slot bytes arena_stage_slot_bytes, the
largest of them the title's and arena_slot_bytes, each stage's values peak
within its own slot, and the arenas (arena_stage_bytes, arena_bytes the
largest, gpu_arena_bytes) hold their stages' slots.
"""
import json, os, re, subprocess, sys

parc, examples, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
fails = 0


def fail(msg):
    global fails
    print("FAIL:", msg)
    fails += 1


def explanation(out):
    """The text after the report: from the first line the explanation starts with,
    up to the -o line."""
    m = re.search(r"^(activation arena of the|activation arena \(train.c's plan|"
                  r"predicted step on|a slot of the)", out, re.M)
    text = out[m.start():] if m else ""
    return text[:text.rfind("wrote ")] if "wrote " in text else text


def explain_both(name, model, args):
    """parc MODEL --explain all ARGS without and with -o: (its stdout without -o,
    the explanation, the -o directory), or None after a failure (both must print
    the same explanation)."""
    base = [parc, os.path.join(examples, model + ".dsl"), "--explain", "all"] + args
    plain = subprocess.run(base, capture_output=True, text=True)
    outdir = os.path.join(work, name)
    built = subprocess.run(base + ["-o", outdir, "--target", "cpu"], capture_output=True,
                           text=True)
    if plain.returncode or built.returncode:
        fail(f"{name}: exit {plain.returncode}, with -o {built.returncode}: "
             f"{plain.stderr}{built.stderr}")
        return None
    a, b = explanation(plain.stdout), explanation(built.stdout)
    if not a or a != b:
        fail(f"{name}: the explanation differs with -o ({len(a)} and {len(b)} bytes)")
        return None
    return plain.stdout, a, outdir, built.stdout


UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def check(name, model, args):
    got = explain_both(name, model, args)
    if not got:
        return
    _, a, outdir, _ = got
    path = os.path.join(examples, model + ".dsl")
    plan = json.load(open(os.path.join(outdir, "plan.json")))
    cost, step = plan["cost"], plan["predicted_step"]
    arenas = re.findall(r"^activation arena (of the (CPU|GPU) trainer|\(train.c's plan).*?"
                        r"\((\d+) bytes\).*\n.*?peak: ([\d.]+) (\w+) live", a, re.M)
    want = [cost["arena_bytes"]] + ([cost["gpu_arena_bytes"]] if cost.get("gpu_arena_bytes") else [])
    if [int(x[2]) for x in arenas] != want:
        fail(f"{name}: arenas {[x[2] for x in arenas]}, plan.json's {want}")
    for k, x in enumerate(arenas):
        live = float(x[3]) * UNIT[x[4]]
        low = cost["arena_live_peak_bytes"] * 0.995 if k == 0 else 0
        if not low <= live <= want[min(k, len(want) - 1)] * 1.005:
            fail(f"{name}: peak {x[3]} {x[4]} live, arena {want}, "
                 f"planner's live peak {cost['arena_live_peak_bytes']}")
    m = re.search(r"compute only: ([\d.]+) (ms|us) in (\d+) calls", a)
    if not m:
        fail(f"{name}: no step line")
        return
    secs = float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1e-6)
    if int(m.group(3)) != step["calls"] or abs(secs - step["compute_s"]) > 1e-3 * secs:
        fail(f"{name}: step {m.group(0)}, plan.json {step['calls']} calls, "
             f"{step['compute_s']} s")
    part = a[m.start():]
    shares = [float(s) for s in re.findall(r"^ +[\d.]+ (?:ms|us) +([\d.]+)%", part, re.M)]
    if abs(sum(shares) - 100) > 0.05 * len(shares) + 0.1:
        fail(f"{name}: the step's shares add up to {sum(shares):.1f}%")
    prelude = os.path.join(examples, "..", "frontend", "prelude.dsl")
    texts = {os.path.basename(path): open(path).read().split("\n"),
             "prelude.dsl": open(prelude).read().split("\n")}
    rows = re.findall(r"  ([\w.]+\.dsl):(\d+):(\d+) +(.*)$", a, re.M)
    for f, line, col, text in rows:
        if f in texts and texts[f][int(line) - 1].strip()[:40] != text[:40]:
            fail(f"{name}: {f}:{line} printed as '{text[:40]}'")
    if len(rows) < 10:
        fail(f"{name}: {len(rows)} rows name a source line")
    print(f"ok   {name}: {len(arenas)} arena(s), {int(m.group(3))} calls, {len(rows)} rows")


def check_pipe(name, model, args):
    got = explain_both(name, model, args)
    if not got:
        return
    report, a, outdir, built = got
    # the report plans each stage's arena and device bytes without -o as -o does
    lines = r"^(activation arena \(planned.*|GPU trainer \(bf16\): activation arena.*|" \
            r"    stage \d+: [\d.]+ \w+ \(\d+ bytes\).*|  activations \(planned.*|" \
            r"    peak .* at most .*)$"
    plain_lines = re.findall(lines, report[:report.find(a)], re.M)
    built_lines = re.findall(lines, built[:built.find(a)], re.M)
    if not plain_lines or plain_lines != built_lines:
        fail(f"{name}: the report's arena lines {plain_lines}, with -o {built_lines}")
    if not a.startswith("a slot"):
        fail(f"{name}: no slot explained")
        return
    busy = [float(x) * (1e-3 if u == "ms" else 1e-6) for x, u in
            re.findall(r"busy ([\d.]+) of [\d.]+ (ms|us)", report)]
    stages = [float(x) * (1e-3 if u == "ms" else 1e-6) for x, u in
              re.findall(r"^  stage \d+: ([\d.]+) (ms|us)$", a, re.M)]
    if "--pp" in args and (not busy or len(busy) != len(stages) or
                           any(abs(x - y) > 1e-3 * y for x, y in zip(stages, busy))):
        fail(f"{name}: stages' calls {stages} s, the report's busy {busy} s")
    plan = json.load(open(os.path.join(outdir, "plan.json")))["cost"]
    slots = re.findall(r"^a slot of the activation arena.*?arenas hold ([\d, ]+)\): .*?"
                       r"\((\d+) bytes\)", a, re.M)
    slots = [([int(x) for x in n.split(", ")], int(b)) for n, b in slots]
    # (plan.json: train.c's slot and each stage's slots, the most of them; arena_bytes
    # and gpu_arena_bytes the largest stage's whole arena, its slots and the gradient
    # accumulators, arena_stage_bytes each stage's)
    gpu = plan.get("gpu_arena_bytes")
    each = plan.get("arena_stage_bytes", [])
    # each explained arena's stages' slots: (stage, live bytes, slot text, slot bytes)
    parts = a.split("a slot of the activation arena")[1:]
    own = [[(int(s), float(x) * UNIT[u], t, int(b)) for s, x, u, t, b in
            re.findall(r"^    stage (\d+): ([\d.]+) (\w+) in .*; slot ([\d.]+ \w+) "
                       r"\((\d+) bytes, ", part, re.M)] for part in parts]
    each_slot = plan.get("arena_stage_slot_bytes", [])
    if len(slots) != 1 + bool(gpu) or slots[0][1] != plan["arena_slot_bytes"] or \
            slots[0][0] != plan["arena_stage_slots"] or \
            [b for _, _, _, b in own[0]] != each_slot or max(each_slot) != slots[0][1] or \
            any(max(b for _, _, _, b in o) != n for o, (_, n) in zip(own, slots)) or \
            max(slots[0][0]) != plan["arena_slots"] or max(each) != plan["arena_bytes"] or \
            any(n * b > e for n, b, e in zip(slots[0][0], each_slot, each)) or \
            (gpu and max(n * b for n, (_, _, _, b) in zip(slots[1][0], own[1])) > gpu):
        fail(f"{name}: slots {slots}, each stage's {own}, plan.json {plan}")
    # each stage's values peak within its slot; the table is the largest's, and
    # train.c's is the planner's own live peak (the most any stage's arena holds)
    for k, part in enumerate(parts):
        peak = re.search(r"the buffers' peak, stage (\d+)'s: ([\d.]+) (\w+) live", part)
        nstages = int(args[args.index("--pp") + 1]) if "--pp" in args else 1
        if not peak or [s for s, _, _, _ in own[k]] != list(range(nstages)):
            fail(f"{name}: stages {own[k]}, peak {peak and peak.group(0)}")
            continue
        top = float(peak.group(2)) * UNIT[peak.group(3)]
        big = max(own[k], key=lambda x: x[1])
        if int(peak.group(1)) != big[0] or abs(top - big[1]) > 0.005 * top or \
                any(live > b * 1.005 for _, live, _, b in own[k]):
            fail(f"{name}: the table's {peak.group(0)}, stages {own[k]}")
        if k == 0 and abs(top - plan["arena_live_peak_bytes"]) > 0.005 * top:
            fail(f"{name}: {peak.group(0)}, plan.json's live peak "
                 f"{plan['arena_live_peak_bytes']}")
    # the pipeline section's activations are the GPU trainer's slots (its own plan
    # where it has one, else train.c's), and each stage's values in them the
    # explanation's, computed apart (the planner's per-arena peaks against
    # cg_explain_peak)
    if "--pp" in args:
        head = re.search(r"^  activations \(planned.*?: slots of .*?\((\d+) bytes\)", report,
                         re.M)
        most = re.findall(r"^    peak .*, (\d+) slots? of ([\d.]+ \w+); a microbatch's values "
                          r"at most ([\d.]+ \w+) live", report, re.M)
        last = re.findall(r"^    stage \d+: ([\d.]+ \w+) in .*; slot ([\d.]+ \w+) ", parts[-1],
                          re.M)
        if not head or int(head.group(1)) != slots[-1][1] or \
                [(int(n), t, x) for n, t, x in most] != \
                [(n, t, x) for n, (x, t) in zip(slots[-1][0], last)]:
            fail(f"{name}: the pipeline's activations {head and head.group(0)}, {most}; "
                 f"explained {slots[-1]}, {last}")
    print(f"ok   {name}: {len(stages)} stages busy {busy}, slots {slots}")


check("gpt2_tiny_bf16_tp2", "gpt2_tiny", ["--tp", "2", "-D", "precision=bf16"])
check("llama_tiny_dp2_sp", "llama_tiny", ["--tp", "2", "--dp", "2", "--sp"])
check("moe_tiny_ep2_bf16", "moe_tiny", ["--dp", "2", "--ep", "2", "-D", "precision=bf16"])
check("gpt2_tiny_nofuse", "gpt2_tiny", ["--no-fuse"])
check_pipe("llama_tiny_pp2_bf16", "llama_tiny", ["--pp", "2", "-D", "precision=bf16"])
check_pipe("gpt2_tiny_pp2_tp2_zb", "gpt2_tiny", ["--pp", "2", "--tp", "2", "--schedule", "zb",
                                                  "--microbatches", "4"])
check_pipe("moe_tiny_routed", "moe_tiny", ["-D", "microbatches=2"])
sys.exit(1 if fails else 0)
