"""The varlen forward's cost per call, back to back (bench/NOTES.md row 134): batch mode against group mode with
CuPy cu_seqlens (read on the host with .get(), which waits for the stream), NumPy cu_seqlens (no read from the
device), and NumPy with max_seqlen_q/k given. bf16, batch 4, 16 heads, equal lengths; CUDA events around 20 calls.

    python bench/probe/varlen_host.py [HDIM] [SEQLEN]

If the CuPy row is slower than the others by about the host's planning time, the host read is the cost.
"""
import sys
import time

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
s = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
b, h = 4, 16
q = cp.asarray(np.random.default_rng(0).standard_normal((b, s, h, d), np.float32).astype(ml_dtypes.bfloat16))
qt = q.reshape(b * s, h, d)
cu_np = np.arange(0, b * s + 1, s, dtype=np.int32)
cu_cp = cp.asarray(cu_np)
cases = {
    "batch (bshd)": lambda: cupy_fmha.attention_forward(q, q, q),
    "varlen, CuPy cu_seqlens": lambda: cupy_fmha.attention_forward(qt, qt, qt, layout="thd", cu_seqlens_q=cu_cp,
                                                                   cu_seqlens_k=cu_cp),
    "varlen, NumPy cu_seqlens": lambda: cupy_fmha.attention_forward(qt, qt, qt, layout="thd", cu_seqlens_q=cu_np,
                                                                    cu_seqlens_k=cu_np),
    "varlen, NumPy + max_seqlen": lambda: cupy_fmha.attention_forward(qt, qt, qt, layout="thd", cu_seqlens_q=cu_np,
                                                                      cu_seqlens_k=cu_np, max_seqlen_q=s,
                                                                      max_seqlen_k=s),
}
print(f"bf16 b{b} h{h} s{s} d{d}; {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
for rnd in range(2):
    for name, f in cases.items():
        for _ in range(3):
            f()
        cp.cuda.Device().synchronize()
        n = 20
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        e0.record()
        for _ in range(n):
            f()
        e1.record()
        e1.synchronize()
        t1 = time.perf_counter()
        print(f"round {rnd} {name:28s} GPU {cp.cuda.get_elapsed_time(e0, e1) / n:.3f} ms a call, "
              f"host {(t1 - t0) / n * 1e3:.3f} ms a call")
