"""The lse cotangent (``dlse``) of the backward, on the CPU: the NumPy oracle's gradients with a
random dlse against central finite differences of L = sum(O * dO) + sum(LSE * dLSE) (float64, tiny
shapes: causal, a window, GQA, bias with dbias, ALiBi, dropout, rows that see no key, group mode),
dlse=None equal to dlse=zeros bit for bit."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from cupy_fmha import reference as R

BF16 = np.dtype(ml_dtypes.bfloat16)


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _fd_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * eps)
    return g


def _lse_term(lse, dlse) -> float:
    """sum(lse * dlse) over the rows that see a key (lse = -inf elsewhere: the loss ignores them,
    and a perturbation of the inputs never gives such a row a key)."""
    fin = np.isfinite(lse)
    return float(np.sum(np.where(fin, lse, 0.0) * np.where(fin, dlse, 0.0)))


def check_fd_dlse(q, k, v, do, dlse, bias=None, **kw):
    """The reference backward with ``dlse`` (and dbias) vs central finite differences of
    L = sum(O * dO) + sum(LSE * dLSE)."""

    def loss():
        o, lse = R.attention_forward(q, k, v, bias=bias, **kw)
        return float(np.sum(o * do)) + _lse_term(lse, dlse)

    grads = R.attention_backward(do, q, k, v, bias=bias, return_dbias=bias is not None, dlse=dlse, **kw)
    named = [("q", q), ("k", k), ("v", v)] + ([("bias", bias)] if bias is not None else [])
    assert len(grads) == len(named)
    for (name, x), g in zip(named, grads):
        assert g.shape == x.shape and g.dtype == np.float64, name
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, _fd_grad(loss, x), rtol=1e-5, atol=1e-7, err_msg=f"d{name}")
    # the lse term changes the gradient (so the test could tell it was dropped): dq, dk (and dbias)
    plain = R.attention_backward(do, q, k, v, bias=bias, return_dbias=bias is not None, **kw)
    assert not np.allclose(grads[0], plain[0]) and not np.allclose(grads[1], plain[1])
    np.testing.assert_array_equal(grads[2], plain[2])  # dV does not see lse
    return grads


def _bshd(rng, b, sq, sk, hq, hk, d, dv):
    q = rng.standard_normal((b, sq, hq, d))
    k = rng.standard_normal((b, sk, hk, d))
    v = rng.standard_normal((b, sk, hk, dv))
    do = rng.standard_normal((b, sq, hq, dv))
    return q, k, v, do


# --------------------------------------------------------------------------- finite differences

FD_CASES = {
    "plain-mha": (dict(sq=4, sk=5, hq=2, hk=2), {}),
    "causal-gqa": (dict(sq=5, sk=5, hq=4, hk=2), dict(causal=True)),
    # bottom-right causal with sq > sk: rows 0 and 1 see no key (lse -inf, zero gradients)
    "causal-rows-without-keys": (dict(sq=5, sk=3, hq=2, hk=1), dict(causal=True)),
    "window-mqa": (dict(sq=6, sk=5, hq=3, hk=1), dict(window_size=(1, 1))),
    "bhsd-scale": (dict(sq=4, sk=6, hq=2, hk=1), dict(layout="bhsd", softmax_scale=0.6, mask="t:1,2")),
    "alibi": (dict(sq=4, sk=6, hq=2, hk=2), dict(alibi=True, mask="b")),
    "dropout": (dict(sq=5, sk=4, hq=2, hk=1), dict(dropout_p=0.3, seed=2**40 + 7, offset=11, causal=True)),
}


@pytest.mark.parametrize("case", list(FD_CASES))
def test_reference_dlse_matches_finite_differences(case):
    sizes, kw = FD_CASES[case]
    kw = dict(kw)
    rng = _rng("dlse", case)
    q, k, v, do = _bshd(rng, 2, sizes["sq"], sizes["sk"], sizes["hq"], sizes["hk"], 3, 2)
    if kw.get("layout") == "bhsd":
        q, k, v, do = (x.transpose(0, 2, 1, 3).copy() for x in (q, k, v, do))
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = rng.uniform(0.1, 1.0, (2, sizes["hq"]))
    dlse = rng.standard_normal((2, sizes["hq"], sizes["sq"]))
    grads = check_fd_dlse(q, k, v, do, dlse, **kw)
    if case == "causal-rows-without-keys":  # rows 0, 1 (no key) keep zero dq despite their dlse
        assert np.all(grads[0][:, :2] == 0) and np.all(dlse[:, :, :2] != 0)
    if "dropout_p" in kw:
        _, _, keep = R.attention_forward(q, k, v, return_dropout_mask=True, **kw)
        assert 0 < keep.mean() < 1


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 3, 4, 5), (4, 5), (2, 1, 1, 5)], ids=str)
def test_reference_dlse_with_bias_and_dbias(shape):
    rng = _rng("dlse-bias", shape)
    q, k, v, do = _bshd(rng, 2, 4, 5, 3, 1, 3, 2)
    bias = rng.standard_normal(shape)
    dlse = rng.standard_normal((2, 3, 4))
    g = check_fd_dlse(q, k, v, do, dlse, bias, causal=True, softmax_scale=0.8)
    plain = R.attention_backward(do, q, k, v, bias=bias, return_dbias=True, causal=True, softmax_scale=0.8)
    assert not np.allclose(g[3], plain[3])  # dbias = dS carries the lse term too


def test_reference_dlse_in_group_mode():
    """Group mode: dlse [batch, nhead_q, max_seqlen_q], entries past each sequence ignored; an empty
    query sequence, an empty key sequence (its rows see no key: zero dq) and a bias."""
    lq, lk = [3, 0, 2, 4], [4, 3, 0, 2]
    rng = _rng("dlse-thd")
    hq, hk = 4, 2
    tq, tk = sum(lq), sum(lk)
    q, k = rng.standard_normal((tq, hq, 3)), rng.standard_normal((tk, hk, 3))
    v, do = rng.standard_normal((tk, hk, 2)), rng.standard_normal((tq, hq, 2))
    cu = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)  # noqa: E731
    kw = dict(layout="thd", cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=5, causal=True)
    bias = rng.standard_normal((4, 1, 5, 4))
    dlse = rng.standard_normal((4, hq, 5))
    g = check_fd_dlse(q, k, v, do, dlse, bias, **kw)
    np.testing.assert_array_equal(g[0][5:7], 0)  # sequence 2 has no keys
    junk = dlse.copy()
    junk[:, :, 4] = 1e6  # past every sequence (the longest has 4 rows): never read
    junk[1] = np.nan  # sequence 1 has no rows
    for a, b in zip(g, R.attention_backward(do, q, k, v, bias=bias, return_dbias=True, dlse=junk, **kw)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("precision", ["float64", "low"])
@pytest.mark.parametrize("thd", [False, True])
def test_reference_dlse_none_equals_zeros_exactly(precision, thd):
    rng = _rng("dlse-zeros", precision, thd)
    if thd:
        q, k = rng.standard_normal((7, 2, 8)), rng.standard_normal((9, 1, 8))
        v, do = rng.standard_normal((9, 1, 8)), rng.standard_normal((7, 2, 8))
        cu_q, cu_k = np.array([0, 3, 7], np.int32), np.array([0, 5, 9], np.int32)
        kw = dict(layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
        zeros = np.zeros((2, 2, 4), np.float32)
    else:
        q, k, v, do = _bshd(rng, 2, 5, 6, 2, 1, 8, 8)
        kw = dict(window_size=(2, 0))
        zeros = np.zeros((2, 2, 5), np.float32)
    q, k, v, do = (x.astype(np.float16) for x in (q, k, v, do))
    bias = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    for extra in ({}, dict(bias=bias, return_dbias=True)) if not thd else ({},):
        a = R.attention_backward(do, q, k, v, precision=precision, **kw, **extra)
        b = R.attention_backward(do, q, k, v, precision=precision, dlse=zeros, **kw, **extra)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_reference_dlse_in_low_precision_tracks_float64():
    rng = _rng("dlse-low")
    q, k, v, do = (x.astype(np.float16) for x in _bshd(rng, 1, 9, 11, 2, 1, 16, 16))
    dlse = rng.standard_normal((1, 2, 9)).astype(np.float32)
    hi = R.attention_backward(do, q, k, v, causal=True, dlse=dlse)
    lo = R.attention_backward(do, q, k, v, causal=True, dlse=dlse, precision="low")
    plain = R.attention_backward(do, q, k, v, causal=True)
    for a, b, c in zip(hi, lo, plain):
        err, change = np.abs(a - b).max(), np.abs(a - c).max()
        assert err < 0.05 * max(change, 1e-3) or err < 2e-3, (err, change)


@pytest.mark.parametrize("bad, exc, words", [
    (lambda s: np.zeros(s[:2] + (s[2] + 1,)), ValueError, r"dlse: expected lse's shape \(2, 2, 5\)"),
    (lambda s: np.zeros(s[1:]), ValueError, r"dlse: expected lse's shape"),
    (lambda s: np.zeros(s, np.int32), TypeError, "dlse: expected a floating-point array, got dtype int32"),
    (lambda s: np.zeros(s).tolist(), TypeError, "dlse: expected a float array of lse's shape .* got builtins.list"),
])
def test_reference_refuses_a_bad_dlse(bad, exc, words):
    rng = _rng("dlse-bad")
    q, k, v, do = _bshd(rng, 2, 5, 6, 2, 1, 4, 4)
    with pytest.raises(exc, match=words):
        R.attention_backward(do, q, k, v, dlse=bad((2, 2, 5)))
    R.attention_backward(do, q, k, v, dlse=np.zeros((2, 2, 5), BF16))  # any float dtype, bf16 included


def test_reference_leaves_dlse_untouched():
    rng = _rng("dlse-untouched")
    q, k, v, do = _bshd(rng, 1, 4, 4, 2, 2, 4, 4)
    dlse = rng.standard_normal((1, 2, 4))
    before = dlse.copy()
    R.attention_backward(do, q, k, v, dlse=dlse, causal=True, precision="low")
    np.testing.assert_array_equal(dlse, before)
