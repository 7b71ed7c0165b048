#!/bin/sh
# Sets up, builds parc, and compiles the example models, printing what parc
# reports for each: parameters, FLOPs per token, per-rank memory.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
cmake -S . -B build >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" >build.log 2>&1 || { cat build.log; exit 1; }
for model in gpt2_tiny llama_tiny moe_tiny gpt2 llama mixtral; do
  echo
  echo "\$ parc examples/$model.dsl"
  ./build/parc "examples/$model.dsl"
done
echo
echo "\$ parc examples/llama.dsl --tp 8 --pp 4 --dp 4"
./build/parc examples/llama.dsl --tp 8 --pp 4 --dp 4
