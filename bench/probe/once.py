"""One attention call inside a CUDA profiler range, after warm-up, for Nsight Compute
(`ncu --profile-from-start off ...`). bshd, batch 1 (or $B), 16 heads.

    python bench/probe/once.py fwd|bwd HDIM SEQLEN [causal] [dropout] [bias] [bf16|fp16]
"""
import os
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha

mode, d, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flags = set(sys.argv[4:])
dt = np.float16 if "fp16" in flags else ml_dtypes.bfloat16
b, h = int(os.environ.get("B", "1")), 16  # B=16 at seqlen 1024: FlashAttention's grid
kw = dict(causal="causal" in flags)
if "dropout" in flags:
    kw.update(dropout_p=0.1, seed=7)
if "bias" in flags:
    kw["bias"] = cp.asarray(np.random.default_rng(0).standard_normal((b, h, s, s), np.float32).astype(dt))
q, k, v, do = (cp.asarray(np.random.default_rng(i).standard_normal((b, s, h, d), np.float32).astype(dt)) for i in range(4))
o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
if mode == "fwd":
    call = lambda: cupy_fmha.attention_forward(q, k, v, **kw)
else:
    call = lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw)
for _ in range(3):
    call()
cp.cuda.runtime.deviceSynchronize()
cp.cuda.runtime.profilerStart()
call()
cp.cuda.runtime.deviceSynchronize()
cp.cuda.runtime.profilerStop()
print("ok", mode, d, s, sorted(flags))
