#!/bin/bash
# Step 63 (issue 11): the ws forward's O through a shared-memory stage and bulk row copies (O_STAGE,
# the default where it fits). A/B against HEAD (bench/ab.py, base tree in .abbase: `git archive HEAD
# kernels cupy_fmha bench`), the ws forward's tests, sanitizers (PERSIST=3: one CTA writes the stage
# for two row blocks). (The first version, 64 threads of a warpgroup sending one row each, was timed
# with probe/fwd_variants.py against O_REG=1 in one process: see bench/NOTES.md step 63.)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "A/B"
timeout -s KILL 150 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab63 -- --hdim 64,128 \
  --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -A25 "B/A" | tail -22
rm -f $OUT/*.png
t "ws forward tests"
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  echo "-- $tool"; CUPY_FMHA_FWD_WS_TILES=PERSIST=3 timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_fwd_ws.py 64,128 2>&1 | tail -1
done
t done
