#!/bin/bash
# Seventh session's last run: the whole GPU suite on the final tree, then the feature costs at
# hdim 128 (every row).   OUT=/tmp/out bash bench/probe/final48_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "gpu suite"
timeout -s KILL 430 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 -rs tests/ > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; grep -E "^SKIPPED" $OUT/suite.txt | head -5; tail -1 $OUT/suite.txt
grep -E "^E  " $OUT/suite.txt | head -10
for d in 128; do
  t "features d$d"
  timeout -s KILL 55 python3 bench/features.py --hdim $d --name 2026-12-02-h200-features-s7-d$d > $OUT/feat$d.txt 2>&1
  echo "rc=$?"; grep -E "│" $OUT/feat$d.txt | cut -c1-120; cp bench/results/2026-12-02-h200-features-s7-d$d.json $OUT/ 2>/dev/null
done
t done
