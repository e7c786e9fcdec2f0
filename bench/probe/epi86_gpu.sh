#!/bin/bash
# Steps 84 and 86 (issue 11; twentieth session): O's epilogue. The timelines (step 79) put 1.56 us per
# row block at hdim 128 in O's epilogue (staged rows, 16 bulk row copies per warp) and 2.3 us at 256
# (4-byte register stores, 8 half-sector rows per instruction; the second warpgroup 2.0 us behind).
# O_VEC=1: the staged rows leave in 16-byte stores of whole rows (hdim 128; 64 with O_REG=0).
# O_IN_Q=1: where there is no stage (hdim 256; 64's O_REG), O staged in the warpgroup's rows of Q's
# buffer, then the same 16-byte stores; Q handed back after it.
#   bench/probe/epi86_gpu.sh test   (bit-identity tests of both; ~3 min)
#   bench/probe/epi86_gpu.sh ab     (bench/ab.py of each against the default; ~5 min)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for what in "$@"; do
if [ "$what" = test ]; then
  t "O_IN_Q and O_VEC tests"
  timeout -s KILL 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_gpu_fwd_ws.py -k "o_in_q or O_VEC" > $OUT/t86.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t86.txt | head -10; tail -1 $OUT/t86.txt
fi
if [ "$what" = ab ]; then
  t "precompile"
  timeout -s KILL 120 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128,256 --dtypes bf16 --fwd-ws-variants "" O_VEC=1 O_REG=0,O_VEC=1 O_IN_Q=1 2>&1 | tail -1
  t "ab O_VEC=1 at hdim 128"
  timeout -s KILL 150 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=O_VEC=1 --rounds 2 --tag ovec86-128 --out $OUT -- \
     --hdim 128 --seqlen 1024,2048,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -8
  t "ab O_IN_Q=1 at hdim 256 and 64"
  timeout -s KILL 200 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=O_IN_Q=1 --rounds 2 --tag oinq86 --out $OUT -- \
     --hdim 64,256 --seqlen 1024,2048,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -14
fi
done
t done
