"""Host cost of ``cupy_fmha.jax``'s callbacks measured on the CPU (no GPU): JAX's CPU backend runs
the jitted attention and calls the real callbacks with its host buffers; CuPy is the stand-in of
the CPU tests (``tests/fake_cupy.py``) and kernel launches do nothing, while the kernel arguments
are packed as on the GPU (``params.pointer_args`` with CuPy's real ``CPointer``, when it imports).
So what is timed is this library's Python between XLA and the driver: planning, reading the
buffers, the stream, the parameter structs, the tensor maps' lookups (their encoding is replaced).
CuPy's own costs (``from_dlpack``, the driver calls, the launches) are not here: see
``bench/probe/jax_callback_cost.py`` on the GPU.

Prints the median time per call of a jitted forward and forward+backward (b1 s128 h4 d64 bf16,
causal) against the same jitted programs with callbacks that do nothing (JAX's own cost of a
callback), the time per callback by difference, and a cProfile of the callbacks.

    PYTHONPATH=. JAX_PLATFORMS=cpu python bench/probe/jax_callback_cpu.py [--calls 300] [--cc 90]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.buffer_callback import buffer_callback  # noqa: E402

import cupy_fmha  # noqa: E402
import fake_cupy as F  # noqa: E402
from cupy_fmha import api  # noqa: E402
from cupy_fmha import jax as fj  # noqa: E402
from cupy_fmha.backends import tma  # noqa: E402


class _Ctx:  # JAX's CPU backend has no stream: ctx.stream raises there
    stream = 0


def _install(cc: str) -> None:
    """The stand-in CuPy, no-op launches, real CPointer packing where CuPy imports."""
    fake = F.fake_cupy(cc)
    fake.from_dlpack = lambda b: F._fake(np.asarray(b))  # the tree before the change wrapped buffers so
    pool: dict = {}  # CuPy's pool hands back cached blocks; the stand-in's np.zeros would page-fault afresh

    def pooled(shape, dtype=np.float32):
        key = (tuple(np.atleast_1d(shape)) if not isinstance(shape, int) else (shape,), np.dtype(dtype))
        if key not in pool:
            pool[key] = F._fake(np.zeros(key[0], key[1]))
        return pool[key]

    fake.empty = fake.zeros = pooled
    api._cupy = lambda: fake
    api._CC.clear()

    class _Fn:
        max_dynamic_shared_size_bytes = 1 << 20

        def __call__(self, grid, block, args, shared_mem=0):
            pass

    fn = _Fn()
    api.get_function = lambda spec: fn
    tma.encode_tile_map = lambda args: np.zeros(1, np.dtype((np.void, 128)))
    try:
        from cupy.cuda import function

        real = {"CPointer": function.CPointer, "CNumpyArray": function.CNumpyArray}
        api._cupy_function = lambda cp, name: real.get(name)
    except Exception:  # noqa: BLE001 - no CuPy: kernel_args, as the CPU tests do
        pass
    if hasattr(fj, "_address"):  # this tree: addresses from __cuda_array_interface__ (GPU only)
        fj._address = lambda b: np.asarray(b).__array_interface__["data"][0]
        fj._stream_handle = lambda ctx: 0
    else:  # the tree before: cupy.from_dlpack and ExternalStream on `import cupy`
        import types
        import warnings

        class _Ext:
            def __init__(self, handle, *a):
                warnings.warn("ExternalStream is deprecated", DeprecationWarning, stacklevel=2)

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        fake.cuda.ExternalStream = _Ext
        mod = types.ModuleType("fake_cupy_module")
        mod.__dict__.update(vars(fake))
        sys.modules["cupy"] = mod
    real_bc = fj.buffer_callback

    def timed(run, types_, **kw):
        kind = "fwd" if len(types_) == 2 else "bwd"  # (o, lse) or (dq, dk, dv[, dbias])

        def body(ctx, out, *b):
            t = time.perf_counter()
            run(_Ctx(), out, *b)
            BODY[kind].append(time.perf_counter() - t)

        return real_bc(body, types_, **kw)

    fj.buffer_callback = timed


BODY: dict = {"fwd": [], "bwd": []}  # seconds inside each callback, per pass


def _median_us(f, args, calls: int) -> float:
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--cc", default="90", help="compute capability the stand-in reports (90: the TMA kernels)")
    ap.add_argument("--profile", type=int, default=300, help="calls under cProfile (0: none)")
    args = ap.parse_args(argv)
    _install(args.cc)
    print(f"cupy_fmha: {cupy_fmha.__file__}; jax {jax.__version__}; cc {args.cc}")
    b, s, h, d = 1, 128, 4, 64
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))
    fwd = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True))
    grad = jax.jit(jax.grad(lambda q, k, v: fj.attention(q, k, v, causal=True).astype(jnp.float32).sum(),
                            argnums=(0, 1, 2)))
    o_t, lse_t = jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, s), jnp.float32)

    def noop(ctx, out, *a):
        return None

    noop_fwd = jax.jit(lambda q, k, v: buffer_callback(noop, (o_t, lse_t))(q, k, v))

    def _noop_grad(q, k, v):
        o, lse = buffer_callback(noop, (o_t, lse_t))(q, k, v)
        return buffer_callback(noop, (o_t,) * 3)(o, q, k, v, o, lse)

    noop_grad = jax.jit(_noop_grad)
    t = {name: _median_us(f, (q, k, v), args.calls)
         for name, f in (("fwd", fwd), ("noop fwd", noop_fwd), ("fwd+bwd", grad), ("noop fwd+bwd", noop_grad))}
    for name, us in t.items():
        print(f"{name:14s} {us:8.1f} us per call (median of {args.calls})")
    print(f"forward callback by difference: {t['fwd'] - t['noop fwd']:7.1f} us")
    for kind, ts in BODY.items():
        ts = ts[len(ts) // 4:]  # past the first calls (planning, compiling)
        print(f"inside the {kind} callback: median {statistics.median(ts) * 1e6:7.1f} us, "
              f"min {min(ts) * 1e6:7.1f} us ({len(ts)} calls)")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.profile):
            jax.block_until_ready(grad(q, k, v))
        pr.disable()
        st = io.StringIO()
        pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(20)
        print(f"cProfile of {args.profile} forward+backward calls (tottime, top 20):")
        print(st.getvalue())


if __name__ == "__main__":
    main()
