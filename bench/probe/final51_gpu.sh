#!/bin/bash
# Steps 50-51 in one call: the dropout forward's time with and without KEEP_GEN (the ws forward's
# keep bits from the producer warpgroup's idle warps); the sanitizers on that build; then the whole
# GPU suite on the tree where the ws backward's dropout build and the ws forward's KEEP_GEN build
# are the defaults (-v, so that a run cut by the time limit still shows each result).
#   OUT=/tmp/out bash bench/probe/final51_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t timing
timeout 40 python3 bench/probe/drop_ws.py keepgen 64,128,192
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=0 timeout 25 python3 bench/probe/drop_ws.py inmma 64,128
timeout 30 python3 bench/probe/drop_bwd.py bwd 64,128
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 30 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64,128 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t suite
LEFT=$(( 585 - $(date +%s) + T0 ))
timeout -s KILL $LEFT python3 -m pytest -m gpu -v -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$? $(tail -1 $OUT/suite.txt)"
echo "PASSED lines: $(grep -c ' PASSED ' $OUT/suite.txt)  FAILED: $(grep -c ' FAILED ' $OUT/suite.txt)  ERROR: $(grep -c ' ERROR ' $OUT/suite.txt)  SKIPPED: $(grep -c ' SKIPPED ' $OUT/suite.txt)"
grep -E " FAILED | ERROR " $OUT/suite.txt | head -12; grep -E "^E  " $OUT/suite.txt | head -8
t done
