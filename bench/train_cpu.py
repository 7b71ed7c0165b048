#!/usr/bin/env python3
"""Training throughput on the CPU: parc's generated trainer against PyTorch.

For each configuration, in one run on the same machine: compile the model
with parc, build the trainer, train STEPS steps; then train the same model
(same weights, data, batch, optimizer, thread count) with PyTorch eager,
written the way a PyTorch user would (torch.nn.functional ops, AdamW).
Prints tokens/s of each (median over the steps after the first) and the
ratio.  Also times `parc examples/gpt2.dsl -o DIR` end to end.

usage: bench/train_cpu.py [--build build] [--threads 2] [--steps 8] [--out DIR]
                          [--recompute-layers]
--recompute-layers compares parc --recompute layers with PyTorch checkpointing
each layer (torch.utils.checkpoint): both run every layer's forward again in
the backward.
Needs /usr/bin/python3 with python3-torch for the PyTorch side; run it with
that interpreter (the script re-executes itself under it if needed).
"""
import argparse, json, math, os, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYS_PY = "/usr/bin/python3"

try:
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint
except ImportError:
    if os.path.exists(SYS_PY) and os.path.realpath(sys.executable) != os.path.realpath(SYS_PY):
        os.execv(SYS_PY, [SYS_PY] + sys.argv)
    sys.exit("bench: needs torch (apt-get install python3-torch)")

sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
import torch_ref  # noqa: E402  (safetensors I/O, data order, init)

CONFIGS = [
    # name, DSL, parc -D overrides, torch config
    ("gpt2_tiny (d 64, 4 layers, seq 64, batch 4)", "gpt2_tiny", {},
     dict(vocab=256, seq=64, d=64, heads=4, layers=4)),
    ("gpt2 d 768, 2 layers (vocab 50257, seq 128, batch 4)", "gpt2",
     {"layers": 2, "seq": 128, "batch": 4, "microbatches": 1, "precision": "fp32"},
     dict(vocab=50257, seq=128, d=768, heads=12, layers=2)),
]


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def torch_step_fn(cfg, P, opt, checkpoint=False):
    """One training step of GPT-2 in idiomatic PyTorch eager (checkpoint: each
    layer under torch.utils.checkpoint, its forward run again in the backward)."""
    H, d = cfg["heads"], cfg["d"]
    hd = d // H

    def layer(h, i):
        B, T = h.shape[0], h.shape[1]
        p = lambda n: P[f"h.{i}.{n}"]
        a = F.layer_norm(h, (d,), p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        qkv = torch.addmm(p("attn.c_attn.bias"), a.view(B * T, d), p("attn.c_attn.weight"))
        q, k, v = qkv.view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B * T, d)
        h = h + torch.addmm(p("attn.c_proj.bias"), o, p("attn.c_proj.weight")).view(B, T, d)
        a = F.layer_norm(h, (d,), p("ln_2.weight"), p("ln_2.bias"), 1e-5).view(B * T, d)
        f = F.gelu(torch.addmm(p("mlp.c_fc.bias"), a, p("mlp.c_fc.weight")), approximate="tanh")
        h = h + torch.addmm(p("mlp.c_proj.bias"), f, p("mlp.c_proj.weight")).view(B, T, d)
        return h

    def forward(x, y):
        B, T = x.shape
        h = P["wte.weight"][x] + P["wpe.weight"][:T]
        for i in range(cfg["layers"]):
            if checkpoint:
                h = torch.utils.checkpoint.checkpoint(layer, h, i, use_reentrant=False)
            else:
                h = layer(h, i)
        h = F.layer_norm(h, (d,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
        logits = h.view(B * T, d) @ P["wte.weight"].t()
        return F.cross_entropy(logits, y.reshape(-1))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(P.values(), 1.0)
        opt.step()
        return loss.item()
    return step


def bench_torch(cfg, init, data, batch, steps, threads, checkpoint=False):
    torch.set_num_threads(threads)
    tensors, _ = torch_ref.read_safetensors(init)
    P = {n: t.float().clone().requires_grad_(True) for n, t in tensors.items()}
    decay = [p for p in P.values() if p.dim() >= 2]
    plain = [p for p in P.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": plain, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95))
    step = torch_step_fn(cfg, P, opt, checkpoint)
    tokens, _ = torch_ref.load_tokens(data)
    tokens = torch.from_numpy(tokens) if not torch.is_tensor(tokens) else tokens
    times, losses = [], []
    for t in range(steps):
        x, y = torch_ref.get_batch(tokens, t, batch, cfg["seq"])
        t0 = time.perf_counter()
        losses.append(step(x, y))
        times.append(time.perf_counter() - t0)
    return times, losses


def bench_parc(parc, dsl, defines, out, init, data, steps, threads, extra=()):
    args = [parc, os.path.join(ROOT, "examples", dsl + ".dsl"), "-o", out, "-D", "lr=1e-4",
            *extra]
    for k, v in defines.items():
        args += ["-D", f"{k}={v}"]
    sh(args)
    sh(["cmake", "-S", out, "-B", out + "/build"])
    sh(["cmake", "--build", out + "/build"])
    log = os.path.join(out, "log.jsonl")
    sh([out + "/build/train", "--quiet", "--init", init, "--data", data, "--steps", str(steps),
        "--lr", "1e-4", "--threads", str(threads), "--log", log])
    rows = [json.loads(l) for l in open(log)]
    rows = [r for r in rows if "step" in r]
    return [r["ms"] / 1000 for r in rows], [r["loss"] for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--recompute-layers", action="store_true")
    a = ap.parse_args()
    extra = ["--recompute", "layers"] if a.recompute_layers else []
    parc = os.path.join(a.build, "parc")
    work = a.out or os.path.join(a.build, "bench-train")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        words = "the quick model learns to predict the next byte of a small text".split()
        f.write(" ".join(words[(i * 7 + i // 3) % len(words)] for i in range(60000)))

    t0 = time.perf_counter()
    sh([parc, os.path.join(ROOT, "examples", "gpt2.dsl"), "-o", os.path.join(work, "gpt2_full")])
    compile_s = time.perf_counter() - t0
    print(f"compile examples/gpt2.dsl end to end (parc -o, incl. LLVM): {compile_s * 1000:.0f} ms")

    print(f"threads {a.threads}, {a.steps} steps each; median step time after the first" +
          ("; parc --recompute layers, PyTorch checkpointing each layer" if extra else "") + "\n")
    for name, dsl, defines, tcfg in CONFIGS:
        cfg = torch_ref.make_config("gpt2", **tcfg)
        batch = defines.get("batch", 4)
        init = os.path.join(work, dsl + ".init.safetensors")
        torch_ref.write_safetensors(init, torch_ref.init_params(cfg, seed=0))
        pt, pl = bench_parc(parc, dsl, defines, os.path.join(work, dsl), init, data, a.steps,
                            a.threads, extra)
        tt, tl = bench_torch(cfg, init, data, batch, a.steps, a.threads, bool(extra))
        tokens = batch * cfg["seq"]
        p_tps = tokens / statistics.median(pt[1:])
        t_tps = tokens / statistics.median(tt[1:])
        same = max(abs(x - y) / abs(y) for x, y in zip(pl, tl))
        print(f"{name}\n  parc    {p_tps:10.0f} tokens/s\n  pytorch {t_tps:10.0f} tokens/s"
              f"\n  ratio parc/pytorch: {p_tps / t_tps:.2f}   (losses agree to {same:.1e})\n")


if __name__ == "__main__":
    main()
