#!/bin/bash
# Step 70 (issue 11, branch issue11-bias64-nwg3): the hdim-64 bias forward on three MMA warpgroups with
# 64-key blocks (0 spills; 128 keys spill 96-576 B). 1. the bias GPU tests; 2. sanitizers on small bias
# forwards; 3. the bias feature cost: the new table (B) against NWG=2,BLOCK_N=128 forced (A), alternated.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "bias GPU tests"
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws_bias.py tests/test_gpu_bias.py \
  tests/test_gpu_fwd_ws.py tests/test_gpu_edge_cases.py tests/test_gpu_varlen.py tests/test_gpu_dropout_features.py -k "bias" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt
for tool in memcheck racecheck synccheck; do
  echo "-- $tool"; timeout -s KILL 50 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_bias.py 64 2>&1 | tail -1
done
for r in 1 2; do
  for side in A B; do
    t "features hdim 64 bias, side $side (round $r)"
    if [ $side = A ]; then E="NWG=2,BLOCK_N=128"; else E=""; fi
    CUPY_FMHA_FWD_WS_TILES="$E" timeout -s KILL 45 python3 bench/features.py --hdim 64 --repeat 15 --rows bias --no-peers \
      --name bias70-$side-r$r 2>&1 | grep "│" | grep -E "plain|bias"
  done
done
cp bench/results/bias70-*.json $OUT/ 2>/dev/null
t done
