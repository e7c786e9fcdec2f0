#!/bin/bash
# Step 75 (issue 10; written in the seventeenth session, rewritten on main in the eighteenth after
# the branch was lost): the wide hdim-256 backward's dQ writer warp, a variant switched on by
# CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1 (not dispatched by default until this run says so).
# Most important first: (1) A/B of the writer against the default build, hdim 256 bf16, causal and
# not, s2048-8192, alternated; (2) the GPU tests of the writer (test_gpu_bwd_ws.py -k writer: batch,
# group, deterministic, twenty runs, bits equal to the default build's), then the wide cases of the
# ws file and the deterministic and varlen files under the switch; (3) compute-sanitizer racecheck,
# synccheck, memcheck on sanitize_bwd_ws.py 256 plain under the switch; (4) the deterministic
# feature cost at hdim 256 with and without it.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
W="CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1"
t "A/B: B = the writer"
timeout -s KILL 200 python3 bench/ab.py --a . --b . --env-b $W --rounds 2 --tag ab75 --out $OUT -- \
  --hdim 256 --seqlen 2048,4096,8192 --dtype bf16 --causal both --mode bwd --repeat 15 2>&1 | grep -v "^\\$"
t "writer tests"
timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py -k writer \
  > $OUT/twriter.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/twriter.txt | head -5; tail -1 $OUT/twriter.txt
t "wide cases under the switch"
env $W timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py \
  tests/test_gpu_deterministic.py tests/test_gpu_varlen.py -k "256 or 224 or 160 or 136 or d128x256" \
  > $OUT/twide.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/twide.txt | head -5; tail -1 $OUT/twide.txt
for tool in racecheck synccheck memcheck; do
  t "compute-sanitizer $tool"
  env $W timeout -s KILL 150 compute-sanitizer --tool $tool --report-api-errors no --kernel-name kns=ws_wide --print-limit 5 \
    python3 bench/probe/sanitize_bwd_ws.py 256 plain 2>&1 | tail -4
done
for v in "" "DQ_WRITER=1"; do
  t "features hdim 256 deterministic '$v'"
  CUPY_FMHA_BWD_WS_WIDE_TILES="$v" timeout -s KILL 60 python3 bench/features.py --hdim 256 --repeat 15 \
    --rows plain,deterministic --no-peers --name step75-features-hd256-w${v:+1} 2>&1 | grep "│"
done
rm -f $OUT/*.png
t done
