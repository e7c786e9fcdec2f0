"""Where a backward call's time goes, ours against cuDNN (PyTorch SDPA) on the same inputs, on
FlashAttention's grid (batch * seqlen = 16384, nhead * hdim = 2048), bf16, bshd.

    python3 bench/probe/bwd_split.py HDIM SEQLEN [causal]           # end-to-end medians (CUDA events)
    ncu --profile-from-start off --metrics gpu__time_duration.sum \\
        python3 bench/probe/bwd_split.py HDIM SEQLEN [causal] --once  # one call of each, for per-kernel times

The difference between the end-to-end median and the sum of the kernels is launch gaps.
"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np
import torch

import cupy_fmha
from cupy_fmha.timing import time_cuda

d, s = int(sys.argv[1]), int(sys.argv[2])
causal = "causal" in sys.argv[3:]
b, h = 16384 // s, 2048 // d
rng = np.random.default_rng(0)
q, k, v, do = (cp.asarray(rng.standard_normal((b, s, h, d), np.float32).astype(ml_dtypes.bfloat16)) for _ in range(4))
o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2).detach().requires_grad_(x is not do) for x in (q, k, v, do))
B = torch.nn.attention.SDPBackend
with torch.nn.attention.sdpa_kernel([B.CUDNN_ATTENTION]):
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
ours = lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal)
cudnn = lambda: torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)
for _ in range(5):
    ours(); cudnn()
torch.cuda.synchronize()
if "--once" in sys.argv:
    cp.cuda.runtime.profilerStart()
    ours()
    cp.cuda.runtime.deviceSynchronize()
    cudnn()
    torch.cuda.synchronize()
    cp.cuda.runtime.profilerStop()
else:
    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    for name, fn in (("ours", ours), ("cudnn", cudnn)):
        t = time_cuda(fn, warmup=5, repeat=30).median_ms
        print(f"d{d} s{s} {'causal' if causal else 'nc'} {name}: {t:.3f} ms, {flops / t / 1e9:.1f} TFLOP/s")
