"""Host (Python) time per attention_forward / attention_backward call against the GPU time, at a
short problem where the host could starve the GPU: bf16, batch 16, 16 heads, seqlen 1024."""

import time

import cupy as cp

import cupy_fmha

for d in (64, 128):
    for causal in (False, True):
        q = cp.random.standard_normal((16, 1024, 16, d), dtype=cp.float32).astype(cp.float16)
        do = cp.random.standard_normal(q.shape, dtype=cp.float32).astype(cp.float16)
        o, lse = cupy_fmha.attention_forward(q, q, q, causal=causal)
        for name, fn in (("fwd", lambda: cupy_fmha.attention_forward(q, q, q, causal=causal)),
                         ("bwd", lambda: cupy_fmha.attention_backward(do, q, q, q, o, lse, causal=causal))):
            for _ in range(10):
                fn()
            cp.cuda.Device().synchronize()
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            cp.cuda.Device().synchronize()
            t2 = time.perf_counter()
            print(f"d{d} causal={causal} {name}: host {1e6 * (t1 - t0) / n:.0f} us/call, "
                  f"host+GPU {1e6 * (t2 - t0) / n:.0f} us/call")
