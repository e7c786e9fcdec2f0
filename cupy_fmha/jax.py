"""cupy-fmha inside JAX: :func:`attention`, a ``jax.custom_vjp`` function whose forward and
backward run this library's kernels through ``jax.experimental.buffer_callback`` on XLA's
stream, so it works under ``jax.jit``, ``jax.grad`` and ``jax.value_and_grad`` (issue 13, first
step: batch mode).

Import it only with JAX installed (``pip install cupy-fmha[jax]``)::

    import jax, jax.numpy as jnp
    from cupy_fmha.jax import attention

    @jax.jit
    def loss(q, k, v):
        return attention(q, k, v, causal=True).astype(jnp.float32).sum()

    dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

How it runs: at trace time the options and shapes go through the same checks as
:func:`cupy_fmha.attention_forward` (a bad argument raises there, with the same named message,
before anything is compiled); at run time XLA calls back into Python with its device buffers
and its CUDA stream, and the callback runs :func:`cupy_fmha.attention_forward` /
:func:`cupy_fmha.attention_backward` on that stream (``cupy.cuda.ExternalStream``), writing
into XLA's output buffers (``out=``). No host synchronization; the residuals kept for the
backward are O and LSE (plus the inputs). Memory beyond what XLA hands over: the backward's
workspaces from CuPy's pool (:func:`cupy_fmha.backward_workspace_bytes`: D, the fp32 dQ
accumulator, the fp32 dK/dV copies under GQA). The callbacks are not marked
``command_buffer_compatible`` (CuPy's allocator and the kernels' first-call compilation are not
safe to capture), so XLA does not put them in CUDA graphs.

Not yet here: group mode (``cu_seqlens``), the elementwise bias and its dBias, dropout keyed
from a JAX PRNG key (dropout takes a Python-int ``seed``/``offset``, fixed at trace time:
change them per step by passing new values, which retraces), ``vmap`` (JAX raises its
NotImplementedError; fold an extra batch axis into the batch dimension instead).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from . import api
from .plan import plan_backward, plan_forward

__all__ = ["attention", "attention_with_lse"]


class _Abstract:
    """Shape, dtype and contiguous strides of a traced array: what the argument checks read."""

    def __init__(self, x):
        self.shape = tuple(int(n) for n in x.shape)
        self.dtype = np.dtype(x.dtype)
        strides, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            strides.append(step)
            step *= max(n, 1)
        self.strides = tuple(reversed(strides))
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape))


class _Options(NamedTuple):
    """The static (hashable) options of one call; forwarded to the CuPy API unchanged."""

    softmax_scale: float | None
    causal: bool
    window_size: tuple[int, int]
    mask: str | None
    layout: str
    dropout_p: float
    seed: int
    offset: int
    deterministic: bool
    alibi: bool  # alibi_slopes given (they travel as an input array)

    def kw(self) -> dict:
        return dict(softmax_scale=self.softmax_scale, causal=self.causal, window_size=self.window_size,
                    mask=self.mask, layout=self.layout, dropout_p=self.dropout_p, seed=self.seed,
                    offset=self.offset)


def _never_device():  # trace-time planning: the kernel choice is made again at run time
    return 80


def _forward_types(opts: _Options, q, k, v, slopes):
    plan = plan_forward(_Abstract(q), _Abstract(k), _Abstract(v), alibi_slopes=None if slopes is None else _Abstract(slopes),
                        cc=_never_device, dtype=None, return_dropout_mask=False, cu_seqlens_q=None, cu_seqlens_k=None,
                        max_seqlen_q=None, max_seqlen_k=None, **opts.kw())
    return (jax.ShapeDtypeStruct(plan.o_shape, q.dtype), jax.ShapeDtypeStruct(plan.lse_shape, jnp.float32))


def _cupy_views(cp, *buffers):
    return tuple(None if b is None else cp.from_dlpack(b) for b in buffers)


def _xla_stream(cp, handle: int):
    """XLA's CUDA stream as a CuPy stream (``ExternalStream``; CuPy 14 marks it deprecated in
    favour of ``Stream.from_external``, which takes an object with the ``__cuda_stream__``
    protocol rather than the raw handle ``buffer_callback`` gives)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(handle)


def _fwd_callback(opts: _Options):
    def run(ctx, out, q, k, v, *slopes):
        import cupy as cp

        with _xla_stream(cp, ctx.stream):
            o, lse = _cupy_views(cp, *out)
            qc, kc, vc = _cupy_views(cp, q, k, v)
            sl = _cupy_views(cp, *slopes)[0] if slopes else None
            api.attention_forward(qc, kc, vc, alibi_slopes=sl, out=(o, lse), **opts.kw())

    return run


def _bwd_callback(opts: _Options):
    def run(ctx, out, do, q, k, v, o, lse, *slopes):
        import cupy as cp

        with _xla_stream(cp, ctx.stream):
            dq, dk, dv = _cupy_views(cp, *out)
            doc, qc, kc, vc, oc, lsec = _cupy_views(cp, do, q, k, v, o, lse)
            sl = _cupy_views(cp, *slopes)[0] if slopes else None
            api.attention_backward(doc, qc, kc, vc, oc, lsec, alibi_slopes=sl, out=(dq, dk, dv),
                                   deterministic=opts.deterministic, **opts.kw())

    return run


def _forward(opts: _Options, q, k, v, slopes):
    types = _forward_types(opts, q, k, v, slopes)
    args = (q, k, v) + (() if slopes is None else (slopes,))
    return buffer_callback(_fwd_callback(opts), types)(*args)


def _backward(opts: _Options, do, q, k, v, o, lse, slopes):
    plan_backward(*(_Abstract(x) for x in (do, q, k, v, o, lse)), alibi_slopes=None if slopes is None else _Abstract(slopes),
                  cc=_never_device, dtype=None, return_dbias=False, deterministic=opts.deterministic, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, **opts.kw())
    types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    args = (do, q, k, v, o, lse) + (() if slopes is None else (slopes,))
    return buffer_callback(_bwd_callback(opts), types)(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(opts, q, k, v, slopes):
    return _forward(opts, q, k, v, slopes)


def _attention_fwd(opts, q, k, v, slopes):
    o, lse = _forward(opts, q, k, v, slopes)
    return (o, lse), (q, k, v, o, lse, slopes)


def _attention_bwd(opts, res, cotangents):
    q, k, v, o, lse, slopes = res
    do, _ = cotangents  # LSE's cotangent is not propagated (it is a by-product for the caller)
    dq, dk, dv = _backward(opts, do.astype(o.dtype), q, k, v, o, lse, slopes)
    return dq, dk, dv, None if slopes is None else jnp.zeros_like(slopes)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention_with_lse(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                       layout="bshd", alibi_slopes=None, dropout_p=0.0, seed=0, offset=0, deterministic=False):
    """:func:`attention` that also returns the log-sum-exp rows, ``(o, lse)``, lse float32
    [batch, nhead_q, seqlen_q]. The gradient flows through ``o`` only (lse's cotangent is
    ignored)."""
    if layout == "thd":
        raise ValueError("layout: 'thd' (group mode, cu_seqlens) is not supported by cupy_fmha.jax yet; "
                         "use 'bshd' or 'bhsd'")
    if alibi_slopes is not None:
        alibi_slopes = jnp.asarray(alibi_slopes)
    opts = _Options(None if softmax_scale is None else float(softmax_scale), causal,
                    tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size, mask, layout,
                    float(dropout_p), seed, offset, deterministic, alibi_slopes is not None)
    return _attention(opts, q, k, v, alibi_slopes)


def attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None, layout="bshd",
              alibi_slopes=None, dropout_p=0.0, seed=0, offset=0, deterministic=False):
    """Fused multi-head attention for JAX: ``O = softmax(softmax_scale * Q K^T + mask) V``,
    differentiable (``jax.grad`` runs this library's backward), usable under ``jax.jit``.

    Args:
        q: [batch, seqlen_q, nhead_q, hdim_q] (``layout="bshd"``) or [batch, nhead_q, seqlen_q,
            hdim_q] (``"bhsd"``), float16 or bfloat16, on a CUDA device.
        k, v: [batch, seqlen_k, nhead_k, hdim_q / hdim_v] (or bhsd), same dtype;
            ``nhead_q % nhead_k == 0`` (GQA / MQA).
        softmax_scale, causal, window_size, mask: as :func:`cupy_fmha.attention_forward` (static
            Python values).
        alibi_slopes: optional float32 array [nhead_q] or [batch, nhead_q] (not differentiated:
            its gradient is zero).
        dropout_p, seed, offset: dropout with this library's Philox stream (Python ints, fixed
            at trace time; the same seed and offset reproduce the same mask in forward and
            backward).
        deterministic: bit-identical gradients run to run (see
            :func:`cupy_fmha.attention_backward`).

    Returns:
        o: like q with head dim hdim_v, in q's dtype.

    Raises:
        TypeError, ValueError: at trace time, with :mod:`cupy_fmha.validate`'s named messages.

    Method: FlashAttention-2's algorithm (Dao, 2023) forward; the backward is CK's
    ``block_fmha_bwd_dq_dk_dv`` pipeline (see :func:`cupy_fmha.attention_backward`).
    """
    o, _ = attention_with_lse(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                              mask=mask, layout=layout, alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed,
                              offset=offset, deterministic=deterministic)
    return o
