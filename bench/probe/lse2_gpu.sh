#!/bin/bash
# GPU run for branch issue10-lse-log2 (bench/NOTES.md step 36): the ws backward's and the
# deterministic tests, then an A/B of the backward against a main tree given as $1.
#   OUT=/tmp/out bash bench/probe/lse2_gpu.sh /path/to/main-tree
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests/test_gpu_bwd_ws.py tests/test_gpu_deterministic.py"
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_gpu_bwd_ws.py \
  tests/test_gpu_deterministic.py > $OUT/lse2-tests.txt 2>&1; echo "rc=$?"
grep -E "^FAILED|^ERROR" $OUT/lse2-tests.txt | head; tail -1 $OUT/lse2-tests.txt
t "A/B bwd: $1 (A) vs this tree (B)"
timeout -s KILL 200 python3 bench/ab.py --a "$1" --b "$PWD" --rounds 2 --out $OUT/ab36 -- --hdim 64,128 --seqlen 1024,8192 \
  --dtype bf16 --causal both --mode bwd 2>&1 | tail -11
t done
