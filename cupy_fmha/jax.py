"""cupy-fmha inside JAX: :func:`attention`, a ``jax.custom_vjp`` function whose forward and
backward run this library's kernels through ``jax.experimental.buffer_callback`` on XLA's
stream, so it works under ``jax.jit``, ``jax.grad``, ``jax.value_and_grad`` and ``jax.vmap``
(issue 13).

Import it only with JAX installed (``pip install cupy-fmha[jax]``)::

    import jax, jax.numpy as jnp
    from cupy_fmha.jax import attention

    @jax.jit
    def loss(q, k, v):
        return attention(q, k, v, causal=True).astype(jnp.float32).sum()

    dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

How it runs: at trace time the options and shapes go through the same checks as
:func:`cupy_fmha.attention_forward` (:func:`cupy_fmha.plan.plan_forward` /
:func:`~cupy_fmha.plan.plan_backward` on shape stand-ins; a bad argument raises there, with the
same named message, before anything is compiled); at run time XLA calls back into Python with
its device buffers and its CUDA stream, and the callback plans again for the real device and
launches the kernels on that stream (``cupy.cuda.ExternalStream``), writing into XLA's output
buffers. The residuals kept for the backward are O and LSE, plus the inputs the backward reads
again (q, k, v, the bias or ALiBi slopes, cu_seqlens, the dropout words). Memory beyond what XLA
hands over: the backward's workspaces from CuPy's pool (:func:`cupy_fmha.backward_workspace_bytes`:
D, the fp32 dQ accumulator, the fp32 dK/dV copies under GQA, the fp32 dS of dBias). The
callbacks are not marked ``command_buffer_compatible`` (CuPy's allocator and the kernels'
first-call compilation are not safe to capture), so XLA does not put them in CUDA graphs.

Features and what they cost:

* Group mode (``layout="thd"``): ``cu_seqlens_q`` / ``cu_seqlens_k`` are int32 JAX arrays
  (operands of the callbacks; no gradient) and ``max_seqlen_q`` / ``max_seqlen_k`` are required
  Python ints (the values of cu_seqlens are not known at trace time, and max_seqlen_q fixes
  lse's shape [batch, nhead_q, max_seqlen_q]). The kernels only need the offsets' device
  pointer and the max lengths, so by default the offsets are **not read back**: the plan is made
  from stand-in offsets with the same batch, totals and max lengths, and the values are
  trusted. Offsets that break the library's rules (start 0, non-decreasing, last = total,
  every length <= max_seqlen) give undefined results, as in FlashAttention's varlen functions.
  ``check_cu_seqlens=True`` hands the real offsets to the library instead, which reads them back
  (a synchronization of XLA's stream and 8 * (batch + 1) bytes per forward and per backward) and
  raises its named error inside the callback.
* Elementwise ``bias`` (fp16/bf16/fp32, any shape broadcastable to [batch, nhead_q, seqlen_q,
  seqlen_k]; group mode: to [batch, nhead_q, max_seqlen_q, max_seqlen_k]): its cotangent is
  dBias in the bias's shape and dtype (:func:`cupy_fmha.attention_backward` with
  ``return_dbias=True``, copied into XLA's buffer). dBias costs an fp32 dS workspace of
  batch * nhead_q * seqlen_q * seqlen_k floats, so it is computed only when JAX differentiates
  with respect to the bias (``custom_vjp``'s symbolic zeros tell): a constant bias or one
  outside ``argnums`` runs the plain backward.
* Dropout: either static Python ints ``seed`` / ``offset`` (fixed at trace time: new values
  retrace), or ``dropout_key``, a JAX PRNG key (typed ``jax.random.key`` or raw uint32
  ``jax.random.PRNGKey``): four uint32 words ``jax.random.bits(key, (4,), uint32)`` are drawn
  on the device and give ``seed = w0 | w1 << 32`` and ``offset = w2 | w3 << 32``
  (:func:`dropout_seed_offset` computes the same pair for a concrete key, e.g. to rebuild the
  mask with :mod:`cupy_fmha.reference`). The kernels take seed and offset by value, so the key
  path **reads those 16 bytes back to the host** inside the forward and again inside the
  backward callback (each a synchronization of XLA's stream). The words are a residual, so the
  backward regenerates exactly the forward's mask.
* ``vmap``: supported by running the call once per vmapped element (``buffer_callback``'s
  ``vmap_method="sequential"``, a loop in the compiled program), for every feature. A vmapped
  batch of batch-mode inputs runs faster folded into the batch dimension; an unbatched
  ``dropout_key`` gives every vmapped element the same mask.
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
from .validate import check_dropout

__all__ = ["attention", "attention_with_lse", "dropout_seed_offset"]

#: the operands of the custom_vjp after (q, k, v), in order; absent ones are None
_OPTIONAL = ("alibi_slopes", "bias", "cu_seqlens_q", "cu_seqlens_k", "dropout_words")


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


def _abstract(x):
    return None if x is None else _Abstract(x)


class _Options(NamedTuple):
    """The static (hashable) options of one call."""

    softmax_scale: float | None
    causal: bool
    window_size: tuple[int, int]
    mask: str | None
    layout: str
    dropout_p: float
    seed: int
    offset: int
    deterministic: bool
    max_seqlen_q: int | None
    max_seqlen_k: int | None
    check_cu_seqlens: bool

    def kw(self, seed=None, offset=None, cu_seqlens=(None, None)) -> dict:
        """The plan functions' keyword options (``seed``/``offset``: those read from a key)."""
        return dict(softmax_scale=self.softmax_scale, causal=self.causal, window_size=self.window_size,
                    mask=self.mask, layout=self.layout, dtype=None, dropout_p=self.dropout_p,
                    seed=self.seed if seed is None else seed, offset=self.offset if offset is None else offset,
                    cu_seqlens_q=cu_seqlens[0], cu_seqlens_k=cu_seqlens[1], max_seqlen_q=self.max_seqlen_q,
                    max_seqlen_k=self.max_seqlen_k)


def _never_device():  # trace-time planning: the kernel choice is made again at run time
    return 80


# --------------------------------------------------------------------------- group mode offsets


def _cu_standin(name: str, cu, total: int, max_seqlen: int, what: str):
    """NumPy offsets standing in for the device ``cu`` when planning: the same dtype and length,
    ``total`` tokens split into sequences of at most ``max_seqlen`` (valid whenever the real
    offsets are). Wrong dtypes or ranks are kept so the library's check names them."""
    shape, dt = tuple(int(n) for n in cu.shape), np.dtype(cu.dtype)
    if len(shape) != 1 or shape[0] < 2 or dt != np.int32:
        return np.zeros(shape, dt)
    batch = shape[0] - 1
    if total > batch * max_seqlen:
        raise ValueError(f"{name}: {total} packed tokens ({what}'s first dimension) cannot be {batch} sequences of "
                         f"at most max_seqlen={max_seqlen} tokens each")
    lengths = np.zeros(batch, np.int64)
    if max_seqlen:
        full, rest = divmod(total, max_seqlen)
        lengths[:full] = max_seqlen
        if rest:
            lengths[full] = rest
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _plan_offsets(opts: _Options, q, k, cu_q, cu_k) -> tuple:
    """What the plan functions get for cu_seqlens: group mode stand-ins (host values, no device
    read); otherwise shape stand-ins of anything given (the library refuses them outside thd)."""
    if opts.layout != "thd" or cu_q is None or cu_k is None or len(q.shape) < 1 or len(k.shape) < 1:
        return _abstract(cu_q), _abstract(cu_k)
    return (_cu_standin("cu_seqlens_q", cu_q, int(q.shape[0]), opts.max_seqlen_q, "q"),
            _cu_standin("cu_seqlens_k", cu_k, int(k.shape[0]), opts.max_seqlen_k, "k"))


# --------------------------------------------------------------------------- run time


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


def _read_words(words) -> tuple[int, int]:
    """(seed, offset) from the four uint32 dropout words on the device: a 16-byte read on the
    current (XLA's) stream, which waits for it."""
    w = [int(x) for x in words.get()]
    return w[0] | (w[1] << 32), w[2] | (w[3] << 32)


def _operands(cp, names, buffers) -> dict:
    return dict(zip(names, _cupy_views(cp, *buffers)))


def _runtime_kw(opts: _Options, a: dict, offsets_for_plan) -> dict:
    seed = offset = None
    if a.get("dropout_words") is not None:
        seed, offset = _read_words(a["dropout_words"])
    plan_cu = (a.get("cu_seqlens_q"), a.get("cu_seqlens_k")) if opts.check_cu_seqlens else offsets_for_plan
    return opts.kw(seed, offset, plan_cu)


def _fwd_callback(opts: _Options, names, offsets_for_plan):
    def run(ctx, out, *buffers):
        import cupy as cp

        with _xla_stream(cp, ctx.stream):
            o, lse = _cupy_views(cp, *out)
            a = _operands(cp, names, buffers)
            bias, slopes = a.get("bias"), a.get("alibi_slopes")
            plan = plan_forward(a["q"], a["k"], a["v"], bias=bias, alibi_slopes=slopes, cc=api._device_cc,
                                return_dropout_mask=False, **_runtime_kw(opts, a, offsets_for_plan))
            api._run_forward(plan, a["q"], a["k"], a["v"], bias, slopes, (o, lse), a.get("cu_seqlens_q"),
                             a.get("cu_seqlens_k"))

    return run


def _bwd_callback(opts: _Options, names, offsets_for_plan, want_dbias: bool):
    def run(ctx, out, *buffers):
        import cupy as cp

        with _xla_stream(cp, ctx.stream):
            grads = _cupy_views(cp, *out)
            a = _operands(cp, names, buffers)
            bias, slopes = a.get("bias"), a.get("alibi_slopes")
            arrays = [a[n] for n in ("do", "q", "k", "v", "o", "lse")]
            plan = plan_backward(*arrays, bias=bias, alibi_slopes=slopes, cc=api._device_cc,
                                 return_dbias=want_dbias, deterministic=opts.deterministic,
                                 **_runtime_kw(opts, a, offsets_for_plan))
            g = api._run_backward(plan, *arrays, bias, slopes, grads[:3], a.get("cu_seqlens_q"),
                                  a.get("cu_seqlens_k"))
            if want_dbias and g.dbias.nbytes:  # dbias comes back fresh (contiguous): into XLA's buffer
                grads[3].data.copy_from_device_async(g.dbias.data, g.dbias.nbytes)

    return run


# --------------------------------------------------------------------------- the two passes


def _present(named: dict):
    """(names, arrays) of the operands that are not None, in a fixed order."""
    names = tuple(n for n, x in named.items() if x is not None)
    return names, tuple(named[n] for n in names)


def _forward(opts: _Options, q, k, v, slopes, bias, cu_q, cu_k, words):
    offsets = _plan_offsets(opts, q, k, cu_q, cu_k)
    plan = plan_forward(_Abstract(q), _Abstract(k), _Abstract(v), bias=_abstract(bias), alibi_slopes=_abstract(slopes),
                        cc=_never_device, return_dropout_mask=False, **opts.kw(cu_seqlens=offsets))
    types = (jax.ShapeDtypeStruct(plan.o_shape, q.dtype), jax.ShapeDtypeStruct(plan.lse_shape, jnp.float32))
    names, args = _present(dict(q=q, k=k, v=v, alibi_slopes=slopes, bias=bias, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                dropout_words=words))
    run = _fwd_callback(opts, names, offsets)
    return buffer_callback(run, types, vmap_method="sequential")(*args)


def _backward(opts: _Options, want_dbias: bool, do, q, k, v, o, lse, slopes, bias, cu_q, cu_k, words):
    offsets = _plan_offsets(opts, q, k, cu_q, cu_k)
    plan_backward(*(_Abstract(x) for x in (do, q, k, v, o, lse)), bias=_abstract(bias), alibi_slopes=_abstract(slopes),
                  cc=_never_device, return_dbias=want_dbias, deterministic=opts.deterministic,
                  **opts.kw(cu_seqlens=offsets))
    types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v) + ((bias,) if want_dbias else ()))
    names, args = _present(dict(do=do, q=q, k=k, v=v, o=o, lse=lse, alibi_slopes=slopes, bias=bias, cu_seqlens_q=cu_q,
                                cu_seqlens_k=cu_k, dropout_words=words))
    run = _bwd_callback(opts, names, offsets, want_dbias)
    return buffer_callback(run, types, vmap_method="sequential")(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(opts, q, k, v, slopes, bias, cu_q, cu_k, words):
    return _forward(opts, q, k, v, slopes, bias, cu_q, cu_k, words)


@jax.tree_util.register_pytree_node_class
class _Saved:
    """The residuals, with a static flag: whether the bias is differentiated (dBias wanted)."""

    def __init__(self, arrays, want_dbias: bool):
        self.arrays, self.want_dbias = tuple(arrays), want_dbias

    def tree_flatten(self):
        return self.arrays, self.want_dbias

    @classmethod
    def tree_unflatten(cls, want_dbias, arrays):
        return cls(arrays, want_dbias)


def _value(x):
    return None if x is None else x.value


def _attention_fwd(opts, q, k, v, slopes, bias, cu_q, cu_k, words):
    # symbolic_zeros=True: the primals come as CustomVJPPrimal (value, perturbed)
    want_dbias = bias is not None and bool(bias.perturbed)
    q, k, v, slopes, bias, cu_q, cu_k, words = (_value(x) for x in (q, k, v, slopes, bias, cu_q, cu_k, words))
    o, lse = _forward(opts, q, k, v, slopes, bias, cu_q, cu_k, words)
    return (o, lse), _Saved((q, k, v, o, lse, slopes, bias, cu_q, cu_k, words), want_dbias)


def _attention_bwd(opts, saved, cotangents):
    q, k, v, o, lse, slopes, bias, cu_q, cu_k, words = saved.arrays
    do, _ = cotangents  # LSE's cotangent is not propagated (it is a by-product for the caller)
    if isinstance(do, jax.custom_derivatives.SymbolicZero):  # only lse was used: nothing flows back
        return (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), None,
                None if bias is None else jnp.zeros_like(bias), None, None, None)
    grads = _backward(opts, saved.want_dbias, do.astype(o.dtype), q, k, v, o, lse, slopes, bias, cu_q, cu_k, words)
    dbias = grads[3] if saved.want_dbias else None  # None: a zero cotangent, for a bias not differentiated
    return grads[0], grads[1], grads[2], None, dbias, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# --------------------------------------------------------------------------- public


def dropout_seed_offset(dropout_key) -> tuple[int, int]:
    """The (seed, offset) pair ``dropout_key`` gives :func:`attention` (for a concrete key, not
    under ``jit``): e.g. to rebuild the keep mask with
    ``cupy_fmha.reference.attention_forward(..., seed=seed, offset=offset,
    return_dropout_mask=True)``."""
    w = [int(x) for x in np.asarray(_dropout_words(dropout_key))]
    return w[0] | (w[1] << 32), w[2] | (w[3] << 32)


def _dropout_words(dropout_key):
    if not hasattr(dropout_key, "dtype") or not hasattr(dropout_key, "shape"):
        raise TypeError("dropout_key: expected a JAX PRNG key (jax.random.key(...) or jax.random.PRNGKey(...)), "
                        f"got {type(dropout_key).__module__}.{type(dropout_key).__name__}")
    return jax.random.bits(dropout_key, (4,), jnp.uint32)


def _static_max_seqlen(name: str, value) -> int:
    if value is None:
        raise ValueError(f"{name}: cupy_fmha.jax needs max_seqlen_q and max_seqlen_k as Python ints in group mode "
                         "(layout='thd'): cu_seqlens are device values, unknown when the function is traced, and "
                         "the max lengths fix lse's shape and the launch grid")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected a Python int (a static value in cupy_fmha.jax), got {value!r}")
    if value < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {value}")
    return int(value)


def attention_with_lse(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                       layout="bshd", alibi_slopes=None, bias=None, dropout_p=0.0, seed=0, offset=0,
                       dropout_key=None, deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, check_cu_seqlens=False):
    """:func:`attention` that also returns the log-sum-exp rows, ``(o, lse)``, lse float32
    [batch, nhead_q, seqlen_q] (group mode: [batch, nhead_q, max_seqlen_q]). The gradient flows
    through ``o`` only (lse's cotangent is ignored)."""
    check_dropout(dropout_p, seed, offset)  # named errors for the static values before they are hashed
    if not isinstance(check_cu_seqlens, (bool, np.bool_)):
        raise TypeError(f"check_cu_seqlens: expected a bool, got {check_cu_seqlens!r}")
    if layout == "thd":
        max_seqlen_q = _static_max_seqlen("max_seqlen_q", max_seqlen_q)
        max_seqlen_k = _static_max_seqlen("max_seqlen_k", max_seqlen_k)
    words = None
    if dropout_key is not None:
        if seed != 0 or offset != 0:
            raise ValueError("dropout_key: give dropout_key or seed/offset, not both")
        if dropout_p > 0:
            words = _dropout_words(dropout_key)
    slopes, bias, cu_q, cu_k = (None if x is None else jnp.asarray(x)
                                for x in (alibi_slopes, bias, cu_seqlens_q, cu_seqlens_k))
    opts = _Options(None if softmax_scale is None else float(softmax_scale), causal,
                    tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size, mask, layout,
                    float(dropout_p), int(seed), int(offset), deterministic, max_seqlen_q, max_seqlen_k,
                    bool(check_cu_seqlens))
    return _attention(opts, q, k, v, slopes, bias, cu_q, cu_k, words)


def attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None, layout="bshd",
              alibi_slopes=None, bias=None, dropout_p=0.0, seed=0, offset=0, dropout_key=None, deterministic=False,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, check_cu_seqlens=False):
    """Fused multi-head attention for JAX: ``O = softmax(softmax_scale * Q K^T + bias + mask) V``,
    differentiable (``jax.grad`` runs this library's backward), usable under ``jax.jit`` and
    ``jax.vmap``.

    Args:
        q: [batch, seqlen_q, nhead_q, hdim_q] (``layout="bshd"``), [batch, nhead_q, seqlen_q,
            hdim_q] (``"bhsd"``) or [total_q, nhead_q, hdim_q] (``"thd"``, group mode), float16
            or bfloat16, on a CUDA device.
        k, v: [batch, seqlen_k, nhead_k, hdim_q / hdim_v] (or bhsd, or [total_k, nhead_k, ...]),
            same dtype; ``nhead_q % nhead_k == 0`` (GQA / MQA).
        softmax_scale, causal, window_size, mask: as :func:`cupy_fmha.attention_forward` (static
            Python values; in group mode masks are resolved per sequence).
        alibi_slopes: optional float32 array [nhead_q] or [batch, nhead_q] (not differentiated:
            its gradient is zero).
        bias: optional elementwise bias added to the scaled scores, float16, bfloat16 or float32,
            any shape broadcastable to [batch, nhead_q, seqlen_q, seqlen_k] (group mode: to
            [batch, nhead_q, max_seqlen_q, max_seqlen_k], sequence ``i`` reading the top-left
            corner of plane ``i``); not with ``alibi_slopes``. Its gradient is dBias in the
            bias's shape and dtype, computed only when JAX differentiates with respect to it.
        dropout_p: dropout probability in [0, 1) (static).
        seed, offset: static Python ints in [0, 2**64): the Philox key and counter offset (the
            same values reproduce the same mask; new values retrace).
        dropout_key: instead of seed/offset, a JAX PRNG key (typed or raw uint32); seed and
            offset are drawn from it on the device (see :func:`dropout_seed_offset`) and read back
            to the host, 16 bytes, in the forward and in the backward callback. Ignored when
            ``dropout_p`` is 0.
        deterministic: bit-identical gradients run to run (see
            :func:`cupy_fmha.attention_backward`).
        cu_seqlens_q, cu_seqlens_k: group mode (``layout="thd"``) only: int32 [batch + 1] offsets,
            JAX arrays (traced values are fine; no gradient).
        max_seqlen_q, max_seqlen_k: group mode only, **required** here: Python ints at least the
            longest sequence (``ValueError`` naming them when missing).
        check_cu_seqlens: group mode: False (default) trusts the offsets (no device read; offsets
            that break the rules give undefined results); True lets the library read them back and
            check them in each callback (a synchronization of XLA's stream).

    Returns:
        o: like q with head dim hdim_v, in q's dtype.

    Raises:
        TypeError, ValueError: at trace time, with :mod:`cupy_fmha.validate`'s named messages
            (and those above for max_seqlen_q/k, dropout_key, check_cu_seqlens).

    Method: FlashAttention-2's algorithm (Dao, 2023) forward; the backward is CK's
    ``block_fmha_bwd_dq_dk_dv`` pipeline (see :func:`cupy_fmha.attention_backward`).
    """
    o, _ = attention_with_lse(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                              mask=mask, layout=layout, alibi_slopes=alibi_slopes, bias=bias, dropout_p=dropout_p,
                              seed=seed, offset=offset, dropout_key=dropout_key, deterministic=deterministic,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, check_cu_seqlens=check_cu_seqlens)
    return o
