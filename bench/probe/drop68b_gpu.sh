#!/bin/bash
# Step 68b (issue 11): with 8-bit draws the dropout ws forward at hdim 128 compiles without spills in
# the overlapped ping-pong pipeline (0 B; the 16-bit one spilled 44-196 B, so the table kept the
# serial one), and at hdim 64 three MMA warpgroups with 64-key blocks compile without spills
# (128 keys: 48 B). Time them against the table's builds (bench/features.py, alternated), then
# next68's hdim-128 three-warpgroup A/B (plain forward).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
feat() { # hdim tiles-env name
  CUPY_FMHA_FWD_WS_TILES="$2" timeout -s KILL 60 python3 bench/features.py --hdim $1 --repeat 15 --rows dropout --no-peers \
    --name drop68b-$3 2>&1 | grep "│" | grep -E "dropout" | sed "s/^/$3 /"
}
for r in 1 2 3; do
  t "round $r"
  feat 128 "" h128-serial-r$r
  feat 128 "PV_OVERLAP=1,PINGPONG=1" h128-pingpong-r$r
  feat 128 "PV_OVERLAP=1,PINGPONG=0" h128-overlap-r$r
  feat 64 "" h64-nwg2-r$r
  feat 64 "NWG=3,BLOCK_N=64" h64-nwg3n64-r$r
  feat 64 "NWG=3" h64-nwg3n128-r$r
done
cp bench/results/drop68b-*.json $OUT/ 2>/dev/null
for bn in 80 64; do
  t "A/B hdim 128 fwd: default (A) against NWG=3,BLOCK_N=$bn (B)"
  timeout -s KILL 90 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=NWG=3,BLOCK_N=$bn --rounds 2 --out $OUT \
    --tag h128nwg3n$bn -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -A14 "B/A" | tail -12
done
rm -f $OUT/*.png
t done
