#!/bin/sh
# Sets up and runs the whole test suite:
#   1. the normal build (warnings are errors) and every ctest test;
#   2. the same suite built with AddressSanitizer and UBSan (clang), less the nvcc
#      builds of generated CUDA sources (label nvcc, already run in step 1);
#   3. the frontend fuzzer for PARC_FUZZ_SECONDS (default 60) from a seed
#      corpus of the examples and golden cases.
# PARC_QUICK=1 runs step 1 only.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
total=0

run_suite() { # build-dir, ctest label to exclude (or ""), cmake options...
  dir=$1 skip=$2
  shift 2
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -DPARC_WERROR=ON "$@" >/dev/null
  echo "== build $dir"
  cmake --build "$dir" -j "$jobs" >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  echo "== test $dir"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" ${skip:+-LE "$skip"} |
    tee "$dir.ctest" | tail -n 4
  n=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$dir.ctest")
  [ -n "$n" ] || { echo "test.sh: failures in $dir (see above)"; exit 1; }
  total=$((total + n))
}

run_suite build ""
if [ "${PARC_QUICK:-0}" != 1 ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  # (the nvcc builds of generated CUDA sources are the same with a sanitized parc: run once)
  run_suite build-asan nvcc -DCMAKE_C_COMPILER=clang -DPARC_SANITIZE=ON

  echo "== fuzz the frontend for ${PARC_FUZZ_SECONDS:-60} s"
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DPARC_FUZZ=ON >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_frontend >build-fuzz.log 2>&1 ||
    { cat build-fuzz.log; exit 1; }
  rm -rf build-fuzz/corpus && mkdir -p build-fuzz/corpus build-fuzz/seeds
  cp examples/*.dsl tests/golden/*.dsl build-fuzz/seeds/
  ./build-fuzz/fuzz_frontend -max_total_time="${PARC_FUZZ_SECONDS:-60}" -max_len=8192 \
    -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 build-fuzz/corpus build-fuzz/seeds \
    >build-fuzz/fuzz.log 2>&1 || { tail -n 60 build-fuzz/fuzz.log; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/fuzz.log || true
  total=$((total + 1))
fi
echo "test.sh: every suite passed"
echo "total: $total passed, 0 failed"
