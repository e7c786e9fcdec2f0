#!/bin/bash
# Final run of steps 56-57: the whole GPU suite on the final kernels, then the backward sweeps at
# hdim 128 and 256 against the peers (JSON and plots into $OUT).   OUT=/tmp/out bash bench/probe/final57_gpu.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "sweeps"
timeout -s KILL 70 python3 bench/sweep.py --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode bwd --peers flash,cudnn --name 2026-12-03-h200-sweep-bwd-hd128-step57 --out-dir $OUT > $OUT/sweep128.txt 2>&1
echo "rc=$?"; grep -E "│ +(bf16|fp16) │ +128" $OUT/sweep128.txt | cut -c1-140
timeout -s KILL 60 python3 bench/sweep.py --hdim 256 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode bwd --peers flash,cudnn --name 2026-12-03-h200-sweep-bwd-hd256-step56 --out-dir $OUT > $OUT/sweep256.txt 2>&1
echo "rc=$?"; grep -E "│ +(bf16|fp16) │ +256" $OUT/sweep256.txt | cut -c1-140
rm -f $OUT/*fp16.png
t "whole GPU suite"
timeout -s KILL 430 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -2 $OUT/suite.txt
t done
