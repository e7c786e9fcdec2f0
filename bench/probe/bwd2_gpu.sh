#!/usr/bin/env bash
# One GPU run for the ws backward's SWIZZLE build (issue 10; bench/NOTES.md step 30): the swizzled
# descriptor probe (GEMM4's column starts), the ws backward's GPU tests and the deterministic tests
# under CUPY_FMHA_BWD_WS_TILES=SWIZZLE=1, an A/B timing of the backward (default build vs SWIZZLE=1 vs
# cuDNN), and compute-sanitizer's memcheck of small SWIZZLE calls. Run from the repository root on the
# H200 machine (python3 with cupy-cuda13x, cuda-bindings, torch, pytest-xdist):
#
#     bash bench/probe/bwd2_gpu.sh            # outputs under $OUT (default /tmp/bwd2-out)
#
# Every piece runs under `timeout -s KILL`, each clipped to what is left of a 460 s deadline, so the
# whole script ends inside 8 minutes. Order = priority: install (cap 30 s), probe (60), precompile
# (90), tests/test_gpu_bwd_ws.py (150), timing (75), memcheck (60), tests/test_gpu_deterministic.py
# (150, or what is left). Expected: about 5-6 minutes if every compile is fresh. Files left in $OUT:
# bwd2.log (everything), probe.log, tests-bwd-ws.log, bwd_variants.json, memcheck.log,
# tests-deterministic.log.
set -u
OUT=${OUT:-/tmp/bwd2-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/bwd2.log") 2>&1
export PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/bwd2-cupy-cache}
T0=$(date +%s)
DEADLINE=460
step() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
# cap N: N seconds, or what is left before the deadline (at least 1)
cap() { local left=$(( DEADLINE - ($(date +%s) - T0) )); (( left < 1 )) && left=1; echo $(( $1 < left ? $1 : left )); }
SW="SWIZZLE=1"

step "install"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader || true
timeout -s KILL "$(cap 30)" python3 -m pip install -q --no-deps --no-build-isolation -e . || echo "pip install failed (rc $?)"
python3 -c "import cupy_fmha, cupy; print(cupy_fmha.__file__, cupy.__version__)"

step "probe: wgmma column starts of the swizzled MN-major K (GEMM4), and the swizzle probe's other cases"
timeout -s KILL "$(cap 60)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_wgmma_swizzle.py \
    > "$OUT/probe.log" 2>&1
echo "probe rc $?"
grep -E "column_start|passed|failed|Error" "$OUT/probe.log" | tail -20

step "precompile (the tests' head dims, both dtypes; ws backward default and $SW)"
timeout -s KILL "$(cap 90)" python3 bench/probe/precompile.py --fwd-ws-variants "" --bwd-ws-variants "" "$SW"

step "tests/test_gpu_bwd_ws.py with CUPY_FMHA_BWD_WS_TILES=$SW"
CUPY_FMHA_BWD_WS_TILES="$SW" timeout -s KILL "$(cap 150)" python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider \
    tests/test_gpu_bwd_ws.py > "$OUT/tests-bwd-ws.log" 2>&1
echo "rc $?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests-bwd-ws.log" | tail -15

step "timing: bwd, bf16, hdim 128 then 64, seqlen 8192/1024, causal both; default vs $SW vs cuDNN"
timeout -s KILL "$(cap 75)" python3 bench/probe/fwd_variants.py --mode bwd --variants "" "$SW" --hdim 128,64 \
    --seqlen 8192,1024 --causal both --dtype bf16 --peers cudnn --rounds 2 --time-limit 55 --out "$OUT/bwd_variants.json"
echo "timing rc $?"

step "compute-sanitizer memcheck, small ws-backward calls under $SW"
CUPY_FMHA_BWD_WS_TILES="$SW" timeout -s KILL "$(cap 60)" compute-sanitizer --tool memcheck --report-api-errors no \
    python3 bench/probe/sanitize_bwd_ws.py 64,120,128 > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"
grep -E "ERROR SUMMARY|^ok|Error|fmha_bwd" "$OUT/memcheck.log" | tail -8

step "tests/test_gpu_deterministic.py with CUPY_FMHA_BWD_WS_TILES=$SW (the ws backward by default)"
CUPY_FMHA_BWD_WS_TILES="$SW" timeout -s KILL "$(cap 150)" python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider \
    tests/test_gpu_deterministic.py > "$OUT/tests-deterministic.log" 2>&1
echo "rc $?"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests-deterministic.log" | tail -15

step "done"
