"""wgmma descriptor probe (see probe.cu): python bench/probe/probe.py 0 1 2 ..."""
import numpy as np, cupy as cp, ml_dtypes, os
here = os.path.dirname(os.path.abspath(__file__))
kdir = os.path.join(here, "..", "..", "kernels")
mod = cp.RawModule(code=open(os.path.join(here, "probe.cu")).read(),
                   options=("-std=c++17", "-arch=sm_90a", "-DFMHA_BF16=1", f"-I{os.path.abspath(kdir)}"))
f = mod.get_function("probe")
rng = np.random.default_rng(0)
A = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
B = rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
ref = A.astype(np.float32) @ B.astype(np.float32)
dA, dB = cp.asarray(A.view(np.uint16)), cp.asarray(B.view(np.uint16))
import sys
for mode in [int(x) for x in sys.argv[1:]]:
    D = cp.full((64, 64), cp.nan, dtype=cp.float32)
    f((1,), (128,), (dA, dB, D, np.int32(mode)))
    err = float(np.nanmax(np.abs(D.get() - ref))) if not np.isnan(D.get()).all() else float("nan")
    print("mode", mode, "maxerr", err, "nan" if np.isnan(D.get()).any() else "")
