"""Elementwise bias and dBias in group mode (layout "thd"), the parts that need no GPU.

* argument checks: a malformed bias is refused before any GPU use, naming the argument (and,
  for shapes, the max length it does not match);
* the host side of the GPU API, run against a stand-in for CuPy (NumPy arrays with a device
  pointer) that records the launches instead of running them: the bias kernel instances are
  picked, the argument tuples match the kernels' signatures, the bias's strides make the
  kernels' ``make_bias`` read ``bias[b, h, i, j]`` at positions local to each sequence, and
  the dS workspace, filled the way ``store_ds`` fills it (pitch = the max lengths), reduces to
  the reference's dBias;
* the NumPy reference: group mode with a bias equals the batch reference run per sequence on
  the bias's top-left corner, and dBias is the per-sequence dS summed over the broadcast
  dimensions, 0 outside every sequence's corner.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api
from cupy_fmha import reference as R

BF16 = np.dtype(ml_dtypes.bfloat16)
LQ, LK = (5, 0, 7, 3), (4, 3, 0, 6)  # an empty q and an empty k sequence in the middle
HQ, HK, D = 2, 1, 32
B, MQ, MK = len(LQ), max(LQ), max(LK)


def _cu(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _packed(lq=LQ, lk=LK, hq=HQ, hk=HK, d=D, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(lq), hq, d)).astype(dtype)
    k = rng.standard_normal((sum(lk), hk, d)).astype(dtype)
    v = rng.standard_normal((sum(lk), hk, d)).astype(dtype)
    do = rng.standard_normal((sum(lq), hq, d)).astype(dtype)
    return q, k, v, do, dict(layout="thd", cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk))


def _fwd(bias, **extra):
    q, k, v, _, kw = _packed()
    return cupy_fmha.attention_forward(q, k, v, bias=bias, **kw, **extra)


def _bwd(bias, **extra):
    q, k, v, do, kw = _packed()
    lse = np.zeros((B, HQ, extra.get("max_seqlen_q", MQ)), np.float32)
    return cupy_fmha.attention_backward(do, q, k, v, do, lse, bias=bias, **kw, **extra)


def _gpu_usable() -> bool:
    try:
        api._cupy()
        return True
    except RuntimeError:
        return False


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize("call", [_fwd, _bwd])
@pytest.mark.parametrize(
    "bias, exc, words",
    [
        (np.zeros((B, HQ, MQ, MK + 1), np.float32), ValueError, "max_seqlen_k dimension is 7"),
        (np.zeros((B, HQ, MQ - 1, MK), np.float32), ValueError, "max_seqlen_q dimension is 6"),
        (np.zeros((B + 1, HQ, MQ, MK), np.float32), ValueError, "batch dimension is 5"),
        (np.zeros((1, 3, MQ, MK), np.float32), ValueError, "nhead_q dimension is 3"),
        (np.zeros((MQ, 5), np.float16), ValueError, r"bias: shape \(7, 5\) is not broadcastable to "
                                                    r"\[batch, nhead_q, max_seqlen_q, max_seqlen_k\]"),
        (np.zeros((1, 1, 1, 1, MK), np.float32), ValueError, "bias: expected rank 1 to 4"),
        (np.zeros((MQ, MK), np.float64), TypeError, "bias: expected float16, bfloat16 or float32"),
        (np.zeros((MQ, MK), np.int32), TypeError, "bias"),
        (np.zeros((MQ, MK), np.uint16), TypeError, "bias: got a uint16 array"),
        ([[0.0] * MK] * MQ, TypeError, "bias: expected a CuPy or NumPy array"),
    ],
)
def test_bad_group_mode_bias_is_rejected_before_any_gpu_use(call, bias, exc, words):
    with pytest.raises(exc, match=words):
        call(bias)


@pytest.mark.parametrize("call", [_fwd, _bwd])
def test_group_mode_bias_follows_max_seqlen(call):
    # a bias of the natural max lengths no longer fits once max_seqlen_k is raised
    with pytest.raises(ValueError, match="max_seqlen_k dimension is 6 .expected 1 or 9"):
        call(np.zeros((B, HQ, MQ, MK), np.float32), max_seqlen_k=9)


@pytest.mark.parametrize("call", [_fwd, _bwd])
def test_group_mode_bias_and_alibi_together_rejected(call):
    with pytest.raises(ValueError, match="bias, alibi_slopes"):
        call(np.zeros((MQ, MK), np.float32), alibi_slopes=np.ones(HQ, np.float32))


def test_group_mode_return_dbias_needs_a_bias_and_a_bool():
    with pytest.raises(ValueError, match="return_dbias"):
        _bwd(None, return_dbias=True)
    with pytest.raises(ValueError, match="return_dbias"):
        _bwd(None, return_dbias=True, alibi_slopes=np.ones(HQ, np.float32))
    with pytest.raises(TypeError, match="return_dbias"):
        _bwd(np.zeros((MQ, MK), np.float32), return_dbias=1)


@pytest.mark.skipif(_gpu_usable(), reason="checks the no-GPU message")
@pytest.mark.parametrize("call", [_fwd, _bwd])
def test_valid_group_mode_bias_without_gpu_says_so(call):
    # no refusal any more: a valid bias gets as far as the GPU check
    with pytest.raises(RuntimeError, match="no usable CUDA GPU"):
        call(np.zeros((1, HQ, MQ, MK), np.float32))


# --------------------------------------------------------------------------- host side, fake CuPy


from fake_cupy import OtherDeviceArray, Recorder, fake_cupy as _fake_cupy  # noqa: E402


@pytest.fixture(params=["90", "80"])
def fake_gpu(request, monkeypatch):
    """The API with a stand-in CuPy on a compute capability 9.0 (wgmma kernels) or 8.0 device. The
    forward's per-element bias reads are what this file checks, so the warp-specialized forward
    (which loads the bias through TMA: tests/test_api_params_cpu.py) is switched off."""
    monkeypatch.setattr(api, "_cupy", lambda: _fake_cupy(request.param))
    monkeypatch.setattr(api, "_CC", {})  # (the device's compute capability is cached per device)
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "0")

    def install(hook=None):
        rec = Recorder(hook)
        monkeypatch.setattr(api, "get_function", rec)
        return rec

    return install


def _bias_read(a: dict, itemsize: int, b: int, h: int, sq: int, sk: int) -> np.ndarray:
    """What make_bias / ElemBias read for sequence b, head h: element b*sb + h*sh + i*sq + j*sk
    from the bias pointer, i < sq, j < sk (positions local to the sequence)."""
    base = a["bias"]
    st = [int(a[n]) * itemsize for n in ("bias_sb", "bias_sh", "bias_sq", "bias_sk")]
    full = np.lib.stride_tricks.as_strided(base, shape=(b + 1, h + 1, sq, sk), strides=st, writeable=False)
    return np.asarray(full[b, h])


def _bias_of(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x.astype(dtype)


SHAPES = {
    "11": (1, 1, MQ, MK),        # CK e:0
    "1h": (1, HQ, MQ, MK),       # CK e:1
    "bh": (B, HQ, MQ, MK),       # CK e:2
    "2d": (MQ, MK),
    "b1-rows": (B, 1, 1, MK),    # broadcast along heads and query rows
}


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("bias_dtype", [np.float16, BF16, np.float32])
def test_forward_launch_reads_each_sequences_corner(kind, bias_dtype, fake_gpu):
    rec = fake_gpu()
    q, k, v, _, kw = _packed(seed=1)
    bias = _bias_of(SHAPES[kind], bias_dtype, 2)
    cupy_fmha.attention_forward(q, k, v, bias=bias, causal=True, **kw)
    (launch,) = rec.launches
    spec, a = launch["spec"], launch["args"]
    assert spec.source.startswith("fmha_fwd") and spec.macro("BIAS") == 1
    assert (a["seqlen_q"], a["seqlen_k"]) == (MQ, MK)  # grid and LSE pitch: the max lengths
    assert int(a["bias_kind"]) == {np.dtype(np.float16): 1, BF16: 2, np.dtype(np.float32): 3}[np.dtype(bias_dtype)]
    bits = bias.view(np.uint16) if np.dtype(bias_dtype) == BF16 else bias
    full = np.broadcast_to(bits.reshape((1,) * (4 - bits.ndim) + bits.shape), (B, HQ, MQ, MK))
    for b in range(B):
        for h in range(HQ):
            got = _bias_read(a, bias.itemsize, b, h, LQ[b], LK[b])
            np.testing.assert_array_equal(got.view(bits.dtype), full[b, h, :LQ[b], :LK[b]])


def _reference_ds(q, k, v, do, kw, mkw):
    """Each sequence's dS in the top-left corner of a [B, HQ, MQ, MK] array (the reference's
    dBias of a full-shape bias), computed with a full-shape random bias."""
    full_bias = _bias_of((B, HQ, MQ, MK), np.float32, 3)
    *_, ds = R.attention_backward(do, q, k, v, bias=full_bias, return_dbias=True, **kw, **mkw)
    return full_bias, ds


def _store_ds_hook(ds_full):
    """Act as dq_dk_dv's store_ds: sequence b, head h, local (i, j) -> dbias_acc[((b * nhead_q +
    h) * pitch_q + i) * pitch_k + j], pitch = the max-length kernel arguments."""

    def hook(launch):
        a = launch["args"]
        if not launch["spec"].source.startswith("fmha_bwd_dq_dk_dv"):
            return
        acc = a["dbias_acc"]
        if isinstance(acc, np.uint64):
            assert int(acc) == 0
            return
        pq, pk, nh = int(a["seqlen_q"]), int(a["seqlen_k"]), launch["grid"][1]
        cq, ck = np.asarray(a["cu_seqlens_q"]), np.asarray(a["cu_seqlens_k"])
        flat = acc.reshape(-1)
        assert np.shares_memory(flat, acc)  # writes land in the workspace
        for b in range(len(cq) - 1):
            sq, sk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
            for h in range(nh):
                for i in range(sq):
                    base = ((b * nh + h) * pq + i) * pk
                    flat[base:base + sk] = ds_full[b, h, i, :sk]

    return hook


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("bias_dtype", [np.float16, BF16, np.float32])
def test_backward_dbias_workspace_and_reduction(kind, bias_dtype, fake_gpu):
    q, k, v, do, kw = _packed(seed=4)
    mkw = {"mask": "b:3,1"}
    _, ds_full = _reference_ds(q, k, v, do, kw, mkw)
    rec = fake_gpu(_store_ds_hook(ds_full))
    bias = _bias_of(SHAPES[kind], bias_dtype, 5)
    lse = np.zeros((B, HQ, MQ), np.float32)
    g = cupy_fmha.attention_backward(do, q, k, v, do, lse, bias=bias, return_dbias=True, **kw, **mkw)
    assert isinstance(g, cupy_fmha.AttentionGradsWithBias)
    (main,) = [x for x in rec.launches if x["spec"].source.startswith("fmha_bwd_dq_dk_dv")]
    a = main["args"]
    assert main["spec"].macro("BIAS") == 1
    assert (int(a["seqlen_q"]), int(a["seqlen_k"])) == (MQ, MK)
    assert a["dbias_acc"].shape == (B, HQ, MQ, MK) and a["dbias_acc"].dtype == np.float32
    assert a["bias"] is not None and int(a["bias_kind"]) > 0
    # the bias the backward reads is the forward's: each sequence's corner
    bits = bias.view(np.uint16) if np.dtype(bias_dtype) == BF16 else bias
    full = np.broadcast_to(bits.reshape((1,) * (4 - bits.ndim) + bits.shape), (B, HQ, MQ, MK))
    for b in range(B):
        got = _bias_read(a, bias.itemsize, b, HQ - 1, LQ[b], LK[b])
        np.testing.assert_array_equal(got.view(bits.dtype), full[b, HQ - 1, :LQ[b], :LK[b]])
    # dbias: the workspace summed over the broadcast dims, in the bias's shape and dtype
    assert g.dbias.shape == bias.shape and g.dbias.dtype == np.dtype(bias_dtype)  # bf16 natively
    shape4 = (1,) * (4 - bias.ndim) + bias.shape
    axes = tuple(i for i in range(4) if shape4[i] == 1)
    ref = ds_full.sum(axis=axes, keepdims=True).reshape(bias.shape)
    got = g.dbias.view(BF16) if np.dtype(bias_dtype) == BF16 else g.dbias
    tol = {np.dtype(np.float16): 2e-3, BF16: 1e-2, np.dtype(np.float32): 1e-6}[np.dtype(bias_dtype)]
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())
    if kind == "bh":  # outside every sequence's corner: exactly 0
        d64 = np.asarray(got, np.float64)
        for b in range(B):
            assert np.all(d64[b, :, LQ[b]:] == 0) and np.all(d64[b, :, :, LK[b]:] == 0)


def test_backward_without_dbias_passes_a_null_workspace(fake_gpu):
    rec = fake_gpu()
    q, k, v, do, kw = _packed(seed=6)
    g = cupy_fmha.attention_backward(do, q, k, v, do, np.zeros((B, HQ, MQ), np.float32),
                                     bias=_bias_of((MQ, MK), np.float32, 7), **kw)
    assert type(g) is cupy_fmha.AttentionGrads
    (main,) = [x for x in rec.launches if x["spec"].source.startswith("fmha_bwd_dq_dk_dv")]
    assert int(main["args"]["dbias_acc"]) == 0 and main["spec"].macro("BIAS") == 1


@pytest.mark.parametrize("bias_dtype", [np.float16, BF16, np.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_mode_dbias_of_a_full_bias_is_stored_directly(bias_dtype, causal, fake_gpu):
    """Batch mode, a bias that broadcasts along nothing: dq_dk_dv stores dS as dBias itself in the
    bias's dtype (BiasArg ds_kind 1 fp16 / 2 bf16 / 0 fp32; no fp32 workspace, no reduction), in an
    array zeroed only when the mask may skip blocks; a bias broadcast over the batch keeps the fp32
    workspace (ds_kind 0) and the reduction."""
    rng = np.random.default_rng(12)
    b, s, hq = 2, 9, HQ
    q, k, v, do = (rng.standard_normal((b, s, hq, D)).astype(np.float16) for _ in range(4))
    lse = np.zeros((b, hq, s), np.float32)
    ds_full = rng.standard_normal((b, hq, s, s)).astype(np.float32)
    store = np.dtype(bias_dtype)

    def hook(launch):
        if launch["spec"].source.startswith("fmha_bwd_dq_dk_dv"):
            a = launch["args"]
            acc, kind = a["dbias_acc"], int(a["bias_ds_kind"])
            if acc.dtype == np.float32:
                assert kind == 0
                acc.reshape(ds_full.shape)[...] = ds_full
            else:  # (dS rounded to the 16-bit dtype, as store_ds does)
                assert kind == {np.dtype(np.float16): 1, BF16: 2}[acc.dtype]
                acc.reshape(ds_full.shape)[...] = ds_full.astype(acc.dtype)
            hook.acc = acc

    rec = fake_gpu(hook)
    full = rng.standard_normal((b, hq, s, s)).astype(store)
    g = cupy_fmha.attention_backward(do, q, k, v, do, lse, bias=full, return_dbias=True, causal=causal)
    assert g.dbias.dtype == store and g.dbias.shape == full.shape and np.shares_memory(g.dbias, hook.acc)
    np.testing.assert_array_equal(g.dbias, ds_full.astype(store))
    (main,) = [x for x in rec.launches if x["spec"].source.startswith("fmha_bwd_dq_dk_dv")]
    assert int(main["args"]["bias_ds_kind"]) == {np.dtype(np.float16): 1, BF16: 2, np.dtype(np.float32): 0}[store]
    # broadcast over the batch: the fp32 workspace, reduced
    g = cupy_fmha.attention_backward(do, q, k, v, do, lse, bias=full[:1], return_dbias=True, causal=causal)
    assert int(rec.launches[-2]["args"]["bias_ds_kind"]) == 0 and hook.acc.dtype == np.float32
    np.testing.assert_allclose(g.dbias.astype(np.float32), ds_full.sum(axis=0, keepdims=True).astype(store).astype(np.float32))


def test_dbias_workspace_bytes():
    """backward_workspace_bytes counts the fp32 dS workspace only where dBias needs it: a broadcast
    bias or group mode, not a bias that broadcasts along nothing in batch mode."""
    ws = lambda **kw: cupy_fmha.backward_workspace_bytes(2, 4, 100, 300, 64, return_dbias=True, bias=True, **kw)["dbias"]
    assert ws() == ws(bias_shape=(1, 4, 100, 300)) == ws(bias_shape=(2, 4, 100, 300), group_mode=True) == 4 * 2 * 4 * 100 * 300
    assert ws(bias_shape=(2, 4, 100, 300)) == 0
    one = cupy_fmha.backward_workspace_bytes(1, 1, 100, 300, 64, return_dbias=True, bias=True, bias_shape=(100, 300))
    assert one["dbias"] == 0


def test_no_bias_keeps_the_plain_instances(fake_gpu):
    rec = fake_gpu()
    q, k, v, do, kw = _packed(seed=8)
    cupy_fmha.attention_forward(q, k, v, **kw)
    cupy_fmha.attention_backward(do, q, k, v, do, np.zeros((B, HQ, MQ), np.float32), **kw)
    for launch in rec.launches:
        assert launch["spec"].macro("BIAS") is None
        if "bias_kind" in launch["args"]:
            assert int(launch["args"]["bias_kind"]) == 0 and int(launch["args"]["bias"]) == 0


def test_deterministic_backward_with_dbias(fake_gpu):
    q, k, v, do, kw = _packed(seed=9)
    _, ds_full = _reference_ds(q, k, v, do, kw, {})
    rec = fake_gpu(_store_ds_hook(ds_full))
    bias = _bias_of((1, HQ, MQ, MK), np.float32, 10)
    g = cupy_fmha.attention_backward(do, q, k, v, do, np.zeros((B, HQ, MQ), np.float32), bias=bias,
                                     return_dbias=True, deterministic=True, **kw)
    (main,) = [x for x in rec.launches if x["spec"].source.startswith("fmha_bwd_dq_dk_dv")]
    assert int(main["args"]["dq_split_stride"]) > 0
    np.testing.assert_allclose(g.dbias, ds_full.sum(axis=0, keepdims=True), rtol=1e-6, atol=1e-6)


def test_bias_on_another_device_is_rejected_before_launch(fake_gpu):
    rec = fake_gpu()
    q, k, v, do, kw = _packed(seed=11)
    bias = _bias_of((MQ, MK), np.float32, 12).view(OtherDeviceArray)
    with pytest.raises(ValueError, match="bias: array is on GPU 1"):
        cupy_fmha.attention_forward(q, k, v, bias=bias, **kw)
    with pytest.raises(ValueError, match="bias: array is on GPU 1"):
        cupy_fmha.attention_backward(do, q, k, v, do, np.zeros((B, HQ, MQ), np.float32), bias=bias,
                                     return_dbias=True, **kw)
    assert rec.launches == []


def test_every_query_sequence_empty(fake_gpu):
    # max_seqlen_q = 0: no forward launch, the backward's main kernel gets a null dS workspace
    # (its CTAs find no query block), and dbias is all zeros in the bias's shape
    rec = fake_gpu()
    q, k, v, do, kw = _packed(lq=(0, 0), lk=(3, 4), seed=13)
    bias = _bias_of((1, HQ, 1, 4), np.float32, 14)
    o, lse = cupy_fmha.attention_forward(q, k, v, bias=bias, **kw)
    assert lse.shape == (2, HQ, 0)
    g = cupy_fmha.attention_backward(do, q, k, v, o, lse, bias=bias, return_dbias=True, **kw)
    assert g.dbias.shape == bias.shape and not np.asarray(g.dbias).any()
    assert not [x for x in rec.launches if x["spec"].source.startswith("fmha_fwd")]
    for x in rec.launches:
        if x["spec"].source.startswith("fmha_bwd_dq_dk_dv"):
            assert int(x["args"]["dbias_acc"]) == 0


# --------------------------------------------------------------------------- the NumPy reference

REF_SHAPES = {
    "11": lambda b, h, sq, sk: (1, 1, sq, sk),
    "1h": lambda b, h, sq, sk: (1, h, sq, sk),
    "bh": lambda b, h, sq, sk: (b, h, sq, sk),
    "2d": lambda b, h, sq, sk: (sq, sk),
    "keys": lambda b, h, sq, sk: (b, h, sq, 1),   # broadcast along the keys
    "rows": lambda b, h, sq, sk: (h, 1, sk),      # broadcast along the query rows
    "b1": lambda b, h, sq, sk: (b, 1, 1, 1),      # one value per sequence
}


@pytest.mark.parametrize("kind", list(REF_SHAPES))
@pytest.mark.parametrize("mkw", [{}, {"mask": "b"}, {"causal": True, "window_size": (2, -1)}, {"mask": "t:1,2"}],
                         ids=str)
def test_reference_group_bias_equals_per_sequence_batch_reference(kind, mkw):
    lq, lk = [5, 0, 7, 3, 4], [6, 2, 0, 3, 9]
    nb, hq, hk, d, dv = len(lq), 4, 2, 8, 5
    mq, mk = max(lq) + 1, max(lk) + 2  # max lengths above the longest: padding never read
    rng = np.random.default_rng(zlib.crc32(repr((kind, mkw)).encode()))
    q = rng.standard_normal((sum(lq), hq, d))
    k = rng.standard_normal((sum(lk), hk, d))
    v = rng.standard_normal((sum(lk), hk, dv))
    do = rng.standard_normal((sum(lq), hq, dv))
    bias = rng.standard_normal(REF_SHAPES[kind](nb, hq, mq, mk))
    kw = dict(layout="thd", cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk), max_seqlen_q=mq, max_seqlen_k=mk, **mkw)
    o, lse = R.attention_forward(q, k, v, bias=bias, **kw)
    dq, dk, dv_, db = R.attention_backward(do, q, k, v, bias=bias, return_dbias=True, **kw)
    assert db.shape == bias.shape
    b4 = np.broadcast_to(bias.reshape((1,) * (4 - bias.ndim) + bias.shape), (nb, hq, mq, mk))
    ds_full = np.zeros((nb, hq, mq, mk))  # per-sequence dS in each plane's corner
    cq, ck = _cu(lq), _cu(lk)
    for b in range(nb):
        rs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lq[b] == 0 or lk[b] == 0:
            continue
        one = np.ascontiguousarray(b4[b:b + 1, :, :lq[b], :lk[b]])
        ob, lb = R.attention_forward(q[None, rs], k[None, ks], v[None, ks], bias=one, **mkw)
        np.testing.assert_allclose(o[rs], ob[0], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(lse[b, :, :lq[b]], lb[0], rtol=1e-12, atol=1e-13)
        g = R.attention_backward(do[None, rs], q[None, rs], k[None, ks], v[None, ks], bias=one,
                                 return_dbias=True, **mkw)
        np.testing.assert_allclose(dq[rs], g[0][0], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(dk[ks], g[1][0], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(dv_[ks], g[2][0], rtol=1e-11, atol=1e-12)
        ds_full[b, :, :lq[b], :lk[b]] = g[3][0]
    # dBias: the per-sequence dS scattered into the corners, summed over the broadcast dims
    shape4 = (1,) * (4 - bias.ndim) + bias.shape
    axes = tuple(i for i in range(4) if shape4[i] == 1)
    want = ds_full.sum(axis=axes, keepdims=True).reshape(bias.shape)
    np.testing.assert_allclose(db, want, rtol=1e-11, atol=1e-12)
    if kind == "bh":
        for b in range(nb):
            assert np.all(db[b, :, lq[b]:] == 0) and np.all(db[b, :, :, lk[b]:] == 0)


def test_reference_group_bias_padding_is_never_read():
    # entries outside every sequence's corner may hold anything (here NaN and inf)
    lq, lk = [3, 0, 4], [5, 2, 1]
    rng = np.random.default_rng(21)
    q, k, v = (rng.standard_normal((sum(n), 2, 8)) for n in (lq, lk, lk))
    do = rng.standard_normal((sum(lq), 2, 8))
    kw = dict(layout="thd", cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk))
    clean = rng.standard_normal((3, 2, 4, 5))
    dirty = clean.copy()
    for b in range(3):
        dirty[b, :, lq[b]:] = np.nan
        dirty[b, :, :, lk[b]:] = np.inf
    o1, l1 = R.attention_forward(q, k, v, bias=clean, causal=True, **kw)
    o2, l2 = R.attention_forward(q, k, v, bias=dirty, causal=True, **kw)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(l1, l2)
    g1 = R.attention_backward(do, q, k, v, bias=clean, causal=True, return_dbias=True, **kw)
    g2 = R.attention_backward(do, q, k, v, bias=dirty, causal=True, return_dbias=True, **kw)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)


def test_reference_group_bias_shape_errors_name_the_max_lengths():
    lq, lk = [3, 0, 4], [5, 2, 1]
    q, k, v = (np.ones((sum(n), 2, 8)) for n in (lq, lk, lk))
    kw = dict(layout="thd", cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk))
    with pytest.raises(ValueError, match="max_seqlen_q dimension is 3"):
        R.attention_forward(q, k, v, bias=np.zeros((3, 2, 3, 5)), **kw)
    with pytest.raises(ValueError, match="max_seqlen_k dimension is 4"):
        R.attention_forward(q, k, v, bias=np.zeros((4, 4)), **kw)
