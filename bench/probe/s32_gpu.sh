#!/bin/bash
# Thirty-second session's queue (bench/NOTES.md rows 113-114). One device call runs the parts given, in order, each
# under what is left of a deadline (DEADLINE seconds from the start, default 560: a call may run 600 s), and copies
# JSON results to $OUT after each part (only the summaries and sweeps: a call brings back 8 files). Without parts:
# on an H200 the whole GPU suite (bench/probe/suite_all_gpu.sh, a call of its own: issue 11's item 1), on an H100
# `droptest dropsan dropab ab192`. Parts:
#   droptest  step 114: the folded softmax with dropout (FOLD=1) against the reference and the keep-mask replica
#             (tests/test_gpu_dropout.py -k folded)
#   dropsan   compute-sanitizer memcheck / racecheck / synccheck under FOLD=1,PERSIST=4 at hdim 64 and 128
#             (bench/probe/sanitize_fwd_ws.py: its dropout cases, causal and group mode)
#   dropab    bench/probe/drop_ws.py: plain and dropout forward times, the default (A) and FOLD=1 (B), alternating
#             A B A B, hdim 64 and 128, s1024 / 4096 / 16384, causal both (the dropout column is what moves)
#   drop113   the same tool, the default (A) against the softmax before step 113 (B: SMAX_TREE=0,LAZY_RESCALE=0):
#             what step 113 gave the dropout builds (which take its tree maxima and lazy rescale, not the fold)
#   ab192     bench/ab.py: the default (A) against step 113's softmax at hdim 192 (B: FOLD=1,SMAX_TREE=1,
#             LAZY_RESCALE=8; untimed there), bf16, causal both
#   maskab    bench/ab.py: the default (A) against MASK_ROWS=2 (an edge tile's mask test from each row's bounds, the
#             lower only where it crosses; step 91 measured 1-4% on causal masks, before step 113), hdim 64 and 128,
#             bf16, causal only
#   persistab bench/ab.py: the launcher's row blocks per CTA (FWD_WS_PERSIST: 4 at s1024, 2 at s2048, measured in step
#             39 before the loop got 30% faster) against PERSIST=2 / 8 at s1024 and 1 / 4 at s2048, hdim 64 and 128, bf16
#   timeline  bench/probe/fwd_timeline.py at hdim 128 s1024 (and causal) and hdim 64 s1024 causal (the short-diagonal build,
#             which step 113 did not move although its loop model fell 7.6%): where a short row block's time goes
#   fwd128 / fwd64 / fwd256   bench/sweep.py --mode fwd with flash and cuDNN, bf16 and fp16, s1024-16384, causal both
#   fa3       the hdim-128 sweep with FlashAttention-3 as a peer (carry .whl)
#   features  bench/features.py --hdim 128 and 64
#   suite     the whole GPU suite in one pytest run (needs a call of its own)
# Thirty-third session (step 115: MASK_ROWS=2 at 64 / 128, step 113's softmax at 192, 2 row blocks per CTA at hdim 128):
#   san115    compute-sanitizer memcheck / racecheck / synccheck on the new default builds at hdim 64, 128 and 192
#             under PERSIST=4 (bench/probe/sanitize_fwd_ws.py: plain, causal, dropout, group mode)
#   persist256  bench/ab.py: the default (A) against PERSIST=2 at s1024 (B), hdim 192 and 256, bf16, causal both
#   okvtl     fwd_timeline.py at hdim 256 (O_IN_Q, the default, against O_IN_KV) and 192 (O_IN_KV against the register
#             store), then bench/ab.py: the default (A) against PERSIST=4 at hdim 256 s1024-2048 (4 row blocks per CTA, row 115 never timed it)
#   sinktest  step 116: KEEP_SINK=1 (the keep decisions inside the softmax) bit-identical to the default and against the
#             reference (tests/test_gpu_dropout.py -k keep_sink)
#   sinksan   compute-sanitizer memcheck / racecheck / synccheck under KEEP_SINK=1,PERSIST=4 at hdim 64 and 128
#   sinkab    bench/probe/drop_ws.py: the default (A) against KEEP_SINK=1 (B), A B A B, hdim 64 and 128
#   biasacc   features.py --rows plain,bias at hdim 128, the default and BIAS_ACC=1 (the bias in S's accumulator, so the
#             folded softmax of step 113), A B A B; then the bias build's TIMING phases at hdim 128 s4096 under each
#             (offline: the default bias build's TIMING form spills 120 bytes, so its phases read high; BIAS_ACC's 0)
#   short64   bench/ab.py: hdim 64 causal s1024 / 2048, the short-diagonal build (two warpgroups, step 67: three measured
#             1.15-1.19x the time at s1024 then) against NWG=3 (the long build's three), on today's softmax and mask test
#   sink2     step 117: bench/probe/drop_ws.py, the default (A) against KEEP_SINK=2 (B) at hdim 128, and the TIMING
#             build's phases at hdim 128 s4096 with dropout under KEEP_SINK=0 / 1 / 2 (why 1 gained nothing there)
# Thirty-fourth session (step 118: ALIGN_END, row blocks counted back from each sequence's last row):
#   aetest    tests/test_gpu_fwd_ws.py -k align_end: ALIGN_END=1 bit-identical to the default (every exact-variant shape,
#             head dim, group mode, the bias builds, PERSIST=4 with NWG=3 at hdim 64 under short causal masks)
#   aesan     compute-sanitizer memcheck / racecheck / synccheck under ALIGN_END=1,PERSIST=4 at hdim 64 and 128
#   aeab      bench/ab.py: the default (A) against ALIGN_END=1 (B), hdim 64 (192-row blocks: a partial block at every
#             length from 4096), bf16, s4096-16384, causal both
#   ae64short bench/ab.py: hdim 64 causal s1024 / 2048, the short-diagonal build (A) against three warpgroups with
#             ALIGN_END (B: NWG=3,ALIGN_END=1), bf16 and fp16 (short64 is the same without ALIGN_END)
#   newtest   after steps 118-119's adoption (ALIGN_END and three warpgroups under every mask at hdim 64, KEEP_SINK=2 at
#             128, BIAS_ACC for the 16-bit bias at 128): tests/test_gpu_fwd_ws.py, test_gpu_dropout.py,
#             test_gpu_fwd_ws_bias.py whole
#   newsan    compute-sanitizer memcheck / racecheck / synccheck on the new defaults: sanitize_fwd_ws.py at hdim 64 and
#             128 under PERSIST=4 (plain, causal, dropout, group mode), sanitize_fwd_bias.py at 128
#   sink64    bench/probe/drop_ws.py at hdim 64: the default (A: KEEP_SINK=1 there) against KEEP_SINK=2 (B), A B A B
#   ae192     bench/ab.py: ALIGN_END=1 (B) against the table at hdim 192 and 256 (112- and 80-key blocks: the first rows'
#             block may see one key block fewer), bf16, s1024-16384, causal only (untimed there; NOTES queue)
#   drop64w3  bench/probe/drop_ws.py at hdim 64: the table's dropout build (A: two warpgroups) against three with 96-key
#             blocks and ALIGN_END (B: NWG=3,BLOCK_N=96,ALIGN_END=1; 0 spills offline, 128 keys spill 64 bytes), A B A B
# Forty-first session (NOTES "Issue 11's missed targets": what no timeline has measured on today's builds):
#   misstl    bench/probe/fwd_timeline.py at hdim 64 s1024 (three warpgroups) and s2048 causal, hdim 256 s1024 causal,
#             hdim 128 s4096 with a bf16 bias: where the missed points' time goes
#   nwg2      bench/ab.py: hdim 64 at s1024 / 2048, the table's three warpgroups (A: 192-row blocks, 1,152 rows computed for
#             1,024 at s1024) against two (B: NWG=2, 128-row blocks), bf16 and fp16, causal both (rows 67 / 74 measured two
#             1.4-1.5% faster at s1024 without a mask, before steps 113-118)
#   mr256     MASK_ROWS=2 (the edge tile's mask test from each row's bounds, the default at 64 / 128 since step 115) at 192
#             and 256, where it spilled in step 87 and compiles without spills now: its bit-identity tests
#             (test_exact_softmax_variants_bit_identical -k MASK_ROWS at 192 / 256), bench/ab.py causal s1024-4096 bf16 and
#             s1024 fp16, then compute-sanitizer's three tools on sanitize_fwd_ws.py 192,256 under MASK_ROWS=2,PERSIST=4
# NOTES row 127 (O_IN_KV: O staged in the last key block's K / V tiles, so Q goes back after the last S GEMM and the next
# row block's Q loads under the epilogue instead of after it, row 124's 1.50 us wait at hdim 256):
#   okv       tests/test_gpu_fwd_ws.py -k o_in_kv (O and LSE bit-identical to the default at 192 / 256: the exact-variant
#             shapes, PERSIST=4, group mode with sequences ending inside key blocks), compute-sanitizer's three tools on
#             sanitize_fwd_ws.py 192,256 under O_IN_KV=1,O_IN_Q=0,PERSIST=4, then bench/ab.py: the default (A) against
#             O_IN_KV=1,O_IN_Q=0 (B), hdim 192 and 256, bf16, s1024-4096, causal both
# Forty-second session (NOTES rows 129-130):
#   okvtl     (listed above, beside persist256)
#   wgskip    WG_SKIP=1 (MMA warpgroups leave out the key blocks none of their rows sees): tests/test_gpu_fwd_ws.py -k
#             "WG_SKIP or wg_skip" (bit-identity: the exact-variant shapes, group mode, PERSIST=4), compute-sanitizer's
#             three tools on sanitize_fwd_ws.py 64,128,256 under WG_SKIP=1,PERSIST=4, then bench/ab.py: the default (A)
#             against WG_SKIP=1 (B), bf16, hdim 64 s1024-4096 and hdim 128 / 256 s1024-2048, causal both
#   skipsan   after WG_SKIP's adoption at 64 and 256 (batch mode only; group mode runs every block): compute-sanitizer's
#             three tools on sanitize_fwd_ws.py 64,256 under PERSIST=4 (the table's builds)
#   dropskip  WG_SKIP in the dropout builds (row 130 timed the plain ones): bench/probe/drop_ws.py, the default (A)
#             against WG_SKIP=1 (B), A B A B, hdim 64 and 128, s1024 / 4096 / 16384 (the dropout column; at 128
#             the plain column moves too, WG_SKIP=1 being not the table's there)
#   bash bench/probe/s32_gpu.sh [parts]
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$NAME"
if [ $# -eq 0 ]; then
  if [[ "$NAME" == *H200* ]]; then exec bash bench/probe/suite_all_gpu.sh; fi
  set -- droptest dropsan dropab ab192
fi
DEADLINE=${DEADLINE:-560}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mkdir -p /tmp/s /tmp/ab $OUT
GRID="--seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both --peers flash,cudnn --out-dir /tmp/s"
sweep() { timeout -s KILL $(left) python3 bench/sweep.py "$@" 2>&1 | grep -v "^\[" | tail -24; }
drop_pair() {  # drop_pair ENV_B: A, B, A, B of drop_ws.py (A: the default)
  for r in 1 2; do
    timeout -s KILL $(left) python3 bench/probe/drop_ws.py A$r 64,128 1024,4096,16384
    CUPY_FMHA_FWD_WS_TILES=$1 timeout -s KILL $(left) python3 bench/probe/drop_ws.py B$r 64,128 1024,4096,16384
  done 2>&1 | sort -k2,2 -k3,3 -k5,5 -k1,1
}
sanitize() {  # sanitize TILES HDIMS TAG: compute-sanitizer's three tools on sanitize_fwd_ws.py under those tiles
  for tool in memcheck racecheck synccheck; do
    CUPY_FMHA_FWD_WS_TILES=$1 timeout -s KILL 150 compute-sanitizer --report-api-errors no \
      --tool $tool python3 bench/probe/sanitize_fwd_ws.py $2 > /tmp/$3-$tool.txt 2>&1
    echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/$3-$tool.txt | tail -1)"
  done
}
gputest() {  # gputest FILE FILTER NAME: one GPU test file's cases matching FILTER, output to $OUT/NAME.txt
  timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 $1 -k "$2" > $OUT/$3.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/$3.txt | head; tail -1 $OUT/$3.txt
}
ab() {  # ab TILES_B TAG LINES SWEEP_ARGS...: bench/ab.py, the default (A) against CUPY_FMHA_FWD_WS_TILES=TILES_B, best of 3
  local b=$1 tag=$2 n=$3; shift 3
  timeout -s KILL $(left) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_FWD_WS_TILES=$b --rounds 3 --tag $tag \
    --out /tmp/ab -- --mode fwd "$@" 2>&1 | grep -v "^\\$" | tail -$n
}
for part in "$@"; do
  if [ "$(left)" -lt 20 ]; then t "$part: skipped, deadline"; continue; fi
  t "$part (left $(left) s)"
  case $part in
    droptest) gputest tests/test_gpu_dropout.py folded test-dropout-fold;;
    dropsan) sanitize FOLD=1,PERSIST=4 64,128 sdrop;;
    dropab) drop_pair FOLD=1;;
    drop113) drop_pair SMAX_TREE=0,LAZY_RESCALE=0;;
    ab192) ab FOLD=1,SMAX_TREE=1,LAZY_RESCALE=8 ab-192-softmax113 12 --hdim 192 --seqlen 1024,2048,4096,8192,16384 \
             --dtype bf16 --causal both;;
    maskab) ab MASK_ROWS=2 ab-maskrows2 12 --hdim 64,128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal yes;;
    persistab) for sb in 1024:2 1024:8 2048:1 2048:4; do
                 ab PERSIST=${sb#*:} ab-persist-${sb/:/-} 6 --hdim 64,128 --seqlen ${sb%:*} --dtype bf16 --causal both
               done;;
    timeline) for a in "128 1024" "128 1024 causal" "64 1024 causal"; do
                timeout -s KILL $(left) python3 bench/probe/fwd_timeline.py $a 2>&1 | tail -24
              done;;
    fwd128) sweep --hdim 128 $GRID --mode fwd --name sweep-fwd-hd128;;
    fwd64) sweep --hdim 64 $GRID --mode fwd --name sweep-fwd-hd64;;
    fwd256) sweep --hdim 256 $GRID --mode fwd --name sweep-fwd-hd256;;
    fa3) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
           && PYTHONPATH=/tmp/site timeout -s KILL $(left) python3 bench/sweep.py --hdim 128 ${GRID/flash,cudnn/flash,cudnn,fa3} \
              --mode both --name sweep-hd128-fa3 2>&1 | grep -v "^\[" | tail -44;;
    features) for h in 128 64; do timeout -s KILL $(left) python3 bench/features.py --hdim $h --name features-d$h 2>&1 | tail -14
                cp bench/results/features-d$h.json /tmp/s/; done;;
    suite) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 --dist worksteal --durations=15 tests \
             > $OUT/suite-all.txt 2>&1
           echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite-all.txt | head -20; tail -1 $OUT/suite-all.txt;;
    san115) sanitize PERSIST=4 64,128,192 s115;;
    persist256) ab PERSIST=2 ab-persist-1024-2-hd192-256 6 --hdim 192,256 --seqlen 1024 --dtype bf16 --causal both;;
    sinktest) gputest tests/test_gpu_dropout.py keep_sink test-dropout-keep-sink;;
    sinksan) sanitize KEEP_SINK=1,PERSIST=4 64,128 ssink;;
    sinkab) drop_pair KEEP_SINK=1 | cut -c1-70;;
    biasacc) for v in "" BIAS_ACC=1 "" BIAS_ACC=1; do echo "== [$v]"
               CUPY_FMHA_FWD_WS_TILES=$v timeout -s KILL $(left) python3 bench/features.py --hdim 128 --rows plain,bias --no-peers \
                 --name f-biasacc 2>&1 | grep -E "^│ (plain|bias) " | cut -c1-60
             done
             for v in "" BIAS_ACC=1; do
               timeout -s KILL $(left) python3 bench/probe/fwd_timeline.py 128 4096 bias $v 2>&1 | grep -E "kernel|per key block|cycles per loop"
             done;;
    short64) ab NWG=3 ab-short64-nwg3 8 --hdim 64 --seqlen 1024,2048 --dtype bf16,fp16 --causal yes;;
    sink2) for r in 1 2; do
             timeout -s KILL $(left) python3 bench/probe/drop_ws.py A$r 128 1024,4096,16384
             CUPY_FMHA_FWD_WS_TILES=KEEP_SINK=2 timeout -s KILL $(left) python3 bench/probe/drop_ws.py B$r 128 1024,4096,16384
           done 2>&1 | sort -k2,2 -k3,3 -k5,5 -k1,1 | cut -c1-70
           for k in 0 1 2; do
             timeout -s KILL $(left) python3 bench/probe/fwd_timeline.py 128 4096 dropout KEEP_SINK=$k 2>&1 | grep -E "per key block|cycles per loop"
           done;;
    aetest) gputest tests/test_gpu_fwd_ws.py align_end test-align-end;;
    aesan) sanitize ALIGN_END=1,PERSIST=4 64,128 sae;;
    aeab) ab ALIGN_END=1 ab-align-end 14 --hdim 64 --seqlen 4096,8192,16384 --dtype bf16 --causal both;;
    ae64short) ab NWG=3,ALIGN_END=1 ab-short64-nwg3-ae 8 --hdim 64 --seqlen 1024,2048 --dtype bf16,fp16 --causal yes;;
    newtest) timeout -s KILL $(left) python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 --dist worksteal tests/test_gpu_fwd_ws.py \
               tests/test_gpu_dropout.py tests/test_gpu_fwd_ws_bias.py > $OUT/test-new-defaults.txt 2>&1
             echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-new-defaults.txt | head; tail -1 $OUT/test-new-defaults.txt;;
    newsan) sanitize PERSIST=4 64,128 snew
            for tool in memcheck racecheck synccheck; do
              timeout -s KILL 150 compute-sanitizer --report-api-errors no --tool $tool python3 bench/probe/sanitize_fwd_bias.py 128 \
                > /tmp/snewb-$tool.txt 2>&1
              echo "bias 128 $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/snewb-$tool.txt | tail -1)"
            done;;
    sink64) for r in 1 2; do
              timeout -s KILL $(left) python3 bench/probe/drop_ws.py A$r 64 1024,4096,16384
              CUPY_FMHA_FWD_WS_TILES=KEEP_SINK=2 timeout -s KILL $(left) python3 bench/probe/drop_ws.py B$r 64 1024,4096,16384
            done 2>&1 | sort -k2,2 -k3,3 -k5,5 -k1,1 | cut -c1-70;;
    ae192) ab ALIGN_END=1 ab-align-end-192-256 14 --hdim 192,256 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --causal yes;;
    drop64w3) for r in 1 2; do
                timeout -s KILL $(left) python3 bench/probe/drop_ws.py A$r 64 1024,4096,16384
                CUPY_FMHA_FWD_WS_TILES=NWG=3,BLOCK_N=96,ALIGN_END=1 timeout -s KILL $(left) python3 bench/probe/drop_ws.py B$r 64 1024,4096,16384
              done 2>&1 | sort -k2,2 -k3,3 -k5,5 -k1,1 | cut -c1-70;;
    misstl) for a in "64 1024" "64 2048 causal" "256 1024 causal" "128 4096 bias"; do
              echo "== fwd_timeline.py $a"; timeout -s KILL $(left) python3 bench/probe/fwd_timeline.py $a 2>&1 | tail -24
            done 2>&1 | tee $OUT/misstl.txt;;
    nwg2) ab NWG=2 ab-hd64-nwg2-short 14 --hdim 64 --seqlen 1024,2048 --dtype bf16,fp16 --causal both;;
    mr256) gputest tests/test_gpu_fwd_ws.py "exact_softmax_variants and MASK_ROWS and (192 or 256)" test-mr256
           ab MASK_ROWS=2 ab-maskrows2-192-256 12 --hdim 192,256 --seqlen 1024,2048,4096 --dtype bf16 --causal yes
           ab MASK_ROWS=2 ab-maskrows2-192-256-fp16 6 --hdim 192,256 --seqlen 1024 --dtype fp16 --causal yes
           sanitize MASK_ROWS=2,PERSIST=4 192,256 smr256;;
    okv) gputest tests/test_gpu_fwd_ws.py "o_in_kv" test-okv
         sanitize O_IN_KV=1,O_IN_Q=0,PERSIST=4 192,256 sokv
         ab O_IN_KV=1,O_IN_Q=0 ab-okv 14 --hdim 192,256 --seqlen 1024,2048,4096 --dtype bf16 --causal both;;
    wgskip) CUPY_FMHA_FWD_WS_TILES=WG_SKIP=1,PERSIST=4 timeout -s KILL 120 python3 bench/probe/sanitize_fwd_ws.py 64,128,256 \
              > $OUT/smoke-wgskip.txt 2>&1 || { echo "smoke rc=$? (a hang?): $(tail -3 $OUT/smoke-wgskip.txt)"; continue; }
            echo "smoke: sanitize_fwd_ws.py 64,128,256 ran"
            gputest tests/test_gpu_fwd_ws.py "WG_SKIP or wg_skip" test-wgskip
            sanitize WG_SKIP=1,PERSIST=4 64,128,256 swgskip
            ab WG_SKIP=1 ab-wgskip-64 14 --hdim 64 --seqlen 1024,2048,4096 --dtype bf16 --causal both
            ab WG_SKIP=1 ab-wgskip-128-256 10 --hdim 128,256 --seqlen 1024,2048 --dtype bf16 --causal both;;
    skipsan) sanitize PERSIST=4 64,256 sskip;;
    dropskip) drop_pair WG_SKIP=1 | cut -c1-70;;
    okvtl) for a in "256 1024 causal" "256 1024 causal O_IN_KV=1 O_IN_Q=0" "256 2048" "256 2048 O_IN_KV=1 O_IN_Q=0" \
                    "192 1024 causal" "192 1024 causal O_IN_KV=0 O_IN_Q=0"; do
             echo "== fwd_timeline.py $a"; timeout -s KILL $(left) python3 bench/probe/fwd_timeline.py $a 2>&1 | tail -24
           done 2>&1 | tee $OUT/okvtl.txt
           ab PERSIST=4 ab-persist4-256 6 --hdim 256 --seqlen 1024,2048 --dtype bf16 --causal both;;
    *) echo "unknown part $part";;
  esac
  cp /tmp/s/*.json /tmp/ab/*summary.json $OUT/ 2>/dev/null
done
t done
