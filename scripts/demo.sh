#!/bin/sh
# Sets up, builds parc, prints what parc reports for the example models
# (parameters, FLOPs per token, per-rank memory) and what fills Llama 3 8B's
# GPU arena at tp 8 (--explain memory), then compiles GPT-2 tiny
# into a trainer, builds it and trains it on the built-in corpus (no
# download) for about a minute on 2 cores: the loss falls
# from ln 256 = 5.55 to well below the corpus's unigram entropy (3.12 nats).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build >/dev/null
cmake --build build -j "$jobs" >build.log 2>&1 || { cat build.log; exit 1; }
for args in "llama.dsl --tp 8 --pp 4 --dp 4" "mixtral.dsl --tp 8 --pp 4 --dp 8 --ep 8"; do
  echo
  echo "\$ parc examples/$args -D batch=64"
  # shellcheck disable=SC2086
  ./build/parc examples/$args -D batch=64
done
echo
echo "\$ parc examples/llama.dsl --tp 8 -D precision=bf16 --explain memory  (its GPU arena, by DSL line)"
./build/parc examples/llama.dsl --tp 8 -D precision=bf16 --explain memory |
  sed -n '/^activation arena of the GPU/,$p' | cut -c1-150
echo
echo "\$ parc examples/gpt2_tiny.dsl -o build/demo"
rm -rf build/demo
./build/parc examples/gpt2_tiny.dsl -o build/demo
echo
echo "\$ cmake -S build/demo -B build/demo/build && cmake --build build/demo/build"
cmake -S build/demo -B build/demo/build >/dev/null
cmake --build build/demo/build >build/demo/build.log 2>&1 || { cat build/demo/build.log; exit 1; }
echo
echo "\$ build/demo/build/train --steps ${PARC_DEMO_STEPS:-5000} --log build/demo/log.jsonl"
build/demo/build/train --steps "${PARC_DEMO_STEPS:-5000}" --threads "$jobs" --log build/demo/log.jsonl
