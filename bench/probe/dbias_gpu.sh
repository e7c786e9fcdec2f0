#!/bin/bash
# GPU run for bench/NOTES.md steps 45-46: the ws backward at head dims that round up to 128 (A/B against
# the mma.sync kernel it replaces), dBias stored directly in the bias's dtype (feature costs at hdim 64
# and 128), the sanitizers on small backwards (hdim 64 and 96: the ws bias build and the mma.sync
# kernel with the direct dBias store), then the whole GPU suite in what time is left.
#   OUT=/tmp/out bash bench/probe/dbias_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for d in 64 128; do
  t "features hdim $d"
  timeout -s KILL 50 python3 bench/features.py --hdim $d --rows "plain,bias" --no-peers --name dbias-d$d 2>&1 | grep -E "^│" | cut -c1-110
  cp bench/results/dbias-d$d.json $OUT/ 2>/dev/null
done
t "ab bwd rounded head dims"
timeout -s KILL 110 python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS=0 --rounds 1 --out $OUT -- --hdim 72,96,104 \
  --seqlen 1024,4096 --dtype bf16 --causal both --mode bwd > $OUT/ab.txt 2>&1
echo "rc=$?"; grep -A14 "^dtype" $OUT/ab.txt
t memcheck
timeout -s KILL 60 compute-sanitizer --tool memcheck --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,96 > $OUT/memcheck.txt 2>&1
echo "rc=$? $(grep -E 'ERROR SUMMARY|^ok' $OUT/memcheck.txt | tr '\n' ' ')"
for tool in racecheck synccheck; do
  t "$tool"
  timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 96 > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
done
t "suite"
left=$(( 585 - ($(date +%s)-T0) ))
timeout -s KILL $left python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 -rs > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -30; tail -3 $OUT/suite.txt
t done
