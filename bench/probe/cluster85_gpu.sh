#!/bin/bash
# Step 85 (issue 11; twentieth session): the ws forward in clusters of two CTAs sharing their K and V
# loads (CLUSTER=2, TMA multicast). Why: at hdim 128 every CTA reads 64 KB of K and V from L2 per
# 128 x 128 key block (8.4 MFLOP): 128 FLOP per byte, so 660 TFLOP/s needs 5.2 TB/s of L2 reads,
# near what L2 delivers; a pair halves that. FlashAttention-3 takes clusters of two at hdim 128
# and 256 without masks (its launch template).
#   bench/probe/cluster85_gpu.sh test      (bit-identity to the default build, the plan's choice; ~3 min)
#   bench/probe/cluster85_gpu.sh ab        (bench/ab.py, CLUSTER=2 against the default, no mask; ~3 min)
#   bench/probe/cluster85_gpu.sh ncu       (L2 throughput and stalls, default vs CLUSTER=2, hdim 128 s8192)
#   bench/probe/cluster85_gpu.sh sanitize  (compute-sanitizer on small clustered forwards)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for what in "$@"; do
if [ "$what" = test ]; then
  t "cluster tests"
  timeout -s KILL 240 python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 8 tests/test_gpu_fwd_ws_cluster.py > $OUT/t85.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR|Error" $OUT/t85.txt | head -10; tail -2 $OUT/t85.txt
fi
if [ "$what" = ab ]; then
  t "precompile"
  timeout -s KILL 90 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128,256 --dtypes bf16 --fwd-ws-variants "" 2>&1 | tail -1
  t "ab CLUSTER=2, hdim 128"
  timeout -s KILL 250 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=CLUSTER=2 --rounds 2 --tag cluster85-128 --out $OUT -- \
     --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -12
  t "ab CLUSTER=2, hdim 64 and 256"
  timeout -s KILL 160 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=CLUSTER=2 --rounds 2 --tag cluster85-64-256 --out $OUT -- \
     --hdim 64,256 --seqlen 2048,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -10
fi
if [ "$what" = ncu ]; then
  M="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,gpc__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum"
  for v in "" CLUSTER=2; do
    t "ncu ours hdim 128 s8192 '$v'"
    CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 100 ncu --profile-from-start off --section WarpStateStats $M --csv --page raw -k regex:fmha_fwd \
      python3 bench/probe/once.py fwd 128 8192 > $OUT/ncu85_${v:-default}.csv 2> /tmp/ncu.err; echo "rc=$?"
    python3 bench/probe/ncu_digest.py $OUT/ncu85_${v:-default}.csv || tail -3 /tmp/ncu.err
  done
fi
if [ "$what" = sanitize ]; then
  export CUPY_FMHA_FWD_WS_TILES=CLUSTER=2
  for tool in memcheck racecheck synccheck; do
    t "compute-sanitizer $tool (CLUSTER=2)"
    timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_fwd_cluster.py 2>&1 | tail -2
  done
  unset CUPY_FMHA_FWD_WS_TILES
fi
done
t done
