#!/bin/bash
# Step 73 (issue 11, sixteenth session): the dropout generator at 7 Philox rounds (FlashAttention-2's
# and CK's count) and keep16's cheaper byte compares (a new keep mask: kernels, replica and tests
# together; bench/NOTES.md step 73).
#   1. the feature cost of dropout at hdim 128 and 64 on this tree and on main's before the step
#      (.abbase = `git archive d73214f kernels cupy_fmha bench`, less bench/data and bench/results), alternated;
#   2. the whole GPU suite (every dropout file: keep masks bit-exact against the replica).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for r in 1 2; do
  for side in .abbase .; do
    for hd in 128 64; do
      t "features hdim $hd, tree $side (round $r)"
      (cd $side && PYTHONPATH=. timeout -s KILL 40 python3 bench/features.py --hdim $hd --repeat 15 --rows dropout --no-peers \
        --name drop73-$hd-r$r 2>&1 | grep "│" | grep -E "plain|dropout")
    done
  done
done
cp bench/results/drop73-*.json $OUT/ 2>/dev/null
t "whole GPU suite"
timeout -s KILL 440 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
rm -f $OUT/*.png
t done
