#!/bin/bash
# Step 60: dK/dV through shared memory and bulk row copies (STAGE_DKDV=1) against the 4-byte register
# stores: the CTA timeline (TIMING build: stores issued, bulk reads), A/B with cuDNN in one process,
# the ws backward's tests and memcheck/racecheck under the variant.
#   bench/probe/stage60_gpu.sh [perf|check]
# This records the A/B run while the switch existed (CUPY_FMHA_BWD_WS_TILES=STAGE_DKDV=1); the staged
# epilogue is now the default and the switch is gone, so the entry is now refused as unknown.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
if [ "$1" != check ]; then
for a in "128 1024" "128 2048" "64 2048" "128 1024 causal"; do
  for v in "" "STAGE_DKDV=1"; do
    echo "== $a $v"; timeout -s KILL 60 python3 bench/probe/timeline58.py $a $v 2>&1 | grep -E "^phase|^globaltimer phase|^gap|Error|error" | head -5
  done
done
t "A/B"
timeout -s KILL 240 python3 bench/probe/fwd_variants.py --mode bwd --variants "" "STAGE_DKDV=1" --hdim 64,128 \
  --seqlen 1024,2048,8192 --causal both --rounds 2 --out $OUT/ab60.json 2>&1 | grep -v Warn | tail -16
fi
if [ "$1" != perf ]; then
t "tests"
CUPY_FMHA_BWD_WS_TILES=STAGE_DKDV=1 timeout -s KILL 170 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
  tests/test_gpu_bwd_ws.py tests/test_gpu_varlen.py tests/test_gpu_deterministic.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  echo "-- $tool"
  CUPY_FMHA_BWD_WS_TILES=STAGE_DKDV=1 timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 plain 2>&1 | tail -2
done
fi
t done
