#!/usr/bin/env bash
# The GPU check (benchmarks/gpu.py) on torch and JAX, for a machine with an
# accelerator. Such a machine may lack Keras: put the wheels it misses in
# .whl first (on a machine with the registry):
#   python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl keras namex optree
# Then, there: bash benchmarks/gpu.sh   (writes docs/results.md's GPU rows;
# JSON and a copy of the docs also go to $OUT when it is set).
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/results}"
for backend in torch jax; do
  KERAS_BACKEND=$backend python3 benchmarks/gpu.py --output "$out" "$@"
done
[ "$out" = benchmarks/results ] || cp docs/results.md "$out/"
