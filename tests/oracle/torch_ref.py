#!/usr/bin/env python3
"""torch_ref.py -- an independent PyTorch reference trainer for parc's GPT-2, Llama and
Mixtral (MoE) families: the oracle that parc's generated trainers are compared against.

The model is written plainly in torch ops from the pinned semantics of
/work/shared/DESIGN.md (Hugging Face parameter names and layouts); the data order,
learning-rate schedules and optimizers are those of parc's runtime, written again here
from their specifications. See tests/oracle/README.md.

Usage (every model option may also come from --config FILE.json; flags win):
  torch_ref.py --family gpt2 --vocab 256 --seq 64 --d 64 --heads 4 --layers 4 \\
      --init W.safetensors --data tokens.bin --batch 4 --steps 100 --lr 1e-3 \\
      --clip 1.0 --schedule cosine --warmup 10 --min-lr 1e-4 [--out log.jsonl]
Prints one JSON object per step: {"step": t, "loss": L, "grad_norm": G, "lr": lr}.

Only the standard library, numpy and torch are used; the module is importable (the
self-tests and make_init.py use its functions)."""
import argparse
import collections
import json
import math
import os
import struct
import sys

import numpy as np
import torch

# --------------------------------------------------------------------------------------
# safetensors (json + struct; no safetensors package)
# --------------------------------------------------------------------------------------

ST_DTYPES = {"F32": ("<f4", 4, torch.float32), "F64": ("<f8", 8, torch.float64)}
ST_MAX_HEADER = 100 << 20   # as the reference reader


class FormatError(Exception):
    """A file (safetensors, token data, config) that does not follow its format."""


def _reject_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise FormatError(f"duplicate key {k!r} in the JSON header")
        seen[k] = v
    return seen


def read_safetensors(path):
    """Reads a safetensors file of F32 (or F64) tensors.

    Returns (tensors, metadata): an OrderedDict name -> torch tensor (its own dtype),
    in data order, and the __metadata__ dict (str -> str, {} if absent). Raises
    FormatError naming the file for anything the format does not allow: short file,
    header outside the file, invalid JSON, unknown dtype, bad shape, offsets outside
    the data section, a size that disagrees with the shape, overlaps or holes."""
    with open(path, "rb") as f:
        data = f.read()

    def bad(msg):
        return FormatError(f"safetensors file {path}: {msg}")

    if len(data) < 8:
        raise bad(f"only {len(data)} bytes; the 8-byte header length is missing (truncated?)")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > ST_MAX_HEADER:
        raise bad(f"header length {hlen} exceeds the {ST_MAX_HEADER}-byte limit")
    if 8 + hlen > len(data):
        raise bad(f"header of {hlen} bytes runs past the end of the {len(data)}-byte file "
                  "(truncated?)")
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"),
                            object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"header is not valid JSON: {e}") from None
    except FormatError as e:
        raise bad(str(e)) from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    body = data[8 + hlen:]
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        raise bad("__metadata__ must map strings to strings")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise bad(f"tensor {name}: entry is not an object")
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise bad(f"tensor {name}: dtype {dt!r} is not supported (F32 or F64)")
        shape = info.get("shape")
        if (not isinstance(shape, list)
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                           for s in shape)):
            raise bad(f"tensor {name}: shape {shape!r} is not a list of non-negative ints")
        offs = info.get("data_offsets")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise bad(f"tensor {name}: data_offsets {offs!r} is not [begin, end]")
        b, e = offs
        if not 0 <= b <= e:
            raise bad(f"tensor {name}: data_offsets [{b}, {e}] are not ordered")
        if e > len(body):
            raise bad(f"tensor {name}: data_offsets [{b}, {e}] run past the {len(body)}-byte "
                      "data section (truncated?)")
        numel = math.prod(shape)
        if e - b != numel * ST_DTYPES[dt][1]:
            raise bad(f"tensor {name}: {e - b} bytes for shape {shape} of {dt}")
        entries.append((b, e, name, dt, shape))
    entries.sort(key=lambda x: (x[0], x[1]))
    pos = 0
    for b, e, name, _, _ in entries:
        if b != pos:
            raise bad(f"tensor {name}: begins at {b}, expected {pos} "
                      f"({'overlap' if b < pos else 'hole'} in the data section)")
        pos = e
    if pos != len(body):
        raise bad(f"data section has {len(body)} bytes but the tensors cover {pos}")
    out = collections.OrderedDict()
    for b, e, name, dt, shape in entries:
        npdt, _, tdt = ST_DTYPES[dt]
        arr = np.frombuffer(body, dtype=npdt, count=(e - b) // ST_DTYPES[dt][1], offset=b)
        native = np.float32 if dt == "F32" else np.float64
        out[name] = torch.from_numpy(arr.astype(native)).reshape(shape)
    return out, meta


def write_safetensors(path, tensors, metadata=None, dtype="F32"):
    """Writes (name, tensor) pairs (a list or a dict, in that order) as dtype F32 or F64.

    Tensors are contiguous in the given order; the header is compact JSON padded with
    spaces so the data section starts 8-aligned. Written to a temporary file in the same
    directory and renamed, so readers never see half a file."""
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    npdt, size, _ = ST_DTYPES[dtype]
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in items:
        arr = t.detach().to("cpu", torch.float64).contiguous().numpy().astype(npdt)
        blob = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# model configuration and parameters
# --------------------------------------------------------------------------------------

# Model keys, each with the names accepted in a --config JSON file (parc's config names
# first, then Hugging Face config.json names).
MODEL_KEYS = {
    "family": ("family", "model_type"),
    "vocab": ("vocab", "vocab_size"),
    "seq": ("seq", "n_positions", "n_ctx"),
    "d": ("d", "n_embd", "hidden_size"),
    "heads": ("heads", "n_head", "num_attention_heads"),
    "kv_heads": ("kv_heads", "num_key_value_heads"),
    "ffn": ("ffn", "n_inner", "intermediate_size"),
    "layers": ("layers", "n_layer", "num_hidden_layers"),
    "theta": ("theta", "rope_theta"),
    "eps": ("eps", "layer_norm_epsilon", "rms_norm_eps"),
    # mixtral only (parc's moe block): experts, top-k, the Switch load-balancing and
    # ST-MoE router z-loss coefficients, the capacity factor (0: dropless) and the width
    # of a DeepSeek-style shared expert (0: none)
    "experts": ("experts", "num_local_experts"),
    "top_k": ("top_k", "num_experts_per_tok"),
    "aux_loss": ("aux_loss", "router_aux_loss_coef"),
    "z_loss": ("z_loss", "router_z_loss_coef"),
    "capacity": ("capacity",),
    "shared_ffn": ("shared_ffn",),
}

FAMILIES = ("gpt2", "llama", "mixtral")


def make_config(family, vocab, seq, d, heads, layers, kv_heads=None, ffn=None,
                theta=10000.0, eps=1e-5, experts=None, top_k=None, aux_loss=None,
                z_loss=None, capacity=None, shared_ffn=None):
    """A checked model configuration dict (the defaults follow parc's prelude)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, not {family!r}")
    cfg = {"family": family, "vocab": int(vocab), "seq": int(seq), "d": int(d),
           "heads": int(heads), "layers": int(layers),
           "kv_heads": int(kv_heads if kv_heads is not None else heads),
           "ffn": int(ffn if ffn is not None else 4 * int(d)),
           "theta": float(theta), "eps": float(eps)}
    if family == "mixtral":
        if experts is None or top_k is None:
            raise ValueError("mixtral needs experts and top_k")
        cfg.update(experts=int(experts), top_k=int(top_k),
                   aux_loss=float(aux_loss if aux_loss is not None else 0.01),
                   z_loss=float(z_loss or 0.0), capacity=float(capacity or 0.0),
                   shared_ffn=int(shared_ffn or 0))
        if not 1 <= cfg["top_k"] <= cfg["experts"]:
            raise ValueError(f"top_k = {cfg['top_k']} must be in [1, experts]")
        if cfg["capacity"] < 0 or cfg["shared_ffn"] < 0:
            raise ValueError("capacity and shared_ffn must not be negative")
    for k in ("vocab", "seq", "d", "heads", "layers", "kv_heads", "ffn"):
        if cfg[k] <= 0 and not (k == "layers" and cfg[k] == 0):
            raise ValueError(f"{k} = {cfg[k]} must be positive")
    if cfg["d"] % cfg["heads"]:
        raise ValueError(f"d = {cfg['d']} is not divisible by heads = {cfg['heads']}")
    if cfg["heads"] % cfg["kv_heads"]:
        raise ValueError(f"heads = {cfg['heads']} is not divisible by kv_heads = "
                         f"{cfg['kv_heads']}")
    if family == "gpt2" and cfg["kv_heads"] != cfg["heads"]:
        raise ValueError("gpt2 has no grouped-query attention: kv_heads must equal heads")
    if family != "gpt2" and (cfg["d"] // cfg["heads"]) % 2:
        raise ValueError(f"head dim {cfg['d'] // cfg['heads']} must be even for RoPE")
    if not cfg["eps"] > 0 or not cfg["theta"] > 0:
        raise ValueError("eps and theta must be positive")
    return cfg


def param_specs(cfg):
    """[(name, shape, init)] in parc's declaration order; init is 'normal', 'ones' or
    'zeros'. GPT-2 Conv1D weights are [in, out]; Llama Linear weights are [out, in].
    Mixtral's experts are parc's stacked tensors (w1, w3 [E, ffn, d], w2 [E, d, ffn])."""
    V, T, d, F, L = cfg["vocab"], cfg["seq"], cfg["d"], cfg["ffn"], cfg["layers"]
    out = []
    if cfg["family"] == "gpt2":
        out += [("wte.weight", [V, d], "normal"), ("wpe.weight", [T, d], "normal")]
        for i in range(L):
            p = f"h.{i}."
            out += [(p + "ln_1.weight", [d], "ones"), (p + "ln_1.bias", [d], "zeros"),
                    (p + "attn.c_attn.weight", [d, 3 * d], "normal"),
                    (p + "attn.c_attn.bias", [3 * d], "zeros"),
                    (p + "attn.c_proj.weight", [d, d], "normal"),
                    (p + "attn.c_proj.bias", [d], "zeros"),
                    (p + "ln_2.weight", [d], "ones"), (p + "ln_2.bias", [d], "zeros"),
                    (p + "mlp.c_fc.weight", [d, F], "normal"),
                    (p + "mlp.c_fc.bias", [F], "zeros"),
                    (p + "mlp.c_proj.weight", [F, d], "normal"),
                    (p + "mlp.c_proj.bias", [d], "zeros")]
        out += [("ln_f.weight", [d], "ones"), ("ln_f.bias", [d], "zeros")]
    else:
        hd = d // cfg["heads"]
        kvd = cfg["kv_heads"] * hd
        out += [("model.embed_tokens.weight", [V, d], "normal")]
        for i in range(L):
            p = f"model.layers.{i}."
            out += [(p + "input_layernorm.weight", [d], "ones"),
                    (p + "self_attn.q_proj.weight", [d, d], "normal"),
                    (p + "self_attn.k_proj.weight", [kvd, d], "normal"),
                    (p + "self_attn.v_proj.weight", [kvd, d], "normal"),
                    (p + "self_attn.o_proj.weight", [d, d], "normal"),
                    (p + "post_attention_layernorm.weight", [d], "ones")]
            if cfg["family"] == "llama":
                out += [(p + "mlp.gate_proj.weight", [F, d], "normal"),
                        (p + "mlp.up_proj.weight", [F, d], "normal"),
                        (p + "mlp.down_proj.weight", [d, F], "normal")]
                continue
            E, S, q = cfg["experts"], cfg["shared_ffn"], p + "block_sparse_moe."
            out += [(q + "gate.weight", [E, d], "normal"), (q + "w1", [E, F, d], "normal"),
                    (q + "w3", [E, F, d], "normal"), (q + "w2", [E, d, F], "normal")]
            if S:
                out += [(q + "shared_experts.gate_proj.weight", [S, d], "normal"),
                        (q + "shared_experts.up_proj.weight", [S, d], "normal"),
                        (q + "shared_experts.down_proj.weight", [d, S], "normal")]
        out += [("model.norm.weight", [d], "ones"), ("lm_head.weight", [V, d], "normal")]
    return out


def init_params(cfg, seed=0, std=0.02, dtype=torch.float32):
    """Deterministic initial weights: normal(0, std) for matrices and embeddings drawn in
    param_specs order from one torch.Generator seeded with `seed`, ones for norm gains,
    zeros for biases. Computed in float32 (then cast), so the values do not depend on
    dtype."""
    g = torch.Generator().manual_seed(int(seed))
    out = collections.OrderedDict()
    for name, shape, kind in param_specs(cfg):
        if kind == "normal":
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=g)
        elif kind == "ones":
            t = torch.ones(shape, dtype=torch.float32)
        else:
            t = torch.zeros(shape, dtype=torch.float32)
        out[name] = t.to(dtype)
    return out


def check_params(cfg, tensors, path="<weights>"):
    """Checks that tensors holds exactly the parameters of cfg with their shapes (GPT-2's
    wpe may have more rows than seq, as Hugging Face's n_positions; rows [0, seq) are
    used)."""
    specs = param_specs(cfg)
    want = {n for n, _, _ in specs}
    missing = [n for n, _, _ in specs if n not in tensors]
    extra = sorted(n for n in tensors if n not in want)
    if missing:
        raise FormatError(f"{path}: missing parameter(s) {', '.join(missing[:5])}"
                          f"{' ...' if len(missing) > 5 else ''}")
    if extra:
        raise FormatError(f"{path}: unexpected tensor(s) {', '.join(extra[:5])}"
                          f"{' ...' if len(extra) > 5 else ''} for family {cfg['family']}")
    for name, shape, _ in specs:
        got = list(tensors[name].shape)
        if name == "wpe.weight" and len(got) == 2 and got[1] == shape[1] and got[0] >= shape[0]:
            continue
        if got != shape:
            raise FormatError(f"{path}: {name} has shape {got}, the config needs {shape}")


# --------------------------------------------------------------------------------------
# the model, plainly in torch ops
# --------------------------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    """(x - mean) / sqrt(biased var + eps) * w + b over the last dimension."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last dimension."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    """GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def split_heads(x, heads):
    """[B, T, heads*hd] -> [B, heads, T, hd]; head h is channels [h*hd, (h+1)*hd)."""
    B, T, C = x.shape
    return x.reshape(B, T, heads, C // heads).transpose(1, 2)


def merge_heads(x):
    """[B, H, T, hd] -> [B, T, H*hd]."""
    B, H, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, T, H * hd)


def causal_attention(q, k, v):
    """q [B, H, T, hd], k and v [B, KV, T, hd]: causal softmax attention with scale
    1/sqrt(hd); query head h reads kv head h // (H/KV)."""
    H, T, hd = q.shape[1], q.shape[2], q.shape[3]
    KV = k.shape[1]
    if KV != H:
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    s = s.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def rope_tables(T, hd, theta, dtype):
    """cos and sin [T, hd] of the angles t * theta^(-2i/hd), i in [0, hd/2), repeated over
    both halves (Hugging Face's layout). Angles are computed in float64, then cast."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """Hugging Face's rotate_half RoPE on x [B, H, T, hd], position t = index along T."""
    return x * cos + rotate_half(x) * sin


def cross_entropy(logits, targets):
    """Mean over all positions of logsumexp(logits) - logits[target]."""
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (lse - picked).mean()


def swiglu(h, gate, up, down):
    """Llama's MLP, down(silu(gate(h)) * up(h)), Linear weights [out, in]."""
    return torch.matmul(torch.nn.functional.silu(torch.matmul(h, gate.t())) *
                        torch.matmul(h, up.t()), down.t())


def moe(cfg, P, q, h):
    """parc's moe block on h [B, T, d] with the parameters under prefix q: the routed
    output plus the shared expert's, and the layer's auxiliary loss terms (Switch load
    balancing, ST-MoE router z-loss). Router: softmax over all E of h @ gate^T, the top_k
    probabilities renormalised to sum 1. Capacity factor c > 0: expert e keeps the first
    min(N, max(1, ceil(c N k / E))) choices of it in (token, rank of choice) order; a
    dropped choice adds nothing (its weight is not renormalised away). Experts SwiGLU
    (w1 gate, w3 up, w2 down). f_e, the fraction of the N k choices that picked e
    (dropped ones too), and P_e, the mean router probability: aux_loss * E * sum f P.
    z-loss: z_loss * mean over tokens of logsumexp(router logits)^2."""
    B, T, d = h.shape
    E, k = cfg["experts"], cfg["top_k"]
    t = h.reshape(B * T, d)
    N = t.shape[0]
    logits = torch.matmul(t, P[q + "gate.weight"].t())
    probs = torch.softmax(logits, dim=-1)
    top, idx = torch.topk(probs, k, dim=-1)
    w = top / top.sum(-1, keepdim=True)
    if cfg["capacity"] > 0:
        cap = min(N, max(1, math.ceil(cfg["capacity"] * N * k / E)))
        onehot = torch.nn.functional.one_hot(idx.reshape(-1), E)     # choices in (n, j) order
        before = (onehot.cumsum(0) - onehot).gather(1, idx.reshape(-1, 1)).reshape(N, k)
        w = w * (before < cap).to(w.dtype)
    w1, w3, w2 = P[q + "w1"], P[q + "w3"], P[q + "w2"]
    # every expert on every token (tiny test models), then each token's chosen ones
    g = torch.einsum("nd,efd->enf", t, w1)
    u = torch.einsum("nd,efd->enf", t, w3)
    out = torch.einsum("enf,edf->end", torch.nn.functional.silu(g) * u, w2)   # [E, N, d]
    rows = torch.arange(N)
    y = sum(w[:, j, None] * out[idx[:, j], rows] for j in range(k))
    y = y.reshape(B, T, d)
    if cfg["shared_ffn"]:
        s = q + "shared_experts."
        y = y + swiglu(h, P[s + "gate_proj.weight"], P[s + "up_proj.weight"],
                       P[s + "down_proj.weight"])
    f = torch.nn.functional.one_hot(idx, E).sum((0, 1)).to(probs.dtype) / (N * k)
    terms = []
    if cfg["aux_loss"]:
        terms.append((f * probs.mean(0)).sum() * (E * cfg["aux_loss"]))
    if cfg["z_loss"]:
        terms.append((torch.logsumexp(logits, dim=-1) ** 2).mean() * cfg["z_loss"])
    return y, terms


def forward(cfg, P, tokens, targets):
    """The loss (a scalar tensor) of the model with parameters P (name -> tensor) on
    tokens and targets (int64 [B, T]): the cross-entropy, plus for mixtral its layers'
    auxiliary loss terms (the objective parc differentiates and logs)."""
    B, T = tokens.shape
    d, H, KV, eps = cfg["d"], cfg["heads"], cfg["kv_heads"], cfg["eps"]
    aux = []
    if cfg["family"] == "gpt2":
        x = P["wte.weight"][tokens] + P["wpe.weight"][:T]
        for i in range(cfg["layers"]):
            p = f"h.{i}."
            h = layer_norm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
            qkv = torch.matmul(h, P[p + "attn.c_attn.weight"]) + P[p + "attn.c_attn.bias"]
            q, k, v = qkv.split(d, dim=-1)
            y = merge_heads(causal_attention(split_heads(q, H), split_heads(k, H),
                                             split_heads(v, H)))
            x = x + torch.matmul(y, P[p + "attn.c_proj.weight"]) + P[p + "attn.c_proj.bias"]
            h = layer_norm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
            h = gelu_tanh(torch.matmul(h, P[p + "mlp.c_fc.weight"]) + P[p + "mlp.c_fc.bias"])
            x = x + torch.matmul(h, P[p + "mlp.c_proj.weight"]) + P[p + "mlp.c_proj.bias"]
        x = layer_norm(x, P["ln_f.weight"], P["ln_f.bias"], eps)
        logits = torch.matmul(x, P["wte.weight"].t())
    else:
        hd = d // H
        cos, sin = rope_tables(T, hd, cfg["theta"], P["model.embed_tokens.weight"].dtype)
        x = P["model.embed_tokens.weight"][tokens]
        for i in range(cfg["layers"]):
            p = f"model.layers.{i}."
            h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
            q = split_heads(torch.matmul(h, P[p + "self_attn.q_proj.weight"].t()), H)
            k = split_heads(torch.matmul(h, P[p + "self_attn.k_proj.weight"].t()), KV)
            v = split_heads(torch.matmul(h, P[p + "self_attn.v_proj.weight"].t()), KV)
            y = merge_heads(causal_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))
            x = x + torch.matmul(y, P[p + "self_attn.o_proj.weight"].t())
            h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
            if cfg["family"] == "mixtral":
                y, terms = moe(cfg, P, p + "block_sparse_moe.", h)
                x = x + y
                aux += terms
            else:
                x = x + swiglu(h, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"],
                               P[p + "mlp.down_proj.weight"])
        x = rms_norm(x, P["model.norm.weight"], eps)
        logits = torch.matmul(x, P["lm_head.weight"].t())
    loss = cross_entropy(logits, targets)
    for a in aux:   # in parc's order: layer by layer, each layer's terms as added
        loss = loss + a
    return loss


# --------------------------------------------------------------------------------------
# token data and its order
# --------------------------------------------------------------------------------------

DATA_MAGIC = 20240520
DATA_VERSION = 1
DATA_HEADER_BYTES = 256 * 4


def load_tokens(path):
    """Token data as a numpy int64 array, and its kind ('llmc' or 'bytes').

    A file whose first int32 is the llm.c magic 20240520 is an llm.c token file: 256
    little-endian int32 of header (version 1, N tokens) then N uint16 tokens, the size
    exactly 1024 + 2N. Any other file is raw bytes, one token per byte."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) >= 4 and struct.unpack("<i", raw[:4])[0] == DATA_MAGIC:
        if len(raw) < DATA_HEADER_BYTES:
            raise FormatError(f"data file {path}: llm.c magic but only {len(raw)} bytes, "
                              f"shorter than the {DATA_HEADER_BYTES}-byte header")
        magic, version, n = struct.unpack("<3i", raw[:12])
        if version != DATA_VERSION:
            raise FormatError(f"data file {path}: llm.c header version {version}, "
                              f"expected {DATA_VERSION} (uint16 tokens)")
        if n < 0 or len(raw) != DATA_HEADER_BYTES + 2 * n:
            raise FormatError(f"data file {path}: header says {n} tokens but the file has "
                              f"{len(raw)} bytes (truncated or corrupt)")
        toks = np.frombuffer(raw, dtype="<u2", count=n, offset=DATA_HEADER_BYTES)
        return toks.astype(np.int64), "llmc"
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64), "bytes"


def seq_start(i, T, N):
    """Start token of sequence i: (i*T) mod (N-T-1), or 0 when N == T+1."""
    if N < T + 1:
        raise ValueError(f"{N} tokens cannot hold one sequence of {T} (+1 target)")
    span = N - T - 1
    return 0 if span == 0 else (i * T) % span


def get_batch(tokens, step, B, T):
    """inputs and targets (int64 [B, T]) of global step `step`: row b is sequence
    i = step*B + b, tokens[s : s+T] and tokens[s+1 : s+T+1] with s = seq_start(i)."""
    N = len(tokens)
    rows = [seq_start(step * B + b, T, N) for b in range(B)]
    x = np.stack([tokens[s:s + T] for s in rows])
    y = np.stack([tokens[s + 1:s + T + 1] for s in rows])
    return torch.from_numpy(x.copy()), torch.from_numpy(y.copy())


# --------------------------------------------------------------------------------------
# learning-rate schedule
# --------------------------------------------------------------------------------------

def lr_at(t, schedule, lr, warmup=0, min_lr=0.0, steps=1):
    """Learning rate at 0-based step t.
    constant: lr.  warmup: lr*(t+1)/warmup for t < warmup, then lr.
    cosine: that warmup, then min_lr + 0.5*(lr-min_lr)*(1+cos(pi*p)) with
    p = min(1, (t-warmup)/max(1, steps-warmup))."""
    if schedule == "constant":
        return lr
    if schedule not in ("warmup", "cosine"):
        raise ValueError(f"unknown schedule {schedule!r}")
    if t < warmup:
        return lr * (t + 1) / warmup
    if schedule == "warmup":
        return lr
    p = min(1.0, (t - warmup) / max(1, steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


# --------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------

TRAIN_DEFAULTS = {
    # the defaults of parc's DSL (frontend/lower.c) where it has them
    "batch": 4, "microbatches": 1, "steps": 10, "lr": 1e-3,
    "optimizer": "adamw", "beta1": 0.9, "beta2": 0.95, "eps_adam": 1e-8, "wd": 0.0,
    "momentum": 0.0, "clip": 0.0, "schedule": "constant", "warmup": 0, "min_lr": 0.0,
    "dtype": "float32", "threads": 1, "seed": 0, "save_dtype": "float32",
}
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def make_optimizer(opt, named):
    """torch.optim.AdamW or SGD over two groups: tensors of rank >= 2 take weight decay,
    rank-1 (norm gains, biases) do not."""
    decay = [p for _, p in named if p.dim() >= 2]
    plain = [p for _, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opt["wd"]},
              {"params": plain, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if opt["optimizer"] == "adamw":
        return torch.optim.AdamW(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]),
                                 eps=opt["eps_adam"])
    if opt["optimizer"] == "sgd":
        return torch.optim.SGD(groups, lr=opt["lr"], momentum=opt["momentum"])
    raise ValueError(f"unknown optimizer {opt['optimizer']!r}")


def loss_and_grads(cfg, P, inputs, targets, microbatches=1):
    """Forward and backward of one step; gradients accumulate into P[...].grad (zeroed
    first). With M microbatches the batch rows split into M equal consecutive parts and
    the objective is the mean of their mean losses (= the mean over all rows). Returns
    the loss as a float."""
    for p in P.values():
        p.grad = None
    B = inputs.shape[0]
    if B % microbatches:
        raise ValueError(f"batch {B} is not divisible by microbatches {microbatches}")
    mb = B // microbatches
    total = 0.0
    for m in range(microbatches):
        sl = slice(m * mb, (m + 1) * mb)
        loss = forward(cfg, P, inputs[sl], targets[sl])
        (loss / microbatches).backward()
        total += loss.item()
    return total / microbatches


def global_grad_norm(params):
    """L2 norm of all gradients together, accumulated in float64."""
    s = 0.0
    for p in params:
        if p.grad is not None:
            s += float((p.grad.detach().double() ** 2).sum())
    return math.sqrt(s)


def train(cfg, opt, P, tokens, emit, save_grads=None):
    """Trains P (name -> tensor, requires_grad) for opt['steps'] steps, calling
    emit({"step", "loss", "grad_norm", "lr"}) after each step's backward, before its
    update. save_grads(dict) receives the step-0 gradients (before clipping).
    Returns 0, or 3 when a loss or gradient norm went non-finite (training stops)."""
    named = list(P.items())
    optim = make_optimizer(opt, named)
    T = cfg["seq"]
    for t in range(opt["steps"]):
        lr = lr_at(t, opt["schedule"], opt["lr"], opt["warmup"], opt["min_lr"], opt["steps"])
        for g in optim.param_groups:
            g["lr"] = lr
        x, y = get_batch(tokens, t, opt["batch"], T)
        loss = loss_and_grads(cfg, P, x, y, opt["microbatches"])
        norm = global_grad_norm(P.values())
        finite = math.isfinite(loss) and math.isfinite(norm)
        emit({"step": t, "loss": loss if finite else None,
              "grad_norm": norm if finite else None, "lr": lr})
        if not finite:
            print(f"torch_ref: step {t}: non-finite loss {loss} or grad norm {norm}; stopping",
                  file=sys.stderr)
            return 3
        if t == 0 and save_grads is not None:
            save_grads(collections.OrderedDict((n, p.grad.detach().clone()) for n, p in named))
        if opt["clip"] > 0:
            torch.nn.utils.clip_grad_norm_([p for _, p in named], opt["clip"])
        optim.step()
    return 0


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(
        prog="torch_ref.py", description="PyTorch reference trainer for parc's GPT-2, "
        "Llama and Mixtral families. Model options may come from --config JSON; flags "
        "override it.")
    m = ap.add_argument_group("model")
    m.add_argument("--config", help="JSON file with model (and optionally train) settings")
    m.add_argument("--family", choices=list(FAMILIES))
    m.add_argument("--vocab", type=int)
    m.add_argument("--seq", type=int, help="sequence length T (and GPT-2's wpe rows)")
    m.add_argument("--d", type=int, help="model width")
    m.add_argument("--heads", type=int)
    m.add_argument("--kv-heads", type=int, help="KV heads (llama; default heads)")
    m.add_argument("--ffn", type=int, help="MLP hidden width (default 4*d)")
    m.add_argument("--layers", type=int)
    m.add_argument("--theta", type=float, help="RoPE base (llama; default 10000)")
    m.add_argument("--eps", type=float, help="norm epsilon (default 1e-5)")
    m.add_argument("--experts", type=int, help="mixtral: routed experts")
    m.add_argument("--top-k", type=int, help="mixtral: experts a token takes")
    m.add_argument("--aux-loss", type=float, help="mixtral: load-balancing coefficient "
                   "(default 0.01)")
    m.add_argument("--z-loss", type=float, help="mixtral: router z-loss coefficient "
                   "(default 0)")
    m.add_argument("--capacity", type=float, help="mixtral: capacity factor (0: dropless)")
    m.add_argument("--shared-ffn", type=int, help="mixtral: shared expert width (0: none)")
    t = ap.add_argument_group("training")
    t.add_argument("--init", help="initial weights (safetensors, F32); default: "
                   "make_init's weights for --seed")
    t.add_argument("--seed", type=int, help="seed of the default init (default 0)")
    t.add_argument("--data", help="llm.c .bin token file, or any file as raw bytes")
    t.add_argument("--batch", type=int)
    t.add_argument("--microbatches", type=int, help="gradient accumulation (default 1)")
    t.add_argument("--steps", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--optimizer", choices=["adamw", "sgd"])
    t.add_argument("--beta1", type=float)
    t.add_argument("--beta2", type=float)
    t.add_argument("--eps-adam", type=float)
    t.add_argument("--wd", type=float, help="weight decay, rank >= 2 tensors only")
    t.add_argument("--momentum", type=float, help="SGD momentum")
    t.add_argument("--clip", type=float, help="max global grad norm (0: no clipping)")
    t.add_argument("--schedule", choices=["constant", "warmup", "cosine"])
    t.add_argument("--warmup", type=int)
    t.add_argument("--min-lr", type=float)
    t.add_argument("--dtype", choices=["float32", "float64"])
    t.add_argument("--threads", type=int)
    o = ap.add_argument_group("output")
    o.add_argument("--out", help="write the JSON lines here instead of stdout")
    o.add_argument("--save-grads", help="write the step-0 gradients (safetensors)")
    o.add_argument("--save-weights", help="write the weights after the last step")
    o.add_argument("--save-dtype", choices=["float32", "float64"],
                   help="dtype of the saved files (default float32, what parc reads)")
    return ap


def resolve(args):
    """Merges flags, the --config JSON and defaults into (cfg, opt)."""
    js = {}
    if args.config:
        with open(args.config) as f:
            try:
                js = json.load(f)
            except json.JSONDecodeError as e:
                raise FormatError(f"config {args.config}: invalid JSON: {e}") from None
        if not isinstance(js, dict):
            raise FormatError(f"config {args.config}: not a JSON object")

    def pick(key, aliases=()):
        v = getattr(args, key, None)
        if v is not None:
            return v
        for a in (key, key.replace("_", "-")) + tuple(aliases):
            if js.get(a) is not None:
                return js[a]
        return None

    mv = {k: pick(k, al) for k, al in MODEL_KEYS.items()}
    for k in ("family", "vocab", "seq", "d", "heads", "layers"):
        if mv[k] is None:
            raise ValueError(f"--{k.replace('_', '-')} is required (flag or --config)")
    cfg = make_config(mv["family"], mv["vocab"], mv["seq"], mv["d"], mv["heads"],
                      mv["layers"], kv_heads=mv["kv_heads"], ffn=mv["ffn"],
                      theta=mv["theta"] if mv["theta"] is not None else 10000.0,
                      eps=mv["eps"] if mv["eps"] is not None else 1e-5,
                      **({k: mv[k] for k in ("experts", "top_k", "aux_loss", "z_loss",
                                             "capacity", "shared_ffn")}
                         if mv["family"] == "mixtral" else {}))
    opt = {}
    for k, dflt in TRAIN_DEFAULTS.items():
        v = pick(k)
        opt[k] = dflt if v is None else type(dflt)(v) if not isinstance(dflt, str) else v
    for k in ("init", "data", "out", "save_grads", "save_weights"):
        opt[k] = pick(k)
    if opt["optimizer"] not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be adamw or sgd, not {opt['optimizer']!r}")
    if opt["schedule"] not in ("constant", "warmup", "cosine"):
        raise ValueError("schedule must be constant, warmup or cosine")
    if opt["dtype"] not in DTYPES or opt["save_dtype"] not in DTYPES:
        raise ValueError("dtype must be float32 or float64")
    if opt["batch"] <= 0 or opt["steps"] < 0 or opt["microbatches"] <= 0:
        raise ValueError("batch and microbatches must be positive, steps >= 0")
    if opt["batch"] % opt["microbatches"]:
        raise ValueError(f"batch {opt['batch']} is not divisible by microbatches "
                         f"{opt['microbatches']}")
    return cfg, opt


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        cfg, opt = resolve(args)
        if opt["steps"] > 0 and not opt["data"]:
            raise ValueError("--data is required to train")
        if opt["save_grads"] and opt["steps"] < 1:
            raise ValueError("--save-grads needs at least one step")
        torch.set_num_threads(max(1, opt["threads"]))
        dtype = DTYPES[opt["dtype"]]
        if opt["init"]:
            W, _ = read_safetensors(opt["init"])
            check_params(cfg, W, opt["init"])
        else:
            W = init_params(cfg, seed=opt["seed"])
        P = collections.OrderedDict(
            (n, W[n].detach().to(dtype).clone().requires_grad_(True))
            for n, _, _ in param_specs(cfg))
        tokens = None
        if opt["data"]:
            tokens, _ = load_tokens(opt["data"])
            if len(tokens) < cfg["seq"] + 1:
                raise FormatError(f"data file {opt['data']} has {len(tokens)} tokens; one "
                                  f"sequence of {cfg['seq']} needs {cfg['seq'] + 1}")
            if len(tokens) and int(tokens.max()) >= cfg["vocab"]:
                pos = int(np.argmax(tokens >= cfg["vocab"]))
                raise FormatError(f"data file {opt['data']}: token {int(tokens[pos])} at "
                                  f"position {pos} is outside the vocab of {cfg['vocab']}")
    except (FormatError, ValueError, OSError) as e:
        print(f"torch_ref: {e}", file=sys.stderr)
        return 1

    save_dt = "F64" if opt["save_dtype"] == "float64" else "F32"
    out = open(opt["out"], "w") if opt["out"] else sys.stdout

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def save_grads(grads):
        write_safetensors(opt["save_grads"], grads, {"format": "pt", "step": "0"}, save_dt)

    try:
        rc = train(cfg, opt, P, tokens, emit, save_grads if opt["save_grads"] else None)
    finally:
        if out is not sys.stdout:
            out.close()
    if opt["save_weights"]:
        write_safetensors(opt["save_weights"], P, {"format": "pt", "steps": str(opt["steps"])},
                          save_dt)
    return rc


if __name__ == "__main__":
    sys.exit(main())
