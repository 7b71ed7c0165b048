#!/bin/sh
# Hostile inputs: each must end, within a time limit, with exit code 1 and a
# diagnostic, never a crash (exit >= 128), a hang or a flood of output.
# usage: robust.sh PARC
set -u
parc=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
python3 "$here/gen.py" "$tmp" || exit 1
fail=0 n=0
check() { # name, expected exit code, command...
  name=$1 want=$2
  shift 2
  n=$((n + 1))
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  size=$(wc -c <"$tmp/err")
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, expected $want"; head -c 2000 "$tmp/err"; fail=$((fail + 1))
  elif [ "$want" = 1 ] && ! grep -q "error" "$tmp/err"; then
    echo "FAIL $name: no error message"; fail=$((fail + 1))
  elif [ "$size" -gt 20000 ]; then
    echo "FAIL $name: $size bytes of diagnostics"; fail=$((fail + 1))
  fi
}
for f in "$tmp"/*.dsl; do
  check "$(basename "$f" .dsl)" 1 "$parc" "$f"
done
check missing_file 1 "$parc" "$tmp/does-not-exist.dsl"
check directory 1 "$parc" "$tmp"
check no_arguments 2 "$parc"
check two_files 2 "$parc" "$tmp/empty.dsl" "$tmp/empty.dsl"
check define_no_name 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" -D =3
check define_no_value 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" -D layers
check define_bad_dims 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" -D d=-64
check define_overflow 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" -D d=99999999999999999999
check define_zero_heads 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" -D heads=0
check unwritable_output 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" -o /proc/parc-cannot-write
check ranks_overflow 1 "$parc" "$here/../../examples/gpt2_tiny.dsl" --tp 65536 --pp 65536
echo "$((n - fail)) passed, $fail failed"
[ "$fail" = 0 ]
