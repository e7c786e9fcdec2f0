#!/bin/bash
# Step 89 (issue 11; twenty-second session, prepared without a device): ROWSUM_MMA at hdim 64, the softmax's
# row sums taken by the P V GEMM (N = 72: a ninth column group over a shared-memory slab of ones) instead of
# 64 FADDs per thread and key block. Why: at hdim 64 three MMA warps share each sub-partition, and by
# tools/sass_sched.py their work per key block needs 1,584 cycles of the MUFU unit (3 x 66 x 8) against
# 1,536 of tensor work and 1,353 issue slots; EXP_EMU=1 takes MUFU to 1,392 but issue to 1,548; ROWSUM_MMA
# with EXP_EMU=1 brings both below the tensor work (MUFU 1,392, issue 1,347). The simulated periods depend
# on the issue policy (GTO 2,446 -> 2,296, LRR 2,024 -> 1,847-2,696), so only the A/B can say.
#   bench/probe/rowsum89_gpu.sh test      (the rowsum tests; the ws forward and bias files under ROWSUM_MMA=1; ~5 min)
#   bench/probe/rowsum89_gpu.sh ab        (bench/ab.py at hdim 64 against the default: ROWSUM_MMA=1, EXP_EMU=1, both; ~6 min)
#   bench/probe/rowsum89_gpu.sh sanitize  (compute-sanitizer on sanitize_fwd_ws.py 64 under ROWSUM_MMA=1,EXP_EMU=1)
#   bench/probe/rowsum89_gpu.sh bias      (step 90: the hdim-64 16-bit bias build on three MMA warpgroups, NWG=3 with BIAS_ACC:
#                                          its tests, then features.py's bias row against two, alternated; ~5 min. The
#                                          model: 55-62 cycles per query row against 75; issue 11's bias target is 1.3x plain)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
VS="ROWSUM_MMA=1 EXP_EMU=1 ROWSUM_MMA=1,EXP_EMU=1"
for what in "$@"; do
if [ "$what" = test ]; then
  t "precompile (hdim 64, both dtypes, the variants with their feature builds)"
  timeout -s KILL 150 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64 --dtypes fp16,bf16 --features \
     --fwd-ws-variants "" $VS 2>&1 | tail -1
  t "the rowsum tests (reference, group mode, bias)"
  timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_gpu_fwd_ws.py -k rowsum > $OUT/t89a.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t89a.txt | head -10; tail -1 $OUT/t89a.txt
  t "the ws forward and bias files under ROWSUM_MMA=1,EXP_EMU=1 (hdim 64 cases take it)"
  CUPY_FMHA_FWD_WS_TILES=ROWSUM_MMA=1,EXP_EMU=1 timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 \
    tests/test_gpu_fwd_ws.py tests/test_gpu_fwd_ws_bias.py -k "not persist and not o_in_q and not switch_selects and not exact_softmax and not poly_exp2 and not rowsum" > $OUT/t89b.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t89b.txt | head -10; tail -1 $OUT/t89b.txt
fi
if [ "$what" = ab ]; then
  t "precompile"
  timeout -s KILL 120 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64 --dtypes bf16 --fwd-ws-variants "" $VS 2>&1 | tail -1
  for v in $VS; do
    t "ab $v"
    timeout -s KILL 110 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$v --rounds 2 --tag rowsum89-${v//[=,]/} --out $OUT -- \
       --hdim 64 --seqlen 1024,2048,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -8
  done
fi
if [ "$what" = sanitize ]; then
  for tool in memcheck racecheck synccheck; do
    t "$tool ROWSUM_MMA=1,EXP_EMU=1"
    CUPY_FMHA_FWD_WS_TILES=ROWSUM_MMA=1,EXP_EMU=1 timeout -s KILL 120 compute-sanitizer --tool $tool --report-api-errors no \
      python3 bench/probe/sanitize_fwd_ws.py 64 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|error" | head -4
  done
fi
if [ "$what" = bias ]; then
  t "the bias tests under NWG=3 (and the routing test)"
  timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_gpu_fwd_ws_bias.py -k "three or routing" > $OUT/t90.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t90.txt | head -10; tail -1 $OUT/t90.txt
  for round in 1 2; do
    for v in "" NWG=3; do
      t "features.py d64 plain,bias [$v] round $round"
      CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 60 python3 bench/features.py --hdim 64 --rows plain,bias --no-peers --repeat 15 \
        --name f90-d64-${v//[=,]/}-r$round 2>/dev/null | grep -E "plain|bias" | cut -c1-130
    done
  done
  cp bench/results/*f90-d64-*.json $OUT/ 2>/dev/null  # (features.py writes to bench/results)
fi
done
t done
