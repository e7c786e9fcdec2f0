#!/bin/bash
# Steps 75-76 (issue 10), part 2 of 2, correctness of the dQ writer variants (part 1, timing:
# next75_gpu.sh): (1) the writer tests (tests/test_gpu_bwd_ws.py -k writer: batch, group and
# deterministic cases, twenty runs, deterministic bits equal to the default builds'); (2) the
# deterministic and group-mode files and the ws file with both switches on; (3) compute-sanitizer
# racecheck, synccheck, memcheck on sanitize_bwd_ws.py's plain calls (hdim 64, 128, 256;
# deterministic included) with both switches on.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "writer tests"
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py -k writer \
  > $OUT/twriter.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/twriter.txt | head -5; tail -1 $OUT/twriter.txt
export CUPY_FMHA_BWD_WS_TILES=DQ_WRITER=1 CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1
t "deterministic, varlen, ws files with both writers"
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_deterministic.py \
  tests/test_gpu_varlen.py tests/test_gpu_bwd_ws.py > $OUT/tfiles.txt 2>&1; echo "rc=$?"
grep -E "^FAILED|^ERROR" $OUT/tfiles.txt | head -5; tail -1 $OUT/tfiles.txt
for tool in memcheck synccheck racecheck; do
  t "compute-sanitizer $tool"
  timeout -s KILL 90 compute-sanitizer --tool $tool --report-api-errors no --kernel-name kns=dq_dk_dv_sm90_ws \
    --print-limit 5 python3 bench/probe/sanitize_bwd_ws.py 64,128,256 plain 2>&1 | tail -3
done
t done
