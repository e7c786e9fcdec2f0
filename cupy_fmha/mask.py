"""Attention masks as CK's generic (y, x) window.

A mask is a window in (query row ``i``, key column ``j``) space with a top-left origin
(ck_tile ``block_masking.hpp``, CK example ``mask.hpp``): row ``i`` sees key ``j`` iff

    i - y + 1 <= j < i + x        and   0 <= j < seqlen_k

``MaskSpec`` keeps a mask independent of the sequence lengths (so one spec serves every
sequence of a variable-length batch); ``MaskSpec.window(seqlen_q, seqlen_k)`` resolves it to
``Window(y, x)`` for one pair of lengths.

Accepted forms:

* CK's strings (as CK tile's example ``mask.hpp`` decodes them): ``0`` no mask; ``1``/``t``
  causal top-left; ``2``/``b`` causal bottom-right; ``t:l,r`` / ``b:l,r`` sliding window (left,
  right sizes, negative = unlimited) from the top-left / bottom-right corner; ``xt:w`` /
  ``xb:w`` xformers-style window of width ``w`` (left = w // 2, right = w - 1 - left; ``w <= 0``
  means causal from that corner, as in CK); ``g:y,x`` a raw window.
* FlashAttention's ``causal=True`` and ``window_size=(left, right)``: bottom-right aligned,
  ``-1`` = unlimited.

Every number must satisfy ``|v| <= 2**62`` (``SIZE_MAX``), so that window arithmetic such as
``1 + left + seqlen_q - seqlen_k`` stays in NumPy's int64; a larger one is a ``ValueError``
naming ``mask`` or ``window_size`` (it used to be an ``OverflowError`` from NumPy). Sizes of at
least the sequence lengths already mean "unlimited" (the kernels clamp the window to +-2**30),
so nothing is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the largest magnitude of a mask size or window coordinate: window arithmetic stays in int64
SIZE_MAX = 2**62

#: MaskSpec's kinds
MASK_KINDS = ("none", "top_left", "bottom_right", "generic")

__all__ = [
    "SIZE_MAX",
    "MaskSpec",
    "Window",
    "parse_mask",
    "resolve_mask",
    "check_causal",
    "dense_mask",
    "q_tile_range",
    "k_tile_range",
    "tile_needs_mask",
]


@dataclass(frozen=True)
class Window:
    """A resolved CK window: row ``i`` sees keys ``j`` with ``i - y + 1 <= j < i + x``."""

    y: int
    x: int

    def key_range(self, i: int, seqlen_k: int) -> tuple[int, int]:
        """Half-open range ``[lo, hi)`` of keys row ``i`` sees (empty when ``hi <= lo``)."""
        return max(i - self.y + 1, 0), min(i + self.x, seqlen_k)


@dataclass(frozen=True)
class MaskSpec:
    """A mask independent of sequence lengths.

    kind: ``"none"``, ``"top_left"``, ``"bottom_right"`` (windows with ``left``/``right``
    sizes, negative = unlimited) or ``"generic"`` (``left``/``right`` hold raw ``y``/``x``).
    """

    kind: str = "none"
    left: int = -1
    right: int = -1

    def __post_init__(self):
        """Refuse what no mask means: an unknown kind, sizes that are not ints (bools included) or
        beyond ``SIZE_MAX``; NumPy ints become Python ints.

        Raises:
            ValueError, TypeError: naming ``mask``."""
        if self.kind not in MASK_KINDS:
            raise ValueError(f"mask: MaskSpec kind must be one of {MASK_KINDS}, got {self.kind!r}")
        for field in ("left", "right"):
            v = getattr(self, field)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"mask: MaskSpec {field} must be an int, got {v!r}")
            if abs(int(v)) > SIZE_MAX:
                raise ValueError(f"mask: MaskSpec {field}={v} is out of range (|size| <= 2**62; a size of at "
                                 "least the sequence length already means unlimited)")
            object.__setattr__(self, field, int(v))

    @property
    def is_none(self) -> bool:
        return self.kind == "none"

    def window(self, seqlen_q: int, seqlen_k: int) -> Window | None:
        """Resolve to ``Window(y, x)`` for these lengths; ``None`` for no mask."""
        if self.kind == "none":
            return None
        if self.kind == "generic":
            return Window(self.left, self.right)
        big = max(seqlen_q, seqlen_k) + 1  # "unlimited": enough to reach every key
        left = big if self.left < 0 else self.left
        right = big if self.right < 0 else self.right
        if self.kind == "top_left":
            return Window(1 + left, 1 + right)
        if self.kind == "bottom_right":
            return Window(1 + left + seqlen_q - seqlen_k, 1 + right + seqlen_k - seqlen_q)
        raise ValueError(f"unknown mask kind {self.kind!r}")

    def describe(self) -> str:
        """CK-style string for this mask (round-trips through ``parse_mask``)."""
        if self.kind == "none":
            return "0"
        if self.kind == "generic":
            return f"g:{self.left},{self.right}"
        corner = "t" if self.kind == "top_left" else "b"
        if self.left < 0 and self.right == 0:
            return corner
        return f"{corner}:{self.left},{self.right}"


def _ints(text: str, n: int, what: str) -> list[int]:
    parts = text.split(",")
    if len(parts) != n:
        raise ValueError(f"mask: {what!r} needs {n} comma-separated integers, got {text!r}")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"mask: {what!r} needs integers, got {text!r}") from None
    for v in vals:
        if abs(v) > SIZE_MAX:
            raise ValueError(
                f"mask: {what!r}: {v} is out of range (|size| <= 2**62; a size of at least the "
                "sequence length already means unlimited)"
            )
    return vals


def parse_mask(mask: str | int | None) -> MaskSpec:
    """Parse CK's mask string (``0``, ``t``, ``b``, ``t:l,r``, ``b:l,r``, ``xt:w``, ``xb:w``,
    ``g:y,x``; also ``1``/``2`` for ``t``/``b``) into a :class:`MaskSpec`.

    Raises:
        ValueError: naming ``mask`` when the string does not parse.
        TypeError: naming ``mask`` when it is not a string, an int or a MaskSpec.
    """
    if mask is None:
        return MaskSpec()
    if isinstance(mask, MaskSpec):
        return mask
    if isinstance(mask, (bool, np.bool_)) or not isinstance(mask, (str, int, np.integer)):
        raise TypeError(f"mask: expected a CK mask string (e.g. 't', 'b:64,0'), an int 0 / 1 / 2 or a MaskSpec, "
                        f"got {mask!r}")
    s = str(int(mask) if isinstance(mask, np.integer) else mask).strip()
    if s in ("0", "n", "none", ""):
        return MaskSpec()
    if s in ("1", "t"):
        return MaskSpec("top_left", -1, 0)
    if s in ("2", "b"):
        return MaskSpec("bottom_right", -1, 0)
    head, sep, tail = s.partition(":")
    if not sep:
        raise ValueError(
            f"mask: cannot parse {mask!r}; expected one of 0, t, b, t:l,r, b:l,r, xt:w, xb:w, g:y,x"
        )
    if head in ("t", "b"):
        left, right = _ints(tail, 2, s)
        kind = "top_left" if head == "t" else "bottom_right"
        return MaskSpec(kind, max(left, -1), max(right, -1))  # any negative size = unlimited (-1)
    if head in ("xt", "xb"):
        (w,) = _ints(tail, 1, s)
        kind = "top_left" if head == "xt" else "bottom_right"
        if w <= 0:
            return MaskSpec(kind, -1, 0)
        left = w // 2
        return MaskSpec(kind, left, w - 1 - left)
    if head == "g":
        y, x = _ints(tail, 2, s)
        return MaskSpec("generic", y, x)
    raise ValueError(
        f"mask: cannot parse {mask!r}; expected one of 0, t, b, t:l,r, b:l,r, xt:w, xb:w, g:y,x"
    )


def check_causal(causal) -> bool:
    """``causal`` as a bool: a Python or NumPy bool, or the ints 0 / 1.

    Raises:
        TypeError: naming ``causal`` for anything else (a traced JAX value included)."""
    if not isinstance(causal, (bool, np.bool_)) and not (
        isinstance(causal, (int, np.integer)) and causal in (0, 1)
    ):
        raise TypeError(f"causal: expected a bool, got {causal!r}")
    return bool(causal)


def resolve_mask(
    mask: str | MaskSpec | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
) -> MaskSpec:
    """Combine CK's ``mask=`` string with FlashAttention's ``causal``/``window_size``.

    FlashAttention's options are bottom-right aligned; ``causal=True`` sets ``right = 0``.
    Giving both ``mask`` and ``causal``/``window_size`` is an error.

    Raises:
        ValueError: naming ``mask``, ``causal`` or ``window_size``.
        TypeError: ``causal`` is not a bool (or 0 / 1), ``mask`` not a string, int or MaskSpec.
    """
    causal = check_causal(causal)
    try:
        pair = tuple(window_size)
    except TypeError:
        pair = ()
    if len(pair) != 2 or not all(
        isinstance(w, (int, np.integer)) and not isinstance(w, (bool, np.bool_)) for w in pair
    ):
        raise ValueError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    left, right = (int(w) for w in pair)
    if max(abs(left), abs(right)) > SIZE_MAX:
        raise ValueError(
            f"window_size: {window_size!r} is out of range (|size| <= 2**62; -1 or a size of at "
            "least the sequence length means unlimited)"
        )
    fa_given = bool(causal) or (left, right) != (-1, -1)
    spec = parse_mask(mask)  # a "no mask" value (None, "0", 0, MaskSpec()) defers to causal/window
    if not spec.is_none:
        if fa_given:
            raise ValueError("mask: give either mask= or causal=/window_size=, not both")
        return spec
    if left < -1 or right < -1:
        raise ValueError(f"window_size: sizes must be >= -1 (-1 = unlimited), got {window_size!r}")
    if causal:
        right = 0
    if left < 0 and right < 0:
        return MaskSpec()
    return MaskSpec("bottom_right", left, right)


def dense_mask(spec: MaskSpec | Window | None, seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """Boolean [seqlen_q, seqlen_k] array, True where row i sees key j."""
    win = spec.window(seqlen_q, seqlen_k) if isinstance(spec, MaskSpec) else spec
    if win is None:
        return np.ones((seqlen_q, seqlen_k), dtype=bool)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    return (j >= i - win.y + 1) & (j < i + win.x)


def q_tile_range(win: Window | None, k0: int, kN0: int, kM0: int, seqlen_q: int) -> tuple[int, int]:
    """CK's ``GetTileRangeAlongY``: the tile-aligned range ``[q_start, q_end)`` of query rows that
    can see keys ``[k0, k0 + kN0)``. Empty when ``q_end <= q_start``."""
    if win is None:
        return 0, seqlen_q
    lo = max(k0 - win.x + 1, 0)
    hi = min(k0 + kN0 - 1 + win.y, seqlen_q)
    lo = (lo // kM0) * kM0
    hi = -(-hi // kM0) * kM0 if hi > 0 else 0
    return lo, max(hi, lo)


def k_tile_range(win: Window | None, q0: int, kM0: int, kN0: int, seqlen_k: int) -> tuple[int, int]:
    """The tile-aligned range ``[k_start, k_end)`` of keys that rows ``[q0, q0 + kM0)`` can see."""
    if win is None:
        return 0, seqlen_k
    lo = max(q0 - win.y + 1, 0)
    hi = min(q0 + kM0 - 1 + win.x, seqlen_k)
    lo = (lo // kN0) * kN0
    hi = -(-hi // kN0) * kN0 if hi > 0 else 0
    return lo, max(hi, lo)


def tile_needs_mask(
    win: Window | None, q0: int, k0: int, kM0: int, kN0: int, seqlen_q: int, seqlen_k: int
) -> bool:
    """True when the tile [q0, q0+kM0) x [k0, k0+kN0) crosses a window edge or a sequence end,
    so per-element tests are needed; False when every element is visible."""
    if q0 + kM0 > seqlen_q or k0 + kN0 > seqlen_k:
        return True
    if win is None:
        return False
    # every row i in the tile must see every column: lowest row's left edge and highest's right
    return not (k0 >= q0 + kM0 - 1 - win.y + 1 and k0 + kN0 <= q0 + win.x)
