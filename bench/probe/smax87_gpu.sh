#!/bin/bash
# Step 87 (issue 11; twenty-first session, prepared without a device): the forward's softmax, read from
# ptxas's own schedule (tools/sass_sched.py): per warp and key block the steady-state softmax is 863
# cycles at hdim 128 (971 at 64, FOLD), of which the MUFU unit's pace (8 cycles per MUFU.EX2, written
# into the stall counts, so ncu calls it `wait`) is 528; an edge tile's (mask tests) 1,341 (1,453).
# Four variants, none dispatched:
#   SMAX_TREE=1  row maxima by pairwise trees, the folded form's sign test around the whole step
#                (bit-identical; model: 64 971 -> 892 cycles, 128 unchanged)
#   MASK_ROWS=m  an edge tile's mask test from per-row bounds, both bounds everywhere (1) or the lower
#                one only where it crosses (2) (bit-identical; model at 128 1,341 -> 1,279 (1), on a
#                causal diagonal 1,138 (2); at 64 1,453 -> 1,389 (1), 1,311 (2))
#   EXP_EMU=k    k of every 8 tiles' exponentials by poly_exp2 on the FMA pipes (model at 128: k=1
#                863 -> 757, k=2 774; at 64 k=1 913, k=2 with the trees 849)
#   LAZY_RESCALE=8  a row's maximum moves only by more than 8 (log2), O rescaled only when one moved
#                (model: O's rescale and P's packing at 128 136 -> 107 cycles, 125 -> 64 instructions; the
#                serial dropout build's softmax 643 -> 598 instructions but 931 -> 1,059 cycles)
# and the TIMING build's new per-phase sums of the loop (where the 2,821 cycles per key block go).
#   bench/probe/smax87_gpu.sh test1     (bit-identity of SMAX_TREE with MASK_ROWS=1 and of MASK_ROWS=2, poly_exp2 on the device; ~4 min)
#   bench/probe/smax87_gpu.sh test2     (EXP_EMU=1, LAZY_RESCALE=8 and all four against the reference over the ws
#                                        forward's, bias and dropout files; ~7 min)
#   bench/probe/smax87_gpu.sh phases    (fwd_timeline.py at 128 and 64, s8192 and s1024: the loop's phases, and the gap
#                                        between CTAs now that the TIMING build's copy-out is parallel: step 88)
#   bench/probe/smax87_gpu.sh ab1|ab2|ab3 (bench/ab.py against the default, bf16, hdim 64 and 128: SMAX_TREE and
#                                        MASK_ROWS=2 | EXP_EMU=1 and LAZY_RESCALE=8 | all four with EXP_EMU 1 and 2; ~5 min each)
#   bench/probe/smax87_gpu.sh ab4       (LAZY_RESCALE=8 at hdim 256; ~3 min)
#   bench/probe/smax87_gpu.sh drop      (features.py's dropout and bias forwards under LAZY_RESCALE, EXP_EMU: the
#                                        serial dropout pipeline at 128 takes the lazy rescale too; ~5 min)
#   bench/probe/smax87_gpu.sh sanitize  (compute-sanitizer on the variant builds, small shapes)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
SKIP="not persist and not o_in_q and not switch_selects and not exact_softmax and not poly_exp2"
for what in "$@"; do
if [ "$what" = test1 ]; then
  t "precompile (fp16, the exact variants and the default, with their feature builds)"
  timeout -s KILL 200 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128,192,256 --dtypes fp16 --features \
     --fwd-ws-variants "" SMAX_TREE=1,MASK_ROWS=1 MASK_ROWS=2 2>&1 | tail -1
  t "SMAX_TREE and MASK_ROWS bit-identity, poly_exp2 on the device"
  timeout -s KILL 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_gpu_fwd_ws.py -k "exact_softmax or poly_exp2" > $OUT/t87a.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t87a.txt | head -10; tail -1 $OUT/t87a.txt
fi
if [ "$what" = test2 ]; then
  VS="EXP_EMU=1 LAZY_RESCALE=8 EXP_EMU=2,SMAX_TREE=1,MASK_ROWS=2,LAZY_RESCALE=8"
  t "precompile (both dtypes, the approximate variants with their feature builds)"
  timeout -s KILL 200 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128,192,256 --dtypes fp16,bf16 --features \
     --fwd-ws-variants $VS 2>&1 | tail -1
  for v in $VS; do
    t "$v against the reference (ws forward, bias, dropout files)"
    CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 \
      tests/test_gpu_fwd_ws.py tests/test_gpu_fwd_ws_bias.py tests/test_gpu_dropout.py -k "$SKIP" > $OUT/t87_$v.txt 2>&1
    echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t87_$v.txt | head -10; tail -1 $OUT/t87_$v.txt
  done
fi
if [ "$what" = phases ]; then
  for args in "128 8192" "128 1024" "64 8192" "128 8192 EXP_EMU=1" "64 8192 SMAX_TREE=1" "128 1024 causal" "128 1024 causal MASK_ROWS=2"; do
    t "fwd_timeline.py $args"
    timeout -s KILL 90 python3 bench/probe/fwd_timeline.py $args 2>&1 | grep -E "kernel|per key block|cycles per loop|row block 0 \(|gap between" | head -9
  done
fi
if [ "$what" = ab1 ] || [ "$what" = ab2 ] || [ "$what" = ab3 ]; then
  t "precompile"
  timeout -s KILL 150 python3 bench/probe/precompile.py --only-fwd-ws --hdims 64,128 --dtypes bf16 --fwd-ws-variants "" SMAX_TREE=1 \
     MASK_ROWS=2 EXP_EMU=1 LAZY_RESCALE=8 EXP_EMU=1,SMAX_TREE=1,MASK_ROWS=2,LAZY_RESCALE=8 \
     EXP_EMU=2,SMAX_TREE=1,MASK_ROWS=2,LAZY_RESCALE=8 2>&1 | tail -1
  case $what in ab1) VS="SMAX_TREE=1 MASK_ROWS=2";; ab2) VS="EXP_EMU=1 LAZY_RESCALE=8";;
                ab3) VS="EXP_EMU=1,SMAX_TREE=1,MASK_ROWS=2,LAZY_RESCALE=8 EXP_EMU=2,SMAX_TREE=1,MASK_ROWS=2,LAZY_RESCALE=8";; esac
  for v in $VS; do
    t "ab $v"
    timeout -s KILL 150 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$v --rounds 2 --tag smax87-${v//[=,]/} --out $OUT -- \
       --hdim 64,128 --seqlen 1024,2048,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -14
  done
fi
if [ "$what" = ab4 ]; then  # LAZY_RESCALE at 256, where O's rescale is 128 FMUL per thread (model: operands 196 -> 86 cycles)
  t "ab LAZY_RESCALE=8 at hdim 256"
  timeout -s KILL 240 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=LAZY_RESCALE=8 --rounds 2 --tag smax87-lazy256 --out $OUT -- \
     --hdim 256 --seqlen 1024,2048,8192 --dtype bf16 --causal both --mode fwd 2>&1 | grep -v '^\$' | tail -8
fi
if [ "$what" = drop ]; then  # the dropout and bias forwards (features.py) under the variants, A B C A B C
  for v in "" LAZY_RESCALE=8 EXP_EMU=1,LAZY_RESCALE=8 "" LAZY_RESCALE=8 EXP_EMU=1,LAZY_RESCALE=8; do
    for d in 128 64; do
      t "features.py d$d [$v]"
      CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 60 python3 bench/features.py --hdim $d --rows plain,dropout,bias --no-peers \
        --repeat 15 --name f87-d$d-${v//[=,]/} 2>/dev/null | grep -E "plain|dropout|bias" | cut -c1-130
    done
  done
fi
if [ "$what" = sanitize ]; then
  for v in SMAX_TREE=1,MASK_ROWS=2 EXP_EMU=2,SMAX_TREE=1,MASK_ROWS=2,LAZY_RESCALE=8; do
    for tool in memcheck racecheck synccheck; do
      t "$tool $v"
      CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL 120 compute-sanitizer --tool $tool --report-api-errors no \
        python3 bench/probe/sanitize_fwd_ws.py 64,128 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|error" | head -4
    done
  done
fi
done
t done
