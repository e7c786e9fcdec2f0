"""Public API: attention forward and backward on CuPy arrays.

Forward: FlashAttention-2 (Dao, 2023). Backward: the three-kernel pipeline of AMD Composable
Kernel's FMHA backward (ck_tile ``fmha_bwd_kernel.hpp``): ``dot_do_o`` (D = rowsum(dO * O)),
``dq_dk_dv`` (K/V resident per CTA, Q/dO/LSE/D streamed; dQ added into an fp32 workspace, or
with ``deterministic=True`` stored into one slab per key block) and ``convert_dq`` (sum the slabs
and cast dQ; also sums dK/dV over each GQA group).

Arrays: CuPy arrays (NumPy arrays are copied to the current device; for other frameworks use
``cupy.from_dlpack``). fp16 is ``float16``. CuPy has no bfloat16, so bf16 travels as ``uint16``
arrays of raw bits, passed with ``dtype="bfloat16"``; NumPy ``ml_dtypes.bfloat16`` arrays are
recognized and copied. bf16 outputs are ``uint16`` CuPy arrays of raw bits.

Group mode (variable-length sequences, ``layout="thd"`` with ``cu_seqlens_q``/``cu_seqlens_k``):
sequences are packed along the token axis, q [total_q, nhead_q, d], k/v [total_k, nhead_k, d/dv];
each sequence is its own attention problem (masks and ALiBi use its own lengths; an elementwise
bias, broadcastable to [batch, nhead_q, max_seqlen_q, max_seqlen_k], is read at sequence b's
local positions, the top-left corner of plane b, and dBias comes back in the bias's shape, 0
where no sequence reaches). The kernels get max_seqlen_q/max_seqlen_k as their sequence lengths
(the row pitch of lse, D, the dQ workspace, all [batch, nhead_q, max_seqlen_q], and of the dS
workspace [batch, nhead_q, max_seqlen_q, max_seqlen_k]) and move every token-indexed pointer by
``cu_seqlens[b]`` rows; see ``kernels/varlen.cuh``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from . import launch as L
from .compile import get_function
from .spec import bwd_specs, dropout_mask_spec, fwd_spec, tuning_key, use_wg_skip
from .validate import (
    _BF16,
    check_alibi_slopes,
    check_backward_inputs,
    check_bias,
    check_dropout,
    check_flag,
    check_forward_inputs,
    check_return_dbias,
    check_varlen_inputs,
    VarlenProblem,
)

__all__ = ["attention_forward", "attention_backward", "AttentionGrads", "AttentionGradsWithBias"]

LOG2E = 1.4426950408889634


class AttentionGrads(NamedTuple):
    """Gradients of the attention inputs, in the inputs' layout and dtype (bf16 as uint16 bits).

    dq: like q; dk: like k (nhead_k heads: summed over each GQA group); dv: like v.
    """

    dq: object
    dk: object
    dv: object


class AttentionGradsWithBias(NamedTuple):
    """What :func:`attention_backward` returns with ``return_dbias=True``: the three gradients of
    :class:`AttentionGrads` plus ``dbias``, the gradient of the elementwise bias with the bias's
    own shape and dtype (bf16 as uint16 bits), a fresh CuPy array.

    dq: like q; dk: like k; dv: like v; dbias: like bias.
    """

    dq: object
    dk: object
    dv: object
    dbias: object


_CHECKED: dict = {}


def _typed(v):
    """A cache key for an option value that tells apart values which compare equal but are not
    equally valid (``True`` / ``1`` / ``1.0``; ``(2, 0)`` / ``(2.0, 0.0)``; ``0`` / ``False``)."""
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_typed(x) for x in v))
    return (type(v), v)


def _checked(check, arrays, **kw):
    """``check(*arrays, **kw)``, memoized on everything it reads (shapes, dtypes, strides, devices
    and the options): a training loop calling with the same shapes pays for validation once.
    Failures are never cached, so bad input always raises."""
    try:
        key = (check.__name__,
               tuple((type(a), tuple(a.shape), a.dtype, tuple(a.strides),
                      getattr(getattr(a, "device", None), "id", None)) for a in arrays),
               tuple(sorted((k, _typed(v)) for k, v in kw.items())))
        hash(key)
    except (AttributeError, TypeError):
        return check(*arrays, **kw)
    p = _CHECKED.get(key)
    if p is None:
        p = check(*arrays, **kw)
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED[key] = p
    return p


_GPU_ERROR: list = []  # the reason no GPU is usable, once known


def _cupy():
    """CuPy, after checking once that a CUDA device is usable.

    Raises:
        RuntimeError: CuPy is missing or no GPU is usable (with the reason).
    """
    try:
        import cupy
    except Exception as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "cupy-fmha's GPU API needs CuPy and a CUDA GPU; install cupy-fmha[cuda13] (or [cuda12]),"
            " or use cupy_fmha.reference for the NumPy implementation"
        ) from exc
    if not _GPU_ERROR:
        try:
            n = cupy.cuda.runtime.getDeviceCount()
            _GPU_ERROR.append("" if n > 0 else "no CUDA device found")
        except Exception as exc:  # noqa: BLE001 - CUDA runtime errors of every kind
            _GPU_ERROR.append(f"{type(exc).__name__}: {exc}")
    if _GPU_ERROR[0]:
        raise RuntimeError(f"cupy_fmha: no usable CUDA GPU ({_GPU_ERROR[0]}); "
                           "cupy_fmha.reference runs the same functions on the CPU")
    return cupy


def _to_device(cp, name: str, a):
    """CuPy array on the current device holding ``a``'s bits (bf16 as uint16); NumPy is copied."""
    if isinstance(a, cp.ndarray):
        if a.device.id != cp.cuda.Device().id:
            raise ValueError(f"{name}: array is on GPU {a.device.id}, but the current device is "
                             f"{cp.cuda.Device().id}; use `with cupy.cuda.Device({a.device.id}):`")
        return a
    a = np.asarray(a)
    if a.dtype == _BF16:
        a = a.view(np.uint16)
    return cp.asarray(a)


def _aligned(a) -> bool:
    """cp.async moves 16-byte chunks: rows and the base must be 16-byte aligned."""
    item = a.itemsize
    return a.data.ptr % 16 == 0 and all((s // item) % 8 == 0 for s in a.strides[:-1])


def _prep(cp, name: str, a):
    a = _to_device(cp, name, a)
    if a.strides[-1] != a.itemsize or not _aligned(a):
        a = cp.ascontiguousarray(a)  # a copy; the caller's array is untouched
        if not _aligned(a):  # e.g. an odd-sized leading view: pad-free copy fixes alignment
            a = a.copy()
    return a


def _strides(a, layout: str) -> tuple[np.int64, np.int64, np.int64]:
    """(batch, head, seq) strides in elements for a rank-4 array in ``layout``."""
    st = [s // a.itemsize for s in a.strides]
    sb, s1, s2 = st[0], st[1], st[2]
    sh, ss = (s2, s1) if layout == "bshd" else (s1, s2)
    return np.int64(sb), np.int64(sh), np.int64(ss)


def _shape(layout: str, b: int, s: int, h: int, d: int) -> tuple[int, int, int, int]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def _dtype_name(p) -> str:
    return "bf16" if p.dtype == _BF16 else "fp16"


def _check_out(cp, out, names, shapes, dtypes):
    """Caller-provided output buffers: CuPy arrays of the expected shape and dtype on the current
    device, unit last stride, 16-byte aligned rows. Raises ValueError/TypeError naming ``out``."""
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        raise TypeError(f"out: expected a tuple ({', '.join(names)}) of CuPy arrays, got {type(out).__name__}")
    for name, a, shape, dt in zip(names, out, shapes, dtypes):
        if not isinstance(a, cp.ndarray):
            raise TypeError(f"out: {name} must be a CuPy array, got {type(a).__name__}")
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"out: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
        if a.dtype != dt:
            raise TypeError(f"out: {name} must have dtype {np.dtype(dt).name}, got {a.dtype.name}")
        if a.device.id != cp.cuda.Device().id:
            raise ValueError(f"out: {name} is on GPU {a.device.id}, not the current device")
        if a.size == 0:  # nothing to address (group mode: every sequence empty)
            continue
        if name == "lse":
            if not a.flags.c_contiguous:
                raise ValueError("out: lse must be C-contiguous")
        elif a.strides[-1] != a.itemsize or not _aligned(a):
            raise ValueError(f"out: {name} needs a unit last stride and 16-byte aligned rows")
    return out


def _alibi_args(cp, alibi_slopes, p):
    """(pointer, batch stride) kernel arguments for ALiBi slopes; a null pointer when off."""
    if alibi_slopes is None:
        return np.uint64(0), np.int64(0)
    shape = check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    slopes = cp.ascontiguousarray(_to_device(cp, "alibi_slopes", alibi_slopes))
    return slopes, np.int64(p.nhead_q if len(shape) == 2 else 0)


_NULL = np.uint64(0)  # a null pointer kernel argument
#: the group-mode kernel arguments in batch mode: no cu_seqlens_q/k, window already resolved
_BATCH_MODE = (_NULL, _NULL, np.int32(0))

#: convert_dq's deterministic-split arguments when it does not sum slabs (dQ atomics, GQA sums)
_NO_SPLIT = (np.int32(0), np.int64(0), np.int32(0), np.int32(0), np.int32(0), np.int32(1), np.int32(1))

_VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _reject_varlen_args(layout, values) -> None:
    for name, val in zip(_VARLEN_ARGS, values):
        if val is not None:
            raise ValueError(f"{name}: variable-length inputs need layout='thd', got {layout!r}")


def _strides_thd(a) -> tuple[np.int64, np.int64, np.int64]:
    """(batch, head, token) strides in elements of a packed [total, heads, d] array; batch 0."""
    st = [s // a.itemsize for s in a.strides]
    return np.int64(0), np.int64(st[1]), np.int64(st[0])


def _cu_device(cp, name: str, cu):
    """cu_seqlens as a contiguous int32 CuPy array on the current device (already validated)."""
    return cp.ascontiguousarray(_to_device(cp, name, cu))


# --------------------------------------------------------------------------- elementwise bias

#: bias_kind kernel argument per logical bias dtype (0 = no bias)
_BIAS_KIND = {np.dtype(np.float16): 1, _BF16: 2, np.dtype(np.float32): 3}
_NO_BIAS = (np.uint64(0), np.int32(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0))


def _check_bias_inputs(p, bias, alibi_slopes, dtype):
    """The bias's logical dtype (``None`` without a bias); raises before anything runs when the
    bias is malformed or given together with ALiBi slopes. Group mode (``p`` a
    :class:`~cupy_fmha.validate.VarlenProblem`): the bias must broadcast to [batch, nhead_q,
    max_seqlen_q, max_seqlen_k]."""
    if bias is None:
        return None
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q, bias=bias)  # raises: both given
    if isinstance(p, VarlenProblem):
        return check_bias(bias, p.batch, p.nhead_q, p.max_seqlen_q, p.max_seqlen_k, dtype=dtype, varlen=True)
    return check_bias(bias, p.batch, p.nhead_q, p.seqlen_q, p.seqlen_k, dtype=dtype)


def _bias_strides(shape, strides, itemsize) -> tuple[int, int, int, int]:
    """Element strides of a bias viewed as [batch, nhead_q, seqlen_q, seqlen_k]: missing leading
    dimensions and every dimension of size 1 (broadcast) get stride 0; others keep theirs (any
    sign), so no copy is needed whatever the bias's layout."""
    st = [0 if int(n) == 1 else int(s) // itemsize for n, s in zip(shape, strides)]
    return tuple([0] * (4 - len(st)) + st)


def _bias_args(cp, bias, bias_dt):
    """Kernel arguments (pointer, kind, batch / head / query / key strides in elements) for a
    checked bias (:data:`_NO_BIAS` without one)."""
    if bias is None:
        return _NO_BIAS
    dev = _to_device(cp, "bias", bias)
    strides = _bias_strides(dev.shape, dev.strides, dev.itemsize)
    # an empty bias (group mode: max_seqlen_q or max_seqlen_k 0) is never read: a null pointer
    ptr = dev if dev.size else _NULL
    return (ptr, np.int32(_BIAS_KIND[bias_dt]), *(np.int64(x) for x in strides))


_BF16_KERNEL: list = []  # the fused float32 -> bf16 bits kernel, built on first use


def _f32_to_bf16_bits(cp, x):
    """float32 CuPy array -> bf16 bits (uint16), rounded to nearest even; NaN stays NaN. One fused
    elementwise kernel: the dS workspace of dBias holds batch * nhead_q * seqlen_q * seqlen_k
    floats (4.3 GB at batch 4, 16 heads, seqlen 4096), and the unfused CuPy expression made
    about ten passes over it. With NumPy as ``cp`` (the CPU tests), the same rule vectorized."""
    if not hasattr(cp, "ElementwiseKernel"):
        u = x.view(cp.uint32)
        bits = ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
        return cp.where(cp.isnan(x), cp.uint16(0x7FC0), bits)
    if not _BF16_KERNEL:
        _BF16_KERNEL.append(cp.ElementwiseKernel(
            "float32 x", "uint16 y",
            "const unsigned int u = __float_as_uint(x);"
            "y = isnan(x) ? (unsigned short)0x7FC0u"
            "             : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);",
            "cupy_fmha_f32_to_bf16_bits"))
    return _BF16_KERNEL[0](x)


def _reduce_dbias(cp, ds, bias, bias_dt):
    """dBias from the fp32 dS workspace [batch, nhead_q, seqlen_q, seqlen_k] (group mode: the max
    lengths, each sequence's dS in the top-left [seqlen_q_i, seqlen_k_i] corner of its plane,
    zeros elsewhere): summed over the dimensions the bias broadcasts along (one CuPy reduction,
    float64 accumulation; no atomics, so the result is the same on every run), cast to the
    bias's dtype, in the bias's shape. A bias that broadcasts along nothing takes the workspace
    itself (no copy for fp32)."""
    shape = tuple(int(n) for n in bias.shape)
    shape4 = (1,) * (4 - len(shape)) + shape
    axes = tuple(a for a in range(4) if shape4[a] == 1 and ds.shape[a] != 1)
    red = ds.sum(axis=axes, dtype=cp.float64, keepdims=True) if axes else ds
    red = red.astype(cp.float32, copy=False).reshape(shape)
    if bias_dt == _BF16:
        return _f32_to_bf16_bits(cp, cp.ascontiguousarray(red))
    return cp.ascontiguousarray(red.astype(bias_dt, copy=False))


def _dropout_args(drop):
    """The kernels' dropout argument group (keep_threshold, rp_keep, seed, offset); passed to
    every instance, read only by the ``DROPOUT=1`` ones."""
    return (np.uint32(drop.threshold), np.float32(1.0 / (1.0 - drop.p)), np.uint64(drop.seed),
            np.uint64(drop.offset))


def _dropout_mask(cp, drop, batch, nhead_q, seqlen_q, seqlen_k):
    """bool [batch, nhead_q, seqlen_q, seqlen_k]: the keep mask the attention kernels apply
    (fmha_dropout_mask.cu calls the same Philox function with the same keying)."""
    keep = cp.empty((batch, nhead_q, seqlen_q, seqlen_k), dtype=cp.bool_)
    if keep.size:
        spec = dropout_mask_spec()
        _launch(cp, spec, L.dropout_mask_launch(batch, nhead_q, seqlen_q, seqlen_k),
                (keep, np.int32(seqlen_q), np.int32(seqlen_k), np.uint32(drop.threshold),
                 np.uint64(drop.seed), np.uint64(drop.offset)))
    return keep


# Per-call host cost matters at short sequences (a 1024-token forward takes ~0.13 ms on an H200),
# so the spec lookups are memoized, keyed also by the tuning variables the tile table reads.
@functools.lru_cache(maxsize=1024)
def _fwd_spec_cached(dtype, hdim_q, hdim_v, cc, alibi, bias, dropout, wg_skip, _tuning_key):
    return fwd_spec(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout, wg_skip=wg_skip)


def _fwd_spec(dtype, hdim_q, hdim_v, cc, *, alibi=False, bias=False, dropout=False, diagonal=False, seqlen_q=0):
    """:func:`cupy_fmha.spec.fwd_spec`, memoized."""
    return _fwd_spec_cached(dtype, hdim_q, hdim_v, cc, alibi, bias, dropout, use_wg_skip(diagonal, seqlen_q),
                            tuning_key())


@functools.lru_cache(maxsize=1024)
def _bwd_specs_cached(dtype, hdim_q, hdim_v, cc, alibi, bias, dropout, deterministic, _tuning_key):
    return bwd_specs(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout, deterministic=deterministic)


def _bwd_specs(dtype, hdim_q, hdim_v, cc, *, alibi=False, bias=False, dropout=False, deterministic=False):
    """:func:`cupy_fmha.spec.bwd_specs`, memoized."""
    return _bwd_specs_cached(dtype, hdim_q, hdim_v, cc, alibi, bias, dropout, deterministic, tuning_key())


def _cc(cp) -> int:
    """Compute capability of the current device as an int (e.g. 90; CuPy caches it)."""
    return int(cp.cuda.Device().compute_capability)


def _launch(cp, spec, launch, args):
    if L.empty_grid(launch):  # group mode with nothing to do (e.g. every sequence empty)
        return
    fn = get_function(spec)
    if launch.smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < launch.smem:
        fn.max_dynamic_shared_size_bytes = launch.smem
    fn(launch.grid, launch.block, args, shared_mem=launch.smem)


def attention_forward(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                      layout="bshd", dtype=None, alibi_slopes=None, bias=None, dropout_p=0.0, seed=0, offset=0,
                      return_dropout_mask=False, out=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                      max_seqlen_k=None):
    """Attention forward: ``O = softmax(softmax_scale * Q K^T + mask) V`` and its log-sum-exp.

    Args:
        q: [batch, seqlen_q, nhead_q, hdim_q] (``layout="bshd"``), [batch, nhead_q, seqlen_q,
            hdim_q] (``"bhsd"``) or [total_q, nhead_q, hdim_q] (``"thd"``, group mode); fp16, or
            bf16 (uint16 bits with ``dtype="bfloat16"``). Any strides with a unit last stride.
        k: [batch, seqlen_k, nhead_k, hdim_q] (or bhsd, or [total_k, nhead_k, hdim_q] for thd);
            ``nhead_q`` a multiple of ``nhead_k`` (GQA/MQA).
        v: [batch, seqlen_k, nhead_k, hdim_v] (or bhsd, or [total_k, nhead_k, hdim_v]).
        softmax_scale: multiplies Q K^T; default ``1 / sqrt(hdim_q)``.
        causal: FlashAttention's causal mask (bottom-right aligned).
        window_size: (left, right) sliding window, bottom-right aligned, -1 = unlimited.
        mask: CK's mask string instead (``0``, ``t``, ``b``, ``t:l,r``, ``b:l,r``, ``xt:w``,
            ``xb:w``, ``g:y,x``); see :mod:`cupy_fmha.mask`. In group mode every mask is resolved
            per sequence with that sequence's own lengths.
        layout: ``"bshd"`` (default), ``"bhsd"``, or ``"thd"`` (group mode, needs cu_seqlens).
        dtype: ``None``, ``"float16"`` or ``"bfloat16"``.
        alibi_slopes: optional float32 [nhead_q] or [batch, nhead_q]: ALiBi as FlashAttention
            defines it, a bias ``-slope * |i + seqlen_k - seqlen_q - j|`` added to the scaled
            scores of query row ``i`` and key ``j`` (group mode: local positions and each
            sequence's own lengths).
        bias: optional elementwise bias added to the scaled scores (after ``softmax_scale``,
            before the mask), any shape broadcastable (NumPy rules) to [batch, nhead_q,
            seqlen_q, seqlen_k], e.g. [1, 1, sq, sk], [1, nhead_q, sq, sk], [batch, nhead_q, sq,
            sk], [sq, sk] or [sq, 1]; any strides (broadcast dimensions are read with stride 0,
            never copied). dtype float16, bfloat16 or float32, independent of q's dtype: bf16 as
            a NumPy ``ml_dtypes.bfloat16`` array, or as uint16 bits on the GPU when
            ``dtype="bfloat16"``. Not together with ``alibi_slopes``. A bias of ``-inf`` masks a
            pair out. Group mode (``layout="thd"``): broadcastable to [batch, nhead_q,
            max_seqlen_q, max_seqlen_k] (batch = ``len(cu_seqlens_q) - 1``); sequence ``i`` uses
            ``bias[i, :, :seqlen_q_i, :seqlen_k_i]``, the top-left corner of its plane, indexed
            by positions local to the sequence (entries beyond it are never read). Selects the
            kernel instance compiled with the bias (``-D BIAS=1``).
        dropout_p: dropout probability in [0, 1) on the attention weights: ``O = (P * Z) V``
            with ``Z = keep / (1 - dropout_p)``; the LSE stays that of the undropped softmax.
            0 (default) runs the kernels built without dropout; above 0, the ``-D DROPOUT=1``
            instances.
        seed, offset: integers in [0, 2**64): the Philox key and counter offset
            (:mod:`cupy_fmha.philox` defines the keep mask bit for bit; element (b, h, i, j)
            uses counter offset ``offset + b * nhead_q + h``; group mode: b is the sequence and
            i, j positions inside it). The backward must get the same ``dropout_p``, ``seed``
            and ``offset``.
        return_dropout_mask: also return the keep mask (computed by a separate small kernel
            with the same Philox function; all True when ``dropout_p`` is 0).
        out: optional (o, lse) buffers to write into instead of fresh arrays (o: any strides with
            a unit last stride and 16-byte aligned rows; lse: C-contiguous float32).
        cu_seqlens_q, cu_seqlens_k: group mode only: int32 [batch + 1] offsets (CuPy or NumPy;
            read back once to validate): sequence ``b`` is rows ``cu_seqlens_q[b]`` to
            ``cu_seqlens_q[b + 1]`` of q (and likewise of k, v). Lengths may be 0 anywhere.
        max_seqlen_q, max_seqlen_k: group mode only: ``None`` (the longest sequence) or an int
            at least that long; max_seqlen_q sets lse's last dimension.

    Returns:
        (o, lse), or (o, lse, keep) with ``return_dropout_mask``: o [batch, seqlen_q, nhead_q,
        hdim_v] in ``layout`` (thd: [total_q, nhead_q, hdim_v]) and the inputs' dtype; lse
        float32 [batch, nhead_q, seqlen_q] (thd: [batch, nhead_q, max_seqlen_q], -inf beyond each
        sequence's length), natural log; keep a CuPy bool array [batch, nhead_q, seqlen_q,
        seqlen_k] (batch mode: as :func:`cupy_fmha.reference.attention_forward` returns it; thd:
        [batch, nhead_q, max_seqlen_q, max_seqlen_k], sequence b's mask in its top-left
        [seqlen_q_b, seqlen_k_b] corner, where the reference returns a list of the per-sequence
        masks). Rows that see no key (all rows of a sequence with no keys): o = 0, lse = -inf.

    Raises:
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_forward_inputs`,
            :func:`cupy_fmha.validate.check_bias` and :func:`cupy_fmha.validate.check_dropout`;
            ``bias`` with ``alibi_slopes``), before anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    if layout == "thd":
        return _forward_varlen(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                               mask=mask, dtype=dtype, alibi_slopes=alibi_slopes, bias=bias, dropout_p=dropout_p,
                               seed=seed, offset=offset, return_dropout_mask=return_dropout_mask, out=out,
                               cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                               max_seqlen_k=max_seqlen_k)
    _reject_varlen_args(layout, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    p = _checked(check_forward_inputs, (q, k, v), softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, mask=mask, layout=layout, dtype=dtype)
    bias_dt = _check_bias_inputs(p, bias, alibi_slopes, dtype)
    drop = check_dropout(dropout_p, seed, offset)
    want_keep = check_flag("return_dropout_mask", return_dropout_mask)
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    cp = _cupy()
    store = np.uint16 if p.dtype == _BF16 else np.float16  # element storage on the device
    o_shape = _shape(layout, p.batch, p.seqlen_q, p.nhead_q, p.hdim_v)
    lse_shape = (p.batch, p.nhead_q, p.seqlen_q)
    if out is not None:
        _check_out(cp, out, ("o", "lse"), (o_shape, lse_shape), (store, np.float32))
    q, k, v = (_prep(cp, n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    bias_args = _bias_args(cp, bias, bias_dt)
    if out is None:
        o, lse = cp.empty(o_shape, dtype=store), cp.empty(lse_shape, dtype=cp.float32)
    else:
        o, lse = out
    win_y, win_x = L.kernel_window(p.window)
    spec = _fwd_spec(_dtype_name(p), p.hdim_q, p.hdim_v, _cc(cp),
                    alibi=alibi_slopes is not None, bias=bias is not None, dropout=drop.enabled,
                    diagonal=min(win_y, win_x) < L.WINDOW_INF, seqlen_q=p.seqlen_q)
    args = (q, k, v, o, lse, *_strides(q, layout), *_strides(k, layout), *_strides(v, layout),
            *_strides(o, layout), np.int32(p.seqlen_q), np.int32(p.seqlen_k), np.int32(p.hdim_q),
            np.int32(p.hdim_v), np.int32(p.group), np.float32(p.softmax_scale * LOG2E),
            np.int32(win_y), np.int32(win_x), *_alibi_args(cp, alibi_slopes, p), *_BATCH_MODE, *bias_args,
            *_dropout_args(drop))
    _launch(cp, spec, L.fwd_launch(spec, p.batch, p.nhead_q, p.seqlen_q), args)
    if want_keep:
        return o, lse, _dropout_mask(cp, drop, p.batch, p.nhead_q, p.seqlen_q, p.seqlen_k)
    return o, lse


def attention_backward(do, q, k, v, o, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       mask=None, layout="bshd", dtype=None, alibi_slopes=None, bias=None, return_dbias=False,
                       dropout_p=0.0, seed=0, offset=0, out=None, deterministic=False, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None) -> AttentionGrads | AttentionGradsWithBias:
    """Attention backward: dQ, dK, dV (and optionally dBias) from dO and the forward's O and LSE.

    Three launches (CK's FMHA backward): ``dot_do_o`` (which also zero-fills the fp32 dQ
    accumulator, as FlashAttention-2's preprocessing does), ``dq_dk_dv``, ``convert_dq`` (+ a GQA
    group sum of dK/dV through the same convert kernel when nhead_q != nhead_k). With
    ``return_dbias``, ``dq_dk_dv`` also stores dS = P * (dP - D) in float32 (before any 16-bit
    rounding) into a zeroed workspace of [batch, nhead_q, seqlen_q, seqlen_k] float32 (group
    mode: the max lengths; 4 bytes per score: plan memory for it), which CuPy then sums over the
    bias's broadcast dimensions.

    Args:
        do: gradient of o, [batch, seqlen_q, nhead_q, hdim_v] (or bhsd, or [total_q, nhead_q,
            hdim_v] for thd); its strides may differ from o's.
        q, k, v: as in :func:`attention_forward`.
        o: the forward output; lse: float32 [batch, nhead_q, seqlen_q] from the forward (thd:
            [batch, nhead_q, max_seqlen_q]).
        softmax_scale, causal, window_size, mask, layout, dtype, alibi_slopes, bias, dropout_p,
            seed, offset, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: as in the
            forward (must match: the backward regenerates the forward's keep mask from dropout_p,
            seed and offset; dV = (P Z)^T dO, dS = P (dP Z - D), D = rowsum(dO * O)).
        return_dbias: also return dbias, the gradient of ``bias`` (needs ``bias``): dS summed
            over the dimensions the bias broadcasts along, in the bias's shape and dtype. Group
            mode: sequence ``i``'s dS lands in the top-left [seqlen_q_i, seqlen_k_i] corner of
            plane ``i`` of a [batch, nhead_q, max_seqlen_q, max_seqlen_k] fp32 workspace, the
            rest is 0; so entries of dbias outside every sequence's corner are 0.
        out: optional (dq, dk, dv) buffers to write into (shapes of q, k, v; unit last stride,
            16-byte aligned rows); dbias is always a fresh array.
        deterministic: bool. False (default): the dq_dk_dv CTAs add their dQ contributions into
            one fp32 accumulator [batch, nhead_q, seqlen_q, hdim_q] with float atomics, so dQ
            may differ in the last bits from run to run. True: dq, dk and dv are bit-identical
            on every run with the same inputs on the same device and library version. Each CTA
            stores its key block kb's dQ contribution with plain stores into slab kb of an fp32
            workspace [nsplit, batch, nhead_q, seqlen_q, hdim_q], nsplit = ceil(seqlen_k /
            BLOCK_N) (BLOCK_N = 128 on the Hopper kernel, 16 * NWARPS = 128 or 64 on the
            mma.sync kernels), and ``convert_dq`` sums, in kb order, only the slabs whose key
            block sees that row (nothing is zero-filled). Memory: nsplit times the atomic
            accumulator, i.e. ``4 * nsplit * batch * nhead_q * seqlen_q * hdim_q`` bytes, e.g.
            4.3 GB for batch 4, 16 heads, seqlen 4096, hdim 128 (32 slabs) instead of 134 MB;
            see :func:`cupy_fmha.launch.dq_workspace`. dK/dV are deterministic in both modes
            (plain stores; GQA sums per-head fp32 copies in a fixed order).

    Returns:
        :class:`AttentionGrads` (dq like q, dk like k with nhead_k heads, dv like v), fresh
        contiguous arrays in ``layout`` and the inputs' dtype. Group mode: rows of a sequence
        with no keys get dq = 0; keys of a sequence with no queries get dk = dv = 0. With
        ``return_dbias=True``: :class:`AttentionGradsWithBias` (the same plus ``dbias``).

    Raises:
        TypeError: ``deterministic`` is not a bool; and see below.
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_backward_inputs`
            and :func:`cupy_fmha.validate.check_bias`; ``bias`` with ``alibi_slopes``;
            ``return_dbias`` not a bool or True without ``bias``), before anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    deterministic = bool(deterministic)
    if layout == "thd":
        return _backward_varlen(do, q, k, v, o, lse, softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, mask=mask, dtype=dtype, alibi_slopes=alibi_slopes,
                                bias=bias, return_dbias=return_dbias, dropout_p=dropout_p, seed=seed, offset=offset,
                                out=out, deterministic=deterministic, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    _reject_varlen_args(layout, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    p = _checked(check_backward_inputs, (do, q, k, v, o, lse), softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, mask=mask, layout=layout, dtype=dtype)
    want_dbias = check_return_dbias(return_dbias, bias)
    bias_dt = _check_bias_inputs(p, bias, alibi_slopes, dtype)
    drop = check_dropout(dropout_p, seed, offset)
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    cp = _cupy()
    store = np.uint16 if p.dtype == _BF16 else np.float16
    b, hq, hk, sq, sk = p.batch, p.nhead_q, p.nhead_k, p.seqlen_q, p.seqlen_k
    shapes = (_shape(layout, b, sq, hq, p.hdim_q), _shape(layout, b, sk, hk, p.hdim_q),
              _shape(layout, b, sk, hk, p.hdim_v))
    if out is not None:
        _check_out(cp, out, ("dq", "dk", "dv"), shapes, (store,) * 3)
    do, q, k, v, o = (_prep(cp, n, a) for n, a in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o)))
    lse = cp.ascontiguousarray(_to_device(cp, "lse", lse))
    bias_args = _bias_args(cp, bias, bias_dt)
    specs = _bwd_specs(_dtype_name(p), p.hdim_q, p.hdim_v, _cc(cp), alibi=alibi_slopes is not None,
                       bias=bias is not None, dropout=drop.enabled, deterministic=deterministic)

    ws = L.dq_workspace(specs.dq_dk_dv, b, hq, sq, sk, p.hdim_q, deterministic)
    # atomic mode adds into zeros (dot_do_o zero-fills it); deterministic slabs are stored
    # before convert_dq reads them
    dq_acc = cp.empty(ws.shape, dtype=cp.float32)
    delta = cp.empty((b, hq, sq), dtype=cp.float32)
    _launch(cp, specs.dot_do_o, L.dot_do_o_launch(specs.dot_do_o, b, hq, sq),
            (do, o, delta, *_strides(do, layout), *_strides(o, layout), np.int32(sq), np.int32(p.hdim_v),
             _NULL, _NULL if deterministic else dq_acc, np.int32(p.hdim_q)))

    # dS for dBias; zeroed: pairs in key/query blocks the mask skips are never written
    ds_acc = cp.zeros((b, hq, sq, sk), dtype=cp.float32) if want_dbias else None
    if out is None:
        dq, dk, dv = (cp.empty(s, dtype=store) for s in shapes)
    else:
        dq, dk, dv = out
    if p.group == 1:
        dk_buf, dv_buf = dk, dv
        dk_st, dv_st = _strides(dk, layout), _strides(dv, layout)
    else:  # per-query-head fp32 dK/dV, summed over each group by the convert kernel
        dk_buf = cp.empty((b, hq, sk, p.hdim_q), dtype=cp.float32)
        dv_buf = cp.empty((b, hq, sk, p.hdim_v), dtype=cp.float32)
        dk_st, dv_st = _strides(dk_buf, "bhsd"), _strides(dv_buf, "bhsd")
    win_y, win_x = L.kernel_window(p.window)
    args = (q, k, v, do, lse, delta, dq_acc, dk_buf, dv_buf,
            *_strides(q, layout), *_strides(k, layout), *_strides(v, layout), *_strides(do, layout),
            *dk_st, *dv_st, np.int32(sq), np.int32(sk), np.int32(p.hdim_q), np.int32(p.hdim_v),
            np.int32(p.group), np.float32(p.softmax_scale * LOG2E), np.float32(p.softmax_scale),
            np.int32(win_y), np.int32(win_x), np.int32(0 if p.group == 1 else 1),
            *_alibi_args(cp, alibi_slopes, p), *_BATCH_MODE, np.int64(ws.split_stride), *bias_args,
            ds_acc if want_dbias else _NULL, *_dropout_args(drop))
    _launch(cp, specs.dq_dk_dv, L.dq_dk_dv_launch(specs.dq_dk_dv, b, hq, sk), args)

    conv = specs.convert_dq
    conv_dq = specs.convert_dq_split if deterministic else conv
    block_n, block_m = L.dq_dk_dv_blocks(specs.dq_dk_dv)
    _launch(cp, conv_dq, L.convert_launch(conv_dq, b, hq, sq),
            (dq_acc, dq, *_strides(dq, layout), np.int32(sq), np.int32(p.hdim_q), np.int32(1),
             np.float32(p.softmax_scale),
             np.int32(ws.nsplit), np.int64(ws.split_stride), np.int32(sk), np.int32(win_y), np.int32(win_x),
             np.int32(block_n), np.int32(block_m), *_BATCH_MODE))
    if p.group > 1:
        for acc, out, d in ((dk_buf, dk, p.hdim_q), (dv_buf, dv, p.hdim_v)):
            _launch(cp, conv, L.convert_launch(conv, b, hk, sk),
                    (acc, out, *_strides(out, layout), np.int32(sk), np.int32(d), np.int32(p.group),
                     np.float32(1.0), *_NO_SPLIT, *_BATCH_MODE))
    if want_dbias:
        return AttentionGradsWithBias(dq, dk, dv, _reduce_dbias(cp, ds_acc, bias, bias_dt))
    return AttentionGrads(dq, dk, dv)


# --------------------------------------------------------------------------- group mode (varlen)


def _forward_varlen(q, k, v, *, softmax_scale, causal, window_size, mask, dtype, alibi_slopes, bias, dropout_p,
                    seed, offset, return_dropout_mask, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k):
    """attention_forward for layout "thd": one launch over (max_seqlen_q blocks, heads, batch).

    The bias (broadcastable to [batch, nhead_q, max_seqlen_q, max_seqlen_k]) goes to the kernel
    as it is, with its [batch, head, row, key] element strides: each CTA reads bias[b, h, i, j]
    with b its sequence and i, j positions local to that sequence (``make_bias`` in
    ``kernels/attention.cuh``), i.e. sequence b uses the top-left corner of its plane."""
    p = check_varlen_inputs(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                            causal=causal, window_size=window_size, mask=mask, layout="thd", dtype=dtype)
    bias_dt = _check_bias_inputs(p, bias, alibi_slopes, dtype)
    drop = check_dropout(dropout_p, seed, offset)
    want_keep = check_flag("return_dropout_mask", return_dropout_mask)
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    cp = _cupy()
    store = np.uint16 if p.dtype == _BF16 else np.float16
    o_shape = (p.total_q, p.nhead_q, p.hdim_v)
    lse_shape = (p.batch, p.nhead_q, p.max_seqlen_q)
    if out is not None:
        _check_out(cp, out, ("o", "lse"), (o_shape, lse_shape), (store, np.float32))
    q, k, v = (_prep(cp, n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    bias_args = _bias_args(cp, bias, bias_dt)
    cu_q, cu_k = _cu_device(cp, "cu_seqlens_q", cu_seqlens_q), _cu_device(cp, "cu_seqlens_k", cu_seqlens_k)
    if out is None:
        o, lse = cp.empty(o_shape, dtype=store), cp.empty(lse_shape, dtype=cp.float32)
    else:
        o, lse = out
    spec = _fwd_spec(_dtype_name(p), p.hdim_q, p.hdim_v, _cc(cp),
                    alibi=alibi_slopes is not None, bias=bias is not None, dropout=drop.enabled)
    win_y, win_x, bottom_right = L.kernel_window_spec(p.mask)
    args = (q, k, v, o, lse, *_strides_thd(q), *_strides_thd(k), *_strides_thd(v), *_strides_thd(o),
            np.int32(p.max_seqlen_q), np.int32(p.max_seqlen_k), np.int32(p.hdim_q), np.int32(p.hdim_v),
            np.int32(p.group), np.float32(p.softmax_scale * LOG2E), np.int32(win_y), np.int32(win_x),
            *_alibi_args(cp, alibi_slopes, p), cu_q, cu_k, np.int32(bottom_right), *bias_args,
            *_dropout_args(drop))
    _launch(cp, spec, L.fwd_launch(spec, p.batch, p.nhead_q, p.max_seqlen_q), args)
    if want_keep:  # sequence b's keep mask in the top-left corner of [max_seqlen_q, max_seqlen_k]
        return o, lse, _dropout_mask(cp, drop, p.batch, p.nhead_q, p.max_seqlen_q, p.max_seqlen_k)
    return o, lse


def _backward_varlen(do, q, k, v, o, lse, *, softmax_scale, causal, window_size, mask, dtype, alibi_slopes,
                     bias, return_dbias, dropout_p, seed, offset, out, deterministic, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k) -> AttentionGrads | AttentionGradsWithBias:
    """attention_backward for layout "thd".

    Workspaces: D and dQ are [batch, nhead_q, max_seqlen_q(, hdim_q)] (rows past a sequence's end
    unused); the GQA dK/dV workspaces are fp32 [nhead_q, total_k, hdim] (packed like the keys, so
    the convert kernel sums each group as one batch of total_k rows). With ``return_dbias`` the
    dS workspace is a zeroed fp32 [batch, nhead_q, max_seqlen_q, max_seqlen_k]: the kernel stores
    sequence b's dS[i, j] (local i < seqlen_q_b, j < seqlen_k_b) at [b, h, i, j], the rest stays
    0, and :func:`_reduce_dbias` sums it to the bias's shape."""
    p = check_varlen_inputs(q, k, v, [("o", o), ("do", do)], cu_seqlens_q=cu_seqlens_q,
                            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                            softmax_scale=softmax_scale, causal=causal, window_size=window_size, mask=mask,
                            layout="thd", dtype=dtype, lse=lse)
    drop = check_dropout(dropout_p, seed, offset)
    want_dbias = check_return_dbias(return_dbias, bias)
    bias_dt = _check_bias_inputs(p, bias, alibi_slopes, dtype)
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    cp = _cupy()
    store = np.uint16 if p.dtype == _BF16 else np.float16
    b, hq, hk, msq, msk = p.batch, p.nhead_q, p.nhead_k, p.max_seqlen_q, p.max_seqlen_k
    tq, tk, d, dv_ = p.total_q, p.total_k, p.hdim_q, p.hdim_v
    shapes = ((tq, hq, d), (tk, hk, d), (tk, hk, dv_))
    if out is not None:
        _check_out(cp, out, ("dq", "dk", "dv"), shapes, (store,) * 3)
    do, q, k, v, o = (_prep(cp, n, a) for n, a in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o)))
    lse = cp.ascontiguousarray(_to_device(cp, "lse", lse))
    bias_args = _bias_args(cp, bias, bias_dt)
    cu_q, cu_k = _cu_device(cp, "cu_seqlens_q", cu_seqlens_q), _cu_device(cp, "cu_seqlens_k", cu_seqlens_k)
    specs = _bwd_specs(_dtype_name(p), d, dv_, _cc(cp), alibi=alibi_slopes is not None,
                       bias=bias is not None, dropout=drop.enabled, deterministic=deterministic)

    ws = L.dq_workspace(specs.dq_dk_dv, b, hq, msq, msk, d, deterministic)
    # atomic mode: dot_do_o zero-fills each sequence's rows (the only ones dq_dk_dv and
    # convert_dq touch)
    dq_acc = cp.empty(ws.shape, dtype=cp.float32)
    delta = cp.empty((b, hq, msq), dtype=cp.float32)
    _launch(cp, specs.dot_do_o, L.dot_do_o_launch(specs.dot_do_o, b, hq, msq),
            (do, o, delta, *_strides_thd(do), *_strides_thd(o), np.int32(msq), np.int32(dv_), cu_q,
             _NULL if deterministic else dq_acc, np.int32(d)))

    # dS for dBias, pitched by the max lengths; zeroed: pairs outside every sequence's corner and
    # in blocks the mask skips are never written
    ds_acc = cp.zeros((b, hq, msq, msk), dtype=cp.float32) if want_dbias else None
    if out is None:
        dq, dk, dv = (cp.empty(s, dtype=store) for s in shapes)
    else:
        dq, dk, dv = out
    if p.group == 1:
        dk_buf, dv_buf = dk, dv
        dk_st, dv_st = _strides_thd(dk), _strides_thd(dv)
    else:  # per-query-head fp32 dK/dV [nhead_q, total_k, hdim], summed over each group below
        dk_buf = cp.empty((hq, tk, d), dtype=cp.float32)
        dv_buf = cp.empty((hq, tk, dv_), dtype=cp.float32)
        dk_st = (np.int64(0), np.int64(tk * d), np.int64(d))
        dv_st = (np.int64(0), np.int64(tk * dv_), np.int64(dv_))
    win_y, win_x, bottom_right = L.kernel_window_spec(p.mask)
    args = (q, k, v, do, lse, delta, dq_acc, dk_buf, dv_buf,
            *_strides_thd(q), *_strides_thd(k), *_strides_thd(v), *_strides_thd(do), *dk_st, *dv_st,
            np.int32(msq), np.int32(msk), np.int32(d), np.int32(dv_), np.int32(p.group),
            np.float32(p.softmax_scale * LOG2E), np.float32(p.softmax_scale), np.int32(win_y), np.int32(win_x),
            np.int32(0 if p.group == 1 else 1), *_alibi_args(cp, alibi_slopes, p), cu_q, cu_k,
            np.int32(bottom_right), np.int64(ws.split_stride), *bias_args,
            ds_acc if want_dbias and ds_acc.size else _NULL, *_dropout_args(drop))
    _launch(cp, specs.dq_dk_dv, L.dq_dk_dv_launch(specs.dq_dk_dv, b, hq, msk), args)

    conv = specs.convert_dq
    conv_dq = specs.convert_dq_split if deterministic else conv
    block_n, block_m = L.dq_dk_dv_blocks(specs.dq_dk_dv)
    _launch(cp, conv_dq, L.convert_launch(conv_dq, b, hq, msq),
            (dq_acc, dq, *_strides_thd(dq), np.int32(msq), np.int32(d), np.int32(1),
             np.float32(p.softmax_scale), np.int32(ws.nsplit), np.int64(ws.split_stride), np.int32(msk),
             np.int32(win_y), np.int32(win_x), np.int32(block_n), np.int32(block_m), cu_q, cu_k,
             np.int32(bottom_right)))
    if p.group > 1:
        for acc, res, dim in ((dk_buf, dk, d), (dv_buf, dv, dv_)):
            _launch(cp, conv, L.convert_launch(conv, 1, hk, tk),
                    (acc, res, *_strides_thd(res), np.int32(tk), np.int32(dim), np.int32(p.group),
                     np.float32(1.0), *_NO_SPLIT, *_BATCH_MODE))
    if want_dbias:
        return AttentionGradsWithBias(dq, dk, dv, _reduce_dbias(cp, ds_acc, bias, bias_dt))
    return AttentionGrads(dq, dk, dv)
