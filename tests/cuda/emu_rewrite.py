#!/usr/bin/env python3
"""tests/cuda/emu_rewrite.py -- a runtime/cuda .cu file as C++ for g++ and the
emulated CUDA runtime (tests/cuda/emu: cuda_runtime.h, kcu_emu_kernel.h).

    emu_rewrite.py IN.cu OUT.cpp

Rewrites, keeping every line where it was (so g++'s diagnostics and a
debugger's lines are the .cu file's; a `#line 1 "IN.cu"` comes first):
  - each kernel launch `K<<<grid, block[, smem[, stream]]>>>(` -- over several
    lines too, K a name, a qualified name or a template-id such as
    `k<true, 64>` -- to `kcu_emu_launch(K, grid, block, smem, stream)(`;
  - each `extern __shared__ [__align__(N)] T name[];` to
    `T *name = (T *)kcu_emu_dyn_smem();` (the launch's dynamic shared memory).
Fails (exit 1, "IN.cu:LINE: ...") on a `<<<` it cannot rewrite, and on an
`extern __shared__` it does not recognise.  Comments and string literals
are left alone (a `<<<` in them is not a launch)."""
import re
import sys


def fail(path, text, pos, what):
    line = text.count("\n", 0, pos) + 1
    sys.stderr.write("%s:%d: %s\n" % (path, line, what))
    sys.exit(1)


def code_mask(text):
    """A copy of text with comments and string/char literals blanked (newlines
    kept): positions found in it are positions in text."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            for k in range(i + 1, j - 1):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def split_top(s):
    """s split at the commas outside (), [], {} (and <> never: a launch's
    arguments are expressions, where < and > are comparisons)."""
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


def kernel_start(m, pos, path, text):
    """Start of the kernel expression ending just before pos (the `<<<`)."""
    j = pos
    while j > 0 and m[j - 1] in " \t":
        j -= 1
    if j > 0 and m[j - 1] == ">":  # a template-id: back over balanced <...>
        depth, j = 0, j - 1
        while j >= 0:
            if m[j] == ">":
                depth += 1
            elif m[j] == "<":
                depth -= 1
                if depth == 0:
                    break
            elif m[j] in ";{}":
                fail(path, text, pos, "a kernel launch whose template arguments are not recognised")
            j -= 1
        if j < 0:
            fail(path, text, pos, "a kernel launch whose template arguments are not recognised")
        while j > 0 and m[j - 1] in " \t":
            j -= 1
    k = j
    while k > 0 and (m[k - 1].isalnum() or m[k - 1] in "_:"):
        k -= 1
    if k == j or not (m[k].isalpha() or m[k] in "_:"):
        fail(path, text, pos, "a `<<<` without a kernel name before it")
    return k


LAUNCH = "<<<"
SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
    r"((?:const\s+|volatile\s+|unsigned\s+|signed\s+)*[A-Za-z_][A-Za-z0-9_:]*)\s*"
    r"(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\[\s*\]\s*;")


def rewrite(path, text):
    m = code_mask(text)
    out, last = [], 0
    pos = m.find(LAUNCH)
    while pos >= 0:
        start = kernel_start(m, pos, path, text)
        end = m.find(">>>", pos + 3)
        if end < 0:
            fail(path, text, pos, "a `<<<` without its `>>>`")
        if "<<<" in m[pos + 3:end] or ";" in m[pos + 3:end]:
            fail(path, text, pos, "a `<<<` whose configuration is not recognised")
        args = split_top(text[pos + 3:end])
        if not 2 <= len(args) <= 4 or any(not a.strip() for a in args):
            fail(path, text, pos, "a kernel launch needs 2 to 4 configuration arguments, got %d"
                 % len(args))
        after = end + 3
        j = after
        while j < len(m) and m[j] in " \t\n":
            j += 1
        if j >= len(m) or m[j] != "(":
            fail(path, text, pos, "a kernel launch without its `(` argument list")
        args += ["0"] * (4 - len(args))
        name = text[start:pos]
        out.append(text[last:start])
        out.append("kcu_emu_launch(%s,%s)" % (name.rstrip(), ",".join(args)))
        out.append(text[after:j])  # whitespace (newlines) before the `(`
        last = j
        pos = m.find(LAUNCH, j)
    text = "".join(out) + text[last:]
    m = code_mask(text)
    out, last = [], 0
    for sm in SHARED.finditer(m):
        seg = text[sm.start():sm.end()]
        nl = seg.count("\n")
        typ, name = sm.group(1).strip(), sm.group(2)
        out.append(text[last:sm.start()])
        out.append("%s *%s = (%s *)kcu_emu_dyn_smem();%s" % (typ, name, typ, "\n" * nl))
        last = sm.end()
    text = "".join(out) + text[last:]
    left = code_mask(text).find("extern __shared__")
    if left >= 0:
        fail(path, text, left, "an `extern __shared__` declaration that is not recognised")
    return text


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: emu_rewrite.py IN.cu OUT.cpp\n")
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    new = rewrite(src, text)
    assert new.count("\n") == text.count("\n"), "line numbers moved"
    with open(dst, "w") as f:
        f.write('#line 1 "%s"\n' % src)
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
