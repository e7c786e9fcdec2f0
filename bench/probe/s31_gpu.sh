#!/bin/bash
# Thirty-first session's probe. Without parts, one call whatever card comes (the device tool gives an H100 or an
# H200 and may not be asked for the H200 to match an issue's wording): on an H200 issue 10's item 1 (the whole
# GPU suite in one run, bench/probe/suite_all_gpu.sh); on an H100 the parts `large src1024`. Parts:
#   large     tests/test_gpu_large_tensors.py alone (the card to itself: in the whole suite on an H100 one case
#             found 22 GiB free of the 57 it wants while 15 other workers shared the card)
#   src1024   per-instruction stall samples of the ws forward at hdim 128 s1024 (issue 11's short-sequence gap;
#             ncu84_gpu.sh's `source` at s1024 only)
#   foldtest  step 112: FOLD=1,SMAX_TREE=1 at hdim 128 against the reference (tests/test_gpu_fwd_ws.py -k fold128)
#   foldsan   compute-sanitizer memcheck / racecheck / synccheck under FOLD=1,SMAX_TREE=1,PERSIST=4 at hdim 128
#   foldab    bench/ab.py: the default (A) against FOLD=1,SMAX_TREE=1 and FOLD=1 alone (B), hdim 128, bf16 and fp16
#   lazyab    bench/ab.py: the default against LAZY_RESCALE=8 (step 87's conditional rescale, never timed at 128) and
#             against it with FOLD=1,SMAX_TREE=1, hdim 128 bf16 (tests: test_lazy_rescale_moving_maxima, in the suite)
#   bash bench/probe/s31_gpu.sh [parts]      (DEADLINE=s: the call's limit less a margin, default 560)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$NAME"
if [ $# -eq 0 ]; then
  if [[ "$NAME" == *H200* ]]; then exec bash bench/probe/suite_all_gpu.sh; fi
  set -- large src1024
fi
DEADLINE=${DEADLINE:-560}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mkdir -p /tmp/ab $OUT
for part in "$@"; do
  t "$part (left $(left) s)"
  case $part in
    large) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/test_gpu_large_tensors.py > $OUT/large.txt 2>&1
           echo "rc=$?"; grep -E "^FAILED|^ERROR|^SKIPPED" $OUT/large.txt | head; tail -1 $OUT/large.txt;;
    src1024) bash bench/probe/s44_gpu.sh src1024;;  # (the ncu run and its listing live there)
    foldtest) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k fold128 \
                > $OUT/test-fold128.txt 2>&1
              echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-fold128.txt | head; tail -1 $OUT/test-fold128.txt;;
    foldsan) for tool in memcheck racecheck synccheck; do
               CUPY_FMHA_FWD_WS_TILES=FOLD=1,SMAX_TREE=1,PERSIST=4 timeout -s KILL 150 compute-sanitizer --report-api-errors no \
                 --tool $tool python3 bench/probe/sanitize_fwd_ws.py 128 > /tmp/sfold-$tool.txt 2>&1
               echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sfold-$tool.txt | tail -1)"
             done;;
    foldab) for b in FOLD=1,SMAX_TREE=1 FOLD=1; do
              timeout -s KILL $(left) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$b --rounds 3 \
                --tag ab-fold-${b//[=,]/-} --out $OUT -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 \
                --mode fwd --causal both 2>&1 | grep -v "^\\$" | tail -22
            done;;
    lazyab) for b in LAZY_RESCALE=8 FOLD=1,SMAX_TREE=1,LAZY_RESCALE=8; do
              timeout -s KILL $(left) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$b --rounds 3 \
                --tag ab-lazy-${b//[=,]/-} --out $OUT -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 \
                --mode fwd --causal both 2>&1 | grep -v "^\\$" | tail -12
            done;;
    *) echo "unknown part $part";;
  esac
done
t done
