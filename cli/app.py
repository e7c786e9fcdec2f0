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
JSON output lists the batches and query heads checked.

Group mode (``--mode group``, variable-length sequences packed along one axis, layout ``thd``):
``--seqlen-q 100,37,0,250`` gives one length per sequence (the batch is their number; zeros are
allowed), ``--seqlen-k`` the same number of key lengths (default: the query lengths). Masks are
resolved per sequence with its own lengths; the subset check takes the first and last sequence.
An elementwise ``--bias e|e:0|e:1|e:2`` has the longest lengths as its sequence dimensions
(sequence i uses the top-left [seqlen_q_i, seqlen_k_i] corner of its plane), and ``--dbias``
checks dBias in that shape.

With dropout (``--p-drop``), whose keep mask depends on the batch and head indices, each checked
(batch, K/V head group) runs as its own reference problem with the Philox offset moved to where
that block starts in the full problem, so the reference draws exactly the full problem's masks.
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

BatchOpt = Annotated[
    Optional[int],
    typer.Option("--batch", "-b", help="Batch size (default 2; group mode: the number of lengths)."),
]
ModeOpt = Annotated[
    str,
    typer.Option("--mode", help="batch (equal lengths) or group (variable lengths, layout thd)."),
]
NheadOpt = Annotated[int, typer.Option("--nhead", help="Number of query heads.")]
NheadKOpt = Annotated[
    Optional[int],
    typer.Option("--nhead-k", help="Number of K/V heads (GQA/MQA); default = --nhead."),
]
SeqQOpt = Annotated[
    str,
    typer.Option(
        "--seqlen-q",
        "-s",
        help="Query sequence length; group mode: comma list of per-sequence lengths, e.g. "
        "100,37,0,250.",
    ),
]
SeqKOpt = Annotated[
    Optional[str],
    typer.Option(
        "--seqlen-k",
        help="Key sequence length (group mode: a comma list as long as --seqlen-q's); default = "
        "--seqlen-q.",
    ),
]
HdimOpt = Annotated[int, typer.Option("--hdim", "-d", help="Head dim of Q and K.")]
HdimVOpt = Annotated[
    Optional[int], typer.Option("--hdim-v", help="Head dim of V and O; default = --hdim.")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="fp16 or bf16.")]
LayoutOpt = Annotated[
    Optional[str],
    typer.Option(
        "--layout",
        help="bshd (batch, seq, head, dim; the default) or bhsd (batch, head, seq, dim); group "
        "mode: thd (tokens, head, dim), its only layout.",
    ),
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
        # (shapes in parentheses: Rich would read "[batch, nhead]" as markup and drop it)
        help="CK's names. n: none; e or e:0: elementwise bias of shape (1, 1, seqlen_q, seqlen_k); "
        "e:1: (1, nhead, seqlen_q, seqlen_k); e:2: (batch, nhead, seqlen_q, seqlen_k) (normal draws "
        "in the input dtype; group mode: the longest lengths, each sequence reads its top-left "
        "corner); a or a:0: ALiBi slopes of shape (nhead,); a:1: ALiBi slopes (batch, nhead).",
    ),
]
DbiasOpt = Annotated[
    bool,
    typer.Option(
        "--dbias/--no-dbias",
        help="Also compute and check dBias (needs an elementwise --bias e, e:0, e:1 or e:2; with "
        "e:0 and e:1 the whole problem is checked, since dBias sums over batches and heads).",
    ),
]
DeterministicOpt = Annotated[
    bool,
    typer.Option(
        "--deterministic",
        help="Bit-reproducible dQ (per-key-block dQ slabs summed in a fixed order instead of "
        "float atomics; more memory). The numpy backend is deterministic anyway: accepted, no-op.",
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
    """Fixed-seed standard normal draws, rounded to the input dtype (dO too; the elementwise
    bias, when on, under key ``bias`` from its own stream; in group mode its sequence dimensions
    are the max lengths and sequence i uses the top-left corner of plane i)."""
    rng = np.random.default_rng(cfg["seed"])
    hd = _host_dtype(cfg["dtype"])
    b, lay = cfg["batch"], cfg["layout"]
    if cfg["group"]:  # packed [total, heads, dim]
        tq, tk = sum(cfg["seqlens_q"]), sum(cfg["seqlens_k"])
        shapes = {"q": (tq, cfg["nhead"], cfg["hdim"]), "k": (tk, cfg["nhead_k"], cfg["hdim"]),
                  "v": (tk, cfg["nhead_k"], cfg["hdim_v"])}
        if mode == "bwd":
            shapes["do"] = (tq, cfg["nhead"], cfg["hdim_v"])
    else:
        shapes = {
            "q": _shape(lay, b, cfg["seqlen_q"], cfg["nhead"], cfg["hdim"]),
            "k": _shape(lay, b, cfg["seqlen_k"], cfg["nhead_k"], cfg["hdim"]),
            "v": _shape(lay, b, cfg["seqlen_k"], cfg["nhead_k"], cfg["hdim_v"]),
        }
        if mode == "bwd":
            shapes["do"] = _shape(lay, b, cfg["seqlen_q"], cfg["nhead"], cfg["hdim_v"])
    inputs = {n: rng.standard_normal(s, dtype=np.float32).astype(hd) for n, s in shapes.items()}
    if cfg["bias_shape"] is not None:
        brng = np.random.default_rng([cfg["seed"], 1])
        inputs["bias"] = brng.standard_normal(cfg["bias_shape"], dtype=np.float32).astype(hd)
    return inputs


#: --bias e:N -> shape of the elementwise bias (CK's meaning), from (batch, nhead, sq, sk)
_ELEMENTWISE = {
    "e:0": lambda b, h, sq, sk: (1, 1, sq, sk),
    "e:1": lambda b, h, sq, sk: (1, h, sq, sk),
    "e:2": lambda b, h, sq, sk: (b, h, sq, sk),
}


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
    """CK's --bias values -> None, 'e:0', 'e:1', 'e:2', 'a:0' or 'a:1'."""
    t = str(text).strip().lower()
    if t in ("n", "0", "none", ""):
        return None
    if t in ("a", "a:0", "a:1"):
        return "a:1" if t == "a:1" else "a:0"
    if t in ("e", "e:0", "e:1", "e:2"):
        return "e:0" if t == "e" else t
    raise UsageProblem(f"--bias: expected n, e, e:0, e:1, e:2, a, a:0 or a:1, got {text!r}")


def _bias_kwargs(cfg: dict, inputs: dict, batches=None, heads=None) -> dict[str, Any]:
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
    if cfg["dbias"]:
        kw["return_dbias"] = True
    return kw


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


def _cu(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


def _dropout_kwargs(cfg: dict, offset: int | None = None) -> dict[str, Any]:
    """``dropout_p=, seed=, offset=`` for the library ({} without dropout); ``offset`` replaces
    the configured counter offset (see :func:`_verify`)."""
    if cfg["p_drop"] == 0.0:
        return {}
    off = cfg["drop_offset"] if offset is None else offset
    return {"dropout_p": cfg["p_drop"], "seed": cfg["drop_seed"], "offset": off}


def _mask_kwargs(cfg: dict, batches=None) -> dict[str, Any]:
    """Mask, scale and layout keywords for the library (group mode: the cu_seqlens too, of the
    sequences ``batches`` when given, with the full problem's max lengths so that lse shapes
    agree)."""
    kw = {
        "softmax_scale": cfg["scale"],
        "causal": cfg["causal"],
        "window_size": cfg["window"],
        "mask": cfg["mask"],
        "layout": cfg["layout"],
    }
    if cfg["group"]:
        lq, lk = cfg["seqlens_q"], cfg["seqlens_k"]
        if batches is not None:
            lq, lk = [lq[b] for b in batches], [lk[b] for b in batches]
        kw.update(cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk), max_seqlen_q=cfg["seqlen_q"],
                  max_seqlen_k=cfg["seqlen_k"])
    return kw


def _head_axis(layout: str) -> int:
    return 2 if layout == "bshd" else 1


def _pairs(cfg: dict) -> int:
    """Query-key pairs per head before masking (sum over sequences in group mode)."""
    if cfg["group"]:
        return sum(a * b for a, b in zip(cfg["seqlens_q"], cfg["seqlens_k"]))
    return cfg["batch"] * cfg["seqlen_q"] * cfg["seqlen_k"]


def _check_selection(cfg: dict, full: bool) -> tuple[list[int], list[int], list[int]]:
    """(batches, q heads, k/v heads) the float64 reference runs on."""
    b, hq, hk = cfg["batch"], cfg["nhead"], cfg["nhead_k"]
    work = hq * _pairs(cfg) * (cfg["hdim"] + cfg["hdim_v"])
    # dBias of a bias shared by batches / heads sums over all of them: only the whole is checkable
    dbias_sums = cfg["dbias"] and cfg["bias"] in ("e:0", "e:1")
    if full or dbias_sums or work <= FULL_CHECK_LIMIT:
        return list(range(b)), list(range(hq)), list(range(hk))
    group = hq // hk
    batches = sorted({0, b - 1})
    kheads = sorted({0, hk - 1})
    qheads = [g * group + j for g in kheads for j in range(group)]
    return batches, qheads, kheads


def _take_packed(x: np.ndarray, lengths: list[int], batches: list[int], heads: list[int]) -> np.ndarray:
    """Rows of sequences ``batches`` (in order) and ``heads`` of a packed [total, heads, dim] array."""
    cu = _cu(lengths)
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


def _outputs_names(mode: str, cfg: dict | None = None) -> tuple[str, ...]:
    if mode == "fwd":
        return ("o", "lse")
    return ("dq", "dk", "dv", "dbias") if cfg is not None and cfg["dbias"] else ("dq", "dk", "dv")


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
              **_bias_kwargs(cfg, d), **_dropout_kwargs(cfg))
    bwd_kw = {"deterministic": True} if cfg.get("deterministic") else {}
    for name in ("cu_seqlens_q", "cu_seqlens_k"):  # group mode: on the device once, not per call
        if name in kw:
            kw[name] = cp.asarray(kw[name])
    fkw = {n: x for n, x in kw.items() if n != "return_dbias"}
    with _phase("compiling and running the first call...", progress):
        if mode == "fwd":
            fn = lambda: api.attention_forward(d["q"], d["k"], d["v"], **fkw)  # noqa: E731
            first = fn()
            outs = {"o": first[0], "lse": first[1]}
        else:
            o, lse = api.attention_forward(d["q"], d["k"], d["v"], **fkw)
            fn = lambda: api.attention_backward(  # noqa: E731
                d["do"], d["q"], d["k"], d["v"], o, lse, **kw, **bwd_kw
            )
            g = fn()
            outs = dict(zip(_outputs_names(mode, cfg), g))
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
    check = validate.check_varlen_inputs if cfg["group"] else validate.check_forward_inputs
    check(
        inputs["q"], inputs["k"], inputs["v"], **_mask_kwargs(cfg),
        dtype="bfloat16" if cfg["dtype"] == "bf16" else "float16",
    )
    kw = dict(_mask_kwargs(cfg), precision="low", **_alibi_kwargs(cfg), **_bias_kwargs(cfg, inputs),
              **_dropout_kwargs(cfg))
    if mode == "fwd":
        kw.pop("return_dbias", None)
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
    names = _outputs_names(mode, cfg)
    host = {n: np.asarray(x, dtype=np.float64) for n, x in zip(names, last["r"])}
    return t, host


def _verify(cfg: dict, mode: str, inputs: dict, outs: dict, backend: str, full: bool,
            progress: bool):
    """Compare the outputs with the float64 reference on the selected batches/heads."""
    from cupy_fmha import reference, verify

    batches, qh, kh = _check_selection(cfg, full)
    kh_list = kh
    lay = cfg["layout"]

    def take(name: str, x: np.ndarray, bs=batches, heads_q=qh, heads_k=kh) -> np.ndarray:
        heads = heads_k if name in ("k", "v", "dk", "dv") else heads_q
        if cfg["group"]:
            lengths = cfg["seqlens_k"] if name in ("k", "v", "dk", "dv") else cfg["seqlens_q"]
            return _take_packed(x, lengths, bs, heads)
        return _take(x, lay, bs, heads)

    sub = {n: take(n, x) for n, x in inputs.items() if n != "bias"}
    kw = dict(_mask_kwargs(cfg, batches), **_alibi_kwargs(cfg, batches, qh),
              **_bias_kwargs(cfg, inputs, batches, qh), **_dropout_kwargs(cfg))
    if mode == "fwd":
        kw.pop("return_dbias", None)
    names = _outputs_names(mode, cfg)

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
            for kv_head in kh_list:
                heads = list(range(kv_head * group, (kv_head + 1) * group))
                piece = {n: take(n, x, [b], heads, [kv_head]) for n, x in inputs.items() if n != "bias"}
                off = (cfg["drop_offset"] + b * cfg["nhead"] + kv_head * group) % 2**64
                kwp = dict(_mask_kwargs(cfg, [b]), **_alibi_kwargs(cfg, [b], heads),
                           **_bias_kwargs(cfg, inputs, [b], heads), **_dropout_kwargs(cfg, off))
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

    with _phase("verifying against the float64 reference...", progress):
        r64 = dict(zip(names, ref("float64")))
        # On the numpy backend the output *is* the precision="low" reference: compare it with
        # float64 under the plain tolerance. On cupy, the low reference sets FlashAttention's bar.
        rlow = dict(zip(names, ref("low"))) if backend == "cupy" else {}
    checks = []
    for name in names:
        if name == "lse":
            out = _take_lse(outs[name], batches, qh)
        elif name == "dbias":  # [b or 1, h or 1, sq, sk]: the subset along what does not broadcast
            out = _bias_kwargs(cfg, {"bias": outs[name]}, batches, qh)["bias"]
        else:
            out = take(name, outs[name])
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


def _lengths(name: str, text, group: bool) -> list[int]:
    """``--seqlen-q``/``--seqlen-k``: one positive integer (batch mode) or a comma list of
    integers >= 0 (group mode)."""
    parts = str(text).replace(" ", "").split(",")
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        what = "a comma list of integers >= 0" if group else "a positive integer"
        raise UsageProblem(f"{name}: expected {what}, got {text!r}") from None
    if not group:
        if len(vals) != 1:
            raise UsageProblem(f"{name}: a list of lengths ({text!r}) needs --mode group")
        return [_positive(name, vals[0])]
    if any(v < 0 for v in vals):
        raise UsageProblem(f"{name}: lengths must be >= 0, got {text!r}")
    return vals


def _group_lengths(batch, seqlen_q, seqlen_k) -> tuple[list[int], list[int]]:
    lq = _lengths("--seqlen-q", seqlen_q, True)
    lk = lq if seqlen_k is None else _lengths("--seqlen-k", seqlen_k, True)
    if len(lk) != len(lq):
        raise UsageProblem(f"--seqlen-k: {len(lk)} lengths, but --seqlen-q has {len(lq)} (one per sequence)")
    if batch is not None and int(batch) != len(lq):
        raise UsageProblem(f"--batch: {batch} does not match the {len(lq)} lengths of --seqlen-q "
                           "(group mode: the batch is the number of sequences)")
    if sum(lq) == 0 or sum(lk) == 0:
        raise UsageProblem("--seqlen-q/--seqlen-k: group mode needs at least one non-empty query "
                           "sequence and one non-empty key sequence")
    return lq, lk


def _config(
    batch, nhead, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, layout, mask, causal, window,
    scale, seed, bias="n", seq_mode="batch", dbias=False, p_drop=0.0, drop_seed=0, drop_offset=0,
) -> dict:
    from cupy_fmha.mask import resolve_mask

    group = _choice("--mode", seq_mode, ("batch", "group")) == "group"
    if group:
        lq, lk = _group_lengths(batch, seqlen_q, seqlen_k)
        b, sq, sk = len(lq), max(lq), max(lk)
        if layout is not None and str(layout).strip().lower() != "thd":
            raise UsageProblem(f"--layout: group mode packs sequences as thd, got {layout!r}")
        lay = "thd"
    else:
        b = _positive("--batch", DEFAULT_BATCH if batch is None else batch)
        sq = _lengths("--seqlen-q", seqlen_q, False)[0]
        sk = sq if seqlen_k is None else _lengths("--seqlen-k", seqlen_k, False)[0]
        lq = lk = None
        if layout is not None and str(layout).strip().lower() == "thd":
            raise UsageProblem("--layout: thd (packed variable-length sequences) needs --mode group")
        lay = _choice("--layout", "bshd" if layout is None else layout, ("bshd", "bhsd"))
    hq = _positive("--nhead", nhead)
    hk = _positive("--nhead-k", hq if nhead_k is None else nhead_k)
    if hq % hk:
        raise UsageProblem(f"--nhead-k: --nhead ({hq}) must be a multiple of --nhead-k ({hk})")
    d = _positive("--hdim", hdim)
    dv = _positive("--hdim-v", d if hdim_v is None else hdim_v)
    dt = _DTYPES.get(str(dtype).strip().lower())
    if dt is None:
        raise UsageProblem(f"--dtype: expected fp16 or bf16, got {dtype!r}")
    win = _parse_window(window)
    if scale is not None and not (math.isfinite(scale) and scale != 0):
        raise UsageProblem(f"--scale: must be a finite nonzero number, got {scale}")
    try:
        spec = resolve_mask(mask, causal=causal, window_size=win)
    except ValueError as e:
        raise UsageProblem(_option_names(str(e))) from None
    kind = _parse_bias(bias)
    alibi = kind if kind is not None and kind.startswith("a") else None
    elem = kind if kind is not None and kind.startswith("e") else None
    if dbias and elem is None:
        raise UsageProblem(f"--dbias: needs an elementwise bias (--bias e, e:0, e:1 or e:2), got "
                           f"--bias {bias}")
    from cupy_fmha.validate import check_dropout

    try:
        check_dropout(p_drop, drop_seed, drop_offset)
    except (TypeError, ValueError) as e:
        raise UsageProblem(_option_names(str(e))) from None
    return {
        "p_drop": float(p_drop),
        "drop_seed": int(drop_seed),
        "drop_offset": int(drop_offset),
        "bias": kind or "n",
        "alibi_slopes": _alibi_slopes(alibi, b, hq),
        # group mode: [.., max_seqlen_q, max_seqlen_k]; sequence i reads its top-left corner
        "bias_shape": None if elem is None else _ELEMENTWISE[elem](b, hq, sq, sk),
        "dbias": bool(dbias),
        "batch": b,
        "nhead": hq,
        "nhead_k": hk,
        "seqlen_q": sq,  # group mode: the longest sequence
        "seqlen_k": sk,
        "group": group,
        "seqlens_q": lq,  # group mode: one length per sequence; None in batch mode
        "seqlens_k": lk,
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
    "cu_seqlens_q": "--seqlen-q",
    "cu_seqlens_k": "--seqlen-k",
    "dropout_p": "--p-drop",
    "seed": "--drop-seed",
    "offset": "--drop-offset",
}


#: (argument, words in the message) -> option, for errors about a tensor's size or head dim
_TENSOR_TO_OPTION = (
    ("q", "head dim", "--hdim"), ("k", "head dim", "--hdim"), ("v", "head dim", "--hdim-v"),
    ("q", "batch size", "--batch"), ("q", "query heads", "--nhead"),
    ("q", "seqlen", "--seqlen-q"), ("k", "seqlen", "--seqlen-k"),
    ("max_seqlen_q", "seqlen", "--seqlen-q"), ("max_seqlen_k", "seqlen", "--seqlen-k"),
)


def _option_names(msg: str) -> str:
    """An API error message with the CLI option in front of the argument it names."""
    head, sep, tail = msg.partition(":")
    name = head.strip()
    if sep and name in _ARG_TO_OPTION:
        return f"{_ARG_TO_OPTION[name]} ({name}):{tail}"
    for arg, words, option in _TENSOR_TO_OPTION:
        if sep and name == arg and words in tail:
            return f"{option} ({name}):{tail}"
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
    if cfg["group"]:
        sq, sk = (",".join(str(n) for n in cfg[key]) for key in ("seqlens_q", "seqlens_k"))
    else:
        sq, sk = cfg["seqlen_q"], cfg["seqlen_k"]
    parts = [
        f"{mode} {cfg['dtype']} {cfg['layout']} b={cfg['batch']} h={cfg['nhead']}/{cfg['nhead_k']}"
        f" sq={sq} sk={sk} d={cfg['hdim']}/{cfg['hdim_v']}"
        f" mask={mask}" + ("" if cfg["bias"] == "n" else f" bias={cfg['bias']}")
        + ("" if cfg["p_drop"] == 0.0 else f" p_drop={cfg['p_drop']:g}")
        + (" deterministic" if cfg.get("deterministic") else "") + f" [{backend}]",
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


def _work(cfg: dict, mode: str) -> tuple[int, int]:
    """(FLOPs, bytes) of the run; group mode sums the sequences, each with its own lengths."""
    from cupy_fmha import flops

    if cfg["group"]:
        seqs = [(1, a, b) for a, b in zip(cfg["seqlens_q"], cfg["seqlens_k"])]
    else:
        seqs = [(cfg["batch"], cfg["seqlen_q"], cfg["seqlen_k"])]
    nflop = nbytes = 0
    for b, sq, sk in seqs:
        nflop += flops.attention_flops(b, cfg["nhead"], sq, sk, cfg["hdim"], cfg["hdim_v"],
                                       cfg["mask_spec"], mode)
        nbytes += flops.attention_bytes(  # by keyword: nhead_k is keyword-only in flops.py
            batch=b, nhead_q=cfg["nhead"], nhead_k=cfg["nhead_k"], seqlen_q=sq, seqlen_k=sk,
            hdim_q=cfg["hdim"], hdim_v=cfg["hdim_v"], mode=mode, itemsize=2,
        )
    return nflop, nbytes


def _run(mode: str, *, batch, nhead, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, layout,
         mask, causal, window, scale, seed, warmup, repeat, verify_, full_check, json_out,
         backend, bias="n", seq_mode="batch", deterministic=False, dbias=False, p_drop=0.0,
         drop_seed=0, drop_offset=0) -> None:
    try:
        cfg = _config(batch, nhead, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, layout,
                      mask, causal, window, scale, seed, bias, seq_mode, dbias, p_drop, drop_seed, drop_offset)
        if mode == "bwd":
            cfg["deterministic"] = bool(deterministic)
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
    nflop, nbytes = _work(cfg, mode)
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
                          "dtype", "layout", "mask", "causal", "scale", "seed", "bias", "dbias",
                          "deterministic", "p_drop", "drop_seed", "drop_offset")
                if k in cfg
            },
            "seq_mode": "group" if cfg["group"] else "batch",
            "seqlens_q": cfg["seqlens_q"],
            "seqlens_k": cfg["seqlens_k"],
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
    batch: BatchOpt = None,
    nhead: NheadOpt = DEFAULT_NHEAD,
    nhead_k: NheadKOpt = None,
    seqlen_q: SeqQOpt = str(DEFAULT_SEQLEN),
    seqlen_k: SeqKOpt = None,
    hdim: HdimOpt = DEFAULT_HDIM,
    hdim_v: HdimVOpt = None,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    layout: LayoutOpt = None,
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
    seq_mode: ModeOpt = "batch",
) -> None:
    """Time the forward pass and check O and LSE against the float64 reference."""
    _run("fwd", batch=batch, nhead=nhead, nhead_k=nhead_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
         hdim=hdim, hdim_v=hdim_v, dtype=dtype, layout=layout, mask=mask, causal=causal,
         window=window, scale=scale, seed=seed, warmup=warmup, repeat=repeat, verify_=verify,
         full_check=full_check, json_out=json_out, backend=backend, bias=bias, seq_mode=seq_mode,
         p_drop=p_drop, drop_seed=drop_seed, drop_offset=drop_offset)


@app.command()
def bwd(
    batch: BatchOpt = None,
    nhead: NheadOpt = DEFAULT_NHEAD,
    nhead_k: NheadKOpt = None,
    seqlen_q: SeqQOpt = str(DEFAULT_SEQLEN),
    seqlen_k: SeqKOpt = None,
    hdim: HdimOpt = DEFAULT_HDIM,
    hdim_v: HdimVOpt = None,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    layout: LayoutOpt = None,
    mask: MaskOpt = None,
    causal: CausalOpt = False,
    window: WindowOpt = None,
    bias: BiasOpt = "n",
    deterministic: DeterministicOpt = False,
    dbias: DbiasOpt = False,
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
    seq_mode: ModeOpt = "batch",
) -> None:
    """Time the backward pass (dot_do_o, dq_dk_dv, convert_dq) and check dQ, dK, dV (and dBias;
    --deterministic: bit-reproducible dQ, see attention_backward)."""
    _run("bwd", batch=batch, nhead=nhead, nhead_k=nhead_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
         hdim=hdim, hdim_v=hdim_v, dtype=dtype, layout=layout, mask=mask, causal=causal,
         window=window, scale=scale, seed=seed, warmup=warmup, repeat=repeat, verify_=verify,
         full_check=full_check, json_out=json_out, backend=backend, bias=bias, seq_mode=seq_mode,
         deterministic=deterministic, dbias=dbias, p_drop=p_drop, drop_seed=drop_seed,
         drop_offset=drop_offset)


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
