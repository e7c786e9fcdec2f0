#!/bin/bash
# The whole GPU suite in two device calls (it outgrew one: about 1,000 GPU tests after steps 75-82, and
# the 480-second kill of suite72_gpu.sh; a call may run 600 s). Run both halves on one tree:
#   bench/probe/suite83_gpu.sh a   (the forward files and the feature files around them)
#   bench/probe/suite83_gpu.sh b   (the backward, group mode, edge cases, determinism, JAX, NCCL, CLI)
# Every GPU test file is in exactly one half (the script says so if one is missing).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
A="tests/test_gpu_fwd_ws.py tests/test_gpu_fwd_ws_bias.py tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py
   tests/test_gpu_bias.py tests/test_gpu_wgmma_swizzle.py tests/test_gpu_tma.py tests/test_gpu_native_bf16.py"
B="tests/test_gpu_bwd_ws.py tests/test_gpu_attention.py tests/test_gpu_varlen.py tests/test_gpu_edge_cases.py
   tests/test_gpu_deterministic.py tests/test_gpu_jax.py tests/test_gpu_parallel.py tests/test_gpu_large_tensors.py tests/test_cli.py"
for f in $(python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests 2>/dev/null | grep :: | cut -d: -f1 | sort -u); do
  case " $(echo $A $B) " in *" $f "*) ;; *) echo "NOT IN EITHER HALF: $f";; esac
done
case "$1" in a) FILES=$A;; b) FILES=$B;; *) echo "usage: $0 a|b"; exit 2;; esac
t "GPU suite, half $1"
timeout -s KILL 540 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 $FILES > $OUT/suite-$1.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite-$1.txt | head -20; tail -2 $OUT/suite-$1.txt
t done
