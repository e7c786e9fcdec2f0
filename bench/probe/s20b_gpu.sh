#!/bin/bash
# Twentieth session, second call: O_IN_Q's correctness before adopting it at hdim 256 (bit-identity
# tests, then the ws-forward GPU file under CUPY_FMHA_FWD_WS_TILES=O_IN_Q=1), and the forward's ncu
# digests (step 84) for the next session.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
t "bit-identity: O_IN_Q, O_VEC"
timeout -s KILL 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py -k "o_in_q or O_VEC" > $OUT/t86.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t86.txt | head -5; tail -1 $OUT/t86.txt
t "test_gpu_fwd_ws.py under O_IN_Q=1 (hdim 256 and 64 take it)"
CUPY_FMHA_FWD_WS_TILES=O_IN_Q=1 timeout -s KILL 220 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_gpu_fwd_ws.py \
  -k "not handover and not persist and not two_q and not o_in_q and not switch_selects" > $OUT/t86b.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR" $OUT/t86b.txt | head -5; tail -1 $OUT/t86b.txt
t "ncu digests"
timeout -s KILL 130 bash bench/probe/ncu84_gpu.sh ncu > $OUT/ncu84.txt 2>&1; grep -E "^==|pipes|stalls|gmma|lts__|xu|bank|gpu__time|cycles_elapsed.avg.per" $OUT/ncu84.txt | cut -c1-400
t done
