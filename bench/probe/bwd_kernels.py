"""Per-kernel breakdown of one backward call, ours against PyTorch's flash backend, on the same
inputs (fp16, hdim 128, batch 2, 16 heads). Arguments: [seqlen (default 8192)] [causal|nc]
[--once]. Without --once it prints the end-to-end medians (CUDA events) of both; with --once it
only warms up, for Nsight Compute to time each kernel:

    python3 bench/probe/bwd_kernels.py 8192
    ncu --metrics gpu__time_duration.sum python3 bench/probe/bwd_kernels.py 8192 nc --once
"""

import sys

import cupy as cp
import torch

import cupy_fmha
from cupy_fmha.timing import time_cuda

b, h, s, d = 2, 16, int(sys.argv[1]) if len(sys.argv) > 1 else 8192, 128
causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
q, k, v, do = (cp.random.standard_normal((b, s, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2).requires_grad_(x is not do) for x in (q, k, v, do))
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
ours = lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal)
flash = lambda: torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)
for _ in range(3):
    ours(); flash()
torch.cuda.synchronize()
if "--once" not in sys.argv:
    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    for name, fn in (("ours", ours), ("flash", flash)):
        t = time_cuda(fn, warmup=5, repeat=30).median_ms
        print(f"{name}: {t:.3f} ms, {flops / t / 1e9:.1f} TFLOP/s")
