#!/bin/bash
# Thirtieth session: the device work as parts under one deadline (DEADLINE s from the start, default 560),
# each part's results copied to $OUT as it ends. Parts:
#   l2       bench/probe/l2_gpu.sh: DRAM bytes and L2 hit rate at s1024 (PERSIST 0/4/16, LINEAR=132, cuDNN)
#   lintest  step 110's bit-identity tests (tests/test_gpu_fwd_ws.py -k linear)
#   linsan   compute-sanitizer memcheck / racecheck / synccheck under LINEAR=7, hdim 128 and 64
#   linab    bench/ab.py: the default (A) against LINEAR=132 (B), forward hdim 128, bf16, causal both, s1024-16384
#   linab64  the same at hdim 64 with LINEAR=132 and 264 (its 91 KB CTA: two per SM)
#   linab256 the same at hdim 256 with LINEAR=132
#   sweep128 / fwd128 / ... / fa3 / features / suite: bench/probe/s29_gpu.sh's parts (run through it)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
DEADLINE=${DEADLINE:-560}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/ab $OUT
ab() { local tag=$1 d=$2 env=$3 seq=$4; shift 4
  timeout -s KILL $(left) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$env --rounds 3 --tag $tag --out /tmp/ab \
    -- --hdim $d --seqlen $seq --dtype bf16 --mode fwd --causal both "$@" 2>&1 | grep -v "^\\$" | tail -12; }
for part in "$@"; do
  if [ "$(left)" -lt 20 ]; then t "$part: skipped, deadline"; continue; fi
  t "$part (left $(left) s)"
  case $part in
    l2) timeout -s KILL $(left) bash bench/probe/l2_gpu.sh > $OUT/l2.txt 2>&1; echo "rc=$?"; cat $OUT/l2.txt | grep -v PIPFAIL;;
    lintest) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k linear \
               > $OUT/test-linear.txt 2>&1
             echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-linear.txt | head; tail -1 $OUT/test-linear.txt;;
    linsan) for tool in memcheck racecheck synccheck; do
              for d in 128 64; do
                CUPY_FMHA_FWD_WS_TILES=LINEAR=7 timeout -s KILL 120 compute-sanitizer --report-api-errors no --tool $tool \
                  python3 bench/probe/sanitize_fwd_ws.py $d > /tmp/sl-$tool-$d.txt 2>&1
                echo "$tool ($d) rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sl-$tool-$d.txt | tail -1)"
              done
            done;;
    linab) ab ab-linear 128 LINEAR=132 1024,2048,4096,8192,16384;;
    linab64) ab ab-linear64 64 LINEAR=132 1024,2048,4096,8192; ab ab-linear64-264 64 LINEAR=264 1024,2048,4096,8192;;
    linab256) ab ab-linear256 256 LINEAR=132 1024,2048,4096,8192;;
    *) DEADLINE=$(left) bash bench/probe/s29_gpu.sh $part 2>&1 | grep -v "NVIDIA\|=== \[.*done";;
  esac
  cp /tmp/ab/*summary.json $OUT/ 2>/dev/null
done
t done
