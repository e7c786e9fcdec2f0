#!/bin/bash
# Step 53 (issue 10, bias + dBias): the ws backward's dBias through TMA. Its tests, the bias suites,
# the timing A/B (probe/dbias_tma.py) and the three sanitizers on the dBias calls.
#   OUT=/tmp/out bash bench/probe/dbias53_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( 585 - $(date +%s) + T0 )); }
t tests
timeout -s KILL 200 python3 -m pytest -v -p no:cacheprovider -n 12 tests/test_gpu_fwd_ws_bias.py tests/test_gpu_bias.py > $OUT/tests.txt 2>&1
echo "rc=$? $(tail -1 $OUT/tests.txt)"
grep -E " FAILED | ERROR " $OUT/tests.txt | head -12; grep -E "^E  " $OUT/tests.txt | head -12
t timing
timeout 150 python3 bench/probe/dbias_tma.py 64,128
for tool in memcheck racecheck synccheck; do
  L=$(left); [ $L -lt 15 ] && break
  t "$tool"
  timeout -s KILL $(( L > 70 ? 70 : L )) compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 dbias \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t done
