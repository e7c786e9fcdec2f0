#!/bin/bash
# Step 48, third run: the quad exchange without per-thread word choice (row_keep_bits): dropout
# tests on the three forward families, sanitizers on the ws dropout forward, times, feature costs.
#   OUT=/tmp/out bash bench/probe/drop48c_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests (default: ws forward)"
timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  tests/test_gpu_dropout_features.py tests/test_gpu_fwd_ws.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -E "^E  " $OUT/tests.txt | head -8
for envv in CUPY_FMHA_FWD_WS=0 CUPY_FMHA_DISABLE_WGMMA=1; do
  t "tests $envv"
  env $envv timeout -s KILL 70 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py > $OUT/t_$envv.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t_$envv.txt | head -10; tail -1 $OUT/t_$envv.txt
done
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 50 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64,128,256 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
P="python3 bench/probe/drop_ws.py"
t timing
timeout 60 $P ws 64,128 1024,4096
timeout 60 $P ws 192,256 4096
CUPY_FMHA_FWD_WS=0 timeout 40 $P old-sm90 128 4096
for d in 128 64; do
  t "features d$d"
  timeout -s KILL 60 python3 bench/features.py --hdim $d --rows plain,dropout --name 2026-12-02-h200-features-drop48-d$d > $OUT/feat$d.txt 2>&1
  echo "rc=$?"; grep -E "plain|dropout" $OUT/feat$d.txt | head -6; cp bench/results/2026-12-02-h200-features-drop48-d$d.json $OUT/ 2>/dev/null
done
t done
