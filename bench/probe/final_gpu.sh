#!/bin/bash
# Last GPU run of the sixth session (what the review of the wide ws backward asked for): the Inf-in-a-
# neighbour test at the head dims whose tail zeroing had not run (fwd 96/192/256, bwd 96/136/256),
# the unequal pairs 256/128 and 128/256 on the ws forward and the wide backward, and 128/256 on the
# mma.sync kernels (CUPY_FMHA_DISABLE_WGMMA=1: the 16-key forward blocks of that pair).
#   OUT=/tmp/out bash bench/probe/final_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "ws tests"
timeout -s KILL 100 python3 -m pytest -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py tests/test_gpu_bwd_ws.py \
  -k "inf_neighbour or d256x128 or d128x256 or d192x128" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -aE "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -aE "^E  " $OUT/tests.txt | head -8
t "mma.sync 128x256"
CUPY_FMHA_DISABLE_WGMMA=1 timeout -s KILL 60 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_gpu_fwd_ws.py \
  -k "d128x256 or d192x128" > $OUT/tests2.txt 2>&1
echo "rc=$?"; grep -aE "^FAILED|^ERROR" $OUT/tests2.txt | head; tail -1 $OUT/tests2.txt
t done
