#!/bin/bash
# GPU run for the ws backward's bias build (bench/NOTES.md step 44), with what was left of the session's
# device time: the bias tests (the ws backward's plain tests too: its parameters changed), the three
# sanitizers at hdim 64 (forward and backward bias calls), the feature cost at hdim 64.
#   OUT=/tmp/out bash bench/probe/bias_gpu2.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests"
timeout -s KILL 150 python3 -m pytest -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws_bias.py tests/test_gpu_bias.py \
  tests/test_gpu_bwd_ws.py "tests/test_gpu_varlen.py::test_varlen_bias_matches_reference" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
t "features hdim 64"
timeout -s KILL 40 python3 bench/features.py --hdim 64 --rows "plain,bias" --no-peers --name bias2-d64 2>&1 | grep -E "^│" | cut -c1-110
cp bench/results/bias2-d64.json $OUT/ 2>/dev/null
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 45 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64 \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
done
t done
