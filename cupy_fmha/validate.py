"""Input checks shared by the GPU API (:mod:`cupy_fmha.api`) and the NumPy reference.

Everything here is duck-typed over NumPy and CuPy arrays: only ``.shape``, ``.dtype``,
``.strides`` (bytes) and, for CuPy arrays, ``.device.id`` are read. CuPy is never imported, so
this module works without a GPU. Inputs are never modified.

All errors are raised before anything runs and name the offending argument, e.g.
``ValueError("k: batch size 3 does not match q's batch size 2")``.

dtypes: fp16 (``numpy.float16``) and bf16. CuPy has no bfloat16, so bf16 data on the GPU
travels as ``uint16`` arrays holding the raw bits; such arrays are accepted only with
``dtype="bfloat16"``. NumPy arrays of ``ml_dtypes.bfloat16`` are recognized automatically.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .mask import MaskSpec, Window, resolve_mask

__all__ = [
    "LAYOUTS",
    "Problem",
    "check_forward_inputs",
    "check_backward_inputs",
    "normalize_dtype",
]

LAYOUTS = ("bshd", "bhsd")
HDIM_MIN, HDIM_MAX, HDIM_STEP = 8, 256, 8

_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_U16 = np.dtype(np.uint16)
_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Problem:
    """A checked attention problem (sizes, dtype, layout, scale, mask).

    ``dtype`` is the logical element type: ``numpy.float16`` or ``ml_dtypes.bfloat16``
    (also for uint16 bf16 bits). The NumPy reference, which accepts any float dtype, may carry
    other float dtypes here.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    nhead_q: int
    nhead_k: int
    hdim_q: int
    hdim_v: int
    dtype: np.dtype
    layout: str
    softmax_scale: float
    mask: MaskSpec

    @property
    def window(self) -> Window | None:
        """The mask resolved for these lengths (``None`` for no mask)."""
        return self.mask.window(self.seqlen_q, self.seqlen_k)

    @property
    def group(self) -> int:
        """Query heads per K/V head (1 for MHA, ``nhead_q`` for MQA)."""
        return self.nhead_q // self.nhead_k


# --------------------------------------------------------------------------- helpers


def normalize_dtype(dtype) -> np.dtype | None:
    """Map the ``dtype=`` argument (``None``, ``"float16"``/``"fp16"``/``"half"``,
    ``"bfloat16"``/``"bf16"``, or the NumPy / ml_dtypes types) to a NumPy dtype or ``None``.

    Raises:
        ValueError: naming ``dtype`` for anything else.
    """
    if dtype is None:
        return None
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key in ("float16", "fp16", "half", "f16"):
            return _F16
        if key in ("bfloat16", "bf16"):
            return _BF16
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt in (_F16, _BF16):
            return dt
    raise ValueError(f"dtype: expected None, 'float16' or 'bfloat16', got {dtype!r}")


def _is_array(a) -> bool:
    return all(hasattr(a, attr) for attr in ("shape", "dtype", "strides"))


def _device_id(a) -> int | None:
    """CuPy device id, or ``None`` for host arrays (NumPy 2's ``.device`` is the string 'cpu')."""
    did = getattr(getattr(a, "device", None), "id", None)
    return did if isinstance(did, (int, np.integer)) else None


def _check_array(name: str, a, rank: int) -> None:
    if not _is_array(a):
        raise TypeError(
            f"{name}: expected a CuPy or NumPy array, got {type(a).__module__}.{type(a).__name__}"
        )
    if len(a.shape) != rank:
        what = "[b, hq, sq]" if rank == 3 else "[b, s, h, d] (bshd) or [b, h, s, d] (bhsd)"
        raise ValueError(f"{name}: expected a rank-{rank} array {what}, got shape {tuple(a.shape)}")
    if any(int(n) == 0 for n in a.shape):
        raise ValueError(f"{name}: zero-size dimension in shape {tuple(a.shape)}")


def _logical_dtype(name: str, a, want: np.dtype | None, any_float: bool) -> np.dtype:
    dt = np.dtype(a.dtype)
    if dt == _U16:
        if want == _BF16:
            return _BF16
        if want is None:
            raise TypeError(
                f"{name}: got a uint16 array; bf16 data travels as uint16 raw bits (CuPy has no "
                "bfloat16), so pass dtype='bfloat16' to use it as bf16"
            )
        raise TypeError(f"{name}: got a uint16 array (bf16 bits) but dtype={want.name!r} was given")
    if any_float:
        if dt.kind == "f" or dt == _BF16:
            return dt
        raise TypeError(f"{name}: expected a floating-point array, got dtype {dt}")
    if dt not in (_F16, _BF16):
        raise TypeError(
            f"{name}: expected float16 or bfloat16 (ml_dtypes.bfloat16, or uint16 bits with "
            f"dtype='bfloat16'), got dtype {dt}"
        )
    if want is not None and dt != want:
        raise TypeError(f"{name}: dtype {dt} does not match dtype={want.name!r}")
    return dt


def _check_strides(name: str, a) -> None:
    itemsize = np.dtype(a.dtype).itemsize
    strides = tuple(int(s) for s in a.strides)
    shape = tuple(int(n) for n in a.shape)
    if any(s < 0 for s in strides):
        raise ValueError(
            f"{name}: negative strides are not supported (strides {strides} bytes); pass a copy"
        )
    if any(s % itemsize for s in strides):
        raise ValueError(
            f"{name}: strides {strides} bytes are not multiples of the element size {itemsize}; "
            "pass a copy"
        )
    if shape[-1] > 1 and strides[-1] != itemsize:
        raise ValueError(
            f"{name}: last dimension must be contiguous (stride 1), got stride "
            f"{strides[-1] // itemsize}; pass a copy"
        )


def _bshd(layout: str, shape) -> tuple[int, int, int, int]:
    """(batch, seqlen, heads, hdim) of a rank-4 shape in ``layout``."""
    b, a1, a2, d = (int(n) for n in shape)
    return (b, a1, a2, d) if layout == "bshd" else (b, a2, a1, d)


def _fmt(layout: str, b: int, s: int, h: int, d: int) -> tuple[int, int, int, int]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def _check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return layout


def _check_scale(softmax_scale, hdim_q: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(hdim_q)
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale: expected a real number or None, got {softmax_scale!r}")
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"softmax_scale: expected a finite nonzero number, got {softmax_scale!r}")
    return scale


def _check_mask(mask, causal, window_size, seqlen_q: int, seqlen_k: int, allow_empty: bool):
    if not isinstance(causal, (bool, np.bool_)) and not (
        isinstance(causal, (int, np.integer)) and causal in (0, 1)
    ):
        raise TypeError(f"causal: expected a bool, got {causal!r}")
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or len(
        window_size
    ) != 2:
        raise ValueError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    if mask is not None and not isinstance(mask, (str, int, MaskSpec)):
        raise TypeError(f"mask: expected a CK mask string or a MaskSpec, got {mask!r}")
    spec = resolve_mask(mask, bool(causal), tuple(window_size))
    if not allow_empty and not spec.is_none:
        from .flops import visible_pairs

        if visible_pairs(spec, seqlen_q, seqlen_k) == 0:
            win = spec.window(seqlen_q, seqlen_k)
            arg = "mask" if mask is not None else "window_size"
            raise ValueError(
                f"{arg}: the mask {spec.describe()!r} (window y={win.y}, x={win.x}) leaves every "
                f"query row without a visible key for seqlen_q={seqlen_q}, seqlen_k={seqlen_k}"
            )
    return spec


def _check_devices(named) -> None:
    seen: dict[int, str] = {}
    for name, a in named:
        did = _device_id(a)
        if did is None:
            continue
        did = int(did)
        if seen and did not in seen:
            other_dev, other = next(iter(seen.items()))
            raise ValueError(
                f"{name}: array is on GPU {did} but {other} is on GPU {other_dev}; "
                "all arrays must be on one device"
            )
        seen.setdefault(did, name)


def _check_qkv(q, k, v, layout, want, any_float, hdim_rule):
    for name, a in (("q", q), ("k", k), ("v", v)):
        _check_array(name, a, 4)
    dq_ = _logical_dtype("q", q, want, any_float)
    for name, a in (("k", k), ("v", v)):
        dt = _logical_dtype(name, a, want, any_float)
        if dt != dq_:
            raise TypeError(f"{name}: dtype {dt} does not match q's dtype {dq_}")
    b, sq, hq, d = _bshd(layout, q.shape)
    bk, sk, hk, dk = _bshd(layout, k.shape)
    bv, sv, hv, dv = _bshd(layout, v.shape)
    if bk != b:
        raise ValueError(f"k: batch size {bk} does not match q's batch size {b}")
    if dk != d:
        raise ValueError(f"k: head dim {dk} does not match q's head dim {d}")
    if bv != b:
        raise ValueError(f"v: batch size {bv} does not match q's batch size {b}")
    if sv != sk:
        raise ValueError(f"v: seqlen {sv} does not match k's seqlen {sk}")
    if hv != hk:
        raise ValueError(f"v: number of heads {hv} does not match k's {hk}")
    if hq % hk:
        raise ValueError(
            f"k: number of heads {hk} must divide q's number of heads {hq} (GQA/MQA)"
        )
    if hdim_rule:
        for name, n in (("q", d), ("v", dv)):
            if n % HDIM_STEP or not HDIM_MIN <= n <= HDIM_MAX:
                raise ValueError(
                    f"{name}: head dim must be a multiple of {HDIM_STEP} in "
                    f"[{HDIM_MIN}, {HDIM_MAX}], got {n}"
                )
    return dq_, (b, sq, hq, d), (sk, hk, dv)


def _problem(q, k, v, extra, *, softmax_scale, causal, window_size, mask, layout, dtype,
             any_float=False, hdim_rule=True, allow_empty=False, lse=None, strides=True):
    layout = _check_layout(layout)
    want = normalize_dtype(dtype)
    dt, (b, sq, hq, d), (sk, hk, dv) = _check_qkv(q, k, v, layout, want, any_float, hdim_rule)
    for name, a in extra:  # o, do: [b, sq, hq, dv]
        _check_array(name, a, 4)
        adt = _logical_dtype(name, a, want, any_float)
        if adt != dt:
            raise TypeError(f"{name}: dtype {adt} does not match q's dtype {dt}")
        expect = _fmt(layout, b, sq, hq, dv)
        if tuple(int(n) for n in a.shape) != expect:
            raise ValueError(
                f"{name}: expected shape {expect} ({layout}: batch, seqlen_q, nhead_q, hdim_v "
                f"from q and v), got {tuple(a.shape)}"
            )
    named = [("q", q), ("k", k), ("v", v), *extra]
    if lse is not None:
        _check_array("lse", lse, 3)
        if np.dtype(lse.dtype) != _F32:
            raise TypeError(f"lse: expected float32, got dtype {np.dtype(lse.dtype)}")
        if tuple(int(n) for n in lse.shape) != (b, hq, sq):
            raise ValueError(
                f"lse: expected shape {(b, hq, sq)} ([batch, nhead_q, seqlen_q]), "
                f"got {tuple(lse.shape)}"
            )
        named.append(("lse", lse))
    if strides:
        for name, a in named:
            _check_strides(name, a)
        _check_devices(named)
    scale = _check_scale(softmax_scale, d)
    spec = _check_mask(mask, causal, window_size, sq, sk, allow_empty)
    return Problem(b, sq, sk, hq, hk, d, dv, dt, layout, scale, spec)


# --------------------------------------------------------------------------- public


def check_forward_inputs(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="bshd",
    dtype=None,
) -> Problem:
    """Check the forward pass's inputs and describe the problem.

    Args:
        q: [b, sq, hq, d] (``bshd``) or [b, hq, sq, d] (``bhsd``), fp16 or bf16.
        k: [b, sk, hk, d] / [b, hk, sk, d], same dtype; ``hq % hk == 0``.
        v: [b, sk, hk, dv] / [b, hk, sk, dv], same dtype.
        softmax_scale: finite nonzero number; default ``1/sqrt(d)``.
        causal, window_size, mask: see :func:`cupy_fmha.mask.resolve_mask`.
        layout: ``"bshd"`` or ``"bhsd"``.
        dtype: ``None``, ``"float16"`` or ``"bfloat16"`` (required for uint16 bf16 bits).

    Returns:
        :class:`Problem`.

    Raises:
        TypeError: not an array, wrong/mixed dtype, uint16 without ``dtype="bfloat16"``,
            non-number ``softmax_scale``, non-bool ``causal``.
        ValueError: bad layout, rank, shape mismatch, zero-size dimension, head dim not a multiple
            of 8 in [8, 256], ``nhead_q % nhead_k != 0``, non-unit last stride, negative strides,
            arrays on different GPUs, bad ``softmax_scale``, bad or empty mask/window.
    """
    return _problem(
        q, k, v, [], softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        mask=mask, layout=layout, dtype=dtype,
    )


def check_backward_inputs(
    do,
    q,
    k,
    v,
    o,
    lse,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="bshd",
    dtype=None,
) -> Problem:
    """Check the backward pass's inputs and describe the problem.

    Like :func:`check_forward_inputs`, plus ``o`` and ``do`` of shape [b, sq, hq, dv] (``bshd``)
    or [b, hq, sq, dv] (``bhsd``) in the inputs' dtype, and ``lse`` float32 [b, hq, sq] (last
    dimension contiguous). Same errors.
    """
    return _problem(
        q, k, v, [("o", o), ("do", do)], lse=lse, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, mask=mask, layout=layout, dtype=dtype,
    )


def check_reference_inputs(q, k, v, extra=(), *, softmax_scale=None, causal=False,
                           window_size=(-1, -1), mask=None, layout="bshd") -> Problem:
    """Checks for the NumPy reference: any float dtype (one dtype for all), any head dim, and
    masks that leave every row empty are allowed (the oracle defines their result)."""
    return _problem(
        q, k, v, list(extra), softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, mask=mask, layout=layout, dtype=None, any_float=True,
        hdim_rule=False, allow_empty=True, strides=False,
    )
