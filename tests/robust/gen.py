#!/usr/bin/env python3
"""Writes hostile inputs for tests/robust/robust.sh into the directory argv[1]."""
import os, random, sys

out = sys.argv[1]
rng = random.Random(20261130)
HEAD = "model m {\n  config { d = 8 }\n  input t : i32[2, 4]\n"

def w(name, data):
    with open(os.path.join(out, name + ".dsl"), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

w("garbage", bytes(rng.randrange(256) for _ in range(1 << 16)))
w("nul_bytes", (HEAD + "  x = 1\0\0 + 2\n\0}\n").encode())
w("bad_utf8", (HEAD + "  x = 1 # caf\n").encode() + b"\xc3\x28 \xff\xfe y = \xe2\x82\n}\n")
w("huge_identifier", HEAD + "  " + "a" * (4 << 20) + " = 1\n}\n")
w("deep_parens", HEAD + "  x = " + "(" * 100000 + "1" + ")" * 100000 + "\n}\n")
w("deep_braces", HEAD + "  repeat 2 {\n" * 100000 + "}\n" * 100001)
w("deep_calls", HEAD + "  x = " + "f(" * 100000 + "1" + ")" * 100000 + "\n}\n")
w("deep_unary", HEAD + "  x = " + "-" * 100000 + "1\n}\n")
w("million_tokens", HEAD + "  x = 1" + " + 1" * 500000 + "\n}\n")
w("million_args", HEAD + "  x = layernorm(" + "1, " * 500000 + "1)\n}\n")
w("million_statements", HEAD + "  a = 1;" * 300000 + "\n}\n")
w("overflow", HEAD + "  n = 9223372036854775807 + 1\n  m = -9223372036854775807 - 2\n"
  "  p = 3037000500 * 3037000500\n  q = (0 - 9223372036854775807 - 1) / -1\n"
  "  r = (0 - 9223372036854775807 - 1) % -1\n  s = 1e308 * 10.0\n}\n")
w("div_zero", HEAD + "  a = 1 / 0\n  b = 1 % 0\n  c = 1.0 / 0.0\n  d2 = 5 % (d - 8)\n}\n")
w("bad_dims", HEAD + "  param a : [-1]\n  param b : [0, 3]\n  param c : [d, d, d, d, d, d, d, d, d]\n"
  "  param e : [2.5]\n  param f : [1099511627777]\n}\n")
w("huge_repeat", HEAD + "  x = embed(t, 16, d)\n  repeat 100000 {\n"
  + "    x = x + layernorm(x)\n" * 20 + "  }\n  loss = cross_entropy(x, t)\n}\n")
w("empty", "")
w("only_comment", "# nothing here\n")
w("unterminated", HEAD + "  x = layernorm(")
