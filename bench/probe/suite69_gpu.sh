#!/bin/bash
# Fifteenth session: the whole GPU suite on main after merging step 68 (8-bit dropout draws; also
# the first GPU run of 054f2e0's short-diagonal dispatch and test_three_warpgroups_under_short_diagonal_masks),
# then the dropout feature cost at hdim 128 and 64 with the peers.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "whole GPU suite"
timeout -s KILL 480 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
for hd in 128 64; do
  t "features hdim $hd"
  timeout -s KILL 45 python3 bench/features.py --hdim $hd --repeat 15 --rows dropout --name step68-features-hd$hd 2>&1 | grep "│"
done
cp bench/results/step68-features-*.json $OUT/ 2>/dev/null
rm -f $OUT/*.png
t done
