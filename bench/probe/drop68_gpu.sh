#!/bin/bash
# Step 68 (issue 11, branch issue11-dropout8; prepared in the fourteenth session, NOT yet run on a GPU):
# 8-bit dropout draws, one Philox call per 16 keys (a new keep mask: kernels, NumPy replica and
# tests changed together; see bench/NOTES.md step 68).
#   1. every GPU file with dropout (the keep masks bit-exact against the replica, forward and
#      backward against the reference, the ws kernels, JAX);
#   2. memcheck / racecheck / synccheck of the dropout paths (the ws forward and backward scripts
#      run dropout calls in their default mode);
#   3. the feature cost of dropout at hdim 64 and 128 on this tree and on main's (.abbase =
#      `git archive main kernels cupy_fmha bench`, less bench/data and bench/results), alternated.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "dropout GPU tests"
timeout -s KILL 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py \
  tests/test_gpu_edge_cases.py tests/test_gpu_jax.py tests/test_gpu_fwd_ws.py tests/test_gpu_bwd_ws.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt
t "sanitizers"
for tool in memcheck racecheck synccheck; do
  echo "-- fwd $tool"; timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_ws.py 64,128 2>&1 | tail -1
  echo "-- bwd $tool"; timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 2>&1 | tail -1
done
for r in 1 2; do
  for side in .abbase .; do
    for hd in 128 64; do
      t "features hdim $hd, tree $side (round $r)"
      (cd $side && PYTHONPATH=. timeout -s KILL 60 python3 bench/features.py --hdim $hd --repeat 15 --rows dropout --no-peers \
        --name drop68-$hd-r$r 2>&1 | grep "│" | grep -E "plain|dropout")
    done
  done
done
t done
