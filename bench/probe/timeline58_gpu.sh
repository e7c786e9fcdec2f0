#!/bin/bash
# Step 58: where the ws backward's per-CTA time goes (the TIMING build's stamps), hdim 128 and 256-less points.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
for a in "128 1024 causal" "128 1024" "128 2048" "128 8192" "64 2048"; do
  echo "== $a"; timeout -s KILL 60 python3 bench/probe/timeline58.py $a 2>&1 | grep -v Warn
done
