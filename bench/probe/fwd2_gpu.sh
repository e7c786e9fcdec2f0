#!/usr/bin/env bash
# One GPU run for issue 11's second forward step (bench/NOTES.md step 25): the swizzled-descriptor
# probe, the ws forward's GPU tests under each pipeline variant, and an A/B timing of the variants
# against cuDNN. Run from the repository root on the H200 machine (python3 with cupy-cuda13x,
# cuda-bindings, torch, pytest-xdist):
#
#     bash bench/probe/fwd2_gpu.sh            # outputs under $OUT (default /tmp/fwd2-out)
#
# Every piece runs under `timeout -s KILL`; the budgets add up to 350 s (expected about 3-4
# minutes: install 10 s, probe 20 s, precompile 30 s, 4 x 20 s of tests, timing 45 s). Files left
# in $OUT (7): fwd2.log (everything), probe.log, tests-<variant>.log (4), fwd_variants.json.
#
# (The first run, 2026-12-01, settled the MN-major swizzled descriptor; bench/NOTES.md step 27.)
set -u
OUT=${OUT:-/tmp/fwd2-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/fwd2.log") 2>&1
export PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/fwd2-cupy-cache}
T0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }

# the variants under test, first the default (all three on), then the first ws forward (all off)
VARIANTS=("" "SWIZZLE=0,PV_OVERLAP=0,PINGPONG=0" "SWIZZLE=1,PV_OVERLAP=0,PINGPONG=0" "SWIZZLE=1,PV_OVERLAP=1,PINGPONG=0")
TIMED=("${VARIANTS[@]}" "SWIZZLE=0,PV_OVERLAP=1,PINGPONG=0")

step "install"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader || true
timeout -s KILL 40 python3 -m pip install -q --no-deps --no-build-isolation -e . || echo "pip install failed (rc $?)"
python3 -c "import cupy_fmha, cupy; print(cupy_fmha.__file__, cupy.__version__)"

step "probe: wgmma on TMA-loaded swizzled / column-blocked tiles; TMA boxes"
timeout -s KILL 40 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu_wgmma_swizzle.py tests/test_gpu_tma.py \
    > "$OUT/probe.log" 2>&1
echo "probe rc $?"
grep -E "MN-major swizzled|passed|failed|Error" "$OUT/probe.log" | tail -20
with_swap() { echo "$1"; }

step "precompile (all variants, the test file's head dims, both dtypes)"
ARGS=()
for v in "${TIMED[@]}"; do ARGS+=("$(with_swap "$v")"); done
timeout -s KILL 60 python3 bench/probe/precompile.py --fwd-ws-variants "${ARGS[@]}"

for v in "${VARIANTS[@]}"; do
    vs=$(with_swap "$v")
    step "tests/test_gpu_fwd_ws.py with CUPY_FMHA_FWD_WS_TILES='$vs'"
    tag=$(echo "${vs:-default}" | tr ',=' '_-')
    CUPY_FMHA_FWD_WS_TILES="$vs" timeout -s KILL 150 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider \
        tests/test_gpu_fwd_ws.py > "$OUT/tests-$tag.log" 2>&1
    echo "rc $?"
    grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests-$tag.log" | tail -12
done

step "timing: bf16, hdim 128 then 64, seqlen 1024/8192, causal both; variants vs the default and cuDNN"
ARGS=()
for v in "${TIMED[@]}"; do ARGS+=("$(with_swap "$v")"); done
timeout -s KILL 70 python3 bench/probe/fwd_variants.py --variants "${ARGS[@]}" --hdim 128,64 --seqlen 8192,1024 \
    --causal both --dtype bf16 --peers cudnn --rounds 2 --time-limit 45 --out "$OUT/fwd_variants.json"
echo "timing rc $?"

step "done"
