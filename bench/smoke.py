"""Quick GPU check: a handful of shapes against the float64 reference, printed as one line each.

    python bench/smoke.py            # exits non-zero on any failure
"""

from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

import cupy as cp
import cupy_fmha
from cupy_fmha import reference

CASES = [
    # b, sq, sk, hq, hk, d, dv, dtype, layout, mask
    (2, 128, 128, 2, 2, 64, 64, "fp16", "bshd", None),
    (1, 253, 500, 4, 2, 64, 64, "bf16", "bshd", "b"),
    (2, 17, 17, 2, 2, 32, 32, "fp16", "bhsd", "t"),
    (1, 1000, 333, 8, 1, 128, 128, "bf16", "bshd", "b:100,20"),
    (1, 1, 1, 1, 1, 72, 72, "fp16", "bshd", None),
    (1, 300, 300, 2, 2, 256, 256, "bf16", "bshd", "t"),
    (1, 257, 190, 2, 1, 192, 128, "fp16", "bhsd", None),
    (1, 500, 251, 4, 4, 96, 96, "bf16", "bshd", "t:10,5"),
]


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    fin = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), fin):
        return float("nan")
    n = np.linalg.norm(b[fin])
    return float(np.linalg.norm(a[fin] - b[fin]) / (n if n > 0 else 1.0))


def to_host(x, dt):
    x = x.get()
    return x.view(ml_dtypes.bfloat16).astype(np.float64) if dt == "bf16" else x.astype(np.float64)


def main() -> int:
    rng = np.random.default_rng(0)
    bad = 0
    for b, sq, sk, hq, hk, d, dv, dt, layout, mask in CASES:
        npdt = ml_dtypes.bfloat16 if dt == "bf16" else np.float16
        shp = lambda s, h, dd: (b, s, h, dd) if layout == "bshd" else (b, h, s, dd)  # noqa: E731
        q = rng.standard_normal(shp(sq, hq, d)).astype(npdt)
        k = rng.standard_normal(shp(sk, hk, d)).astype(npdt)
        v = rng.standard_normal(shp(sk, hk, dv)).astype(npdt)
        do = rng.standard_normal(shp(sq, hq, dv)).astype(npdt)
        kw = dict(mask=mask, layout=layout)
        dtk = "bfloat16" if dt == "bf16" else None
        dev = [cp.asarray(x.view(np.uint16) if dt == "bf16" else x) for x in (q, k, v, do)]
        t = time.time()
        o, lse = cupy_fmha.attention_forward(*dev[:3], dtype=dtk, **kw)
        g = cupy_fmha.attention_backward(dev[3], *dev[:3], o, lse, dtype=dtk, **kw)
        cp.cuda.Device().synchronize()
        el = time.time() - t
        ro, rl = reference.attention_forward(q, k, v, **kw)
        rdq, rdk, rdv = reference.attention_backward(do, q, k, v, **kw)
        errs = dict(o=rel(to_host(o, dt), ro), lse=rel(lse.get(), rl), dq=rel(to_host(g.dq, dt), rdq),
                    dk=rel(to_host(g.dk, dt), rdk), dv=rel(to_host(g.dv, dt), rdv))
        ok = all(e < 2e-2 for e in errs.values())
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} b{b} sq{sq} sk{sk} h{hq}/{hk} d{d}/{dv} {dt} {layout} mask={mask} "
              + " ".join(f"{k}={v:.2e}" for k, v in errs.items()) + f" ({el:.1f}s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
