#!/bin/bash
# Steps 75-76 (issue 10), part 2 of 2, correctness of the dQ writer variants (part 1, timing:
# next75_gpu.sh): (1) the writer tests (tests/test_gpu_bwd_ws.py -k writer: batch, group and
# deterministic cases, twenty runs, deterministic bits equal to the default builds'); (2) the
# deterministic and group-mode files and the ws file with both switches on; (3) compute-sanitizer
# memcheck and synccheck on sanitize_bwd_ws.py's plain calls (hdim 64, 128, 256; deterministic
# included), racecheck at 128 and 256, with both switches on. About 8 minutes.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "writer tests"
timeout -s KILL 90 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py -k writer \
  > $OUT/twriter.txt 2>&1; echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/twriter.txt | head -5; tail -1 $OUT/twriter.txt
export CUPY_FMHA_BWD_WS_TILES=DQ_WRITER=1 CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1
t "deterministic, varlen, ws files with both writers"
timeout -s KILL 170 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_deterministic.py \
  tests/test_gpu_varlen.py tests/test_gpu_bwd_ws.py -k "not writer" > $OUT/tfiles.txt 2>&1; echo "rc=$?"
grep -E "^FAILED|^ERROR" $OUT/tfiles.txt | head -5; tail -1 $OUT/tfiles.txt
for run in "memcheck 70 64,128,256" "synccheck 70 64,128,256" "racecheck 100 128,256"; do
  set -- $run
  t "compute-sanitizer $1 (hdim $3)"
  timeout -s KILL $2 compute-sanitizer --tool $1 --report-api-errors no --kernel-name kns=dq_dk_dv_sm90_ws \
    --print-limit 5 python3 bench/probe/sanitize_bwd_ws.py $3 plain 2>&1 | tail -3
done
t done
