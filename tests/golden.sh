#!/bin/sh
# Golden test runner.  usage: golden.sh PARC CASE.dsl [--update]
#
# The expected file beside CASE.dsl picks the check:
#   CASE.ir   parc CASE.dsl --emit ir   must exit 0 and print exactly this
#   CASE.out  parc CASE.dsl             must exit 0 and print exactly this report
#   CASE.err  parc CASE.dsl             must exit 1 (or the code on a '# EXIT: N'
#                                       line) and print exactly this on stderr
# A line '# ARGS: ...' in CASE.dsl adds command-line arguments.  parc runs
# in the case's directory so that paths in messages are stable.
# --update rewrites the expected file from the current output.
set -u
parc=$1 case=$2 update=${3:-}
dir=$(dirname "$case") name=$(basename "$case" .dsl)
args=$(sed -n 's/^# ARGS: //p' "$case" | head -n 1)
want_rc=$(sed -n 's/^# EXIT: //p' "$case" | head -n 1)
cd "$dir" || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

if [ -f "$name.ir" ]; then kind=ir; want_rc=${want_rc:-0}
elif [ -f "$name.out" ]; then kind=out; want_rc=${want_rc:-0}
elif [ -f "$name.err" ]; then kind=err; want_rc=${want_rc:-1}
else echo "no expected file (.ir, .out or .err) for $case"; exit 1
fi

# shellcheck disable=SC2086
if [ $kind = ir ]; then "$parc" "$name.dsl" --emit ir $args >"$tmp/got" 2>"$tmp/stderr"
else "$parc" "$name.dsl" $args >"$tmp/stdout" 2>"$tmp/stderr"
fi
rc=$?
[ $kind = out ] && cp "$tmp/stdout" "$tmp/got"
[ $kind = err ] && cp "$tmp/stderr" "$tmp/got"

if [ "$update" = --update ]; then
  cp "$tmp/got" "$name.$kind"
  echo "updated $dir/$name.$kind (exit $rc)"
  exit 0
fi
if [ "$rc" != "$want_rc" ]; then
  echo "FAIL $name: exit code $rc, expected $want_rc"
  cat "$tmp/stderr"
  exit 1
fi
if ! diff -u "$name.$kind" "$tmp/got"; then
  echo "FAIL $name: output differs from $name.$kind (rerun with --update if intended)"
  exit 1
fi
exit 0
