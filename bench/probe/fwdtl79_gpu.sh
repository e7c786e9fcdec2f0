#!/bin/bash
# Step 79: where the ws forward's time goes at short lengths (the TIMING build's per-row-block stamps,
# bench/probe/fwd_timeline.py), the points issue 11 still misses (hdim 128 s1024 0.84x cuDNN, hdim
# 64 s1024-4096 0.79-0.90, hdim 256 s1024 0.82) beside long ones that meet it; then the wide backward's
# phase sums at hdim 256 (bench/probe/wide_timeline.py) and the deterministic backward by key block. About 4 minutes.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
for a in "128 1024" "128 1024 causal" "128 2048" "128 8192" "128 1024 PERSIST=0" "64 1024" "64 4096" "64 16384" "256 1024" "256 8192"; do
  echo "== $a"; timeout -s KILL 60 python3 bench/probe/fwd_timeline.py $a 2>&1 | grep -v Warn
done
# and the wide backward's phase sums (hdim 256, bench/probe/wide_timeline.py), with and without the dQ writer (step 75;
# the default since step 83)
for a in "2048" "4096" "4096 causal" "4096 DQ_WRITER=0" "8192"; do
  echo "== wide $a"; timeout -s KILL 60 python3 bench/probe/wide_timeline.py $a 2>&1 | grep -v Warn
done
# and the deterministic backward's start by key block (the ordered adds' staircase, bench/probe/timeline58.py det)
for a in "128 4096 det" "128 4096 det DQ_WRITER=1" "64 4096 det"; do
  echo "== ws bwd $a"; timeout -s KILL 60 python3 bench/probe/timeline58.py $a 2>&1 | grep -v Warn
done
