"""What one ring step computes, on the GPU (CuPy and this library's kernels) or on the CPU (NumPy
and the dense reference), behind one small interface, so the ring schedule in
:mod:`cupy_fmha.parallel.ring` is the same code in both places.

Both take and return arrays in the caller's layout (``bshd`` / ``bhsd``) and a mask in the
call's own coordinates (a :class:`cupy_fmha.mask.MaskSpec`, generic window or none).

* :class:`CupyOps`: :func:`cupy_fmha.attention_forward` and :func:`cupy_fmha.attention_backward`
  on the current CuPy stream; the backward takes the *global* ``o`` and ``lse`` (its ``dot_do_o``
  kernel computes ``D = rowsum(dO * O)`` from the ``o`` it is given and the ``dq_dk_dv`` kernel
  uses ``P = exp(S - lse)`` with the ``lse`` it is given), which makes each partial backward
  exact (an optional ``dlse``, lse's cotangent for the call's rows, is passed on: it is subtracted
  from D, per row, so every call over those rows takes it); partial results come back in the inputs' dtype (fp16/bf16) and are accumulated in
  float32 by the caller. Streams and events are CuPy's.
* :class:`NumpyOps`: the forward is :func:`cupy_fmha.reference.attention_forward` (float64);
  the backward is :func:`partial_backward` below, the same maths with a given ``o`` and
  ``lse``; accumulation in float64; no streams (events are host timestamps).
"""

from __future__ import annotations

import time

import numpy as np

from ..mask import MaskSpec, dense_mask

__all__ = ["CupyOps", "NumpyOps", "partial_backward", "ops_for"]


def _to_bhsd(a, layout):
    return a if layout == "bhsd" else a.transpose(0, 2, 1, 3)


def partial_backward(do, q, k, v, o, lse, *, mask: MaskSpec, softmax_scale: float, layout: str = "bshd",
                     dlse=None):
    """Attention backward over one key block with a *given* ``o`` and ``lse`` (NumPy, float64).

    ``P = exp(scale * Q K^T - lse)`` on the visible pairs (0 elsewhere and on rows whose lse is
    -inf), ``D = rowsum(dO * O) - dlse``, ``dV = P^T dO``, ``dS = P * (dO V^T - D)``, ``dQ = scale
    * dS K``, ``dK = scale * dS^T Q``; dK, dV summed over each GQA group. With the lse and o of the
    whole problem (and the whole rows' dlse) these are the key block's exact share of the full
    gradients.

    Args:
        do, q, k, v, o: float arrays in ``layout`` (q/do/o [batch, sq, hq, d/dv] for bshd).
        lse: [batch, hq, sq], natural log.
        dlse: optional cotangent of lse (d loss / d lse), float array [batch, hq, sq]; None: zero.
            Since d lse_i / d s_ij = P_ij it enters as ``dS = P * (dP - (D - dlse))``.
        mask: the block's mask (:class:`cupy_fmha.mask.MaskSpec`, resolved with the block's
            lengths).
        softmax_scale: the scale of Q K^T.

    Returns:
        (dq, dk, dv) float64 in ``layout``.
    """
    f = np.float64
    Q, K, V, dO, O = (np.asarray(_to_bhsd(np.asarray(a), layout), dtype=f) for a in (q, k, v, do, o))
    L = np.asarray(lse, dtype=f)
    b, hq, sq, _ = Q.shape
    hk, sk = K.shape[1], K.shape[2]
    g = hq // hk
    Kx, Vx = np.repeat(K, g, axis=1), np.repeat(V, g, axis=1)
    vis = dense_mask(mask, sq, sk)
    s = np.where(vis, softmax_scale * np.matmul(Q, Kx.transpose(0, 1, 3, 2)), -np.inf)
    live = ~np.isneginf(L)[..., None]  # a NaN lse gives NaN, as the kernels do, not a silent 0
    p = np.where(live, np.exp(s - np.where(live, L[..., None], 0.0)), 0.0)
    D = np.sum(dO * O, axis=-1, keepdims=True)
    if dlse is not None:  # the lse term of the softmax gradient (not written into the caller's array)
        D = D - np.asarray(dlse, dtype=f)[..., None]
    dv = np.matmul(p.transpose(0, 1, 3, 2), dO)
    ds = p * (np.matmul(dO, Vx.transpose(0, 1, 3, 2)) - D)
    dq = softmax_scale * np.matmul(ds, Kx)
    dk = softmax_scale * np.matmul(ds.transpose(0, 1, 3, 2), Q)
    dk = dk.reshape(b, hk, g, sk, -1).sum(axis=2)
    dv = dv.reshape(b, hk, g, sk, -1).sum(axis=2)
    back = (lambda a: a) if layout == "bhsd" else (lambda a: a.transpose(0, 2, 1, 3))
    return tuple(np.ascontiguousarray(back(a)) for a in (dq, dk, dv))


class NumpyOps:
    """The CPU model: NumPy arrays, float64 maths, no streams."""

    name = "numpy"
    xp = np
    acc_dtype = np.dtype(np.float64)
    lse_dtype = np.dtype(np.float64)

    def forward(self, q, k, v, mask, softmax_scale, layout):
        from .. import reference

        return reference.attention_forward(q, k, v, mask=mask, softmax_scale=softmax_scale, layout=layout)

    def backward(self, do, q, k, v, o, lse, mask, softmax_scale, layout, deterministic, *, dlse=None):
        return partial_backward(do, q, k, v, o, lse, mask=mask, softmax_scale=softmax_scale, layout=layout,
                                dlse=dlse)

    def current_stream(self):
        return None

    def record(self, stream):
        return None

    def wait(self, stream, event) -> None:
        pass

    def timer(self, stream):
        return time.perf_counter()

    @staticmethod
    def elapsed_ms(t0, t1) -> float:
        return (t1 - t0) * 1e3

    def contiguous(self, a):
        return np.ascontiguousarray(a)

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def accumulate(self, dst, src) -> None:
        """``dst += src`` in dst's (accumulation) dtype; dst may be a view."""
        dst += src.astype(dst.dtype, copy=False)

    def cast(self, a, dtype):
        return a.astype(dtype)


class CupyOps:
    """The GPU path: CuPy arrays, this library's kernels on the current stream, float32
    accumulation, CUDA events."""

    name = "cupy"
    acc_dtype = np.dtype(np.float32)
    lse_dtype = np.dtype(np.float32)

    def __init__(self):
        import cupy

        self.xp = cupy

    def forward(self, q, k, v, mask, softmax_scale, layout):
        from ..api import attention_forward

        return attention_forward(q, k, v, mask=mask, softmax_scale=softmax_scale, layout=layout)

    def backward(self, do, q, k, v, o, lse, mask, softmax_scale, layout, deterministic, *, dlse=None):
        from ..api import attention_backward

        return tuple(attention_backward(do, q, k, v, o, lse, mask=mask, softmax_scale=softmax_scale, layout=layout,
                                        deterministic=deterministic, dlse=dlse))

    def current_stream(self):
        return self.xp.cuda.get_current_stream()

    def record(self, stream):
        ev = self.xp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    def wait(self, stream, event) -> None:
        if event is not None:
            stream.wait_event(event)

    def timer(self, stream):
        ev = self.xp.cuda.Event()
        ev.record(stream)
        return ev

    def elapsed_ms(self, t0, t1) -> float:
        t1.synchronize()
        return float(self.xp.cuda.get_elapsed_time(t0, t1))

    def contiguous(self, a):
        return self.xp.ascontiguousarray(a)

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def accumulate(self, dst, src) -> None:
        """``dst += src`` in dst's (accumulation) dtype; dst may be a view."""
        dst += src.astype(dst.dtype, copy=False)

    def cast(self, a, dtype):
        return a.astype(dtype)


def ops_for(a):
    """:class:`CupyOps` for a CuPy array, :class:`NumpyOps` for a NumPy array, else None."""
    if isinstance(a, np.ndarray):
        return NumpyOps()
    if type(a).__module__.split(".")[0] == "cupy" and hasattr(a, "device"):
        return CupyOps()
    return None
