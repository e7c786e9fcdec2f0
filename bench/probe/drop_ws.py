"""Forward times with and without dropout (p = 0.1) for the kernel the environment selects
(CUPY_FMHA_FWD_WS, CUPY_FMHA_FWD_WS_TILES), bf16, bshd, batch 4, 16 heads (bench/NOTES.md step 48).

    python bench/probe/drop_ws.py TAG HDIM[,HDIM] [SEQLEN[,SEQLEN]]

Prints one line per (hdim, seqlen, mask): the instance name, plain and dropout medians in ms and
their ratio."""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha
from cupy_fmha.backends import cuda
from cupy_fmha.timing import time_cuda

tag = sys.argv[1]
hdims = [int(x) for x in sys.argv[2].split(",")]
seqlens = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "4096").split(",")]
for d in hdims:
    for s in seqlens:
        b, h = max(1, 16384 // s), 16
        q, k, v = (cp.asarray(np.random.default_rng(i).standard_normal((b, s, h, d), np.float32).astype(ml_dtypes.bfloat16))
                   for i in range(3))
        for causal in (False, True):
            ts = []
            for kw in ({}, dict(dropout_p=0.1, seed=3)):
                fn = lambda: cupy_fmha.attention_forward(q, k, v, causal=causal, **kw)
                ts.append(time_cuda(fn, warmup=3, repeat=15).median_ms)
            name = cuda.fwd_spec("bf16", d, d, 90, dropout=True).name.replace("fmha_fwd_", "")[:70]
            print(f"{tag:10s} d{d} s{s} b{b} {'causal' if causal else 'nc    '} plain {ts[0]:.3f} drop {ts[1]:.3f} "
                  f"ratio {ts[1] / ts[0]:.2f}  {name}", flush=True)
