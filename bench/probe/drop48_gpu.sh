#!/bin/bash
# Step 48: dropout on the ws forward: its tests, then the dropout forward's time for the candidate
# tables against fmha_fwd_sm90 / the mma.sync kernel.   OUT=/tmp/out bash bench/probe/drop48_gpu.sh
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t tests
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_dropout.py \
  tests/test_gpu_dropout_features.py tests/test_gpu_fwd_ws.py tests/test_gpu_jax.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt; grep -E "^E  " $OUT/tests.txt | head -12
P="python3 bench/probe/drop_ws.py"
t timing
CUPY_FMHA_FWD_WS=0 timeout 60 $P old 64,128 1024,4096
timeout 60 $P ws 64,128 1024,4096
CUPY_FMHA_FWD_WS_TILES=BLOCK_N=64 timeout 40 $P ws-bn64 128 1024,4096
CUPY_FMHA_FWD_WS_TILES=BLOCK_N=128,PV_OVERLAP=0,PINGPONG=0 timeout 40 $P ws-128ser 128 1024,4096
CUPY_FMHA_FWD_WS_TILES=BLOCK_N=128 timeout 40 $P ws-128pp 128 1024,4096
CUPY_FMHA_FWD_WS=0 timeout 60 $P old 192,256 4096
timeout 60 $P ws 192,256 1024,4096
CUPY_FMHA_FWD_WS_TILES=BLOCK_N=64,PV_OVERLAP=1,PINGPONG=1 timeout 40 $P ws-bn64pp 192 4096
CUPY_FMHA_FWD_WS_TILES=BLOCK_N=80 timeout 40 $P ws-bn80 192 4096
t done
