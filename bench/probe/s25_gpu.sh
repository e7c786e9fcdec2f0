#!/bin/bash
# Twenty-fifth session (issue 11, bench/NOTES.md step 99): KEEP_RING, the ws forward's keep decisions made by the
# producer warpgroup's idle warps into a ring in shared memory.
#   bench/probe/s25_gpu.sh test      the dropout GPU tests with KEEP_RING on for the whole run (every ws-forward
#                                    dropout build with whole 32-key spans takes it), then the file's own KEEP_RING
#                                    tests (bit-identity with the default build, group mode, PERSIST=2), ~3 min
#   bench/probe/s25_gpu.sh time      drop_ws.py (forward, hdim 64 and 128, s1024/4096/16384, causal both; plain and
#                                    dropout in one process), the default build and KEEP_RING=1 alternated twice
#   bench/probe/s25_gpu.sh feat      features.py plain,dropout at hdim 64 and 128 with KEEP_RING=1 (issue 11's ratio)
#   bench/probe/s25_gpu.sh spans     drop_ws.py hdim 64 and 128, s4096/16384: the default build and KEEP_RING=1, 2, 3
#                                    (spans per key block from the producer warps), two rounds in turn
#   bench/probe/s25_gpu.sh sanitize  compute-sanitizer memcheck, racecheck, synccheck of sanitize_fwd_ws.py 64,128
#                                    under KEEP_RING=1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for what in "$@"; do
if [ "$what" = test ]; then
  t "dropout tests under KEEP_RING=${RING:-2}"
  CUPY_FMHA_FWD_WS_TILES=KEEP_RING=${RING:-2} timeout -s KILL 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
     tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py tests/test_gpu_fwd_ws.py -k "drop or keep or ring" \
     > $OUT/s25-test-env.txt 2>&1; echo "rc=$?"
  grep -E "^FAILED|^ERROR" $OUT/s25-test-env.txt | head -20; tail -2 $OUT/s25-test-env.txt
  t "the KEEP_RING tests"
  timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_gpu_dropout.py -k ring \
     > $OUT/s25-test-ring.txt 2>&1; echo "rc=$?"
  grep -E "^FAILED|^ERROR|Error" $OUT/s25-test-ring.txt | head -20; tail -2 $OUT/s25-test-ring.txt
fi
if [ "$what" = time ]; then
  for round in 1 2; do
    for v in "" KEEP_RING=1; do
      t "drop_ws.py [$v] round $round"
      CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 120 python3 bench/probe/drop_ws.py "r$round${v:+ring}" 64,128 1024,4096,16384 \
        2>&1 | tail -12 | cut -c1-110
    done
  done
fi
if [ "$what" = spans ]; then
  for round in 1 2; do
    for v in "" KEEP_RING=1 KEEP_RING=2 KEEP_RING=3; do
      t "drop_ws.py [$v] round $round"
      CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 120 python3 bench/probe/drop_ws.py "r$round${v:+-$v}" 64,128 4096,16384 \
        2>&1 | tail -8 | cut -c1-84
    done
  done
fi
if [ "$what" = feat ]; then
  for d in 64 128; do
    t "features.py d$d plain,dropout KEEP_RING=${RING:-2}"
    CUPY_FMHA_FWD_WS_TILES=KEEP_RING=${RING:-2} timeout -s KILL 100 python3 bench/features.py --hdim $d --rows plain,dropout --no-peers \
       --repeat 15 --name s25-ring-d$d 2>/dev/null | grep -E "plain|dropout" | cut -c1-130
    cp bench/results/*s25-ring-d$d.json $OUT/ 2>/dev/null
  done
fi
if [ "$what" = sanitize ]; then
  for tool in memcheck racecheck synccheck; do
    t "compute-sanitizer $tool, sanitize_fwd_ws.py 64,128, KEEP_RING=${RING:-2}"
    CUPY_FMHA_FWD_WS_TILES=KEEP_RING=${RING:-2} timeout -s KILL 200 compute-sanitizer --tool $tool python3 bench/probe/sanitize_fwd_ws.py 64,128 \
      2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Error" | head -5
  done
fi
done
t done
