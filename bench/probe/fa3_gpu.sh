#!/bin/bash
# The sweep's `fa3` peer (FlashAttention-3 through JAX, bench/fa3_peer.py) on the device, from the
# wheel bench/probe/fa3_wheel.sh put in .whl/ (the call must carry ".whl"): first the peer alone on
# one point (does the wheel load beside the image's JAX and CUDA 13?), then hdim 128 of the grid,
# bf16 and fp16, causal and not, both passes, with the SDPA peers and ours in the same run.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || { echo "no wheel in .whl (bench/probe/fa3_wheel.sh, carry .whl)"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "fa3 peer alone"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -s KILL 120 python3 bench/fa3_peer.py --points \
  '[{"dtype": "bfloat16", "hdim": 128, "causal": false, "seqlen": 4096, "batch": 4, "nhead": 16}]' 2>&1 | tail -3
t "sweep hdim 128 with fa3"
timeout -s KILL 420 python3 bench/sweep.py --hdim 128 --seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both \
  --mode both --peers flash,cudnn,fa3 --out-dir $OUT --name sweep-hd128-fa3 2>&1 | grep -v "^\[" | tail -40
t done
