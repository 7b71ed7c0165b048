#!/usr/bin/env python3
"""make_init.py -- writes initial weights for a GPT-2, Llama or Mixtral config as a float32
safetensors file with Hugging Face names, so parc's trainer and torch_ref.py can start
from the same weights.

Values: normal(0, --std) for every matrix and embedding, drawn in parc's parameter
declaration order (torch_ref.param_specs) from one torch.Generator seeded with --seed
(no numpy RNG); ones for norm gains; zeros for biases. The same seed and config give a
byte-identical file.

usage: make_init.py --family gpt2|llama --vocab V --seq T --d D --heads H --layers L
                    [--kv-heads KV] [--ffn F] [--seed S] [--std 0.02] -o W.safetensors
       (or --config FILE.json with the same keys as torch_ref.py; Mixtral's MoE settings
       come from there)"""
import argparse
import os
import sys

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(prog="make_init.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="JSON file with the model settings")
    ap.add_argument("--family", choices=list(torch_ref.FAMILIES))
    for k in ("vocab", "seq", "d", "heads", "kv-heads", "ffn", "layers"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--theta", type=float)
    ap.add_argument("--eps", type=float)
    ap.add_argument("--seed", type=int, default=0, help="torch.Generator seed (default 0)")
    ap.add_argument("--std", type=float, default=0.02, help="std of the normal init")
    ap.add_argument("-o", "--output", required=True, help="safetensors file to write")
    args = ap.parse_args(argv)
    # torch_ref.resolve wants the training fields too; only the model ones matter here.
    ns = torch_ref.build_parser().parse_args([])
    for k in ("config", "family", "vocab", "seq", "d", "heads", "kv_heads", "ffn", "layers",
              "theta", "eps"):
        setattr(ns, k, getattr(args, k))
    try:
        cfg, _ = torch_ref.resolve(ns)
    except (torch_ref.FormatError, ValueError, OSError) as e:
        print(f"make_init: {e}", file=sys.stderr)
        return 1
    W = torch_ref.init_params(cfg, seed=args.seed, std=args.std)
    meta = {"format": "pt", "family": cfg["family"], "seed": str(args.seed),
            "std": repr(args.std)}
    torch_ref.write_safetensors(args.output, W, meta)
    n = sum(t.numel() for t in W.values())
    print(f"make_init: wrote {len(W)} tensors, {n} parameters to {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
