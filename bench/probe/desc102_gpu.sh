#!/bin/bash
# Steps 102-103: the loop's wgmma descriptors from one 32-bit address (DESC_ADDR=1, both ws kernels).
# Run on an H100 in the twenty-eighth session before step 104 made it the default in the backward and the
# forward at hdim 192/256 (bench/NOTES.md row 104); since then the parts take A = DESC_ADDR=0 (the pointers),
# B = the default, and the tests compare the pointer-formed build with the default. Parts, in the order given:
#   test      the ws backward's DESC_ADDR tests (bit-identity to the default in both dQ modes; reference) and
#             the ws forward's (O and LSE bit-identical to the default at hdim 64-256, masks, dropout, ALiBi,
#             group mode, bias)
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck on small calls of both kernels' defaults
#   abbwd     bench/ab.py, DESC_ADDR=0 (A) against the default (B), backward at hdim 128 and 64, bf16, causal both
#   abfwd     the same, forward at hdim 256 and 192
#   det       features.py's deterministic row at hdim 128 and 64, the default and DESC_ADDR=0
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/ab
for part in "$@"; do
  t "$part"
  case $part in
    test)
      timeout -s KILL 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_bwd_ws.py tests/test_gpu_fwd_ws.py \
        -k "desc_addr or DESC_ADDR" > $OUT/test-desc.txt 2>&1
      echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/test-desc.txt | head; tail -1 $OUT/test-desc.txt;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout -s KILL 150 compute-sanitizer --report-api-errors no --tool $tool \
          python3 bench/probe/sanitize_bwd_ws.py 64,128 plain > /tmp/sb-$tool.txt 2>&1
        echo "bwd $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sb-$tool.txt | tail -1)"
        timeout -s KILL 150 compute-sanitizer --report-api-errors no --tool $tool \
          python3 bench/probe/sanitize_fwd_ws.py 64,128,192,256 > /tmp/sf-$tool.txt 2>&1
        echo "fwd $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sf-$tool.txt | tail -1)"
      done;;
    abbwd) python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_BWD_WS_TILES=DESC_ADDR=0 --rounds 3 --tag ab-desc-bwd --out /tmp/ab \
        -- --hdim 128,64 --seqlen 2048,4096,8192,16384 --dtype bf16 --mode bwd --causal both 2>&1 | grep -v "^\\$" | tail -18;;
    abfwd) python3 bench/ab.py --a . --b . --env-a CUPY_FMHA_FWD_WS_TILES=DESC_ADDR=0 --rounds 3 --tag ab-desc-fwd --out /tmp/ab \
        -- --hdim 256,192 --seqlen 1024,2048,4096,8192,16384 --dtype bf16 --mode fwd --causal both 2>&1 | grep -v "^\\$" | tail -32;;
    det) for h in 128 64; do
           python3 bench/features.py --hdim $h --rows plain,det --no-peers --name det-d$h 2>&1 | grep -E "plain|determ"
           CUPY_FMHA_BWD_WS_TILES=DESC_ADDR=0 python3 bench/features.py --hdim $h --rows plain,det --no-peers --name det-desc-d$h 2>&1 | grep -E "plain|determ"
         done;;
  esac
done
mkdir -p $OUT; cp /tmp/ab/*summary.json $OUT/ 2>/dev/null
t done
