"""One-point timing of our forward/backward against PyTorch SDPA flash (same inputs).

    python bench/quickperf.py --hdim 128 --seqlen 8192 [--causal]
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np

import cupy_fmha
from cupy_fmha.flops import attention_flops
from cupy_fmha.mask import resolve_mask


def bench(fn, warmup=5, rep=20):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(rep):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-peer", action="store_true", help="skip PyTorch")
    a = ap.parse_args()
    d, s = a.hdim, a.seqlen
    b, h = 16384 // s, 2048 // d
    rng = cp.random.default_rng(0)
    mk = lambda *shape: rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)  # noqa: E731
    q, k, v, do = (mk(b, s, h, d) for _ in range(4))
    o, lse = cupy_fmha.attention_forward(q, k, v, causal=a.causal)
    spec = resolve_mask(None, a.causal, (-1, -1))
    ff = attention_flops(b, h, s, s, d, d, spec, "fwd")
    fb = attention_flops(b, h, s, s, d, d, spec, "bwd")
    tf = bench(lambda: cupy_fmha.attention_forward(q, k, v, causal=a.causal))
    tb = bench(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=a.causal))
    line = f"ours fp16 d{d} s{s} causal={a.causal}: fwd {tf:.3f} ms {ff/tf/1e9:.0f} TF/s  bwd {tb:.3f} ms {fb/tb/1e9:.0f} TF/s"
    try:
        if a.no_peer:
            raise RuntimeError("skipped")
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2).requires_grad_(True) for x in (q, k, v, do))
        tdo = tdo.detach()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=a.causal)  # noqa: E731
            tff = bench(fwd)
            out = fwd()
            tbb = bench(lambda: torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True))
        line += f" | torch flash fwd {ff/tff/1e9:.0f} bwd {fb/tbb/1e9:.0f} TF/s"
    except Exception as exc:  # noqa: BLE001
        line += f" | torch: {exc}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
