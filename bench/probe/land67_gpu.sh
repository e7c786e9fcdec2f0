#!/bin/bash
# Fourteenth session, call 1 (steps 65 and 66 merged on one tree, first GPU run of both): the new
# and touched tests, the A/Bs that decide whether each lands, then the sanitizers of both kernels.
# .abbase = `git archive main kernels cupy_fmha bench` (398f852), less bench/data and bench/results.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests: step 65 (heads group) and step 66 (fwd ws, both O paths)"
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py \
  "tests/test_gpu_bwd_ws.py" -k "heads_group or fwd" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "A/B 65: causal bwd, hdim 64/128 (B/A: below 1 = faster)"
timeout -s KILL 140 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab65 -- --hdim 64,128 \
  --seqlen 4096,8192,16384 --dtype bf16,fp16 --causal yes --mode bwd 2>&1 | grep -A20 "B/A" | tail -16
t "A/B 66: fwd hdim 128 bf16"
timeout -s KILL 80 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab66 -- --hdim 128 \
  --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -A14 "B/A" | tail -12
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  echo "-- bwd $tool"; CUPY_FMHA_BWD_WS_TILES=HEADS_X=2 timeout -s KILL 35 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_bwd_ws.py 64,128 plain 2>&1 | tail -1
  echo "-- fwd $tool"; CUPY_FMHA_FWD_WS_TILES=PERSIST=3,O_REG=0 timeout -s KILL 35 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_fwd_ws.py 64,128 2>&1 | tail -1
done
t "A/B 66 at hdim 64: TMA stage (B, O_REG=0) against register stores (A)"
timeout -s KILL 60 python3 bench/ab.py --a .abbase --b . --env-b CUPY_FMHA_FWD_WS_TILES=O_REG=0 --rounds 2 --out $OUT --tag ab66h64 \
  -- --hdim 64 --seqlen 1024,4096,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -A10 "B/A" | tail -8
rm -f $OUT/*.png
t done
