#!/usr/bin/env bash
# Ring attention (issue 14) on one GPU: the GPU tests of cupy_fmha.parallel and the emulated
# two-rank ring of bench/context_parallel.py. Run from the repository root on a machine with one
# NVIDIA GPU (nothing is downloaded: the editable install uses what is installed), under 4
# minutes in all: every step has its own `timeout -s KILL` and the next step runs anyway.
# Outputs under $OUT (default ./cp_gpu_out): install.log, pytest.txt, bench_local2.txt,
# bench_local2.json, env.txt, status.txt (each step's exit status).
set -u
OUT="${OUT:-$PWD/cp_gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY="${PYTHON:-python3}"
: > "$OUT/status.txt"

step() {  # step NAME SECONDS LOG COMMAND...
    local name="$1" secs="$2" log="$3"
    shift 3
    local t0=$SECONDS
    timeout -s KILL "$secs" "$@" > "$log" 2>&1
    local rc=$?
    echo "$name rc=$rc ${secs}s-limit took=$((SECONDS - t0))s" | tee -a "$OUT/status.txt"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    "$PY" -c 'import cupy, sys; print("python", sys.version.split()[0], "cupy", cupy.__version__, "gpus", cupy.cuda.runtime.getDeviceCount()); from cupy.cuda import nccl; print("nccl available", nccl.available, nccl.get_version() if nccl.available else "")' 2>&1
} > "$OUT/env.txt"

step install 40 "$OUT/install.log" "$PY" -m pip install -q --no-deps --no-build-isolation -e .
step pytest 135 "$OUT/pytest.txt" "$PY" -m pytest -m gpu -v -p no:cacheprovider -rs tests/test_gpu_parallel.py
step bench_local2 55 "$OUT/bench_local2.txt" "$PY" bench/context_parallel.py --local 2 --seqlen 16384 \
    --warmup 1 --repeat 5 --out "$OUT/bench_local2.json"
tail -n 25 "$OUT/pytest.txt"
cat "$OUT/bench_local2.txt"
cat "$OUT/status.txt"
