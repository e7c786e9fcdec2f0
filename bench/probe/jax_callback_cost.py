"""Host cost of ``cupy_fmha.jax``'s callbacks on the GPU (issue 13; bench/NOTES.md step 25 found
the JAX transformer's step host-bound at about 0.5 ms per callback).

For a tiny attention (default b1 s128 h4 d64 bf16, causal, so the kernels take microseconds) it
times, median of ``--calls`` calls each after a warm-up:

* jitted forward, and jitted forward + backward (``jax.grad``), with ``cupy_fmha.jax.attention``,
  with ``jax.nn.dot_product_attention(implementation="cudnn")``, and with callbacks that do
  nothing (``buffer_callback`` with the same results: JAX's and XLA's own cost of a callback):
  per call, the time until the call returns (dispatch) and until the result is ready;
* inside each of our callbacks (the Python body, timed where XLA calls it): the host time per
  forward and per backward callback;
* the minimum time inside CuPy's kernel call per kernel (argument conversion + driver launch:
  the part no Python of ours can remove);

then prints a cProfile top 20 (by total time) of the callback bodies. ``--repo`` imports
cupy_fmha from another checkout (e.g. ``git archive`` of the tree before a change) to compare
with the same script: the timing wraps ``buffer_callback`` and ``get_function``, which both
trees use. Takes about 20 s once CuPy's kernel cache is warm (the first run compiles the kernels
with NVRTC and reports that time apart).

    python bench/probe/jax_callback_cost.py [--calls 400] [--repo PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400, help="timed calls per program (default 400)")
    ap.add_argument("--shape", default="1,128,4,64", help="batch,seqlen,heads,hdim (default 1,128,4,64)")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]),
                    help="checkout to import cupy_fmha from (default: this one)")
    ap.add_argument("--profile", type=int, default=200, help="forward+backward calls under cProfile (0: none)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.repo)
    t_start = time.perf_counter()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.buffer_callback import buffer_callback

    import cupy_fmha
    from cupy_fmha import api
    from cupy_fmha import jax as fj

    head = subprocess_git(args.repo)
    print(f"cupy_fmha from {cupy_fmha.__file__} ({head}); jax {jax.__version__}; {jax.devices()[0].device_kind}")

    # ---- the timers: inside our callbacks, and inside CuPy's kernel call
    body = {"fwd": [], "bwd": []}
    profile = {"on": False, "prof": cProfile.Profile()}
    real_bc = fj.buffer_callback

    def timed_bc(run, types, **kw):
        kind = "fwd" if len(types) == 2 else "bwd"

        def cb(ctx, out, *buffers):
            if profile["on"]:
                profile["prof"].enable()
            t = time.perf_counter()
            run(ctx, out, *buffers)
            body[kind].append(time.perf_counter() - t)
            if profile["on"]:
                profile["prof"].disable()

        return real_bc(cb, types, **kw)

    fj.buffer_callback = timed_bc
    launch = collections.defaultdict(list)
    real_get = api.get_function

    class Timed:
        def __init__(self, fn, name):
            self.fn, self.name = fn, name

        @property
        def max_dynamic_shared_size_bytes(self):
            return self.fn.max_dynamic_shared_size_bytes

        @max_dynamic_shared_size_bytes.setter
        def max_dynamic_shared_size_bytes(self, v):
            self.fn.max_dynamic_shared_size_bytes = v

        def __call__(self, *a, **k):
            t = time.perf_counter()
            self.fn(*a, **k)
            launch[self.name].append(time.perf_counter() - t)

    wrapped: dict = {}

    def get_function(spec):
        fn = real_get(spec)
        w = wrapped.get(id(fn))
        if w is None or w.fn is not fn:
            w = wrapped[id(fn)] = Timed(fn, spec.source)
        return w

    api.get_function = get_function

    # ---- the programs
    b, s, h, d = (int(x) for x in args.shape.split(","))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.bfloat16) for _ in range(3))

    def loss_of(attn):
        return lambda q, k, v: attn(q, k, v).astype(jnp.float32).sum()

    ours = lambda q, k, v: fj.attention(q, k, v, causal=True)  # noqa: E731
    cudnn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")  # noqa: E731
    o_t, lse_t = jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, s), jnp.float32)

    def nothing(ctx, out, *a):
        return None

    def noop_grad(q, k, v):
        o, lse = buffer_callback(nothing, (o_t, lse_t))(q, k, v)
        return buffer_callback(nothing, (o_t,) * 3)(o, q, k, v, o, lse)

    progs = {
        "cupy fwd": jax.jit(ours),
        "cupy fwd+bwd": jax.jit(jax.grad(loss_of(ours), argnums=(0, 1, 2))),
        "cudnn fwd": jax.jit(cudnn),
        "cudnn fwd+bwd": jax.jit(jax.grad(loss_of(cudnn), argnums=(0, 1, 2))),
        "noop-callback fwd": jax.jit(lambda q, k, v: buffer_callback(nothing, (o_t, lse_t))(q, k, v)),
        "noop-callback fwd+bwd": jax.jit(noop_grad),
    }
    t0 = time.perf_counter()
    for f in progs.values():  # compile (XLA) and, for ours, compile or load the kernels (NVRTC)
        jax.block_until_ready(f(q, k, v))
    warm_s = time.perf_counter() - t0
    print(f"warm-up (XLA compiles, CuPy kernels compiled or loaded): {warm_s:.1f} s")
    g_ours = progs["cupy fwd+bwd"](q, k, v)
    g_ref = progs["cudnn fwd+bwd"](q, k, v)
    err = max(float(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32)).max() /
                    (jnp.abs(r.astype(jnp.float32)).max() + 1e-6)) for a, r in zip(g_ours, g_ref))
    print(f"gradients vs cuDNN: max relative error {err:.2e}")

    res: dict = {"shape": [b, s, h, d], "calls": args.calls, "repo": args.repo, "head": head, "warmup_s": warm_s,
                 "grad_rel_err_vs_cudnn": err, "programs": {}}
    for _ in range(20):
        for f in progs.values():
            f(q, k, v)
    jax.block_until_ready(f(q, k, v))
    for v_ in body.values():
        v_.clear()
    launch.clear()
    print(f"\n{'program':24s} {'dispatch us':>12s} {'ready us':>10s}   (median of {args.calls})")
    for name, f in progs.items():
        disp, ready = [], []
        for _ in range(args.calls):
            t = time.perf_counter()
            out = f(q, k, v)
            t1 = time.perf_counter()
            jax.block_until_ready(out)
            t2 = time.perf_counter()
            disp.append(t1 - t)
            ready.append(t2 - t)
        res["programs"][name] = {"dispatch_us": statistics.median(disp) * 1e6, "ready_us": statistics.median(ready) * 1e6}
        print(f"{name:24s} {res['programs'][name]['dispatch_us']:12.1f} {res['programs'][name]['ready_us']:10.1f}")
    p = res["programs"]
    print("\nper forward+backward call, ours minus cuDNN: "
          f"{p['cupy fwd+bwd']['ready_us'] - p['cudnn fwd+bwd']['ready_us']:.1f} us; "
          f"ours minus do-nothing callbacks: {p['cupy fwd+bwd']['ready_us'] - p['noop-callback fwd+bwd']['ready_us']:.1f} us")
    res["inside_callback_us"] = {}
    for kind, ts in body.items():
        m = {"median": statistics.median(ts) * 1e6, "min": min(ts) * 1e6, "p90": sorted(ts)[int(0.9 * len(ts))] * 1e6,
             "n": len(ts)}
        res["inside_callback_us"][kind] = m
        print(f"inside the {kind} callback: median {m['median']:.1f} us, min {m['min']:.1f}, p90 {m['p90']:.1f} "
              f"({m['n']} calls)")
    res["cupy_launch_min_us"] = {n: min(ts) * 1e6 for n, ts in launch.items()}
    print("inside CuPy's kernel call, min per kernel (us): " +
          ", ".join(f"{n} {t:.1f}" for n, t in res["cupy_launch_min_us"].items()))

    if args.profile:
        f = progs["cupy fwd+bwd"]
        profile["on"] = True
        for _ in range(args.profile):
            jax.block_until_ready(f(q, k, v))
        profile["on"] = False
        st = io.StringIO()
        pstats.Stats(profile["prof"], stream=st).sort_stats("tottime").print_stats(20)
        text = st.getvalue()
        print(f"\ncProfile of the callback bodies over {args.profile} forward+backward calls (tottime, top 20):")
        print(text)
        st = io.StringIO()
        pstats.Stats(profile["prof"], stream=st).sort_stats("cumulative").print_stats(20)
        print("the same by cumulative time:")
        print(st.getvalue())
        res["profile_tottime"] = text
    res["total_s"] = time.perf_counter() - t_start
    print(f"total {res['total_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


def subprocess_git(repo: str) -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or "no git"
    except Exception:  # noqa: BLE001 - an archive without .git
        return "no git"


if __name__ == "__main__":
    main()
