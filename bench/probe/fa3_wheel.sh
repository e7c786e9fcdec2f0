#!/bin/bash
# FlashAttention-3 for the sweep's `fa3` peer: the flash-attn3-jax wheel (PyPI; FlashAttention-3's
# Hopper kernels for JAX, head dim 128) downloaded HERE into .whl/ (git-ignored through
# .git/info/exclude), for a device call that carries it (the device machine has no network):
#   bash bench/probe/fa3_wheel.sh            # here, once per checkout
#   device run, carry [".whl"]: bash bench/probe/fa3_gpu.sh
# Its needs (jax >= 0.6, einops) are on the device image already.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl flash-attn3-jax==0.2.3
ls -la .whl
