#!/bin/bash
# GPU run for the wide ws backward (fmha_bwd_dq_dk_dv_sm90_ws_wide, bench/NOTES.md step 47): its tests
# (the ws backward file under CUPY_FMHA_BWD_WS=1, which now covers every head dim; the deterministic
# file; the wide head dims of the main suites), the three sanitizers at hdim 256, the hdim-256
# backward sweep against the peers, and an A/B against the mma.sync kernel it replaces.
#   OUT=/tmp/out bash bench/probe/wide_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests"
timeout -s KILL 170 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/ \
  -k "bwd_ws or d256 or d240 or d224 or d192 or d160 or 256" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
grep -E "^E  " $OUT/tests.txt | head -12
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 45 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 256 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t "sweep hdim 256 bwd"
timeout -s KILL 80 python3 bench/sweep.py --hdim 256 --seqlen 512,1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode bwd --peers flash,cudnn --name hd256-bwd > $OUT/sweep.txt 2>&1
echo "rc=$?"; grep -E "d256" $OUT/sweep.txt | tail -24 | cut -c1-150; cp bench/results/hd256-bwd* $OUT/ 2>/dev/null
t "ab"
timeout -s KILL 90 python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS=0 --rounds 1 --out $OUT -- --hdim 160,192,256 \
  --seqlen 1024,4096 --dtype bf16 --causal both --mode bwd > $OUT/ab.txt 2>&1
echo "rc=$?"; grep -A14 "^dtype" $OUT/ab.txt
t done
