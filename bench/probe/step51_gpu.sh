#!/bin/bash
# Steps 50-51: (50) the ws backward's dropout build as the default: the dropout suites as they run
# by default (and on the older kernel, CUPY_FMHA_BWD_WS=0), the feature costs; the hdim-128 bias
# backward on the ws kernel (bias128.py). (51) KEEP_GEN=1: the ws forward's keep bits made by the
# producer warpgroup's idle warps: the dropout suites under it (and with PERSIST=2: the ring across
# row blocks), the sanitizers, its time.   OUT=/tmp/out bash bench/probe/step51_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
summ() { echo "rc=$1 $(tail -1 $2)"; grep -E "^FAILED|^ERROR" $2 | head -8; grep -E "^E  " $2 | head -6; }
t tests-default
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py \
  tests/test_gpu_bwd_ws.py -k "dropout or switch or older" > $OUT/tests.txt 2>&1; summ $? $OUT/tests.txt
t tests-keepgen
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=1 timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  tests/test_gpu_dropout_features.py tests/test_gpu_fwd_ws.py -k "dropout and not older" > $OUT/tests_kg.txt 2>&1; summ $? $OUT/tests_kg.txt
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=1,PERSIST=2 timeout -s KILL 90 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  -k "not older" > $OUT/tests_kgp.txt 2>&1; summ $? $OUT/tests_kgp.txt
for tool in memcheck racecheck synccheck; do
  t "$tool"
  CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=1 timeout -s KILL 50 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_fwd_ws.py 64,128,192 > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t timing-fwd
timeout 50 python3 bench/probe/drop_ws.py default 64,128,192
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=1 timeout 50 python3 bench/probe/drop_ws.py keepgen 64,128,192
CUPY_FMHA_FWD_WS_TILES=KEEP_GEN=1,PV_OVERLAP=1,PINGPONG=1 timeout 30 python3 bench/probe/drop_ws.py kg-pp 128
t bias128
timeout 100 python3 bench/probe/bias128.py 128
t features
for d in 64 128; do timeout 60 python3 bench/features.py --hdim $d --rows plain,dropout 2>&1 | tail -6; done
t done
