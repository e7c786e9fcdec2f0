#!/bin/bash
# Step 62 (issue 11): the ws forward's key-block length chosen by measurement. Variants of
# CUPY_FMHA_FWD_WS_TILES (BLOCK_N 144-192 at hdim 128, 160/192 at hdim 64, STAGES=3 at 128) against
# the default and cuDNN in one process (probe/fwd_variants.py); then the backward sweeps of the
# step-61 tree (bench/sweep.py, peers flash and cuDNN) that the twelfth session could not run.
#   bench/probe/tile62_gpu.sh [fwd] [sweep]
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for what in "$@"; do
if [ "$what" = fwd ]; then
  t "fwd variants hdim 128"
  timeout -s KILL 170 python3 bench/probe/fwd_variants.py --variants "" BLOCK_N=144 BLOCK_N=160 BLOCK_N=176 BLOCK_N=192 STAGES=3 \
    --hdim 128 --seqlen 1024,2048,4096,8192,16384 --causal both --rounds 2 --time-limit 150 --out $OUT/fwd62-hd128.json 2>&1 \
    | grep -v "^$" | cut -c1-130
  t "fwd variants hdim 64"
  timeout -s KILL 90 python3 bench/probe/fwd_variants.py --variants "" BLOCK_N=160 BLOCK_N=192 STAGES=3 \
    --hdim 64 --seqlen 1024,4096,16384 --causal both --rounds 2 --time-limit 75 --out $OUT/fwd62-hd64.json 2>&1 \
    | grep -v "^$" | cut -c1-130
fi
if [ "$what" = sweep ]; then
  for hd in 128 64 256; do
    t "bwd sweep hdim $hd"
    timeout -s KILL 100 python3 bench/sweep.py --hdim $hd --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
      --mode bwd --peers flash,cudnn --name 2026-12-04-h200-sweep-bwd-hd$hd-step61 --out-dir $OUT > $OUT/sweep$hd.txt 2>&1
    echo "rc=$?"; grep -E "│ +(bf16|fp16) │ +$hd" $OUT/sweep$hd.txt | cut -c1-140
  done
  rm -f $OUT/*fp16.png $OUT/sweep*.txt
fi
done
t done
