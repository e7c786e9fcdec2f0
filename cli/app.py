"""``cupy-fmha``: correctness and speed runs of the fused attention forward and backward.

Commands:

* ``cupy-fmha fwd``  time the forward, check O and LSE against the float64 reference.
* ``cupy-fmha bwd``  time the backward (dq_dk_dv pipeline), check dQ, dK, dV.
* ``cupy-fmha info`` describe the device and software stack.

Each ``fwd``/``bwd`` run prints one summary line (or one JSON object with ``--json``) and exits
with status 0 when valid, 1 when a check fails, 2 on a bad argument.

Backends: ``cupy`` runs the GPU kernels; ``numpy`` runs the library's reference in its
``precision="low"`` mode (a plain same-precision implementation) and checks it through the same
path, so the command line works on machines without a GPU. ``auto`` picks ``cupy`` when a GPU
is usable.

What is verified: every output element of the problem is produced by the backend, but the float64
reference (dense NumPy, costly on a CPU) runs on a subset of the problem when the whole would be
too slow: the first and last batch, and the first and last K/V head together with all the query
heads of their groups (so GQA group sums are checked). ``--full-check`` checks everything. The
JSON output lists the batches and query heads checked. With dropout (``--p-drop``), whose keep
mask depends on the batch and head indices, each checked (batch, K/V head group) runs as its own
reference problem with the Philox offset moved to where that block starts in the full problem, so
the reference draws exactly the full problem's masks.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any, Optional

import numpy as np
import typer
from typer.core import TyperGroup

try:
    from typing import Annotated
except ImportError:  # pragma: no cover
    from typing_extensions import Annotated

from cupy_fmha import device


def _exception_classes(name: str) -> tuple[type, ...]:
    """``name`` from Typer's vendored Click (Typer >= 0.20), Typer itself and the click package,
    whichever exist: a usage error may come from any of them depending on the Typer version."""
    found = []
    for mod in ("typer._click.exceptions", "typer.exceptions", "typer", "click.exceptions"):
        try:
            cls = getattr(__import__(mod, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


_ClickException = _exception_classes("ClickException")
_NoArgsIsHelpError = _exception_classes("NoArgsIsHelpError")
_Abort = _exception_classes("Abort")

PROG = "cupy-fmha"

# Defaults shared by fwd and bwd: a meaningful, quick job on a GPU that the numpy backend also
# finishes in about half a minute on 2 CPU cores.
DEFAULT_BATCH = 2
DEFAULT_NHEAD = 16
DEFAULT_SEQLEN = 2048
DEFAULT_HDIM = 128
DEFAULT_DTYPE = "bf16"
# warm-up / timed calls when not given: (cupy, numpy)
DEFAULT_WARMUP = {"cupy": 5, "numpy": 0}
DEFAULT_REPEAT = {"cupy": 20, "numpy": 1}
# check everything when b * hq * sq * sk * (d + dv) is at most this (a few seconds of float64)
FULL_CHECK_LIMIT = 2**32

_DTYPES = {
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}


class UsageProblem(Exception):
    """A bad option value found by the command line itself."""


def _err(msg: str) -> None:
    msg = " ".join(str(msg).split())  # exactly one line
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    sys.stderr.flush()


def _notice(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")
    sys.stderr.flush()


class _OneLineErrors(TyperGroup):
    """Typer group whose usage errors are one line on stderr (exit 2), not a Rich panel."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except _NoArgsIsHelpError as e:
            if not standalone_mode:
                raise
            e.show()
            sys.exit(0)
        except _ClickException as e:
            if not standalone_mode:
                raise
            _err(e.format_message())
            sys.exit(e.exit_code)
        except _Abort:
            if not standalone_mode:
                raise
            _err("aborted")
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name=PROG,
    help="Fused multi-head attention (forward and backward) for CuPy: correctness and speed runs.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["--help"]},
)


# ---------------------------------------------------------------------------------------------
# options shared by fwd and bwd

BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="Batch size.")]
NheadOpt = Annotated[int, typer.Option("--nhead", help="Number of query heads.")]
NheadKOpt = Annotated[
    Optional[int],
    typer.Option("--nhead-k", help="Number of K/V heads (GQA/MQA); default = --nhead."),
]
SeqQOpt = Annotated[int, typer.Option("--seqlen-q", "-s", help="Query sequence length.")]
SeqKOpt = Annotated[
    Optional[int], typer.Option("--seqlen-k", help="Key sequence length; default = --seqlen-q.")
]
HdimOpt = Annotated[int, typer.Option("--hdim", "-d", help="Head dim of Q and K.")]
HdimVOpt = Annotated[
    Optional[int], typer.Option("--hdim-v", help="Head dim of V and O; default = --hdim.")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="fp16 or bf16.")]
LayoutOpt = Annotated[
    str, typer.Option("--layout", help="bshd (batch, seq, head, dim) or bhsd (batch, head, seq, dim).")
]
MaskOpt = Annotated[
    Optional[str],
    typer.Option(
        "--mask",
        "-m",
        help="CK mask string: 0, t, b, t:l,r, b:l,r, xt:w, xb:w, g:y,x (t/b = top-left/"
        "bottom-right causal).",
    ),
]
CausalOpt = Annotated[
    bool, typer.Option("--causal", help="FlashAttention-style causal (bottom-right aligned).")
]
WindowOpt = Annotated[
    Optional[str],
    typer.Option(
        "--window",
        help="FlashAttention-style sliding window 'L,R' (-1 = unlimited), bottom-right aligned.",
    ),
]
BiasOpt = Annotated[
    str,
    typer.Option(
        "--bias",
        help="n: none; a or a:0: ALiBi slopes [nhead]; a:1: ALiBi slopes [batch, nhead] (CK's "
        "names). Elementwise bias (e, e:0, e:1, e:2) is not supported on the GPU yet.",
    ),
]
PDropOpt = Annotated[
    float,
    typer.Option("--p-drop", help="Dropout probability in [0, 1) on the attention weights (CK's -p_drop)."),
]
DropSeedOpt = Annotated[
    int, typer.Option("--drop-seed", help="Dropout Philox seed, an integer in [0, 2**64).")
]
DropOffsetOpt = Annotated[
    int, typer.Option("--drop-offset", help="Dropout Philox counter offset, an integer in [0, 2**64).")
]
ScaleOpt = Annotated[
    Optional[float], typer.Option("--scale", help="Softmax scale; default 1/sqrt(hdim).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the normal input draws (not dropout's: --drop-seed).")]
WarmupOpt = Annotated[
    Optional[int],
    typer.Option("--warmup", help="Untimed calls first (default: 5 on cupy, 0 on numpy)."),
]
RepeatOpt = Annotated[
    Optional[int],
    typer.Option("--repeat", help="Timed calls; the median is reported (default: 20 / 1)."),
]
VerifyOpt = Annotated[
    bool, typer.Option("--verify/--no-verify", help="Check against the float64 reference.")
]
FullCheckOpt = Annotated[
    bool,
    typer.Option(
        "--full-check",
        help="Run the float64 reference on every batch and head (default: a subset on large "
        "problems: first/last batch, first/last K/V head group).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead.")]
BackendOpt = Annotated[
    str,
    typer.Option("--backend", help="auto, cupy or numpy (auto = cupy when a GPU is usable)."),
]


# ---------------------------------------------------------------------------------------------
# helpers


def _err_console():
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def _phase(text: str, enabled: bool):
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


def _show_progress(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


def _parse_window(text: Optional[str]) -> tuple[int, int]:
    if text is None:
        return (-1, -1)
    parts = text.replace(" ", "").split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise UsageProblem(f"--window: expected 'L,R' (two integers, -1 = unlimited), got {text!r}")


def _positive(name: str, value: int) -> int:
    if value is None or int(value) < 1:
        raise UsageProblem(f"{name}: must be a positive integer, got {value}")
    return int(value)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    v = str(value).strip().lower()
    if v not in allowed:
        raise UsageProblem(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    return v


def _host_dtype(dtype: str):
    if dtype == "fp16":
        return np.dtype(np.float16)
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _shape(layout: str, b: int, s: int, h: int, d: int) -> tuple[int, int, int, int]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def _make_inputs(cfg: dict, mode: str) -> dict[str, np.ndarray]:
    """Fixed-seed standard normal draws, rounded to the input dtype (dO too)."""
    rng = np.random.default_rng(cfg["seed"])
    hd = _host_dtype(cfg["dtype"])
    b, lay = cfg["batch"], cfg["layout"]
    shapes = {
        "q": _shape(lay, b, cfg["seqlen_q"], cfg["nhead"], cfg["hdim"]),
        "k": _shape(lay, b, cfg["seqlen_k"], cfg["nhead_k"], cfg["hdim"]),
        "v": _shape(lay, b, cfg["seqlen_k"], cfg["nhead_k"], cfg["hdim_v"]),
    }
    if mode == "bwd":
        shapes["do"] = _shape(lay, b, cfg["seqlen_q"], cfg["nhead"], cfg["hdim_v"])
    return {n: rng.standard_normal(s, dtype=np.float32).astype(hd) for n, s in shapes.items()}


def _alibi_slopes(kind: str | None, batch: int, nhead: int) -> np.ndarray | None:
    """ALiBi slopes for ``--bias a|a:0|a:1``: the usual geometric series 2^(-8 (h+1) / nhead),
    per batch entry scaled by 1 + b/8 for ``a:1`` so that batches differ."""
    if kind is None:
        return None
    base = 2.0 ** (-8.0 * (np.arange(nhead) + 1) / nhead)
    if kind == "a:1":
        base = base[None, :] * (1.0 + np.arange(batch)[:, None] / 8.0)
    return base.astype(np.float32)


def _parse_bias(text: str) -> str | None:
    t = str(text).strip().lower()
    if t in ("n", "0", "none", ""):
        return None
    if t in ("a", "a:0", "a:1"):
        return "a:1" if t == "a:1" else "a:0"
    if t.startswith("e"):
        raise UsageProblem("--bias: elementwise bias (e, e:0, e:1, e:2) is not supported on the GPU "
                           "yet (the NumPy reference has it); use n, a, a:0 or a:1")
    raise UsageProblem(f"--bias: expected n, a, a:0 or a:1, got {text!r}")


def _alibi_kwargs(cfg: dict, batches=None, heads=None) -> dict[str, Any]:
    """``alibi_slopes=`` for the library, optionally restricted to some batches and query heads."""
    slopes = cfg["alibi_slopes"]
    if slopes is None:
        return {}
    if heads is not None:
        slopes = np.take(slopes, heads, axis=-1)
    if batches is not None and slopes.ndim == 2:
        slopes = np.take(slopes, batches, axis=0)
    return {"alibi_slopes": np.ascontiguousarray(slopes)}


def _dropout_kwargs(cfg: dict, offset: int | None = None) -> dict[str, Any]:
    """``dropout_p=, seed=, offset=`` for the library ({} without dropout); ``offset`` replaces
    the configured counter offset (see :func:`_verify`)."""
    if cfg["p_drop"] == 0.0:
        return {}
    off = cfg["drop_offset"] if offset is None else offset
    return {"dropout_p": cfg["p_drop"], "seed": cfg["drop_seed"], "offset": off}


def _mask_kwargs(cfg: dict) -> dict[str, Any]:
    return {
        "softmax_scale": cfg["scale"],
        "causal": cfg["causal"],
        "window_size": cfg["window"],
        "mask": cfg["mask"],
        "layout": cfg["layout"],
    }


def _head_axis(layout: str) -> int:
    return 2 if layout == "bshd" else 1


def _check_selection(cfg: dict, full: bool) -> tuple[list[int], list[int], list[int]]:
    """(batches, q heads, k/v heads) the float64 reference runs on."""
    b, hq, hk = cfg["batch"], cfg["nhead"], cfg["nhead_k"]
    work = b * hq * cfg["seqlen_q"] * cfg["seqlen_k"] * (cfg["hdim"] + cfg["hdim_v"])
    if full or work <= FULL_CHECK_LIMIT:
        return list(range(b)), list(range(hq)), list(range(hk))
    group = hq // hk
    batches = sorted({0, b - 1})
    kheads = sorted({0, hk - 1})
    qheads = [g * group + j for g in kheads for j in range(group)]
    return batches, qheads, kheads


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


def _outputs_names(mode: str) -> tuple[str, ...]:
    return ("o", "lse") if mode == "fwd" else ("dq", "dk", "dv")


# ---------------------------------------------------------------------------------------------
# backends


def _run_cupy(cfg: dict, mode: str, inputs: dict, warmup: int, repeat: int, progress: bool):
    import cupy as cp

    from cupy_fmha import api, timing

    bf16 = cfg["dtype"] == "bf16"

    def dev(x: np.ndarray):
        return cp.asarray(x.view(np.uint16) if bf16 else x)

    d = {n: dev(x) for n, x in inputs.items()}
    kw = dict(_mask_kwargs(cfg), dtype="bfloat16" if bf16 else None, **_alibi_kwargs(cfg),
              **_dropout_kwargs(cfg))
    with _phase("compiling and running the first call...", progress):
        if mode == "fwd":
            fn = lambda: api.attention_forward(d["q"], d["k"], d["v"], **kw)  # noqa: E731
            first = fn()
            outs = {"o": first[0], "lse": first[1]}
        else:
            o, lse = api.attention_forward(d["q"], d["k"], d["v"], **kw)
            fn = lambda: api.attention_backward(  # noqa: E731
                d["do"], d["q"], d["k"], d["v"], o, lse, **kw
            )
            g = fn()
            outs = {"dq": g[0], "dk": g[1], "dv": g[2]}
        cp.cuda.get_current_stream().synchronize()
    t = timing.time_cuda(
        fn, warmup=warmup, repeat=repeat, progress=None if progress else False, label=mode
    )
    host = {n: _to_host_float(x, bf16) for n, x in outs.items()}
    return t, host


def _run_numpy(cfg: dict, mode: str, inputs: dict, warmup: int, repeat: int, progress: bool):
    from cupy_fmha import reference, timing, validate

    # reject what the GPU library would reject (head dims, empty masks, ...), not just what the
    # permissive reference would
    validate.check_forward_inputs(
        inputs["q"], inputs["k"], inputs["v"], **_mask_kwargs(cfg),
        dtype="bfloat16" if cfg["dtype"] == "bf16" else "float16",
    )
    kw = dict(_mask_kwargs(cfg), precision="low", **_alibi_kwargs(cfg), **_dropout_kwargs(cfg))
    last: dict[str, Any] = {}
    if mode == "fwd":

        def fn():
            last["r"] = reference.attention_forward(inputs["q"], inputs["k"], inputs["v"], **kw)

    else:

        def fn():
            last["r"] = reference.attention_backward(
                inputs["do"], inputs["q"], inputs["k"], inputs["v"], **kw
            )

    # one call: a spinner; several: time_host's own progress bar (never both at once)
    spin = progress and warmup + repeat == 1
    with _phase(f"running the numpy reference ({mode}, precision=low)...", spin):
        t = timing.time_host(
            fn,
            warmup=warmup,
            repeat=repeat,
            progress=None if progress and not spin else False,
            label=mode,
        )
    names = _outputs_names(mode)
    host = {n: np.asarray(x, dtype=np.float64) for n, x in zip(names, last["r"])}
    return t, host


def _verify(cfg: dict, mode: str, inputs: dict, outs: dict, backend: str, full: bool,
            progress: bool):
    """Compare the outputs with the float64 reference on the selected batches/heads."""
    from cupy_fmha import reference, verify

    batches, qh, kh = _check_selection(cfg, full)
    kh_list = kh
    lay = cfg["layout"]
    sub = {
        n: _take(x, lay, batches, kh if n in ("k", "v") else qh) for n, x in inputs.items()
    }
    kw = dict(_mask_kwargs(cfg), **_alibi_kwargs(cfg, batches, qh), **_dropout_kwargs(cfg))

    def ref_call(arrays, precision: str, kwargs):
        if mode == "fwd":
            return reference.attention_forward(
                arrays["q"], arrays["k"], arrays["v"], precision=precision, **kwargs
            )
        return reference.attention_backward(
            arrays["do"], arrays["q"], arrays["k"], arrays["v"], precision=precision, **kwargs
        )

    def ref(precision: str):
        if cfg["p_drop"] == 0.0 or (len(batches) == cfg["batch"] and len(qh) == cfg["nhead"]):
            return ref_call(sub, precision, kw)
        # Dropout's keep mask depends on (b, h) through offset + b * nhead_q + h: a subset
        # problem would draw other masks. Each (batch, K/V head group) runs as its own problem
        # with the counter offset moved to where that block starts in the full problem.
        group = cfg["nhead"] // cfg["nhead_k"]
        rows = []
        for b in batches:
            parts = []
            for kh in kh_list:
                heads = list(range(kh * group, (kh + 1) * group))
                piece = {n: _take(x, lay, [b], [kh] if n in ("k", "v") else heads)
                         for n, x in inputs.items()}
                off = (cfg["drop_offset"] + b * cfg["nhead"] + kh * group) % 2**64
                kwp = dict(_mask_kwargs(cfg), **_alibi_kwargs(cfg, [b], heads),
                           **_dropout_kwargs(cfg, off))
                parts.append(ref_call(piece, precision, kwp))
            rows.append(parts)
        out = []
        for n, name in enumerate(_outputs_names(mode)):
            axis = 1 if name == "lse" else _head_axis(lay)
            out.append(np.concatenate(
                [np.concatenate([np.asarray(part[n]) for part in parts], axis=axis) for parts in rows],
                axis=0))
        return tuple(out)

    with _phase("verifying against the float64 reference...", progress):
        r64 = dict(zip(_outputs_names(mode), ref("float64")))
        # On the numpy backend the output *is* the precision="low" reference: compare it with
        # float64 under the plain tolerance. On cupy, the low reference sets FlashAttention's bar.
        rlow = dict(zip(_outputs_names(mode), ref("low"))) if backend == "cupy" else {}
    checks = []
    for name in _outputs_names(mode):
        if name == "lse":
            out = _take_lse(outs[name], batches, qh)
        else:
            out = _take(outs[name], lay, batches, kh if name in ("dk", "dv") else qh)
        low = rlow.get(name)
        checks.append(
            verify.compare(
                name,
                out,
                np.asarray(r64[name], dtype=np.float64),
                None if low is None else np.asarray(low, dtype=np.float64),
                dtype=cfg["dtype_name"],
                hdim_q=cfg["hdim"],
                hdim_v=cfg["hdim_v"],
            )
        )
    checked = {
        "batches": batches,
        "heads_q": qh,
        "full": len(batches) == cfg["batch"] and len(qh) == cfg["nhead"],
    }
    return checks, checked


# ---------------------------------------------------------------------------------------------
# the run


def _config(
    batch, nhead, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, layout, mask, causal, window,
    scale, seed, bias="n", p_drop=0.0, drop_seed=0, drop_offset=0,
) -> dict:
    from cupy_fmha.mask import resolve_mask

    b = _positive("--batch", batch)
    hq = _positive("--nhead", nhead)
    hk = _positive("--nhead-k", hq if nhead_k is None else nhead_k)
    if hq % hk:
        raise UsageProblem(f"--nhead-k: --nhead ({hq}) must be a multiple of --nhead-k ({hk})")
    sq = _positive("--seqlen-q", seqlen_q)
    sk = _positive("--seqlen-k", sq if seqlen_k is None else seqlen_k)
    d = _positive("--hdim", hdim)
    dv = _positive("--hdim-v", d if hdim_v is None else hdim_v)
    dt = _DTYPES.get(str(dtype).strip().lower())
    if dt is None:
        raise UsageProblem(f"--dtype: expected fp16 or bf16, got {dtype!r}")
    lay = _choice("--layout", layout, ("bshd", "bhsd"))
    win = _parse_window(window)
    if scale is not None and not (math.isfinite(scale) and scale != 0):
        raise UsageProblem(f"--scale: must be a finite nonzero number, got {scale}")
    try:
        spec = resolve_mask(mask, causal=causal, window_size=win)
    except ValueError as e:
        raise UsageProblem(_option_names(str(e))) from None
    alibi = _parse_bias(bias)
    from cupy_fmha.validate import check_dropout

    try:
        check_dropout(p_drop, drop_seed, drop_offset)
    except (TypeError, ValueError) as e:
        raise UsageProblem(_option_names(str(e))) from None
    return {
        "p_drop": float(p_drop),
        "drop_seed": int(drop_seed),
        "drop_offset": int(drop_offset),
        "bias": alibi or "n",
        "alibi_slopes": _alibi_slopes(alibi, b, hq),
        "batch": b,
        "nhead": hq,
        "nhead_k": hk,
        "seqlen_q": sq,
        "seqlen_k": sk,
        "hdim": d,
        "hdim_v": dv,
        "dtype": dt,
        "dtype_name": "float16" if dt == "fp16" else "bfloat16",
        "layout": lay,
        "mask": mask,
        "causal": bool(causal),
        "window": win,
        "mask_spec": spec,
        "scale": scale,
        "seed": int(seed),
    }


# the library names its arguments; say which option that is
_ARG_TO_OPTION = {
    "mask": "--mask",
    "window_size": "--window",
    "causal": "--causal",
    "softmax_scale": "--scale",
    "layout": "--layout",
    "dtype": "--dtype",
    "dropout_p": "--p-drop",
    "seed": "--drop-seed",
    "offset": "--drop-offset",
}


def _option_names(msg: str) -> str:
    head, sep, tail = msg.partition(":")
    if sep and head.strip() in _ARG_TO_OPTION:
        return f"{_ARG_TO_OPTION[head.strip()]} ({head.strip()}):{tail}"
    return msg


def _pick_backend(backend: str, quiet: bool) -> str:
    be = _choice("--backend", backend, ("auto", "cupy", "numpy"))
    if be == "cupy" and not device.gpu_available():
        raise UsageProblem(
            "--backend cupy: no usable CUDA GPU (CuPy missing, no device, or the driver failed); "
            "use --backend numpy"
        )
    if be == "auto":
        be = "cupy" if device.gpu_available() else "numpy"
        if be == "numpy":
            _notice("no usable GPU found: running the numpy reference backend (slow)")
    return be


def _fmt_err(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2e}"


def _fmt_rate(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _summary_line(cfg: dict, mode: str, backend: str, t, tflops, gbs, checks, valid) -> str:
    mask = cfg["mask_spec"].describe()
    parts = [
        f"{mode} {cfg['dtype']} {cfg['layout']} b={cfg['batch']} h={cfg['nhead']}/{cfg['nhead_k']}"
        f" sq={cfg['seqlen_q']} sk={cfg['seqlen_k']} d={cfg['hdim']}/{cfg['hdim_v']}"
        f" mask={mask}" + ("" if cfg["bias"] == "n" else f" bias={cfg['bias']}")
        + ("" if cfg["p_drop"] == 0.0 else f" p_drop={cfg['p_drop']:g}") + f" [{backend}]",
        f"{t.median_ms:.3f} ms, {_fmt_rate(tflops)} TFLOP/s, {_fmt_rate(gbs)} GB/s",
    ]
    if checks is not None:
        parts.append(
            " ".join(
                f"{c.name} {_fmt_err(c.max_err)}/{_fmt_err(c.rel_err)}"
                + ("" if c.ok else f" ({getattr(c, 'reason', '') or 'FAIL'})")
                for c in checks
            )
        )
    parts.append("valid: " + ("-" if valid is None else ("y" if valid else "n")))
    return " | ".join(parts)


def _run(mode: str, *, batch, nhead, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, layout,
         mask, causal, window, scale, seed, warmup, repeat, verify_, full_check, json_out,
         backend, bias="n", p_drop=0.0, drop_seed=0, drop_offset=0) -> None:
    from cupy_fmha import flops

    try:
        cfg = _config(batch, nhead, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, layout,
                      mask, causal, window, scale, seed, bias, p_drop, drop_seed, drop_offset)
        be = _pick_backend(backend, json_out)
        warm = DEFAULT_WARMUP[be] if warmup is None else warmup
        rep = DEFAULT_REPEAT[be] if repeat is None else repeat
        if warm < 0:
            raise UsageProblem(f"--warmup: must be >= 0, got {warm}")
        if rep < 1:
            raise UsageProblem(f"--repeat: must be >= 1, got {rep}")
    except UsageProblem as e:
        _err(str(e))
        raise typer.Exit(2)

    progress = _show_progress(False)
    try:
        with _phase("drawing inputs...", progress):
            inputs = _make_inputs(cfg, mode)
        runner = _run_cupy if be == "cupy" else _run_numpy
        t, outs = runner(cfg, mode, inputs, warm, rep, progress)
    except (ValueError, TypeError) as e:  # the library's argument checks
        _err(_option_names(str(e)))
        raise typer.Exit(2)

    checks, checked, valid = None, None, None
    if verify_:
        checks, checked = _verify(cfg, mode, inputs, outs, be, full_check, progress)
        valid = all(bool(c.ok) for c in checks)

    spec = cfg["mask_spec"]
    nflop = flops.attention_flops(
        cfg["batch"], cfg["nhead"], cfg["seqlen_q"], cfg["seqlen_k"], cfg["hdim"], cfg["hdim_v"],
        spec, mode,
    )
    nbytes = flops.attention_bytes(  # by keyword: nhead_k is keyword-only in flops.py
        batch=cfg["batch"], nhead_q=cfg["nhead"], nhead_k=cfg["nhead_k"],
        seqlen_q=cfg["seqlen_q"], seqlen_k=cfg["seqlen_k"], hdim_q=cfg["hdim"],
        hdim_v=cfg["hdim_v"], mode=mode, itemsize=2,
    )
    secs = t.median_ms * 1e-3
    tflops = nflop / secs / 1e12 if secs > 0 else float("inf")
    gbs = nbytes / secs / 1e9 if secs > 0 else float("inf")

    if json_out:
        obj = {
            "mode": mode,
            "backend": be,
            "config": {
                k: cfg[k]
                for k in ("batch", "nhead", "nhead_k", "seqlen_q", "seqlen_k", "hdim", "hdim_v",
                          "dtype", "layout", "mask", "causal", "scale", "seed", "bias", "p_drop",
                          "drop_seed", "drop_offset")
            },
            "window": list(cfg["window"]),
            "mask_resolved": spec.describe(),
            "timing": t.as_dict(),
            "warmup": warm,
            "repeat": rep,
            "flops": nflop,
            "bytes": nbytes,
            "tflops": tflops,
            "gbs": gbs,
            "checks": None
            if checks is None
            else [
                {
                    "name": c.name,
                    "max_err": _json_float(c.max_err),
                    "rel_err": _json_float(c.rel_err),
                    "limit": _json_float(c.limit),
                    "ok": bool(c.ok),
                    "reason": getattr(c, "reason", "") or "",
                }
                for c in checks
            ],
            "checked": checked,
            "valid": valid,
        }
        typer.echo(json.dumps(obj))
    else:
        typer.echo(_summary_line(cfg, mode, be, t, tflops, gbs, checks, valid))
    if valid is False:
        raise typer.Exit(1)


def _json_float(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else str(x)


# ---------------------------------------------------------------------------------------------
# commands


@app.command()
def fwd(
    batch: BatchOpt = DEFAULT_BATCH,
    nhead: NheadOpt = DEFAULT_NHEAD,
    nhead_k: NheadKOpt = None,
    seqlen_q: SeqQOpt = DEFAULT_SEQLEN,
    seqlen_k: SeqKOpt = None,
    hdim: HdimOpt = DEFAULT_HDIM,
    hdim_v: HdimVOpt = None,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    layout: LayoutOpt = "bshd",
    mask: MaskOpt = None,
    causal: CausalOpt = False,
    window: WindowOpt = None,
    bias: BiasOpt = "n",
    p_drop: PDropOpt = 0.0,
    drop_seed: DropSeedOpt = 0,
    drop_offset: DropOffsetOpt = 0,
    scale: ScaleOpt = None,
    seed: SeedOpt = 0,
    warmup: WarmupOpt = None,
    repeat: RepeatOpt = None,
    verify: VerifyOpt = True,
    full_check: FullCheckOpt = False,
    json_out: JsonOpt = False,
    backend: BackendOpt = "auto",
) -> None:
    """Time the forward pass and check O and LSE against the float64 reference."""
    _run("fwd", batch=batch, nhead=nhead, nhead_k=nhead_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
         hdim=hdim, hdim_v=hdim_v, dtype=dtype, layout=layout, mask=mask, causal=causal,
         window=window, scale=scale, seed=seed, warmup=warmup, repeat=repeat, verify_=verify,
         full_check=full_check, json_out=json_out, backend=backend, bias=bias, p_drop=p_drop,
         drop_seed=drop_seed, drop_offset=drop_offset)


@app.command()
def bwd(
    batch: BatchOpt = DEFAULT_BATCH,
    nhead: NheadOpt = DEFAULT_NHEAD,
    nhead_k: NheadKOpt = None,
    seqlen_q: SeqQOpt = DEFAULT_SEQLEN,
    seqlen_k: SeqKOpt = None,
    hdim: HdimOpt = DEFAULT_HDIM,
    hdim_v: HdimVOpt = None,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    layout: LayoutOpt = "bshd",
    mask: MaskOpt = None,
    causal: CausalOpt = False,
    window: WindowOpt = None,
    bias: BiasOpt = "n",
    p_drop: PDropOpt = 0.0,
    drop_seed: DropSeedOpt = 0,
    drop_offset: DropOffsetOpt = 0,
    scale: ScaleOpt = None,
    seed: SeedOpt = 0,
    warmup: WarmupOpt = None,
    repeat: RepeatOpt = None,
    verify: VerifyOpt = True,
    full_check: FullCheckOpt = False,
    json_out: JsonOpt = False,
    backend: BackendOpt = "auto",
) -> None:
    """Time the backward pass (dot_do_o, dq_dk_dv, convert_dq) and check dQ, dK, dV."""
    _run("bwd", batch=batch, nhead=nhead, nhead_k=nhead_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
         hdim=hdim, hdim_v=hdim_v, dtype=dtype, layout=layout, mask=mask, causal=causal,
         window=window, scale=scale, seed=seed, warmup=warmup, repeat=repeat, verify_=verify,
         full_check=full_check, json_out=json_out, backend=backend, bias=bias, p_drop=p_drop,
         drop_seed=drop_seed, drop_offset=drop_offset)


@app.command()
def info(json_out: JsonOpt = False) -> None:
    """Describe the GPU (if any), CuPy, CUDA, NVRTC and the kernel cache."""
    d = device.describe()
    if json_out:
        typer.echo(json.dumps(d, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cupy-fmha environment", show_header=True)
    table.add_column("item")
    table.add_column("value")
    for k, v in d.items():
        table.add_row(k, "-" if v is None else str(v))
    Console().print(table)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
