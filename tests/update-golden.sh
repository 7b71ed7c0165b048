#!/bin/sh
# Regenerates every golden file from the current compiler: review the diff!
# usage: tests/update-golden.sh [BUILD_DIR]
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
for c in "$here"/golden/*.dsl; do sh "$here/golden.sh" "$(cd "$build" && pwd)/parc" "$c" --update; done
