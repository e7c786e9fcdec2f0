#!/bin/bash
# Step 105 (issue 11): O_WRITER=1, the ws forward's staged O rows sent by a producer-warpgroup thread
# (not dispatched). Parts, in the order given (tests and sanitizers first: adopt nothing without them):
#   test      the bit-identity tests (hdim 128 plain / ALiBi / dropout / (256, 128), PERSIST 0, 2, 4, rows
#             without keys; group mode), then tests/test_gpu_fwd_ws.py whole under the switch
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck on small forwards at hdim 128 and 64 (O_REG=0), PERSIST=4
#   ab        bench/ab.py, the default (A) against O_WRITER=1 (B), forward hdim 128, bf16 and fp16, causal both
#   ab64      the same at hdim 64, where the table stores O from the registers (O_REG): the default (A) against
#             the stage with the writer (B: O_REG=0,O_WRITER=1; the stage alone measured 0.5-8% slower, step 63)
#   persist   from s4096 the table keeps one row block per CTA (FWD_WS_PERSIST: 2 measured 0.98-1.02x at 4096,
#             step 39), where the writer has nothing to overlap; with it, 2 per CTA may pay: the default (A)
#             against O_WRITER=1,PERSIST=2 (B) at s4096-16384
#   timeline  bench/probe/fwd_timeline.py at hdim 128 s1024 and s2048, default and O_WRITER=1 (O's epilogue
#             per row block: 1.56 us in step 83's timeline; under the switch its "O issued" stamp marks O
#             staged, and the CTA's exit stamp comes before the writer's last copies: the A/B is the measure)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/ab $OUT
for part in "$@"; do
  t "$part"
  case $part in
    test)
      timeout -s KILL 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k o_writer \
        > $OUT/test-owriter.txt 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-owriter.txt | head; tail -1 $OUT/test-owriter.txt
      CUPY_FMHA_FWD_WS_TILES=O_WRITER=1 timeout -s KILL 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 \
        tests/test_gpu_fwd_ws.py tests/test_gpu_attention.py -k "not o_writer and not variants and not o_in_q" > $OUT/test-owriter-all.txt 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-owriter-all.txt | head; tail -1 $OUT/test-owriter-all.txt;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        CUPY_FMHA_FWD_WS_TILES=O_WRITER=1,PERSIST=4 timeout -s KILL 150 compute-sanitizer --report-api-errors no --tool $tool \
          python3 bench/probe/sanitize_fwd_ws.py 128 > /tmp/so-$tool.txt 2>&1
        echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/so-$tool.txt | tail -1)"
        CUPY_FMHA_FWD_WS_TILES=O_REG=0,O_WRITER=1,PERSIST=4 timeout -s KILL 150 compute-sanitizer --report-api-errors no --tool $tool \
          python3 bench/probe/sanitize_fwd_ws.py 64 > /tmp/so64-$tool.txt 2>&1
        echo "$tool (64) rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/so64-$tool.txt | tail -1)"
      done;;
    ab) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=O_WRITER=1 --rounds 3 --tag ab-owriter --out /tmp/ab \
        -- --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --mode fwd --causal both 2>&1 | grep -v "^\\$" | tail -22;;
    ab64) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=O_REG=0,O_WRITER=1 --rounds 3 --tag ab-owriter64 --out /tmp/ab \
        -- --hdim 64 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --mode fwd --causal both 2>&1 | grep -v "^\\$" | tail -12;;
    persist) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=O_WRITER=1,PERSIST=2 --rounds 3 --tag ab-owriter-p2 \
        --out /tmp/ab -- --hdim 128 --seqlen 4096,8192,16384 --dtype bf16 --mode fwd --causal both 2>&1 | grep -v "^\\$" | tail -8;;
    timeline) for s in 1024 2048; do
        python3 bench/probe/fwd_timeline.py 128 $s 2>&1 | grep -E "row block 1|per key block|gap" | head -4
        python3 bench/probe/fwd_timeline.py 128 $s O_WRITER=1 2>&1 | grep -E "row block 1|per key block|gap" | head -4
      done;;
  esac
done
cp /tmp/ab/*summary.json $OUT/ 2>/dev/null
t done
