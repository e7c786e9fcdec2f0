#!/bin/bash
# Thirty-fifth session's last call (about 300 s of device time left; DEADLINE, default 250 s). On an H200: the forward sweeps, feature
# costs and the FlashAttention-3 column for the README's H200 table (`s32_gpu.sh fwd128 fwd64 fwd256 features fa3`,
# carry .whl). On an H100: does sizing each xdist worker's BLAS pool to its share of the cores (tests/conftest.py,
# 22e3c0e) shorten the GPU suite? Two reference-heavy GPU test files under -n 16, three runs: B (the cap; it also
# fills CuPy's kernel cache), A (CUPY_FMHA_TEST_BLAS_THREADS=0: every worker's OpenBLAS on all 16 cores), B again;
# A against the second B, both on a warm cache.
#   bash bench/probe/s35_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$NAME"
if [[ "$NAME" == *H200* ]]; then DEADLINE=${DEADLINE:-250} exec bash bench/probe/s32_gpu.sh fwd128 fwd64 fwd256 features fa3; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
FILES="tests/test_gpu_attention.py tests/test_gpu_varlen.py"
T0=$(date +%s); DEADLINE=${DEADLINE:-250}
for r in B1 A B2; do
  left=$(( DEADLINE - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "$r: skipped, deadline"; continue; }
  v=""; [ $r = A ] && v=0
  s=$(date +%s.%N)
  CUPY_FMHA_TEST_BLAS_THREADS=$v timeout -s KILL $left python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 --dist worksteal \
    --durations=3 $FILES > $OUT/blas-$r.txt 2>&1
  echo "$r rc=$? wall $(python3 -c "import time; print(round(time.time() - $s, 1))") s: $(tail -1 $OUT/blas-$r.txt)"
  grep -E "^[0-9.]+s call" $OUT/blas-$r.txt | head -3
done
