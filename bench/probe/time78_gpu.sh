#!/bin/bash
# Steps 75-77, timing only, in one device call (about 9 minutes): the three variants prepared
# without a GPU in the seventeenth and eighteenth sessions, each against the default build in the
# same call, so that the next call can make the winners the default and run the whole GPU suite
# (which then tests them) and the sanitizers. (1) the wide writer, hdim 256 bwd, bench/ab.py
# alternated; (2) the ws writer: plain and deterministic backward at hdim 128 and 64, and the wide
# writer's deterministic cost at 256 (bench/features.py); (3) BIAS_ACC: the bias forward at hdim 64
# and 128. Correctness of each variant: next75b_gpu.sh (writers), next77_gpu.sh (BIAS_ACC).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
feat() {  # feat NAME VAR VALUE HDIM ROWS
  t "features $1: hdim $4 $5, $2='$3'"
  env $2="$3" timeout -s KILL 45 python3 bench/features.py --hdim $4 --repeat 15 --rows $5 --no-peers --name $1 2>&1 \
    | grep "│" | grep -E "plain|determ|bias"
}
t "A/B hdim 256 backward: B = the wide writer"
timeout -s KILL 200 python3 bench/ab.py --a . --b . --env-b CUPY_FMHA_BWD_WS_WIDE_TILES=DQ_WRITER=1 --rounds 2 \
  --tag ab75 --out $OUT -- --hdim 256 --seqlen 2048,4096,8192 --dtype bf16 --causal both --mode bwd --repeat 10 \
  2>&1 | grep -v '^\$'
for r in 1 2; do
  for v in "" "DQ_WRITER=1"; do
    feat t78-ws128-w${v:+1}-r$r CUPY_FMHA_BWD_WS_TILES "$v" 128 plain,deterministic
    feat t78-ws64-w${v:+1}-r$r CUPY_FMHA_BWD_WS_TILES "$v" 64 plain,deterministic
  done
  for v in "" "BIAS_ACC=1"; do
    feat t78-bias64-acc${v:+1}-r$r CUPY_FMHA_FWD_WS_TILES "$v" 64 plain,bias
  done
done
for v in "" "DQ_WRITER=1"; do
  feat t78-wide256-w${v:+1} CUPY_FMHA_BWD_WS_WIDE_TILES "$v" 256 plain,deterministic
done
for v in "" "BIAS_ACC=1"; do
  feat t78-bias128-acc${v:+1} CUPY_FMHA_FWD_WS_TILES "$v" 128 plain,bias
done
cp bench/results/t78-*.json $OUT/ 2>/dev/null
rm -f $OUT/*.png
t done
