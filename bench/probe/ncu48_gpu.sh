#!/bin/bash
# Step 48 probes: Philox throughput alone; Nsight Compute digests of the dropout forward (on
# fmha_fwd_sm90) against its plain build and the ws forward, and of the hdim-256 wide and hdim-128
# ws backward kernels.   OUT=/tmp/out bash bench/probe/ncu48_gpu.sh
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t philox; timeout -s KILL 60 python3 bench/probe/philox_rate.py
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats"
n=0
run() { local tag=$1; shift; n=$((n+1)); t "ncu $tag: $*"
  timeout -s KILL 120 env $ENVV ncu --profile-from-start off $SEC --csv --page raw -k regex:"fmha_fwd|dq_dk_dv" \
     python3 bench/probe/once.py "$@" > $OUT/ncu_$n.csv 2> $OUT/ncu_$n.err
  echo "rc=$?"; python3 bench/probe/ncu_digest.py $OUT/ncu_$n.csv || tail -5 $OUT/ncu_$n.err; }
ENVV="CUPY_FMHA_FWD_WS=0" run drop-fwd-sm90 fwd 128 4096 dropout
ENVV="CUPY_FMHA_FWD_WS=0" run plain-fwd-sm90 fwd 128 4096
ENVV="CUPY_FMHA_FWD_WS=1" run plain-fwd-ws fwd 128 4096
ENVV="" run drop-fwd-d64 fwd 64 4096 dropout
ENVV="CUPY_FMHA_BWD_WS=1" run bwd-wide-256 bwd 256 4096
ENVV="CUPY_FMHA_BWD_WS=1" run bwd-ws-128 bwd 128 4096
t done
