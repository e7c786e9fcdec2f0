#!/bin/bash
# GPU run for the ws backward's 128-query-row build at hdim 64 (bench/NOTES.md step 35): bwd timing
# at hdim 64 (default vs CUPY_FMHA_BWD_WS_TILES=BLOCK_M=128 vs cuDNN, one process), memcheck /
# racecheck / synccheck of it, then the whole GPU suite under BLOCK_M=128 (which changes only the
# hdim-64 ws backward, so the suite covers both that build and every other default kernel).
#   OUT=/tmp/out bash bench/probe/bm128_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "bwd timing, hdim 64: default vs BLOCK_M=128 vs cuDNN"
timeout -s KILL 120 python3 bench/probe/fwd_variants.py --mode bwd --hdim 64 --seqlen 1024,2048,8192,16384 \
  --variants "" "BLOCK_M=128" --out $OUT/bm128-variants.json 2>&1 | grep -v "^$" | tail -40
t "bwd timing, hdim 128: default vs STAGES=3 (a third Q/dO buffer: 231,992 B of shared memory) vs cuDNN"
timeout -s KILL 90 python3 bench/probe/fwd_variants.py --mode bwd --hdim 128 --seqlen 1024,8192 \
  --variants "" "STAGES=3" --out $OUT/stages3-variants.json 2>&1 | grep -v "^$" | tail -20
for tool in memcheck racecheck synccheck; do
  t "$tool, BLOCK_M=128, hdim 64"
  CUPY_FMHA_BWD_WS_TILES=BLOCK_M=128 timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_bwd_ws.py 64 > $OUT/bm128-$tool.txt 2>&1; echo "rc=$?"; tail -1 $OUT/bm128-$tool.txt
done
t "the GPU suite under CUPY_FMHA_BWD_WS_TILES=BLOCK_M=128"
CUPY_FMHA_BWD_WS_TILES=BLOCK_M=128 timeout -s KILL 380 python3 -m pytest -m gpu -q -p no:cacheprovider -n 14 -rs \
  > $OUT/bm128-suite.txt 2>&1; echo "suite rc=$?"
grep -E "^FAILED|^ERROR" $OUT/bm128-suite.txt | head -20; tail -4 $OUT/bm128-suite.txt
t done
