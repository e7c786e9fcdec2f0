"""Kernel parameter structs, mirrored from ``kernels/params.cuh`` as NumPy structured dtypes.

Each kernel pass takes one struct by value. The Python side fills a one-element structured
array of the matching dtype and hands it to the kernel as its only argument (CuPy passes a
one-element NumPy array by value, copying its bytes into the launch). ``kernels/params.cuh`` is
the declaration; this module is its one mirror, and ``tests/test_params_layout.py`` compiles
``static_assert(offsetof(...) == ...)`` lines generated from these dtypes against the header
(:func:`layout_asserts`), so a field moved on one side only fails CI.

Pure NumPy: no CuPy, so it works (and is tested) without a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import struct as _structmod
import threading

import numpy as np

__all__ = ["TENSOR", "SEQ", "MASK", "ALIBI", "BIAS", "DROPOUT", "FWD", "DOT_DO_O", "BWD", "CONVERT",
           "DROPOUT_MASK", "STRUCTS", "KERNEL_STRUCTS", "FLAT_ABI", "layout_asserts", "pack", "kernel_args", "pointer_args", "flat_names", "flat_args", "unflatten"]


_P = np.uint64   # a device pointer
_I64 = np.int64  # index_t
_I32 = np.int32
_U32 = np.uint32
_F32 = np.float32


def _struct(*fields) -> np.dtype:
    return np.dtype(list(fields), align=True)


TENSOR = _struct(("ptr", _P), ("sb", _I64), ("sh", _I64), ("ss", _I64))
SEQ = _struct(("cu_seqlens_q", _P), ("cu_seqlens_k", _P), ("seqlen_q", _I32), ("seqlen_k", _I32))
MASK = _struct(("win_y", _I32), ("win_x", _I32), ("bottom_right", _I32), ("pad_", _I32))
ALIBI = _struct(("slopes", _P), ("sb", _I64))
BIAS = _struct(("ptr", _P), ("sb", _I64), ("sh", _I64), ("sq", _I64), ("sk", _I64), ("kind", _I32),
               ("ds_kind", _I32))
DROPOUT = _struct(("seed", np.uint64), ("offset", np.uint64), ("keep_threshold", _U32), ("rp_keep", _F32))

FWD = _struct(("q", TENSOR), ("k", TENSOR), ("v", TENSOR), ("o", TENSOR), ("lse", _P), ("seq", SEQ),
              ("hdim_q", _I32), ("hdim_v", _I32), ("group", _I32), ("scale_log2", _F32), ("mask", MASK),
              ("alibi", ALIBI), ("bias", BIAS), ("dropout", DROPOUT))
DOT_DO_O = _struct(("dout", TENSOR), ("o", TENSOR), ("delta", _P), ("dq_acc", _P), ("seq", SEQ),
                   ("hdim_q", _I32), ("hdim_v", _I32), ("dq_pitch", _I32), ("dq_cols", _I32))
BWD = _struct(("q", TENSOR), ("k", TENSOR), ("v", TENSOR), ("dout", TENSOR), ("dk", TENSOR), ("dv", TENSOR),
              ("lse", _P), ("delta", _P), ("dq_acc", _P), ("dbias_acc", _P), ("dq_sem", _P),
              ("dq_split_stride", _I64),
              ("seq", SEQ), ("hdim_q", _I32), ("hdim_v", _I32), ("group", _I32), ("dkdv_fp32", _I32),
              ("scale_log2", _F32), ("scale", _F32), ("mask", MASK), ("alibi", ALIBI), ("bias", BIAS),
              ("dropout", DROPOUT))
CONVERT = _struct(("acc", _P), ("out", TENSOR), ("split_stride", _I64), ("seq", SEQ), ("hdim", _I32),
                  ("nsum", _I32), ("nsplit", _I32), ("block_n", _I32), ("block_m", _I32), ("acc_pitch", _I32),
                  ("acc_cols", _I32), ("acc_tiled", _I32), ("scale", _F32), ("pad_", _I32),
                  ("mask", MASK))
DROPOUT_MASK = _struct(("keep", _P), ("seqlen_q", _I32), ("seqlen_k", _I32), ("dropout", DROPOUT))

#: C++ struct name -> dtype, every struct of kernels/params.cuh
STRUCTS = {"TensorArg": TENSOR, "SeqArg": SEQ, "MaskArg": MASK, "AlibiArg": ALIBI, "BiasArg": BIAS,
           "DropoutArg": DROPOUT, "FwdParams": FWD, "DotDoOParams": DOT_DO_O, "BwdParams": BWD,
           "ConvertParams": CONVERT, "DropoutMaskParams": DROPOUT_MASK}


def layout_asserts(structs: dict[str, np.dtype] | None = None) -> str:
    """C++ ``static_assert`` lines checking every field offset and every struct size of
    ``structs`` (default :data:`STRUCTS`) against ``kernels/params.cuh``."""
    lines = []
    for cname, dt in (structs or STRUCTS).items():
        lines.append(f"static_assert(sizeof(fmha::{cname}) == {dt.itemsize}, \"{cname}: size\");")
        for field, (fdt, off) in dt.fields.items():
            lines.append(f"static_assert(__builtin_offsetof(fmha::{cname}, {field}) == {off}, "
                         f"\"{cname}.{field}: offset\");")
            lines.append(f"static_assert(sizeof(((fmha::{cname}*)0)->{field}) == {fdt.itemsize}, "
                         f"\"{cname}.{field}: size\");")
    return "\n".join(lines) + "\n"


def pack(dtype: np.dtype, values: tuple) -> np.ndarray:
    """A one-element array of ``dtype`` from nested tuples in field order: the flattened values
    packed by :mod:`struct` (whose format is the struct's scalar fields in order, padding fields
    included) and viewed as ``dtype`` (writable: the bytes are copied into a bytearray)."""
    fmt, _ = _flat_layout(dtype)
    return np.frombuffer(bytearray(fmt.pack(*_flatten(values))), dtype=dtype)


#: the params struct of each kernel source (its entry function's one parameter, or FLAT_ABI)
KERNEL_STRUCTS = {"fmha_fwd": FWD, "fmha_fwd_sm90": FWD, "fmha_fwd_sm90_ws": FWD, "fmha_bwd_dot_do_o": DOT_DO_O, "fmha_bwd_dq_dk_dv": BWD,
                  "fmha_bwd_dq_dk_dv_sm90": BWD, "fmha_bwd_dq_dk_dv_sm90_ws": BWD, "fmha_bwd_dq_dk_dv_sm90_ws_wide": BWD,
                  "fmha_bwd_convert_dq": CONVERT, "fmha_dropout_mask": DROPOUT_MASK}

#: kernels that take their struct flattened into separate arguments (``FMHA_BWD_PARAMS_ARGS`` in
#: kernels/params.cuh: by value, the struct made fmha_bwd_dq_dk_dv_sm90 10% slower on the H200)
FLAT_ABI = frozenset({"fmha_bwd_dq_dk_dv", "fmha_bwd_dq_dk_dv_sm90", "fmha_bwd_dq_dk_dv_sm90_ws", "fmha_bwd_dq_dk_dv_sm90_ws_wide"})

_CODES = {np.dtype(np.uint64): "Q", np.dtype(np.int64): "q", np.dtype(np.int32): "i", np.dtype(np.uint32): "I",
          np.dtype(np.float32): "f"}


def _leaves(dt: np.dtype, prefix: str = ""):
    """(name, dtype) of every scalar field of ``dt`` in memory order, groups joined by '_'."""
    for name in dt.names:
        sub = dt.fields[name][0]
        if sub.names:
            yield from _leaves(sub, f"{prefix}{name}_")
        else:
            yield prefix + name, sub


def flat_names(dt: np.dtype) -> list[str]:
    """The flattened argument names of a struct (as ``FMHA_BWD_PARAMS_ARGS`` declares them)."""
    return [n for n, _ in _leaves(dt)]


_FLAT: dict = {}


def _flat_layout(dt: np.dtype):
    got = _FLAT.get(dt)
    if got is None:
        leaves = list(_leaves(dt))
        fmt = _structmod.Struct("<" + "".join(_CODES[t] for _, t in leaves))
        assert fmt.size == dt.itemsize, "a struct with implicit padding cannot be flattened"
        got = _FLAT[dt] = (fmt, tuple(t.type for _, t in leaves))
    return got


def flat_args(params: np.ndarray) -> tuple:
    """A one-element params array as the tuple of typed NumPy scalars of its fields, in order (the
    kernel arguments of a FLAT_ABI kernel)."""
    fmt, types = _flat_layout(params.dtype)
    return tuple(t(v) for t, v in zip(types, fmt.unpack(params.tobytes())))


@functools.lru_cache(maxsize=None)
def _void(nbytes: int) -> np.dtype:
    return np.dtype((np.void, nbytes))


def _flatten(values: tuple) -> list:
    """The scalars of nested tuples in order. This runs for every launch: one pass for the groups
    of today's structs (one level deep; about half the time of the general walk), and the general
    walk only when a deeper group left a tuple behind."""
    out = []
    extend, append = out.extend, out.append
    for x in values:
        if x.__class__ is tuple:
            extend(x)
        else:
            append(x)
    for x in out:
        if x.__class__ is tuple:
            return _flatten_deep(values)
    return out


def _flatten_deep(values) -> list:
    out = []
    for x in values:
        if x.__class__ is tuple:
            out.extend(_flatten_deep(x))
        else:
            out.append(x)
    return out


def kernel_args(dtype: np.dtype, values: tuple, flat: bool) -> tuple:
    """The kernel arguments for a struct given as nested tuples in field order: the struct's bytes
    as a one-element array of an unstructured ``void`` dtype of the struct's size (:func:`pack`
    viewed so; CuPy copies the bytes into the by-value parameter), or with ``flat`` its fields as
    typed NumPy scalars (a FLAT_ABI kernel; the same values :func:`flat_args` would give, without
    building the array). Not the structured array itself: for that CuPy reads NumPy's
    ``__array_interface__``, whose field description NumPy rebuilds recursively on every call
    (about 40 us of host time per launch on the H200's host; bench/NOTES.md step 19)."""
    if not flat:
        return (pack(dtype, values).view(_void(dtype.itemsize)),)
    _, types = _flat_layout(dtype)
    return tuple([t(v) for t, v in zip(types, _flatten(values))])


_LOCAL = threading.local()


def pointer_args(dtype: np.dtype, values: tuple, flat: bool, cpointer) -> tuple:
    """:func:`kernel_args` as CuPy pointer objects (``cpointer``: ``cupy.cuda.function.CPointer``,
    which CuPy passes to the driver as it is): the values are packed into a staging buffer of the
    struct's bytes, one per thread and struct, and the arguments point into it: one pointer for
    a by-value struct, one per field for a FLAT_ABI kernel. The pointer objects are made once per
    buffer, so a launch converts no argument: CuPy builds a wrapper for every NumPy scalar or
    array it is given, about 34 us for the flattened backward's 54 fields on the H200 host
    (bench/NOTES.md step 23). The driver copies the parameters when the kernel is launched, so
    the buffer may be packed again as soon as the launch call has returned; one buffer per thread
    keeps concurrent launches from sharing one."""
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    hit = bufs.get((dtype, flat, cpointer))
    if hit is None:
        fmt, _ = _flat_layout(dtype)
        buf = (ctypes.c_char * max(dtype.itemsize, 1))()  # struct.pack_into is faster on it than on NumPy
        base = ctypes.addressof(buf)
        if flat:
            offsets, off = [], 0
            for code in fmt.format.lstrip("<"):
                offsets.append(off)
                off += _structmod.calcsize("<" + code)
            ptrs = tuple(cpointer(base + o) for o in offsets)
        else:
            ptrs = (cpointer(base),)
        hit = bufs[(dtype, flat, cpointer)] = (fmt, buf, ptrs)
    fmt, buf, ptrs = hit
    fmt.pack_into(buf, 0, *_flatten(values))
    return ptrs


def unflatten(dt: np.dtype, args) -> np.ndarray:
    """The inverse of :func:`flat_args` (for tests)."""
    fmt, _ = _flat_layout(dt)
    return np.frombuffer(fmt.pack(*(a.item() if hasattr(a, "item") else a for a in args)), dtype=dt).copy()
