"""dBias from the ws backward's BIAS build: the TMA store of its dS tile (api.DBIAS_TMA_STORE, the
default where dBias allows it) against the same kernel's element-by-element store. Times (medians of
15, ms) of the plain backward, the bias backward without dBias and with it, each way; and whether
dq/dk/dv/dbias agree bit for bit (dq: largest relative difference, atomic order).
bf16 b4 h16 s4096 bshd, bias [b,h,s,s] bf16.

    python bench/probe/dbias_tma.py [HDIMS]    (e.g. 64,128)
"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha
from cupy_fmha import api
from cupy_fmha.timing import time_cuda

hdims = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64,128").split(",")]
bf = ml_dtypes.bfloat16
for d in hdims:
    b, s, h = 4, 4096, 16
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal((b, s, h, d), np.float32).astype(bf)) for _ in range(4))
    bias = cp.asarray(rng.standard_normal((b, h, s, s), np.float32).astype(bf))
    for causal in (False, True):
        o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
        plain = time_cuda(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal),
                          warmup=3, repeat=15).median_ms
        o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal, bias=bias)
        tb = time_cuda(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, bias=bias),
                       warmup=3, repeat=15).median_ms
        res = {}
        for tag, on in (("tma", True), ("elements", False)):
            api.DBIAS_TMA_STORE = on
            res[tag] = cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, bias=bias, return_dbias=True)
            tdb = time_cuda(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, bias=bias,
                                                                 return_dbias=True), warmup=3, repeat=15).median_ms
            print(f"d{d} {'causal' if causal else 'nc    '} plain {plain:.3f} bias {tb:.3f} ({tb / plain:.2f}x) "
                  f"bias+dbias[{tag}] {tdb:.3f} ({tdb / plain:.2f}x)", flush=True)
        api.DBIAS_TMA_STORE = True
        a, e = res["tma"], res["elements"]
        same = {n: bool((getattr(a, n).view(cp.uint16) == getattr(e, n).view(cp.uint16)).all()) for n in ("dk", "dv", "dbias")}
        dq = float(cp.abs(a.dq.astype(cp.float32) - e.dq.astype(cp.float32)).max()) / float(cp.abs(e.dq.astype(cp.float32)).max())
        print(f"   d{d} {'causal' if causal else 'nc'}: bit-identical {same}, dq rel diff {dq:.2e}", flush=True)
