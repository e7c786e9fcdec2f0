#!/bin/bash
# Step 60 (c): the staged dK/dV epilogue on by default (ws and wide backwards): A/B against 7df253b
# (git archive of kernels, cupy_fmha, bench into .abbase), the whole GPU suite, memcheck/racecheck of the wide build.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
timeout -s KILL 60 python3 bench/probe/timeline58.py 128 1024 2>&1 | grep -E "^phase"
t "A/B"
timeout -s KILL 170 python3 bench/ab.py --a .abbase --b . --rounds 2 --out $OUT --tag ab60 -- --hdim 64,128,256 \
  --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode bwd 2>&1 | grep -A40 "B/A" | tail -34
t "sanitizers (wide)"
for tool in memcheck racecheck; do
  echo "-- $tool"; timeout -s KILL 50 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 256 plain 2>&1 | tail -2
done
t "whole GPU suite"
timeout -s KILL 400 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
t done
