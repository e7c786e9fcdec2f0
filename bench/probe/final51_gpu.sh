#!/bin/bash
# Steps 50-51, part 1: the dropout forward's time with and without KEEP_GEN (the ws forward's keep
# bits from the producer warpgroup's idle warps); the sanitizers on that build; the hdim-128 bias
# backward on the ws kernel (bias128.py).   OUT=/tmp/out bash bench/probe/final51_gpu.sh
# Part 2 (the next call, while the machine is warm): bench/probe/suite51_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t timing
timeout 90 python3 bench/probe/drop_ws.py keepgen 64,128,192
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=0 timeout 60 python3 bench/probe/drop_ws.py inmma 64,128
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64,128 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t bias128
timeout 100 python3 bench/probe/bias128.py 128
t done
