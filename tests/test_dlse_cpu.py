"""The lse cotangent (``dlse``) of the backward, on the CPU: the NumPy oracle's gradients with a
random dlse against central finite differences of L = sum(O * dO) + sum(LSE * dLSE) (float64, tiny
shapes: causal, a window, GQA, bias with dbias, ALiBi, dropout, rows that see no key, group mode),
dlse=None equal to dlse=zeros bit for bit, and the GPU API's handling on a stand-in CuPy
(tests/fake_cupy.py): bad dlse refused by name before anything is launched, the caller's arrays
untouched, and D - dlse reaching the dq_dk_dv launch (dlse subtracted from the D workspace after
dot_do_o, before dq_dk_dv)."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api
from cupy_fmha import reference as R
from conftest import cu_seqlens as cu
from fake_cupy import OtherDeviceArray, Recorder, _fake, delta_hook, fake_cupy
from fd import check_fd

BF16 = np.dtype(ml_dtypes.bfloat16)


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def check_fd_dlse(q, k, v, do, dlse, bias=None, **kw):
    """The reference backward with ``dlse`` (and dbias) vs central finite differences of
    L = sum(O * dO) + sum(LSE * dLSE), and the lse term seen in dq and dk."""
    grads = check_fd(q, k, v, do, bias, dlse=dlse, **kw)
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


GROUP_FD = {
    "window": dict(window_size=(1, 0)),
    "window-alibi": dict(window_size=(2, 0), alibi=True),
    "window-dropout": dict(window_size=(3, 0), dropout_p=0.25, seed=5, offset=3),
}


@pytest.mark.parametrize("case", list(GROUP_FD))
def test_reference_dlse_in_group_mode_with_a_sliding_window(case):
    """Group mode with a sliding window and GQA (ALiBi, dropout): an empty query sequence, an empty
    key sequence, rows the window leaves without keys (sequence 0's row 0) and max_seqlen_q past
    the longest sequence; the lse term against finite differences."""
    kw = dict(GROUP_FD[case])
    lq, lk = [4, 0, 3, 5], [3, 2, 0, 6]
    hq, hk = 4, 2
    rng = _rng("dlse-thd-window", case)
    q, k = rng.standard_normal((sum(lq), hq, 3)), rng.standard_normal((sum(lk), hk, 3))
    v, do = rng.standard_normal((sum(lk), hk, 2)), rng.standard_normal((sum(lq), hq, 2))
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = rng.uniform(0.1, 1.0, (hq,))
    kw.update(layout="thd", cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=6)
    _, lse = R.attention_forward(q, k, v, **kw)
    assert np.all(np.isneginf(lse[0, :, 0])) and np.all(np.isfinite(lse[0, :, 1:4]))
    g = check_fd_dlse(q, k, v, do, rng.standard_normal((4, hq, 6)), **kw)
    np.testing.assert_array_equal(g[0][4:7], 0)  # sequence 2 has no keys

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


# --------------------------------------------------------------------------- the GPU API, stand-in CuPy


@pytest.fixture(params=["90", "80", "gfx942"])
def rec(request, monkeypatch):
    """The stand-in CuPy for an sm_90, sm_80 or (cupy-rocm) gfx942 device and a launch recorder
    whose hook plays dot_do_o's part (``fake_cupy.delta_hook``; ``rec.seen[-1]`` the last dq_dk_dv
    launch's record)."""
    cp = fake_cupy("94", "gfx942:sramecc+:xnack-") if request.param == "gfx942" else fake_cupy(request.param)
    monkeypatch.setattr(api, "_cupy", lambda: cp)
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    seen: list = []
    r = Recorder(hook=delta_hook(seen))
    r.seen = seen
    monkeypatch.setattr(api, "get_function", r)
    from cupy_fmha.backends import tma
    monkeypatch.setattr(tma, "encode_tile_map", lambda args: np.zeros(1, np.dtype((np.void, 128))))
    return r


def _api_inputs(b=2, sq=37, sk=53, hq=4, hk=2, d=64, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    do = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    lse = rng.standard_normal((b, hq, sq)).astype(np.float32)
    return q, k, v, do, lse


@pytest.mark.parametrize("kind", ["numpy", "device", "strided-device"])
def test_api_subtracts_dlse_from_d_between_the_launches(rec, kind):
    q, k, v, do, lse = _api_inputs()
    rng = np.random.default_rng(5)
    host = rng.standard_normal((2, 4, 37)).astype(np.float32)
    if kind == "numpy":
        dlse = host.copy()
    elif kind == "device":
        dlse = _fake(host.copy())
    else:  # a strided view on the device: read in place by the elementwise subtraction
        wide = _fake(np.zeros((2, 4, 74), np.float32))
        wide[:, :, ::2] = host
        dlse = _fake(wide[:, :, ::2])
    before = np.array(dlse)
    cupy_fmha.attention_backward(do, q, k, v, do, lse, causal=True, dlse=dlse)
    kinds = [la["spec"].source for la in rec.launches]
    assert kinds[0] == "fmha_bwd_dot_do_o" and kinds[1].startswith("fmha_bwd_dq_dk_dv")
    np.testing.assert_array_equal(rec.seen[-1]["main"], rec.seen[-1]["dot"] - host)  # D - dlse, in float32
    assert rec.seen[-1]["main"].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(rec.seen[-1]["lse"]), lse)  # lse itself as it was
    np.testing.assert_array_equal(np.asarray(dlse), before)  # the caller's dlse untouched


def test_api_without_dlse_passes_d_unchanged(rec):
    q, k, v, do, lse = _api_inputs()
    cupy_fmha.attention_backward(do, q, k, v, do, lse)
    np.testing.assert_array_equal(rec.seen[-1]["main"], rec.seen[-1]["dot"])
    rec.launches.clear()
    cupy_fmha.attention_backward(do, q, k, v, do, lse, dlse=np.zeros((2, 4, 37), np.float32))
    np.testing.assert_array_equal(rec.seen[-1]["main"], rec.seen[-1]["dot"])


def test_api_dlse_in_group_mode(rec):
    """Group mode: dlse has lse's [batch, nhead_q, max_seqlen_q] shape; with dbias and GQA."""
    rng = np.random.default_rng(3)
    cu_q, cu_k = np.array([0, 29, 29, 50], np.int32), np.array([0, 0, 40, 70], np.int32)
    q = rng.standard_normal((50, 4, 64)).astype(np.float16)
    k, v = (rng.standard_normal((70, 2, 64)).astype(np.float16) for _ in range(2))
    lse = rng.standard_normal((3, 4, 30)).astype(np.float32)
    dlse = rng.standard_normal((3, 4, 30)).astype(np.float32)
    bias = rng.standard_normal((3, 1, 30, 40)).astype(np.float32)
    g = cupy_fmha.attention_backward(q, q, k, v, q, lse, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                     max_seqlen_q=30, causal=True, bias=bias, return_dbias=True, dlse=dlse)
    assert g.dbias.shape == bias.shape
    np.testing.assert_array_equal(rec.seen[-1]["main"], rec.seen[-1]["dot"] - dlse)
    with pytest.raises(ValueError, match=r"dlse: expected lse's shape \(3, 4, 30\) \[batch, nhead_q, max_seqlen_q\]"):
        cupy_fmha.attention_backward(q, q, k, v, q, lse, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                     max_seqlen_q=30, dlse=dlse[:, :, :29])


BAD_DLSE = [
    # (what, exception, message, dlse from lse)
    ("shape", ValueError, r"dlse: expected lse's shape \(2, 4, 37\) \[batch, nhead_q, seqlen_q\], got \(2, 4, 36\)",
     lambda lse: np.zeros((2, 4, 36), np.float32)),
    ("rank", ValueError, r"dlse: expected lse's shape \(2, 4, 37\) .*got \(2, 4, 37, 1\)",
     lambda lse: np.zeros((2, 4, 37, 1), np.float32)),
    ("float16", TypeError, r"dlse: expected float32 \(lse's dtype\), got dtype float16",
     lambda lse: lse.astype(np.float16)),
    ("float64", TypeError, r"dlse: expected float32 \(lse's dtype\), got dtype float64",
     lambda lse: lse.astype(np.float64)),
    ("bf16-bits", TypeError, r"dlse: expected float32 \(lse's dtype\), got dtype uint16",
     lambda lse: lse.astype(BF16).view(np.uint16)),
    ("list", TypeError, r"dlse: expected a float32 array .*got builtins.list", lambda lse: lse.tolist()),
    ("scalar", TypeError, r"dlse: expected a float32 array .*got builtins.float", lambda lse: 1.0),
    ("other-gpu", ValueError, r"dlse: array is on GPU 1 but .* is on GPU 0",
     lambda lse: np.zeros(lse.shape, np.float32).view(OtherDeviceArray)),
]


@pytest.mark.parametrize("what, exc, words, make", BAD_DLSE, ids=[b[0] for b in BAD_DLSE])
def test_api_refuses_a_bad_dlse_before_any_launch(rec, what, exc, words, make):
    q, k, v, do, lse = _api_inputs()
    q, k, v, do, lse = (_fake(x) for x in (q, k, v, do, lse))  # on the (stand-in) device: read in place
    snapshot = [np.array(x) for x in (q, k, v, do, lse)]
    dlse = make(np.asarray(lse))
    dlse_before = np.array(dlse, copy=True) if isinstance(dlse, np.ndarray) else dlse
    for _ in range(2):  # (the checks are memoized; a failure never is)
        with pytest.raises(exc, match=words):
            cupy_fmha.attention_backward(do, q, k, v, do, lse, causal=True, dlse=dlse)
    assert not rec.launches
    for x, before in zip((q, k, v, do, lse), snapshot):  # the caller's arrays untouched
        np.testing.assert_array_equal(np.asarray(x), before)
    if isinstance(dlse, np.ndarray):
        np.testing.assert_array_equal(np.asarray(dlse), dlse_before)


def test_api_checks_dlse_without_a_gpu(monkeypatch):
    """A bad dlse is named before CuPy or a device is looked for (as every other argument)."""

    def no_gpu():
        raise RuntimeError("no usable CUDA GPU (test)")

    monkeypatch.setattr(api, "_cupy", no_gpu)
    q, k, v, do, lse = _api_inputs()
    with pytest.raises(TypeError, match="dlse: expected float32"):
        api.attention_backward(do, q, k, v, do, lse, dlse=lse.astype(np.float16))
    with pytest.raises(RuntimeError, match="no usable CUDA GPU"):
        api.attention_backward(do, q, k, v, do, lse, dlse=lse)


def test_api_dlse_memoized_plan_tells_shapes_apart(rec):
    """The memoized checks key on dlse too: a good dlse does not let a bad one of another shape pass."""
    q, k, v, do, lse = _api_inputs()
    cupy_fmha.attention_backward(do, q, k, v, do, lse, dlse=np.zeros((2, 4, 37), np.float32))
    with pytest.raises(ValueError, match="dlse: expected lse's shape"):
        cupy_fmha.attention_backward(do, q, k, v, do, lse, dlse=np.zeros((2, 4, 1), np.float32))
    with pytest.raises(TypeError, match="dlse: expected float32"):
        cupy_fmha.attention_backward(do, q, k, v, do, lse, dlse=np.zeros((2, 4, 37), np.float64))


@pytest.mark.parametrize("into", ["dq", "dk"])
def test_api_refuses_out_sharing_memory_with_dlse(rec, into):
    """``out=`` buffers may not share memory with an input, and dlse is one (the README's output
    buffers, attention_backward's ``out``): a dq or dk buffer over dlse's memory was accepted, and
    the call then overwrote the caller's dlse ("not modified"). Refused by name, before a launch."""
    q, k, v, do, lse = (_fake(x) for x in _api_inputs())
    dq, dk, dv = (_fake(np.zeros(x.shape, x.dtype)) for x in (q, k, v))
    n = int(np.prod(lse.shape))
    dlse = (dq if into == "dq" else dk).reshape(-1).view(np.float32)[:n].reshape(lse.shape)
    dlse[...] = np.random.default_rng(4).standard_normal(lse.shape)
    before = np.array(dlse)
    with pytest.raises(ValueError, match=f"out: {into} shares memory with the input dlse"):
        cupy_fmha.attention_backward(do, q, k, v, do, lse, causal=True, dlse=dlse, out=(dq, dk, dv))
    assert not rec.launches
    np.testing.assert_array_equal(np.asarray(dlse), before)
    # a dlse of its own is fine with the same buffers
    cupy_fmha.attention_backward(do, q, k, v, do, lse, causal=True, dlse=_fake(before.copy()), out=(dq, dk, dv))
    np.testing.assert_array_equal(rec.seen[-1]["main"], rec.seen[-1]["dot"] - before)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (0 * inf, as documented)
def test_reference_non_finite_dlse_is_used_as_given():
    """NaN / inf in dlse (documented): used as given, never silently dropped. A NaN in a row that
    sees keys makes that row's dq NaN; an infinite entry in a row that sees no key (lse = -inf,
    P = 0 there) still gives NaN (0 * inf), so such rows want a 0 (JAX: mask lse before squaring
    it, not after); group mode never reads a sequence without keys, nor rows past a sequence."""
    rng = _rng("dlse-non-finite")
    q, k, v, do = _bshd(rng, 1, 5, 3, 2, 1, 4, 4)
    kw = dict(causal=True)  # bottom-right, sq > sk: rows 0 and 1 see no key
    _, lse = R.attention_forward(q, k, v, **kw)
    assert np.all(np.isneginf(lse[:, :, :2])) and np.all(np.isfinite(lse[:, :, 2:]))
    dlse = rng.standard_normal(lse.shape)
    nan = dlse.copy()
    nan[0, 1, 3] = np.nan
    g = R.attention_backward(do, q, k, v, dlse=nan, **kw)
    assert np.all(np.isnan(g[0][0, 3, 1])) and np.all(np.isfinite(g[0][0, 2]))
    zloss = 2 * lse  # the cotangent of sum(lse ** 2): -inf on the rows without keys
    assert not np.all(np.isfinite(R.attention_backward(do, q, k, v, dlse=zloss, **kw)[0]))
    masked = np.where(np.isfinite(lse), zloss, 0.0)
    g = R.attention_backward(do, q, k, v, dlse=masked, **kw)
    assert all(np.all(np.isfinite(x)) for x in g) and np.all(g[0][:, :2] == 0)
    # group mode: sequence 1 has rows but no keys, sequence 2 no rows; row 3 is past every sequence
    lq, lk = [2, 3, 0], [3, 0, 2]
    q, do = rng.standard_normal((5, 2, 4)), rng.standard_normal((5, 2, 4))
    k, v = rng.standard_normal((5, 1, 4)), rng.standard_normal((5, 1, 4))
    kw = dict(layout="thd", cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=4)
    dlse = rng.standard_normal((3, 2, 4))
    junk = dlse.copy()
    junk[1], junk[2], junk[:, :, 3] = np.nan, np.inf, -np.inf
    for a, b in zip(*(R.attention_backward(do, q, k, v, dlse=d, **kw) for d in (dlse, junk))):
        np.testing.assert_array_equal(a, b)
