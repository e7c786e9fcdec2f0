"""dBias from the fp32 dS workspace the backward kernel fills: summed over the dimensions the
bias broadcasts along and cast to the bias's dtype. Works on CuPy arrays, and on NumPy arrays
(``cp`` = numpy) for the CPU tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["reduce_dbias", "f32_to_bf16_bits"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_BF16_KERNEL: list = []  # the fused float32 -> bf16 bits kernel, built on first use


def f32_to_bf16_bits(cp, x):
    """float32 array -> bf16 bits (uint16), rounded to nearest even; NaN stays NaN. On CuPy one
    fused elementwise kernel: the dS workspace of dBias holds batch * nhead_q * seqlen_q *
    seqlen_k floats (4.3 GB at batch 4, 16 heads, seqlen 4096), and the unfused expression made
    about ten passes over it. With NumPy as ``cp``, the same rule vectorized."""
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


def reduce_dbias(cp, ds, bias):
    """dBias from the fp32 dS workspace ``ds`` [batch, nhead_q, seqlen_q, seqlen_k] (group mode:
    the max lengths, each sequence's dS in the top-left [seqlen_q_i, seqlen_k_i] corner of its
    plane, zeros elsewhere), in the shape and storage dtype of ``bias`` (the bias as the kernels
    read it: float16, float32, bfloat16, or uint16 bf16 bits).

    Summed over the dimensions the bias broadcasts along (one reduction, float64 accumulation;
    no atomics, so the result is the same on every run), then cast. A bias that broadcasts along
    nothing takes the workspace itself (no copy for fp32)."""
    shape = tuple(int(n) for n in bias.shape)
    shape4 = (1,) * (4 - len(shape)) + shape
    axes = tuple(a for a in range(4) if shape4[a] == 1 and ds.shape[a] != 1)
    red = ds.sum(axis=axes, dtype=cp.float64, keepdims=True) if axes else ds
    red = red.astype(cp.float32, copy=False).reshape(shape)
    store = np.dtype(bias.dtype)
    if store in (_BF16, np.dtype(np.uint16)):  # bf16: exact round-to-nearest-even bits
        bits = f32_to_bf16_bits(cp, cp.ascontiguousarray(red))
        return bits if store == np.dtype(np.uint16) else bits.view(store)
    return cp.ascontiguousarray(red.astype(store, copy=False))
