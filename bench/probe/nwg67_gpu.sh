#!/bin/bash
# Fourteenth session, call 3 (step 67, issue 11, branch issue11-fwd-nwg3): the ws forward at hdim 64
# with three MMA warpgroups (192 query rows per CTA, 160 registers each; FlashAttention-3's hdim-64
# shape). 1. bench/ab.py, one tree against itself: NWG=2 forced (A) against the new default (B);
# 2. memcheck of the small forwards (PERSIST=3); 3. the whole GPU suite on this tree (the default
# at hdim 64 is the new build).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "A/B hdim 64 fwd: NWG=2 (A) against NWG=3 (B)"
timeout -s KILL 75 python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_FWD_WS_TILES=NWG=2 --rounds 2 --out $OUT --tag nwg3 \
  -- --hdim 64 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -A14 "B/A" | tail -12
t "memcheck"
CUPY_FMHA_FWD_WS_TILES=PERSIST=3 timeout -s KILL 40 compute-sanitizer --tool memcheck --report-api-errors no \
  python3 bench/probe/sanitize_fwd_ws.py 64 2>&1 | tail -1
t "whole GPU suite"
timeout -s KILL 470 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
rm -f $OUT/*.png
t done
