#!/bin/bash
# Steps 56-57: sanitizers of the wide backward (every reader arriving on `empty` itself) and of the
# SPLIT_PDS builds (P formed while GEMM2 runs); their tests; A/B of SPLIT_PDS at hdim 128 (ws) and
# 256 (wide); an ncu digest of the wide backward.   OUT=/tmp/out bash bench/probe/split57_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
san() { local tag=$1; shift
  for tool in racecheck memcheck synccheck; do
    t "$tag $tool"
    timeout -s KILL 60 env "$@" compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py \
      ${HD:-256} plain > $OUT/$tag-$tool.txt 2>&1
    echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tag-$tool.txt | tr '\n' ' ')"
    grep -m2 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tag-$tool.txt
  done; }
HD=256 san wide X=1
HD=128 san split128 CUPY_FMHA_BWD_WS_TILES=SPLIT_PDS=1
HD=256 san split256 CUPY_FMHA_BWD_WS_WIDE_TILES=SPLIT_PDS=1
t "tests (default)"
timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py tests/test_gpu_deterministic.py \
  -k "256 or 224 or 192 or 160 or twenty" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head; tail -1 $OUT/tests.txt
t "tests (SPLIT_PDS=1 both kernels)"
CUPY_FMHA_BWD_WS_TILES=SPLIT_PDS=1 CUPY_FMHA_BWD_WS_WIDE_TILES=SPLIT_PDS=1 timeout -s KILL 150 python3 -m pytest -m gpu -q \
  -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py tests/test_gpu_deterministic.py > $OUT/tests_split.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests_split.txt | head; tail -1 $OUT/tests_split.txt
t "ab hdim 128: default (A) vs SPLIT_PDS=1 (B)"
timeout -s KILL 150 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_TILES=SPLIT_PDS=1 --rounds 2 --tag ab-split128 \
  --out $OUT -- --hdim 128 --seqlen 1024,2048,8192 --dtype bf16 --causal both --mode bwd > $OUT/ab128.txt 2>&1
echo "rc=$?"; grep -A10 "^dtype" $OUT/ab128.txt
t "ab hdim 256: default (A) vs SPLIT_PDS=1 (B)"
timeout -s KILL 100 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_WIDE_TILES=SPLIT_PDS=1 --rounds 1 --tag ab-split256 \
  --out $OUT -- --hdim 256 --seqlen 1024,4096,8192 --dtype bf16 --causal both --mode bwd > $OUT/ab256.txt 2>&1
echo "rc=$?"; grep -A10 "^dtype" $OUT/ab256.txt
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats"
t "ncu wide 256"
timeout -s KILL 90 ncu --profile-from-start off $SEC --csv --page raw -k regex:"dq_dk_dv" python3 bench/probe/once.py bwd 256 4096 \
  > $OUT/ncu_wide.csv 2> $OUT/ncu_wide.err
echo "rc=$?"; python3 bench/probe/ncu_digest.py $OUT/ncu_wide.csv || tail -5 $OUT/ncu_wide.err
rm -f $OUT/*.png; (cd $OUT && tar czf all.tgz --exclude all.tgz . && find . -type f ! -name all.tgz -delete)
t done
