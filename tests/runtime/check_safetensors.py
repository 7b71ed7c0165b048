#!/usr/bin/env python3
"""Independent safetensors reader and writer (json + struct) against rt_safetensors
(through rt_tool): Python reads what C wrote, C reads what Python wrote, and C
rejects what it must. usage: check_safetensors.py RT_TOOL WORKDIR"""
import json
import math
import os
import struct
import subprocess
import sys

TOOL, WORK = sys.argv[1], sys.argv[2]
errors = []


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def read_st(path):
    """Python's reader: {name: (shape, [bits])}, metadata, header length."""
    data = open(path, "rb").read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = data[8 + hlen:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        b, e = info["data_offsets"]
        n = math.prod(info["shape"])
        assert e - b == 4 * n, name
        out[name] = (info["shape"], list(struct.unpack(f"<{n}I", body[b:e])), b)
    return out, meta, hlen, data[8:8 + hlen], len(body)


def c_reads_python_file():
    """Python writes; the C reader must return the same names, shapes and bits."""
    tensors = [  # (name, shape, values) -- deliberately not in sorted order
        ("model.layers.0.self_attn.q_proj.weight", [4, 3], [i / 4 - 1 for i in range(12)]),
        ("lm_head.weight", [2, 2, 2], [float(i * i) for i in range(8)]),
        ("model.norm.weight", [5], [1.0, -0.0, float("inf"), 1e-40, -3.5]),
        ("scalar", [], [42.0]),
        ("zero", [0, 4], []),
    ]
    header, body = {"__metadata__": {"format": "pt", "note": "written by python"}}, b""
    for name, shape, vals in tensors:
        blob = struct.pack(f"<{len(vals)}f", *vals)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(body), len(body) + len(blob)]}
        body += blob
    text = json.dumps(header, indent=1).encode()   # not padded, with newlines
    path = os.path.join(WORK, "py_written.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)
    r = subprocess.run([TOOL, "st-dump", path], capture_output=True, text=True)
    if r.returncode:
        errors.append(f"C rejected the python file: {r.stderr.strip()}")
        return
    dump = json.loads(r.stdout)
    got = {t["name"]: (t["shape"], t["bits"]) for t in dump["tensors"]}
    for name, shape, vals in tensors:
        want = (shape, [f32_bits(v) for v in vals])
        if got.get(name) != want:
            errors.append(f"C read {name} as {got.get(name)}, want {want}")
    if [t["name"] for t in dump["tensors"]] != [t[0] for t in tensors]:
        errors.append("C does not list tensors in data order")
    if dump["metadata"] != {"format": "pt", "note": "written by python"}:
        errors.append(f"C read metadata {dump['metadata']}")


def python_reads_c_file():
    path = os.path.join(WORK, "c_written.safetensors")
    subprocess.run([TOOL, "st-write", path], check=True)
    tensors, meta, hlen, header, body_len = read_st(path)
    if hlen % 8 or header.rstrip(b" ") != header.rstrip() or len(header.rstrip(b" ")) + 8 <= hlen:
        errors.append(f"header of {hlen} bytes is not padded with spaces to a multiple of 8")
    if meta != {"format": "pt", "parc": "test \u00e9 unicode"}:
        errors.append(f"metadata {meta}")

    def fixed(t, k):   # rt_tool's fixed_value
        return ((k * 7 + t * 13) % 101 - 50) / 8.0

    want = {
        "h.0.attn.c_attn.weight": ([6, 18], [f32_bits(fixed(0, k)) for k in range(108)]),
        "h.0.attn.c_attn.bias": ([18], [f32_bits(fixed(1, k)) for k in range(18)]),
        "special": ([9], [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, None, 0x7F7FFFFF,
                          0x80800000, 0x00000001, f32_bits(1 / 3)]),
        "empty": ([3, 0], []),
        'model.norm.weight."quoted" name': ([2, 3, 4], [f32_bits(fixed(4, k)) for k in range(24)]),
    }
    if set(tensors) != set(want):
        errors.append(f"tensor names {sorted(tensors)}")
        return
    offset = 0
    for name in want:   # written in this order, contiguously
        shape, bits, begin = tensors[name]
        wshape, wbits = want[name]
        if begin != offset:
            errors.append(f"{name} begins at {begin}, want {offset}")
        offset += 4 * len(wbits)
        nan_ok = all(w is not None or (g & 0x7F800000 == 0x7F800000 and g & 0x7FFFFF)
                     for g, w in zip(bits, wbits))
        if shape != wshape or len(bits) != len(wbits) or not nan_ok or any(
                w is not None and g != w for g, w in zip(bits, wbits)):
            errors.append(f"{name}: shape {shape}, values differ")
    if offset != body_len:
        errors.append(f"data section has {body_len} bytes, tensors {offset}")


def c_rejects():
    cases = [
        ({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, 4,
         "tensor 'w' has dtype BF16; parc reads only F32"),
        ({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, 4, "dtype F16"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 4, "outside the 4-byte"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8, "overlap"),
    ]
    for k, (header, body_len, needle) in enumerate(cases):
        text = json.dumps(header).encode()
        path = os.path.join(WORK, f"py_bad{k}.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + bytes(body_len))
        r = subprocess.run([TOOL, "st-dump", path], capture_output=True, text=True)
        lines = r.stderr.splitlines()
        if r.returncode != 1 or len(lines) != 1 or needle not in lines[0] or path not in lines[0]:
            errors.append(f"case {k}: wanted one line naming {path} with {needle!r}, "
                          f"got {r.stderr!r}")
    # Truncated copies of a good file.
    good = open(os.path.join(WORK, "c_written.safetensors"), "rb").read()
    for cut in (4, 8, 20, len(good) // 2, len(good) - 1):
        path = os.path.join(WORK, "py_cut.safetensors")
        with open(path, "wb") as f:
            f.write(good[:cut])
        r = subprocess.run([TOOL, "st-dump", path], capture_output=True, text=True)
        if r.returncode != 1 or len(r.stderr.splitlines()) != 1:
            errors.append(f"file cut at {cut} bytes not rejected with one line: {r.stderr!r}")


c_reads_python_file()
python_reads_c_file()
c_rejects()
if errors:
    print("\n".join(errors[:10]))
    sys.exit(f"check_safetensors: {len(errors)} failure(s)")
