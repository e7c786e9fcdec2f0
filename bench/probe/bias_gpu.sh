#!/bin/bash
# GPU run for the ws forward's bias build (bench/NOTES.md step 43): a smoke call per head dim and bias
# dtype (a hang in the bias ring shows here, not as a hung suite), the bias tests, the three
# sanitizers, and the feature cost of the bias forward at hdim 128 and 64.
#   OUT=/tmp/out bash bench/probe/bias_gpu.sh [suite]   (suite: then the whole GPU suite)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
T0=$(date +%s); t() { echo "=== [$(( $(date +%s)-T0 )) s] $*"; }
cat > /tmp/bias_smoke.py <<'PY'
import cupy as cp, cupy_fmha, numpy as np
from cupy_fmha import reference as R
for d in (64, 128):
    for bdt in (cp.float16, cp.float32):
        for shape in ((2, 2, 300, 256), (2, 1, 1, 256), (300, 250)):
            sk = shape[-1]
            q = cp.random.standard_normal((2, 300, 2, d), dtype=cp.float32).astype(cp.float16)
            k, v = (cp.random.standard_normal((2, sk, 2, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
            bias = cp.random.standard_normal(shape, dtype=cp.float32).astype(bdt)
            o, lse = cupy_fmha.attention_forward(q, k, v, bias=bias, causal=True)
            ro, rl = R.attention_forward(*(cp.asnumpy(x).astype(np.float64) for x in (q, k, v)), causal=True,
                                         bias=cp.asnumpy(bias).astype(np.float64))
            err = float(np.abs(cp.asnumpy(o).astype(np.float64) - ro).max())
            print(d, bdt.__name__, shape, "max|o - ref|", round(err, 5), "lse", float(np.abs(cp.asnumpy(lse) - rl).max()))
cp.cuda.Device().synchronize(); print("ok")
PY
t "smoke"
timeout -s KILL 90 python3 /tmp/bias_smoke.py; echo "rc=$?"
t "bias tests"
timeout -s KILL 200 python3 -m pytest -q -p no:cacheprovider -n 15 -x tests/test_gpu_fwd_ws_bias.py tests/test_gpu_bias.py \
  tests/test_gpu_varlen.py tests/test_gpu_fwd_ws.py tests/test_gpu_jax.py -k "bias or ws" > $OUT/bias-tests.txt 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|Error" $OUT/bias-tests.txt | head -20; tail -3 $OUT/bias-tests.txt
for tool in memcheck racecheck synccheck; do
  t "$tool"
  timeout -s KILL 60 compute-sanitizer --tool $tool --report-api-errors no python3 bench/probe/sanitize_bwd_ws.py 64,128 \
    > $OUT/bias-$tool.txt 2>&1
  echo "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok' $OUT/bias-$tool.txt | tr '\n' ' ')"
done
for d in 128 64; do
  t "features hdim $d"
  timeout -s KILL 90 python3 bench/features.py --hdim $d --rows "plain,bias" --no-peers --name bias-d$d \
    2>&1 | grep -v "^$" | tail -8
  cp bench/results/*bias-d$d*.json $OUT/ 2>/dev/null
done
if [ "$1" = suite ]; then
  t "the GPU suite"
  timeout -s KILL ${SUITE_S:-$((580 - $(date +%s) + T0))} python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 -rs \
    > $OUT/suite.txt 2>&1; echo "suite rc=$?"
  grep -E "^FAILED|^ERROR" $OUT/suite.txt | head -20; tail -4 $OUT/suite.txt
fi
t done
