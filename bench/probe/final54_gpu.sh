#!/bin/bash
# The session's last device call (little device time left): step 54's A/B (the K-major swizzled dS
# tile, DS_SW=1, in the ws backward's plain builds; bench/ab.py, one tree, CUPY_FMHA_BWD_WS_TILES=DS_SW=1
# on side B), then bench/features.py at hdim 128 and 64 on the final kernels (issue 10's feature
# costs), as far as the call's time allows.
#   OUT=/tmp/out bash bench/probe/final54_gpu.sh
# (DS_SW was removed after this run, bench/NOTES.md step 54; the script stays as its record)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( 380 - $(date +%s) + T0 )); }
t ab
timeout 150 python3 bench/ab.py --a . --b . --rounds 1 --out $OUT --tag dssw \
  --env-b CUPY_FMHA_BWD_WS_TILES=DS_SW=1 -- --hdim 64,128 --seqlen 2048,8192 --dtype bf16 --causal both --mode bwd 2>&1 \
  | grep -v "^\\$" | tail -14
for d in 128 64; do
  L=$(left); [ $L -lt 40 ] && break
  t "features d$d"
  timeout $(( L > 120 ? 120 : L )) python3 bench/features.py --hdim $d --repeat 15 --name 2026-12-03-h200-features-d$d 2>&1 \
    | grep -E "^\||^[a-z]" | head -30
  cp bench/results/2026-12-03-h200-features-d$d.json $OUT/ 2>/dev/null
done
t done
