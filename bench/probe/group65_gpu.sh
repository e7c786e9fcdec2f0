#!/bin/bash
# Step 65 (issue 10, branch issue10-heads-group; prepared in the thirteenth session, not yet run):
# the ws backward's grouped start order (HEADS_X=2: heavy key blocks first within groups of two
# heads), which the plan takes for causal masks at 4097-8192 keys with an even nhead_q at hdim <= 128.
#   1. the new GPU tests (forced through CUPY_FMHA_BWD_WS_TILES=HEADS_X=2 at small shapes) and the ws,
#      varlen and deterministic files as they are;
#   2. memcheck / racecheck / synccheck of sanitize_bwd_ws.py 64,128 under HEADS_X=2 (every call there
#      has two query heads);
#   3. bench/ab.py against main (base tree in .abbase: `git archive main kernels cupy_fmha bench`, less
#      bench/data and bench/results): causal, hdim 64 and 128, bf16 and fp16, seqlen 4096 (HEADS_X=1 on
#      both sides: a control), 8192 (the change), 16384 (0 on both sides: a control).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests"
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py tests/test_gpu_varlen.py \
  tests/test_gpu_deterministic.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  echo "-- $tool"; CUPY_FMHA_BWD_WS_TILES=HEADS_X=2 timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_bwd_ws.py 64,128 plain 2>&1 | tail -1
done
t "A/B"
timeout -s KILL 150 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab65 -- --hdim 64,128 \
  --seqlen 4096,8192,16384 --dtype bf16,fp16 --causal yes --mode bwd 2>&1 | grep -A20 "B/A" | tail -16
rm -f $OUT/*.png
t done
