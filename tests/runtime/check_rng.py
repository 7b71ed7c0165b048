#!/usr/bin/env python3
"""Independent Philox4x32-10 + FNV-1a + Box-Muller in Python, compared bit for bit
with rt_rng_normal (through rt_tool). usage: check_rng.py RT_TOOL WORKDIR"""
import math
import struct
import subprocess
import sys

M32 = 0xFFFFFFFF


def philox(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def normal_bits(seed, stream, i):
    x = philox((i & M32, i >> 32, stream & M32, stream >> 32), (seed & M32, seed >> 32))
    u1 = (x[0] + 1.0) / 4294967296.0
    u2 = x[1] / 4294967296.0
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return struct.unpack("<I", struct.pack("<f", z))[0]


def main():
    tool = sys.argv[1]
    bad = 0
    for seed, name, n in [(0, "wte.weight", 300), (1337, "h.11.mlp.c_proj.weight", 300),
                          (2**64 - 1, "model.layers.0.self_attn.q_proj.weight", 100)]:
        out = subprocess.run([tool, "normal", str(seed), name, str(n)], check=True,
                             capture_output=True, text=True).stdout.split()
        stream = fnv1a64(name)
        if int(out[0], 16) != stream:
            print(f"stream of {name}: C {out[0]}, python {stream:016x}")
            bad += 1
        for i in range(n):
            want = normal_bits(seed, stream, i)
            if int(out[1 + i], 16) != want:
                bad += 1
                if bad < 5:
                    print(f"seed {seed} {name} index {i}: C {out[1 + i]}, python {want:08x}")
    if bad:
        sys.exit(f"check_rng: {bad} mismatches")


main()
