#!/bin/bash
# Twenty-seventh session: issue 10's H200 evidence after step 100. Parts, in the order given:
#   sweep128  backward sweep with peers, hdim 128 (issue 10's table)
#   abcausal  80 rows for causal masks against the 64-row diagonal entries (BWD_WS_DIAGONAL_SEQLEN_K)
#   sweep64 / sweep256  backward sweeps with peers at hdim 64 / 256
#   fwd128 / fwd64 / fwd256  forward sweeps with peers (issue 11's table)
#   fa3       hdim 128, both passes, with FlashAttention-3 as a peer (carry .whl: bench/probe/fa3_wheel.sh)
#   features  bench/features.py at hdim 128 and 64 (feature costs, both passes)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/s /tmp/ab
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
GRID="--seqlen 1024,2048,4096,8192,16384 --dtype bf16,fp16 --causal both --peers flash,cudnn --out-dir /tmp/s"
for part in "$@"; do
  t "$part"
  case $part in
    sweep128) python3 bench/sweep.py --hdim 128 $GRID --mode bwd --name sweep-bwd-hd128 2>&1 | grep -v "^\[" | tail -24;;
    sweep64) python3 bench/sweep.py --hdim 64 $GRID --mode bwd --name sweep-bwd-hd64 2>&1 | grep -v "^\[" | tail -24;;
    sweep256) python3 bench/sweep.py --hdim 256 $GRID --mode bwd --name sweep-bwd-hd256 2>&1 | grep -v "^\[" | tail -24;;
    fwd128) python3 bench/sweep.py --hdim 128 $GRID --mode fwd --name sweep-fwd-hd128 2>&1 | grep -v "^\[" | tail -24;;
    fwd64) python3 bench/sweep.py --hdim 64 $GRID --mode fwd --name sweep-fwd-hd64 2>&1 | grep -v "^\[" | tail -24;;
    fwd256) python3 bench/sweep.py --hdim 256 $GRID --mode fwd --name sweep-fwd-hd256 2>&1 | grep -v "^\[" | tail -24;;
    abcausal) python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_TILES=BLOCK_M=80,SPLIT_PDS=2,DQ_WRITER=1 --rounds 2 \
        --tag ab-causal80 --out /tmp/ab -- --hdim 128 --seqlen 1024,2048,4096,8192 --dtype bf16 --mode bwd --causal yes 2>&1 | grep -v "^\\$" | tail -8;;
    fa3) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
           && PYTHONPATH=/tmp/site python3 bench/sweep.py --hdim 128 ${GRID/flash,cudnn/flash,cudnn,fa3} --mode both \
              --name sweep-hd128-fa3 2>&1 | grep -v "^\[" | tail -44;;
    features) for h in 128 64; do python3 bench/features.py --hdim $h --name features-d$h 2>&1 | tail -14; cp bench/results/features-d$h.json /tmp/s/; done;;
  esac
done
mkdir -p $OUT; cp /tmp/s/*.json $OUT/ 2>/dev/null  # JSON only: 8 files come back; plots are drawn here from it
t done
