"""The forward softmax's exponential on the FMA pipes (the ``EXP_EMU`` variant of the Hopper forward,
bench/NOTES.md step 87): a NumPy replica of ``poly_exp2`` in ``kernels/arch/sm80/instr.cuh``, for its
accuracy tests and its GPU test.

The method is FlashAttention-4's (Dao et al., 2025: part of the exponentials computed with a
polynomial on the FMA units, so that the MUFU unit stops bounding the softmax): for the softmax's
arguments (x <= 0, a rounding above it, or with LAZY_RESCALE up to that many above it; valid for
x < 128), n = floor(x) and f = x - n in [0, 1], 2^x = 2^f * 2^n with 2^f from a cubic. The
cubic here was fitted for the least relative error under p(0) = 1 and p(1) = 2 exactly (so 2^0 and
the powers of two are exact); its error is at most 1.04e-4 relative over [0, 1), against
float16's half unit of 2.4e-4 and bfloat16's 2.0e-3, the dtypes P is rounded to before the P V
product.

Special values: anything below -126 (the device clamps x at -127 first) comes out as +0.0, -inf
included, exactly as MUFU.EX2 with flush-to-zero gives 0 there; NaN stays NaN.
"""

from __future__ import annotations

import numpy as np

#: 2^f ~ 1 + f (c1 + f (c2 + f c3)) on [0, 1): (c1, c2, c3) as float32, the kernel's literals
POLY_EXP2 = (float.fromhex("0x1.640eaap-1"), float.fromhex("0x1.cf7a66p-3"), float.fromhex("0x1.4095eap-4"))
#: the clamp (-127: n = -127 builds a zero factor) and the add that rounds x down to an integer
CLAMP, ROUNDER = -127.0, 12582912.0  # 1.5 * 2^23
#: the largest relative error of the replica over [-126, 0] (tests/test_softmax_exp.py measures it)
MAX_REL_ERROR = 1.04e-4


def _f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def _add_rd(a: np.ndarray, b: float) -> np.ndarray:
    """float32 a + b rounded toward -inf (the device's add.rm.f32), from the float64 sum (exact for
    |a| >= 2^-29; below that it rounds to b, where the device gives b - 1: n = 0 here, -1 there, and
    2^x = 1.0 either way)."""
    s = a.astype(np.float64) + b
    r = s.astype(np.float32)
    return np.where(r.astype(np.float64) > s, np.nextafter(r, np.float32(-np.inf)), r)


def _fma(a, b, c) -> np.ndarray:
    """float32 fma through float64 (the product is exact there; the sum may round twice, which can
    move a result by one float32 unit in rare ties: the GPU test allows that)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def poly_exp2(x) -> np.ndarray:
    """2^x (float32 in, float32 out) the way ``poly_exp2`` in kernels/arch/sm80/instr.cuh computes it,
    step by step in float32.

    Args:
        x: array-like of float32 values (the softmax's x <= 0; valid for x < 128: 128 gives inf).

    Returns:
        float32 array of the same shape.
    """
    x = _f32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        xc = np.where(np.isnan(x), x, np.maximum(x, np.float32(CLAMP)))  # max.NaN.f32
        t = _add_rd(xc, ROUNDER)
        f = (xc.astype(np.float64) - (t.astype(np.float64) - ROUNDER)).astype(np.float32)  # (one rounding, as the device's)
        c1, c2, c3 = (np.float32(c) for c in POLY_EXP2)
        p = _fma(_fma(_fma(c3, f, c2), f, c1), f, np.float32(1.0))
        bits = (t.view(np.uint32).astype(np.uint64) * 0x800000 + 0x3F800000) & 0xFFFFFFFF
        scale = bits.astype(np.uint32).view(np.float32)
        return (p.astype(np.float64) * scale.astype(np.float64)).astype(np.float32)
