"""Merging partial attention results by their log-sum-exp (NumPy or CuPy arrays).

If the keys of one query row are split into disjoint sets ``K_1 .. K_n`` and attention over each
set gives ``(o_i, lse_i)`` (``lse_i = log sum_{j in K_i} exp(s_j)``, ``o_i`` normalized within
the set), then over all keys

    lse = log sum_i exp(lse_i)              (a log-sum-exp of the partial lse's)
    o   = sum_i exp(lse_i - lse) * o_i

This is how ring attention (Liu et al., 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context") and blockwise/flash attention combine blocks. A set the row sees nothing
of has ``lse_i = -inf`` and ``o_i = 0``: its weight is ``exp(-inf) = 0``; a row that sees nothing
at all keeps ``lse = -inf`` and ``o = 0`` (no NaN, the library's convention).

The backward needs no merge: with the global ``o`` and ``lse``, each partial backward is exact
(``P = exp(S - lse)`` is already the global softmax restricted to the set, and ``D =
rowsum(dO * O)`` depends only on the row), and dQ, dK, dV are sums of the partials.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lse_view", "merge_into", "merge_partials"]


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def lse_view(lse, layout: str):
    """An lse-shaped array [batch, heads, seqlen] viewed to broadcast against o (``bshd``:
    [batch, seqlen, heads, 1]; ``bhsd``: [batch, heads, seqlen, 1])."""
    if layout == "bshd":
        return lse.transpose(0, 2, 1)[..., None]
    if layout == "bhsd":
        return lse[..., None]
    raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")


def _check_pair(o, lse, layout: str, o_name: str, lse_name: str) -> None:
    """``o`` a rank-4 array in ``layout`` and ``lse`` [batch, heads, seqlen] of the same rows."""
    for name, a, rank in ((o_name, o, 4), (lse_name, lse, 3)):
        if not all(hasattr(a, x) for x in ("shape", "dtype", "astype")):
            raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(a).__name__}")
        if len(a.shape) != rank:
            raise ValueError(f"{name}: expected rank {rank}, got shape {tuple(a.shape)}")
    b, x1, x2, _ = (int(n) for n in o.shape)
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    want = (b, x2, x1) if layout == "bshd" else (b, x1, x2)
    if tuple(int(n) for n in lse.shape) != want:
        raise ValueError(f"{lse_name}: expected shape {want} ([batch, heads, seqlen] of {o_name}, {layout}), "
                         f"got {tuple(lse.shape)}")


_ACC_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_acc(o_acc, lse_acc) -> None:
    """The accumulators: float32 or float64, one dtype for both, writable (checked before
    anything is written: a failure half-way would leave o_acc scaled but lse_acc not)."""
    for name, a in (("o_acc", o_acc), ("lse_acc", lse_acc)):
        if np.dtype(a.dtype) not in _ACC_DTYPES:
            raise TypeError(f"{name}: expected a float32 or float64 accumulator, got dtype {a.dtype}")
        if not getattr(getattr(a, "flags", None), "writeable", True):
            raise ValueError(f"{name}: the accumulator is read-only (merge_into writes it in place)")
    if np.dtype(lse_acc.dtype) != np.dtype(o_acc.dtype):
        raise TypeError(f"lse_acc: dtype {lse_acc.dtype} differs from o_acc's {o_acc.dtype} (one accumulation "
                        "dtype for both)")


def merge_into(o_acc, lse_acc, o_part, lse_part, layout: str = "bshd") -> None:
    """Fold one partial result into running accumulators, in place.

    Args:
        o_acc: float32/float64 [batch, seqlen, heads, dv] (``bshd``) or [batch, heads, seqlen,
            dv] (``bhsd``): the running output, normalized (0 where lse_acc is -inf). May be a
            view (a row range of a larger accumulator).
        lse_acc: same float dtype, [batch, heads, seqlen], natural log, -inf = nothing yet.
        o_part: the partial output (any float dtype, e.g. bf16), o_acc's shape.
        lse_part: float32/float64 [batch, heads, seqlen], -inf for rows that saw no key.
        layout: ``"bshd"`` or ``"bhsd"``.

    Raises:
        TypeError, ValueError: an argument that is not an array, or of another shape than the
            accumulators' (nothing is broadcast), or a bad ``layout``; accumulators that are not
            float32/float64 of one dtype, or read-only. Nothing is written then.
    """
    _check_pair(o_acc, lse_acc, layout, "o_acc", "lse_acc")
    _check_pair(o_part, lse_part, layout, "o_part", "lse_part")
    _check_acc(o_acc, lse_acc)
    if tuple(o_part.shape) != tuple(o_acc.shape):
        raise ValueError(f"o_part: shape {tuple(o_part.shape)} differs from o_acc's {tuple(o_acc.shape)}")
    xp = _xp(o_acc)
    new = xp.logaddexp(lse_acc, lse_part.astype(lse_acc.dtype, copy=False))
    safe = xp.where(xp.isneginf(new), lse_acc.dtype.type(0), new)
    w_acc = xp.exp(lse_acc - safe)  # exp(-inf) = 0 for an empty side; 0/0 never happens
    w_part = xp.exp(lse_part - safe)
    o_acc *= lse_view(w_acc, layout)
    # explicit casts: no mixed bf16/float32 arithmetic is asked of CuPy
    o_acc += o_part.astype(o_acc.dtype, copy=False) * lse_view(w_part.astype(o_acc.dtype, copy=False), layout)
    lse_acc[...] = new


def merge_partials(parts, layout: str = "bshd", dtype=np.float64):
    """``(o, lse)`` of attention over the union of the key sets of ``parts`` (a non-empty list of
    ``(o_i, lse_i)`` of one shape), accumulated in ``dtype`` (float32 or float64).

    Raises:
        TypeError, ValueError: an empty list, an entry that is not a pair of arrays, shapes that
            differ (see :func:`merge_into`), a ``dtype`` other than float32/float64.
    """
    if hasattr(parts, "shape") or not hasattr(parts, "__iter__"):
        raise TypeError(f"parts: expected a list of (o, lse) pairs, got {type(parts).__name__}")
    parts = list(parts)
    if not parts:
        raise ValueError("parts: expected at least one (o, lse) pair")
    for i, p in enumerate(parts):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise TypeError(f"parts[{i}]: expected an (o, lse) pair, got {type(p).__name__}")
        _check_pair(p[0], p[1], layout, f"parts[{i}][0]", f"parts[{i}][1]")
    try:
        acc = np.dtype(dtype)
    except TypeError:
        acc = np.dtype(object)
    if acc not in _ACC_DTYPES:
        raise TypeError(f"dtype: expected float32 or float64 (the accumulation dtype), got {dtype!r}")
    xp = _xp(parts[0][0])
    o = xp.zeros(parts[0][0].shape, dtype=acc)
    lse = xp.full(parts[0][1].shape, -np.inf, dtype=acc)
    for o_i, lse_i in parts:
        merge_into(o, lse, o_i, lse_i, layout)
    return o, lse
