#!/bin/bash
# Prepared in the fourteenth session for the next one (not yet run; no code change needed, every
# variant goes through CUPY_FMHA_FWD_WS_TILES):
#   1. hdim 128: three MMA warpgroups with 64- or 80-key blocks (both compile offline with 0 spills at
#      160 registers; 96 keys spill 16 B) against the default two with 128 keys: bench/ab.py, bf16,
#      both masks, 1024-16384. Step 67 found +9-14% at hdim 64 without a mask.
#   2. hdim 64: the builds step 67 left on two warpgroups or did not time: dropout (three: 0 spills,
#      ALiBi + dropout 4 B), ALiBi and varlen (three since step 67): bench/features.py with NWG=2 and NWG=3
#      forced, alternated.
#   3. the forward GPU tests at hdim 64/128 under the hdim-128 variant, if it wins.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for bn in 80 64; do
  t "A/B hdim 128 fwd: default (A) against NWG=3,BLOCK_N=$bn (B)"
  timeout -s KILL 80 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=NWG=3,BLOCK_N=$bn --rounds 2 --out $OUT \
    --tag h128nwg3n$bn -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -A14 "B/A" | tail -12
done
for r in 1 2; do
  for n in 2 3; do
    t "features hdim 64, NWG=$n forced (round $r)"
    CUPY_FMHA_FWD_WS_TILES=NWG=$n timeout -s KILL 60 python3 bench/features.py --hdim 64 --repeat 15 --rows dropout,alibi,varlen \
      --no-peers --name next68-features-hd64-nwg$n-r$r 2>&1 | grep -E "plain|dropout|alibi|varlen" | grep "│"
  done
done
cp bench/results/next68-*.json $OUT/ 2>/dev/null
t "fwd tests at hdim 64/128 under NWG=3,BLOCK_N=80"
CUPY_FMHA_FWD_WS_TILES=NWG=3,BLOCK_N=80 timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
  tests/test_gpu_fwd_ws.py -k "d64 or d128 or d120 or d96 or d56" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head; tail -1 $OUT/tests.txt
rm -f $OUT/*.png
t done
