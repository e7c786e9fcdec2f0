#!/bin/bash
# Step 61: the ws backwards' grid as (nhead_q, key blocks, batch) (heavy key blocks first under causal
# masks) against HEAD's (key blocks, nhead_q, batch): bench/ab.py (base tree in .abbase: git archive of
# HEAD's kernels, cupy_fmha, bench), then the ws backward's tests and memcheck/racecheck/synccheck.
# It recorded the heads-first grid at every shape and mask (the kernels then read kb = blockIdx.y,
# h = blockIdx.x unconditionally); the tree now takes it only where the plan's rule says
# (HEADS_X, use_heads_x), so a rerun measures the rule (as final61_gpu.sh does).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "A/B"
timeout -s KILL 230 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab61 -- --hdim 64,128,256 \
  --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode bwd 2>&1 | grep -A40 "B/A" | tail -34
t "tests"
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
  tests/test_gpu_bwd_ws.py tests/test_gpu_varlen.py tests/test_gpu_deterministic.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  echo "-- $tool"; timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 plain 2>&1 | tail -1
done
t done
