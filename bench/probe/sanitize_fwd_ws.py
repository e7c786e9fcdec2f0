"""Small forwards of the warp-specialized Hopper forward for compute-sanitizer, at the head dims given
(default 96,192,256: 96 rounds up to the 128-wide tiles, 192 and 256 run their own 112- and 80-key
blocks): fp16 and bf16, plain, causal, GQA with lengths one past a block, ALiBi (at 256 the serial
pipeline), a sliding window, group mode with sequences that end inside a key block, and dropout
(causal; group mode).

    compute-sanitizer --tool memcheck python3 bench/probe/sanitize_fwd_ws.py [hdims]
"""

import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha
from cupy_fmha.backends import cuda

rng = cp.random.default_rng(0)


def randn(shape, dtype):
    return rng.standard_normal(shape, dtype=cp.float32).astype(dtype)


def run(d, dtype, sq=129, sk=161, hq=2, hk=2, **kw):
    q = randn((1, sq, hq, d), dtype)
    k, v = randn((1, sk, hk, d), dtype), randn((1, sk, hk, d), dtype)
    cupy_fmha.attention_forward(q, k, v, **kw)
    cp.cuda.Device().synchronize()


def run_group(d, dtype, lq=(65, 3, 130), lk=(129, 200, 1), h=2, **kw):
    cu_q = cp.asarray(np.cumsum([0, *lq]), dtype=cp.int32)
    cu_k = cp.asarray(np.cumsum([0, *lk]), dtype=cp.int32)
    q = randn((sum(lq), h, d), dtype)
    k, v = randn((sum(lk), h, d), dtype), randn((sum(lk), h, d), dtype)
    cupy_fmha.attention_forward(q, k, v, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lq),
                                max_seqlen_k=max(lk), **kw)
    cp.cuda.Device().synchronize()


hdims = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "96,192,256").split(",")]
for d in hdims:
    print(cuda.fwd_spec("bf16", d, d, 90).name, flush=True)
for dtype in (cp.float16, ml_dtypes.bfloat16):
    for d in hdims:
        run(d, dtype)
        run(d, dtype, causal=True)
        run(d, dtype, hk=1, sq=300, sk=257)
        run(d, dtype, alibi_slopes=cp.asarray([0.5, 0.25], dtype=cp.float32), causal=True)
        run(d, dtype, window_size=(100, 20), sq=300, sk=300)
        run(d, dtype, sq=700, sk=300, causal=True)  # (4-6 row blocks: PERSIST's ring over several; 192-row ones at hdim 64 under CUPY_FMHA_FWD_WS_TILES=NWG=3)
        run_group(d, dtype, mask="b")
        # dropout (the keep bits in the MMA warps; step 48): batch and group mode, causal
        run(d, dtype, dropout_p=0.2, seed=5, causal=True)
        run(d, dtype, dropout_p=0.2, seed=6, sq=300, sk=520)  # (5 key blocks: KEEP_GEN's ring wraps)
        run_group(d, dtype, dropout_p=0.3, seed=2**40 + 1, offset=7)
print("ok")
