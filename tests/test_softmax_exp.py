"""The forward's exponential on the FMA pipes (EXP_EMU, bench/NOTES.md step 87): the NumPy replica
of kernels/arch/sm80/instr.cuh's poly_exp2 against 2^x (relative error, special values), and the
kernel's literals against the replica's. The device itself: tests/test_gpu_fwd_ws.py
(test_poly_exp2_on_the_device)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cupy_fmha import softmax_exp as E
from cupy_fmha.compile import kernel_dir


def test_relative_error_over_the_softmax_range():
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-126, 0, 400_001, dtype=np.float32),
                        rng.uniform(-126, 0, 400_000).astype(np.float32),
                        -np.float32(2.0) ** -np.arange(1, 40, dtype=np.float32),  # just below 0
                        np.arange(-126, 1, dtype=np.float32)])  # integers: exact powers of two
    got = E.poly_exp2(x).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() <= E.MAX_REL_ERROR, rel.max()
    ints = np.arange(-126, 1, dtype=np.float32)
    assert np.array_equal(E.poly_exp2(ints), np.exp2(ints.astype(np.float64)).astype(np.float32))


def test_special_values():
    x = np.array([-np.inf, -1e30, -200.0, -127.0, -126.5, -126.0, 0.0, -0.0, np.nan], np.float32)
    got = E.poly_exp2(x)
    assert np.array_equal(got[:5], np.zeros(5, np.float32)) and not np.signbit(got[:5]).any()  # +0.0
    assert got[5] == np.float32(2.0) ** -126 and got[6] == 1 and got[7] == 1
    assert np.isnan(got[8])


def test_above_zero():
    """The folded softmax's FFMA can land a rounding above 0 for a row's largest score, and with
    LAZY_RESCALE a stale maximum lets x reach that many above 0 (at most 15: fwd_ws_tiles)."""
    x = np.concatenate([np.float32(2.0) ** -np.arange(1, 30, dtype=np.float32),
                        np.linspace(0, 16, 100_001, dtype=np.float32), np.arange(0, 128, dtype=np.float32)])
    rel = np.abs(E.poly_exp2(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() <= E.MAX_REL_ERROR
    assert np.isinf(E.poly_exp2(np.array([128.0], np.float32))[0])


def test_kernel_literals_are_the_replicas():
    src = (kernel_dir() / "arch" / "sm80" / "instr.cuh").read_text()
    body = src[src.index("float poly_exp2(float x)"):]
    body = body[:body.index("\n}\n")]
    lits = [float.fromhex(h[:-1]) for h in re.findall(r"0x1\.[0-9a-f]+p-\d+f", body)]
    assert lits == [E.POLY_EXP2[2], E.POLY_EXP2[1], E.POLY_EXP2[0]], lits  # (Horner order: c3, c2, c1)
    assert "0fC2FE0000" in body and np.float32(E.CLAMP).view(np.uint32) == 0xC2FE0000
    assert f"{E.ROUNDER:.0f}.f" in body and "0x800000u + 0x3f800000u" in body


@pytest.mark.parametrize("bad", [np.float32(-127.0) - np.float32(0.5), np.float32(-1000)])
def test_clamped_inputs_are_zero(bad):
    assert E.poly_exp2(np.array([bad]))[0] == 0
