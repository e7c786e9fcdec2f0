"""Small forwards with an elementwise bias on the warp-specialized Hopper forward's TMA bias builds,
for compute-sanitizer (step 70: three MMA warpgroups with 64-key blocks at hdim 64): 16-bit and fp32
biases, full [b, h, sq, sk] and broadcast along the rows, causal or not, lengths off the blocks.

    compute-sanitizer --tool memcheck python3 bench/probe/sanitize_fwd_bias.py [hdims]
"""

import sys

import cupy as cp
import ml_dtypes

import cupy_fmha

rng = cp.random.default_rng(0)


def run(d, dtype, bias_dtype, sq=200, sk=161, hq=2, rows=True, **kw):
    q = rng.standard_normal((1, sq, hq, d), dtype=cp.float32).astype(dtype)
    k = rng.standard_normal((1, sk, hq, d), dtype=cp.float32).astype(dtype)
    v = rng.standard_normal((1, sk, hq, d), dtype=cp.float32).astype(dtype)
    bias = rng.standard_normal((1, hq, sq if rows else 1, sk), dtype=cp.float32).astype(bias_dtype)
    cupy_fmha.attention_forward(q, k, v, bias=bias, **kw)
    cp.cuda.Device().synchronize()


for d in [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64").split(",")]:
    for dtype in (cp.float16, ml_dtypes.bfloat16):
        run(d, dtype, dtype)
        run(d, dtype, cp.float32, causal=True)
        run(d, dtype, dtype, rows=False, sq=450, sk=300)
        run(d, dtype, cp.float32, sq=700, sk=129, causal=True)
print("done")
