"""FLOP and byte counts for attention, following FlashAttention's convention.

* forward: ``2 * pairs * (d + dv)`` per (batch, head), i.e. ``4 * sq * sk * d`` without a mask
  (two GEMMs: S = Q K^T and O = P V);
* plain causal masks (top-left or bottom-right, left unlimited, right 0) count half of the full
  ``sq * sk`` pairs, as FlashAttention's benchmarks do (whatever the exact count is);
* other windows count the exact number of visible (unmasked) pairs;
* backward: ``2 * pairs * (3 * d + 2 * dv)`` (five GEMMs: Q K^T, dO V^T, P^T dO, dS^T Q, dS K),
  which is 2.5 x forward when ``d == dv``.
"""

from __future__ import annotations

import numpy as np

from .mask import MaskSpec, Window, parse_mask

__all__ = ["visible_pairs", "any_visible", "attention_flops", "attention_bytes", "is_plain_causal"]

_MODES = ("fwd", "bwd")


def _window(mask_spec, seqlen_q: int, seqlen_k: int) -> Window | None:
    if isinstance(mask_spec, Window) or mask_spec is None:
        return mask_spec
    if not isinstance(mask_spec, MaskSpec):
        mask_spec = parse_mask(mask_spec)
    return mask_spec.window(seqlen_q, seqlen_k)


def visible_pairs(mask_spec: MaskSpec | Window | str | None, seqlen_q: int, seqlen_k: int) -> int:
    """Exact number of (query row, key) pairs visible under the mask, per (batch, head).

    Row ``i`` sees ``max(0, min(i + x, sk) - max(i - y + 1, 0))`` keys; the sum is taken over
    all rows with vectorized int64 NumPy (a million rows take milliseconds).

    Args:
        mask_spec: a :class:`MaskSpec`, a resolved :class:`Window`, a CK mask string or ``None``.
        seqlen_q, seqlen_k: sequence lengths (>= 0).
    """
    seqlen_q, seqlen_k = int(seqlen_q), int(seqlen_k)
    if seqlen_q < 0 or seqlen_k < 0:
        raise ValueError(f"seqlen: expected lengths >= 0, got {seqlen_q}, {seqlen_k}")
    win = _window(mask_spec, seqlen_q, seqlen_k)
    if win is None:
        return seqlen_q * seqlen_k
    # a window side beyond the sequences is the same as one just past them; clamped, int64 cannot
    # overflow for any size (windows up to SIZE_MAX = 2**62 reach here)
    x = min(max(int(win.x), -(seqlen_q + 1)), seqlen_k + 1)
    y = min(max(int(win.y), -(seqlen_k + 1)), seqlen_q + 1)
    i = np.arange(seqlen_q, dtype=np.int64)
    lo = np.maximum(i - (y - 1), 0)
    hi = np.minimum(i + x, seqlen_k)
    return int(np.maximum(hi - lo, 0).sum())


def any_visible(mask_spec: MaskSpec | Window | str | None, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether some query row sees some key (``visible_pairs(...) > 0``) in O(1): row ``i`` sees
    keys ``[max(i - y + 1, 0), min(i + x, sk))``, non-empty exactly when ``x + y > 1``,
    ``sk > 0`` and ``-x < i < sk + y - 1``; some row does when that range meets ``[0, sq)``.
    (Argument validation runs this on every call, so it must not cost O(seqlen_q).)"""
    seqlen_q, seqlen_k = int(seqlen_q), int(seqlen_k)
    if seqlen_q <= 0 or seqlen_k <= 0:
        return False
    win = _window(mask_spec, seqlen_q, seqlen_k)
    if win is None:
        return True
    y, x = int(win.y), int(win.x)
    if x + y <= 1:
        return False
    return max(0, 1 - x) <= min(seqlen_q - 1, seqlen_k + y - 2)


def is_plain_causal(mask_spec) -> bool:
    """True for a causal mask in FlashAttention's sense: top-left or bottom-right aligned,
    left unlimited, right 0 (counted as half of all pairs)."""
    if isinstance(mask_spec, Window) or mask_spec is None:
        return False
    spec = mask_spec if isinstance(mask_spec, MaskSpec) else parse_mask(mask_spec)
    return spec.kind in ("top_left", "bottom_right") and spec.left < 0 and spec.right == 0


def _check_mode(mode: str) -> str:
    if mode not in _MODES:
        raise ValueError(f"mode: expected 'fwd' or 'bwd', got {mode!r}")
    return mode


def attention_flops(
    batch: int,
    nhead_q: int,
    seqlen_q: int,
    seqlen_k: int,
    hdim_q: int,
    hdim_v: int,
    mask_spec: MaskSpec | Window | str | None,
    mode: str,
) -> int:
    """FLOPs of one attention forward (``mode="fwd"``) or backward (``"bwd"``) pass.

    FlashAttention's convention (see the module docstring): for no mask
    ``fwd = 4 * b * h * sq * sk * d`` (d == dv), halved for plain causal masks, exact visible
    pairs for other windows; ``bwd = 2 * pairs * (3 * d + 2 * dv)``.

    Raises:
        ValueError: ``mode`` not ``"fwd"``/``"bwd"``.
    """
    _check_mode(mode)
    per_pair = 2 * (hdim_q + hdim_v) if mode == "fwd" else 2 * (3 * hdim_q + 2 * hdim_v)
    bh = int(batch) * int(nhead_q)
    if is_plain_causal(mask_spec):
        # half of sq*sk pairs; per_pair is even, so the product stays an exact integer
        return bh * int(seqlen_q) * int(seqlen_k) * (per_pair // 2)
    return bh * visible_pairs(mask_spec, seqlen_q, seqlen_k) * per_pair


def attention_bytes(
    batch: int,
    nhead_q: int,
    seqlen_q: int,
    seqlen_k: int,
    hdim_q: int,
    hdim_v: int,
    mode: str,
    itemsize: int = 2,
    *,
    nhead_k: int | None = None,
) -> int:
    """Minimum global-memory traffic in bytes, each tensor read or written once.

    fwd: reads Q, K, V; writes O and LSE (float32). bwd: reads Q, K, V, O, dO, LSE; writes dQ,
    dK, dV (dK, dV with ``nhead_k`` heads; default ``nhead_k = nhead_q``). ``itemsize`` is the
    element size of Q/K/V/O and the gradients (2 for fp16/bf16).
    """
    _check_mode(mode)
    hk = nhead_q if nhead_k is None else nhead_k
    q = batch * nhead_q * seqlen_q * hdim_q
    k = batch * hk * seqlen_k * hdim_q
    v = batch * hk * seqlen_k * hdim_v
    o = batch * nhead_q * seqlen_q * hdim_v
    lse = batch * nhead_q * seqlen_q * 4
    if mode == "fwd":
        return (q + k + v + o) * itemsize + lse
    return (2 * (q + k + v) + 2 * o) * itemsize + lse
