#!/bin/sh
# tests/kir/vectorized.sh LL SPEC... -- each kernel's optimized IR in LL
# must hold vector code.  SPEC is KERNEL (some <4|8|16 x float> value) or
# KERNEL=REGEX (an extended regex its body must match).
ll=$1
shift
status=0
for spec in "$@"; do
  fn=${spec%%=*}
  case $spec in
    *=*) re=${spec#*=} ;;
    *) re='<(4|8|16) x float>' ;;
  esac
  body=$(awk -v fn="$fn" '$0 ~ ("^define .*@" fn "\\(") { p = 1 } p { print } p && /^}/ { exit }' "$ll")
  if [ -z "$body" ]; then
    echo "FAIL $fn: not in $ll"
    status=1
  elif printf '%s\n' "$body" | grep -Eq "$re"; then
    echo "ok   $fn: $re"
  else
    echo "FAIL $fn: nothing matches $re (not vectorized?)"
    status=1
  fi
done
exit $status
