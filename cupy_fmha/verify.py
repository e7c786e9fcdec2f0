"""The tolerance rule used by the tests, the CLI and the benchmarks.

``compare(name, out, ref, ref_low, dtype=..., hdim_q=..., hdim_v=...)`` judges a GPU result
``out`` against the float64 reference ``ref`` and, optionally, the emulated same-precision
reference ``ref_low`` (:func:`cupy_fmha.reference.attention_forward` with ``precision="low"``).

The rule (all must hold):

1. **Finite where expected.** No NaN anywhere (unwritten, poisoned outputs are NaN). ``-inf``
   (LSE of rows with no visible key) must appear in ``out`` exactly where it appears in ``ref``;
   those entries are then left out of every norm. Any other infinity fails (in ``ref`` too).
2. **Relative error** ``rel_err = ||out - ref|| / ||ref||`` (Frobenius; ``||out||`` when
   ``||ref|| == 0``; 0 when both are 0) below ``limit``: 1e-2, or 3e-2 for bf16 when
   ``max(hdim_q, hdim_v) > 128`` (CK's rule). When ``ref_low`` is given, ``rel_err`` may
   instead be at most ``2 * rel_err_low``: this escape only matters where the plain
   implementation itself is off by more than ``limit / 2``, i.e. where the exact result is
   nearly zero through cancellation (for example dQ and dK when every row sees one key, which
   are exactly 0 in exact arithmetic); rule 3 still binds there. A reference that is zero (root
   mean square below ``ZERO_RMS`` = 1e-10: float64 noise; or below ``SMALL_RMS`` = 1e-6 when
   ``ref_low`` misses it by the relative limit itself: cancellation) is judged by an absolute bound
   instead, 16 unit roundoffs for unit-scale inputs, or rule 3's bound where that is larger.
3. **FlashAttention's rule** (when ``ref_low`` is given):
   ``max_err <= 2 * max_err_low + eps``, ``eps = 1e-5 + 2 * u * max|ref|`` with ``u`` the unit
   roundoff of the dtype (2^-11 fp16, 2^-8 bf16). ``eps`` is about two roundings of the largest
   value (a kernel must round its output once when storing it, and rounds P or dS once more for
   a GEMM): it keeps the rule from flaking where the plain implementation happens to be (nearly)
   exact, e.g. one visible key per row, while a real bug (one wrong or missing tile, a missed K
   block: errors of several percent of the values) still exceeds it by an order of magnitude
   (0.1% of max|ref| for fp16, 0.8% for bf16).

Known limit: dQ and dK of *tiny* problems where every row sees only 2 or 3 keys (a handful of
query-key pairs per head) are dominated by cancellation in ``dP - D``; a correct fp32-accumulating
kernel can then be 3-5x less accurate than the plain implementation (simulated), and CK's relative
rule fails there too. Tests should not use such cases; with tens of rows or more they pass with
margin (the worst simulated ratio stays below the bound for every mask kind).

Why not "max rule OR relative rule": with bf16 ``rel_err_low`` is about 4e-3, so "``rel_err <=
2 * rel_err_low``" alone would accept a tile whose values are off by ~10% when that tile is under
1% of the tensor. The max rule is the one that sees a single bad tile, so it is always required.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["Check", "compare", "rel_limit", "bf16_bits_to_float", "float_to_bf16_bits"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_UNIT_ROUNDOFF = {_F16: 2.0**-11, _BF16: 2.0**-8, np.dtype(np.float32): 2.0**-24}

#: a reference whose root mean square is below this is taken as exactly zero (the float64 noise
#: of a mathematically zero output) and judged by an absolute bound; anything larger by the
#: relative rule
ZERO_RMS = 1e-10
#: below this, a reference the same-precision reference cannot reproduce is taken as noise as well
SMALL_RMS = 1e-6


@dataclass
class Check:
    """Outcome of :func:`compare`.

    ``limit`` is the relative-error limit; ``max_limit`` the FlashAttention bound on ``max_err``
    (``None`` without ``ref_low``); ``reason`` says why a check failed ("" when ok).
    """

    name: str
    max_err: float
    rel_err: float
    ok: bool
    limit: float
    max_err_low: float | None = None
    rel_err_low: float | None = None
    max_limit: float | None = None
    reason: str = ""

    def __str__(self) -> str:
        s = f"{self.name}: max_err={self.max_err:.3e} rel_err={self.rel_err:.3e} (limit {self.limit:g})"
        if self.max_limit is not None:
            s += (
                f" low: max_err={self.max_err_low:.3e} rel_err={self.rel_err_low:.3e}"
                f" max_limit={self.max_limit:.3e}"
            )
        return s + (" ok" if self.ok else f" FAIL: {self.reason}")


def _dtype(dtype) -> np.dtype:
    if isinstance(dtype, str):
        key = dtype.lower()
        if key in ("float16", "fp16", "half"):
            return _F16
        if key in ("bfloat16", "bf16"):
            return _BF16
        if key in ("float32", "fp32"):
            return np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in _UNIT_ROUNDOFF:
        raise ValueError(f"dtype: expected float16, bfloat16 or float32, got {dtype!r}")
    return dt


def rel_limit(dtype, hdim_q: int, hdim_v: int) -> float:
    """CK's relative tolerance: 1e-2, or 3e-2 for bf16 with a head dim above 128."""
    return 3e-2 if _dtype(dtype) == _BF16 and max(hdim_q, hdim_v) > 128 else 1e-2


def _f64(a) -> np.ndarray:
    if not isinstance(a, np.ndarray) and hasattr(a, "get"):
        a = a.get()
    a = np.asarray(a)
    if a.dtype == np.uint16:
        raise TypeError("compare: got uint16 (bf16 bits?); convert with bf16_bits_to_float first")
    if a.dtype.kind not in "fiub" and a.dtype != _BF16:
        raise TypeError(f"compare: expected a real array, got dtype {a.dtype}")
    return a.astype(np.float64)


def _errs(out: np.ndarray, ref: np.ndarray, keep: np.ndarray) -> tuple[float, float]:
    diff = out[keep] - ref[keep]
    max_err = float(np.max(np.abs(diff))) if diff.size else 0.0
    num = float(np.linalg.norm(diff))
    den = float(np.linalg.norm(ref[keep]))
    if den == 0.0:
        den = float(np.linalg.norm(out[keep]))
    rel = 0.0 if num == 0.0 else (num / den if den > 0 else math.inf)
    return max_err, rel


def compare(name, out, ref, ref_low=None, *, dtype, hdim_q: int, hdim_v: int) -> Check:
    """Judge ``out`` against ``ref`` (and ``ref_low``) by the module's rule.

    Args:
        name: label for messages (``"o"``, ``"dq"``...).
        out: the result under test: NumPy or CuPy (``.get()`` is used), any float dtype; bf16
            results held as uint16 bits must be converted first (:func:`bf16_bits_to_float`).
        ref: float64 reference of the same shape.
        ref_low: optional same-precision reference (``precision="low"``).
        dtype: the inputs' dtype (``"float16"``/``"bfloat16"`` or the NumPy dtypes).
        hdim_q, hdim_v: head dims (select the bf16 limit).

    Returns:
        :class:`Check`.

    Raises:
        ValueError: shapes differ; TypeError: uint16 input.
    """
    dt = _dtype(dtype)
    limit = rel_limit(dt, hdim_q, hdim_v)
    out, ref = _f64(out), _f64(ref)
    if out.shape != ref.shape:
        raise ValueError(f"{name}: shape {out.shape} does not match the reference's {ref.shape}")
    low = None if ref_low is None else _f64(ref_low)
    if low is not None and low.shape != ref.shape:
        raise ValueError(f"{name}: ref_low shape {low.shape} does not match ref's {ref.shape}")

    reasons = []
    ref_ninf = np.isneginf(ref)
    keep = ~ref_ninf
    n_nan = int(np.isnan(out).sum())
    if n_nan:
        reasons.append(f"{n_nan} NaN")
    if np.isnan(ref).any():
        reasons.append("NaN in the reference")
    if np.isposinf(ref).any():  # (attention has none: lse's empty rows are -inf)
        reasons.append("+inf in the reference")
    if not np.array_equal(np.isneginf(out), ref_ninf):
        reasons.append("-inf entries do not match the reference's")
    bad_inf = np.isinf(out) & keep
    if bad_inf.any():
        reasons.append(f"{int(bad_inf.sum())} unexpected inf")
    keep &= np.isfinite(out) & np.isfinite(ref)
    max_err, rel_err = _errs(out, ref, keep)
    if reasons:  # errors over the finite part are still reported
        return Check(name, max_err, rel_err, False, limit, reason="; ".join(reasons))

    chk = Check(name, max_err, rel_err, True, limit)
    if low is not None:
        low_keep = keep & np.isfinite(low)
        chk.max_err_low, chk.rel_err_low = _errs(low, ref, low_keep)
        amax = float(np.max(np.abs(ref[keep]))) if keep.any() else 0.0
        chk.max_limit = 2.0 * chk.max_err_low + 1e-5 + 2.0 * _UNIT_ROUNDOFF[dt] * amax
        if max_err > chk.max_limit:
            reasons.append(f"max_err {max_err:.3e} > 2 * max_err_low + eps = {chk.max_limit:.3e}")
    # An output that is mathematically zero (e.g. dq, dk when every row sees one key: dS = 0)
    # leaves only rounding noise, so the relative test is meaningless there; such outputs are
    # judged by an absolute bound instead: 16 unit roundoffs of the input dtype, for inputs of
    # unit scale. When ref_low is given, its own noise sets the bar instead where that is larger:
    # e.g. dBias of a bias constant along the keys is exactly 0, but any implementation that
    # stores O in fp16 gets sum_j dS_ij = sum_j P dP - D of the order of fp16's rounding of O,
    # whatever the (fp32) bias dtype passed here.
    # "Zero" means float64 rounding noise (about 1e-16 of the operands, whose scale is 1 in the
    # tests), not a small result: below ZERO_RMS; a reference of rms 1e-7 (a scaled loss's
    # gradients) is judged by the relative rule like any other (an absolute bound of 16 ulps of
    # unit scale would pass anything there).
    # Between ZERO_RMS and SMALL_RMS a reference that the plain same-precision implementation cannot
    # reproduce to the relative limit (rel_err_low >= limit) is cancellation noise too (e.g. dQ under
    # ALiBi slopes so steep that P is nearly one-hot: dS = P (dP - D) with D from the rounded O), and
    # is judged the same way; one it reproduces is a real small result.
    ref_rms = float(np.sqrt(np.mean(ref[keep] ** 2))) if keep.any() else 0.0
    noise = low is not None and ref_rms < SMALL_RMS and not chk.rel_err_low < limit
    if ref_rms < ZERO_RMS or noise:
        atol = 16.0 * _UNIT_ROUNDOFF[dt]
        if low is not None:
            atol = max(atol, chk.max_limit)
        if max_err > atol:
            reasons.append(f"reference is zero; max_err {max_err:.3e} > {atol:.3e}")
    elif not rel_err < limit and not (low is not None and rel_err <= 2.0 * chk.rel_err_low):
        reasons.append(f"rel_err {rel_err:.3e} >= {limit:g}")
    chk.ok = not reasons
    chk.reason = "; ".join(reasons)
    return chk


def bf16_bits_to_float(a) -> np.ndarray:
    """uint16 raw bf16 bits (NumPy, or CuPy via ``.get()``) -> float32 NumPy array (exact)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get"):
        a = a.get()
    a = np.asarray(a)
    if a.dtype != np.uint16:
        raise TypeError(f"a: expected uint16 bf16 bits, got dtype {a.dtype}")
    return a.view(_BF16).astype(np.float32)


def float_to_bf16_bits(a) -> np.ndarray:
    """Float array -> uint16 raw bf16 bits, rounded to nearest even (NaN stays NaN)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get"):
        a = a.get()
    a = np.asarray(a)
    if a.dtype == _BF16:
        return np.ascontiguousarray(a).view(np.uint16)
    if a.dtype.kind != "f":
        raise TypeError(f"a: expected a float array, got dtype {a.dtype}")
    if a.dtype.itemsize > 4:
        a = _f64_to_f32_round_to_odd(a.astype(np.float64))
    return np.ascontiguousarray(a.astype(np.float32).astype(_BF16)).view(np.uint16)


def _f64_to_f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd (truncate, then set the last bit if inexact).

    ml_dtypes casts float64 to bf16 through a round-to-nearest float32, which double-rounds;
    rounding to odd first keeps the final round-to-nearest-even to bf16 exact (float32 carries
    16 more bits than bf16).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(np.float32)
        away = np.abs(r.astype(np.float64)) > np.abs(x)
        r = np.where(away & np.isfinite(x), np.nextafter(r, np.float32(0)), r)
        inexact = np.isfinite(x) & (r.astype(np.float64) != x)
    bits = r.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)
