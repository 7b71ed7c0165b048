#!/usr/bin/env python3
"""Self-tests of the PyTorch oracle (torch_ref.py, make_init.py).

usage: test_oracle.py CASE WORKDIR [PARC]
cases: gradcheck semantics train data optimizer safetensors parc_params parc_interp
       parc_interp_moe
Exit 0 pass, 1 fail, 77 skip (no torch for this python, or no parc for parc_params)."""
import json
import math
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
sys.dont_write_bytecode = True   # no __pycache__ in the source tree

try:
    import numpy as np
    import torch
except ImportError as e:   # the oracle needs torch; the build does not
    print(f"SKIP: {sys.executable} cannot import torch/numpy ({e}); the oracle tests need "
          "python3-torch (Debian) for /usr/bin/python3")
    sys.exit(SKIP)

sys.path.insert(0, HERE)
import torch_ref as R  # noqa: E402

torch.set_num_threads(1)
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def run_tool(script, args, expect_rc=0, cli=False):
    """Runs a tool of this folder: its main() in this process (torch starts once), or with
    cli=True as a command under this python. Returns an object with returncode, stdout
    and stderr."""
    argv = [str(a) for a in args]
    if cli:
        r = subprocess.run([sys.executable, os.path.join(HERE, script)] + argv,
                           capture_output=True, text=True)
    else:
        import contextlib
        import io
        import types
        mod = __import__(script[:-3])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = mod.main(argv)
            except SystemExit as e:   # argparse errors
                rc = e.code
        r = types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())
    if r.returncode != expect_rc:
        errors.append(f"{script} {' '.join(map(str, args))}: exit {r.returncode}, expected "
                      f"{expect_rc}; stderr: {r.stderr.strip()[-800:]}")
    return r


def records(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def tiny_cfg(family):
    """A tiny config for exact float64 checks: GQA with 2 query heads per KV head."""
    if family == "gpt2":
        return R.make_config("gpt2", vocab=13, seq=6, d=16, heads=4, layers=2, ffn=24)
    return R.make_config("llama", vocab=13, seq=6, d=16, heads=4, kv_heads=2, ffn=24,
                         layers=2, theta=100.0, eps=1e-5)


def busy_params(cfg, seed=5):
    """float64 weights far from init symmetry: normal(0, 0.3) matrices, gains near 1 and
    biases near 0 with noise, so every nonlinearity is exercised."""
    P = R.init_params(cfg, seed=seed, std=0.3, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    for n, shape, kind in R.param_specs(cfg):
        if kind != "normal":
            P[n] = P[n] + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
    return P


def tiny_batch(cfg, B=2, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg["vocab"], (B, cfg["seq"]), generator=g)
    y = torch.randint(0, cfg["vocab"], (B, cfg["seq"]), generator=g)
    return x, y


PSEUDO_ENGLISH_WORDS = (
    "the of and a to in is was that for it with as his on be at by had are but from or "
    "have an they which one you were her all she there would their we him been has when "
    "who will more no if out so said what up its about into than them can only other new "
    "some could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right "
    "used take three river garden window morning evening letter market children").split()


def pseudo_english(nbytes):
    """Fixed pseudo-English text: sentences of common words picked by a 32-bit LCG."""
    state, out, size = 12345, [], 0
    while size < nbytes:
        state = (1103515245 * state + 12345) & 0x7FFFFFFF
        n = 5 + state % 9
        words = []
        for _ in range(n):
            state = (1103515245 * state + 12345) & 0x7FFFFFFF
            words.append(PSEUDO_ENGLISH_WORDS[(state >> 8) % len(PSEUDO_ENGLISH_WORDS)])
        s = " ".join(words)
        s = s[0].upper() + s[1:] + (". " if state % 5 else ".\n")
        out.append(s)
        size += len(s)
    return "".join(out).encode("ascii")[:nbytes]


# --------------------------------------------------------------------------------------
# (a) gradients against float64 finite differences
# --------------------------------------------------------------------------------------

def case_gradcheck(work):
    for family in ("gpt2", "llama"):
        cfg = tiny_cfg(family)
        P = busy_params(cfg)
        for p in P.values():
            p.requires_grad_(True)
        x, y = tiny_batch(cfg)
        R.loss_and_grads(cfg, P, x, y)
        grads = {n: p.grad.clone() for n, p in P.items()}
        g = torch.Generator().manual_seed(11)
        h, worst, checked = 1e-6, 0.0, 0
        with torch.no_grad():
            for n, p in P.items():
                flat = p.view(-1)
                idx = {0, flat.numel() - 1}
                idx |= {int(i) for i in torch.randint(0, flat.numel(), (2,), generator=g)}
                for i in sorted(idx):
                    old = float(flat[i])
                    flat[i] = old + h
                    lp = float(R.forward(cfg, P, x, y))
                    flat[i] = old - h
                    lm = float(R.forward(cfg, P, x, y))
                    flat[i] = old
                    fd = (lp - lm) / (2 * h)
                    an = float(grads[n].view(-1)[i])
                    err = abs(fd - an) / (1e-7 + abs(fd))
                    worst = max(worst, abs(fd - an))
                    checked += 1
                    check(abs(fd - an) <= 1e-8 + 1e-5 * abs(fd),
                          f"{family} {n}[{i}]: autograd {an:.12g} vs finite difference "
                          f"{fd:.12g} (rel {err:.2e})")
        # every parameter receives a gradient (none is disconnected from the loss)
        for n, gr in grads.items():
            check(float(gr.abs().sum()) > 0, f"{family} {n}: gradient is identically zero")
        # microbatches: mean of microbatch means == the mean over the batch
        x4, y4 = tiny_batch(cfg, B=4, seed=9)
        l1 = R.loss_and_grads(cfg, P, x4, y4, 1)
        g1 = {n: p.grad.clone() for n, p in P.items()}
        l2 = R.loss_and_grads(cfg, P, x4, y4, 2)
        check(abs(l1 - l2) < 1e-12, f"{family}: microbatched loss {l2} != {l1}")
        for n, p in P.items():
            check(torch.allclose(p.grad, g1[n], rtol=1e-10, atol=1e-13),
                  f"{family} {n}: microbatched gradient differs")
        print(f"{family}: {checked} elements, max |autograd - fd| = {worst:.2e}")


# --------------------------------------------------------------------------------------
# the torch model against a per-position, per-head reference written from the spec
# --------------------------------------------------------------------------------------

def naive_loss(cfg, W, tokens, targets):
    """Mean cross entropy from explicit loops over batch rows, positions and heads, in
    float64 numpy, straight from DESIGN.md's pinned semantics (independent of the
    vectorised torch code)."""
    d, H, KV, eps, L = cfg["d"], cfg["heads"], cfg["kv_heads"], cfg["eps"], cfg["layers"]
    hd, half = d // H, d // H // 2
    W = {n: t.detach().double().numpy() for n, t in W.items()}
    gpt2 = cfg["family"] == "gpt2"

    def ln(v, w, b):
        mu = sum(v) / len(v)
        var = sum((a - mu) ** 2 for a in v) / len(v)
        return np.array([(a - mu) / math.sqrt(var + eps) for a in v]) * w + b

    def rms(v, w):
        ms = sum(a * a for a in v) / len(v)
        return np.array([a / math.sqrt(ms + eps) for a in v]) * w

    def gelu(v):
        return np.array([0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) *
                                                  (a + 0.044715 * a ** 3))) for a in v])

    def silu(v):
        return np.array([a / (1 + math.exp(-a)) for a in v])

    def rope(v, t):   # one head's vector at position t
        out = v.copy()
        for i in range(half):
            a = t * cfg["theta"] ** (-2.0 * i / hd)
            x1, x2 = v[i], v[i + half]
            out[i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[i + half] = x2 * math.cos(a) + x1 * math.sin(a)
        return out

    total, count = 0.0, 0
    for row, trow in zip(tokens.tolist(), targets.tolist()):
        T = len(row)
        if gpt2:
            xs = [W["wte.weight"][row[t]] + W["wpe.weight"][t] for t in range(T)]
        else:
            xs = [W["model.embed_tokens.weight"][row[t]].copy() for t in range(T)]
        for layer in range(L):
            p = f"h.{layer}." if gpt2 else f"model.layers.{layer}."
            qs, ks, vs = [], [], []
            for t in range(T):
                if gpt2:
                    h = ln(xs[t], W[p + "ln_1.weight"], W[p + "ln_1.bias"])
                    qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
                    q, k, v = qkv[:d], qkv[d:2 * d], qkv[2 * d:]
                else:
                    h = rms(xs[t], W[p + "input_layernorm.weight"])
                    q = W[p + "self_attn.q_proj.weight"] @ h       # [out, in] @ x
                    k = W[p + "self_attn.k_proj.weight"] @ h
                    v = W[p + "self_attn.v_proj.weight"] @ h
                    q = np.concatenate([rope(q[j * hd:(j + 1) * hd], t) for j in range(H)])
                    k = np.concatenate([rope(k[j * hd:(j + 1) * hd], t) for j in range(KV)])
                qs.append(q), ks.append(k), vs.append(v)
            new = []
            for t in range(T):
                y = np.zeros(d)
                for head in range(H):
                    g = head // (H // KV)
                    qh = qs[t][head * hd:(head + 1) * hd]
                    s = [float(qh @ ks[u][g * hd:(g + 1) * hd]) / math.sqrt(hd)
                         for u in range(t + 1)]
                    m = max(s)
                    e = [math.exp(a - m) for a in s]
                    z = sum(e)
                    for u in range(t + 1):
                        y[head * hd:(head + 1) * hd] += e[u] / z * vs[u][g * hd:(g + 1) * hd]
                if gpt2:
                    x = xs[t] + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
                    h = ln(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
                    f = gelu(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
                    x = x + f @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
                else:
                    x = xs[t] + W[p + "self_attn.o_proj.weight"] @ y
                    h = rms(x, W[p + "post_attention_layernorm.weight"])
                    f = (silu(W[p + "mlp.gate_proj.weight"] @ h) *
                         (W[p + "mlp.up_proj.weight"] @ h))
                    x = x + W[p + "mlp.down_proj.weight"] @ f
                new.append(x)
            xs = new
        for t in range(T):
            if gpt2:
                logits = W["wte.weight"] @ ln(xs[t], W["ln_f.weight"], W["ln_f.bias"])
            else:
                logits = W["lm_head.weight"] @ rms(xs[t], W["model.norm.weight"])
            m = max(logits)
            total += m + math.log(sum(math.exp(a - m) for a in logits)) - logits[trow[t]]
            count += 1
    return total / count


def case_semantics(work):
    for family in ("gpt2", "llama"):
        cfg = tiny_cfg(family)
        P = busy_params(cfg)
        x, y = tiny_batch(cfg)
        with torch.no_grad():
            got = float(R.forward(cfg, P, x, y))
        want = naive_loss(cfg, P, x, y)
        check(abs(got - want) <= 1e-12 * abs(want),
              f"{family}: torch model loss {got!r} != per-position reference {want!r}")
        print(f"{family}: loss {got:.15f} vs reference {want:.15f}")
        # float32 runs the same model
        P32 = {n: t.float() for n, t in P.items()}
        with torch.no_grad():
            got32 = float(R.forward(cfg, P32, x, y))
        check(abs(got32 - want) < 1e-4 * abs(want), f"{family}: float32 loss {got32} vs {want}")
    # the hand-written pieces agree with torch's own implementations
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 16, generator=g, dtype=torch.float64) * 3
    w = torch.randn(16, generator=g, dtype=torch.float64)
    b = torch.randn(16, generator=g, dtype=torch.float64)
    F = torch.nn.functional
    check(torch.allclose(R.gelu_tanh(a), F.gelu(a, approximate="tanh"), rtol=1e-14, atol=1e-15),
          "gelu_tanh differs from F.gelu(approximate='tanh')")
    check(torch.allclose(R.layer_norm(a, w, b, 1e-5), F.layer_norm(a, (16,), w, b, 1e-5),
                         rtol=1e-12, atol=1e-13), "layer_norm differs from F.layer_norm")
    # rotate_half RoPE: position 0 is the identity; the rotation keeps norms; a pair
    # (i, i + hd/2) rotates by t * theta^(-2i/hd)
    cos, sin = R.rope_tables(7, 8, 10000.0, torch.float64)
    v = torch.randn(1, 1, 7, 8, generator=g, dtype=torch.float64)
    r = R.apply_rope(v, cos, sin)
    check(torch.allclose(r[..., 0, :], v[..., 0, :]), "rope at position 0 is not the identity")
    check(torch.allclose(r.norm(dim=-1), v.norm(dim=-1)), "rope does not preserve norms")
    ang = 5 * 10000.0 ** (-2 * 1 / 8)
    x1, x2 = float(v[0, 0, 5, 1]), float(v[0, 0, 5, 5])
    check(abs(float(r[0, 0, 5, 1]) - (x1 * math.cos(ang) - x2 * math.sin(ang))) < 1e-12 and
          abs(float(r[0, 0, 5, 5]) - (x2 * math.cos(ang) + x1 * math.sin(ang))) < 1e-12,
          "rope pair (1, 5) at position 5 is not the rotate_half rotation")


# --------------------------------------------------------------------------------------
# (b) training lowers the loss
# --------------------------------------------------------------------------------------

TRAIN_GPT2 = ["--family", "gpt2", "--vocab", 256, "--seq", 16, "--d", 32, "--heads", 4,
              "--layers", 2]
TRAIN_LLAMA = {"family": "llama", "vocab": 256, "seq": 16, "d": 32, "heads": 4,
               "kv_heads": 2, "ffn": 88, "layers": 2, "theta": 10000.0, "eps": 1e-5}


def case_train(work):
    data = os.path.join(work, "text.txt")
    with open(data, "wb") as f:
        f.write(pseudo_english(16384))
    lconf = os.path.join(work, "llama_tiny.json")
    with open(lconf, "w") as f:
        json.dump(TRAIN_LLAMA, f)
    common = ["--data", data, "--batch", 4, "--steps", 30, "--lr", 1e-2, "--threads", 1]
    runs = {"gpt2": (TRAIN_GPT2, ["--family", "gpt2", "--vocab", 256, "--seq", 16, "--d", 32,
                                  "--heads", 4, "--layers", 2]),
            "llama": (["--config", lconf], ["--config", lconf])}
    for family, (model_args, init_args) in runs.items():
        init = os.path.join(work, f"{family}_init.safetensors")
        final = os.path.join(work, f"{family}_final.safetensors")
        run_tool("make_init.py", init_args + ["--seed", 7, "-o", init], cli=True)
        r = run_tool("torch_ref.py", model_args + common + ["--init", init,
                                                           "--save-weights", final], cli=True)
        if r.returncode:
            continue
        recs = records(r.stdout)
        check([q["step"] for q in recs] == list(range(30)), f"{family}: steps {recs[:3]}...")
        check(all(q["lr"] == 1e-2 for q in recs), f"{family}: lr is not constant 1e-2")
        check(all(q["grad_norm"] > 0 and math.isfinite(q["grad_norm"]) for q in recs),
              f"{family}: grad norms not finite positive")
        first = recs[0]["loss"]
        last = sum(q["loss"] for q in recs[-5:]) / 5
        check(abs(first - math.log(256)) < 0.25,
              f"{family}: initial loss {first:.4f} is not near ln(256) = {math.log(256):.4f}")
        check(last < first - 1.5, f"{family}: loss {first:.4f} -> {last:.4f} (mean of the "
              "last 5 steps) did not drop by 1.5 nats")
        W0, _ = R.read_safetensors(init)
        W1, meta = R.read_safetensors(final)
        check(list(W1) == list(W0), f"{family}: saved weights have other names or order")
        check(all(not torch.equal(W0[n], W1[n]) for n in W0),
              f"{family}: some saved weights did not change")
        check(meta.get("steps") == "30", f"{family}: metadata {meta}")
        print(f"{family}: loss {first:.4f} -> {last:.4f} over 30 steps")


# --------------------------------------------------------------------------------------
# (c) the data order
# --------------------------------------------------------------------------------------

def independent_batch(tok, step, B, T):
    """DESIGN.md: sequence i = step*B + b starts at (i*T) mod (N-T-1); 0 if N == T+1."""
    N = len(tok)
    xs, ys = [], []
    for b in range(B):
        i = step * B + b
        s = 0 if N - T - 1 == 0 else (i * T) % (N - T - 1)
        xs.append(list(tok[s:s + T]))
        ys.append(list(tok[s + 1:s + T + 1]))
    return xs, ys


def write_llmc(path, tokens, version=1, count=None, extra=b""):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack(f"<{len(tokens)}H", *tokens) + extra)


def case_data(work):
    raw = pseudo_english(1000)
    rawp = os.path.join(work, "raw.txt")
    with open(rawp, "wb") as f:
        f.write(raw)
    toks = [(i * 7919 + 13) % 5003 for i in range(777)]   # > 255: needs uint16
    binp = os.path.join(work, "toks.bin")
    write_llmc(binp, toks)
    for path, want_tok, kind in ((rawp, list(raw), "bytes"), (binp, toks, "llmc")):
        got, k = R.load_tokens(path)
        check(k == kind and got.tolist() == want_tok, f"{path}: read as {k}, wrong tokens")
        for B, T in ((4, 16), (3, 50), (5, 7)):
            for step in (0, 1, 2, 5, 17, 123, 10 ** 6):
                x, y = R.get_batch(got, step, B, T)
                wx, wy = independent_batch(want_tok, step, B, T)
                check(x.tolist() == wx and y.tolist() == wy,
                      f"{kind}: batch of step {step} (B {B}, T {T}) differs from the formula")
    # N == T+1: the modulus is zero and every sequence starts at 0
    x, y = R.get_batch(np.arange(9), 3, 2, 8)
    check(x.tolist() == [list(range(8))] * 2 and y.tolist() == [list(range(1, 9))] * 2,
          "N == T+1 does not start every sequence at 0")
    check(R.seq_start(5, 10, 100) == 50 and R.seq_start(9, 10, 100) == 90 % 89,
          "seq_start disagrees with (i*T) mod (N-T-1)")
    # malformed llm.c files are rejected, not read as bytes
    for name, kw in (("ver2.bin", {"version": 2}), ("short.bin", {"count": 800}),
                     ("long.bin", {"extra": b"\0\0"})):
        p = os.path.join(work, name)
        write_llmc(p, toks, **kw)
        try:
            R.load_tokens(p)
            check(False, f"{name}: malformed llm.c file accepted")
        except R.FormatError:
            pass
    # end to end: with lr 0 the trainer's loss at step t is the model's loss on the
    # independently formed batch t (float64), so its batches follow the formula
    cfg = R.make_config("llama", vocab=256, seq=8, d=16, heads=2, kv_heads=1, ffn=24,
                        layers=1)
    init = os.path.join(work, "data_init.safetensors")
    short = os.path.join(work, "short.txt")
    with open(short, "wb") as f:
        f.write(raw[:40])   # N = 40, span 31: the order wraps within a few steps
    run_tool("make_init.py", ["--family", "llama", "--vocab", 256, "--seq", 8, "--d", 16,
                              "--heads", 2, "--kv-heads", 1, "--ffn", 24, "--layers", 1,
                              "-o", init])
    r = run_tool("torch_ref.py", ["--family", "llama", "--vocab", 256, "--seq", 8, "--d", 16,
                                  "--heads", 2, "--kv-heads", 1, "--ffn", 24, "--layers", 1,
                                  "--init", init, "--data", short, "--batch", 3,
                                  "--steps", 8, "--lr", 0, "--optimizer", "sgd",
                                  "--dtype", "float64"])
    if r.returncode == 0:
        W, _ = R.read_safetensors(init)
        P = {n: t.double() for n, t in W.items()}
        for rec in records(r.stdout):
            wx, wy = independent_batch(list(raw[:40]), rec["step"], 3, 8)
            with torch.no_grad():
                want = float(R.forward(cfg, P, torch.tensor(wx), torch.tensor(wy)))
            check(abs(rec["loss"] - want) < 1e-12,
                  f"step {rec['step']}: trainer loss {rec['loss']} != loss on the formula's "
                  f"batch {want}")
    # the trainer refuses tokens outside the vocab, naming the position
    r = run_tool("torch_ref.py", ["--family", "gpt2", "--vocab", 100, "--seq", 8, "--d", 8,
                                  "--heads", 2, "--layers", 1, "--data", binp, "--steps", 1],
                 expect_rc=1)
    check("outside the vocab" in r.stderr, f"out-of-vocab message: {r.stderr.strip()}")


# --------------------------------------------------------------------------------------
# schedules and optimizers against hand-written updates
# --------------------------------------------------------------------------------------

def case_optimizer(work):
    want = {("constant", 0): 1.0, ("constant", 50): 1.0,
            ("warmup", 0): 0.25, ("warmup", 3): 1.0, ("warmup", 9): 1.0,
            ("cosine", 0): 0.25, ("cosine", 2): 0.75, ("cosine", 4): 1.0,
            ("cosine", 7): 0.55, ("cosine", 10): 0.1, ("cosine", 15): 0.1}
    for (sched, t), v in want.items():
        got = R.lr_at(t, sched, 1.0, warmup=4, min_lr=0.1, steps=10)
        check(abs(got - v) < 1e-15, f"lr_at({t}, {sched}) = {got}, want {v}")
    check(abs(R.lr_at(3, "cosine", 1.0, 0, 0.0, 4) - 0.5 * (1 + math.cos(math.pi * 3 / 4)))
          < 1e-15, "cosine without warmup")

    data = os.path.join(work, "opt.txt")
    with open(data, "wb") as f:
        f.write(pseudo_english(3000))
    tokens, _ = R.load_tokens(data)

    def hand_run(cfg, init, steps, B, lr_fn, clip, update):
        P = {n: t.double().requires_grad_(True) for n, t in init.items()}
        state = {n: {} for n in P}
        norms = []
        for t in range(steps):
            x, y = R.get_batch(tokens, t, B, cfg["seq"])
            for p in P.values():
                p.grad = None
            R.forward(cfg, P, x, y).backward()
            norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in P.values()))
            norms.append(norm)
            coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
            with torch.no_grad():
                for n, p in P.items():
                    update(p, p.grad * coef, state[n], t + 1, lr_fn(t))
        return P, norms

    def adamw(b1, b2, eps, wd):
        def up(p, g, st, k, lr):
            if p.dim() >= 2:
                p.mul_(1 - lr * wd)          # decoupled decay, matrices only
            st["m"] = b1 * st.get("m", torch.zeros_like(p)) + (1 - b1) * g
            st["v"] = b2 * st.get("v", torch.zeros_like(p)) + (1 - b2) * g * g
            mhat = st["m"] / (1 - b1 ** k)
            vhat = st["v"] / (1 - b2 ** k)
            p.sub_(lr * mhat / (vhat.sqrt() + eps))
        return up

    def sgd(mom, wd):
        def up(p, g, st, k, lr):
            if p.dim() >= 2:
                g = g + wd * p               # torch.optim.SGD: L2 added to the gradient
            st["b"] = g.clone() if "b" not in st else mom * st["b"] + g
            p.sub_(lr * st["b"])
        return up

    cases = [
        ("gpt2", ["--family", "gpt2", "--vocab", 256, "--seq", 8, "--d", 16, "--heads", 2,
                  "--layers", 2],
         ["--optimizer", "adamw", "--beta1", 0.8, "--beta2", 0.9, "--eps-adam", 1e-6,
          "--wd", 0.5, "--lr", 3e-2, "--clip", 0.05, "--schedule", "warmup", "--warmup", 2],
         adamw(0.8, 0.9, 1e-6, 0.5), lambda t: 3e-2 * min(1.0, (t + 1) / 2), 0.05),
        ("llama", ["--family", "llama", "--vocab", 256, "--seq", 8, "--d", 16, "--heads", 4,
                   "--kv-heads", 2, "--ffn", 24, "--layers", 2],
         ["--optimizer", "sgd", "--momentum", 0.9, "--wd", 0.1, "--lr", 0.5,
          "--schedule", "cosine", "--warmup", 1, "--min-lr", 0.05],
         sgd(0.9, 0.1), lambda t: R.lr_at(t, "cosine", 0.5, 1, 0.05, 4), 0.0),
    ]
    for family, model_args, opt_args, update, lr_fn, clip in cases:
        init = os.path.join(work, f"opt_{family}_init.safetensors")
        final = os.path.join(work, f"opt_{family}_final.safetensors")
        grads = os.path.join(work, f"opt_{family}_grads.safetensors")
        run_tool("make_init.py", model_args + ["--seed", 3, "-o", init])
        r = run_tool("torch_ref.py", model_args + opt_args + [
            "--init", init, "--data", data, "--batch", 2, "--steps", 4, "--dtype", "float64",
            "--save-dtype", "float64", "--save-weights", final, "--save-grads", grads])
        if r.returncode:
            continue
        recs = records(r.stdout)
        W0, _ = R.read_safetensors(init)
        cfg = R.make_config(**{k: v for k, v in zip(
            [a[2:].replace("-", "_") for a in model_args[0::2]], model_args[1::2])})
        P, norms = hand_run(cfg, W0, 4, 2, lr_fn, clip, update)
        W1, _ = R.read_safetensors(final)
        worst = 0.0
        for n, p in P.items():
            diff = float((W1[n] - p.detach()).abs().max())
            worst = max(worst, diff)
            check(W1[n].dtype == torch.float64 and diff < 1e-12,
                  f"{family} {n}: trainer weights differ from the hand-written update by {diff}")
        for t, rec in enumerate(recs):
            check(abs(rec["grad_norm"] - norms[t]) < 1e-10 * norms[t],
                  f"{family} step {t}: grad_norm {rec['grad_norm']} vs {norms[t]}")
            check(abs(rec["lr"] - lr_fn(t)) < 1e-15, f"{family} step {t}: lr {rec['lr']}")
        if family == "gpt2":
            check(all(n > clip for n in norms), "the AdamW case should clip on every step")
        # the step-0 gradients: those of the initial weights on batch 0, before clipping
        G, meta = R.read_safetensors(grads)
        P0 = {n: t.double().requires_grad_(True) for n, t in W0.items()}
        x, y = R.get_batch(tokens, 0, 2, cfg["seq"])
        R.forward(cfg, P0, x, y).backward()
        check(list(G) == list(W0) and all(torch.allclose(G[n], P0[n].grad, rtol=1e-12,
                                                         atol=1e-15) for n in G),
              f"{family}: --save-grads is not the step-0 gradient")
        print(f"{family}: 4 steps match the hand-written update, max diff {worst:.1e}")


# --------------------------------------------------------------------------------------
# (d) safetensors
# --------------------------------------------------------------------------------------

def parse_st(path):
    """An independent parse: (header length, header dict, body bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    return hlen, json.loads(data[8:8 + hlen]), data[8 + hlen:]


def case_safetensors(work):
    gpt2 = ["--family", "gpt2", "--vocab", 300, "--seq", 32, "--d", 64, "--heads", 4,
            "--layers", 2]
    llama = ["--family", "llama", "--vocab", 300, "--seq", 32, "--d", 64, "--heads", 4,
             "--kv-heads", 1, "--ffn", 96, "--layers", 2, "--theta", 500000]
    for family, args in (("gpt2", gpt2), ("llama", llama)):
        p = os.path.join(work, f"st_{family}.safetensors")
        run_tool("make_init.py", args + ["--seed", 42, "-o", p], cli=True)
        # again, in this process (same code path as the command line, less start-up)
        p2 = os.path.join(work, f"st_{family}_again.safetensors")
        p3 = os.path.join(work, f"st_{family}_seed43.safetensors")
        run_tool("make_init.py", args + ["--seed", 42, "-o", p2])
        run_tool("make_init.py", args + ["--seed", 43, "-o", p3])
        if errors:
            return
        b1, b2, b3 = (open(q, "rb").read() for q in (p, p2, p3))
        check(b1 == b2, f"{family}: make_init is not deterministic")
        check(b1 != b3, f"{family}: make_init ignores --seed")
        cfg = R.make_config(**{k: v for k, v in zip([a[2:].replace("-", "_")
                                                     for a in args[0::2]], args[1::2])})
        specs = R.param_specs(cfg)
        hlen, header, body = parse_st(p)
        meta = header.pop("__metadata__", {})
        check((8 + hlen) % 8 == 0, f"{family}: data section not 8-aligned")
        check(list(header) == [n for n, _, _ in specs], f"{family}: names or order differ")
        pos = 0
        for n, shape, kind in specs:
            e = header.get(n, {})
            check(e.get("dtype") == "F32" and e.get("shape") == shape and
                  e.get("data_offsets") == [pos, pos + 4 * math.prod(shape)],
                  f"{family}: header entry {n}: {e}")
            pos += 4 * math.prod(shape)
        check(pos == len(body), f"{family}: data section {len(body)} bytes, want {pos}")
        W, meta2 = R.read_safetensors(p)
        check(meta2 == meta and meta.get("seed") == "42", f"{family}: metadata {meta2}")
        big = []
        for n, shape, kind in specs:
            b, e = header[n]["data_offsets"]
            vals = struct.unpack(f"<{(e - b) // 4}f", body[b:e])
            check(W[n].dtype == torch.float32 and list(W[n].shape) == shape and
                  W[n].flatten().tolist() == list(vals), f"{family} {n}: reader values differ")
            if kind == "ones":
                check(all(v == 1.0 for v in vals), f"{family} {n}: not ones")
            elif kind == "zeros":
                check(all(v == 0.0 for v in vals), f"{family} {n}: not zeros")
            else:
                big.extend(vals)
        m = sum(big) / len(big)
        sd = math.sqrt(sum((v - m) ** 2 for v in big) / len(big))
        check(abs(m) < 1e-3 and abs(sd - 0.02) < 0.0005, f"{family}: normal init mean {m} "
              f"std {sd}, want 0 and 0.02")
        # round trip: read -> write gives the same bytes
        q = os.path.join(work, f"st_{family}_rewritten.safetensors")
        R.write_safetensors(q, W, meta2)
        check(open(q, "rb").read() == b1, f"{family}: read -> write does not round-trip")

    # a file written by hand: unpadded header with newlines, entries not in data order,
    # F64, a scalar and an empty tensor
    tensors = [("b", [2, 3], "F32", [0.5 * i - 1 for i in range(6)]),
               ("a", [], "F64", [math.pi]), ("z", [0, 4], "F32", []),
               ("c", [3], "F32", [1e-40, -0.0, 3e38])]
    header, body = {"__metadata__": {"note": "hand"}}, b""
    for n, shape, dt, vals in tensors:
        blob = struct.pack(f"<{len(vals)}{'f' if dt == 'F32' else 'd'}", *vals)
        header[n] = {"dtype": dt, "shape": shape,
                     "data_offsets": [len(body), len(body) + len(blob)]}
        body += blob
    header = dict(reversed(list(header.items())))
    text = json.dumps(header, indent=1).encode()
    hp = os.path.join(work, "hand.safetensors")
    with open(hp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)
    W, meta = R.read_safetensors(hp)
    check(list(W) == ["b", "a", "z", "c"], f"hand file: tensors not in data order: {list(W)}")
    check(meta == {"note": "hand"}, f"hand file metadata {meta}")
    for n, shape, dt, vals in tensors:
        got = W[n].flatten().tolist()
        want = list(struct.unpack(f"<{len(vals)}{'f' if dt == 'F32' else 'd'}",
                                  struct.pack(f"<{len(vals)}{'f' if dt == 'F32' else 'd'}",
                                              *vals)))
        check(list(W[n].shape) == shape and got == want, f"hand file {n}: {W[n]}")

    # rejections: each must raise FormatError, never crash or read garbage
    good = open(os.path.join(work, "st_gpt2.safetensors"), "rb").read()
    hlen = struct.unpack("<Q", good[:8])[0]
    hdr = json.loads(good[8:8 + hlen])

    def with_header(h, body=None):
        t = json.dumps(h).encode()
        return struct.pack("<Q", len(t)) + t + (good[8 + hlen:] if body is None else body)

    def edit(fn):
        h = json.loads(good[8:8 + hlen])
        fn(h)
        return with_header(h)

    first, second = "wte.weight", "wpe.weight"
    bad = {
        "truncated by one byte": good[:-1],
        "truncated in the data": good[:8 + hlen + 100],
        "truncated in the header": good[:8 + hlen // 2],
        "only 5 bytes": good[:5],
        "empty": b"",
        "header length past the end": struct.pack("<Q", 1 << 40) + good[8:],
        "bad JSON": struct.pack("<Q", 4) + b"{oops" + good[8 + hlen:],
        "JSON array": with_header([1, 2]),
        "dtype I32": edit(lambda h: h[first].update(dtype="I32")),
        "dtype BF16": edit(lambda h: h[first].update(dtype="BF16")),
        "shape disagrees with size": edit(lambda h: h[first].update(shape=[256, 65])),
        "negative shape": edit(lambda h: h[first].update(shape=[-300, -64])),
        "overlap": edit(lambda h: h[second].update(
            data_offsets=[h[second]["data_offsets"][0] - 4, h[second]["data_offsets"][1] - 4])),
        "hole": with_header(hdr, good[8 + hlen:] + b"\0\0\0\0"),
        "offsets reversed": edit(lambda h: h[first].update(
            data_offsets=h[first]["data_offsets"][::-1])),
        "metadata not strings": edit(lambda h: h.update(__metadata__={"seed": 42})),
        "duplicate name": struct.pack("<Q", 0),   # replaced below
    }
    dup = good[8:8 + hlen].decode().rstrip()
    entry = '"ln_f.bias":' + json.dumps(hdr["ln_f.bias"])
    dup = dup[:-1] + "," + entry + "}"
    bad["duplicate name"] = struct.pack("<Q", len(dup)) + dup.encode() + good[8 + hlen:]
    # ln_f.bias (the last tensor) aliased onto ln_f.weight: an overlap with no hole
    alias = json.loads(good[8:8 + hlen])
    nb = alias["ln_f.bias"]["data_offsets"][1] - alias["ln_f.bias"]["data_offsets"][0]
    alias["ln_f.bias"]["data_offsets"] = list(alias["ln_f.weight"]["data_offsets"])
    bad["aliased tensors"] = with_header(alias, good[8 + hlen:len(good) - nb])
    for what, blob in bad.items():
        p = os.path.join(work, "bad.safetensors")
        with open(p, "wb") as f:
            f.write(blob)
        try:
            R.read_safetensors(p)
            check(False, f"reader accepted a file with {what}")
        except R.FormatError:
            pass
        except Exception as e:   # noqa: BLE001 -- any other exception is a reader bug
            check(False, f"reader crashed on a file with {what}: {type(e).__name__}: {e}")
    # the trainer refuses a truncated --init, and one of another config, naming why
    p = os.path.join(work, "truncated.safetensors")
    with open(p, "wb") as f:
        f.write(good[:-3])
    args = ["--family", "gpt2", "--vocab", 300, "--seq", 32, "--d", 64, "--heads", 4,
            "--layers", 2, "--steps", 0]
    r = run_tool("torch_ref.py", args + ["--init", p], expect_rc=1, cli=True)
    check("truncated" in r.stderr, f"truncated --init message: {r.stderr.strip()}")
    wrong = list(args)
    wrong[wrong.index("--d") + 1] = 32
    r = run_tool("torch_ref.py", wrong + ["--init", os.path.join(work, "st_gpt2.safetensors")],
                 expect_rc=1)
    check("wte.weight has shape [300, 64]" in r.stderr, f"shape message: {r.stderr.strip()}")


# --------------------------------------------------------------------------------------
# the oracle's parameters are parc's (names, order, shapes, init kinds)
# --------------------------------------------------------------------------------------

def case_parc_params(work, parc, examples):
    import re
    runs = [("gpt2_tiny", []), ("gpt2_tiny", ["-D", "layers=2", "-D", "d=32", "-D", "ffn=48"]),
            ("llama_tiny", []), ("llama_tiny", ["-D", "kv_heads=1", "-D", "layers=3"]),
            ("gpt2", []), ("llama", [])]
    for model, defs in runs:
        r = subprocess.run([parc, os.path.join(examples, model + ".dsl"), "--emit", "ir"] + defs,
                           capture_output=True, text=True)
        if not check(r.returncode == 0, f"parc {model} {defs}: exit {r.returncode} "
                     f"{r.stderr.strip()}"):
            continue
        conf = re.search(r"^config (.*)$", r.stdout, re.M).group(1)
        vals = dict(kv.split(" = ") for kv in conf.split(", "))
        family = "gpt2" if model.startswith("gpt2") else "llama"
        cfg = R.make_config(family, vocab=int(vals["vocab"]), seq=int(vals["seq"]),
                            d=int(vals["d"]), heads=int(vals["heads"]),
                            layers=int(vals["layers"]), kv_heads=int(vals.get("kv_heads",
                                                                              vals["heads"])),
                            ffn=int(vals["ffn"]), theta=float(vals.get("theta", 1e4)),
                            eps=float(vals.get("eps", 1e-5)))
        got = []
        for m in re.finditer(r"= param (\S+) : f32\[([0-9, ]*)\] init (\w+)", r.stdout):
            got.append((m.group(1), [int(s) for s in m.group(2).split(",")], m.group(3)))
        want = R.param_specs(cfg)
        check(got == [(n, s, k) for n, s, k in want],
              f"parc {model} {defs}: parameters differ from the oracle's:\n  parc   "
              f"{got[:6]}...\n  oracle {want[:6]}...")
        # the model's norm eps and GPT-2's fixed LayerNorm eps reach the IR as the oracle's
        eps = re.findall(r"(?:layer_norm|rms_norm) .* eps=(\S+)", r.stdout)
        check(eps and all(float(e) == cfg["eps"] for e in eps), f"parc {model}: norm eps {eps}")
        scales = re.findall(r"= sdpa .* scale=(\S+)", r.stdout)
        hd = cfg["d"] // cfg["heads"]
        check(scales and all(abs(float(s) - 1 / math.sqrt(hd)) < 1e-8 for s in scales),
              f"parc {model}: sdpa scales {set(scales)}, want 1/sqrt({hd})")
        print(f"parc {model} {' '.join(defs)}: {len(got)} parameters agree")


# --------------------------------------------------------------------------------------
# parc's reference interpreter as a trainer against the oracle, step by step
# --------------------------------------------------------------------------------------

SGD_TRAIN = """train {
  batch = 2  microbatches = 1  steps = 5  lr = 0.05
  optimizer = sgd(momentum = 0.9, wd = 0.1)
  schedule = warmup(warmup = 2)
  clip = 0.5  precision = fp32  seed = 1
}
"""
ADAMW_TRAIN = """train {
  batch = 3  microbatches = 1  steps = 5  lr = 0.02
  optimizer = adamw(beta1 = 0.8, beta2 = 0.99, eps = 1e-6, wd = 0.5)
  schedule = constant
  clip = 0  precision = fp32  seed = 1
}
"""


def case_parc_interp(work, tool, examples, moe=False):
    """moe: the Mixtral family instead (examples/moe_tiny.dsl: Switch load balancing,
    dropless and with a capacity factor, router z-loss, shared expert), from weights
    of std 0.2 so that routing and the auxiliary losses matter."""
    import re
    text = pseudo_english(4000)
    raw = os.path.join(work, "text.txt")
    with open(raw, "wb") as f:
        f.write(text)
    binp = os.path.join(work, "text.bin")
    write_llmc(binp, list(text))

    def variant(model, train):
        src = open(os.path.join(examples, model + ".dsl")).read()
        src, n = re.subn(r"\ntrain \{.*?\n\}\n", "\n" + train, src, flags=re.S)
        p = os.path.join(work, f"{model}_{'sgd' if 'sgd' in train else 'adamw'}.dsl")
        with open(p, "w") as f:
            f.write(src)
        return p if check(n == 1, f"{model}.dsl: no train section to replace") else None

    small = ["seq=8", "d=16", "layers=2", "ffn=24"]
    runs = [  # (name, dsl, data, overrides)
        ("gpt2_tiny", os.path.join(examples, "gpt2_tiny.dsl"), raw,
         small + ["steps=6", "batch=2", "lr=0.01"]),   # the file's adamw, cosine, clip 1
        ("llama_tiny", os.path.join(examples, "llama_tiny.dsl"), binp,
         small + ["steps=6", "batch=3", "lr=0.01"]),
        ("llama_tiny sgd", variant("llama_tiny", SGD_TRAIN), raw,
         small + ["kv_heads=1", "theta=500000.0", "eps=1e-6"]),
        ("gpt2_tiny adamw", variant("gpt2_tiny", ADAMW_TRAIN), binp, small),
    ]
    if moe:
        tiny = os.path.join(examples, "moe_tiny.dsl")
        small = ["seq=8", "d=16", "layers=2", "ffn=12", "heads=4", "kv_heads=2", "experts=4",
                 "top_k=2"]
        runs = [
            ("moe_tiny", tiny, raw, small + ["steps=6", "batch=2", "lr=0.01"]),
            ("moe_tiny z-loss shared", tiny, binp,
             small + ["steps=6", "batch=2", "lr=0.01", "z_loss=0.05", "shared_ffn=20"]),
            ("moe_tiny adamw capacity z-loss shared", variant("moe_tiny", ADAMW_TRAIN), raw,
             small + ["capacity=0.5", "aux_loss=0.1", "z_loss=0.02", "shared_ffn=8",
                      "top_k=1"]),
        ]
    for name, dsl, data, defs in runs:
        if dsl is None:
            continue
        tag = name.replace(" ", "_")
        r = subprocess.run([tool, dsl, "-", data, "-"] + defs, capture_output=True, text=True)
        if not check(r.returncode == 0, f"{name}: interp_train settings: {r.stderr.strip()}"):
            continue
        settings = json.loads(r.stdout.splitlines()[0])["settings"]
        settings["family"] = ("gpt2" if name.startswith("gpt2") else
                              "mixtral" if name.startswith("moe") else "llama")
        conf = os.path.join(work, tag + ".json")
        with open(conf, "w") as f:
            json.dump(settings, f)
        init = os.path.join(work, tag + "_init.safetensors")
        run_tool("make_init.py", ["--config", conf, "--seed", 5, "-o", init] +
                 (["--std", 0.2] if moe else []))
        pout = os.path.join(work, tag + "_parc.safetensors")
        r = subprocess.run([tool, dsl, init, data, pout] + defs, capture_output=True, text=True)
        if not check(r.returncode == 0, f"{name}: interp_train: {r.stderr.strip()}"):
            continue
        parc = records(r.stdout)[1:]
        tout = os.path.join(work, tag + "_torch.safetensors")
        t = run_tool("torch_ref.py", ["--config", conf, "--init", init, "--data", data,
                                      "--dtype", "float64", "--save-dtype", "float64",
                                      "--save-weights", tout])
        if t.returncode:
            continue
        ref = records(t.stdout)
        check(len(parc) == len(ref) == settings["steps"], f"{name}: step counts differ")
        for a, b in zip(parc, ref):
            for k in ("loss", "grad_norm", "lr"):
                check(abs(a[k] - b[k]) <= 1e-10 * abs(b[k]) + 1e-15,
                      f"{name} step {b['step']}: {k} parc {a[k]!r} vs torch {b[k]!r}")
        A, _ = R.read_safetensors(pout)
        Bw, _ = R.read_safetensors(tout)
        check(list(A) == list(Bw), f"{name}: parameter names or order differ")
        worst = 0.0
        for n in Bw:
            if n in A:
                d = float(((A[n].double() - Bw[n]).abs() / Bw[n].abs().clamp(min=1)).max())
                worst = max(worst, d)
                check(d < 1e-6, f"{name} {n}: final weights differ by {d:.2e} (relative)")
        print(f"{name}: {len(ref)} steps, loss {ref[0]['loss']:.6f} -> {ref[-1]['loss']:.6f}, "
              f"weights agree to {worst:.1e}")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    case, work = sys.argv[1], sys.argv[2]
    work = os.path.join(work, "oracle_" + case)
    os.makedirs(work, exist_ok=True)
    cases = {"gradcheck": case_gradcheck, "semantics": case_semantics, "train": case_train,
             "data": case_data, "optimizer": case_optimizer, "safetensors": case_safetensors}
    if case in ("parc_interp", "parc_interp_moe"):
        if len(sys.argv) < 5:
            print("SKIP: no interp_train executable given")
            return SKIP
        if not os.access(sys.argv[3], os.X_OK):
            print(f"FAIL: {sys.argv[3]} is not an executable (build it first)")
            return 1
        case_parc_interp(work, sys.argv[3], sys.argv[4], moe=case == "parc_interp_moe")
    elif case == "parc_params":
        if len(sys.argv) < 5:
            print("SKIP: no parc executable given")
            return SKIP
        if not os.access(sys.argv[3], os.X_OK):
            print(f"FAIL: {sys.argv[3]} is not an executable (build it first)")
            return 1
        case_parc_params(work, sys.argv[3], sys.argv[4])
    elif case in cases:
        cases[case](work)
    else:
        print(f"unknown case {case!r}; one of {', '.join(cases)}, parc_params, parc_interp")
        return 2
    for e in errors:
        print("FAIL:", e)
    print(f"oracle/{case}: {'FAIL' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
