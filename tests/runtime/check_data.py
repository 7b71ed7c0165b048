#!/usr/bin/env python3
"""Independent check of the data order (DESIGN.md "Pinned semantics"): sequence
i = step*B + b starts at token (i*T) mod (N-T-1); inputs are T tokens from there,
targets the next T. Python writes llm.c .bin and raw files, reads them with its own
code, and compares with what rt_data_batch returns (through rt_tool).
usage: check_data.py RT_TOOL WORKDIR"""
import math
import os
import random
import struct
import subprocess
import sys

TOOL, WORK = sys.argv[1], sys.argv[2]
failures = []


def write_bin(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def read_tokens(path):
    """Python's own reader: llm.c .bin if the magic is there, else raw bytes."""
    data = open(path, "rb").read()
    if len(data) >= 4 and struct.unpack("<i", data[:4])[0] == 20240520:
        n = struct.unpack("<i", data[8:12])[0]
        return list(struct.unpack(f"<{n}H", data[1024:1024 + 2 * n]))
    return list(data)


def expected(tokens, steps, B, T):
    n = len(tokens)
    span = n - T - 1
    out = []
    for step in steps:
        out.append(f"step {step}")
        for b in range(B):
            i = step * B + b
            s = (i * T) % span if span else 0
            out.append(" ".join(map(str, tokens[s:s + T])))
            out.append(" ".join(map(str, tokens[s + 1:s + T + 1])))
    return out


def run(*args):
    return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)


def check_batches(path, vocab, B, T, steps):
    r = run("batch", path, vocab, B, T, *steps)
    if r.returncode != 0:
        failures.append(f"{path} B={B} T={T}: rt_tool failed: {r.stderr.strip()}")
        return
    want = expected(read_tokens(path), steps, B, T)
    if r.stdout.splitlines() != want:
        failures.append(f"{path} B={B} T={T}: batches differ from the formula")


def check_error(args, needle):
    r = run(*args)
    lines = r.stderr.splitlines()
    if r.returncode != 1 or len(lines) != 1 or needle not in lines[0]:
        failures.append(f"{args}: wanted one error line with {needle!r}, got {r.stderr!r}")


def entropy(tokens):
    counts = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    n = len(tokens)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def main():
    rnd = random.Random(20240520)
    bin_path = os.path.join(WORK, "py_data.bin")
    tokens = [rnd.randrange(50257) for _ in range(3001)]
    write_bin(bin_path, tokens)
    raw_path = os.path.join(WORK, "py_data.raw")
    with open(raw_path, "wb") as f:
        f.write(bytes(rnd.randrange(256) for _ in range(2000)))
    big_steps = [0, 1, 2, 7, 100, 12345, 10**9]
    for path, vocab in [(bin_path, 50257), (raw_path, 256)]:
        for B, T in [(1, 1), (4, 64), (3, 17), (2, 1024)]:
            check_batches(path, vocab, B, T, big_steps)
    # N == T + 1: the one sequence there is.
    check_batches(bin_path, 50257, 2, 3000, [0, 5])
    # Entropy against Python's count.
    for path, vocab in [(bin_path, 50257), (raw_path, 256)]:
        got = float(run("entropy", path, vocab).stdout)
        if abs(got - entropy(read_tokens(path))) > 1e-9:
            failures.append(f"{path}: entropy {got} != {entropy(read_tokens(path))}")
    # Errors: one line naming the file and the value at fault.
    check_error(["batch", bin_path, 50257, 1, 3001, 0],
                f"data file {bin_path} has 3001 tokens; one sequence of 3001 needs 3002")
    check_error(["batch", bin_path, 1000, 4, 64, 0], "is >= vocab 1000")
    check_error(["batch", raw_path, 255, 1, 8, 0], "vocab is 255; use vocab >= 256")
    check_error(["batch", os.path.join(WORK, "py_missing.bin"), 256, 1, 8, 0],
                "cannot open (No such file or directory)")
    trunc = os.path.join(WORK, "py_trunc.bin")
    with open(bin_path, "rb") as f, open(trunc, "wb") as g:
        g.write(f.read()[:1024 + 100])
    check_error(["batch", trunc, 50257, 1, 8, 0], "header says 3001 tokens")
    # The built-in corpus is what its file form says, and its entropy matches.
    corpus = os.path.join(WORK, "py_corpus.txt")
    r = run("builtin", 1 << 20, corpus)
    data = open(corpus, "rb").read()
    if len(data) != 1 << 20 or abs(float(r.stdout) - entropy(data)) > 1e-9:
        failures.append("built-in corpus: size or entropy differs")
    if failures:
        for f in failures[:10]:
            print(f)
        sys.exit(f"check_data: {len(failures)} failure(s)")


main()
