#!/bin/bash
# Step 50: the ws backward's dropout build as the default (its tests as the dropout suites run them,
# and the older kernel under CUPY_FMHA_BWD_WS=0), the feature costs, and the hdim-128 bias backward
# on the ws kernel (bias128.py).   OUT=/tmp/out bash bench/probe/step50_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t tests
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py \
  tests/test_gpu_bwd_ws.py -k "dropout or switch or older" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -E "^E  " $OUT/tests.txt | head -10
t bias128
timeout 150 python3 bench/probe/bias128.py 128
t features
for d in 64 128; do
  timeout 90 python3 bench/features.py --hdim $d --rows plain,dropout 2>&1 | tail -7
done
t done
