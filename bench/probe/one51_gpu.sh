#!/bin/bash
# Steps 50-51 in one call (device time was short): the whole GPU suite (-v: a run cut by its time
# limit still shows each result) on the tree where the ws backward's dropout build and the ws
# forward's KEEP_GEN build are the defaults; then the dropout forward with and without KEEP_GEN;
# then the sanitizers on the KEEP_GEN build, as far as the call's 600 s allow.
#   OUT=/tmp/out bash bench/probe/one51_gpu.sh
# (KEEP_GEN was removed after this run: bench/NOTES.md step 51; the script stays as its record)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( 585 - $(date +%s) + T0 )); }
t suite
timeout -s KILL 450 python3 -m pytest -m gpu -v -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$? $(tail -1 $OUT/suite.txt)"
echo "PASSED: $(grep -c ' PASSED ' $OUT/suite.txt)  FAILED: $(grep -c ' FAILED ' $OUT/suite.txt)  ERROR: $(grep -c ' ERROR ' $OUT/suite.txt)  SKIPPED: $(grep -c ' SKIPPED ' $OUT/suite.txt)"
grep -E " FAILED | ERROR " $OUT/suite.txt | head -12; grep -E "^E  " $OUT/suite.txt | head -8
t timing
timeout 30 python3 bench/probe/drop_ws.py keepgen 128,64
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=0 timeout $(( $(left) > 45 ? 45 : $(left) )) python3 bench/probe/drop_ws.py inmma 128,64
for tool in racecheck memcheck synccheck; do
  L=$(left); [ $L -lt 15 ] && break
  t "$tool"
  timeout -s KILL $(( L > 40 ? 40 : L )) compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 128 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t done
