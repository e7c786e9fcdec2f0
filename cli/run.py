"""Running a checked :class:`~.config.RunConfig`: the backend, the inputs, the timed calls on the
``cupy`` (GPU kernels) or ``numpy`` (the library's reference, ``precision="low"``) backend, and the
verification against the float64 reference.

What is verified: every output element of the problem is produced by the backend, but the float64
reference (dense NumPy, costly on a CPU) runs on a subset of the problem when the whole would be
too slow: the first and last batch, and the first and last K/V head together with all the query
heads of their groups (so GQA group sums are checked). ``--full-check`` checks everything.

With dropout (``--p-drop``), whose keep mask depends on the batch and head indices, each checked
(batch, K/V head group) runs as its own reference problem with the Philox offset moved to where
that block starts in the full problem, so the reference draws exactly the full problem's masks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from cupy_fmha import device

from .config import RunConfig, UsageProblem, cu_seqlens, host_dtype, with_backend

# check everything when b * hq * sq * sk * (d + dv) is at most this (a few seconds of float64)
FULL_CHECK_LIMIT = 2**32

#: device nodes without which no CUDA (or ROCm) GPU can be used on Linux
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


@dataclass(frozen=True)
class Outcome:
    """What a run produced: the timing, the checks (``None`` with ``--no-verify``), what was
    checked and whether it is valid (``None`` when not verified)."""

    timing: Any
    checks: list | None
    checked: dict | None
    valid: bool | None


# ---------------------------------------------------------------------------------------------
# backend


def _gpu_possible() -> bool:
    """False when this is Linux without any GPU device node (no driver loaded): then importing
    CuPy (seconds) to find that out is skipped."""
    if sys.platform != "linux":
        return True
    return any(os.path.exists(p) for p in _GPU_NODES)


def _why_no_gpu() -> str | None:
    """The reason for the ``--backend cupy`` refusal, cheapest check first (importing CuPy takes
    seconds)."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed; install cupy-fmha[cuda13] (or [cuda12])"
    if not _gpu_possible():
        return "no GPU device node on this machine"
    return device.gpu_problem()


def gpu_usable() -> bool:
    return _gpu_possible() and device.gpu_available()


def pick_backend(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its backend resolved: ``auto`` -> cupy when a GPU is usable, else numpy."""
    if cfg.backend == "cupy" and not gpu_usable():
        why = _why_no_gpu()
        raise UsageProblem(f"--backend cupy: no usable CUDA GPU was found{f' ({why})' if why else ''}; "
                           "use --backend numpy (or auto)")
    if cfg.backend == "auto":
        return with_backend(cfg, "cupy" if gpu_usable() else "numpy")
    if cfg.backend not in ("cupy", "numpy"):
        raise UsageProblem(f"--backend: expected auto, cupy or numpy, got {cfg.backend!r}")
    return with_backend(cfg, cfg.backend)


# ---------------------------------------------------------------------------------------------
# progress


def _err_console():
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def phase(text: str, enabled: bool):
    """A Rich spinner on stderr while a (possibly long) step runs; only on a terminal."""
    if not enabled:
        yield
        return
    console = _err_console()
    if not console.is_terminal:
        yield
        return
    with console.status(text, spinner="dots"):
        yield


def show_progress() -> bool:
    return sys.stderr.isatty()


# ---------------------------------------------------------------------------------------------
# inputs and the library's keyword arguments


def _shape(layout: str, b: int, s: int, h: int, d: int) -> tuple[int, int, int, int]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def input_shapes(cfg: RunConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of q, k, v (and do for bwd) as the run draws them."""
    if cfg.group:  # packed [total, heads, dim]
        tq, tk = sum(cfg.seqlens_q), sum(cfg.seqlens_k)
        shapes = {"q": (tq, cfg.nhead, cfg.hdim), "k": (tk, cfg.nhead_k, cfg.hdim),
                  "v": (tk, cfg.nhead_k, cfg.hdim_v)}
        if cfg.mode == "bwd":
            shapes["do"] = (tq, cfg.nhead, cfg.hdim_v)
        return shapes
    b, lay = cfg.batch, cfg.layout
    shapes = {
        "q": _shape(lay, b, cfg.seqlen_q, cfg.nhead, cfg.hdim),
        "k": _shape(lay, b, cfg.seqlen_k, cfg.nhead_k, cfg.hdim),
        "v": _shape(lay, b, cfg.seqlen_k, cfg.nhead_k, cfg.hdim_v),
    }
    if cfg.mode == "bwd":
        shapes["do"] = _shape(lay, b, cfg.seqlen_q, cfg.nhead, cfg.hdim_v)
    return shapes


def make_inputs(cfg: RunConfig) -> dict[str, np.ndarray]:
    """Fixed-seed standard normal draws, rounded to the input dtype (dO too; the elementwise
    bias, when on, under key ``bias`` from its own stream; in group mode its sequence dimensions
    are the max lengths and sequence i uses the top-left corner of plane i)."""
    rng = np.random.default_rng(cfg.seed)
    hd = host_dtype(cfg.dtype)
    inputs = {n: rng.standard_normal(s, dtype=np.float32).astype(hd)
              for n, s in input_shapes(cfg).items()}
    if cfg.bias_shape is not None:
        brng = np.random.default_rng([cfg.seed, 1])
        inputs["bias"] = brng.standard_normal(cfg.bias_shape, dtype=np.float32).astype(hd)
    return inputs


def bias_kwargs(cfg: RunConfig, inputs: dict, batches=None, heads=None) -> dict[str, Any]:
    """``bias=`` (and ``return_dbias=``) for the library, optionally restricted to some batches
    and query heads (only along the dimensions the bias does not broadcast)."""
    bias = inputs.get("bias")
    if bias is None:
        return {}
    if batches is not None and bias.shape[0] > 1:
        bias = np.take(bias, batches, axis=0)
    if heads is not None and bias.shape[1] > 1:
        bias = np.take(bias, heads, axis=1)
    if isinstance(bias, np.ndarray):  # the reference's copy; device arrays go to the GPU API as they are
        bias = np.ascontiguousarray(bias)
    kw: dict[str, Any] = {"bias": bias}
    if cfg.dbias:
        kw["return_dbias"] = True
    return kw


def alibi_kwargs(cfg: RunConfig, batches=None, heads=None) -> dict[str, Any]:
    """``alibi_slopes=`` for the library, optionally restricted to some batches and query heads."""
    slopes = cfg.alibi_slopes
    if slopes is None:
        return {}
    if heads is not None:
        slopes = np.take(slopes, heads, axis=-1)
    if batches is not None and slopes.ndim == 2:
        slopes = np.take(slopes, batches, axis=0)
    return {"alibi_slopes": np.ascontiguousarray(slopes)}


def dropout_kwargs(cfg: RunConfig, offset: int | None = None) -> dict[str, Any]:
    """``dropout_p=, seed=, offset=`` for the library ({} without dropout); ``offset`` replaces
    the configured counter offset (see :func:`verify`)."""
    if cfg.p_drop == 0.0:
        return {}
    off = cfg.drop_offset if offset is None else offset
    return {"dropout_p": cfg.p_drop, "seed": cfg.drop_seed, "offset": off}


def mask_kwargs(cfg: RunConfig, batches=None) -> dict[str, Any]:
    """Mask, scale and layout keywords for the library (group mode: the cu_seqlens too, of the
    sequences ``batches`` when given, with the full problem's max lengths so that lse shapes
    agree)."""
    kw = {
        "softmax_scale": cfg.scale,
        "causal": cfg.causal,
        "window_size": cfg.window,
        "mask": cfg.mask,
        "layout": cfg.layout,
    }
    if cfg.group:
        lq, lk = cfg.seqlens_q, cfg.seqlens_k
        if batches is not None:
            lq, lk = [lq[b] for b in batches], [lk[b] for b in batches]
        kw.update(cu_seqlens_q=cu_seqlens(lq), cu_seqlens_k=cu_seqlens(lk),
                  max_seqlen_q=cfg.seqlen_q, max_seqlen_k=cfg.seqlen_k)
    return kw


def output_names(cfg: RunConfig) -> tuple[str, ...]:
    if cfg.mode == "fwd":
        return ("o", "lse")
    return ("dq", "dk", "dv", "dbias") if cfg.dbias else ("dq", "dk", "dv")


# ---------------------------------------------------------------------------------------------
# what the float64 reference checks


def _pairs(cfg: RunConfig) -> int:
    """Query-key pairs per head before masking (sum over sequences in group mode)."""
    if cfg.group:
        return sum(a * b for a, b in zip(cfg.seqlens_q, cfg.seqlens_k))
    return cfg.batch * cfg.seqlen_q * cfg.seqlen_k


def check_selection(cfg: RunConfig) -> tuple[list[int], list[int], list[int]]:
    """(batches, q heads, k/v heads) the float64 reference runs on."""
    b, hq, hk = cfg.batch, cfg.nhead, cfg.nhead_k
    work = hq * _pairs(cfg) * (cfg.hdim + cfg.hdim_v)
    # dBias of a bias shared by batches / heads sums over all of them: only the whole is checkable
    dbias_sums = cfg.dbias and cfg.bias in ("e:0", "e:1")
    if cfg.full_check or dbias_sums or work <= FULL_CHECK_LIMIT:
        return list(range(b)), list(range(hq)), list(range(hk))
    group = hq // hk
    batches = sorted({0, b - 1})
    kheads = sorted({0, hk - 1})
    qheads = [g * group + j for g in kheads for j in range(group)]
    return batches, qheads, kheads


def _head_axis(layout: str) -> int:
    return 2 if layout == "bshd" else 1


def _take_packed(x: np.ndarray, lengths, batches: list[int], heads: list[int]) -> np.ndarray:
    """Rows of sequences ``batches`` (in order) and ``heads`` of a packed [total, heads, dim] array."""
    cu = cu_seqlens(lengths)
    rows = np.concatenate([x[cu[b]:cu[b + 1]] for b in batches], axis=0)
    return np.take(rows, heads, axis=1)


def _take(x: np.ndarray, layout: str, batches: list[int], heads: list[int]) -> np.ndarray:
    x = np.take(x, batches, axis=0)
    return np.take(x, heads, axis=_head_axis(layout))


def _take_lse(x: np.ndarray, batches: list[int], heads: list[int]) -> np.ndarray:
    return np.take(np.take(x, batches, axis=0), heads, axis=1)


def _to_host_float(x, bf16_bits: bool) -> np.ndarray:
    """Device or host array -> float64 NumPy (bf16 bit patterns decoded)."""
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()
    x = np.asarray(x)
    if bf16_bits and x.dtype == np.uint16:
        from cupy_fmha import verify

        return np.asarray(verify.bf16_bits_to_float(x), dtype=np.float64)
    return x.astype(np.float64)


# ---------------------------------------------------------------------------------------------
# backends


def run_cupy(cfg: RunConfig, inputs: dict, progress: bool):
    import cupy as cp

    from cupy_fmha import api, timing

    # bf16: CuPy's native bfloat16 where it has one (CuPy 14), else the raw bits as uint16
    bf16 = cfg.dtype == "bf16" and not api._native_bf16(cp)

    def dev(x: np.ndarray):
        return cp.asarray(x.view(np.uint16) if bf16 else x)

    d = {n: dev(x) for n, x in inputs.items()}
    kw = dict(mask_kwargs(cfg), dtype="bfloat16" if bf16 else None, **alibi_kwargs(cfg),
              **bias_kwargs(cfg, d), **dropout_kwargs(cfg))
    bwd_kw = {"deterministic": True} if cfg.deterministic else {}
    for name in ("cu_seqlens_q", "cu_seqlens_k"):  # group mode: on the device once, not per call
        if name in kw:
            kw[name] = cp.asarray(kw[name])
    fkw = {n: x for n, x in kw.items() if n != "return_dbias"}
    with phase("compiling and running the first call...", progress):
        if cfg.mode == "fwd":
            fn = lambda: api.attention_forward(d["q"], d["k"], d["v"], **fkw)  # noqa: E731
            first = fn()
            outs = {"o": first[0], "lse": first[1]}
        else:
            o, lse = api.attention_forward(d["q"], d["k"], d["v"], **fkw)
            fn = lambda: api.attention_backward(  # noqa: E731
                d["do"], d["q"], d["k"], d["v"], o, lse, **kw, **bwd_kw
            )
            g = fn()
            outs = dict(zip(output_names(cfg), g))
        cp.cuda.get_current_stream().synchronize()
    t = timing.time_cuda(
        fn, warmup=cfg.warmup, repeat=cfg.repeat, progress=None if progress else False,
        label=cfg.mode,
    )
    host = {n: _to_host_float(x, bf16) for n, x in outs.items()}
    return t, host


def run_numpy(cfg: RunConfig, inputs: dict, progress: bool):
    from cupy_fmha import reference, timing

    kw = dict(mask_kwargs(cfg), precision="low", **alibi_kwargs(cfg), **bias_kwargs(cfg, inputs),
              **dropout_kwargs(cfg))
    if cfg.mode == "fwd":
        kw.pop("return_dbias", None)
    last: dict[str, Any] = {}
    if cfg.mode == "fwd":

        def fn():
            last.pop("r", None)  # one result alive at a time
            last["r"] = reference.attention_forward(inputs["q"], inputs["k"], inputs["v"], **kw)

    else:

        def fn():
            last.pop("r", None)
            last["r"] = reference.attention_backward(
                inputs["do"], inputs["q"], inputs["k"], inputs["v"], **kw
            )

    # one call: a spinner; several: time_host's own progress bar (never both at once)
    spin = progress and cfg.warmup + cfg.repeat == 1
    with phase(f"running the numpy reference ({cfg.mode}, precision=low)...", spin):
        t = timing.time_host(
            fn,
            warmup=cfg.warmup,
            repeat=cfg.repeat,
            progress=None if progress and not spin else False,
            label=cfg.mode,
        )
    host = {n: np.asarray(x, dtype=np.float64) for n, x in zip(output_names(cfg), last["r"])}
    return t, host


# ---------------------------------------------------------------------------------------------
# verification


def verify(cfg: RunConfig, inputs: dict, outs: dict, progress: bool):
    """Compare the outputs with the float64 reference on the selected batches/heads."""
    from cupy_fmha import reference
    from cupy_fmha import verify as tolerance

    batches, qh, kh = check_selection(cfg)
    lay = cfg.layout
    mode = cfg.mode

    def take(name: str, x: np.ndarray, bs=batches, heads_q=qh, heads_k=kh) -> np.ndarray:
        heads = heads_k if name in ("k", "v", "dk", "dv") else heads_q
        if cfg.group:
            lengths = cfg.seqlens_k if name in ("k", "v", "dk", "dv") else cfg.seqlens_q
            return _take_packed(x, lengths, bs, heads)
        return _take(x, lay, bs, heads)

    sub = {n: take(n, x) for n, x in inputs.items() if n != "bias"}
    kw = dict(mask_kwargs(cfg, batches), **alibi_kwargs(cfg, batches, qh),
              **bias_kwargs(cfg, inputs, batches, qh), **dropout_kwargs(cfg))
    if mode == "fwd":
        kw.pop("return_dbias", None)
    names = output_names(cfg)

    def ref_call(arrays, precision: str, kwargs):
        if mode == "fwd":
            return reference.attention_forward(
                arrays["q"], arrays["k"], arrays["v"], precision=precision, **kwargs
            )
        return reference.attention_backward(
            arrays["do"], arrays["q"], arrays["k"], arrays["v"], precision=precision, **kwargs
        )

    def ref(precision: str):
        if cfg.p_drop == 0.0 or (len(batches) == cfg.batch and len(qh) == cfg.nhead):
            return ref_call(sub, precision, kw)
        # Dropout's keep mask depends on (b, h) through offset + b * nhead_q + h: a subset
        # problem would draw other masks. Each (batch, K/V head group) runs as its own problem
        # with the counter offset moved to where that block starts in the full problem.
        group = cfg.nhead // cfg.nhead_k
        rows = []
        for b in batches:
            parts = []
            for kv_head in kh:
                heads = list(range(kv_head * group, (kv_head + 1) * group))
                piece = {n: take(n, x, [b], heads, [kv_head]) for n, x in inputs.items() if n != "bias"}
                off = (cfg.drop_offset + b * cfg.nhead + kv_head * group) % 2**64
                kwp = dict(mask_kwargs(cfg, [b]), **alibi_kwargs(cfg, [b], heads),
                           **bias_kwargs(cfg, inputs, [b], heads), **dropout_kwargs(cfg, off))
                if mode == "fwd":
                    kwp.pop("return_dbias", None)
                parts.append(ref_call(piece, precision, kwp))
            rows.append(parts)
        out = []
        for n, name in enumerate(names):  # heads side by side, then batches (sequences) one after another
            axis = 1 if name in ("lse", "dbias") else _head_axis(lay)
            out.append(np.concatenate(
                [np.concatenate([np.asarray(part[n]) for part in parts], axis=axis) for parts in rows],
                axis=0))
        return tuple(out)

    with phase("verifying against the float64 reference...", progress):
        r64 = dict(zip(names, ref("float64")))
        # On the numpy backend the output *is* the precision="low" reference: compare it with
        # float64 under the plain tolerance. On cupy, the low reference sets FlashAttention's bar.
        rlow = dict(zip(names, ref("low"))) if cfg.backend == "cupy" else {}
    checks = []
    for name in names:
        if name == "lse":
            out = _take_lse(outs[name], batches, qh)
        elif name == "dbias":  # [b or 1, h or 1, sq, sk]: the subset along what does not broadcast
            out = bias_kwargs(cfg, {"bias": outs[name]}, batches, qh)["bias"]
        else:
            out = take(name, outs[name])
        low = rlow.get(name)
        checks.append(
            tolerance.compare(
                name,
                out,
                np.asarray(r64[name], dtype=np.float64),
                None if low is None else np.asarray(low, dtype=np.float64),
                dtype=cfg.dtype_name,
                hdim_q=cfg.hdim,
                hdim_v=cfg.hdim_v,
            )
        )
    checked = {
        "batches": batches,
        "heads_q": qh,
        "full": len(batches) == cfg.batch and len(qh) == cfg.nhead,
    }
    return checks, checked


# ---------------------------------------------------------------------------------------------
# the run


def execute(cfg: RunConfig) -> Outcome:
    """Draw the inputs, run the backend, verify (unless ``--no-verify``)."""
    progress = show_progress()
    with phase("drawing inputs...", progress):
        inputs = make_inputs(cfg)
    runner = run_cupy if cfg.backend == "cupy" else run_numpy
    t, outs = runner(cfg, inputs, progress)
    if not cfg.verify:
        return Outcome(t, None, None, None)
    checks, checked = verify(cfg, inputs, outs, progress)
    return Outcome(t, checks, checked, all(bool(c.ok) for c in checks))
