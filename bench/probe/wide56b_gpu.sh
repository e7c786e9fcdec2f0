#!/bin/bash
# Step 56, second run: racecheck after every reader of a Q/dO buffer arrives on its `empty` barrier
# itself; the wide tests again; Nsight Compute digests (stall reasons, per-opcode samples) of the
# wide backward at hdim 256 and of the ws backward at hdim 128.   OUT=/tmp/out bash bench/probe/wide56b_gpu.sh
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for tool in racecheck memcheck synccheck; do
  t "$tool"
  timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 256,192 plain \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t "tests"
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py tests/test_gpu_deterministic.py \
  -k "256 or 224 or 192 or 160 or twenty" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats"
n=0
prof() { local tag=$1; shift; n=$((n+1)); t "ncu $tag: $*"
  timeout -s KILL 120 ncu --profile-from-start off $SEC --csv --page raw -k regex:"dq_dk_dv" \
     python3 bench/probe/once.py "$@" > $OUT/ncu_$n.csv 2> $OUT/ncu_$n.err
  echo "rc=$?"; python3 bench/probe/ncu_digest.py $OUT/ncu_$n.csv || tail -5 $OUT/ncu_$n.err; }
prof wide-256 bwd 256 4096
prof ws-128 bwd 128 4096
for k in "256" "128"; do
  t "ncu source $k"
  timeout -s KILL 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -k regex:"dq_dk_dv" \
    -o $OUT/src$k python3 bench/probe/once.py bwd $k 4096 > $OUT/src$k.log 2>&1
  ncu -i $OUT/src$k.ncu-rep --page source --csv --print-source sass > $OUT/src$k.csv 2>/dev/null
  python3 bench/probe/ncu_source.py $OUT/src$k.csv 22 | cut -c1-160; rm -f $OUT/src$k.ncu-rep
done
t done
