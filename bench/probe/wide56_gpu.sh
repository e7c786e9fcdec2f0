#!/bin/bash
# GPU run for bench/NOTES.md step 56: the wide ws backward's dQ staged in its Q/dO buffers and added
# with bulk reduce-adds (DQ_STAGE, default) instead of per-thread atomics, and the WIDE_AHEAD variants.
# Tests of the wide build and the deterministic file, the three sanitizers at hdim 256 (plain calls,
# unequal head dims), A/B of the variants, then the hdim-256 backward sweep against the peers.
#   OUT=/tmp/out bash bench/probe/wide56_gpu.sh
# (WIDE_AHEAD was removed after this run, measured slower: its A/B lines now time the default twice.)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests"
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py tests/test_gpu_deterministic.py \
  tests/test_gpu_attention.py tests/test_gpu_varlen.py -k "bwd_ws or determ or d256 or d224 or d192 or d160 or 256" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
grep -E "^E  " $OUT/tests.txt | head -12
t "ab: atomics (A) vs staged dQ (B)"
AB="--hdim 256 --seqlen 1024,4096,8192 --dtype bf16 --causal both --mode bwd"
timeout -s KILL 100 python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_STAGE=0 --rounds 1 --tag ab-stage \
  --out $OUT -- $AB > $OUT/ab1.txt 2>&1
echo "rc=$?"; grep -A10 "^dtype" $OUT/ab1.txt
t "ab: staged (A) vs AHEAD=2 (B)"
timeout -s KILL 100 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_WIDE_TILES=WIDE_AHEAD=2 --rounds 1 --tag ab-ahead2 \
  --out $OUT -- $AB > $OUT/ab2.txt 2>&1
echo "rc=$?"; grep -A10 "^dtype" $OUT/ab2.txt
t "ab: staged (A) vs AHEAD=1 (B, spills)"
timeout -s KILL 100 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_WIDE_TILES=WIDE_AHEAD=1 --rounds 1 --tag ab-ahead1 \
  --out $OUT -- $AB > $OUT/ab3.txt 2>&1
echo "rc=$?"; grep -A10 "^dtype" $OUT/ab3.txt
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 256,192 plain \
    > $OUT/$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/$tool.txt | tr '\n' ' ')"
  grep -m3 -A2 -E "^========= (Invalid|Illegal|Race|Barrier|Error)" $OUT/$tool.txt
done
t "sweep hdim 256 bwd"
timeout -s KILL 90 python3 bench/sweep.py --hdim 256 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode bwd --peers flash,cudnn --name hd256-bwd-56 --out-dir $OUT > $OUT/sweep.txt 2>&1
echo "rc=$?"; grep -E "d256|256 " $OUT/sweep.txt | tail -24 | cut -c1-150
t done
