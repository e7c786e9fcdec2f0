#!/bin/bash
# Steps 75-76 (issue 10), part 1 of 2, timing: the dQ writer warp of both ws backwards, variants
# switched on by CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1 (hdim 256, the wide build) and
# CUPY_FMHA_BWD_WS_TILES=DQ_WRITER=1 (hdim 64 and 128), not dispatched until this says so.
# (1) A/B of the wide writer against the default build, hdim 256 bf16, causal and not,
# s2048-8192, alternated (bench/ab.py); (2) the deterministic feature cost (and plain, atomic mode)
# at hdim 64, 128, 256 with and without the writer (bench/features.py, bf16 b4 h16 s4096), two
# alternations. Part 2 (tests, compute-sanitizer): next75b_gpu.sh.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "A/B hdim 256: B = the wide writer"
timeout -s KILL 220 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1 --rounds 2 \
  --tag ab75 --out $OUT -- --hdim 256 --seqlen 2048,4096,8192 --dtype bf16 --causal both --mode bwd --repeat 15 \
  2>&1 | grep -v '^\$'
for r in 1 2; do
  for d in 128 64 256; do
    var=CUPY_FMHA_BWD_WS_TILES; [ $d = 256 ] && var=CUPY_FMHA_BWD_WS_WIDE_TILES
    for v in "" "DQ_WRITER=1"; do
      t "features hdim $d plain,deterministic $var='$v' (round $r)"
      env $var="$v" timeout -s KILL 60 python3 bench/features.py --hdim $d --repeat 15 --rows plain,deterministic \
        --no-peers --name step76-hd$d-w${v:+1}-r$r 2>&1 | grep "│" | grep -E "plain|determ"
    done
  done
done
cp bench/results/step76-*.json $OUT/ 2>/dev/null
rm -f $OUT/*.png
t done
