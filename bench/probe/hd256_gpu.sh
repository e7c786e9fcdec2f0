#!/bin/bash
# GPU run for the ws forward at head dims 192/256 and rounded-up head dims (bench/NOTES.md step 45):
# the forward tests (the ws file and the main suites that carry those head dims), the three sanitizers
# on small forwards at hdim 96/192/256, then the hdim-256 forward sweep against the peers and an A/B of
# the ws forward against the kernels it replaces (CUPY_FMHA_FWD_WS=0) at head dims that round up.
#   OUT=/tmp/out bash bench/probe/hd256_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests"
timeout -s KILL 170 python3 -m pytest -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py tests/test_gpu_attention.py \
  tests/test_gpu_varlen.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 50 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 96,192,256 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
done
t "sweep hdim 256 fwd"
timeout -s KILL 120 python3 bench/sweep.py --hdim 256 --seqlen 512,1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode fwd --peers flash,cudnn --name hd256-fwd > $OUT/sweep.txt 2>&1
echo "rc=$?"; grep -E "d256" $OUT/sweep.txt | tail -30; cp bench/results/hd256-fwd* $OUT/ 2>/dev/null
t "ab rounded head dims"
timeout -s KILL 150 python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_FWD_WS=0 --rounds 1 --out $OUT -- --hdim 32,96,160,192,224,256 \
  --seqlen 1024,4096 --dtype bf16 --causal both --mode fwd > $OUT/ab.txt 2>&1
echo "rc=$?"; tail -30 $OUT/ab.txt
t done
