#!/bin/bash
# Prepared in the fifteenth session, run in the sixteenth (trimmed to one call: s16384 and the second
# hdim-64 round dropped; no code change needed, every
# variant goes through CUPY_FMHA_FWD_WS_TILES; probe/drop_ws.py times plain and dropout p=0.1 in one
# process, non-causal and causal, bf16, 16384 tokens per batch):
#   1. the hdim-128 dropout forward (serial, two warpgroups, 128 keys: 1.71-1.77x plain) with 64- and
#      96-key blocks (serial) and three warpgroups with 64 (step 71: 1.597-1.615 against 1.529-1.652,
#      undecided), alternated, s1024 / s4096 / s16384;
#   2. hdim 64 under short causal masks: the dropout build step 71 left there (two warpgroups,
#      overlapped; A = table) against three serial (B), s1024 / s2048 (use_fwd_ws_short's range);
#   3. issue 10's hdim-256 causal backward gap (0.84-0.89x cuDNN at 4096-8192): the wide kernel with
#      the grouped start order (HEADS_X=2 or 4; today 1 up to 4096 keys, 0 above: use_heads_x groups
#      only hdim <= 128), which compiles without spills (offline, fifteenth session); first its tests
#      under HEADS_X=2 (cases whose nhead_q is odd raise launch.py's ValueError there: failures to
#      read, not kernel faults), then bench/ab.py, the table (A) against each (B);
#   4. then the whole GPU suite if anything changes the table.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for r in 1 2; do
  for v in "" "BLOCK_N=64" "BLOCK_N=96" "NWG=3,BLOCK_N=64"; do
    t "hdim 128 dropout, tiles '$v' (round $r)"
    CUPY_FMHA_FWD_WS_TILES="$v" timeout -s KILL 50 python3 bench/probe/drop_ws.py "h128[$v]" 128 1024,4096
  done
done
for v in "" "NWG=3,PV_OVERLAP=0,PINGPONG=0"; do
  t "hdim 64 dropout, tiles '$v' (the short rule applies to causal rows only)"
  CUPY_FMHA_FWD_WS_TILES="$v" timeout -s KILL 40 python3 bench/probe/drop_ws.py "h64[$v]" 64 1024,2048
done
t "wide backward tests under HEADS_X=2"
CUPY_FMHA_BWD_WS_WIDE_TILES=HEADS_X=2 timeout -s KILL 110 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
  tests/test_gpu_bwd_ws.py tests/test_gpu_deterministic.py -k "256 or d192 or d160 or 224" 2>&1 | tail -1
for hx in 2 4; do
  t "A/B hdim 256 causal bwd: table (A) against HEADS_X=$hx (B)"
  timeout -s KILL 110 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_WIDE_TILES=HEADS_X=$hx --rounds 2 --out $OUT \
    --tag wide-hx$hx -- --hdim 256 --seqlen 4096,8192 --dtype bf16 --causal yes --mode bwd 2>&1 | grep -A6 "B/A" | tail -5
done
rm -f $OUT/*.png
t done
