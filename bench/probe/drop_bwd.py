"""Backward times with and without dropout (p = 0.1) for the kernels the environment selects
(e.g. CUPY_FMHA_BWD_SM90_TILES), bf16, bshd, batch 4, 16 heads, seqlen 4096 (bench/NOTES.md steps 48-49).

    python bench/probe/drop_bwd.py TAG HDIM[,HDIM]
"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha
from cupy_fmha.backends import cuda
from cupy_fmha.timing import time_cuda

tag, hdims = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
for d in hdims:
    b, s, h = 4, 4096, 16
    q, k, v, do = (cp.asarray(np.random.default_rng(i).standard_normal((b, s, h, d), np.float32).astype(ml_dtypes.bfloat16))
                   for i in range(4))
    for causal in (False, True):
        ts = []
        for kw in ({}, dict(dropout_p=0.1, seed=3)):
            o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal, **kw)
            fn = lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, **kw)
            ts.append(time_cuda(fn, warmup=3, repeat=15).median_ms)
        name = cuda.bwd_specs("bf16", d, d, 90, dropout=True).dq_dk_dv.name.replace("fmha_bwd_dq_dk_dv_", "")[:60]
        print(f"{tag:8s} d{d} {'causal' if causal else 'nc    '} plain {ts[0]:.3f} drop {ts[1]:.3f} ratio {ts[1] / ts[0]:.2f}  {name}",
              flush=True)
