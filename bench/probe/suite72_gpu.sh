#!/bin/bash
# Sixteenth session: the whole GPU suite on main with step 71 re-applied (branch land71: the hdim-64
# dropout forward on three serial warpgroups, short causal masks keeping two overlapped), then the
# hdim-64 dropout feature cost with the peers.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "whole GPU suite"
timeout -s KILL 480 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
t "features hdim 64"
timeout -s KILL 60 python3 bench/features.py --hdim 64 --repeat 15 --rows dropout --name step71-features-hd64 2>&1 | grep "│"
cp bench/results/step71-features-*.json $OUT/ 2>/dev/null
rm -f $OUT/*.png
t done
