#!/bin/bash
# Twenty-ninth session: one device call runs the parts given, in order, each under what is left of a
# deadline (DEADLINE seconds from the start, default 560: a call may run 600 s), and copies its results
# to $OUT as soon as it ends, so a call cut short still brings back what finished. Parts:
#   sweep128 / sweep64 / sweep256 / fwd128 / fwd64 / fwd256 / fa3 / features: bench/probe/s27_gpu.sh's parts
#   st3test  step 107: three K/V stages at hdim 128, O staged in Q's buffer (STAGES=3,O_IN_Q=1): the bit-identity tests
#   st3san   compute-sanitizer memcheck / racecheck / synccheck on it, PERSIST=4
#   st3ab    bench/ab.py: the default (A) against STAGES=3,O_IN_Q=1 (B), forward hdim 128, bf16, causal both
#   kbtest   step 111: 176- and 192-key blocks at hdim 128 (O in Q's buffer) against the reference (-k key_block)
#   kbsan    compute-sanitizer memcheck / racecheck / synccheck under BLOCK_N=176,O_IN_Q=1,PERSIST=4 (hdim 128)
#   kbab     bench/ab.py: the default (A) against BLOCK_N=176,O_IN_Q=1, BLOCK_N=192,O_IN_Q=1 and O_REG=1,O_IN_Q=1 (O in Q's buffer alone), hdim 128 bf16
#   suite    the whole GPU suite in one pytest run (bench/probe/suite_all_gpu.sh; needs a call of its own)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
DEADLINE=${DEADLINE:-560}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/s /tmp/ab $OUT
GRID="--seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both --peers flash,cudnn --out-dir /tmp/s"
sweep() { timeout -s KILL $(left) python3 bench/sweep.py "$@" 2>&1 | grep -v "^\[" | tail -24; }
for part in "$@"; do
  if [ "$(left)" -lt 20 ]; then t "$part: skipped, deadline"; continue; fi
  t "$part (left $(left) s)"
  case $part in
    st3test) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k "o_in_q and 128" \
               > $OUT/test-stages3.txt 2>&1
             echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-stages3.txt | head; tail -1 $OUT/test-stages3.txt;;
    st3san) for tool in memcheck racecheck synccheck; do
              CUPY_FMHA_FWD_WS_TILES=STAGES=3,O_IN_Q=1,PERSIST=4 timeout -s KILL 150 compute-sanitizer --report-api-errors no \
                --tool $tool python3 bench/probe/sanitize_fwd_ws.py 128 > /tmp/s3-$tool.txt 2>&1
              echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s3-$tool.txt | tail -1)"
            done;;
    st3ab) timeout -s KILL $(left) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=STAGES=3,O_IN_Q=1 --rounds 3 \
             --tag ab-stages3 --out /tmp/ab -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --mode fwd \
             --causal both 2>&1 | grep -v "^\\$" | tail -12;;
    sweep128) sweep --hdim 128 $GRID --mode bwd --name sweep-bwd-hd128;;
    sweep64) sweep --hdim 64 $GRID --mode bwd --name sweep-bwd-hd64;;
    sweep256) sweep --hdim 256 $GRID --mode bwd --name sweep-bwd-hd256;;
    fwd128) sweep --hdim 128 $GRID --mode fwd --name sweep-fwd-hd128;;
    fwd64) sweep --hdim 64 $GRID --mode fwd --name sweep-fwd-hd64;;
    fwd256) sweep --hdim 256 $GRID --mode fwd --name sweep-fwd-hd256;;
    fa3) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
           && PYTHONPATH=/tmp/site timeout -s KILL $(left) python3 bench/sweep.py --hdim 128 ${GRID/flash,cudnn/flash,cudnn,fa3} \
              --mode both --name sweep-hd128-fa3 2>&1 | grep -v "^\[" | tail -44;;
    features) for h in 128 64; do timeout -s KILL $(left) python3 bench/features.py --hdim $h --name features-d$h 2>&1 | tail -14
                cp bench/results/features-d$h.json /tmp/s/; done;;
    kbtest) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k key_block \
              > $OUT/test-key-block.txt 2>&1
            echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-key-block.txt | head; tail -1 $OUT/test-key-block.txt;;
    kbsan) for tool in memcheck racecheck synccheck; do
             CUPY_FMHA_FWD_WS_TILES=BLOCK_N=176,O_IN_Q=1,PERSIST=4 timeout -s KILL 150 compute-sanitizer --report-api-errors no \
               --tool $tool python3 bench/probe/sanitize_fwd_ws.py 128 > /tmp/skb-$tool.txt 2>&1
             echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/skb-$tool.txt | tail -1)"
           done;;
    kbab) for b in BLOCK_N=176,O_IN_Q=1 BLOCK_N=192,O_IN_Q=1 O_REG=1,O_IN_Q=1; do
            timeout -s KILL $(left) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$b --rounds 3 \
              --tag ab-kb-${b//[=,]/-} --out /tmp/ab -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --mode fwd \
              --causal both 2>&1 | grep -v "^\\$" | tail -12
          done;;
    suite) DIST="--dist worksteal"
           timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 $DIST --durations=15 tests > $OUT/suite-all.txt 2>&1
           echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite-all.txt | head -20; tail -1 $OUT/suite-all.txt;;
    *) echo "unknown part $part";;
  esac
  cp /tmp/s/*.json /tmp/ab/*summary.json $OUT/ 2>/dev/null
done
t done
