#!/bin/bash
# Step 58: the ws backward's persistent grid (CUPY_FMHA_BWD_WS_TILES=PERSIST=n): timing of n = 2, 4, 8
# against the default and cuDNN, then the ws backward's tests and the three sanitizers under PERSIST=3
# (partial last rounds, the reversed odd rounds).   OUT=/tmp/out bash bench/probe/persist58_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "variants"
timeout -s KILL 160 python3 bench/probe/fwd_variants.py --mode bwd --variants "" "PERSIST=2" "PERSIST=4" "PERSIST=8" \
  --hdim 128,64 --seqlen 1024,2048,4096 --causal both --rounds 2 --time-limit 130 --out $OUT/persist58.json > $OUT/variants.txt 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/variants.txt | tail -40 | cut -c1-170
t "tests under PERSIST=3"
CUPY_FMHA_BWD_WS_TILES=PERSIST=3 timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
  tests/test_gpu_bwd_ws.py tests/test_gpu_varlen.py tests/test_gpu_deterministic.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "sanitizers under PERSIST=3"
for tool in memcheck racecheck synccheck; do
  echo "-- $tool"
  CUPY_FMHA_BWD_WS_TILES=PERSIST=3 timeout -s KILL 75 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_bwd_ws.py 64,128 plain 2>&1 | tail -3
done
t done
