#!/usr/bin/env python3
"""bench/attn_torch_gpu.py -- the named competitors for parc's attention kernels:
PyTorch's scaled_dot_product_attention with each of its backends (FlashAttention-2
"flash", xFormers' "efficient", "cudnn", where the machine's torch has them), timed
at one shape, forward and forward + backward, bf16.  parc's own rows at the same
shape are gpu_ops_check's "sdpa (bf16 io, all in)" and "sdpa_grad (bf16 io, all
in)" (tests/gpu/ops_check.c; GPT-2 small's: B8 H12 T1024 hd64 causal), with the
same FLOP count: 4 B H T^2 hd (halved when causal) forward, 2.5 times that
backward (the backward row here is the forward + backward call minus the
forward).  Prints one row per backend and pass:

  attn torch <backend> <fwd|bwd>  <ms> ms  <TFLOP/s> TFLOP/s

or "unavailable" with torch's reason.  --device cpu runs the math backend only,
on a small shape, as a check that the script works (no timing meaning).

  python3 bench/attn_torch_gpu.py                      # GPT-2 small's shape on CUDA
  python3 bench/attn_torch_gpu.py --device cpu --B 1 --H 2 --T 64 --hd 16 --reps 2
"""
import argparse
import time

import torch
import torch.nn.functional as F

try:  # torch 2.2 on (the device's); Debian's python3-torch 1.13 has no SDPA at all
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    SDPBackend = sdpa_kernel = None


def flops(a, backward):
    f = 4.0 * a.B * a.H * a.T * a.T * a.hd * (0.5 if a.causal else 1.0)
    return 2.5 * f if backward else f


def timed(fn, reps, cuda):
    """median seconds of reps calls of fn (after one warm-up call)"""
    fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def run(a, name, backend):
    cuda = a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device=a.device).manual_seed(1)
    shape = (a.B, a.H, a.T, a.hd)
    q, k, v = (torch.randn(shape, device=a.device, dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))
    dy = torch.randn(shape, device=a.device, dtype=dtype, generator=g)
    causal = bool(a.causal)

    def fwd():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        y = fwd()
        y.backward(dy)
        q.grad = k.grad = v.grad = None

    try:
        tf = timed(fwd, a.reps, cuda)
        tb = timed(fwd_bwd, a.reps, cuda) - tf
    except RuntimeError as e:  # the backend does not run this shape or machine
        print(f"attn torch {name:9s} unavailable: {str(e).splitlines()[0][:100]}")
        return
    for what, t, back in (("fwd", tf, False), ("bwd", tb, True)):
        print(f"attn torch {name:9s} {what}  {t * 1e3:8.3f} ms  {flops(a, back) / t / 1e12:7.1f} TFLOP/s")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--H", type=int, default=12)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--hd", type=int, default=64)
    p.add_argument("--causal", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = p.parse_args()
    if SDPBackend is None:
        print(f"attn torch: torch {torch.__version__} has no torch.nn.attention (2.2 on needed)")
        return 1
    if a.device == "cuda" and not torch.cuda.is_available():
        print("attn torch: no CUDA device")
        return 1
    if a.reps < 1 or min(a.B, a.H, a.T, a.hd) < 1:
        p.error("--reps, --B, --H, --T, --hd must be at least 1")
    print(f"attn torch: torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version() if a.device == 'cuda' else '-'}, "
          f"B{a.B} H{a.H} T{a.T} hd{a.hd}{' causal' if a.causal else ''}")
    B = SDPBackend
    backends = [("flash", B.FLASH_ATTENTION), ("efficient", B.EFFICIENT_ATTENTION)]
    if hasattr(B, "CUDNN_ATTENTION"):
        backends.append(("cudnn", B.CUDNN_ATTENTION))
    if a.device == "cpu":
        backends = [("math", B.MATH)]
    for name, backend in backends:
        run(a, name, backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
