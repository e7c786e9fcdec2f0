#!/bin/bash
# Fourteenth session, last call (step 67 with its length rule): the ws forward's GPU tests on the final
# tree (short diagonal masks at hdim 64 back on two MMA warpgroups), then the hdim-64 feature costs
# of the forward (bias and dropout stay on two MMA warpgroups while the plain forward takes three).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests"
timeout -s KILL 100 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt
t "features hdim 64"
timeout -s KILL 70 python3 bench/features.py --hdim 64 --repeat 15 --rows dropout,bias --no-peers \
  --name 2026-12-04-features-hd64-step67 2>&1 | tail -12
cp bench/results/2026-12-04-features-hd64-step67.json $OUT/ 2>/dev/null
t done
