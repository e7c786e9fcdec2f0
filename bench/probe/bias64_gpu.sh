#!/bin/bash
# Step 64 (issue 11): the hdim-64 bias forward with 2 (default), 3 and 4 tiles in the ws forward's
# bias ring (CUPY_FMHA_FWD_WS_TILES=BIAS_RING=n), each depth in its own process, twice, alternated.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for round in 1 2; do
  for n in 2 3 4; do
    t "round $round BIAS_RING=$n"
    CUPY_FMHA_FWD_WS_TILES=BIAS_RING=$n timeout -s KILL 60 python3 bench/features.py --hdim 64 --rows plain,bias \
      --repeat 15 --no-peers --name bias64-r$n-$round 2>&1 | grep -E "plain|bias" | grep -v "^#" | cut -c1-150
    cp bench/results/bias64-r$n-$round.json $OUT/ 2>/dev/null
  done
done
if [ -z "$SKIP_TESTS" ]; then t "bias tests under BIAS_RING=4"
CUPY_FMHA_FWD_WS_TILES=BIAS_RING=4 timeout -s KILL 90 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws_bias.py 2>&1 | tail -2; fi
t done
