#!/bin/bash
# Step 73: compute-sanitizer on the dropout paths after the generator change (the ws forward and
# backward scripts run dropout calls: causal, group mode), hdim 64 and 128.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for tool in memcheck racecheck synccheck; do
  t "fwd $tool"; timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64,128 2>&1 | tail -1
  t "bwd $tool"; timeout -s KILL 80 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 2>&1 | tail -1
done
t done
