#!/bin/bash
# Twenty-fourth session (issue 11, bench/NOTES.md step 96): the dropout keying in fragment order, run from a
# copy of the step-96 tree in .s95/ (carried; the repository root holds the tree before it).
#   bench/probe/s24_gpu.sh test   the dropout GPU tests of the new tree (bit-exact keep masks against the NumPy
#                                 replica, forward and backward against the reference), ~3 min
#   bench/probe/s24_gpu.sh time   drop_ws.py (forward, hdim 64 and 128) and drop_bwd.py (backward), old tree
#                                 (repository root) and new (.s95) alternated twice, ~1.5 min
#   bench/probe/s24_gpu.sh pipe   the hdim-128 dropout forward (new tree) on its serial pipeline (the table's) against
#                                 the overlapped one and overlapped + ping-pong (0 spills offline), two rounds, ~1 min
#   NEW=. bench/probe/s24_gpu.sh feat   (once step 96 is on the tree itself) issue 11's feature ratios: features.py
#                                 plain, bias and dropout at hdim 64, plain and dropout at 128, ~1 min
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
NEW=${NEW:-$ROOT/.s95}
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
for what in "$@"; do
if [ "$what" = test ]; then
  t "tests (new tree)"
  (cd $NEW && PYTHONPATH=$NEW timeout -s KILL 420 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 -x \
     tests/test_gpu_dropout.py tests/test_gpu_dropout_features.py tests/test_gpu_bwd_ws.py tests/test_gpu_fwd_ws.py \
     tests/test_gpu_edge_cases.py -k "drop or keep" > $OUT/s24-test.txt 2>&1; echo "rc=$?")
  grep -E "^FAILED|^ERROR|Error" $OUT/s24-test.txt | head -20; tail -3 $OUT/s24-test.txt
fi
if [ "$what" = time ]; then
  for round in 1 2; do
    for tree in $ROOT $NEW; do
      t "drop_ws.py [$tree] round $round"
      (cd $tree && PYTHONPATH=$tree timeout -s KILL 100 python3 bench/probe/drop_ws.py r$round 64,128 1024,4096,16384 2>&1 | tail -12 | cut -c1-160)
      t "drop_bwd.py [$tree] round $round"
      (cd $tree && PYTHONPATH=$tree timeout -s KILL 100 python3 bench/probe/drop_bwd.py r$round 64,128 2>&1 | tail -4 | cut -c1-160)
    done
  done
fi
if [ "$what" = feat ]; then
  (cd $NEW && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL)
  for d in 64 128; do
    rows=plain,dropout; [ $d = 64 ] && rows=plain,bias,dropout
    t "features.py d$d $rows"
    (cd $NEW && timeout -s KILL 100 python3 bench/features.py --hdim $d --rows $rows --no-peers --repeat 15 --name s24-feat-d$d \
       2>/dev/null | grep -E "plain|bias|dropout" | cut -c1-130; cp bench/results/*s24-feat-d$d.json $OUT/ 2>/dev/null)
  done
fi
if [ "$what" = pipe ]; then
  for round in 1 2; do
    for v in "" PV_OVERLAP=1 PV_OVERLAP=1,PINGPONG=1; do
      t "drop_ws.py d128 [$v] round $round"
      (cd $NEW && CUPY_FMHA_FWD_WS_TILES=$v PYTHONPATH=$NEW timeout -s KILL 90 python3 bench/probe/drop_ws.py "r$round${v//[=,]/}" 128 1024,4096,16384 2>&1 | tail -6 | cut -c1-120)
    done
  done
fi
done
t done
