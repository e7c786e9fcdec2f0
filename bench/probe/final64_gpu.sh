#!/bin/bash
# Thirteenth session, final: the whole GPU suite on the final tree, then the forward sweeps at hdim
# 128, 64, 256 against the peers (JSON, plots into $OUT).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "whole GPU suite"
timeout -s KILL 470 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
for hd in 128 64 256; do
  t "fwd sweep hdim $hd"
  timeout -s KILL 35 python3 bench/sweep.py --hdim $hd --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
    --mode fwd --peers flash,cudnn --name 2026-12-04-h200-sweep-fwd-hd$hd-step63 --out-dir $OUT > $OUT/sw$hd.txt 2>&1
  echo "rc=$?"
done
rm -f $OUT/*fp16.png $OUT/sw*.txt
t done
