"""The elementwise-bias backward at hdim 128 on the ws kernel (its BIAS build spills ~80 B of
registers offline, so cupy_fmha.backends.cuda.BWD_WS_BIAS_HDIMS keeps it on fmha_bwd_dq_dk_dv_sm90)
against the default: times (medians of 15, ms) and the largest difference of dq/dk/dv/dbias between
the two. bf16 b4 h16 s4096 bshd, bias [b,h,s,s] bf16.

    python bench/probe/bias128.py [HDIMS]    (e.g. 128 or 64,128)
"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import cupy_fmha
from cupy_fmha import plan
from cupy_fmha.backends import cuda
from cupy_fmha.timing import time_cuda

hdims = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "128").split(",")]
bf = ml_dtypes.bfloat16
for d in hdims:
    b, s, h = 4, 4096, 16
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal((b, s, h, d), np.float32).astype(bf)) for _ in range(4))
    bias = cp.asarray(rng.standard_normal((b, h, s, s), np.float32).astype(bf))
    for causal in (False, True):
        res = {}
        for tag, hd in (("default", tuple(cuda.BWD_WS_BIAS_HDIMS)), ("ws", (64, 128))):
            cuda.BWD_WS_BIAS_HDIMS = hd
            plan._bwd_specs.cache_clear()
            plan._KERNELS.clear()
            o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal)
            plain = time_cuda(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal),
                              warmup=3, repeat=15).median_ms
            o, lse = cupy_fmha.attention_forward(q, k, v, causal=causal, bias=bias)
            outs = cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, bias=bias, return_dbias=True)
            res[tag] = [cp.asarray(x, cp.float32) for x in outs]
            tb = time_cuda(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, bias=bias),
                           warmup=3, repeat=15).median_ms
            tdb = time_cuda(lambda: cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=causal, bias=bias,
                                                                 return_dbias=True), warmup=3, repeat=15).median_ms
            name = cuda.bwd_specs("bf16", d, d, 90, bias=True, bias_tma=2).dq_dk_dv.name.replace("fmha_bwd_dq_dk_dv_", "")[:50]
            print(f"{tag:8s} d{d} {'causal' if causal else 'nc    '} plain {plain:.3f} bias {tb:.3f} ({tb / plain:.2f}x) "
                  f"bias+dbias {tdb:.3f} ({tdb / plain:.2f}x)  {name}", flush=True)
        diffs = [float(cp.abs(a - c).max()) / max(float(cp.abs(c).max()), 1e-30) for a, c in zip(res["ws"], res["default"])]
        print(f"   d{d} {'causal' if causal else 'nc'}: max |ws - default| / max|default| dq dk dv dbias: "
              + " ".join(f"{x:.2e}" for x in diffs), flush=True)
        cuda.BWD_WS_BIAS_HDIMS = (64,)
