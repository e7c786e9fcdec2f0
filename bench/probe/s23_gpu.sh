#!/bin/bash
# Twenty-third session (issue 11): the H200 confirmation of the two candidates that row 91 measured on an H100,
# and of step 89's miss, in one call (~6 min):
#   1. step 90: the hdim-64 16-bit bias forward on three MMA warpgroups (NWG=3, the table's since step 92) against
#      two (NWG=2, which forces the plain row to two as well: read the bias row's time, and the ratio against
#      the NWG=3 run's plain row), features.py alternated twice (H100: -5.6%, 1.42-1.44x -> 1.35x plain;
#      issue 11's target 1.3x);
#   2. step 87: SMAX_TREE=1 at hdim 64 against the default, bench/ab.py bf16 s1024-16384 causal and not
#      (H100: 0.961-1.031, -3.4/-3.9% at s8192);
#   3. step 89: ROWSUM_MMA=1 at hdim 64 (H100: 0.986-1.013, no gain; removed if the H200 agrees).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "precompile"
timeout -s KILL 120 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64 --dtypes bf16 --features \
   --fwd-ws-variants "" SMAX_TREE=1 ROWSUM_MMA=1 NWG=3 2>&1 | tail -1
for round in 1 2; do
  for v in NWG=2 ""; do
    t "features.py d64 plain,bias [$v] round $round"
    CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 60 python3 bench/features.py --hdim 64 --rows plain,bias --no-peers --repeat 15 \
      --name s23-d64-bias-${v//[=,]/}nwg-r$round 2>/dev/null | grep -E "plain|bias" | cut -c1-130
  done
done
cp bench/results/*s23-d64-*.json $OUT/ 2>/dev/null
for v in SMAX_TREE=1 ROWSUM_MMA=1; do
  t "ab $v"
  timeout -s KILL 150 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$v --rounds 2 --tag s23-${v//[=,]/} --out $OUT -- \
     --hdim 64 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -14
done
t done
