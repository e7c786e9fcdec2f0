"""One PyTorch SDPA call (cuDNN or flash backend) inside a CUDA profiler range, after warm-up, for
Nsight Compute: the peer's kernels profiled the way probe/once.py profiles ours (bshd, batch 1,
16 heads; torch's layout is bhsd views of the same bshd memory, as bench/sweep.py passes them).

    python bench/probe/once_torch.py fwd|bwd HDIM SEQLEN [causal] [cudnn|flash]
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

mode, d, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flags = set(sys.argv[4:])
backend = SDPBackend.FLASH_ATTENTION if "flash" in flags else SDPBackend.CUDNN_ATTENTION
b, h = int(os.environ.get("B", "1")), 16  # B=16 at seqlen 1024: FlashAttention's grid
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2) for _ in range(4))
for t in (q, k, v):
    t.requires_grad_(mode == "bwd")
with sdpa_kernel([backend]):
    def call():
        o = F.scaled_dot_product_attention(q, k, v, is_causal="causal" in flags)
        if mode == "bwd":
            o.backward(do)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
print("ok", mode, d, s, sorted(flags))
