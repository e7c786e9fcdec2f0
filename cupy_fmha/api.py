"""Public API: attention forward and backward on CuPy arrays.

Forward: FlashAttention-2 (Dao, 2023). Backward: the three-kernel pipeline of AMD Composable
Kernel's FMHA backward (ck_tile ``fmha_bwd_kernel.hpp``): ``dot_do_o`` (D = rowsum(dO * O)),
``dq_dk_dv`` (K/V resident per CTA, Q/dO/LSE/D streamed; dQ added into an fp32 workspace) and
``convert_dq`` (cast dQ; also sums dK/dV over each GQA group).

Arrays: CuPy arrays (NumPy arrays are copied to the current device; for other frameworks use
``cupy.from_dlpack``). fp16 is ``float16``. CuPy has no bfloat16, so bf16 travels as ``uint16``
arrays of raw bits, passed with ``dtype="bfloat16"``; NumPy ``ml_dtypes.bfloat16`` arrays are
recognized and copied. bf16 outputs are ``uint16`` CuPy arrays of raw bits.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import launch as L
from .compile import get_function
from .spec import bwd_specs, fwd_spec
from .validate import (
    _BF16,
    check_alibi_slopes,
    check_backward_inputs,
    check_bias,
    check_forward_inputs,
    check_return_dbias,
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


def _checked(check, arrays, **kw):
    """``check(*arrays, **kw)``, memoized on everything it reads (shapes, dtypes, strides, devices
    and the options): a training loop calling with the same shapes pays for validation once.
    Failures are never cached, so bad input always raises."""
    try:
        key = (check.__name__,
               tuple((type(a), tuple(a.shape), a.dtype, tuple(a.strides),
                      getattr(getattr(a, "device", None), "id", None)) for a in arrays),
               tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kw.items())))
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


# --------------------------------------------------------------------------- elementwise bias

#: bias_kind kernel argument per logical bias dtype (0 = no bias)
_BIAS_KIND = {np.dtype(np.float16): 1, _BF16: 2, np.dtype(np.float32): 3}
_NO_BIAS = (np.uint64(0), np.int32(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0))


def _check_bias_inputs(p, bias, alibi_slopes, dtype):
    """The bias's logical dtype (``None`` without a bias); raises before anything runs when the
    bias is malformed or given together with ALiBi slopes."""
    if bias is None:
        return None
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q, bias=bias)  # raises: both given
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
    return (dev, np.int32(_BIAS_KIND[bias_dt]), *(np.int64(x) for x in strides))


def _f32_to_bf16_bits(cp, x):
    """float32 CuPy array -> bf16 bits (uint16), rounded to nearest even; NaN stays NaN."""
    u = x.view(cp.uint32)
    bits = ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
    return cp.where(cp.isnan(x), cp.uint16(0x7FC0), bits)


def _reduce_dbias(cp, ds, bias, bias_dt):
    """dBias from the fp32 dS workspace [batch, nhead_q, seqlen_q, seqlen_k]: summed over the
    dimensions the bias broadcasts along (one CuPy reduction, float64 accumulation; no atomics,
    so the result is the same on every run), cast to the bias's dtype, in the bias's shape."""
    shape = tuple(int(n) for n in bias.shape)
    shape4 = (1,) * (4 - len(shape)) + shape
    axes = tuple(a for a in range(4) if shape4[a] == 1 and ds.shape[a] != 1)
    red = ds.sum(axis=axes, dtype=cp.float64, keepdims=True) if axes else ds
    red = red.astype(cp.float32).reshape(shape)
    if bias_dt == _BF16:
        return _f32_to_bf16_bits(cp, red)
    return cp.ascontiguousarray(red.astype(bias_dt))


def _launch(cp, spec, launch, args):
    fn = get_function(spec)
    if launch.smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < launch.smem:
        fn.max_dynamic_shared_size_bytes = launch.smem
    fn(launch.grid, launch.block, args, shared_mem=launch.smem)


def attention_forward(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                      layout="bshd", dtype=None, alibi_slopes=None, bias=None, out=None):
    """Attention forward: ``O = softmax(softmax_scale * Q K^T + mask) V`` and its log-sum-exp.

    Args:
        q: [batch, seqlen_q, nhead_q, hdim_q] (``layout="bshd"``) or [batch, nhead_q, seqlen_q,
            hdim_q] (``"bhsd"``); fp16, or bf16 (uint16 bits with ``dtype="bfloat16"``). Any
            strides with a unit last stride.
        k: [batch, seqlen_k, nhead_k, hdim_q] (or bhsd); ``nhead_q`` a multiple of ``nhead_k``
            (GQA/MQA).
        v: [batch, seqlen_k, nhead_k, hdim_v] (or bhsd).
        softmax_scale: multiplies Q K^T; default ``1 / sqrt(hdim_q)``.
        causal: FlashAttention's causal mask (bottom-right aligned).
        window_size: (left, right) sliding window, bottom-right aligned, -1 = unlimited.
        mask: CK's mask string instead (``0``, ``t``, ``b``, ``t:l,r``, ``b:l,r``, ``xt:w``,
            ``xb:w``, ``g:y,x``); see :mod:`cupy_fmha.mask`.
        layout: ``"bshd"`` (default) or ``"bhsd"``.
        dtype: ``None``, ``"float16"`` or ``"bfloat16"``.
        alibi_slopes: optional float32 [nhead_q] or [batch, nhead_q]: ALiBi as FlashAttention
            defines it, a bias ``-slope * |i + seqlen_k - seqlen_q - j|`` added to the scaled
            scores of query row ``i`` and key ``j``.
        bias: optional elementwise bias added to the scaled scores (after ``softmax_scale``,
            before the mask), any shape broadcastable (NumPy rules) to [batch, nhead_q,
            seqlen_q, seqlen_k], e.g. [1, 1, sq, sk], [1, nhead_q, sq, sk], [batch, nhead_q, sq,
            sk], [sq, sk] or [sq, 1]; any strides (broadcast dimensions are read with stride 0,
            never copied). dtype float16, bfloat16 or float32, independent of q's dtype: bf16 as
            a NumPy ``ml_dtypes.bfloat16`` array, or as uint16 bits on the GPU when
            ``dtype="bfloat16"``. Not together with ``alibi_slopes``. A bias of ``-inf`` masks a
            pair out. Selects the kernel instance compiled with the bias (``-D BIAS=1``).
        out: optional (o, lse) buffers to write into instead of fresh arrays (o: any strides with
            a unit last stride and 16-byte aligned rows; lse: C-contiguous float32).

    Returns:
        (o, lse): o [batch, seqlen_q, nhead_q, hdim_v] in ``layout`` and the inputs' dtype;
        lse float32 [batch, nhead_q, seqlen_q], natural log. Rows that see no key: o = 0,
        lse = -inf.

    Raises:
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_forward_inputs`
            and :func:`cupy_fmha.validate.check_bias`; ``bias`` with ``alibi_slopes``), before
            anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    p = _checked(check_forward_inputs, (q, k, v), softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, mask=mask, layout=layout, dtype=dtype)
    bias_dt = _check_bias_inputs(p, bias, alibi_slopes, dtype)
    cp = _cupy()
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
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
    spec = fwd_spec(_dtype_name(p), p.hdim_q, p.hdim_v, int(cp.cuda.Device().compute_capability),
                    bias=bias is not None)
    win_y, win_x = L.kernel_window(p.window)
    args = (q, k, v, o, lse, *_strides(q, layout), *_strides(k, layout), *_strides(v, layout),
            *_strides(o, layout), np.int32(p.seqlen_q), np.int32(p.seqlen_k), np.int32(p.hdim_q),
            np.int32(p.hdim_v), np.int32(p.group), np.float32(p.softmax_scale * LOG2E),
            np.int32(win_y), np.int32(win_x), *_alibi_args(cp, alibi_slopes, p), *bias_args)
    _launch(cp, spec, L.fwd_launch(spec, p.batch, p.nhead_q, p.seqlen_q), args)
    return o, lse


def attention_backward(do, q, k, v, o, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       mask=None, layout="bshd", dtype=None, alibi_slopes=None, bias=None, return_dbias=False,
                       out=None) -> AttentionGrads | AttentionGradsWithBias:
    """Attention backward: dQ, dK, dV (and optionally dBias) from dO and the forward's O and LSE.

    Three launches (CK's FMHA backward): ``dot_do_o``, ``dq_dk_dv``, ``convert_dq`` (+ a GQA
    group sum of dK/dV through the same convert kernel when nhead_q != nhead_k). With
    ``return_dbias``, ``dq_dk_dv`` also stores dS = P * (dP - D) in float32 (before any 16-bit
    rounding) into a zeroed workspace of [batch, nhead_q, seqlen_q, seqlen_k] float32 (4 bytes
    per score: plan memory for it), which CuPy then sums over the bias's broadcast dimensions.

    Args:
        do: gradient of o, [batch, seqlen_q, nhead_q, hdim_v] (or bhsd); its strides may differ
            from o's.
        q, k, v: as in :func:`attention_forward`.
        o: the forward output; lse: float32 [batch, nhead_q, seqlen_q] from the forward.
        softmax_scale, causal, window_size, mask, layout, dtype, alibi_slopes, bias: as in the
            forward (must match).
        return_dbias: also return dbias, the gradient of ``bias`` (needs ``bias``): dS summed
            over the dimensions the bias broadcasts along, in the bias's shape and dtype.
        out: optional (dq, dk, dv) buffers to write into (shapes of q, k, v; unit last stride,
            16-byte aligned rows); dbias is always a fresh array.

    Returns:
        :class:`AttentionGrads` (dq like q, dk like k with nhead_k heads, dv like v), fresh
        contiguous arrays in ``layout`` and the inputs' dtype; with ``return_dbias=True``,
        :class:`AttentionGradsWithBias` (the same plus ``dbias``).

    Raises:
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_backward_inputs`
            and :func:`cupy_fmha.validate.check_bias`; ``bias`` with ``alibi_slopes``;
            ``return_dbias`` not a bool or True without ``bias``), before anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    p = _checked(check_backward_inputs, (do, q, k, v, o, lse), softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, mask=mask, layout=layout, dtype=dtype)
    want_dbias = check_return_dbias(return_dbias, bias)
    bias_dt = _check_bias_inputs(p, bias, alibi_slopes, dtype)
    cp = _cupy()
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    store = np.uint16 if p.dtype == _BF16 else np.float16
    b, hq, hk, sq, sk = p.batch, p.nhead_q, p.nhead_k, p.seqlen_q, p.seqlen_k
    shapes = (_shape(layout, b, sq, hq, p.hdim_q), _shape(layout, b, sk, hk, p.hdim_q),
              _shape(layout, b, sk, hk, p.hdim_v))
    if out is not None:
        _check_out(cp, out, ("dq", "dk", "dv"), shapes, (store,) * 3)
    do, q, k, v, o = (_prep(cp, n, a) for n, a in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o)))
    lse = cp.ascontiguousarray(_to_device(cp, "lse", lse))
    bias_args = _bias_args(cp, bias, bias_dt)
    specs = bwd_specs(_dtype_name(p), p.hdim_q, p.hdim_v, int(cp.cuda.Device().compute_capability),
                      bias=bias is not None)

    delta = cp.empty((b, hq, sq), dtype=cp.float32)
    _launch(cp, specs.dot_do_o, L.dot_do_o_launch(specs.dot_do_o, b, hq, sq),
            (do, o, delta, *_strides(do, layout), *_strides(o, layout), np.int32(sq), np.int32(p.hdim_v)))

    dq_acc = cp.zeros((b, hq, sq, p.hdim_q), dtype=cp.float32)
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
            *_alibi_args(cp, alibi_slopes, p), *bias_args,
            ds_acc if want_dbias else np.uint64(0))
    _launch(cp, specs.dq_dk_dv, L.dq_dk_dv_launch(specs.dq_dk_dv, b, hq, sk), args)

    conv = specs.convert_dq
    _launch(cp, conv, L.convert_launch(conv, b, hq, sq),
            (dq_acc, dq, *_strides(dq, layout), np.int32(sq), np.int32(p.hdim_q), np.int32(1),
             np.float32(p.softmax_scale)))
    if p.group > 1:
        for acc, out, d in ((dk_buf, dk, p.hdim_q), (dv_buf, dv, p.hdim_v)):
            _launch(cp, conv, L.convert_launch(conv, b, hk, sk),
                    (acc, out, *_strides(out, layout), np.int32(sk), np.int32(d), np.int32(p.group),
                     np.float32(1.0)))
    if want_dbias:
        return AttentionGradsWithBias(dq, dk, dv, _reduce_dbias(cp, ds_acc, bias, bias_dt))
    return AttentionGrads(dq, dk, dv)
