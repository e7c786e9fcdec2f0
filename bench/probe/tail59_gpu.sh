#!/bin/bash
# Step 59: the ws backward's final dQ wait after the dK/dV stores (.read): the CTA timeline (TIMING build), end-to-end
# against cuDNN (compare with step 58's bwd_split.py numbers), the ws backward's tests and memcheck/racecheck.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for a in "128 1024" "128 2048" "64 2048"; do
  echo "== $a"; timeout -s KILL 60 python3 bench/probe/timeline58.py $a 2>&1 | grep -E "^phase|^globaltimer phase|^gap"
done
t "end to end"
for a in "128 1024 causal" "128 1024" "128 2048" "128 2048 causal" "256 2048" "256 2048 causal" "64 2048"; do
  timeout -s KILL 40 python3 bench/probe/bwd_split.py $a 2>&1 | grep -v Warn
done
t "tests"
timeout -s KILL 170 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
  tests/test_gpu_bwd_ws.py tests/test_gpu_varlen.py tests/test_gpu_deterministic.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "sanitizers"
for tool in memcheck racecheck; do
  echo "-- $tool"
  timeout -s KILL 70 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 plain 2>&1 | tail -2
done
t done
