#!/bin/bash
# Fourteenth session, call 2: the whole GPU suite on main + step 65 (the grouped causal start order),
# then one tree against itself: the plain order (HEADS_X=0, side A) against groups of two heads
# (HEADS_X=2, side B) at causal 8192 (step 65's range) and 16384 keys (outside it: does it pay there?).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "whole GPU suite"
timeout -s KILL 470 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
t "A/B: HEADS_X=0 (A) against HEADS_X=2 (B), causal bwd bf16"
timeout -s KILL 110 python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS_TILES=HEADS_X=0 --env-b CUPY_FMHA_BWD_WS_TILES=HEADS_X=2 \
  --rounds 3 --out $OUT --tag hx2 -- --hdim 64,128 --seqlen 8192,16384 --dtype bf16 --causal yes --mode bwd 2>&1 | grep -A8 "B/A" | tail -6
rm -f $OUT/*.png
t done
