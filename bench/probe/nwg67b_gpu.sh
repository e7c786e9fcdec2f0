#!/bin/bash
# Fourteenth session, call 4 (step 67 and step 65's sweep): racecheck and synccheck of the hdim-64
# three-warpgroup forward; the forward sweep at hdim 64 and the causal backward sweeps at hdim 64
# and 128 against the peers (JSON and plots into $OUT).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for tool in racecheck synccheck; do
  t "$tool"; CUPY_FMHA_FWD_WS_TILES=PERSIST=3 timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_fwd_ws.py 64 2>&1 | tail -1
done
t "fwd sweep hdim 64"
timeout -s KILL 40 python3 bench/sweep.py --hdim 64 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode fwd --peers flash,cudnn --name 2026-12-04-h200-sweep-fwd-hd64-step67 --out-dir $OUT > $OUT/sw64.txt 2>&1; echo "rc=$?"
for hd in 128 64; do
  t "causal bwd sweep hdim $hd"
  timeout -s KILL 45 python3 bench/sweep.py --hdim $hd --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal yes \
    --mode bwd --peers flash,cudnn --name 2026-12-04-h200-sweep-bwd-causal-hd$hd-step65 --out-dir $OUT > $OUT/swb$hd.txt 2>&1
  echo "rc=$?"
done
rm -f $OUT/*fp16.png $OUT/sw*.txt
t done
