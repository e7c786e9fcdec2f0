#!/bin/bash
# Step 73 follow-up: with the cheaper keep mask, do the overlapped / ping-pong pipelines now beat
# the serial dropout builds (step 69a chose serial at 10 rounds)? Table entries through
# CUPY_FMHA_FWD_WS_TILES (probe/drop_ws.py: plain and dropout p=0.1, bf16, 16384 tokens), 2 rounds.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for r in 1 2; do
  for v in "" "PV_OVERLAP=1,PINGPONG=1" "PV_OVERLAP=1,PINGPONG=0"; do
    t "hdim 128 '$v' (round $r)"
    CUPY_FMHA_FWD_WS_TILES="$v" timeout -s KILL 40 python3 bench/probe/drop_ws.py "h128[$v]" 128 1024,4096
  done
  for v in "" "NWG=3,PV_OVERLAP=1,PINGPONG=0" "NWG=2,PV_OVERLAP=1,PINGPONG=1"; do
    t "hdim 64 '$v' (round $r)"
    CUPY_FMHA_FWD_WS_TILES="$v" timeout -s KILL 40 python3 bench/probe/drop_ws.py "h64[$v]" 64 1024,4096
  done
done
t done
