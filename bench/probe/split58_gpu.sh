#!/bin/bash
# Step 58: the whole GPU suite on 7df253b (its new group-mode deterministic cases), then where the
# backward's time goes at short lengths (per-kernel ncu times, ours and cuDNN).  OUT=/tmp/out bash bench/probe/split58_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "split"
for a in "128 1024 causal" "128 1024" "128 2048" "128 2048 causal" "256 2048" "256 2048 causal"; do
  timeout -s KILL 40 python3 bench/probe/bwd_split.py $a 2>&1 | grep -v Warn
  timeout -s KILL 60 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv python3 bench/probe/bwd_split.py $a --once 2>/dev/null \
    | grep gpu__time | awk -F'","' '{printf "  %-60.60s %s %s\n", $5, $NF, $(NF-1)}' | tr -d '"'
done
t "whole GPU suite"
timeout -s KILL 420 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
t done
