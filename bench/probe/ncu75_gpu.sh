#!/bin/bash
# Prepared in the sixteenth session for issue 10's hdim-256 causal backward gap (0.84-0.89x cuDNN at
# 4096-8192; step 72 ruled out the start order): Nsight Compute digests of the wide dq_dk_dv kernel
# at hdim 256, s4096, causal against non-causal (batch 1, 16 heads, probe/once.py), and hdim 128
# causal for comparison: occupancy, issue slots, pipes, stall reasons. Run after the whole suite.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
n=0
run() { local tag=$1; shift; n=$((n+1)); t "ncu $tag: $*"
  timeout -s KILL 120 ncu --profile-from-start off $SEC --csv --page raw -k regex:"dq_dk_dv" \
     python3 bench/probe/once.py "$@" > $OUT/ncu_$n.csv 2> $OUT/ncu_$n.err
  echo "rc=$?"; python3 bench/probe/ncu_digest.py $OUT/ncu_$n.csv || tail -5 $OUT/ncu_$n.err; }
run causal-256 bwd 256 4096 causal
run plain-256 bwd 256 4096
run causal-128 bwd 128 4096 causal
t done
