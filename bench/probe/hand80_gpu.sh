#!/bin/bash
# Step 80 (issue 11; nineteenth session, on main as variants, not yet run): the ws forward's row-block
# hand-over. (1) the timeline of the default and of Q_EARLY=1,TURN_CARRY=1 at hdim 128 s1024 (Q's wait
# and the gaps, bench/probe/fwd_timeline.py); (2) the variants against the default and cuDNN in one
# process (probe/fwd_variants.py, best of 2 alternations) at the short points issue 11 misses and one
# long one; (3) their GPU tests (bit-identical to the default build) and compute-sanitizer on small
# forwards with 2 row blocks per CTA.   bench/probe/hand80_gpu.sh time   (1-2, about 8 minutes)
#                                       bench/probe/hand80_gpu.sh time2  (step 81's two Q buffers, about 6 minutes)
#                                       bench/probe/hand80_gpu.sh check  (3's tests, about 5 minutes)
#                                       bench/probe/hand80_gpu.sh sanitize  (3's compute-sanitizer runs, about 6 minutes)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for what in "$@"; do
if [ "$what" = time ]; then
t "precompile the variants (in parallel, so fwd_variants.py's time limit goes to timing)"
timeout -s KILL 120 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128,256 --dtypes bf16 --fwd-ws-variants "" \
  Q_EARLY=1 TURN_CARRY=1 Q_EARLY=1,TURN_CARRY=1 PERSIST=2 Q_EARLY=1,TURN_CARRY=1,PERSIST=2 TIMING=1 TIMING=1,Q_EARLY=1,TURN_CARRY=1 2>&1 | tail -3
for v in "" "Q_EARLY=1,TURN_CARRY=1"; do
  t "timeline hdim 128 s1024 '$v'"
  timeout -s KILL 50 python3 bench/probe/fwd_timeline.py 128 1024 $v 2>&1 | grep -v Warn
done
V='"" Q_EARLY=1 TURN_CARRY=1 Q_EARLY=1,TURN_CARRY=1'
t "fwd variants hdim 128 (and two row blocks per CTA from s4096, where the default takes one)"
eval timeout -s KILL 150 python3 bench/probe/fwd_variants.py --variants $V PERSIST=2 Q_EARLY=1,TURN_CARRY=1,PERSIST=2 \
  --hdim 128 --seqlen 1024,2048,4096 \
  --causal both --rounds 2 --time-limit 130 --out $OUT/fwd80-hd128.json 2>&1 | grep -v "^$" | cut -c1-150
t "fwd variants hdim 64 (and two row blocks per CTA from s4096)"
eval timeout -s KILL 130 python3 bench/probe/fwd_variants.py --variants $V PERSIST=2 Q_EARLY=1,TURN_CARRY=1,PERSIST=2 \
  --hdim 64 --seqlen 1024,2048,4096 --causal both --rounds 2 --time-limit 110 --out $OUT/fwd80-hd64.json 2>&1 \
  | grep -v "^$" | cut -c1-150
t "fwd variants hdim 256"
eval timeout -s KILL 80 python3 bench/probe/fwd_variants.py --variants $V --hdim 256 --seqlen 1024,2048 \
  --causal both --rounds 2 --time-limit 60 --out $OUT/fwd80-hd256.json 2>&1 | grep -v "^$" | cut -c1-150
fi
if [ "$what" = time2 ]; then  # step 81: two Q buffers (at hdim 128 O's stage gives way, so O_REG=1 alone too)
t "precompile"
timeout -s KILL 150 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128 --dtypes bf16 --fwd-ws-variants "" O_REG=1 \
  Q_STAGES=2 Q_STAGES=2,TURN_CARRY=1 Q_EARLY=1,TURN_CARRY=1 PERSIST=2 Q_STAGES=2,TURN_CARRY=1,PERSIST=2 \
  TIMING=1,Q_STAGES=2,TURN_CARRY=1 2>&1 | tail -3
t "fwd Q_STAGES hdim 128"
timeout -s KILL 150 python3 bench/probe/fwd_variants.py --variants "" O_REG=1 Q_STAGES=2 Q_STAGES=2,TURN_CARRY=1 \
  Q_EARLY=1,TURN_CARRY=1 --hdim 128 --seqlen 1024,2048,4096 --causal both --rounds 2 --time-limit 130 \
  --out $OUT/fwd81-hd128.json 2>&1 | grep -v "^$" | cut -c1-150
t "fwd Q_STAGES hdim 64"
timeout -s KILL 150 python3 bench/probe/fwd_variants.py --variants "" Q_STAGES=2,TURN_CARRY=1 Q_EARLY=1,TURN_CARRY=1 \
  PERSIST=2 Q_STAGES=2,TURN_CARRY=1,PERSIST=2 --hdim 64 --seqlen 1024,2048,4096 --causal both --rounds 2 --time-limit 130 \
  --out $OUT/fwd81-hd64.json 2>&1 | grep -v "^$" | cut -c1-150
t "timeline hdim 64 s1024 with Q_STAGES=2,TURN_CARRY=1"
timeout -s KILL 60 python3 bench/probe/fwd_timeline.py 64 1024 Q_STAGES=2,TURN_CARRY=1 2>&1 | grep -v Warn
fi
if [ "$what" = check ]; then
t "hand-over tests"
# (-v: a turn fault shows as a hang, not a wrong answer; the tests never reported PASSED are the ones that hung)
timeout -s KILL 400 python3 -m pytest -m gpu -v -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k "handover or persist or two_q" \
  > $OUT/t80.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR| FAILED | ERROR " $OUT/t80.txt | head -10; tail -1 $OUT/t80.txt
python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_gpu_fwd_ws.py -k "handover or persist or two_q" 2>/dev/null | grep :: \
  | while read -r id; do grep -qF "$id" <(grep -E "PASSED|FAILED|SKIPPED|ERROR" $OUT/t80.txt) || echo "never finished: $id"; done | head -20
fi
if [ "$what" = sanitize ]; then  # (PERSIST=8: sanitize_fwd_ws.py's 700-row calls put 4-6 row blocks in one CTA, so both Q buffers are reused)
for v in PERSIST=8,Q_EARLY=1,TURN_CARRY=1 PERSIST=8,Q_STAGES=2,TURN_CARRY=1; do
export CUPY_FMHA_FWD_WS_TILES=$v
for tool in memcheck racecheck synccheck; do
  t "compute-sanitizer $tool ($v)"
  timeout -s KILL 55 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64,128,256 2>&1 | tail -1
done
done
unset CUPY_FMHA_FWD_WS_TILES
fi
done
t done
