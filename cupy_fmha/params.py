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

import numpy as np

__all__ = ["TENSOR", "SEQ", "MASK", "ALIBI", "BIAS", "DROPOUT", "FWD", "DOT_DO_O", "BWD", "CONVERT",
           "DROPOUT_MASK", "STRUCTS", "layout_asserts", "pack"]

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
               ("pad_", _I32))
DROPOUT = _struct(("seed", np.uint64), ("offset", np.uint64), ("keep_threshold", _U32), ("rp_keep", _F32))

FWD = _struct(("q", TENSOR), ("k", TENSOR), ("v", TENSOR), ("o", TENSOR), ("lse", _P), ("seq", SEQ),
              ("hdim_q", _I32), ("hdim_v", _I32), ("group", _I32), ("scale_log2", _F32), ("mask", MASK),
              ("alibi", ALIBI), ("bias", BIAS), ("dropout", DROPOUT))
DOT_DO_O = _struct(("dout", TENSOR), ("o", TENSOR), ("delta", _P), ("dq_acc", _P), ("seq", SEQ),
                   ("hdim_q", _I32), ("hdim_v", _I32))
BWD = _struct(("q", TENSOR), ("k", TENSOR), ("v", TENSOR), ("dout", TENSOR), ("dk", TENSOR), ("dv", TENSOR),
              ("lse", _P), ("delta", _P), ("dq_acc", _P), ("dbias_acc", _P), ("dq_split_stride", _I64),
              ("seq", SEQ), ("hdim_q", _I32), ("hdim_v", _I32), ("group", _I32), ("dkdv_fp32", _I32),
              ("scale_log2", _F32), ("scale", _F32), ("mask", MASK), ("alibi", ALIBI), ("bias", BIAS),
              ("dropout", DROPOUT))
CONVERT = _struct(("acc", _P), ("out", TENSOR), ("split_stride", _I64), ("seq", SEQ), ("hdim", _I32),
                  ("nsum", _I32), ("nsplit", _I32), ("block_n", _I32), ("block_m", _I32), ("pad_", _I32),
                  ("scale", _F32), ("pad2_", _F32), ("mask", MASK))
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
    """A one-element array of ``dtype`` from nested tuples in field order (the fastest way NumPy
    builds a structured value: one call, no per-field assignment)."""
    return np.array([values], dtype=dtype)
