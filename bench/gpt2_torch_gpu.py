#!/usr/bin/env python3
"""bench/gpt2_torch_gpu.py -- the named competitor for parc's GPU trainer: GPT-2
small (the model of examples/gpt2.dsl: vocab 50257, 12 layers, d 768, 12 heads,
seq 1024, tied embeddings, GELU tanh, pre-LN) trained in PyTorch on one GPU.

PyTorch as users run it without extra work: eager mode, bf16 autocast (fp32
master weights), scaled_dot_product_attention (flash kernels on Hopper), fused
AdamW (0.9, 0.95, wd 0.1), clip 1.0; batch 8 x 1024 random tokens.  Writes a
JSON-lines log in the trainer's format ({"step", "loss", "ms", "tokens_per_s"})
so that tests/gpu/compare.py bench reads both with the same FLOP count
(parc's plan.json).  --compile adds torch.compile (minutes of compile time).

  python3 bench/gpt2_torch_gpu.py --steps 30 --log torch.jsonl
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab, seq, d, heads, layers):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--log", required=True, help="JSON-lines log to write")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = ap.parse_args()
    torch.manual_seed(1337)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT2(50257, a.seq, 768, 12, 12).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_fn = torch.compile(model) if a.compile else model
    gen = torch.Generator(device=dev).manual_seed(1)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {nparams:,} parameters, "
          f"B {a.batch} x T {a.seq}, {'compiled' if a.compile else 'eager'}", flush=True)
    with open(a.log, "w") as log:
        for step in range(a.steps):
            tokens = torch.randint(0, 50257, (a.batch, a.seq + 1), device=dev, generator=gen)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_fn(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            rec = {"step": step, "loss": loss.item(), "ms": ms,
                   "tokens_per_s": a.batch * a.seq / (ms * 1e-3)}
            log.write(json.dumps(rec) + "\n")
            if step % 10 == 0 or step == a.steps - 1:
                print(f"step {step}: loss {rec['loss']:.4f}, {ms:.1f} ms, "
                      f"{rec['tokens_per_s']:,.0f} tokens/s", flush=True)
    if not math.isfinite(loss.item()):
        raise SystemExit("loss is not finite")


if __name__ == "__main__":
    main()
