"""Small calls of the warp-specialized Hopper backward for compute-sanitizer (memcheck first): the
build chosen by CUPY_FMHA_BWD_WS_TILES (e.g. SWIZZLE=1), fp16 and bf16, head dims 64, 120 (padded to
128: TMA's zero fill of the columns past the head dim) and 128, plain, causal, GQA, ALiBi,
deterministic (the ordered dQ adds), and group mode with sequences that end inside a query and a key
block (the zeroed tail rows). Lengths are one past a block (65 query rows, 129 keys). The forward
runs on the ws forward by default, its bias build included (16-bit and fp32 bias, padded copies and
in-place rows, a bias broadcast along the rows, group mode; some with the backward, whose bias
build runs at hdim 64 and 128, with dBias, through its TMA store too, and in deterministic mode), and dropout (the backward's DROPOUT
build: batch mode causal and deterministic, group mode).

    CUPY_FMHA_BWD_WS_TILES=SWIZZLE=1 compute-sanitizer --tool memcheck python3 bench/probe/sanitize_bwd_ws.py [hdims] [dbias|plain]

(`plain`: the calls without a bias or dropout, plus unequal head dims above 128: the wide build's.)
"""

import os
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha
from cupy_fmha.backends import cuda

os.environ.setdefault("CUPY_FMHA_BWD_WS", "1")
rng = cp.random.default_rng(0)


def randn(shape, dtype):
    return rng.standard_normal(shape, dtype=cp.float32).astype(dtype)


def run(d, dtype, sq=65, sk=129, hq=2, hk=2, dv=None, **kw):
    dv = dv or d
    q, do = randn((1, sq, hq, d), dtype), randn((1, sq, hq, dv), dtype)
    k, v = randn((1, sk, hk, d), dtype), randn((1, sk, hk, dv), dtype)
    det = kw.pop("deterministic", False)
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
    cupy_fmha.attention_backward(do, q, k, v, o, lse, deterministic=det, **kw)
    cp.cuda.Device().synchronize()


def run_group(d, dtype, lq=(65, 3, 130), lk=(129, 200, 1), h=2, **kw):
    cu_q = cp.asarray(np.cumsum([0, *lq]), dtype=cp.int32)
    cu_k = cp.asarray(np.cumsum([0, *lk]), dtype=cp.int32)
    q, do = randn((sum(lq), h, d), dtype), randn((sum(lq), h, d), dtype)
    k, v = randn((sum(lk), h, d), dtype), randn((sum(lk), h, d), dtype)
    det = kw.pop("deterministic", False)
    g = dict(layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lq), max_seqlen_k=max(lk), **kw)
    o, lse = cupy_fmha.attention_forward(q, k, v, **g)
    cupy_fmha.attention_backward(do, q, k, v, o, lse, deterministic=det, **g)
    cp.cuda.Device().synchronize()


def run_bias(d, dtype, bshape, bdt, sq=65, sk=129, h=2, group=False, backward=False, **kw):
    bias = randn(bshape, cp.float32).astype(bdt)
    if group:
        lq, lk = (65, 3, 130), (129, 200, 1)
        cu_q = cp.asarray(np.cumsum([0, *lq]), dtype=cp.int32)
        cu_k = cp.asarray(np.cumsum([0, *lk]), dtype=cp.int32)
        q, k, v = randn((sum(lq), h, d), dtype), randn((sum(lk), h, d), dtype), randn((sum(lk), h, d), dtype)
        kw = dict(kw, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lq), max_seqlen_k=max(lk))
    else:
        q, k, v = randn((1, sq, h, d), dtype), randn((1, sk, h, d), dtype), randn((1, sk, h, d), dtype)
    o, lse = cupy_fmha.attention_forward(q, k, v, bias=bias, **kw)
    if backward:  # (the ws backward's bias build at hdim 64: dBias, deterministic ordered adds)
        do = randn(o.shape, dtype)
        cupy_fmha.attention_backward(do, q, k, v, o, lse, bias=bias, return_dbias=True, **kw)
        cupy_fmha.attention_backward(do, q, k, v, o, lse, bias=bias, deterministic=True, **kw)
    cp.cuda.Device().synchronize()


hdims = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64,120,128").split(",")]
print(cuda.bwd_specs("bf16", 128, 128, 90).dq_dk_dv.name, flush=True)
for dtype in (cp.float16, ml_dtypes.bfloat16):
    for d in hdims:
        if sys.argv[2:] == ["dbias"]:  # only the dBias calls of the bias build (a shorter sanitizer run)
            run_bias(d, dtype, (1, 2, 65, 136), dtype, sk=136, backward=True)
            run_bias(d, dtype, (1, 2, 200, 264), dtype, sq=200, sk=264, backward=True, causal=True)
            run_bias(d, dtype, (1, 2, 65, 129), cp.float32, backward=True, causal=True)
            continue
        run(d, dtype)
        run(d, dtype, causal=True)
        run(d, dtype, hk=1, sq=200, sk=300)
        run(d, dtype, causal=True, deterministic=True, sq=200, sk=300)
        run(d, dtype, alibi_slopes=cp.asarray([0.5, 0.25], dtype=cp.float32))
        run_group(d, dtype, mask="b")
        run_group(d, dtype, mask="b", deterministic=True)
        if sys.argv[2:] == ["plain"]:  # (the wide build: no bias or dropout there; unequal head dims)
            if d > 128:
                run(d, dtype, dv=128, causal=True, deterministic=True, sq=200, sk=300)
                run(128, dtype, dv=d, sq=200, sk=300)
                run(128, dtype, dv=d, deterministic=True, sq=200, sk=300)
            continue
        run_bias(d, dtype, (1, 2, 65, 129), cp.float16)
        run_bias(d, dtype, (2, 200, 256), cp.float32, sq=200, sk=256, causal=True)
        run_bias(d, dtype, (2, 1, 256), cp.float32, sq=130, sk=256)
        run_bias(d, dtype, (3, 2, 130, 200), cp.float16, group=True, mask="b")
        run_bias(d, dtype, (1, 2, 65, 129), cp.float32, backward=True, causal=True)
        run_bias(d, dtype, (2, 1, 256), cp.float16, sq=130, sk=256, backward=True)
        run_bias(d, dtype, (3, 2, 130, 200), cp.float16, group=True, backward=True, mask="b")
        # dBias in the inputs' dtype with 16-byte rows: the TMA store of the dS tile (clipped rows and keys)
        run_bias(d, dtype, (1, 2, 65, 136), dtype, sk=136, backward=True)
        run_bias(d, dtype, (1, 2, 200, 264), dtype, sq=200, sk=264, backward=True, causal=True)
        # dropout: under CUPY_FMHA_BWD_WS=1 (set above) the backward's DROPOUT build (step 49)
        run(d, dtype, dropout_p=0.2, seed=7, causal=True)
        run(d, dtype, dropout_p=0.3, seed=2**33 + 1, offset=5, deterministic=True, sq=200, sk=300)
        run_group(d, dtype, mask="b", dropout_p=0.2, seed=3)
print("ok")
