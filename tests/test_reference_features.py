"""Issue 3 features of the NumPy oracle: bias / dbias, ALiBi, dropout (Philox keep mask) and varlen
(group mode), checked against central finite differences and against equivalent formulations;
rows without keys; very negative scores; emulated low precision; and the new input checks."""

from __future__ import annotations

import math
import zlib

import ml_dtypes
import numpy as np
import pytest

from cupy_fmha import reference as R
from cupy_fmha.mask import dense_mask, resolve_mask
from cupy_fmha import philox
from cupy_fmha.philox import dropout_keep_block
from cupy_fmha.validate import (
    VarlenProblem,
    check_alibi_slopes,
    check_bias,
    check_cu_seqlens,
    check_dropout,
    check_varlen_inputs,
)
from fd import check_fd

BF16 = ml_dtypes.bfloat16


# --------------------------------------------------------------------------- helpers


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make(rng, b, sq, sk, hq, hk, d, dv, dtype=np.float64):
    """bshd inputs."""
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hk, dv)).astype(dtype)
    do = rng.standard_normal((b, sq, hq, dv)).astype(dtype)
    return q, k, v, do


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def make_varlen(rng, lq, lk, hq, hk, d, dv, dtype=np.float64):
    tq, tk = int(sum(lq)), int(sum(lk))
    q = rng.standard_normal((tq, hq, d)).astype(dtype)
    k = rng.standard_normal((tk, hk, d)).astype(dtype)
    v = rng.standard_normal((tk, hk, dv)).astype(dtype)
    do = rng.standard_normal((tq, hq, dv)).astype(dtype)
    kw = dict(layout="thd", cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk))
    return q, k, v, do, kw


# --------------------------------------------------------------------------- finite differences

B, HQ = 2, 4
BIAS_SHAPES = [
    lambda sq, sk: (1, 1, sq, sk),
    lambda sq, sk: (1, HQ, sq, sk),
    lambda sq, sk: (B, HQ, sq, sk),
    lambda sq, sk: (sq, sk),
    lambda sq, sk: (B, 1, 1, sk),  # key padding style
    lambda sq, sk: (HQ, sq, 1),
    lambda sq, sk: (sk,),
]
FD_MASKS = [{}, {"mask": "b"}, {"causal": True}, {"mask": "t:1,2"}, {"window_size": (1, 0)}]


@pytest.mark.parametrize("si", range(len(BIAS_SHAPES)))
@pytest.mark.parametrize("sq, sk", [(5, 6), (6, 4)])
def test_bias_gradients_match_finite_differences(si, sq, sk):
    shape = BIAS_SHAPES[si](sq, sk)
    rng = _rng("bias", si, sq, sk)
    hk = (1, 2, 4)[si % 3]
    q, k, v, do = make(rng, B, sq, sk, HQ, hk, 3, 2)
    bias = rng.standard_normal(shape)
    mkw = FD_MASKS[(si + sq) % len(FD_MASKS)]
    check_fd(q, k, v, do, bias, softmax_scale=0.8, **mkw)


@pytest.mark.parametrize("mkw", [{}, {"mask": "b"}, {"mask": "t:2,0"}], ids=str)
@pytest.mark.parametrize("per_batch", [False, True])
def test_alibi_gradients_match_finite_differences(mkw, per_batch):
    rng = _rng("alibi", str(mkw), per_batch)
    q, k, v, do = make(rng, B, 5, 7, HQ, 2, 3, 2)
    slopes = rng.uniform(0.05, 1.0, (B, HQ) if per_batch else (HQ,)).astype(np.float32)
    check_fd(q, k, v, do, alibi_slopes=slopes, **mkw)


@pytest.mark.parametrize(
    "mkw, bias_shape, hk",
    [({}, None, 4), ({"mask": "b"}, None, 2), ({"causal": True}, (1, HQ, 6, 5), 1),
     ({"mask": "t:1,1"}, (B, HQ, 6, 5), 2)],
    ids=str,
)
def test_dropout_gradients_match_finite_differences(mkw, bias_shape, hk):
    rng = _rng("drop", str(mkw), bias_shape)
    q, k, v, do = make(rng, B, 6, 5, HQ, hk, 3, 2)
    bias = None if bias_shape is None else rng.standard_normal(bias_shape)
    kw = dict(dropout_p=0.3, seed=2**40 + 7, offset=11, **mkw)
    _, _, keep = R.attention_forward(q, k, v, bias=bias, return_dropout_mask=True, **kw)
    assert 0 < keep.mean() < 1  # some dropped, some kept
    check_fd(q, k, v, do, bias, **kw)


# zero-length q sequence (index 1), zero-length k sequence (index 2), both (index 3)
VARLEN_LENS = [([3, 0, 4, 0, 2], [4, 3, 0, 0, 5]), ([2, 5, 0, 3], [6, 0, 2, 3])]
VARLEN_FEATURES = [
    {},
    {"bias": "full"},
    {"bias": "shared"},
    {"alibi": True},
    {"dropout_p": 0.25, "seed": 99, "offset": 5},
    {"bias": "full", "dropout_p": 0.4, "seed": 1, "offset": 2**64 - 3},
]


@pytest.mark.parametrize("fi", range(len(VARLEN_FEATURES)))
@pytest.mark.parametrize("li", range(len(VARLEN_LENS)))
def test_varlen_gradients_match_finite_differences(fi, li):
    feat = dict(VARLEN_FEATURES[fi])
    lq, lk = VARLEN_LENS[li]
    rng = _rng("varlen", fi, li)
    hq, hk = [(4, 2), (2, 1), (2, 2)][(fi + li) % 3]
    q, k, v, do, kw = make_varlen(rng, lq, lk, hq, hk, 3, 2)
    kw.update([{}, {"mask": "b"}, {"causal": True}, {"mask": "t:1,0"}][(fi + 2 * li) % 4])
    nb, mq, mk = len(lq), max(lq), max(lk)
    bias = None
    kind = feat.pop("bias", None)
    if kind == "full":
        bias = rng.standard_normal((nb, hq, mq, mk))
    elif kind == "shared":
        bias = rng.standard_normal((1, 1, mq + 1, mk))
        kw["max_seqlen_q"] = mq + 1
    if feat.pop("alibi", False):
        kw["alibi_slopes"] = rng.uniform(0.1, 1, (nb, hq)).astype(np.float32)
    kw.update(feat)
    grads = check_fd(q, k, v, do, bias, **kw)
    o, lse = R.attention_forward(q, k, v, bias=bias, **kw)
    assert lse.shape == (nb, hq, kw.get("max_seqlen_q", mq))
    cq, ck = cu(lq), cu(lk)
    for b in range(nb):
        rows = slice(cq[b], cq[b + 1])
        assert np.all(np.isneginf(lse[b, :, lq[b]:]))  # beyond the sequence
        if lk[b] == 0:  # no keys: o = 0, lse = -inf, dq = 0
            assert np.all(o[rows] == 0) and np.all(grads[0][rows] == 0)
            assert np.all(np.isneginf(lse[b]))
        if lq[b] == 0:  # no queries: dk = dv = 0
            keys = slice(ck[b], ck[b + 1])
            assert np.all(grads[1][keys] == 0) and np.all(grads[2][keys] == 0)
    if bias is not None and bias.shape[0] == nb:
        db = grads[3]
        for b in range(nb):
            assert np.all(db[b, :, lq[b]:] == 0) and np.all(db[b, :, :, lk[b]:] == 0)


# --------------------------------------------------------------------------- equivalences


@pytest.mark.parametrize("mkw", [{}, {"mask": "b"}, {"causal": True, "window_size": (2, -1)},
                                 {"mask": "t:1,2"}, {"mask": "xb:3"}], ids=str)
@pytest.mark.parametrize("feature", ["plain", "bias", "alibi", "dropout"])
def test_varlen_equals_separate_sequences(mkw, feature):
    lq, lk = [5, 0, 7, 3, 4], [6, 2, 0, 3, 9]
    rng = _rng("vsep", str(mkw), feature)
    hq, hk, d, dv = 4, 2, 8, 5
    q, k, v, do, kw = make_varlen(rng, lq, lk, hq, hk, d, dv)
    nb, mq, mk = len(lq), max(lq), max(lk)
    kw.update(mkw)
    extra = {}
    if feature == "bias":
        extra["bias"] = rng.standard_normal((nb, hq, mq, mk))
    elif feature == "alibi":
        extra["alibi_slopes"] = rng.uniform(0.1, 1, (nb, hq)).astype(np.float32)
    elif feature == "dropout":
        extra.update(dropout_p=0.2, seed=31337, offset=1000)
    o, lse, keep = R.attention_forward(q, k, v, return_dropout_mask=True, **kw, **extra)
    dq, dk, dv_, *db = R.attention_backward(do, q, k, v, return_dbias=feature == "bias", **kw, **extra)
    assert isinstance(keep, list) and len(keep) == nb
    cq, ck = cu(lq), cu(lk)
    for b in range(nb):
        assert keep[b].shape == (hq, lq[b], lk[b])
        if lq[b] == 0 or lk[b] == 0:
            continue
        rs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = {}
        if feature == "bias":
            one["bias"] = extra["bias"][b:b + 1, :, :lq[b], :lk[b]]
        elif feature == "alibi":
            one["alibi_slopes"] = extra["alibi_slopes"][b:b + 1]
        elif feature == "dropout":  # batch index b of the varlen call == offset shifted by b*hq
            one.update(dropout_p=0.2, seed=31337, offset=1000 + b * hq)
        ob, lb, kb = R.attention_forward(q[None, rs], k[None, ks], v[None, ks], return_dropout_mask=True,
                                         **mkw, **one)
        np.testing.assert_array_equal(kb[0], keep[b])
        np.testing.assert_allclose(o[rs], ob[0], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(lse[b, :, :lq[b]], lb[0], rtol=1e-12, atol=1e-13)
        g = R.attention_backward(do[None, rs], q[None, rs], k[None, ks], v[None, ks],
                                 return_dbias=feature == "bias", **mkw, **one)
        np.testing.assert_allclose(dq[rs], g[0][0], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(dk[ks], g[1][0], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(dv_[ks], g[2][0], rtol=1e-11, atol=1e-12)
        if feature == "bias":
            np.testing.assert_allclose(db[0][b, :, :lq[b], :lk[b]], g[3][0], rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_zero_bias_equals_no_bias(layout):
    rng = _rng("zero", layout)
    q, k, v, do = make(rng, 2, 6, 9, 4, 2, 8, 8)
    if layout == "bhsd":
        q, k, v, do = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v, do))
    for bias in (np.zeros((1, 4, 6, 9), np.float32), np.zeros((6, 9), np.float16)):
        o0, l0 = R.attention_forward(q, k, v, mask="b:3,1", layout=layout)
        o1, l1 = R.attention_forward(q, k, v, mask="b:3,1", layout=layout, bias=bias)
        np.testing.assert_array_equal(o0, o1)
        np.testing.assert_array_equal(l0, l1)
        g0 = R.attention_backward(do, q, k, v, mask="b:3,1", layout=layout)
        g1 = R.attention_backward(do, q, k, v, mask="b:3,1", layout=layout, bias=bias, return_dbias=True)
        for a, b in zip(g0, g1):
            np.testing.assert_array_equal(a, b)
        assert g1[3].shape == bias.shape


def alibi_bias(slopes, b, hq, sq, sk):
    s = np.broadcast_to(np.asarray(slopes, np.float64).reshape(-1, hq), (b, hq))
    dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :])
    return -s[:, :, None, None] * dist


@pytest.mark.parametrize("sq, sk", [(5, 9), (9, 5), (6, 6)])
@pytest.mark.parametrize("mkw", [{}, {"causal": True}, {"mask": "t:2,1"}], ids=str)
def test_alibi_equals_explicit_bias(sq, sk, mkw):
    rng = _rng("alibi-eq", sq, sk, str(mkw))
    q, k, v, do = make(rng, 2, sq, sk, 4, 1, 8, 4)
    for slopes in (rng.uniform(0, 1, 4).astype(np.float32), rng.uniform(0, 1, (2, 4)).astype(np.float32)):
        bias = alibi_bias(slopes, 2, 4, sq, sk)
        a = R.attention_forward(q, k, v, alibi_slopes=slopes, **mkw)
        e = R.attention_forward(q, k, v, bias=bias, **mkw)
        for x, y in zip(a, e):
            np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-14)
        ga = R.attention_backward(do, q, k, v, alibi_slopes=slopes, **mkw)
        ge = R.attention_backward(do, q, k, v, bias=bias, **mkw)
        assert len(ga) == 3
        for x, y in zip(ga, ge):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-13)


def test_alibi_varlen_uses_each_sequences_lengths():
    lq, lk = [4, 7, 2], [9, 3, 2]
    rng = _rng("alibi-varlen")
    q, k, v, do, kw = make_varlen(rng, lq, lk, 2, 2, 8, 8)
    slopes = rng.uniform(0, 1, 2).astype(np.float32)
    bias = np.zeros((3, 2, 7, 9))
    for b in range(3):
        bias[b, :, :lq[b], :lk[b]] = alibi_bias(slopes, 1, 2, lq[b], lk[b])[0]
    a = R.attention_forward(q, k, v, alibi_slopes=slopes, causal=True, **kw)
    e = R.attention_forward(q, k, v, bias=bias, causal=True, **kw)
    for x, y in zip(a, e):
        np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-14)


def test_dropout_p0_equals_no_dropout():
    rng = _rng("p0")
    q, k, v, do = make(rng, 2, 7, 5, 4, 2, 8, 8)
    o0, l0 = R.attention_forward(q, k, v, mask="b")
    o1, l1, keep = R.attention_forward(q, k, v, mask="b", dropout_p=0.0, seed=5, offset=9,
                                       return_dropout_mask=True)
    np.testing.assert_array_equal(o0, o1)
    np.testing.assert_array_equal(l0, l1)
    assert keep.shape == (2, 4, 7, 5) and keep.dtype == bool and keep.all()
    for a, b in zip(R.attention_backward(do, q, k, v, mask="b"),
                    R.attention_backward(do, q, k, v, mask="b", dropout_p=0.0, seed=5, offset=9)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_dropout_forward_formula_and_mask(layout):
    """O = (P * keep * s) V with the undropped P (s = 256 / threshold, philox.keep_scale); LSE
    unchanged; keep = Philox block."""
    rng = _rng("dropform", layout)
    b, sq, sk, hq, hk, d = 2, 33, 41, 4, 2, 16
    q, k, v, _ = make(rng, b, sq, sk, hq, hk, d, d)
    t = (lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))) if layout == "bhsd" else (lambda x: x)
    p, seed, offset = 0.3, 123456789, 42
    kw = dict(layout=layout, mask="t:5,-1")
    o, lse, keep = R.attention_forward(t(q), t(k), t(v), dropout_p=p, seed=seed, offset=offset,
                                       return_dropout_mask=True, **kw)
    o0, lse0 = R.attention_forward(t(q), t(k), t(v), **kw)
    np.testing.assert_array_equal(lse, lse0)
    for bi in range(b):
        np.testing.assert_array_equal(keep[bi], dropout_keep_block(seed, offset, bi, hq, sq, sk, p))
    qh, kh, vh = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    kh, vh = np.repeat(kh, hq // hk, 1), np.repeat(vh, hq // hk, 1)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d)
    vis = dense_mask(resolve_mask("t:5,-1"), sq, sk)
    P = np.where(vis, np.exp(s - lse[..., None]), 0.0)
    want = (P * keep * philox.keep_scale(p)) @ vh
    np.testing.assert_allclose(t(o).transpose(0, 2, 1, 3) if layout == "bshd" else o, want,
                               rtol=1e-12, atol=1e-12)
    assert abs(keep.mean() - 0.7) < 0.03
    assert not np.allclose(o, o0)


def test_dropout_keep_rate_through_reference():
    rng = _rng("rate")
    q, k, v, _ = make(rng, 2, 128, 192, 4, 4, 8, 8)
    for p in (0.1, 0.5, 0.8):
        _, _, keep = R.attention_forward(q, k, v, dropout_p=p, seed=7, offset=0, return_dropout_mask=True)
        n = keep.size
        assert abs(keep.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n) + 1 / 512  # (p rounds to a multiple of 1/256)


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("precision", ["float64", "low"])
@pytest.mark.parametrize("mode", ["batch", "varlen"])
def test_rows_without_keys_with_bias_and_dropout(precision, mode):
    rng = _rng("empty", precision, mode)
    sq, sk, hq, hk = 9, 4, 4, 2
    dt = np.float16
    dkw = dict(dropout_p=0.3, seed=3, offset=4)
    if mode == "batch":
        q, k, v, do = make(rng, 2, sq, sk, hq, hk, 8, 8, dtype=dt)
        kw = {}
        bias = rng.standard_normal((2, hq, sq, sk)).astype(np.float32)
    else:
        q, k, v, do, kw = make_varlen(rng, [sq, 3, sq], [sk, 0, sk], hq, hk, 8, 8, dtype=dt)
        bias = rng.standard_normal((3, hq, sq, sk)).astype(np.float32)
    for extra in ({"bias": bias}, {"alibi_slopes": np.full(hq, 0.5, np.float32)}):
        o, lse = R.attention_forward(q, k, v, mask="b", precision=precision, **kw, **dkw, **extra)
        g = R.attention_backward(do, q, k, v, mask="b", precision=precision, return_dbias="bias" in extra,
                                 **kw, **dkw, **extra)
        for x in (o, lse, *g):
            assert not np.isnan(x).any()
        for x in (o, *g):
            assert np.all(np.isfinite(x))
        empty = sq - sk  # bottom-right causal: rows 0..empty-1 see nothing
        if mode == "batch":
            assert np.all(o[:, :empty] == 0) and np.all(g[0][:, :empty] == 0)
            assert np.all(np.isneginf(lse[:, :, :empty])) and np.all(np.isfinite(lse[:, :, empty:]))
            if "bias" in extra:
                assert np.all(g[3][:, :, :empty] == 0) and np.abs(g[3]).sum() > 0
        else:
            for r0 in (0, sq + 3):  # sequences 0 and 2
                assert np.all(o[r0:r0 + empty] == 0) and np.all(g[0][r0:r0 + empty] == 0)
            assert np.all(o[sq:sq + 3] == 0) and np.all(g[0][sq:sq + 3] == 0)  # sequence 1: no keys
            assert np.all(np.isneginf(lse[1])) and np.all(np.isneginf(lse[[0, 2], :, :empty]))
            assert np.all(np.isfinite(lse[[0, 2], :, empty:]))
        assert np.abs(g[1]).sum() > 0 and np.abs(g[2]).sum() > 0


def test_no_visible_key_at_all_with_features():
    rng = _rng("none")
    q, k, v, do = make(rng, 1, 4, 4, 2, 2, 8, 8)
    bias = rng.standard_normal((1, 2, 4, 4))
    kw = dict(mask="g:0,0", dropout_p=0.5, seed=1, offset=1)
    o, lse = R.attention_forward(q, k, v, bias=bias, **kw)
    assert np.all(o == 0) and np.all(np.isneginf(lse))
    for g in R.attention_backward(do, q, k, v, bias=bias, return_dbias=True, **kw):
        assert np.all(g == 0)


@pytest.mark.parametrize("precision", ["float64", "low"])
def test_lse_below_minus_100(precision):
    """A bias of -120 on every key: lse < -100, and since the bias is constant per row, O and the
    gradients equal those without bias; dbias sums to 0 per row and matches finite differences."""
    rng = _rng("neg", precision)
    sq, sk, hq, hk = 6, 7, 4, 2
    q, k, v, do = make(rng, 2, sq, sk, hq, hk, 8, 8)
    bias = np.full((1, 1, sq, sk), -120.0)
    o, lse = R.attention_forward(q, k, v, bias=bias, precision=precision, causal=True)
    o0, lse0 = R.attention_forward(q, k, v, precision=precision, causal=True)
    assert np.all(lse < -100)
    tol = dict(rtol=1e-10, atol=1e-12) if precision == "float64" else dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, lse0 - 120, **tol)
    np.testing.assert_allclose(o, o0, **tol)
    g = R.attention_backward(do, q, k, v, bias=bias, return_dbias=True, precision=precision, causal=True)
    g0 = R.attention_backward(do, q, k, v, precision=precision, causal=True)
    for a, b in zip(g[:3], g0):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, **tol)
    assert np.all(np.isfinite(g[3]))
    if precision == "float64":
        bias_b = np.full((2, hq, sq, sk), -120.0)
        db = check_fd(q, k, v, do, bias_b, causal=True)[3]
        np.testing.assert_allclose(db.sum(axis=-1), 0, atol=1e-9)
        # dropout too
        check_fd(q, k, v, do, bias_b, causal=True, dropout_p=0.2, seed=8, offset=8)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["batch", "varlen"])
def test_low_precision_with_features(dtype, mode):
    rng = _rng("low", mode, str(dtype))
    hq, hk, d = 4, 2, 32
    if mode == "batch":
        q, k, v, do = make(rng, 2, 40, 56, hq, hk, d, d, dtype=dtype)
        kw = {}
        bias = rng.standard_normal((1, hq, 40, 56)).astype(np.float32)
    else:
        q, k, v, do, kw = make_varlen(rng, [40, 0, 23], [56, 9, 31], hq, hk, d, d, dtype=dtype)
        bias = rng.standard_normal((3, 1, 40, 56)).astype(dtype)
    for extra in ({"bias": bias}, {"alibi_slopes": np.linspace(0.05, 0.5, hq).astype(np.float32)}):
        fkw = dict(kw, mask="b:20,0", dropout_p=0.2, seed=17, offset=3, **extra)
        rd = "bias" in extra
        ref = (*R.attention_forward(q, k, v, **fkw), *R.attention_backward(do, q, k, v, return_dbias=rd, **fkw))
        low = (*R.attention_forward(q, k, v, precision="low", **fkw),
               *R.attention_backward(do, q, k, v, precision="low", return_dbias=rd, **fkw))
        tol = 1e-2 if dtype == np.float16 else 3e-2
        names = ("o", "lse", "dq", "dk", "dv", "dbias")
        for name, a, b in zip(names, ref, low):
            fin = np.isfinite(a)
            np.testing.assert_array_equal(fin, np.isfinite(b))
            rel = np.linalg.norm(a[fin] - b[fin]) / np.linalg.norm(a[fin])
            assert 0 < rel < tol, (name, rel)
        for x in (low[0], *low[2:5]):  # representable in the input dtype
            np.testing.assert_array_equal(x.astype(dtype).astype(np.float64), x)
        if rd:  # dbias in the bias's dtype
            np.testing.assert_array_equal(low[5].astype(bias.dtype).astype(np.float64), low[5])


def test_seqlen_one_and_varlen_max_seqlen_padding():
    rng = _rng("one")
    q, k, v, do = make(rng, 1, 1, 1, 2, 2, 32, 32)
    o, lse = R.attention_forward(q, k, v, causal=True)
    np.testing.assert_allclose(o, v, rtol=1e-14)
    g = R.attention_backward(do, q, k, v, causal=True)
    # softmax of one element is constant: dS = P (dP - D) is 0 up to float64 rounding (dP is a
    # GEMM, D a row sum: their summation orders differ, so exact zeros depend on the BLAS)
    np.testing.assert_allclose(g[0], 0, atol=1e-13)
    np.testing.assert_allclose(g[1], 0, atol=1e-13)
    np.testing.assert_allclose(g[2], do)
    # max_seqlen larger than the longest sequence: lse padded with -inf
    q, k, v, do, kw = make_varlen(rng, [2, 3], [3, 1], 2, 1, 8, 8)
    o, lse = R.attention_forward(q, k, v, max_seqlen_q=6, max_seqlen_k=4, **kw)
    assert lse.shape == (2, 2, 6) and np.all(np.isneginf(lse[:, :, 3:]))
    o2, lse2 = R.attention_forward(q, k, v, **kw)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse[:, :, :3], lse2)
    # all sequences empty
    q, k, v, do, kw = make_varlen(rng, [0, 0], [0, 2], 2, 1, 8, 8)
    o, lse = R.attention_forward(q, k, v, **kw)
    assert o.shape == (0, 2, 8) and lse.shape == (2, 2, 0)
    dq, dk, dv = R.attention_backward(do, q, k, v, **kw)
    assert dq.shape == (0, 2, 8) and np.all(dk == 0) and np.all(dv == 0)


def test_inputs_untouched():
    rng = _rng("untouched")
    q, k, v, do, kw = make_varlen(rng, [3, 2], [2, 4], 2, 1, 8, 8, dtype=np.float32)
    bias = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    cq, ck = kw["cu_seqlens_q"].copy(), kw["cu_seqlens_k"].copy()
    copies = [x.copy() for x in (q, k, v, do, bias)]
    R.attention_backward(do, q, k, v, bias=bias, return_dbias=True, dropout_p=0.5, precision="low", **kw)
    for a, b in zip((q, k, v, do, bias), copies):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(kw["cu_seqlens_q"], cq)
    np.testing.assert_array_equal(kw["cu_seqlens_k"], ck)


# --------------------------------------------------------------------------- input checks


def test_reference_feature_errors():
    rng = _rng("errors")
    q, k, v, do = make(rng, 2, 5, 6, 4, 2, 8, 8)
    f = R.attention_forward
    cases = [
        (ValueError, "dropout_p", dict(dropout_p=1.0)),
        (ValueError, "dropout_p", dict(dropout_p=-0.1)),
        (ValueError, "dropout_p", dict(dropout_p=float("nan"))),
        (TypeError, "dropout_p", dict(dropout_p="0.1")),
        (ValueError, "seed", dict(dropout_p=0.1, seed=-1)),
        (ValueError, "seed", dict(seed=2**64)),
        (TypeError, "seed", dict(seed=1.5)),
        (ValueError, "offset", dict(offset=2**64)),
        (TypeError, "offset", dict(offset=True)),
        (ValueError, r"bias: shape \(2, 4, 5, 5\) is not broadcastable.*seqlen_k", dict(bias=np.zeros((2, 4, 5, 5)))),
        (ValueError, r"bias:.*batch dimension is 3", dict(bias=np.zeros((3, 1, 5, 6)))),
        (ValueError, r"bias: expected rank 1 to 4", dict(bias=np.zeros((1, 2, 4, 5, 6)))),
        (TypeError, r"bias: expected a floating-point", dict(bias=np.zeros((5, 6), np.int32))),
        (TypeError, r"bias: expected a (CuPy or )?NumPy array", dict(bias=[[0.0] * 6] * 5)),
        (ValueError, r"alibi_slopes: expected shape", dict(alibi_slopes=np.zeros(2, np.float32))),
        (ValueError, r"alibi_slopes: expected shape", dict(alibi_slopes=np.zeros((3, 4), np.float32))),
        (ValueError, r"bias, alibi_slopes", dict(bias=np.zeros((5, 6)), alibi_slopes=np.zeros(4, np.float32))),
        (TypeError, "return_dropout_mask", dict(return_dropout_mask=1)),
        (ValueError, "cu_seqlens_q: variable-length inputs need layout='thd'", dict(cu_seqlens_q=np.array([0, 5], np.int32))),
        (ValueError, "max_seqlen_k", dict(max_seqlen_k=6)),
    ]
    for exc, pat, kw in cases:
        with pytest.raises(exc, match=pat):
            f(q, k, v, **kw)
    with pytest.raises(ValueError, match="return_dbias"):
        R.attention_backward(do, q, k, v, return_dbias=True)
    with pytest.raises(ValueError, match="return_dbias"):
        R.attention_backward(do, q, k, v, return_dbias=True, alibi_slopes=np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="return_dbias"):
        R.attention_backward(do, q, k, v, return_dbias="yes", bias=np.zeros((5, 6)))


def test_varlen_errors():
    rng = _rng("varlen-errors")
    q, k, v, do, kw = make_varlen(rng, [3, 2], [4, 1], 4, 2, 8, 8)
    cq = kw["cu_seqlens_q"]
    f = lambda **o: R.attention_forward(q, k, v, **{**kw, **o})  # noqa: E731
    cases = [
        (TypeError, "cu_seqlens_q: expected dtype int32", dict(cu_seqlens_q=cq.astype(np.int64))),
        (TypeError, "cu_seqlens_k: expected an int32 array", dict(cu_seqlens_k=[0, 4, 5])),
        (ValueError, "cu_seqlens_q: expected a rank-1", dict(cu_seqlens_q=cq[None])),
        (ValueError, "cu_seqlens_q: expected a rank-1", dict(cu_seqlens_q=cq[:1])),
        (ValueError, "cu_seqlens_q: must start at 0", dict(cu_seqlens_q=np.array([1, 3, 5], np.int32))),
        (ValueError, "cu_seqlens_k: must be non-decreasing", dict(cu_seqlens_k=np.array([0, 4, 3, 5], np.int32))),
        (ValueError, "cu_seqlens_q: last value 4 does not match the packed length 5",
         dict(cu_seqlens_q=np.array([0, 3, 4], np.int32))),
        (ValueError, "cu_seqlens_k: 4 entries but cu_seqlens_q has 3", dict(cu_seqlens_k=np.array([0, 4, 4, 5], np.int32))),
        (ValueError, "cu_seqlens_k: layout 'thd' needs", dict(cu_seqlens_k=None)),
        (ValueError, "max_seqlen_q: 2 is less than the longest sequence", dict(max_seqlen_q=2)),
        (TypeError, "max_seqlen_k", dict(max_seqlen_k=4.0)),
        (ValueError, "bias:.*seqlen_q dimension is 4", dict(bias=np.zeros((2, 4, 4, 4)))),
        (ValueError, "alibi_slopes", dict(alibi_slopes=np.zeros((1, 4), np.float32))),
    ]
    for exc, pat, o in cases:
        with pytest.raises(exc, match=pat):
            f(**o)
    with pytest.raises(ValueError, match="k: number of heads 3"):
        R.attention_forward(q, np.zeros((5, 3, 8)), np.zeros((5, 3, 8)), **kw)
    with pytest.raises(ValueError, match="do: expected shape"):
        R.attention_backward(do[:, :2], q, k, v, **kw)
    with pytest.raises(ValueError, match="q: expected a rank-3"):
        R.attention_forward(q[None], k, v, **kw)
    # bias sized for a given max_seqlen is accepted
    R.attention_forward(q, k, v, bias=np.zeros((1, 1, 6, 4)), max_seqlen_q=6, **kw)


def test_strict_checks_for_the_gpu_api():
    """The new check functions in their default (GPU API) mode."""
    f16 = np.float16
    # bias: fp16 / bf16 / fp32 (bf16 bits as uint16 with dtype='bfloat16'); not float64
    for dt in (f16, BF16, np.float32):
        assert check_bias(np.zeros((1, 1, 5, 6), dt), 2, 4, 5, 6) == np.dtype(dt)
    assert check_bias(np.zeros((5, 6), np.uint16), 2, 4, 5, 6, dtype="bfloat16") == np.dtype(BF16)
    with pytest.raises(TypeError, match="bias: got a uint16"):
        check_bias(np.zeros((5, 6), np.uint16), 2, 4, 5, 6)
    with pytest.raises(TypeError, match="bias: expected float16, bfloat16 or float32"):
        check_bias(np.zeros((5, 6)), 2, 4, 5, 6)
    # alibi: float32 only
    assert check_alibi_slopes(np.zeros(4, np.float32), 2, 4) == (4,)
    assert check_alibi_slopes(np.zeros((2, 4), np.float32), 2, 4) == (2, 4)
    with pytest.raises(TypeError, match="alibi_slopes: expected float32"):
        check_alibi_slopes(np.zeros(4), 2, 4)
    # dropout
    d = check_dropout(0.2, np.uint64(2**64 - 1), 7)
    assert (d.p, d.seed, d.offset, d.threshold, d.enabled) == (0.2, 2**64 - 1, 7, 205, True)
    assert not check_dropout().enabled and check_dropout().threshold == 256
    # cu_seqlens
    assert check_cu_seqlens("cu_seqlens_q", np.array([0, 0, 3, 3], np.int32), 3) == (0, 0, 3, 3)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected 3 entries"):
        check_cu_seqlens("cu_seqlens_q", np.array([0, 0, 3, 3], np.int32), 3, batch=2)
    # varlen problem
    rng = _rng("strict")
    q, k, v, do, kw = make_varlen(rng, [3, 0, 2], [4, 1, 0], 4, 2, 16, 8, dtype=f16)
    o = do.copy()
    lse = np.zeros((3, 4, 3), np.float32)
    p = check_varlen_inputs(q, k, v, [("o", o), ("do", do)], lse=lse, causal=True,
                            cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"])
    assert isinstance(p, VarlenProblem)
    assert (p.batch, p.seqlens_q, p.seqlens_k, p.max_seqlen_q, p.max_seqlen_k) == (3, (3, 0, 2), (4, 1, 0), 3, 4)
    assert (p.total_q, p.total_k, p.nhead_q, p.group, p.hdim_q, p.hdim_v) == (5, 5, 4, 2, 16, 8)
    assert p.window(0) == p.mask.window(3, 4) and p.layout == "thd"
    cukw = dict(cu_seqlens_q=kw["cu_seqlens_q"], cu_seqlens_k=kw["cu_seqlens_k"])
    with pytest.raises(TypeError, match="q: expected float16 or bfloat16"):
        check_varlen_inputs(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), **cukw)
    with pytest.raises(ValueError, match="q: head dim must be a multiple of 8"):
        check_varlen_inputs(q[..., :12], k[..., :12], v, **cukw)
    with pytest.raises(ValueError, match=r"lse: expected shape \(3, 4, 3\)"):
        check_varlen_inputs(q, k, v, lse=lse[:, :, :2], **cukw)
    with pytest.raises(ValueError, match="layout: cu_seqlens_q/cu_seqlens_k need layout='thd'"):
        check_varlen_inputs(q, k, v, layout="bshd", **cukw)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        check_varlen_inputs(q, k, np.zeros((5, 2, 16), f16)[..., ::2], **cukw)


# ---------------------------------------------------------------------------------------------
# memory: the batch-wide keep mask only when it is asked for


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_forward_allocates_the_keep_mask_only_when_asked(p):
    import tracemalloc

    rng = np.random.default_rng(5)
    b, h, s, d = 64, 1, 128, 8  # the [b, h, s, s] bool mask (1 MiB) dwarfs one entry's work
    q, k, v = (rng.standard_normal((b, s, h, d)).astype(np.float16) for _ in range(3))
    kw = dict(dropout_p=p, seed=3, offset=1, precision="low")
    peaks = {}
    for want in (False, True):
        tracemalloc.start()
        res = R.attention_forward(q, k, v, return_dropout_mask=want, **kw)
        peaks[want] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if want:
            o2, l2, keep = res
        else:
            o1, l1 = res
    assert keep.shape == (b, h, s, s) and keep.dtype == bool
    assert keep.all() if p == 0.0 else 0.6 < keep.mean() < 0.8
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(l1, l2)
    assert peaks[True] - peaks[False] >= 0.9 * keep.nbytes, peaks
