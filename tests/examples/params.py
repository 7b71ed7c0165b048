#!/usr/bin/env python3
"""Checks `parameters: N` of every example against an independent count.

The big examples must match the published sizes (GPT-2 small, Llama 3 8B,
Mixtral 8x7B).  Every example, big or tiny, must also match a closed-form
count computed here from its config values, with and without -D overrides,
so the test cannot pass by echoing the compiler's own arithmetic.
usage: params.py PARC EXAMPLES_DIR
"""
import re, subprocess, sys

parc, ex = sys.argv[1], sys.argv[2]
PUBLISHED = {"gpt2": 124_439_808, "llama": 8_030_261_248, "mixtral": 46_702_792_704}

def config(path):
    text = open(path).read()
    block = re.search(r"config\s*{(.*?)}", text, re.S).group(1)
    env = {}
    for name, expr in re.findall(r"(\w+)\s*=\s*([^\n]+)", block):
        env[name] = eval(expr.strip(), {}, dict(env))
    return env

def count(family, c):
    V, d, L = c["vocab"], c["d"], c["layers"]
    if family == "gpt2":  # wte, wpe, ln_f + per layer: 2 LN, c_attn, c_proj, c_fc, c_proj
        f = c["ffn"]
        return V * d + c["seq"] * d + 2 * d + L * (4 * d + d * 3 * d + 3 * d + d * d + d + d * f + f + f * d + d)
    hd = d // c["heads"]
    attn = d * d + 2 * d * c["kv_heads"] * hd + d * d
    if family == "llama":
        mlp = 3 * d * c["ffn"]
    else:  # moe: router + experts
        mlp = d * c["experts"] + 3 * c["experts"] * d * c["ffn"]
    return 2 * V * d + d + L * (2 * d + attn + mlp)

def parc_count(path, defines):
    args = [parc, path] + [a for k, v in defines.items() for a in ("-D", f"{k}={v}")]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return int(re.search(r"^parameters: (\d+)$", out.stdout, re.M).group(1))

passed = failed = 0
def check(what, got, want):
    global passed, failed
    if got == want:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}: parc says {got}, expected {want}")

for name, family in [("gpt2", "gpt2"), ("gpt2_tiny", "gpt2"), ("llama", "llama"),
                     ("llama_tiny", "llama"), ("mixtral", "moe"), ("moe_tiny", "moe")]:
    path = f"{ex}/{name}.dsl"
    c = config(path)
    if name in PUBLISHED:
        check(name + " (published size)", parc_count(path, {}), PUBLISHED[name])
    check(name, parc_count(path, {}), count(family, c))
    over = {"layers": 2, "d": 96, "heads": 4, "vocab": 300}
    if "kv_heads" in c: over["kv_heads"] = 2
    if "ffn" in c: over["ffn"] = 200
    if "experts" in c: over.update(experts=3, top_k=2)
    c2 = dict(c, **over)
    check(name + " with -D", parc_count(path, over), count(family, c2))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
