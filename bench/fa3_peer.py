"""FlashAttention-3 as a benchmark peer, in a process of its own: JAX with the ``flash-attn3-jax``
wheel (FlashAttention-3's Hopper kernels behind an XLA FFI call; its published wheels hold head dim
128 only). ``bench/sweep.py --peers ...,fa3`` runs this script once for the grid's hdim-128 points
and merges what it prints; it can also be run alone:

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/fa3_peer.py \\
        --points '[{"dtype": "bfloat16", "hdim": 128, "causal": false, "seqlen": 4096, "batch": 4, "nhead": 16}]'

A separate process because JAX and the CuPy/PyTorch process would otherwise share one GPU's memory
pools and streams. Inputs are bshd (FlashAttention-3's layout), normal random, ``--nsets`` sets
rotated so that L2 does not flatter. The forward is ``flash_mha`` under ``jax.jit``; the backward
is the VJP alone (``jax.vjp`` of the forward, its function jitted with the residuals as arguments,
so only FlashAttention-3's backward runs).

Timing: JAX gives no CUDA events on its stream, so each measurement is the wall time of a burst of
``--burst`` calls dispatched back to back (asynchronously) and one ``block_until_ready`` at its end,
divided by the burst; the median (and min) over ``--repeat`` bursts after ``--warmup`` calls. The
one dispatch latency and the final synchronization a burst carries (tens of microseconds) spread
over its calls. Not the same method as the CUDA-event medians of ``ours`` and the SDPA peers: read
differences of a few percent at the shortest points with that in mind.

Output: one JSON object on stdout (and in ``--out``): ``available`` (false with ``error`` when JAX
or the wheel cannot be imported or finds no GPU), ``version``, ``method`` and ``results``, one
entry per point with ``fwd_ms`` / ``bwd_ms`` (medians), ``fwd_min_ms`` / ``bwd_min_ms``, or
``fwd_error`` / ``bwd_error``. Points at other head dims are answered with an error, not timed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

METHOD = "wall time of bursts of async calls / burst (jax.block_until_ready at each burst's end), median over bursts"
HDIMS = (128,)  # the published wheels' only head dim


def _err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:160] if msg else ''}"


def burst_time(block, call, args: list, warmup: int, repeat: int, burst: int) -> dict:
    """Median / min milliseconds per call of ``call(*args[i % len(args)])`` (see the module doc)."""
    n = len(args)
    out = None
    for i in range(max(warmup, 1)):
        out = call(*args[i % n])
    block(out)
    per_call = []
    for r in range(repeat):
        t0 = time.perf_counter()
        for i in range(burst):
            out = call(*args[(r * burst + i) % n])
        block(out)
        per_call.append((time.perf_counter() - t0) / burst * 1e3)
    return {"median_ms": statistics.median(per_call), "min_ms": min(per_call), "samples": len(per_call)}


def measure(jax, jnp, flash_mha, point: dict, modes: set, args) -> dict:
    """One point: its forward and backward times (or errors)."""
    res: dict = {k: point[k] for k in ("dtype", "hdim", "causal", "seqlen", "batch", "nhead")}
    if point["hdim"] not in HDIMS:
        for m in modes:
            res[f"{m}_error"] = f"flash-attn3-jax's wheel holds head dim {HDIMS[0]} only"
        return res
    dt = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}[point["dtype"]]
    shape = (point["batch"], point["seqlen"], point["nhead"], point["hdim"])
    scale = 1.0 / math.sqrt(point["hdim"])
    causal = bool(point["causal"])
    key = jax.random.PRNGKey(args.seed)
    sets = []
    for _ in range(args.nsets):
        key, *ks = jax.random.split(key, 5)
        sets.append(tuple(jax.random.normal(k, shape, jnp.float32).astype(dt) for k in ks))

    def attn(q, k, v):
        return flash_mha(q, k, v, softmax_scale=scale, is_causal=causal)

    if "fwd" in modes:
        try:
            fwd = jax.jit(attn)
            res["fwd"] = burst_time(jax.block_until_ready, fwd, [s[:3] for s in sets], args.warmup, args.repeat,
                                    args.burst)
        except Exception as exc:  # noqa: BLE001 - a failing point is reported, the others still run
            res["fwd_error"] = _err(exc)
    if "bwd" in modes:
        try:
            bwd = jax.jit(lambda vjp_fn, do: vjp_fn(do))
            calls = []
            for q, k, v, do in sets:
                _, vjp_fn = jax.vjp(attn, q, k, v)
                calls.append((vjp_fn, do))
            res["bwd"] = burst_time(jax.block_until_ready, bwd, calls, args.warmup, args.repeat, args.burst)
            del calls
        except Exception as exc:  # noqa: BLE001
            res["bwd_error"] = _err(exc)
    for m in ("fwd", "bwd"):
        if m in res:
            t = res.pop(m)
            res[f"{m}_ms"], res[f"{m}_min_ms"] = t["median_ms"], t["min_ms"]
    del sets
    return res


def run(points: list, modes: set, args) -> dict:
    doc: dict = {"available": False, "method": METHOD, "burst": args.burst, "repeat": args.repeat, "results": []}
    try:
        import jax
        import jax.numpy as jnp
        from flash_attn3_jax import __version__ as version, flash_mha

        if not any(d.platform == "gpu" for d in jax.devices()):
            raise RuntimeError(f"JAX sees no GPU ({jax.devices()})")
    except Exception as exc:  # noqa: BLE001 - no JAX, no wheel, no GPU: the sweep goes on without the peer
        doc["error"] = _err(exc)
        return doc
    doc.update(available=True, version=version, jax=jax.__version__)
    for p in points:
        doc["results"].append(measure(jax, jnp, flash_mha, p, modes, args))
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", required=True,
                    help="JSON list of points: dtype (bfloat16|float16), hdim, causal, seqlen, batch, nhead")
    ap.add_argument("--modes", default="fwd,bwd", help="fwd, bwd or both, comma-separated")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7, help="bursts (median reported)")
    ap.add_argument("--burst", type=int, default=10, help="calls per burst")
    ap.add_argument("--nsets", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        points = json.loads(args.points)
        assert isinstance(points, list) and all(isinstance(p, dict) for p in points)
    except Exception:  # noqa: BLE001
        ap.error("--points: expected a JSON list of objects")
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    if not modes or not modes <= {"fwd", "bwd"}:
        ap.error(f"--modes: expected fwd, bwd or both, got {args.modes!r}")
    for p in points:
        missing = {"dtype", "hdim", "causal", "seqlen", "batch", "nhead"} - set(p)
        if missing:
            ap.error(f"--points: a point lacks {sorted(missing)}")
        if p["dtype"] not in ("bfloat16", "float16"):
            ap.error(f"--points: dtype must be bfloat16 or float16, got {p['dtype']!r}")
    doc = run(points, modes, args)
    text = json.dumps(doc)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
