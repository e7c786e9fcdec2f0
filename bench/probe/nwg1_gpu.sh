#!/bin/bash
# Step 101: the ws forward on one MMA warpgroup per CTA and two CTAs per SM (NWG=1; not dispatched).
# Parts, in the order given:
#   test      the NWG=1 tests of test_gpu_fwd_ws.py (-k one_warpgroup), then compute-sanitizer memcheck /
#             racecheck / synccheck on small calls of the build at hdim 64 and 128
#   ab128     bench/ab.py, the default (two ping-pong warpgroups, 128-key blocks) against NWG=1 with
#             64-key blocks, hdim 128 forward, bf16, causal both
#   ab64      the same at hdim 64 (default: three warpgroups) against NWG=1 with 128-key blocks
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
ONE="NWG=1,BLOCK_N=64,PINGPONG=0"
SWEEP="--seqlen 1024,2048,4096,8192,16384 --dtype bf16 --mode fwd --causal both"
mkdir -p /tmp/ab
for part in "$@"; do
  t "$part"
  case $part in
    test)
      timeout -s KILL 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k one_warpgroup > $OUT/test-nwg1.txt 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-nwg1.txt | head; tail -1 $OUT/test-nwg1.txt
      for tool in memcheck racecheck synccheck; do
        CUPY_FMHA_FWD_WS_TILES=$ONE,PERSIST=2 timeout -s KILL 120 compute-sanitizer --report-api-errors no --tool $tool \
          python3 bench/probe/sanitize_fwd_ws.py 64,128 > /tmp/san-$tool.txt 2>&1
        echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san-$tool.txt | tail -2 | tr '\n' ' ')"
      done;;
    ab128) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$ONE --rounds 2 --tag ab-nwg1-hd128 --out /tmp/ab \
        -- --hdim 128 $SWEEP 2>&1 | grep -v "^\\$" | tail -12;;
    ab64)
      python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=NWG=1,PINGPONG=0 --rounds 2 --tag ab-nwg1-hd64 --out /tmp/ab \
        -- --hdim 64 $SWEEP 2>&1 | grep -v "^\\$" | tail -12;;
  esac
done
mkdir -p $OUT; cp /tmp/ab/*summary.json $OUT/ 2>/dev/null
t done
