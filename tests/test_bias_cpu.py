"""Elementwise bias / dBias in the GPU API, the parts that need no GPU: argument checks (raised
before CuPy is touched), the bias's kernel strides, the dS -> dBias reduction and the bf16
rounding (run here with NumPy standing in for CuPy: they use only array methods both share)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api, dbias
from cupy_fmha import reference as R
from cupy_fmha.spec import bwd_specs, default_dispatch_table, fwd_spec

BF16 = np.dtype(ml_dtypes.bfloat16)
B, S, H, D = 2, 16, 2, 64


def _qkv():
    q = np.random.default_rng(0).standard_normal((B, S, H, D)).astype(np.float16)
    return q, q.copy(), q.copy()


def _fwd(**kw):
    q, k, v = _qkv()
    return cupy_fmha.attention_forward(q, k, v, **kw)


def _bwd(**kw):
    q, k, v = _qkv()
    lse = np.zeros((B, H, S), np.float32)
    return cupy_fmha.attention_backward(q, q, k, v, q, lse, **kw)


@pytest.mark.parametrize("call", [_fwd, _bwd])
@pytest.mark.parametrize(
    "bias, exc, words",
    [
        (np.zeros((B, H, S, S + 1), np.float32), ValueError, "bias: shape"),
        (np.zeros((3, H, S, S), np.float32), ValueError, "batch dimension is 3"),
        (np.zeros((1, 3, S, S), np.float32), ValueError, "nhead_q dimension is 3"),
        (np.zeros((1, 1, 1, 1, S), np.float32), ValueError, "rank 1 to 4"),
        (np.zeros((S, S), np.float64), TypeError, "bias: expected float16, bfloat16 or float32"),
        (np.zeros((S, S), np.int32), TypeError, "bias"),
        (np.zeros((S, S), np.uint16), TypeError, "bias: got a uint16 array"),
        ([[0.0] * S] * S, TypeError, "bias: expected a CuPy or NumPy array"),
    ],
)
def test_bad_bias_is_rejected_before_any_gpu_use(call, bias, exc, words):
    with pytest.raises(exc, match=words):
        call(bias=bias)


@pytest.mark.parametrize("call", [_fwd, _bwd])
def test_bias_and_alibi_together_rejected(call):
    with pytest.raises(ValueError, match="bias, alibi_slopes"):
        call(bias=np.zeros((S, S), np.float32), alibi_slopes=np.ones(H, np.float32))


def test_return_dbias_needs_a_bias_and_a_bool():
    with pytest.raises(ValueError, match="return_dbias"):
        _bwd(return_dbias=True)
    with pytest.raises(ValueError, match="return_dbias"):
        _bwd(return_dbias=True, alibi_slopes=np.ones(H, np.float32))
    with pytest.raises(TypeError, match="return_dbias"):
        _bwd(return_dbias=1, bias=np.zeros((S, S), np.float32))


@pytest.mark.parametrize(
    "shape, strides, want",
    [
        ((1, 1, 16, 8), (512, 512, 32, 4), (0, 0, 8, 1)),        # [1, 1, sq, sk] fp32
        ((2, 3, 16, 8), (1536, 512, 32, 4), (384, 128, 8, 1)),   # [b, h, sq, sk]
        ((16, 8), (32, 4), (0, 0, 8, 1)),                        # [sq, sk]
        ((16, 1), (4, 4), (0, 0, 1, 0)),                         # [sq, 1]: broadcast last dim
        ((8,), (4,), (0, 0, 0, 1)),                              # [sk]
        ((3, 1, 16, 8), (-512, 512, 4, 64), (-128, 0, 1, 16)),  # transposed, reversed views
    ],
)
def test_bias_strides(shape, strides, want):
    assert api._bias_strides(shape, strides, 4) == want


def test_bias_instances_are_separate_and_in_the_table():
    for cc in (80, 90):
        for d in (32, 64, 128, 256):
            plain, biased = fwd_spec("fp16", d, d, cc), fwd_spec("fp16", d, d, cc, bias=True)
            assert "BIAS" not in plain.name and biased.macro("BIAS") == 1
            # the warp-specialized Hopper forward (the plain default on sm_90) reads no bias but
            # through TMA (bias_tma): the biased instance is the other sm_90a family at hdim 64/128,
            # the mma.sync kernel elsewhere
            other = "fmha_fwd_sm90" if cc == 90 and d in (64, 128) else "fmha_fwd"
            assert biased.source == (other if plain.source == "fmha_fwd_sm90_ws" else plain.source)
            pb, bb = bwd_specs("bf16", d, d, cc), bwd_specs("bf16", d, d, cc, bias=True)
            assert bb.dq_dk_dv.macro("BIAS") == 1 and "BIAS" not in pb.dq_dk_dv.name
            assert bb.dot_do_o == pb.dot_do_o and bb.convert_dq == pb.convert_dq
    names = {s.name for s in default_dispatch_table()}
    assert fwd_spec("bf16", 128, 128, 90, bias=True).name in names
    assert bwd_specs("fp16", 96, 96, 80, bias=True).dq_dk_dv.name in names
    assert fwd_spec("bf16", 128, 128, 90).name in names


def test_f32_to_bf16_bits_rounds_to_nearest_even():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-30, 30, 4000),
                        [0.0, -0.0, np.inf, -np.inf, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8,
                         3.0e38, -1e-40]]).astype(np.float32)
    got = dbias.f32_to_bf16_bits(np, x)
    assert got.dtype == np.uint16
    assert np.array_equal(got, x.astype(BF16).view(np.uint16))
    nan = dbias.f32_to_bf16_bits(np, np.array([np.nan], np.float32)).view(BF16).astype(np.float32)
    assert np.isnan(nan).all()


@pytest.mark.parametrize(
    "shape", [(1, 1, 5, 7), (1, 3, 5, 7), (2, 3, 5, 7), (5, 7), (5, 1), (7,), (2, 1, 1, 7)]
)
@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32])
def test_reduce_dbias_sums_broadcast_dims(shape, dtype):
    ds = np.random.default_rng(2).standard_normal((2, 3, 5, 7)).astype(np.float32)
    bias = np.zeros(shape, dtype)
    got = dbias.reduce_dbias(np, ds, bias)
    shape4 = (1,) * (4 - len(shape)) + shape
    axes = tuple(a for a in range(4) if shape4[a] == 1)
    want = ds.astype(np.float64).sum(axis=axes, keepdims=True).astype(np.float32).reshape(shape)
    want = want.astype(dtype)
    assert got.shape == shape
    if np.dtype(dtype) == BF16:
        assert got.dtype == BF16 and np.array_equal(got.view(np.uint16), want.view(np.uint16))
        bits = dbias.reduce_dbias(np, ds, bias.view(np.uint16))  # uint16 bits in, bits out
        assert bits.dtype == np.uint16 and np.array_equal(bits, want.view(np.uint16))
    else:
        assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)


def test_reduce_dbias_matches_reference_convention():
    # the reference's dbias for a [1, h, sq, sk] bias is dS summed over the batch
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((2, 6, 2, 16)) for _ in range(4))
    bias = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    full = np.broadcast_to(bias, (2, 2, 6, 6)).copy()
    *_, db_full = R.attention_backward(do, q, k, v, bias=full, return_dbias=True)
    *_, db = R.attention_backward(do, q, k, v, bias=bias, return_dbias=True)
    got = dbias.reduce_dbias(np, db_full.astype(np.float32), bias)
    assert np.allclose(got, db, rtol=1e-5, atol=1e-6)


def test_attention_grads_tuples():
    assert api.AttentionGrads._fields == ("dq", "dk", "dv")
    assert api.AttentionGradsWithBias._fields == ("dq", "dk", "dv", "dbias")
    assert cupy_fmha.AttentionGradsWithBias is api.AttentionGradsWithBias
