#!/bin/bash
# Step 100: 80 query rows per step in the ws backward at hdim 128 (BLOCK_M=80: GEMM4 as dQ^T; SPLIT_PDS=2,
# P under GEMM2 only, where SPLIT_PDS=1 spills 108 bytes and serializes the wgmmas). Parts, in order given:
#   test      the BLOCK_M=80 tests (test_gpu_bwd_ws.py -k bm80), then the whole file under BLOCK_M=80,SPLIT_PDS=0
#   ab        bench/ab.py: the default (64 rows, SPLIT_PDS=1) against 80 rows, hdim 128 bwd, bf16, causal both
#   ab2       80 rows: SPLIT_PDS=0 against 2, and 64 rows SPLIT_PDS=2 against the default, non-causal
#   ab4       80 rows without and with the dQ writer (DQ_WRITER=1: 4 bytes of spill instead of 20), causal both
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck on small hdim-128 calls of the 80-row build
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
BM80="BLOCK_M=80,SPLIT_PDS=2"
SWEEP="--hdim 128 --seqlen 2048,4096,8192,16384 --dtype bf16 --mode bwd"
for part in "$@"; do
  case $part in
    test)
      t "bm80 tests"
      timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py -k bm80 > $OUT/test-bm80.txt 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-bm80.txt | head; tail -1 $OUT/test-bm80.txt
      t "test_gpu_bwd_ws.py under BLOCK_M=80,SPLIT_PDS=0"
      CUPY_FMHA_BWD_WS_TILES=BLOCK_M=80,SPLIT_PDS=0 timeout -s KILL 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py > $OUT/test-bwdws-bm80.txt 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-bwdws-bm80.txt | head; tail -1 $OUT/test-bwdws-bm80.txt;;
    ab)
      t "ab: default vs $BM80"
      python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_TILES=$BM80 --rounds 2 --tag ab-bm80 --out $OUT -- $SWEEP --causal both 2>&1 | grep -v "^\\$" | tail -30;;
    ab2)
      t "ab2: BLOCK_M=80,SPLIT_PDS=0 vs $BM80"
      python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS_TILES=BLOCK_M=80,SPLIT_PDS=0 --env-b CUPY_FMHA_BWD_WS_TILES=$BM80 --rounds 2 --tag ab2-bm80 --out $OUT -- $SWEEP --causal no 2>&1 | grep -v "^\\$" | tail -12
      t "ab3: default vs SPLIT_PDS=2 (64 rows)"
      python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_TILES=SPLIT_PDS=2 --rounds 2 --tag ab3-split2 --out $OUT -- $SWEEP --causal no 2>&1 | grep -v "^\\$" | tail -12;;
    ab4)
      t "ab4: $BM80 vs $BM80,DQ_WRITER=1"
      python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS_TILES=$BM80 --env-b CUPY_FMHA_BWD_WS_TILES=$BM80,DQ_WRITER=1 --rounds 2 --tag ab4-writer --out $OUT -- $SWEEP --causal both 2>&1 | grep -v "^\\$" | tail -12;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        t "compute-sanitizer $tool"
        CUPY_FMHA_BWD_WS_TILES=$BM80 timeout -s KILL 200 compute-sanitizer --tool $tool python3 bench/probe/sanitize_bwd_ws.py 128 plain > $OUT/san-$tool.txt 2>&1
        echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|error" $OUT/san-$tool.txt | tail -3
      done;;
  esac
done
t done
