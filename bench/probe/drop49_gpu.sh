#!/bin/bash
# Step 49 (next session's first run): the ws backward's DROPOUT build (warps make their own keep
# bits, AccFrag::keep_bits_t), written and compiled offline only: its tests (test_gpu_bwd_ws.py's
# dropout cases, under CUPY_FMHA_BWD_WS=1), the sanitizers, and its time against the default
# (fmha_bwd_dq_dk_dv_sm90) and with 128 query rows at hdim 64.   OUT=/tmp/out bash bench/probe/drop49_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t tests
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py -k "dropout or switch" \
  > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -E "^E  " $OUT/tests.txt | head -10
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t timing
timeout 60 python3 bench/probe/drop_bwd.py default 64,128
CUPY_FMHA_BWD_WS=1 timeout 60 python3 bench/probe/drop_bwd.py ws 64,128
CUPY_FMHA_BWD_WS=1 CUPY_FMHA_BWD_WS_TILES=BLOCK_M=128 timeout 40 python3 bench/probe/drop_bwd.py ws-bm128 64
t done
t fwd-d64-serial
timeout 60 python3 bench/probe/drop_ws.py overlap 64 1024,4096
CUPY_FMHA_FWD_WS_TILES=PV_OVERLAP=0,PINGPONG=0 timeout 60 python3 bench/probe/drop_ws.py serial 64 1024,4096
t done2
t bias128
timeout 120 python3 bench/probe/bias128.py 128
t done3
