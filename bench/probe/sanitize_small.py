"""Small calls of every kernel pass for compute-sanitizer (memcheck, racecheck, synccheck): the
forward and backward at lengths that are not multiples of any tile, in the configurations the
library routes to distinct kernel builds (plain, causal, dropout, ALiBi, bias, deterministic,
GQA), fp16 and bf16, hdim 64 and 128 (wgmma kernels on sm_90) and 96 (mma.sync kernels).

    compute-sanitizer --tool memcheck python3 bench/probe/sanitize_small.py [hdims, default 64,128,96]
"""

import sys

import cupy as cp
import ml_dtypes

import cupy_fmha

rng = cp.random.default_rng(0)


def run(d, dtype, **kw):
    b, sq, sk, hq, hk = 1, 77, 133, 2, kw.pop("hk", 2)
    q = rng.standard_normal((b, sq, hq, d), dtype=cp.float32).astype(dtype)
    k = rng.standard_normal((b, sk, hk, d), dtype=cp.float32).astype(dtype)
    v = rng.standard_normal((b, sk, hk, d), dtype=cp.float32).astype(dtype)
    do = rng.standard_normal((b, sq, hq, d), dtype=cp.float32).astype(dtype)
    det = kw.pop("deterministic", False)
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
    grads = cupy_fmha.attention_backward(do, q, k, v, o, lse, deterministic=det, **kw)
    cp.cuda.Device().synchronize()
    return grads


for dtype in (cp.float16, ml_dtypes.bfloat16):
    for d in (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64,128,96").split(",")):
        run(d, dtype)
        run(d, dtype, causal=True)
        run(d, dtype, dropout_p=0.2, seed=3)
        run(d, dtype, causal=True, deterministic=True)
        run(d, dtype, hk=1)
        run(d, dtype, alibi_slopes=cp.asarray([0.5, 0.25], dtype=cp.float32))
        run(d, dtype, bias=rng.standard_normal((77, 133), dtype=cp.float32).astype(dtype))
print("ok")
