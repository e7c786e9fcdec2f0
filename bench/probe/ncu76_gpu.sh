#!/bin/bash
# Seventeenth session, issue 10: where the wide hdim-256 backward's warps wait (ncu75: tensor pipe
# 37% causal and not, barrier the first stall reason at 4.6 per issue): Nsight Compute source
# counters (per SASS instruction: executions, stall samples by reason) of fmha_bwd_dq_dk_dv_sm90_ws_wide,
# bf16 b1 h16 s4096 causal; exported as CSV for bench/probe/ncu_source.py. Then issue 11's candidate:
# the plain hdim-64 forward without a mask on two ping-pong warpgroups at s1024/2048 (bench/ab.py).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "ncu source counters, wide backward hdim 256 causal"
timeout -s KILL 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -k regex:"dq_dk_dv" \
   -o $OUT/wide256c python3 bench/probe/once.py bwd 256 4096 causal > $OUT/ncu.log 2>&1; echo "rc=$?"; tail -2 $OUT/ncu.log
timeout -s KILL 60 ncu -i $OUT/wide256c.ncu-rep --page source --csv --print-source sass > $OUT/wide256c_src.csv 2> $OUT/src.err
echo "rc=$?"; python3 bench/probe/ncu_source.py $OUT/wide256c_src.csv 20 || tail -5 $OUT/src.err
rm -f $OUT/wide256c.ncu-rep
t "ab hdim 64 plain forward, NWG=2 (B) against the table (A)"
timeout -s KILL 200 python3 bench/ab.py --a . --b . --rounds 3 --env-b CUPY_FMHA_FWD_WS_TILES=NWG=2 --out $OUT -- \
   --mode fwd --dtype bf16 --hdim 64 --seqlen 1024,2048 --causal no 2>&1 | grep -v '^\$'
t done
