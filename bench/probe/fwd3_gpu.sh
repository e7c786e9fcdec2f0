#!/bin/bash
# GPU run for branch issue11-fwd-uniform (bench/NOTES.md step 32): the ws forward's tests, then an A/B
# of the forward against a main tree given as $1 (e.g. an archive of the commit this branch left).
#   OUT=/tmp/out bash bench/probe/fwd3_gpu.sh /path/to/main-tree
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "tests/test_gpu_fwd_ws.py"
timeout -s KILL 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_gpu_fwd_ws.py > $OUT/fwd3-tests.txt 2>&1; echo "rc=$?"
grep -E "^FAILED|^ERROR" $OUT/fwd3-tests.txt | head; tail -1 $OUT/fwd3-tests.txt
t "A/B forward: $1 (A) vs this tree (B)"
timeout -s KILL 150 python3 bench/ab.py --a "$1" --b "$PWD" --rounds 2 --out $OUT/ab32 -- --hdim 64,128 --seqlen 1024,8192 \
  --dtype bf16 --causal both --mode fwd 2>&1 | tail -11
t done
