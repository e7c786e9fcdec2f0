#!/bin/bash
# Step 69 follow-up: Nsight Compute digests of the ws forward at hdim 128 and 64, s4096, plain against
# the 8-bit dropout build (why dropout still costs 1.7-2.0x: issue slots, pipes, stalls).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats"
n=0
run() { local tag=$1; shift; n=$((n+1)); t "ncu $tag: $*"
  timeout -s KILL 100 ncu --profile-from-start off $SEC --csv --page raw -k regex:"fmha_fwd" \
     python3 bench/probe/once.py "$@" > $OUT/ncu_$n.csv 2> $OUT/ncu_$n.err
  echo "rc=$?"; python3 bench/probe/ncu_digest.py $OUT/ncu_$n.csv || tail -5 $OUT/ncu_$n.err; }
run plain-128 fwd 128 4096
run drop-128 fwd 128 4096 dropout
run plain-64 fwd 64 4096
run drop-64 fwd 64 4096 dropout
t done
