#!/bin/bash
# Step 61, final: HEADS_X (the ws backwards' heads-first grid) for causal masks up to 4096 keys, the
# plan's rule, against HEAD (bench/ab.py, base tree in .abbase); the whole GPU suite; sanitizers on
# small causal shapes (sanitize_bwd_ws.py runs causal cases, which now take the HEADS_X builds).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "A/B"
timeout -s KILL 75 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab61final -- --hdim 64,128,256 \
  --seqlen 1024,2048,4096,8192 --dtype bf16 --causal yes --mode bwd 2>&1 | grep -A20 "B/A" | tail -15
t "whole GPU suite"
timeout -s KILL 440 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  for d in 64,128 256; do
    echo "-- $tool $d"; timeout -s KILL 25 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py $d plain 2>&1 | tail -1
  done
done
t done
