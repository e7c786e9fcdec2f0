#!/bin/bash
# GPU run for branch issue11-fwd-persist (bench/NOTES.md step 39): a smoke call under PERSIST=4 (a
# deadlock in the cross-row-block ring shows here, not as a hung suite), the timing of PERSIST 0 / 2
# / 4 against cuDNN in one process, this tree (PERSIST=0) against a main tree given as $1, the three
# sanitizers under PERSIST=3 (uneven row blocks per CTA), then the whole GPU suite under PERSIST=4.
#   OUT=/tmp/out bash bench/probe/persist_gpu.sh /path/to/main-tree
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
cat > /tmp/persist_smoke.py <<'PY'
import cupy as cp, cupy_fmha, numpy as np
for d in (64, 128):
    for causal in (False, True):
        q, k, v = (cp.random.standard_normal((2, 700, 2, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
        o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
        assert bool(cp.isfinite(o).all()), (d, causal)
cp.cuda.Device().synchronize(); print("ok")
PY
t "smoke, PERSIST=4 and 3"
for n in 4 3; do CUPY_FMHA_FWD_WS_TILES=PERSIST=$n timeout -s KILL 60 python3 /tmp/persist_smoke.py; echo "rc=$?"; done
t "PERSIST 0 / 2 / 4 vs cuDNN"
timeout -s KILL 120 python3 bench/probe/fwd_variants.py --variants "" "PERSIST=2" "PERSIST=4" --hdim 64,128 \
  --seqlen 1024,2048,8192 --causal both --out $OUT/persist-variants.json 2>&1 | grep -v "^$" | tail -30
t "A/B: $1 (A) vs this tree at PERSIST=0 (B)"
timeout -s KILL 60 python3 bench/ab.py --a "$1" --b "$PWD" --rounds 2 --out /tmp/ab39 -- --hdim 64,128 --seqlen 1024,8192 \
  --dtype bf16 --causal both --mode fwd 2>&1 | tail -11
for tool in memcheck racecheck synccheck; do
  t "$tool, PERSIST=3"
  CUPY_FMHA_FWD_WS_TILES=PERSIST=3 timeout -s KILL 40 compute-sanitizer --tool $tool --report-api-errors no \
    python3 bench/probe/sanitize_bwd_ws.py 64,128 > $OUT/persist-$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/persist-$tool.txt | tr '\n' ' ')"
done
t "the GPU suite under CUPY_FMHA_FWD_WS_TILES=PERSIST=4"
CUPY_FMHA_FWD_WS_TILES=PERSIST=4 timeout -s KILL ${SUITE_S:-$((515 - $(date +%s) + T0))} python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 -rs \
  > $OUT/persist-suite.txt 2>&1; echo "suite rc=$?"
grep -E "^FAILED|^ERROR" $OUT/persist-suite.txt | head -20; tail -4 $OUT/persist-suite.txt
t done
