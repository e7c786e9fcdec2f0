"""Quick look at the native-bf16 and DLPack paths on a GPU (not a test: tests/test_gpu_native_bf16.py
is): a bf16 forward and backward with CuPy's bfloat16 arrays, then with torch tensors passed
directly, each against the float64 reference; prints dtypes and relative errors."""

import cupy as cp
import ml_dtypes
import numpy as np

from cupy_fmha import attention_backward, attention_forward
from cupy_fmha import reference as R

bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
b, s, h, d = 2, 131, 4, 64
host = [rng.standard_normal((b, s, h, d)).astype(bf16) for _ in range(4)]
q, k, v, do = (cp.asarray(x) for x in host)
print("cupy bf16 input dtype:", q.dtype)
o, lse = attention_forward(q, k, v, causal=True)
g = attention_backward(do, q, k, v, o, lse, causal=True)
ro, _ = R.attention_forward(*(x.astype(np.float64) for x in host[:3]), causal=True)
rg = R.attention_backward(host[3].astype(np.float64), *(x.astype(np.float64) for x in host[:3]), causal=True)


def rel(a, ref):
    a = cp.asnumpy(a).astype(np.float64)
    return np.linalg.norm(a - ref) / np.linalg.norm(ref)


print("o", o.dtype, f"{rel(o, ro):.2e}", "| dq dk dv", [x.dtype for x in g],
      [f"{rel(x, r):.2e}" for x, r in zip(g, rg)])

import torch  # noqa: E402

tq, tk, tv, tdo = (torch.from_dlpack(x) for x in (q, k, v, do))
before = tq.clone()
o2, lse2 = attention_forward(tq, tk, tv, causal=True)
g2 = attention_backward(tdo, tq, tk, tv, o2, lse2, causal=True)
print("torch in:", type(o2).__name__, o2.dtype, "same as cupy:", bool((o2 == o).all()),
      [type(x).__name__ for x in g2], "input unchanged:", bool(torch.equal(before, tq)))
th = torch.randn(b, s, h, d, device="cuda", dtype=torch.float16)
o3, _ = attention_forward(th, th, th)
print("torch fp16:", o3.dtype)
bits = [x.view(cp.uint16) for x in (q, k, v, do)]
o4, lse4 = attention_forward(*bits[:3], causal=True, dtype="bfloat16")
g4 = attention_backward(bits[3], *bits[:3], o4, lse4, causal=True, dtype="bfloat16")
print("uint16 bits:", o4.dtype, [x.dtype for x in g4], "same bits:", bool((o4 == o.view(cp.uint16)).all()))
