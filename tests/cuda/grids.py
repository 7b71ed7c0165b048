#!/usr/bin/env python3
"""The generated CUDA kernels' grids against the work they do.

usage: grids.py PARC ROOT WORK

Compiles example models on layouts whose kernels have few rows (dp buckets,
ZeRO's optimizer into its gather buffer, pipeline stages, expert
parallelism) with `--target cuda`, reads each kernel's header comment in
kernels.cu (rows, loop extents, mapping) and checks that no kernel doing at
least 2^20 elements' work (rows x the loops' extents) runs on fewer than 64
blocks: a kernel mapped a block a row (or a warp, or a thread) over one or
two rows of millions of elements would leave all but a few of the GPU's SMs
idle, which the step model (every kernel at the chip's memory rate) cannot
see.  The mappings that spread a row over blocks (flat, flat over loops,
split rows, column tiles) are wide by construction and counted as such.
Prints the fewest blocks any large kernel has, per layout."""
import os
import re
import subprocess
import sys

LAYOUTS = [
    ("gpt2", ["--dp", "2"]),
    ("gpt2", ["--dp", "2", "--zero", "1"]),
    ("gpt2", ["--pp", "2", "--dp", "2", "--zero", "1"]),
    ("gpt2", ["--tp", "2", "--sp"]),
    ("llama", ["-D", "layers=2", "--dp", "2"]),
    ("llama", ["-D", "layers=2", "--dp", "2", "--zero", "1"]),
    ("mixtral", ["-D", "layers=2", "--ep", "2", "--dp", "2"]),
]
BIG = 1 << 20       # elements of work from which a kernel must be wide
MIN_BLOCKS = 64     # about half the SMs of an H100 or H200

HEAD = re.compile(r"/\* ---- (\S+): rows \[[^\]]*\] = (\d+), (\d+) loops? ?(?:of )?([^\n]*)\n"
                  r" \* mapping: ([^\n]*)")


def blocks(rows, mapping):
    """Blocks of a launch over every row, or None for the wide mappings."""
    m = re.match(r"one warp per row, (\d+) rows per", mapping)
    if m:
        return -(-rows // int(m.group(1)))
    if re.match(r"one \d+-thread block per row", mapping):
        return rows
    m = re.match(r"one thread per row .*?(\d+)-thread blocks", mapping)
    if m:
        return -(-rows // int(m.group(1)))
    if mapping.startswith(("flat", "split rows", "column tiles")):
        return None
    raise SystemExit(f"grids.py: unknown mapping '{mapping}'")


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    parc, root, work = sys.argv[1:]
    bad = 0
    for model, flags in LAYOUTS:
        out = os.path.join(work, model + "".join(flags).replace("-", "_").replace("=", ""))
        subprocess.run([parc, os.path.join(root, "examples", model + ".dsl"), *flags,
                        "--target", "cuda", "-o", out], check=True, stdout=subprocess.DEVNULL)
        text = open(os.path.join(out, "kernels.cu")).read()
        heads = HEAD.findall(text)
        if not heads:
            raise SystemExit(f"grids.py: no kernel headers in {out}/kernels.cu")
        fewest = None
        for name, rows, nloops, extents, mapping in heads:
            rows = int(rows)
            if "row-dependent" in extents:
                continue  # a loop's extent varies by row: its work is not known here
            work_elems = rows * sum(int(e) for e in re.findall(r"\d+", extents)) if int(nloops) else rows
            b = blocks(rows, mapping)
            if b is None or work_elems < BIG:
                continue
            fewest = b if fewest is None else min(fewest, b)
            if b < MIN_BLOCKS:
                print(f"FAIL {model} {' '.join(flags)}: {name} does {work_elems} elements' work "
                      f"on {b} blocks ({mapping})")
                bad += 1
        print(f"{model} {' '.join(flags)}: {len(heads)} kernels, fewest blocks of a large "
              f"row-mapped kernel: {fewest if fewest is not None else 'none such'}")
    if bad:
        raise SystemExit(f"grids.py: {bad} kernels too narrow for their work")
    print("grids.py: ok")


if __name__ == "__main__":
    main()
