"""Input checks shared by the GPU API (:mod:`cupy_fmha.api`) and the NumPy reference.

Everything here is duck-typed over NumPy and CuPy arrays: only ``.shape``, ``.dtype``,
``.strides`` (bytes) and, for CuPy arrays, ``.device.id`` are read. CuPy is never imported, so
this module works without a GPU. Inputs are never modified.

All errors are raised before anything runs and name the offending argument, e.g.
``ValueError("k: batch size 3 does not match q's batch size 2")``.

dtypes: fp16 (``numpy.float16``) and bf16 (``ml_dtypes.bfloat16``: NumPy arrays, and CuPy 14's
native bfloat16 arrays). For CuPy versions without bfloat16, bf16 data on the GPU may travel as
``uint16`` arrays holding the raw bits; such arrays are accepted only with ``dtype="bfloat16"``.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from ._checks import check_int
from .mask import MaskSpec, Window, resolve_mask
from .philox import check_uint64, keep_scale, keep_threshold

__all__ = [
    "LAYOUTS",
    "Problem",
    "check_forward_inputs",
    "check_backward_inputs",
    "normalize_dtype",
    "VarlenProblem",
    "Dropout",
    "check_varlen_inputs",
    "check_cu_seqlens",
    "check_bias",
    "check_alibi_slopes",
    "check_dropout",
    "check_flag",
    "check_return_dbias",
    "check_dlse",
    "check_kernel_limits",
]

LAYOUTS = ("bshd", "bhsd")
HDIM_MIN, HDIM_MAX, HDIM_STEP = 8, 256, 8
#: Size limits of the GPU kernels (not of the NumPy reference). Every launch has grid
#: (row or key blocks, nhead_q, batch) and CUDA caps grid y and z at 65535. Row and key indices,
#: lengths and the mask window are 32-bit ints in the kernels, and an unlimited window edge is
#: 2^30 (launch.WINDOW_INF), so ``i + x`` and ``k0 + y`` fit in int32 only for lengths below
#: 2^30 (less a margin for the tile sizes). Offsets into the tensors are 64-bit (no limit here).
GRID_YZ_MAX = 65535
SEQLEN_MAX = (1 << 30) - (1 << 16)

_F16 = np.dtype(np.float16)
_U16 = np.dtype(np.uint16)
_F32 = np.dtype(np.float32)
_F32_MAX = float(np.finfo(np.float32).max)
_LOG2E = 1.4426950408889634


@functools.lru_cache(maxsize=1)
def _bf16() -> np.dtype:
    """``ml_dtypes.bfloat16``, imported on first use: importing ml_dtypes takes seconds on a
    slow machine, and checking fp16 problems (or the CLI's up-front checks) needs none of it."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _is_bf16(dt) -> bool:
    """``dt == bfloat16``; only a dtype named so can be (and then ml_dtypes is loaded)."""
    return dt is not None and np.dtype(dt).name == "bfloat16" and np.dtype(dt) == _bf16()


def __getattr__(name: str):
    if name == "_BF16":  # kept importable (``from .validate import _BF16``), resolved lazily
        return _bf16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
            return _bf16()
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is not None and (dt == _F16 or _is_bf16(dt)):
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
        if _is_bf16(want):
            return want
        if any_float:  # the NumPy reference: it has no dtype= and takes ml_dtypes' bfloat16 itself
            raise TypeError(f"{name}: got a uint16 array; the reference takes bf16 as ml_dtypes.bfloat16 "
                            "arrays (view the bits with .view(ml_dtypes.bfloat16))")
        if want is None:
            raise TypeError(
                f"{name}: got a uint16 array; pass dtype='bfloat16' to use it as raw bf16 bits (or pass "
                "a bfloat16 array: CuPy 14 has the dtype natively)"
            )
        raise TypeError(f"{name}: got a uint16 array (bf16 bits) but dtype={want.name!r} was given")
    if any_float:
        if dt.kind == "f" or _is_bf16(dt):
            return dt
        raise TypeError(f"{name}: expected a floating-point array, got dtype {dt}")
    if not (dt == _F16 or _is_bf16(dt)):
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
    if 0 in shape:  # an empty array (group mode: every sequence empty) addresses nothing
        return
    # negative strides are fine: the API copies such an input before the kernels read it
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


def _check_lse(lse, shape: tuple[int, ...], what: str) -> None:
    """lse (already known to be a rank-3 array): float32 of ``shape`` (described as ``what``)."""
    if np.dtype(lse.dtype) != _F32:
        raise TypeError(f"lse: expected float32, got dtype {np.dtype(lse.dtype)}")
    if tuple(int(n) for n in lse.shape) != shape:
        raise ValueError(f"lse: expected shape {shape} ({what}), got {tuple(lse.shape)}")


def require_lse(lse) -> None:
    """The backward's ``lse`` is required (the forward's second output); ``None`` is refused here
    because the shared checks skip an absent ``lse`` (the forward has none)."""
    if lse is None:
        raise TypeError("lse: expected the forward's float32 log-sum-exp array [batch, nhead_q, seqlen_q] "
                        "([batch, nhead_q, max_seqlen_q] in layout 'thd'), got None")


def _check_layout_and_devices(named, also_on_device=()) -> None:
    """Unit last stride and strides in whole elements for each (name, array); one device for all."""
    for name, a in named:
        _check_strides(name, a)
    _check_devices(list(named) + list(also_on_device))


def _check_layout(layout) -> str:
    if layout == "thd":  # group mode's layout, reached here without its offsets
        raise ValueError(f"layout: 'thd' (packed sequences) needs cu_seqlens_q and cu_seqlens_k; "
                         f"without them expected one of {LAYOUTS}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return layout


def _check_scale(softmax_scale, hdim_q: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(hdim_q)
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale: expected a real number or None, got {softmax_scale!r}")
    try:
        scale = float(softmax_scale)
    except OverflowError:  # an int beyond float64
        raise ValueError(f"softmax_scale: expected a finite nonzero number, got {softmax_scale!r}") from None
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"softmax_scale: expected a finite nonzero number, got {softmax_scale!r}")
    with np.errstate(over="ignore"):
        folded = np.float32(abs(scale) * _LOG2E)
    if not np.isfinite(folded):
        # the kernels fold log2(e) into the scale in float32: inf there, NaN everywhere after
        raise ValueError(
            f"softmax_scale: {softmax_scale!r} is too large: softmax_scale * log2(e) must be "
            f"finite in float32 (|softmax_scale| <= {_F32_MAX / _LOG2E:.4g})"
        )
    return scale


def _check_mask(mask, causal, window_size, seqlen_q: int, seqlen_k: int, allow_empty: bool):
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or len(
        window_size
    ) != 2:
        raise ValueError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    spec = resolve_mask(mask, causal, tuple(window_size))
    if not allow_empty and not spec.is_none:
        from .flops import any_visible

        if not any_visible(spec, seqlen_q, seqlen_k):
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
        _check_head_dims(d, dv)
    return dq_, (b, sq, hq, d), (sk, hk, dv)


def _check_head_dims(hdim_q: int, hdim_v: int, names: tuple[str, str] = ("q", "v")) -> None:
    """The kernels' head-dim rule: multiples of HDIM_STEP in [HDIM_MIN, HDIM_MAX] (q, then v;
    ``names``: the arguments that carry them)."""
    for name, n in zip(names, (hdim_q, hdim_v)):
        if n % HDIM_STEP or not HDIM_MIN <= n <= HDIM_MAX:
            raise ValueError(
                f"{name}: head dim must be a multiple of {HDIM_STEP} in "
                f"[{HDIM_MIN}, {HDIM_MAX}], got {n}"
            )


def check_kernel_limits(batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int,
                        names: tuple[str, str] = ("q", "k"), batch_name: str = "q") -> None:
    """Reject sizes the GPU kernels cannot launch or index (see ``GRID_YZ_MAX``, ``SEQLEN_MAX``),
    naming the argument (``names``: what carries seqlen_q / seqlen_k; ``batch_name``: the batch, in
    group mode ``cu_seqlens_q``), instead of a CUDA launch error or silently wrapped 32-bit indices."""
    if batch > GRID_YZ_MAX:
        what = "batch size" if batch_name == "q" else "number of sequences"
        raise ValueError(f"{batch_name}: {what} {batch} exceeds the kernels' limit of {GRID_YZ_MAX} "
                         "(CUDA grid dimension z); split the batch")
    if nhead_q > GRID_YZ_MAX:
        raise ValueError(f"q: {nhead_q} query heads exceed the kernels' limit of {GRID_YZ_MAX} "
                         "(CUDA grid dimension y)")
    for name, n in zip(names, (seqlen_q, seqlen_k)):
        if n > SEQLEN_MAX:
            raise ValueError(f"{name}: seqlen {n} exceeds the kernels' limit of {SEQLEN_MAX} "
                             "(32-bit row indices and mask window)")


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
        _check_lse(lse, (b, hq, sq), "[batch, nhead_q, seqlen_q]")
        named.append(("lse", lse))
    if strides:
        _check_layout_and_devices(named)
    if hdim_rule:  # the GPU API's checks (the reference relaxes hdim_rule)
        check_kernel_limits(b, hq, sq, sk)
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
            of 8 in [8, 256], ``nhead_q % nhead_k != 0``, non-unit last stride,
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
    require_lse(lse)
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


# --------------------------------------------------------------------------- issue 3 features
#
# Varlen (group mode), bias, ALiBi and dropout. These are separate functions so that
# check_forward_inputs / check_backward_inputs keep their behaviour; the NumPy reference uses them
# with ``any_float=True`` (any float dtype, any head dim), the GPU API in the strict default mode.

_I32 = np.dtype(np.int32)


@dataclass(frozen=True)
class VarlenProblem:
    """A checked variable-length ("group mode", layout ``thd``) attention problem.

    q is [total_q, nhead_q, hdim_q], k/v [total_k, nhead_k, hdim_q/hdim_v]; sequence ``b`` holds
    rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``
    of k and v. Lengths may be 0. lse is [batch, nhead_q, max_seqlen_q].
    """

    batch: int
    cu_seqlens_q: tuple[int, ...]
    cu_seqlens_k: tuple[int, ...]
    max_seqlen_q: int
    max_seqlen_k: int
    nhead_q: int
    nhead_k: int
    hdim_q: int
    hdim_v: int
    dtype: np.dtype
    softmax_scale: float
    mask: MaskSpec
    layout: str = "thd"

    @property
    def total_q(self) -> int:
        return self.cu_seqlens_q[-1]

    @property
    def total_k(self) -> int:
        return self.cu_seqlens_k[-1]

    @property
    def seqlens_q(self) -> tuple[int, ...]:
        c = self.cu_seqlens_q
        return tuple(c[i + 1] - c[i] for i in range(self.batch))

    @property
    def seqlens_k(self) -> tuple[int, ...]:
        c = self.cu_seqlens_k
        return tuple(c[i + 1] - c[i] for i in range(self.batch))

    @property
    def group(self) -> int:
        return self.nhead_q // self.nhead_k

    def window(self, b: int) -> Window | None:
        """The mask resolved for sequence ``b``'s own lengths (``None`` for no mask)."""
        return self.mask.window(self.seqlens_q[b], self.seqlens_k[b])


@dataclass(frozen=True)
class Dropout:
    """Checked dropout settings; ``threshold = floor((1 - p) * 256 + 0.5)``, and ``scale`` the factor
    of a kept element, ``256 / threshold`` (see :mod:`cupy_fmha.philox`)."""

    p: float
    seed: int
    offset: int
    threshold: int

    @property
    def enabled(self) -> bool:
        return self.p > 0.0

    @property
    def scale(self) -> float:
        return keep_scale(self.p)


def _host_values(name: str, a):
    """NumPy copy of a NumPy/CuPy array (CuPy arrays through ``.get()``)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get") and _is_array(a):
        a = a.get()
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"{name}: expected a CuPy or NumPy array, got {type(a).__module__}.{type(a).__name__}"
        )
    return a


def check_cu_seqlens(name: str, cu, total: int, batch: int | None = None) -> tuple[int, ...]:
    """Check cumulative sequence offsets: int32 [batch + 1], starting at 0, non-decreasing,
    last value == ``total`` (the packed tensor's first dimension). Returns them as ints.

    Raises:
        TypeError: not an array, not int32.  ValueError: rank, length, values.
    """
    if not _is_array(cu):
        raise TypeError(
            f"{name}: expected an int32 array [batch + 1], got "
            f"{type(cu).__module__}.{type(cu).__name__}"
        )
    if np.dtype(cu.dtype) != _I32:
        raise TypeError(f"{name}: expected dtype int32, got {np.dtype(cu.dtype)}")
    if len(cu.shape) != 1 or int(cu.shape[0]) < 2:
        raise ValueError(
            f"{name}: expected a rank-1 array [batch + 1] with batch >= 1, "
            f"got shape {tuple(cu.shape)}"
        )
    if batch is not None and int(cu.shape[0]) != batch + 1:
        raise ValueError(
            f"{name}: expected {batch + 1} entries (batch + 1), got {int(cu.shape[0])}"
        )
    vals = [int(x) for x in _host_values(name, cu)]
    if vals[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {vals[0]}")
    bad = [i for i in range(len(vals) - 1) if vals[i + 1] < vals[i]]
    if bad:
        i = bad[0]
        raise ValueError(
            f"{name}: must be non-decreasing, but entry {i + 1} ({vals[i + 1]}) "
            f"< entry {i} ({vals[i]})"
        )
    if vals[-1] != total:
        raise ValueError(
            f"{name}: last value {vals[-1]} does not match the packed length {total} "
            "(first dimension of the packed tensor)"
        )
    return tuple(vals)


def _check_max_seqlen(name: str, value, lengths) -> int:
    longest = max(lengths) if lengths else 0
    if value is None:
        return longest
    value = check_int(name, value, what="an int or None")
    if value < longest:
        raise ValueError(f"{name}: {value} is less than the longest sequence ({longest})")
    return value


def _check_array3(name: str, a) -> None:
    if not _is_array(a):
        raise TypeError(
            f"{name}: expected a CuPy or NumPy array, got {type(a).__module__}.{type(a).__name__}"
        )
    if len(a.shape) != 3:
        raise ValueError(
            f"{name}: expected a rank-3 array [total, heads, hdim] (layout 'thd'), "
            f"got shape {tuple(a.shape)}"
        )
    if any(int(n) == 0 for n in a.shape[1:]):
        raise ValueError(f"{name}: zero-size heads or head dim in shape {tuple(a.shape)}")


def check_varlen_inputs(
    q,
    k,
    v,
    extra=(),
    *,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="thd",
    dtype=None,
    lse=None,
    any_float=False,
    hdim_rule=True,
    strides=True,
) -> VarlenProblem:
    """Check a variable-length (group mode) problem and describe it.

    Args:
        q: [total_q, nhead_q, d]; k: [total_k, nhead_k, d]; v: [total_k, nhead_k, dv]; one dtype
            (fp16/bf16 unless ``any_float``); ``nhead_q % nhead_k == 0``. total may be 0.
        extra: ``(name, array)`` pairs of shape [total_q, nhead_q, dv] (o, do).
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] (see :func:`check_cu_seqlens`).
        max_seqlen_q, max_seqlen_k: ``None`` (the longest sequence) or an int >= it.
        softmax_scale, causal, window_size, mask, dtype: as :func:`check_forward_inputs`; the
            mask is resolved per sequence with that sequence's lengths, and may leave rows (or
            whole sequences) without keys.
        layout: must be ``"thd"``.
        lse: optional float32 [batch, nhead_q, max_seqlen_q].
        any_float, hdim_rule, strides: relaxations for the NumPy reference.

    Raises:
        TypeError, ValueError: naming the argument.
    """
    if layout != "thd":
        raise ValueError(f"layout: cu_seqlens_q/cu_seqlens_k need layout='thd', got {layout!r}")
    want = normalize_dtype(dtype)
    for name, a in (("q", q), ("k", k), ("v", v)):
        _check_array3(name, a)
    dt = _logical_dtype("q", q, want, any_float)
    for name, a in (("k", k), ("v", v)):
        adt = _logical_dtype(name, a, want, any_float)
        if adt != dt:
            raise TypeError(f"{name}: dtype {adt} does not match q's dtype {dt}")
    tq, hq, d = (int(n) for n in q.shape)
    tk, hk, dk = (int(n) for n in k.shape)
    tv, hv, dv = (int(n) for n in v.shape)
    if dk != d:
        raise ValueError(f"k: head dim {dk} does not match q's head dim {d}")
    if tv != tk:
        raise ValueError(f"v: total length {tv} does not match k's {tk}")
    if hv != hk:
        raise ValueError(f"v: number of heads {hv} does not match k's {hk}")
    if hq % hk:
        raise ValueError(f"k: number of heads {hk} must divide q's number of heads {hq} (GQA/MQA)")
    if hdim_rule:
        _check_head_dims(d, dv)
    for name, a in extra:
        _check_array3(name, a)
        adt = _logical_dtype(name, a, want, any_float)
        if adt != dt:
            raise TypeError(f"{name}: dtype {adt} does not match q's dtype {dt}")
        if tuple(int(n) for n in a.shape) != (tq, hq, dv):
            raise ValueError(
                f"{name}: expected shape {(tq, hq, dv)} (total_q, nhead_q, hdim_v), "
                f"got {tuple(a.shape)}"
            )
    if cu_seqlens_q is None or cu_seqlens_k is None:
        which = "cu_seqlens_q" if cu_seqlens_q is None else "cu_seqlens_k"
        raise ValueError(f"{which}: layout 'thd' needs cu_seqlens_q and cu_seqlens_k")
    cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, tq)
    ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, tk)
    if len(cq) != len(ck):
        raise ValueError(
            f"cu_seqlens_k: {len(ck)} entries but cu_seqlens_q has {len(cq)} (both batch + 1)"
        )
    batch = len(cq) - 1
    mq = _check_max_seqlen("max_seqlen_q", max_seqlen_q, [cq[i + 1] - cq[i] for i in range(batch)])
    mk = _check_max_seqlen("max_seqlen_k", max_seqlen_k, [ck[i + 1] - ck[i] for i in range(batch)])
    named = [("q", q), ("k", k), ("v", v), *extra]
    if lse is not None:
        if not _is_array(lse):
            raise TypeError("lse: expected a rank-3 float32 array [batch, nhead_q, max_seqlen_q], "
                            f"got {type(lse).__module__}.{type(lse).__name__}")
        if len(lse.shape) != 3:
            raise ValueError("lse: expected a rank-3 float32 array [batch, nhead_q, max_seqlen_q], "
                             f"got shape {tuple(lse.shape)}")
        _check_lse(lse, (batch, hq, mq), "[batch, nhead_q, max_seqlen_q]")
        named.append(("lse", lse))
    if strides:
        _check_layout_and_devices(
            named, [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)])
    if hdim_rule:  # the GPU API's checks (the reference relaxes hdim_rule)
        check_kernel_limits(batch, hq, mq, mk, names=("max_seqlen_q", "max_seqlen_k"), batch_name="cu_seqlens_q")
    scale = _check_scale(softmax_scale, d)
    spec = _check_mask(mask, causal, window_size, mq, mk, allow_empty=True)
    return VarlenProblem(batch, cq, ck, mq, mk, hq, hk, d, dv, dt, scale, spec)


def check_bias(bias, batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int, *,
               any_float: bool = False, dtype=None, varlen: bool = False) -> np.dtype:
    """Check an elementwise bias: rank 1-4, broadcastable (NumPy rules: each dimension 1 or
    equal) to [batch, nhead_q, seqlen_q, seqlen_k], e.g. [1, 1, sq, sk], [1, h, sq, sk],
    [b, h, sq, sk], [sq, sk]. dtype fp16, bf16 or fp32 (uint16 bf16 bits with
    ``dtype="bfloat16"``); any float with ``any_float``. ``varlen=True`` (group mode): pass
    max_seqlen_q and max_seqlen_k as the lengths (batch = number of sequences); messages then
    name them so. Sequence ``i`` uses the bias's top-left [seqlen_q_i, seqlen_k_i] corner.

    Returns:
        The bias's logical dtype.

    Raises:
        TypeError: not an array, bad dtype.  ValueError: rank or shape not broadcastable.
    """
    if not _is_array(bias):
        raise TypeError(
            "bias: expected a CuPy or NumPy array, got "
            f"{type(bias).__module__}.{type(bias).__name__}"
        )
    dt = np.dtype(bias.dtype)
    if dt == _U16:
        if not _is_bf16(normalize_dtype(dtype)):
            raise TypeError(
                "bias: got a uint16 array; uint16 is read as bf16 bits only with dtype='bfloat16', which "
                "names q, k and v's type too; with float16 inputs pass the bias as a bfloat16 (CuPy 14, "
                "ml_dtypes) or float32 array"
            )
        dt = _bf16()
    elif any_float:
        if not (dt.kind == "f" or _is_bf16(dt)):
            raise TypeError(f"bias: expected a floating-point array, got dtype {dt}")
    elif not (dt in (_F16, _F32) or _is_bf16(dt)):
        raise TypeError(f"bias: expected float16, bfloat16 or float32, got dtype {dt}")
    shape = tuple(int(n) for n in bias.shape)
    full = (batch, nhead_q, seqlen_q, seqlen_k)
    if not 1 <= len(shape) <= 4:
        raise ValueError(f"bias: expected rank 1 to 4 (broadcastable to {full}), got shape {shape}")
    names = ("max_seqlen_k", "max_seqlen_q", "nhead_q", "batch") if varlen else (
        "seqlen_k", "seqlen_q", "nhead_q", "batch")
    for have, want, what in zip(shape[::-1], full[::-1], names):
        if have not in (1, want):
            raise ValueError(
                f"bias: shape {shape} is not broadcastable to [{', '.join(names[::-1])}] "
                f"= {full}: its {what} dimension is {have} (expected 1 or {want})"
            )
    return dt


def check_alibi_slopes(alibi_slopes, batch: int, nhead_q: int, *, bias=None,
                       any_float: bool = False) -> tuple[int, ...]:
    """Check ALiBi slopes: float32 [nhead_q] or [batch, nhead_q] (any float with ``any_float``);
    not together with ``bias``. Returns the shape.

    Raises:
        ValueError: both bias and alibi_slopes given; bad shape.  TypeError: not an array, dtype.
    """
    if bias is not None:
        raise ValueError("bias, alibi_slopes: give at most one of bias= and alibi_slopes=")
    if not _is_array(alibi_slopes):
        raise TypeError(
            f"alibi_slopes: expected a float32 array, got "
            f"{type(alibi_slopes).__module__}.{type(alibi_slopes).__name__}"
        )
    dt = np.dtype(alibi_slopes.dtype)
    if any_float:
        if dt.kind != "f":
            raise TypeError(f"alibi_slopes: expected a floating-point array, got dtype {dt}")
    elif dt != _F32:
        raise TypeError(f"alibi_slopes: expected float32, got dtype {dt}")
    shape = tuple(int(n) for n in alibi_slopes.shape)
    if shape not in ((nhead_q,), (batch, nhead_q)):
        raise ValueError(
            f"alibi_slopes: expected shape ({nhead_q},) [nhead_q] or ({batch}, {nhead_q}) "
            f"[batch, nhead_q], got {shape}"
        )
    return shape


def check_dropout(dropout_p=0.0, seed=0, offset=0) -> Dropout:
    """Check dropout settings: ``dropout_p`` a real number in [0, 1); ``seed`` and ``offset``
    integers in [0, 2**64) (Python or NumPy integers).

    Raises:
        TypeError: non-number p, non-integer seed/offset.  ValueError: out of range.
    """
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p: expected a real number in [0, 1), got {dropout_p!r}")
    p = float(dropout_p)
    if not (math.isfinite(p) and 0.0 <= p < 1.0):
        raise ValueError(f"dropout_p: expected a number in [0, 1), got {dropout_p!r}")
    seed = check_uint64("seed", seed)
    offset = check_uint64("offset", offset)
    return Dropout(p, seed, offset, keep_threshold(p))


def check_flag(name: str, value) -> bool:
    """A bool option (Python or NumPy bool)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return bool(value)


def check_return_dbias(return_dbias, bias) -> bool:
    """``return_dbias=True`` needs an explicit ``bias`` (ALiBi slopes have no gradient here)."""
    flag = check_flag("return_dbias", return_dbias)
    if flag and bias is None:
        raise ValueError(
            "return_dbias: True needs bias= (dbias is the gradient of an explicit bias)"
        )
    return flag


def check_dlse(dlse, lse, named=(), varlen: bool = False) -> None:
    """The backward's optional ``dlse``, the cotangent of the forward's lse (``None``: zero): a
    float32 array of lse's shape ([batch, nhead_q, seqlen_q]; group mode [batch, nhead_q,
    max_seqlen_q]), on the device of the other arrays (``named``: ``(name, array)`` pairs, lse's
    included) when it is a CuPy array; any strides (it is only read, by an elementwise
    subtraction). ``lse`` must have been checked already; ``varlen``: group mode (the message names
    max_seqlen_q).

    Raises:
        TypeError: not an array, not float32.  ValueError: not lse's shape, another GPU.
    """
    if dlse is None:
        return
    shape = tuple(int(n) for n in lse.shape)
    if not _is_array(dlse):
        raise TypeError(f"dlse: expected a float32 array of lse's shape {shape} (lse's cotangent) or None, got "
                        f"{type(dlse).__module__}.{type(dlse).__name__}")
    dt, lse_dt = np.dtype(dlse.dtype), np.dtype(lse.dtype)
    if dt != _F32:  # (lse is float32 but on the ring's CPU model, whose lse is float64)
        why = "lse's dtype" if lse_dt == _F32 else f"also where lse is {lse_dt}, as on the ring's CPU model"
        raise TypeError(f"dlse: expected float32 ({why}), got dtype {dt}")
    if tuple(int(n) for n in dlse.shape) != shape:
        what = "max_seqlen_q" if varlen else "seqlen_q"
        raise ValueError(f"dlse: expected lse's shape {shape} [batch, nhead_q, {what}], got {tuple(dlse.shape)}")
    _check_devices([*named, ("dlse", dlse)])


_TOO_HARD = getattr(np, "exceptions", np).TooHardError  # (numpy.exceptions from NumPy 1.25)


def _byte_view(a) -> np.ndarray:
    """A NumPy array at ``a``'s device address with its shape and strides, for NumPy's overlap
    solver, which only does arithmetic on addresses: nothing is ever read through it."""
    item = np.dtype(a.dtype).itemsize

    class _At:
        __array_interface__ = {"shape": tuple(int(n) for n in a.shape), "typestr": f"|V{item}",
                               "data": (int(a.data.ptr), False), "strides": tuple(int(s) for s in a.strides),
                               "version": 3}
    return np.asarray(_At())


def _extent(a) -> tuple[int, int]:
    """The device byte range [lo, hi) a non-empty array's elements lie in."""
    lo = hi = int(a.data.ptr)
    for n, st in zip(a.shape, a.strides):
        reach = int(st) * (int(n) - 1)
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return lo, hi + np.dtype(a.dtype).itemsize


def shares_memory(a, b) -> bool:
    """Whether two device arrays have an element in common, decided exactly on their addresses,
    shapes and strides (interleaved views of one buffer, e.g. dq / dk / dv of a packed [b, s, 3, h,
    d] gradient, do not); True where NumPy's solver gives up (a bounded search)."""
    if a.size == 0 or b.size == 0:
        return False
    (alo, ahi), (blo, bhi) = _extent(a), _extent(b)
    if ahi <= blo or bhi <= alo:  # (separate allocations: decided here, without NumPy's solver)
        return False
    try:
        return bool(np.shares_memory(_byte_view(a), _byte_view(b), max_work=1 << 20))
    except _TOO_HARD:
        return True


def _overlaps_itself(a) -> bool:
    """Whether two elements of ``a`` may share memory: a zero stride (a broadcast view), or strides
    that do not nest (each, sorted, at least the span of the smaller ones: sufficient for distinct
    elements, and true of every view of a dense buffer)."""
    span = np.dtype(a.dtype).itemsize
    for stride, n in sorted((abs(int(s)), int(n)) for n, s in zip(a.shape, a.strides) if int(n) > 1):
        if stride < span:
            return True
        span += stride * (n - 1)
    return False


def check_out(array_type, device_id: int, out, names, shapes, dtypes, inputs=()):
    """Caller-provided output buffers (``out=``): a tuple of ``array_type`` arrays (CuPy's
    ndarray) with the expected shapes and dtypes on device ``device_id``, unit last stride and
    16-byte aligned rows (lse: C-contiguous), whose elements are distinct and share no memory
    with each other or with any of ``inputs`` (``(name, array)`` pairs: the arrays the call reads;
    only those of ``array_type`` can alias). Returns ``out``.

    Raises:
        TypeError, ValueError: naming ``out`` and the buffer.
    """
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        raise TypeError(f"out: expected a tuple ({', '.join(names)}) of CuPy arrays, got {type(out).__name__}")
    for name, a, shape, dt in zip(names, out, shapes, dtypes):
        if not isinstance(a, array_type):
            raise TypeError(f"out: {name} must be a CuPy array, got {type(a).__name__}")
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"out: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
        if a.dtype != dt:
            raise TypeError(f"out: {name} must have dtype {np.dtype(dt).name}, got {a.dtype.name}")
        if a.device.id != device_id:
            raise ValueError(f"out: {name} is on GPU {a.device.id}, not the current device")
        if a.size == 0:  # nothing to address (group mode: every sequence empty)
            continue
        if name == "lse":
            if not a.flags.c_contiguous:
                raise ValueError("out: lse must be C-contiguous")
        elif a.strides[-1] != a.itemsize or a.data.ptr % 16 or any(
                (s // a.itemsize) % 8 for s in a.strides[:-1]):
            raise ValueError(f"out: {name} needs a unit last stride and 16-byte aligned rows")
        if any(s < 0 for s in a.strides):  # the TMA stores take positive strides only
            raise ValueError(f"out: {name} has negative strides {tuple(a.strides)} (bytes); pass a buffer "
                             "with non-negative strides")
        if _overlaps_itself(a):
            raise ValueError(f"out: {name}'s strides {tuple(a.strides)} (bytes) let elements share memory "
                             f"(a broadcast view?); pass a buffer with one address per element")
    # byte ranges once per array; NumPy's exact solver only where two ranges meet
    written = [(n, a, _extent(a)) for n, a in zip(names, out) if a.size]
    read = [(n, b, _extent(b)) for n, b in inputs if isinstance(b, array_type) and b.size]

    def meet(x, y):
        return x[2][0] < y[2][1] and y[2][0] < x[2][1] and shares_memory(x[1], y[1])

    for i, w in enumerate(written):
        for other in written[:i]:
            if meet(w, other):
                raise ValueError(f"out: {other[0]} and {w[0]} share memory; pass separate buffers")
        for r in read:
            if meet(w, r):
                raise ValueError(f"out: {w[0]} shares memory with the input {r[0]}, which the kernels "
                                 f"read while they write it; pass a separate buffer")
    return out
