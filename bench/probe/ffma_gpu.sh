#!/bin/bash
# GPU run for branch issue11-fwd-ffma (bench/NOTES.md step 37): the ws forward's tests (with the new
# negative-scale cases), then an A/B of the forward against a main tree given as $1.
#   OUT=/tmp/out bash bench/probe/ffma_gpu.sh /path/to/main-tree
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests/test_gpu_fwd_ws.py tests/test_fwd_ws_sass.py"
timeout -s KILL 150 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_gpu_fwd_ws.py tests/test_fwd_ws_sass.py \
  > $OUT/ffma-tests.txt 2>&1; echo "rc=$?"
grep -E "^FAILED|^ERROR" $OUT/ffma-tests.txt | head; tail -1 $OUT/ffma-tests.txt
t "A/B fwd: $1 (A) vs this tree (B)"
timeout -s KILL 150 python3 bench/ab.py --a "$1" --b "$PWD" --rounds 2 --out $OUT/ab37 -- --hdim 64,128 --seqlen 1024,8192 \
  --dtype bf16 --causal both --mode fwd 2>&1 | tail -11
t done
