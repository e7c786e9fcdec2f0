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
from .spec import bwd_specs, dropout_mask_spec, fwd_spec
from .validate import (_BF16, check_alibi_slopes, check_backward_inputs, check_dropout, check_flag,
                       check_forward_inputs)

__all__ = ["attention_forward", "attention_backward", "AttentionGrads"]

LOG2E = 1.4426950408889634


class AttentionGrads(NamedTuple):
    """Gradients of the attention inputs, in the inputs' layout and dtype (bf16 as uint16 bits).

    dq: like q; dk: like k (nhead_k heads: summed over each GQA group); dv: like v.
    """

    dq: object
    dk: object
    dv: object


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


def _launch(cp, spec, launch, args):
    fn = get_function(spec)
    if launch.smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < launch.smem:
        fn.max_dynamic_shared_size_bytes = launch.smem
    fn(launch.grid, launch.block, args, shared_mem=launch.smem)


def attention_forward(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), mask=None,
                      layout="bshd", dtype=None, alibi_slopes=None, dropout_p=0.0, seed=0, offset=0,
                      return_dropout_mask=False, out=None):
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
        dropout_p: dropout probability in [0, 1) on the attention weights: ``O = (P * Z) V``
            with ``Z = keep / (1 - dropout_p)``; the LSE stays that of the undropped softmax.
            0 (default) runs the kernels built without dropout.
        seed, offset: integers in [0, 2**64): the Philox key and counter offset
            (:mod:`cupy_fmha.philox` defines the keep mask bit for bit; element (b, h, i, j)
            uses counter offset ``offset + b * nhead_q + h``). The backward must get the same
            ``dropout_p``, ``seed`` and ``offset``.
        return_dropout_mask: also return the keep mask (computed by a separate small kernel
            with the same Philox function; all True when ``dropout_p`` is 0).
        out: optional (o, lse) buffers to write into instead of fresh arrays (o: any strides with
            a unit last stride and 16-byte aligned rows; lse: C-contiguous float32).

    Returns:
        (o, lse), or (o, lse, keep) with ``return_dropout_mask``: o [batch, seqlen_q, nhead_q,
        hdim_v] in ``layout`` and the inputs' dtype; lse float32 [batch, nhead_q, seqlen_q],
        natural log; keep a CuPy bool array [batch, nhead_q, seqlen_q, seqlen_k] (as
        :func:`cupy_fmha.reference.attention_forward` returns it). Rows that see no key: o = 0,
        lse = -inf.

    Raises:
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_forward_inputs`
            and :func:`cupy_fmha.validate.check_dropout`), before anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    p = _checked(check_forward_inputs, (q, k, v), softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, mask=mask, layout=layout, dtype=dtype)
    drop = check_dropout(dropout_p, seed, offset)
    want_keep = check_flag("return_dropout_mask", return_dropout_mask)
    cp = _cupy()
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, p.batch, p.nhead_q)
    store = np.uint16 if p.dtype == _BF16 else np.float16  # element storage on the device
    o_shape = _shape(layout, p.batch, p.seqlen_q, p.nhead_q, p.hdim_v)
    lse_shape = (p.batch, p.nhead_q, p.seqlen_q)
    if out is not None:
        _check_out(cp, out, ("o", "lse"), (o_shape, lse_shape), (store, np.float32))
    q, k, v = (_prep(cp, n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    if out is None:
        o, lse = cp.empty(o_shape, dtype=store), cp.empty(lse_shape, dtype=cp.float32)
    else:
        o, lse = out
    spec = fwd_spec(_dtype_name(p), p.hdim_q, p.hdim_v, int(cp.cuda.Device().compute_capability),
                    dropout=drop.enabled)
    win_y, win_x = L.kernel_window(p.window)
    args = (q, k, v, o, lse, *_strides(q, layout), *_strides(k, layout), *_strides(v, layout),
            *_strides(o, layout), np.int32(p.seqlen_q), np.int32(p.seqlen_k), np.int32(p.hdim_q),
            np.int32(p.hdim_v), np.int32(p.group), np.float32(p.softmax_scale * LOG2E),
            np.int32(win_y), np.int32(win_x), *_alibi_args(cp, alibi_slopes, p),
            *_dropout_args(drop))
    _launch(cp, spec, L.fwd_launch(spec, p.batch, p.nhead_q, p.seqlen_q), args)
    if want_keep:
        return o, lse, _dropout_mask(cp, drop, p.batch, p.nhead_q, p.seqlen_q, p.seqlen_k)
    return o, lse


def attention_backward(do, q, k, v, o, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       mask=None, layout="bshd", dtype=None, alibi_slopes=None, dropout_p=0.0, seed=0,
                       offset=0, out=None) -> AttentionGrads:
    """Attention backward: dQ, dK, dV from dO and the forward's O and LSE.

    Three launches (CK's FMHA backward): ``dot_do_o``, ``dq_dk_dv``, ``convert_dq`` (+ a GQA
    group sum of dK/dV through the same convert kernel when nhead_q != nhead_k).

    Args:
        do: gradient of o, [batch, seqlen_q, nhead_q, hdim_v] (or bhsd); its strides may differ
            from o's.
        q, k, v: as in :func:`attention_forward`.
        o: the forward output; lse: float32 [batch, nhead_q, seqlen_q] from the forward.
        softmax_scale, causal, window_size, mask, layout, dtype, alibi_slopes, dropout_p, seed,
            offset: as in the forward (must match: the backward regenerates the forward's keep
            mask from them; dV = (P Z)^T dO, dS = P (dP Z - D), D = rowsum(dO * O)).
        out: optional (dq, dk, dv) buffers to write into (shapes of q, k, v; unit last stride,
            16-byte aligned rows).

    Returns:
        :class:`AttentionGrads` (dq like q, dk like k with nhead_k heads, dv like v), fresh
        contiguous arrays in ``layout`` and the inputs' dtype.

    Raises:
        TypeError, ValueError: bad input (see :func:`cupy_fmha.validate.check_backward_inputs`),
            before anything is launched.
        RuntimeError: CuPy or a GPU is missing.
    """
    p = _checked(check_backward_inputs, (do, q, k, v, o, lse), softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, mask=mask, layout=layout, dtype=dtype)
    drop = check_dropout(dropout_p, seed, offset)
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
    specs = bwd_specs(_dtype_name(p), p.hdim_q, p.hdim_v, int(cp.cuda.Device().compute_capability),
                      dropout=drop.enabled)

    delta = cp.empty((b, hq, sq), dtype=cp.float32)
    _launch(cp, specs.dot_do_o, L.dot_do_o_launch(specs.dot_do_o, b, hq, sq),
            (do, o, delta, *_strides(do, layout), *_strides(o, layout), np.int32(sq), np.int32(p.hdim_v)))

    dq_acc = cp.zeros((b, hq, sq, p.hdim_q), dtype=cp.float32)
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
            *_alibi_args(cp, alibi_slopes, p), *_dropout_args(drop))
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
    return AttentionGrads(dq, dk, dv)
