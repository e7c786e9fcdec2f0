"""Options -> one frozen, checked :class:`RunConfig`.

The checks are the library's own (:mod:`cupy_fmha.validate`, :mod:`cupy_fmha.mask`), run on
shape-only stand-ins for the arrays before any input exists, so a run is refused for the same
reasons (and at the same limits: head dims, GQA, kernel grid and length limits, masks, scale,
bias, ALiBi, dropout) as the library would refuse it, only earlier. Their messages name the
library's arguments; :func:`option_names` puts the CLI's option names in their place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cupy_fmha import footprint, validate
from cupy_fmha.mask import MaskSpec
from cupy_fmha.philox import check_uint64

from .options import DEFAULT_BATCH, DEFAULT_REPEAT, DEFAULT_WARMUP

__all__ = ["RunConfig", "UsageProblem", "build", "option_names", "with_backend"]

_DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16", "bf16": "bf16",
           "bfloat16": "bf16"}
#: group mode packs the sequences with int32 offsets (cu_seqlens)
INT32_MAX = 2**31 - 1


#: upper bound of --warmup and --repeat (a typo of a few extra digits should not run for hours)
MAX_CALLS = 100_000

class UsageProblem(Exception):
    """A bad option value (or a run this machine cannot hold): one line, exit status 2."""


@dataclass(frozen=True)
class RunConfig:
    """Everything a ``fwd`` / ``bwd`` run needs, checked. Built by :func:`build`; the backend
    (and the warm-up / repeat counts that depend on it) are settled by :func:`with_backend`."""

    mode: str  # "fwd" or "bwd"
    batch: int  # group mode: the number of sequences
    nhead: int
    nhead_k: int
    seqlen_q: int  # group mode: the longest sequence
    seqlen_k: int
    hdim: int
    hdim_v: int
    dtype: str  # "fp16" or "bf16"
    layout: str  # bshd, bhsd; thd in group mode
    mask_spec: MaskSpec
    seqlens_q: tuple[int, ...] | None = None  # group mode: one length per sequence
    seqlens_k: tuple[int, ...] | None = None
    mask: str | None = None  # as given (the library resolves it again)
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    scale: float | None = None
    seed: int = 0
    bias: str = "n"  # n, e:0, e:1, e:2, a:0, a:1
    bias_shape: tuple[int, ...] | None = None  # elementwise bias (group mode: the longest lengths)
    dbias: bool = False
    deterministic: bool = False
    p_drop: float = 0.0
    drop_seed: int = 0
    drop_offset: int = 0
    backend: str = "auto"  # auto until with_backend
    warmup: int | None = None  # None until with_backend: the backend's default
    repeat: int | None = None
    verify: bool = True
    full_check: bool = False
    json: bool = False
    max_memory_gib: float | None = None  # None: the default host limit

    @property
    def group(self) -> bool:
        return self.seqlens_q is not None

    @property
    def seq_mode(self) -> str:
        return "group" if self.group else "batch"

    @property
    def dtype_name(self) -> str:
        return "float16" if self.dtype == "fp16" else "bfloat16"

    @property
    def itemsize(self) -> int:
        return 2

    @property
    def alibi_slopes(self) -> np.ndarray | None:
        """The ALiBi slopes of ``--bias a:0`` / ``a:1`` (made when asked for), or ``None``."""
        return alibi_slopes(self.bias if self.bias.startswith("a") else None, self.batch, self.nhead)

    @property
    def sizes(self) -> footprint.Sizes:
        if self.group:
            return footprint.Sizes.group(self.seqlens_q, self.seqlens_k, self.nhead, self.nhead_k,
                                         self.hdim, self.hdim_v)
        return footprint.Sizes(self.batch, self.nhead, self.nhead_k, self.seqlen_q, self.seqlen_k,
                               self.hdim, self.hdim_v)


# ---------------------------------------------------------------------------------------------
# the library's names -> the CLI's

#: argument -> option, for messages that start with the argument's name
_ARG_TO_OPTION = {
    "mask": "--mask",
    "window_size": "--window",
    "causal": "--causal",
    "softmax_scale": "--scale",
    "layout": "--layout",
    "dtype": "--dtype",
    "cu_seqlens_q": "--seqlen-q",
    "cu_seqlens_k": "--seqlen-k",
    "max_seqlen_q": "--seqlen-q",
    "max_seqlen_k": "--seqlen-k",
    "dropout_p": "--p-drop",
    "seed": "--drop-seed",
    "offset": "--drop-offset",
    "bias": "--bias",
    "alibi_slopes": "--bias",
    "bias, alibi_slopes": "--bias",
}

#: (tensor, words in the message) -> option, for errors about a tensor's size or head dim
_TENSOR_TO_OPTION = (
    ("q", "head dim", "--hdim"), ("k", "head dim", "--hdim"), ("v", "head dim", "--hdim-v"),
    ("q", "batch size", "--batch"), ("q", "query heads", "--nhead"),
    ("k", "number of heads", "--nhead-k"),
    ("q", "seqlen", "--seqlen-q"), ("k", "seqlen", "--seqlen-k"),
)

#: the API's keyword names inside a message
_IN_TEXT = (
    ("causal=/window_size=", "--causal/--window"),
    ("mask=", "--mask"),
    ("causal=True", "--causal"),
    ("causal=", "--causal"),
    ("window_size=", "--window"),
    ("softmax_scale", "scale"),
    ("dropout_p", "--p-drop"),
)


def option_names(msg: str) -> str:
    """A library error message with the CLI's option names: ``mask: give either mask= or
    causal=/window_size=, not both`` -> ``--mask: give either --mask or --causal/--window, not
    both``; ``q: head dim ...`` -> ``--hdim (q): head dim ...``."""
    head, sep, tail = msg.partition(":")
    name = head.strip()
    for old, new in _IN_TEXT:
        tail = tail.replace(old, new)
    if sep and name in _ARG_TO_OPTION:
        return f"{_ARG_TO_OPTION[name]}:{tail}"
    for arg, words, option in _TENSOR_TO_OPTION:
        if sep and name == arg and words in tail:
            return f"{option} ({name}):{tail}"
    return msg


# ---------------------------------------------------------------------------------------------
# parsing


def _positive(name: str, value) -> int:
    if value is None or int(value) < 1:
        raise UsageProblem(f"{name}: must be a positive integer, got {value}")
    return int(value)


def _value(x) -> str:
    """An option value as text (enum members by their value)."""
    return str(getattr(x, "value", x)).strip().lower()


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
    if sum(vals) > INT32_MAX:
        raise UsageProblem(f"{name}: the lengths add up to {sum(vals)} tokens; group mode packs "
                           f"them with int32 offsets (at most {INT32_MAX})")
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


def _parse_window(text) -> tuple[int, int]:
    if text is None:
        return (-1, -1)
    parts = str(text).replace(" ", "").split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise UsageProblem(f"--window: expected 'L,R' (two integers, -1 = unlimited), got {text!r}") from None


def parse_bias(text: str) -> str | None:
    """CK's --bias values -> None, 'e:0', 'e:1', 'e:2', 'a:0' or 'a:1'."""
    t = str(text).strip().lower()
    if t in ("n", "0", "none", ""):
        return None
    if t in ("a", "a:0", "a:1"):
        return "a:1" if t == "a:1" else "a:0"
    if t in ("e", "e:0", "e:1", "e:2"):
        return "e:0" if t == "e" else t
    raise UsageProblem(f"--bias: expected n, e, e:0, e:1, e:2, a, a:0 or a:1, got {text!r}")


#: --bias e:N -> shape of the elementwise bias (CK's meaning), from (batch, nhead, sq, sk)
_ELEMENTWISE = {
    "e:0": lambda b, h, sq, sk: (1, 1, sq, sk),
    "e:1": lambda b, h, sq, sk: (1, h, sq, sk),
    "e:2": lambda b, h, sq, sk: (b, h, sq, sk),
}


def alibi_slopes(kind: str | None, batch: int, nhead: int) -> np.ndarray | None:
    """ALiBi slopes for ``--bias a|a:0|a:1``: the usual geometric series 2^(-8 (h+1) / nhead),
    per batch entry scaled by 1 + b/8 for ``a:1`` so that batches differ."""
    if kind is None:
        return None
    base = 2.0 ** (-8.0 * (np.arange(nhead) + 1) / nhead)
    if kind == "a:1":
        base = base[None, :] * (1.0 + np.arange(batch)[:, None] / 8.0)
    return base.astype(np.float32)


class _Shaped:
    """A shape-only stand-in for a C-contiguous array: what :mod:`cupy_fmha.validate` reads
    (``shape``, ``dtype``, ``strides``), with no memory behind it."""

    def __init__(self, shape, dtype):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        strides, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            strides.append(step)
            step *= max(n, 1)
        self.strides = tuple(reversed(strides))


def host_dtype(dtype: str) -> np.dtype:
    if dtype == "fp16":
        return np.dtype(np.float16)
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def cu_seqlens(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


def _library_checks(*, group, b, hq, hk, sq, sk, lq, lk, d, dv, lay, mask, causal, win,
                    scale, bias_shape, alibi, p_drop, drop_seed, drop_offset) -> MaskSpec:
    """The library's own argument checks on stand-ins; returns the resolved mask. (The
    stand-ins are fp16 whatever --dtype says: the checks do not depend on it, and bf16 would
    import ml_dtypes, which takes seconds on a slow machine.)"""
    hd = np.dtype(np.float16)
    mask_kw = dict(softmax_scale=scale, causal=causal, window_size=win, mask=mask)
    dtype_name = "float16"
    try:
        if group:
            tq, tk = sum(lq), sum(lk)
            prob = validate.check_varlen_inputs(
                _Shaped((tq, hq, d), hd), _Shaped((tk, hk, d), hd), _Shaped((tk, hk, dv), hd),
                cu_seqlens_q=cu_seqlens(lq), cu_seqlens_k=cu_seqlens(lk), dtype=dtype_name,
                **mask_kw)
        else:
            def shape(s, h, n):
                return (b, s, h, n) if lay == "bshd" else (b, h, s, n)

            prob = validate.check_forward_inputs(
                _Shaped(shape(sq, hq, d), hd), _Shaped(shape(sk, hk, d), hd),
                _Shaped(shape(sk, hk, dv), hd), layout=lay, dtype=dtype_name, **mask_kw)
        if bias_shape is not None:
            validate.check_bias(_Shaped(bias_shape, hd), b, hq, sq, sk, dtype=dtype_name,
                                varlen=group)
        if alibi is not None:
            shape = (b, hq) if alibi == "a:1" else (hq,)
            validate.check_alibi_slopes(_Shaped(shape, np.float32), b, hq)
        validate.check_dropout(p_drop, drop_seed, drop_offset)
    except (TypeError, ValueError, OverflowError) as e:
        raise UsageProblem(option_names(str(e))) from None
    return prob.mask


def build(
    mode: str, *, batch=None, nhead=16, nhead_k=None, seqlen_q="2048", seqlen_k=None, hdim=128,
    hdim_v=None, dtype="bf16", layout=None, mask=None, causal=False, window=None, scale=None,
    seed=0, bias="n", seq_mode="batch", dbias=False, deterministic=False, p_drop=0.0,
    drop_seed=0, drop_offset=0, backend="auto", warmup=None, repeat=None, verify=True,
    full_check=False, json=False, max_memory=None,
) -> RunConfig:
    """Check the options of a ``fwd``/``bwd`` run and freeze them.

    Raises:
        UsageProblem: a bad value, with the option's name.
    """
    seq_mode = _value(seq_mode)
    if seq_mode not in ("batch", "group"):
        raise UsageProblem(f"--mode: expected batch or group, got {seq_mode!r}")
    group = seq_mode == "group"
    lay_in = None if layout is None else _value(layout)
    if group:
        lq, lk = _group_lengths(batch, seqlen_q, seqlen_k)
        b, sq, sk = len(lq), max(lq), max(lk)
        if lay_in is not None and lay_in != "thd":
            raise UsageProblem(f"--layout: group mode packs sequences as thd, got {lay_in!r}")
        lay = "thd"
    else:
        b = _positive("--batch", DEFAULT_BATCH if batch is None else batch)
        sq = _lengths("--seqlen-q", seqlen_q, False)[0]
        sk = sq if seqlen_k is None else _lengths("--seqlen-k", seqlen_k, False)[0]
        lq = lk = None
        if lay_in == "thd":
            raise UsageProblem("--layout: thd (packed variable-length sequences) needs --mode group")
        lay = "bshd" if lay_in is None else lay_in
        if lay not in ("bshd", "bhsd"):
            raise UsageProblem(f"--layout: expected bshd or bhsd, got {lay_in!r}")
    hq = _positive("--nhead", nhead)
    hk = _positive("--nhead-k", hq if nhead_k is None else nhead_k)
    d = _positive("--hdim", hdim)
    dv = _positive("--hdim-v", d if hdim_v is None else hdim_v)
    dt = _DTYPES.get(_value(dtype))
    if dt is None:
        raise UsageProblem(f"--dtype: expected fp16 or bf16, got {_value(dtype)!r}")
    win = _parse_window(window)
    kind = parse_bias(bias)
    alibi = kind if kind is not None and kind.startswith("a") else None
    elem = kind if kind is not None and kind.startswith("e") else None
    if dbias and elem is None:
        raise UsageProblem(f"--dbias: needs an elementwise bias (--bias e, e:0, e:1 or e:2), got "
                           f"--bias {bias}")
    try:
        seed = check_uint64("--seed", seed)
    except (TypeError, ValueError) as e:
        raise UsageProblem(str(e)) from None
    if warmup is not None and not 0 <= warmup <= MAX_CALLS:
        raise UsageProblem(f"--warmup: must be in [0, {MAX_CALLS}], got {warmup}")
    if repeat is not None and not 1 <= repeat <= MAX_CALLS:
        raise UsageProblem(f"--repeat: must be in [1, {MAX_CALLS}], got {repeat}")
    if max_memory is not None and not (math.isfinite(max_memory) and max_memory > 0):
        raise UsageProblem(f"--max-memory: expected a positive number of GiB, got {max_memory}")
    bias_shape = None if elem is None else _ELEMENTWISE[elem](b, hq, sq, sk)
    spec = _library_checks(
        group=group, b=b, hq=hq, hk=hk, sq=sq, sk=sk, lq=lq, lk=lk, d=d, dv=dv, lay=lay,
        mask=mask, causal=bool(causal), win=win, scale=scale, bias_shape=bias_shape,
        alibi=alibi, p_drop=p_drop, drop_seed=drop_seed, drop_offset=drop_offset,
    )
    return RunConfig(
        mode=mode, batch=b, nhead=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=sk, hdim=d, hdim_v=dv,
        dtype=dt, layout=lay, mask_spec=spec,
        seqlens_q=None if lq is None else tuple(lq), seqlens_k=None if lk is None else tuple(lk),
        mask=mask, causal=bool(causal), window=win, scale=scale, seed=seed, bias=kind or "n",
        bias_shape=bias_shape, dbias=bool(dbias),
        deterministic=bool(deterministic) if mode == "bwd" else False,
        p_drop=float(p_drop), drop_seed=int(drop_seed), drop_offset=int(drop_offset),
        backend=_value(backend), warmup=warmup, repeat=repeat, verify=bool(verify),
        full_check=bool(full_check), json=bool(json), max_memory_gib=max_memory,
    )


def with_backend(cfg: RunConfig, backend: str) -> RunConfig:
    """``cfg`` for the resolved backend (``cupy`` or ``numpy``), with its warm-up and repeat
    counts filled in."""
    from dataclasses import replace

    return replace(
        cfg, backend=backend,
        warmup=DEFAULT_WARMUP[backend] if cfg.warmup is None else cfg.warmup,
        repeat=DEFAULT_REPEAT[backend] if cfg.repeat is None else cfg.repeat,
    )
