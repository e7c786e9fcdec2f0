"""The NumPy oracle: gradients vs central finite differences, forward vs a naive per-row loop,
rows without keys, extreme scores, the emulated low precision; and the tolerance rule
(:mod:`cupy_fmha.verify`) it feeds."""

from __future__ import annotations

import math
import zlib

import ml_dtypes
import numpy as np
import pytest

from cupy_fmha import reference as R
from cupy_fmha.mask import resolve_mask
from cupy_fmha.verify import bf16_bits_to_float, compare, float_to_bf16_bits, rel_limit
from fd import fd_grad

BF16 = ml_dtypes.bfloat16

# (mask kwargs) covering every kind: none, CK strings, FlashAttention causal / window_size
MASKS = [
    {},
    {"mask": "t"},
    {"mask": "b"},
    {"mask": "t:1,2"},
    {"mask": "b:2,0"},
    {"mask": "b:0,1"},
    {"mask": "xt:3"},
    {"mask": "xb:4"},
    {"mask": "g:3,2"},
    {"causal": True},
    {"window_size": (1, 1)},
    {"causal": True, "window_size": (2, -1)},
]
SEQS = [(5, 5), (3, 6), (6, 3)]  # sq == sk, sq < sk, sq > sk (rows without keys for "b")


def _shape(layout, b, s, h, d):
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def make(rng, layout, b, sq, sk, hq, hk, d, dv, dtype=np.float64, spread=1.0):
    q = (spread * rng.standard_normal(_shape(layout, b, sq, hq, d))).astype(dtype)
    k = rng.standard_normal(_shape(layout, b, sk, hk, d)).astype(dtype)
    v = rng.standard_normal(_shape(layout, b, sk, hk, dv)).astype(dtype)
    do = rng.standard_normal(_shape(layout, b, sq, hq, dv)).astype(dtype)
    return q, k, v, do


def _cases():
    cases = []
    for mi, m in enumerate(MASKS):
        for si, (sq, sk) in enumerate(SEQS):
            n = mi * len(SEQS) + si
            layout = ("bshd", "bhsd")[n % 2]
            hq, hk = [(2, 1), (4, 1), (2, 2), (4, 2)][n % 4]  # GQA ratios 2, 4, MHA
            cases.append(pytest.param(m, sq, sk, layout, hq, hk, id=f"{m}-{sq}x{sk}-{layout}-{hq}/{hk}"))
    return cases


@pytest.mark.parametrize("mkw, sq, sk, layout, hq, hk", _cases())
def test_backward_matches_finite_differences(mkw, sq, sk, layout, hq, hk):
    rng = np.random.default_rng(zlib.crc32(repr((mkw, sq, sk, layout, hq)).encode()))
    d, dv, scale = 3, 2, 0.7  # hdim_q != hdim_v, non-default scale
    q, k, v, do = make(rng, layout, 2, sq, sk, hq, hk, d, dv)
    kw = dict(mkw, layout=layout, softmax_scale=scale)

    def loss():
        o, _ = R.attention_forward(q, k, v, **kw)
        return float(np.sum(o * do))

    dq, dk, dv_ = R.attention_backward(do, q, k, v, **kw)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    for name, x, g in (("q", q, dq), ("k", k, dk), ("v", v, dv_)):
        fd = fd_grad(loss, x)
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7, err_msg=f"d{name}")


def _naive_forward(q, k, v, scale, spec, layout):
    if layout == "bhsd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    win = spec.window(sq, sk)
    o = np.zeros((b, sq, hq, v.shape[3]))
    lse = np.full((b, hq, sq), -np.inf)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hk)
            for i in range(sq):
                lo, hi = (0, sk) if win is None else win.key_range(i, sk)
                if hi <= lo:
                    continue
                s = [scale * float(np.dot(q[bi, i, h], k[bi, j, kh])) for j in range(lo, hi)]
                mx = max(s)
                w = [math.exp(x - mx) for x in s]
                tot = sum(w)
                lse[bi, h, i] = mx + math.log(tot)
                for j, wj in zip(range(lo, hi), w):
                    o[bi, i, h] += wj / tot * v[bi, j, kh]
    if layout == "bhsd":
        o = o.transpose(0, 2, 1, 3)
    return o, lse


@pytest.mark.parametrize("mkw", MASKS, ids=str)
@pytest.mark.parametrize("sq, sk", [(7, 7), (5, 9), (9, 5)])
def test_forward_matches_naive_loop(mkw, sq, sk):
    rng = np.random.default_rng(sq * 100 + sk)
    layout = "bhsd" if sq > sk else "bshd"
    q, k, v, _ = make(rng, layout, 2, sq, sk, 4, 2, 8, 5)
    o, lse = R.attention_forward(q, k, v, layout=layout, **mkw)
    spec = resolve_mask(mkw.get("mask"), mkw.get("causal", False), mkw.get("window_size", (-1, -1)))
    o_ref, lse_ref = _naive_forward(q, k, v, 1 / math.sqrt(8), spec, layout)
    assert o.dtype == np.float64 and lse.dtype == np.float64
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-12, atol=1e-12)


def test_layouts_agree():
    rng = np.random.default_rng(3)
    q, k, v, do = make(rng, "bshd", 2, 6, 9, 4, 2, 8, 8)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    o1, l1 = R.attention_forward(q, k, v, mask="t:2,3")
    o2, l2 = R.attention_forward(t(q), t(k), t(v), mask="t:2,3", layout="bhsd")
    np.testing.assert_allclose(o1, t(o2), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(l1, l2, rtol=1e-13)
    g1 = R.attention_backward(do, q, k, v, mask="t:2,3")
    g2 = R.attention_backward(t(do), t(q), t(k), t(v), mask="t:2,3", layout="bhsd")
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, t(b), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("group", [2, 4, 8])
def test_gqa_equals_repeated_kv(group):
    rng = np.random.default_rng(group)
    hq = 8
    q, k, v, do = make(rng, "bshd", 1, 5, 7, hq, hq // group, 8, 4)
    kr, vr = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    o1, l1 = R.attention_forward(q, k, v, causal=True)
    o2, l2 = R.attention_forward(q, kr, vr, causal=True)
    np.testing.assert_allclose(o1, o2, rtol=1e-13, atol=1e-14)
    dq1, dk1, dv1 = R.attention_backward(do, q, k, v, causal=True)
    dq2, dk2, dv2 = R.attention_backward(do, q, kr, vr, causal=True)
    np.testing.assert_allclose(dq1, dq2, rtol=1e-12, atol=1e-13)
    sh = dk2.shape
    np.testing.assert_allclose(dk1, dk2.reshape(*sh[:2], hq // group, group, -1).sum(3), atol=1e-12)
    np.testing.assert_allclose(dv1, dv2.reshape(*sh[:2], hq // group, group, -1).sum(3), atol=1e-12)


@pytest.mark.parametrize("precision", ["float64", "low"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_rows_without_keys(precision, layout):
    rng = np.random.default_rng(5)
    sq, sk = 9, 4  # bottom-right causal: rows 0..4 see nothing
    q, k, v, do = make(rng, layout, 2, sq, sk, 4, 2, 8, 8, dtype=np.float16)
    o, lse = R.attention_forward(q, k, v, mask="b", layout=layout, precision=precision)
    dq, dk, dv = R.attention_backward(do, q, k, v, mask="b", layout=layout, precision=precision)
    for x in (o, lse, dq, dk, dv):
        assert not np.isnan(x).any()
    empty = sq - sk
    rows = (slice(None), slice(0, empty)) if layout == "bshd" else (slice(None), slice(None), slice(0, empty))
    assert np.all(o[rows] == 0) and np.all(dq[rows] == 0)
    assert np.all(np.isneginf(lse[:, :, :empty])) and np.all(np.isfinite(lse[:, :, empty:]))
    assert np.all(np.isfinite(dk)) and np.all(np.isfinite(dv)) and np.abs(dk).sum() > 0


def test_mask_with_no_visible_key_at_all():
    rng = np.random.default_rng(6)
    q, k, v, do = make(rng, "bshd", 1, 4, 4, 2, 2, 8, 8)
    o, lse = R.attention_forward(q, k, v, mask="g:0,0")
    assert np.all(o == 0) and np.all(np.isneginf(lse))
    for g in R.attention_backward(do, q, k, v, mask="g:0,0"):
        assert np.all(g == 0)


@pytest.mark.parametrize("level", [-120.0, -1000.0, 300.0])
@pytest.mark.parametrize("precision", ["float64", "low"])
def test_extreme_scores_are_stable(level, precision):
    rng = np.random.default_rng(7)
    b, s, h, d = 1, 6, 2, 8
    q = np.ones((b, s, h, d))
    k = np.full((b, s, h, d), level / d)  # every score == level
    v = rng.standard_normal((b, s, h, d))
    do = rng.standard_normal((b, s, h, d))
    o, lse = R.attention_forward(q, k, v, softmax_scale=1.0, precision=precision)
    np.testing.assert_allclose(o, np.broadcast_to(v.mean(axis=1, keepdims=True), o.shape), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, level + math.log(s), rtol=1e-6)
    grads = R.attention_backward(do, q, k, v, softmax_scale=1.0, precision=precision)
    for g in grads:
        assert np.all(np.isfinite(g))
    # causal too: row i averages keys 0..i
    o, lse = R.attention_forward(q, k, v, softmax_scale=1.0, mask="t")
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse))
    np.testing.assert_allclose(o[0, 2], v[0, :3].mean(axis=0), rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
def test_low_precision_close_to_float64(dtype):
    rng = np.random.default_rng(8)
    q, k, v, do = make(rng, "bshd", 2, 40, 56, 4, 2, 32, 32, dtype=dtype, spread=1.5)
    kw = dict(mask="b:20,0")
    o, lse = R.attention_forward(q, k, v, **kw)
    ol, lsel = R.attention_forward(q, k, v, precision="low", **kw)
    g = R.attention_backward(do, q, k, v, **kw)
    gl = R.attention_backward(do, q, k, v, precision="low", **kw)
    tol = 1e-2 if dtype == np.float16 else 3e-2
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *g), (ol, lsel, *gl)):
        rel = np.linalg.norm(a - b) / np.linalg.norm(a)
        assert rel < tol, (name, rel)
        assert rel > 0, name  # really rounded
    for x in (ol, *gl):  # values are representable in the input dtype
        np.testing.assert_array_equal(x.astype(dtype).astype(np.float64), x)


def test_input_dtypes_and_untouched():
    rng = np.random.default_rng(9)
    q, k, v, do = make(rng, "bshd", 1, 5, 5, 2, 2, 8, 8, dtype=np.float32)
    copies = [x.copy() for x in (q, k, v, do)]
    o32, _ = R.attention_forward(q, k, v)
    o64, _ = R.attention_forward(*(x.astype(np.float64) for x in (q, k, v)))
    np.testing.assert_allclose(o32, o64, rtol=1e-12)
    R.attention_backward(do, q, k, v, causal=True, precision="low")
    for a, b in zip((q, k, v, do), copies):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="precision"):
        R.attention_forward(q, k, v, precision="half")
    with pytest.raises(TypeError, match="k:"):
        R.attention_forward(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match="q:.*uint16"):
        R.attention_forward(q.view(np.uint16)[..., ::2], k, v)


def test_reference_speed_budget():
    """b=2, h=8, s=1024, d=128 must stay in the seconds range (guards against a slow rewrite)."""
    import time

    rng = np.random.default_rng(10)
    q, k, v, do = make(rng, "bshd", 2, 1024, 1024, 8, 8, 128, 128, dtype=np.float16)
    t = time.perf_counter()
    R.attention_backward(do, q, k, v, causal=True)
    assert time.perf_counter() - t < 20


# --------------------------------------------------------------------------- verify


def test_compare_accepts_good_and_rejects_bugs():
    rng = np.random.default_rng(11)
    q, k, v, do = make(rng, "bshd", 2, 128, 128, 4, 4, 64, 64, dtype=np.float16, spread=1.5)
    o, _ = R.attention_forward(q, k, v)
    ol, _ = R.attention_forward(q, k, v, precision="low")
    # a good fp16 kernel: exact maths, final rounding only
    good = o.astype(np.float16)
    c = compare("o", good, o, ol, dtype="float16", hdim_q=64, hdim_v=64)
    assert c.ok, c
    assert compare("o", ol, o, ol, dtype=np.float16, hdim_q=64, hdim_v=64).ok
    # one wrong 16 x 64 tile (10% off) in one head
    bad = good.astype(np.float64)
    bad[0, 32:48, 1, :] *= 1.1
    c = compare("o", bad, o, ol, dtype="float16", hdim_q=64, hdim_v=64)
    assert not c.ok and "max_err" in c.reason, c
    # NaN (unwritten output)
    bad = good.astype(np.float64)
    bad[1, 5, 2, 7] = np.nan
    c = compare("o", bad, o, ol, dtype="float16", hdim_q=64, hdim_v=64)
    assert not c.ok and "NaN" in c.reason
    # gross error without ref_low: relative rule
    c = compare("o", o * 1.05, o, dtype="float16", hdim_q=64, hdim_v=64)
    assert not c.ok and c.rel_err > 1e-2


def test_compare_neg_inf_and_zero_reference():
    ref = np.array([[-np.inf, 1.0, 2.0]])
    assert compare("lse", np.array([[-np.inf, 1.0, 2.0]], np.float32), ref, dtype="float16",
                   hdim_q=64, hdim_v=64).ok
    c = compare("lse", np.array([[0.0, 1.0, 2.0]]), ref, dtype="float16", hdim_q=64, hdim_v=64)
    assert not c.ok and "-inf" in c.reason
    c = compare("lse", np.array([[-np.inf, np.inf, 2.0]]), ref, dtype="float16", hdim_q=64, hdim_v=64)
    assert not c.ok
    z = np.zeros((4, 4))
    assert compare("dk", z, z, z, dtype="bfloat16", hdim_q=64, hdim_v=64).ok
    # exact result 0 by cancellation: judged against the plain implementation's noise
    noise_low = np.full((4, 4), 1e-2)
    assert compare("dk", np.full((4, 4), 1e-6), z, noise_low, dtype="float16", hdim_q=64, hdim_v=64).ok
    assert not compare("dk", np.full((4, 4), 1e-1), z, noise_low, dtype="float16", hdim_q=64, hdim_v=64).ok


def test_compare_limits_and_errors():
    assert rel_limit("bfloat16", 192, 128) == 3e-2
    assert rel_limit("bfloat16", 128, 128) == 1e-2
    assert rel_limit("float16", 256, 256) == 1e-2
    with pytest.raises(ValueError):
        compare("o", np.zeros(3), np.zeros(4), dtype="float16", hdim_q=8, hdim_v=8)
    with pytest.raises(TypeError):
        compare("o", np.zeros(3, np.uint16), np.zeros(3), dtype="bfloat16", hdim_q=8, hdim_v=8)


def test_bf16_bits_roundtrip():
    rng = np.random.default_rng(12)
    x = rng.standard_normal(1000).astype(np.float32)
    bits = float_to_bf16_bits(x)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, x.astype(BF16).view(np.uint16))
    back = bf16_bits_to_float(bits)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(float_to_bf16_bits(back), bits)
    # round to nearest even, including from float64 (no double rounding)
    vals = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30)])
    np.testing.assert_array_equal(bf16_bits_to_float(float_to_bf16_bits(vals)),
                                  np.array([1.0, 1 + 2**-6, 1 + 2**-7, -(1 + 2**-7)], np.float32))
    assert np.isnan(bf16_bits_to_float(float_to_bf16_bits(np.array([np.nan]))))[0]
