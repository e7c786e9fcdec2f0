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
its device buffers and its CUDA stream, and the callback launches the kernels on that stream,
writing into XLA's output buffers. Everything that depends only on the traced shapes, dtypes and
options (the plan for the device: kernel instances, grid, block, shared memory, workspace sizes;
the kernels' strides) is resolved by the first call on a device and kept with the callback, which
is shared by every trace with the same shapes and options; a call then only reads the buffers'
addresses, looks up the TMA tensor maps for them (cached: XLA hands the same buffers back call
after call), takes the backward's workspaces from CuPy's pool and launches. The tuning variables
(``CUPY_FMHA_*_TILES``, ``CUPY_FMHA_BWD_WS``, ...) are read when that plan is made. The residuals kept for the backward are O and LSE, plus the inputs the backward reads
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
  ``return_dbias=True``). For a bias that broadcasts along nothing (batch mode) the kernel stores
  dS into XLA's dBias buffer itself; any other costs an fp32 dS workspace of
  batch * nhead_q * seqlen_q * seqlen_k floats, reduced and copied into XLA's buffer. So dBias is
  computed only when JAX differentiates with respect to the bias (``custom_vjp``'s symbolic zeros
  tell): a constant bias or one outside ``argnums`` runs the plain backward.
* Dropout: either static Python ints ``seed`` / ``offset`` (fixed at trace time: new values
  retrace), or ``dropout_key``, a JAX PRNG key (typed ``jax.random.key`` or raw uint32
  ``jax.random.PRNGKey``): four uint32 words ``jax.random.bits(key, (4,), uint32)`` are drawn
  on the device and give ``seed = w0 | w1 << 32`` and ``offset = w2 | w3 << 32``
  (:func:`dropout_seed_offset` computes the same pair for a concrete key, e.g. to rebuild the
  mask with :mod:`cupy_fmha.reference`). The kernels take seed and offset by value, so the key
  path **reads those 16 bytes back to the host** inside the forward and again inside the
  backward callback (each a synchronization of XLA's stream). The words are a residual, so the
  backward regenerates exactly the forward's mask.
* lse's gradient: a loss that uses :func:`attention_with_lse`'s lse as well as (or instead of) o
  gets lse's term of the softmax gradient. lse's cotangent (float32, lse's shape) becomes one
  more operand of the backward callback, :func:`cupy_fmha.attention_backward`'s ``dlse``, which
  the launcher subtracts from D = rowsum(dO * O) between the backward's first two kernels
  (d lse_i / d s_ij = P_ij, so dS = P (dP - D + dlse)): same kernels, one elementwise pass over
  lse's floats. Only when the cotangent is not a symbolic zero (lse used and differentiated): lse
  unused, an aux output or under ``jax.lax.stop_gradient`` leaves the backward as it was. The
  cotangent is used as given: rows that see no key have lse = -inf, and a NaN or infinite
  cotangent there makes the gradients non-finite (0 * inf), so mask lse before the loss uses it,
  ``f(jnp.where(jnp.isfinite(lse), lse, 0))``; ``jnp.where(jnp.isfinite(lse), f(lse), 0)`` gives
  those rows a NaN cotangent (JAX's own 0 * inf).
* ``vmap``: supported by running the call once per vmapped element (``buffer_callback``'s
  ``vmap_method="sequential"``, a loop in the compiled program), for every feature. A vmapped
  batch of batch-mode inputs runs faster folded into the batch dimension; an unbatched
  ``dropout_key`` gives every vmapped element the same mask.
* Not supported: forward mode (``jax.jvp``, ``jax.jacfwd``: JAX refuses a ``custom_vjp``
  function), higher-order derivatives (grad of grad, ``jax.hessian``: a TypeError naming
  :func:`attention` at trace time), gradients for the ALiBi slopes, symbolic shapes
  (``jax.export``'s shape polymorphism: a ValueError naming the operand).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from . import api
from . import launch as L
from ._checks import check_int
from .dbias import reduce_dbias
from .plan import _typed, plan_backward, plan_forward
from .mask import check_causal
from .validate import _check_scale, check_dropout, check_flag

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
#
# A callback's work splits in two. What depends only on the traced shapes, dtypes and options is
# resolved once per device (compute capability) and kept in the callback object (:class:`_Bound`):
# the plan (kernel instances, grid, block, shared memory, workspace shapes), the element strides
# of every TensorArg, the feature groups without their addresses, the dropout group. What is left
# for each call depends on XLA's buffers: their device addresses (read from
# ``__cuda_array_interface__``; no CuPy array is made), the TMA tensor maps (cached per tuple of
# addresses: XLA hands the same buffers back step after step), the backward's workspaces from
# CuPy's pool, and the launches, through the same :func:`cupy_fmha.api._launch_forward` /
# :func:`~cupy_fmha.api._launch_backward` as the CuPy API. Paths that read device values anyway
# (``check_cu_seqlens=True``; buffers that are not 16-byte aligned, which XLA does not hand out in
# practice) wrap the buffers as CuPy arrays and take the library's general path, which checks and
# plans with the real values.


def _stream_handle(ctx) -> int:
    """XLA's CUDA stream (``cudaStream_t`` as an int) for this callback."""
    return ctx.stream


def _address(buffer) -> int:
    """Device address of one of XLA's buffers (dense and row-major: XLA passes no strides), from
    ``__cuda_array_interface__``; from the DLPack capsule where that interface is refused (a
    jaxlib without a typestr for the buffer's dtype)."""
    try:
        return buffer.__cuda_array_interface__["data"][0]
    except Exception:  # noqa: BLE001 - jaxlib's errors for an unsupported dtype vary by version
        return _dlpack_address(buffer)


_CAPSULE_POINTER = None


def _dlpack_address(buffer) -> int:
    """``data + byte_offset`` of the DLTensor in ``buffer.__dlpack__()`` (its first member, in
    the unversioned capsule ``"dltensor"``; the capsule keeps ownership and frees it)."""
    global _CAPSULE_POINTER
    if _CAPSULE_POINTER is None:
        import ctypes

        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        _CAPSULE_POINTER = (get, ctypes.c_uint64)
    get, u64 = _CAPSULE_POINTER
    capsule = buffer.__dlpack__()  # held until read: its destructor frees the tensor
    tensor = get(capsule, b"dltensor")
    # DLTensor: data (0), device (8), ndim (16), dtype (20), shape (24), strides (32), byte_offset (40)
    address = u64.from_address(tensor).value + u64.from_address(tensor + 40).value
    del capsule
    return address


def _device_view(cp, buffer, shape, dtype):
    """A CuPy array over one of XLA's buffers (owned by XLA for the callback's duration), for the
    paths that need arrays: the dropout words' read, dBias, the general path."""
    nbytes = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
    mem = cp.cuda.UnownedMemory(_address(buffer), nbytes, buffer, buffer.__dlpack_device__()[1])
    return cp.ndarray(tuple(shape), dtype, cp.cuda.MemoryPointer(mem, 0))


class _CudaStream:
    """A stream handle with the CUDA stream protocol, for ``cupy.cuda.Stream.from_external``."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_STREAMS: dict = {}


def _xla_stream(cp, handle: int):
    """XLA's CUDA stream as a CuPy stream, made once per handle. ``Stream.from_external`` where
    CuPy has it (14 and newer, which deprecate ``ExternalStream``: silencing that warning in
    ``warnings.catch_warnings()`` on every call cost more than making the stream), else
    ``ExternalStream`` (not deprecated there). The object only carries the handle."""
    s = _STREAMS.get(handle)
    if s is None:
        from_external = getattr(cp.cuda.Stream, "from_external", None)
        s = from_external(_CudaStream(handle)) if from_external is not None else cp.cuda.ExternalStream(handle)
        if len(_STREAMS) > 64:
            _STREAMS.clear()
        _STREAMS[handle] = s
    return s


def _read_words(cp, buffer) -> tuple[int, int]:
    """(seed, offset) from the four uint32 dropout words on the device: a 16-byte read on the
    current (XLA's) stream, which waits for it."""
    w = [int(x) for x in _device_view(cp, buffer, (4,), np.uint32).get()]
    return w[0] | (w[1] << 32), w[2] | (w[3] << 32)


def _runtime_kw(opts: _Options, a: dict, offsets_for_plan, words=None) -> dict:
    """The plan functions' options at run time on the general path: with ``check_cu_seqlens`` the
    real offsets (which the library reads back and checks), else the stand-ins; ``words``: the
    (seed, offset) read from a key."""
    seed, offset = (None, None) if words is None else words
    plan_cu = (a.get("cu_seqlens_q"), a.get("cu_seqlens_k")) if opts.check_cu_seqlens else offsets_for_plan
    return opts.kw(seed, offset, plan_cu)


def _rows_aligned(x: _Abstract) -> bool:
    """Whether a q-like operand's rows are 16-byte aligned (``api._aligned`` less the address)."""
    return all((s // x.dtype.itemsize) % 8 == 0 for s in x.strides[:-1])


class _Bound(NamedTuple):
    """A callback's static launch data on one device (see the section comment)."""

    plan: object      #: FwdPlan / BwdPlan for this compute capability
    strides: tuple    #: TensorArg strides of each q-like operand (fwd: q k v o; bwd: do q k v o dq dk dv)
    nonempty: tuple   #: whether each q-like operand has elements (an empty one gets address 0)
    seq: tuple        #: SeqArg with null offsets (group mode puts their addresses in per call)
    bias: tuple       #: BiasArg with a null address
    dropout: tuple    #: DropoutArg (a key's words replace seed and offset per call)
    fast: bool        #: False: every call takes the general path (rows not 16-byte aligned)
    maps: dict        #: addresses of the mapped tensors -> their TMA maps as kernel arguments


#: q-like operands of each pass, in TensorArg order (then the outputs: fwd o; bwd dq, dk, dv)
_QLIKE = {"fwd": ("q", "k", "v"), "bwd": ("do", "q", "k", "v", "o")}
_NOUT = {"fwd": 1, "bwd": 3}


class _Callback:
    """The callback of one pass (``"fwd"``/``"bwd"``) for one static key: options, operand
    names, shapes and dtypes (``avals``, operand name -> :class:`_Abstract`; ``outs`` the results'),
    group mode's stand-in offsets, dBias wanted. ``buffer_callback`` calls it with the execution
    context, the result buffers and the operand buffers. Made once per key (:func:`_callback`),
    so equal traces share it; it plans once per device (``plans`` counts, for tests)."""

    def __init__(self, kind: str, opts: _Options, names: tuple, avals: dict, outs: tuple, offsets,
                 want_dbias: bool = False):
        self.kind, self.opts, self.names, self.avals, self.outs = kind, opts, names, avals, outs
        self.offsets, self.want_dbias = offsets, want_dbias
        self.plans = 0
        self._bound: dict = {}
        self._qlike = _QLIKE[kind]
        self._maps_of = (0, 1, 2) if kind == "fwd" else (1, 2, 3, 0)  # q, k, v (, do) in the TensorArgs

    # ------------------------------------------------------------------ static, once per device

    def _plan(self, cc: int):
        a, opts = self.avals, self.opts
        kw = opts.kw(cu_seqlens=self.offsets)
        if self.kind == "fwd":
            return plan_forward(a["q"], a["k"], a["v"], bias=a.get("bias"), alibi_slopes=a.get("alibi_slopes"),
                                cc=lambda: cc, return_dropout_mask=False, **kw)
        return plan_backward(*(a[n] for n in ("do", "q", "k", "v", "o", "lse")), bias=a.get("bias"),
                             alibi_slopes=a.get("alibi_slopes"), dlse=a.get("dlse"), cc=lambda: cc,
                             return_dbias=self.want_dbias,
                             deterministic=opts.deterministic, **kw)

    def bind(self, cc: int) -> _Bound:
        """The static launch data for compute capability ``cc``, resolved on first use."""
        bound = self._bound.get(cc)
        if bound is not None:
            return bound
        plan = self._plan(cc)
        self.plans += 1
        qlike = [self.avals[n] for n in self._qlike] + list(self.outs[:_NOUT[self.kind]])
        bias = self.avals.get("bias")
        bias0 = api._bias_arg(plan, 0, bias.shape, bias.strides, bias.dtype.itemsize) if bias is not None \
            else api._bias_arg(plan, 0, (), (), 1)
        bound = _Bound(plan, tuple(api._tensor_strides(x.strides, x.dtype.itemsize, plan.layout) for x in qlike),
                       tuple(x.size > 0 for x in qlike), api._seq_arg(plan, 0, 0), bias0, api._dropout(plan),
                       all(_rows_aligned(x) for x in qlike), {})
        self._bound[cc] = bound
        return bound

    # ------------------------------------------------------------------ each call

    def _addr(self, a: dict, name: str) -> int:
        return _address(a[name]) if name in a and self.avals[name].size else 0

    def _maps(self, cp, b: _Bound, tensors, launch) -> tuple:
        """The TMA maps of the mapped tensors, cached per tuple of their addresses (the strides
        and shapes are this callback's own)."""
        if not b.plan.maps or L.empty_grid(launch):
            return ()
        mapped = tuple(tensors[i] for i in self._maps_of)
        key = tuple(t[0] for t in mapped)
        maps = b.maps.get(key)
        if maps is None:
            maps = api._maps(cp, b.plan.maps, mapped)
            if len(b.maps) > 64:
                b.maps.clear()
            b.maps[key] = maps
        return maps

    def __call__(self, ctx, out, *buffers):
        cp = api._cupy()
        with _xla_stream(cp, _stream_handle(ctx)):
            if self.opts.check_cu_seqlens:
                return self._general(cp, out, buffers)
            b = self.bind(api._device_cc())
            if not b.fast:
                return self._general(cp, out, buffers)
            a = dict(zip(self.names, buffers))
            ptrs = [_address(x) if ne else 0
                    for x, ne in zip([a[n] for n in self._qlike] + list(out[:_NOUT[self.kind]]), b.nonempty)]
            if any(p & 15 for p in ptrs):  # the library would copy (inputs) or refuse (outputs): its path says
                return self._general(cp, out, buffers)
            words = a.get("dropout_words")
            dropout = b.dropout if words is None else (*_read_words(cp, words), *b.dropout[2:])
            tensors = tuple([(p, *s) for p, s in zip(ptrs, b.strides)])
            plan = b.plan
            seq = api._seq_arg(plan, self._addr(a, "cu_seqlens_q"), self._addr(a, "cu_seqlens_k")) \
                if plan.group_mode else b.seq
            alibi = api._alibi_arg(plan, self._addr(a, "alibi_slopes"))
            bias_arg = b.bias if "bias" not in a else (self._addr(a, "bias"), *b.bias[1:])
            tma = (plan.spec if self.kind == "fwd" else plan.specs.dq_dk_dv).macro("BIAS_TMA", 0)
            if tma and bias_arg[0] and not api._bias_tma_ready(bias_arg[0], bias_arg, tma):
                # rows not a multiple of 16 bytes: the TMA loads read a padded copy (held until queued)
                padded = api._tma_bias(cp, _device_view(cp, a["bias"], self.avals["bias"].shape,
                                                        self.avals["bias"].dtype))
                bias_arg = api._bias_arg(plan, api._ptr(padded), padded.shape, padded.strides, padded.itemsize)
            if self.kind == "fwd":
                lse = _address(out[1]) if self.outs[1].size else 0
                api._launch_forward(cp, plan, tensors, lse, seq, alibi, bias_arg, dropout,
                                    self._maps(cp, b, tensors, plan.launch))
                return None
            dbias = self._direct_dbias(cp, plan, out[3]) if self.want_dbias else None
            if dbias is not None:  # (the kernel stores dS straight into XLA's buffer, as dBias)
                bias_arg = (*bias_arg[:6], api._DS_KIND[np.dtype(dbias.dtype)])
            # lse's cotangent (an operand only when it is not a symbolic zero), subtracted from D
            dlse = _device_view(cp, a["dlse"], self.avals["dlse"].shape, np.float32) \
                if "dlse" in a and self.avals["dlse"].size else None
            ds = api._launch_backward(cp, plan, tensors, self._addr(a, "lse"), seq, alibi, bias_arg, dropout,
                                      self._maps(cp, b, tensors, plan.launches["dq_dk_dv"]), dbias=dbias, dlse=dlse)
            if self.want_dbias and dbias is None:
                self._write_dbias(cp, reduce_dbias(cp, ds, self.avals["bias"]), out[3])
        return None

    def _direct_dbias(self, cp, plan, buffer):
        """XLA's dBias ``buffer`` as the array the backward kernel stores dS into as dBias itself
        (:func:`cupy_fmha.api._direct_dbias`: a bias that broadcasts along nothing, batch mode; then
        no fp32 workspace, no reduction and no copy), viewed as float16 / uint16 (bf16 bits) /
        float32; None otherwise, or for an empty or misaligned buffer."""
        dt = np.dtype(self.outs[3].dtype)
        if not self.outs[3].size or _address(buffer) % 16:
            return None
        bits = np.dtype(np.uint16) if dt.itemsize == 2 and dt != np.float16 else dt  # (bf16 as its bits)
        view = _device_view(cp, buffer, self.outs[3].shape, bits)
        return api._direct_dbias(cp, plan, self.avals["bias"], into=view)

    def _write_dbias(self, cp, dbias, buffer) -> None:
        """dBias (fresh and contiguous, in the bias's shape and dtype) into XLA's buffer."""
        if dbias.nbytes:
            _device_view(cp, buffer, dbias.shape, self.outs[3].dtype).data.copy_from_device_async(
                dbias.data, dbias.nbytes)

    def _general(self, cp, out, buffers) -> None:
        """The library's general path on CuPy views of the buffers: the checks and the plan with
        the real values (``check_cu_seqlens``: the offsets, read back), the copies of misaligned
        inputs, the named error of misaligned outputs."""
        a = {n: _device_view(cp, x, self.avals[n].shape, self.avals[n].dtype) for n, x in zip(self.names, buffers)}
        res = [_device_view(cp, x, r.shape, r.dtype) for x, r in zip(out, self.outs)]
        words = _read_words(cp, buffers[self.names.index("dropout_words")]) if "dropout_words" in a else None
        kw = _runtime_kw(self.opts, a, self.offsets, words)
        bias, slopes, cu = a.get("bias"), a.get("alibi_slopes"), (a.get("cu_seqlens_q"), a.get("cu_seqlens_k"))
        if self.kind == "fwd":
            plan = plan_forward(a["q"], a["k"], a["v"], bias=bias, alibi_slopes=slopes, cc=api._device_cc,
                                return_dropout_mask=False, **kw)
            api._run_forward(plan, a["q"], a["k"], a["v"], bias, slopes, tuple(res), *cu)
            return
        arrays = [a[n] for n in ("do", "q", "k", "v", "o", "lse")]
        plan = plan_backward(*arrays, bias=bias, alibi_slopes=slopes, dlse=a.get("dlse"), cc=api._device_cc,
                             return_dbias=self.want_dbias, deterministic=self.opts.deterministic, **kw)
        g = api._run_backward(plan, *arrays, bias, slopes, tuple(res[:3]), *cu, dlse=a.get("dlse"))
        if self.want_dbias and g.dbias.nbytes:
            res[3].data.copy_from_device_async(g.dbias.data, g.dbias.nbytes)


_CALLBACKS: dict = {}


def _callback(kind: str, opts: _Options, named: dict, outs: tuple, offsets, want_dbias: bool = False):
    """(names, operands, callback) for one pass: the operands that are not None, in a fixed
    order, and the :class:`_Callback` of this static key, shared by every trace with the same
    key (so an eager call finds JAX's compiled callback again, and the plans are made once)."""
    names = tuple(n for n, x in named.items() if x is not None)
    avals = {n: _Abstract(named[n]) for n in names}
    outs = tuple(_Abstract(r) for r in outs)
    key = (kind, tuple(_typed(x) for x in opts), names,
           tuple((x.shape, x.dtype) for x in avals.values()), tuple((r.shape, r.dtype) for r in outs), want_dbias,
           None if offsets is None or not isinstance(offsets[0], np.ndarray) else tuple(o.tobytes() for o in offsets))
    cb = _CALLBACKS.get(key)
    if cb is None:
        if len(_CALLBACKS) > 1024:
            _CALLBACKS.clear()
        cb = _CALLBACKS[key] = _Callback(kind, opts, names, avals, outs, offsets, want_dbias)
    return names, tuple(named[n] for n in names), cb


# --------------------------------------------------------------------------- the two passes


def _no_derivative(*_):
    """The derivative rule of the two passes: only a derivative of :func:`attention`'s own
    derivative reaches it (``custom_vjp`` runs the forward on primal values and the backward is
    not differentiated), and there JAX's error for a buffer callback ("Buffer callbacks do not
    support JVP. Please use jax.custom_jvp") told the user to rewrite the library."""
    raise TypeError("cupy_fmha.jax.attention: higher-order derivatives (a derivative of its gradient: grad of "
                    "grad, jax.hessian, jax.jvp of jax.grad) are not supported: its forward and backward run "
                    "this library's kernels, which have no derivative of their own")


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _forward(opts: _Options, q, k, v, slopes, bias, cu_q, cu_k, words):
    offsets = _plan_offsets(opts, q, k, cu_q, cu_k)
    plan = plan_forward(_Abstract(q), _Abstract(k), _Abstract(v), bias=_abstract(bias), alibi_slopes=_abstract(slopes),
                        cc=_never_device, return_dropout_mask=False, **opts.kw(cu_seqlens=offsets))
    types = (jax.ShapeDtypeStruct(plan.o_shape, q.dtype), jax.ShapeDtypeStruct(plan.lse_shape, jnp.float32))
    _, args, run = _callback("fwd", opts, dict(q=q, k=k, v=v, alibi_slopes=slopes, bias=bias, cu_seqlens_q=cu_q,
                                               cu_seqlens_k=cu_k, dropout_words=words), types, offsets)
    return buffer_callback(run, types, vmap_method="sequential")(*args)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _backward(opts: _Options, want_dbias: bool, do, q, k, v, o, lse, slopes, bias, cu_q, cu_k, words, dlse):
    # dlse: lse's cotangent, or None (a symbolic zero): then no operand, and the callback of the plain backward
    offsets = _plan_offsets(opts, q, k, cu_q, cu_k)
    plan_backward(*(_Abstract(x) for x in (do, q, k, v, o, lse)), bias=_abstract(bias), alibi_slopes=_abstract(slopes),
                  dlse=_abstract(dlse), cc=_never_device, return_dbias=want_dbias, deterministic=opts.deterministic,
                  **opts.kw(cu_seqlens=offsets))
    types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v) + ((bias,) if want_dbias else ()))
    _, args, run = _callback("bwd", opts, dict(do=do, q=q, k=k, v=v, o=o, lse=lse, alibi_slopes=slopes, bias=bias,
                                               cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, dropout_words=words, dlse=dlse),
                             types, offsets, want_dbias)
    return buffer_callback(run, types, vmap_method="sequential")(*args)


_forward.defjvp(_no_derivative)
_backward.defjvp(_no_derivative)


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
    do, dlse = cotangents
    zero = jax.custom_derivatives.SymbolicZero
    # lse's cotangent: an operand of the backward callback (dS = P (dP - D + dlse)) only where it is not a
    # symbolic zero, so a loss of o alone runs the plain backward
    dlse = None if isinstance(dlse, zero) else dlse.astype(jnp.float32)
    if isinstance(do, zero):
        if dlse is None:  # neither output was used: nothing flows back
            return (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), None,
                    None if bias is None else jnp.zeros_like(bias), None, None, None)
        do = jnp.zeros_like(o)  # lse alone: D = 0, dS = P * dlse
    grads = _backward(opts, saved.want_dbias, do.astype(o.dtype), q, k, v, o, lse, slopes, bias, cu_q, cu_k, words,
                      dlse)
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
    try:
        typed = jax.dtypes.issubdtype(dropout_key.dtype, jax.dtypes.prng_key)
    except TypeError:  # not a dtype JAX knows: jax.random.bits below says why, named
        typed = False
    shape = tuple(dropout_key.shape)
    if shape != () if typed else len(shape) != 1:
        raise ValueError(f"dropout_key: expected one PRNG key (a typed key of shape (), or a raw uint32 key of "
                         f"shape (2,)), got a {'typed' if typed else 'raw'} key array of shape {shape}; "
                         "for a key per vmapped element, jax.vmap over the keys")
    try:
        return jax.random.bits(dropout_key, (4,), jnp.uint32)
    except (TypeError, ValueError) as e:  # a raw key of the wrong dtype or length
        raise TypeError(f"dropout_key: expected a JAX PRNG key (jax.random.key(...) or jax.random.PRNGKey(...)), "
                        f"got {dropout_key.dtype} of shape {shape}: {e}") from None


#: JAX's platform names for the devices the callbacks run on
_GPU_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def _check_on_gpu(name: str, x) -> None:
    """An eager call with an array on another device (JAX's CPU backend) is refused by name here:
    run, the callback would fail inside XLA with a long wrapped traceback. Traced values (jit,
    grad, vmap, eval_shape) have no device yet and pass; a jitted program placed on the CPU still
    fails in the callback, with this library's "no usable CUDA GPU" message last."""
    tracer = getattr(jax.core, "Tracer", None)
    if tracer is not None and isinstance(x, tracer):
        return
    try:
        platforms = {d.platform for d in x.devices()}
    except Exception:  # noqa: BLE001 - not a placed jax.Array (a tracer of another kind, NumPy)
        return
    other = sorted(platforms - _GPU_PLATFORMS)
    if other:
        raise RuntimeError(f"{name}: on JAX's {other[0]} device; cupy_fmha.jax runs its kernels on a CUDA GPU "
                           "(JAX with CUDA, jax[cuda13]); on the CPU use jax.nn.dot_product_attention or "
                           "cupy_fmha.reference")


#: what each static option must be, for :func:`_check_static`'s message
_STATIC = {"window_size": "a pair of Python ints (left, right)",
           "mask": "a CK mask string, an int or a MaskSpec",
           "layout": "'bshd', 'bhsd' or 'thd'",
           "max_seqlen_q": "a Python int", "max_seqlen_k": "a Python int"}


def _check_static(name: str, value) -> None:
    """The options are the custom_vjp's static (hashable) argument: a traced value (an argument
    of a jitted or vmapped function, or a pair holding one) is refused here by name. Past this,
    JAX's UnexpectedTracerError about ``nondiff_argnums`` named neither the option nor the fix."""
    tracer = getattr(jax.core, "Tracer", None)
    parts = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if tracer is not None and any(isinstance(x, tracer) for x in parts):
        raise TypeError(f"{name}: expected {_STATIC[name]}, a static value in cupy_fmha.jax (fixed when the "
                        f"call is traced), got the traced value {value!r}; pass a Python value (under jax.jit: "
                        "static_argnums / static_argnames)")


def _as_array(name: str, x):
    """``x`` (a JAX or NumPy array, or what NumPy makes one of) as a JAX array, None kept; what
    ``jnp.asarray`` refuses is named here (its own message names no argument)."""
    if x is None:
        return None
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name}: expected a JAX or NumPy array, got {type(x).__module__}.{type(x).__name__} "
                        f"({e})") from None


def _static_max_seqlen(name: str, value) -> int:
    if value is None:
        raise ValueError(f"{name}: cupy_fmha.jax needs max_seqlen_q and max_seqlen_k as Python ints in group mode "
                         "(layout='thd'): cu_seqlens are device values, unknown when the function is traced, and "
                         "the max lengths fix lse's shape and the launch grid")
    return check_int(name, value, 0, what="a Python int (a static value in cupy_fmha.jax)")


def attention_with_lse(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                       layout="bshd", alibi_slopes=None, bias=None, dropout_p=0.0, seed=0, offset=0,
                       dropout_key=None, deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, check_cu_seqlens=False):
    """:func:`attention` that also returns the log-sum-exp rows, ``(o, lse)``, lse float32
    [batch, nhead_q, seqlen_q] (group mode: [batch, nhead_q, max_seqlen_q]; rows that see no key:
    -inf), natural log. The gradient flows through both: lse_i = log sum_j exp(s_ij) gives
    d lse_i / d s_ij = P_ij, so lse's cotangent g adds g_i P_ij to dS (dS = P (dP - D + g), D =
    rowsum(dO * O)); it is passed to the backward callback as
    :func:`cupy_fmha.attention_backward`'s ``dlse`` (subtracted from D, same kernels), and only
    when the differentiated value depends on lse (otherwise the backward is that of
    :func:`attention`)."""
    check_dropout(dropout_p, seed, offset)  # named errors for the static values before they are hashed
    if softmax_scale is not None:  # (a traced or array value is refused here, by name)
        softmax_scale = _check_scale(softmax_scale, 1)
    check_causal(causal)  # (static values: a traced one is refused here, by name)
    check_flag("deterministic", deterministic)
    if not isinstance(check_cu_seqlens, (bool, np.bool_)):
        raise TypeError(f"check_cu_seqlens: expected a bool, got {check_cu_seqlens!r}")
    for name, value in (("window_size", window_size), ("mask", mask), ("layout", layout),
                        ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        _check_static(name, value)
    if check_cu_seqlens and layout != "thd":  # (it would only send every call down the general path)
        raise ValueError(f"check_cu_seqlens: True checks group mode's offsets (layout='thd'), got layout {layout!r}")
    if layout == "thd":
        max_seqlen_q = _static_max_seqlen("max_seqlen_q", max_seqlen_q)
        max_seqlen_k = _static_max_seqlen("max_seqlen_k", max_seqlen_k)
    words = None
    if dropout_key is not None:
        if seed != 0 or offset != 0:
            raise ValueError("dropout_key: give dropout_key or seed/offset, not both")
        if dropout_p > 0:
            words = _dropout_words(dropout_key)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not all(hasattr(x, a) for a in ("shape", "dtype")):
            raise TypeError(f"{name}: expected a JAX array, got {type(x).__module__}.{type(x).__name__}")
        _check_on_gpu(name, x)
    for name, x in (("q", q), ("k", k), ("v", v), ("alibi_slopes", alibi_slopes), ("bias", bias)):
        # (JAX turns a NumPy float64 into float32 where x64 is off: the library's check would then
        # name the wrong dtype; attention_forward refuses float64)
        if x is not None and np.dtype(getattr(x, "dtype", np.float32)) == np.float64:
            raise TypeError(f"{name}: got float64; expected " + ("float32" if name == "alibi_slopes" else
                                                                  "float16 or bfloat16" if name in ("q", "k", "v") else
                                                                  "float16, bfloat16 or float32"))
    if isinstance(window_size, np.ndarray):  # a hashable static value, checked as a pair of ints later
        window_size = tuple(window_size.tolist())
    slopes, bias, cu_q, cu_k = (_as_array(name, x) for name, x in (
        ("alibi_slopes", alibi_slopes), ("bias", bias), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)))
    for name, x in (("q", q), ("k", k), ("v", v), ("alibi_slopes", slopes), ("bias", bias), ("cu_seqlens_q", cu_q),
                    ("cu_seqlens_k", cu_k)):
        if x is not None and not all(isinstance(n, (int, np.integer)) for n in x.shape):
            # (a symbolic dimension of jax.export's shape polymorphism: past here int() of it raised
            # InconclusiveDimensionOperation from deep inside the planning)
            raise ValueError(f"{name}: shape {tuple(x.shape)} has a symbolic dimension; cupy_fmha.jax plans its "
                             "kernels for concrete shapes (no shape polymorphism)")
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
        dropout_key: instead of seed/offset, one JAX PRNG key (typed, shape (), or raw uint32,
            shape (2,); for a key per element, ``jax.vmap`` over a batch of keys); seed and
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
            check them in each callback (a synchronization of XLA's stream). True in another
            layout is a ValueError.

    Returns:
        o: like q with head dim hdim_v, in q's dtype.

    Raises:
        TypeError, ValueError: at trace time, with :mod:`cupy_fmha.validate`'s named messages
            (and those above for max_seqlen_q/k, dropout_key, check_cu_seqlens); a traced value
            (under ``jit`` or ``vmap``) for a static option is a TypeError naming it.

    Method: FlashAttention-2's algorithm (Dao, 2023) forward; the backward is CK's
    ``block_fmha_bwd_dq_dk_dv`` pipeline (see :func:`cupy_fmha.attention_backward`).
    """
    o, _ = attention_with_lse(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                              mask=mask, layout=layout, alibi_slopes=alibi_slopes, bias=bias, dropout_p=dropout_p,
                              seed=seed, offset=offset, dropout_key=dropout_key, deterministic=deterministic,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                              max_seqlen_k=max_seqlen_k, check_cu_seqlens=check_cu_seqlens)
    return o
