"""Dense NumPy reference (the oracle) for attention forward and backward.

Maths (per batch b and query head h; K/V head ``h // (nhead_q // nhead_k)``)::

    S   = scale * Q K^T, masked entries = -inf
    LSE = logsumexp(S)              (rows with no visible key: -inf)
    P   = exp(S - LSE)              (rows with no visible key: 0)
    O   = P V
    D   = rowsum(dO * O)
    dV  = P^T dO                    (summed over each GQA group)
    dP  = dO V^T
    dS  = P * (dP - D)
    dQ  = scale * dS K
    dK  = scale * dS^T Q            (summed over each GQA group)

``precision="float64"`` (default) computes everything in float64 from the upcast inputs.
``precision="low"`` emulates a plain same-precision implementation, as FlashAttention's tests use
it to set their tolerance: float32 arithmetic, with S, P, O, dP, dS, dQ, dK and dV rounded to the
inputs' dtype (fp16, bf16; float32 for float32/float64 inputs) where such an implementation would
store them; LSE and D stay float32. Results are returned as float64 arrays either way.

The work is vectorized over heads (one matmul per GEMM per batch entry); memory is about six
[nhead_q, sq, sk] float64 arrays at a time.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .mask import dense_mask
from .validate import check_reference_inputs

__all__ = ["attention_forward", "attention_backward"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_PRECISIONS = ("float64", "low")


def _host(name: str, a):
    """NumPy view of ``a`` (CuPy arrays are copied to the host)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get") and hasattr(a, "shape"):
        a = a.get()
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array, got {type(a).__name__}")
    return a


def _prepare(named, precision, **kw):
    if precision not in _PRECISIONS:
        raise ValueError(f"precision: expected 'float64' or 'low', got {precision!r}")
    arrays = {name: _host(name, a) for name, a in named}
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    extra = [(n, a) for n, a in arrays.items() if n not in ("q", "k", "v")]
    prob = check_reference_inputs(q, k, v, extra, **kw)
    dt = prob.dtype
    if precision == "low":
        rdt = dt if dt.itemsize <= 4 else np.dtype(np.float32)
        work = np.float32
    else:
        rdt, work = None, np.float64
    # to [b, h, s, d] in the working dtype
    conv = {}
    for name, a in arrays.items():
        a = a if prob.layout == "bhsd" else a.transpose(0, 2, 1, 3)
        conv[name] = np.ascontiguousarray(a.astype(work))
    return prob, conv, rdt, work


def _rounder(rdt):
    if rdt is None:
        return lambda x: x
    if rdt == np.float32:
        return lambda x: x.astype(np.float32)
    return lambda x: x.astype(rdt).astype(np.float32)


def _forward_one(q, k, v, visible, scale, group, rnd, work):
    """One batch entry. q [hq, sq, d], k [hk, sk, d], v [hk, sk, dv] -> p, o, lse."""
    kx = np.repeat(k, group, axis=0) if group > 1 else k
    vx = np.repeat(v, group, axis=0) if group > 1 else v
    s = rnd(work(scale) * np.matmul(q, kx.transpose(0, 2, 1)))
    s = np.where(visible, s, work(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, work(0))  # empty rows: any finite shift works
    e = np.exp(s - m)  # exp(-inf) = 0 at masked entries
    denom = e.sum(axis=-1, keepdims=True)
    has = denom > 0
    safe = np.where(has, denom, work(1))
    p = rnd(e / safe)
    lse = np.where(has, m + np.log(safe), work(-np.inf))[..., 0]
    o = rnd(np.matmul(p, vx))
    return p, o, lse, kx, vx


def _to_layout(a, layout):
    return a if layout == "bhsd" else a.transpose(0, 2, 1, 3)


def attention_forward(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="bshd",
    precision="float64",
):
    """Reference attention forward.

    Args:
        q: [b, sq, hq, d] (``layout="bshd"``) or [b, hq, sq, d] (``"bhsd"``); any float dtype
            (float16, ``ml_dtypes.bfloat16``, float32, float64). CuPy arrays are copied over.
        k: [b, sk, hk, d] / [b, hk, sk, d], same dtype; ``hq % hk == 0``.
        v: [b, sk, hk, dv] / [b, hk, sk, dv], same dtype.
        softmax_scale: default ``1/sqrt(d)``.
        causal, window_size, mask: see :func:`cupy_fmha.mask.resolve_mask`.
        precision: ``"float64"`` or ``"low"`` (see the module docstring).

    Returns:
        ``(o, lse)``: o float64 [b, sq, hq, dv] / [b, hq, sq, dv]; lse float64 [b, hq, sq]
        (``-inf`` for rows with no visible key, whose o row is 0).

    Raises:
        TypeError, ValueError: as :mod:`cupy_fmha.validate` (any float dtype and head dim are
            allowed here); ``precision`` not one of ``"float64"``, ``"low"``.
    """
    prob, a, rdt, work = _prepare(
        [("q", q), ("k", k), ("v", v)], precision, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, mask=mask, layout=layout,
    )
    visible = dense_mask(prob.mask, prob.seqlen_q, prob.seqlen_k)
    rnd = _rounder(rdt)
    o = np.empty((prob.batch, prob.nhead_q, prob.seqlen_q, prob.hdim_v))
    lse = np.empty((prob.batch, prob.nhead_q, prob.seqlen_q))
    for b in range(prob.batch):
        _, ob, lb, _, _ = _forward_one(
            a["q"][b], a["k"][b], a["v"][b], visible, prob.softmax_scale, prob.group, rnd, work
        )
        o[b], lse[b] = ob, lb
    return np.ascontiguousarray(_to_layout(o, prob.layout)), lse


def attention_backward(
    do,
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    mask=None,
    layout="bshd",
    precision="float64",
):
    """Reference attention backward (recomputes the forward; no o/lse needed).

    Args:
        do: [b, sq, hq, dv] (``bshd``) or [b, hq, sq, dv] (``bhsd``), same dtype as q.
        q, k, v, softmax_scale, causal, window_size, mask, layout, precision: as
            :func:`attention_forward`.

    Returns:
        ``(dq, dk, dv)`` float64 in the inputs' layout: dq like q; dk like k and dv like v, with
        ``nhead_k`` heads (each the sum over its group of query heads). Rows with no visible key
        contribute nothing (zero dq rows), never NaN.

    Raises:
        TypeError, ValueError: as :func:`attention_forward`, plus do's shape/dtype.
    """
    prob, a, rdt, work = _prepare(
        [("q", q), ("k", k), ("v", v), ("do", do)], precision, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, mask=mask, layout=layout,
    )
    visible = dense_mask(prob.mask, prob.seqlen_q, prob.seqlen_k)
    rnd = _rounder(rdt)
    scale = work(prob.softmax_scale)
    b_, hq, hk, g = prob.batch, prob.nhead_q, prob.nhead_k, prob.group
    sq, sk, d, dv_ = prob.seqlen_q, prob.seqlen_k, prob.hdim_q, prob.hdim_v
    dq = np.empty((b_, hq, sq, d))
    dk = np.empty((b_, hk, sk, d))
    dv = np.empty((b_, hk, sk, dv_))
    for b in range(b_):
        qb, dob = a["q"][b], a["do"][b]
        p, o, _, kx, vx = _forward_one(qb, a["k"][b], a["v"][b], visible, scale, g, rnd, work)
        D = np.sum(dob * o, axis=-1, keepdims=True)
        pt = p.transpose(0, 2, 1)
        dv_h = np.matmul(pt, dob)  # [hq, sk, dv]
        dv[b] = rnd(dv_h.reshape(hk, g, sk, dv_).sum(axis=1))
        dp = rnd(np.matmul(dob, vx.transpose(0, 2, 1)))
        ds = rnd(p * (dp - D))
        dq[b] = rnd(scale * np.matmul(ds, kx))
        dk_h = np.matmul(ds.transpose(0, 2, 1), qb)  # [hq, sk, d]
        dk[b] = rnd(scale * dk_h.reshape(hk, g, sk, d).sum(axis=1))
    lay = prob.layout
    return tuple(np.ascontiguousarray(_to_layout(x, lay)) for x in (dq, dk, dv))
