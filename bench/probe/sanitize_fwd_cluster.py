"""Small clustered ws forwards (CLUSTER=2, step 85) for compute-sanitizer: two and four row blocks
(one and two per CTA), keys ending inside a tile and fewer keys than a tile, GQA, ALiBi, hdim 64 /
128 / 256, fp16 and bf16; each call checks that the plan took the clustered build.

    compute-sanitizer --tool racecheck python3 bench/probe/sanitize_fwd_cluster.py
"""

import inspect
import os

import cupy as cp
import ml_dtypes

import cupy_fmha
from cupy_fmha import plan as P

rng = cp.random.default_rng(0)
KW = {n: p.default for n, p in inspect.signature(cupy_fmha.attention_forward).parameters.items()
      if p.default is not inspect.Parameter.empty and n not in ("bias", "alibi_slopes", "out")}


def run(d, dtype, sq, sk, hq=2, hk=2, persist=0, **kw):
    os.environ["CUPY_FMHA_FWD_WS_TILES"] = f"CLUSTER=2,PERSIST={persist}"
    q = rng.standard_normal((1, sq, hq, d), dtype=cp.float32).astype(dtype)
    k, v = (rng.standard_normal((1, sk, hk, d), dtype=cp.float32).astype(dtype) for _ in range(2))
    spec = P.plan_forward(q, k, v, cc=lambda: 90, **{**KW, **kw}).spec
    assert spec.macro("CLUSTER") == 2, spec.name
    cupy_fmha.attention_forward(q, k, v, **kw)
    cp.cuda.Device().synchronize()


for d in (64, 128, 256):
    bm = 192 if d == 64 else 128
    for dtype in (cp.float16, ml_dtypes.bfloat16):
        run(d, dtype, 2 * bm - 1, 161)
        run(d, dtype, 4 * bm, 300, persist=2)
        run(d, dtype, 2 * bm, 37, hq=4, hk=2)
        run(d, dtype, 2 * bm, 200, alibi_slopes=cp.asarray([0.5, 0.25], dtype=cp.float32))
print("ok")
