#!/bin/bash
# Step 71 (issue 11): with 8-bit draws the serial dropout forward compiles without spills on three
# MMA warpgroups (hdim 64 with 128-key blocks; hdim 128 with 64 or 80). 1. bench/features.py --rows
# dropout, the table's builds against them, alternated; 2. the dropout tests at hdim 64 and at 96/128
# under each candidate; 3. memcheck of the ws forward's dropout calls under them.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
feat() { CUPY_FMHA_FWD_WS_TILES="$2" timeout -s KILL 40 python3 bench/features.py --hdim $1 --repeat 15 --rows dropout --no-peers \
    --name drop71-$3 2>&1 | grep "│" | grep -E "dropout" | sed "s/^/$3 /"; }
H64="NWG=3,PV_OVERLAP=0,PINGPONG=0"
for r in 1 2; do
  t "round $r"
  feat 64 "" h64-table-r$r; feat 64 "$H64" h64-nwg3serial-r$r; feat 64 "PV_OVERLAP=0,PINGPONG=0" h64-nwg2serial-r$r
  feat 128 "" h128-table-r$r; feat 128 "NWG=3,BLOCK_N=80" h128-nwg3n80-r$r; feat 128 "NWG=3,BLOCK_N=64" h128-nwg3n64-r$r
done
cp bench/results/drop71-*.json $OUT/ 2>/dev/null
t "dropout tests d64 under $H64"
CUPY_FMHA_FWD_WS_TILES=$H64 timeout -s KILL 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  tests/test_gpu_dropout_features.py -k "d64 or 64" > $OUT/t64.txt 2>&1; echo "rc=$?"; grep -E "^FAILED" $OUT/t64.txt | head -5; tail -1 $OUT/t64.txt
t "dropout tests d96/d128 under NWG=3,BLOCK_N=80"
CUPY_FMHA_FWD_WS_TILES=NWG=3,BLOCK_N=80 timeout -s KILL 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  tests/test_gpu_dropout_features.py -k "d128 or d96 or 128" > $OUT/t128.txt 2>&1; echo "rc=$?"; grep -E "^FAILED" $OUT/t128.txt | head -5; tail -1 $OUT/t128.txt
t "memcheck"
CUPY_FMHA_FWD_WS_TILES=$H64 timeout -s KILL 30 compute-sanitizer --tool memcheck --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64 2>&1 | tail -1
CUPY_FMHA_FWD_WS_TILES=NWG=3,BLOCK_N=80 timeout -s KILL 30 compute-sanitizer --tool memcheck --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 128 2>&1 | tail -1
t done
