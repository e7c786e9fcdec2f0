#!/bin/bash
# Step 74 (issue 11, branch issue11-drop-next; sixteenth session): (1) the dropout GPU files on this
# branch (row_keep_bits' one-multiply gather: keep masks bit-exact against the replica); (2) the same
# at hdim 64 forced onto two ping-pong warpgroups (the candidate for FWD_WS_DROPOUT_BY_HDIM[64],
# step 73's follow-up); (3) hdim-64 dropout, table (three serial) against two ping-pong over more
# lengths, causal and not (probe/drop_ws.py); (4) the hdim-128 dropout feature cost, this tree
# against main's (.abbase = `git archive main kernels cupy_fmha bench`), alternated.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
PP="NWG=2,PV_OVERLAP=1,PINGPONG=1"
t "dropout GPU files (table builds)"
timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py \
  > $OUT/tdrop.txt 2>&1; echo "rc=$?"; grep -E "^FAILED" $OUT/tdrop.txt | head -5; tail -1 $OUT/tdrop.txt
t "dropout tests d64 under $PP"
CUPY_FMHA_FWD_WS_TILES=$PP timeout -s KILL 70 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  tests/test_gpu_dropout_features.py -k "d64 or 64" > $OUT/t64.txt 2>&1; echo "rc=$?"; grep -E "^FAILED" $OUT/t64.txt | head -5; tail -1 $OUT/t64.txt
for v in "" "$PP"; do
  t "hdim 64 dropout '$v'"
  CUPY_FMHA_FWD_WS_TILES="$v" timeout -s KILL 40 python3 bench/probe/drop_ws.py "h64[$v]" 64 2048,8192,16384
done
for r in 1 2; do
  for side in .abbase .; do
    t "features hdim 128, tree $side (round $r)"
    (cd $side && PYTHONPATH=. timeout -s KILL 40 python3 bench/features.py --hdim 128 --repeat 15 --rows dropout --no-peers \
      --name drop74-128-r$r 2>&1 | grep "│" | grep -E "plain|dropout")
  done
done
rm -f $OUT/*.png
t done
