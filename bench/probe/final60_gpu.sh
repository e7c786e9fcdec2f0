#!/bin/bash
# Final run of step 60 (the dK/dV epilogue through shared memory and bulk row copies, on by default):
#   bench/probe/final60_gpu.sh suite   the whole GPU suite, synccheck of the wide build
#   bench/probe/final60_gpu.sh sweep   backward sweeps at hdim 64, 128, 256 against the peers (JSON, plots into $OUT)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
if [ "$1" = suite ]; then
  t "whole GPU suite"
  timeout -s KILL 520 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
  t "synccheck (wide)"
  timeout -s KILL 50 compute-sanitizer --tool synccheck --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 256 plain 2>&1 | tail -2
fi
if [ "$1" = sweep ]; then
  for hd in 128 64 256; do
    t "sweep hdim $hd"
    timeout -s KILL 100 python3 bench/sweep.py --hdim $hd --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
      --mode bwd --peers flash,cudnn --name 2026-12-04-h200-sweep-bwd-hd$hd-step60 --out-dir $OUT > $OUT/sweep$hd.txt 2>&1
    echo "rc=$?"; grep -E "│ +(bf16|fp16) │ +$hd" $OUT/sweep$hd.txt | cut -c1-140
  done
  rm -f $OUT/*fp16.png
fi
t done
