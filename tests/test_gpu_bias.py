"""Elementwise bias and dBias on the GPU against the NumPy reference.

Marked ``gpu``: skipped without CuPy or a device (see conftest.py). Cases are hand-picked: the
bias shapes CK's CLI names ([1, 1, sq, sk], [1, h, sq, sk], [b, h, sq, sk]) plus [sq, sk], a
bias broadcast along the keys ([b, h, sq, 1]) and one broadcast along the rows ([h, 1, sk]);
bias dtypes fp16 / bf16 / fp32 under fp16 and bf16 inputs; masks 0 / t / b / windows; GQA;
head dims 64 and 128 (the wgmma kernels on sm_90), 96 (the ws forward rounds it up to 128, the
backward is mma.sync) and 32 / 256 / 192x128 (mma.sync: the bias tile does not fit beside the
wider ws tiles);
unaligned lengths. The bias instances are compiled with ``-D BIAS=1`` (one per (dtype, hdims)).

Judging: :func:`cupy_fmha.verify.compare` against the float64 reference and the emulated
same-precision reference (``precision="low"``), dBias included. Outputs go into NaN-poisoned
``out=`` buffers, so elements a kernel fails to write fail the comparison; dBias is always a
fresh array, reduced from a zeroed workspace.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # the conftest hook skips these tests without a device; this keeps collection clean
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

import cupy_fmha
from conftest import BF16, BIAS_SHAPES, F16, F32, BiasInputs, check, run, seed_for
from cupy_fmha import reference as R
from cupy_fmha.verify import compare

pytestmark = pytest.mark.gpu


def _run(pb, kw, dbias=True, bias=None):
    """:func:`conftest.run` with the bias (``pb.dev_bias`` unless given), dbias by default."""
    return run(pb, kw, bias=pb.dev_bias if bias is None else bias, dbias=dbias)


# id: (dtype, bias dtype, layout, b, sq, sk, hq, hk, d, dv, bias shape, mask kwargs, dbias)
CASES = {
    # head dims 64 / 128: the wgmma kernels on sm_90
    "f16-b16-d64-11-none-253x130": (F16, F16, "bshd", 2, 253, 130, 4, 4, 64, 64, "11", {}, True),
    "f16-b32-d64-1h-t-gqa2": (F16, F32, "bshd", 2, 253, 253, 4, 2, 64, 64, "1h", {"mask": "t"}, True),
    "f16-bbf-d64-bh-b-130x253": (F16, BF16, "bhsd", 2, 130, 253, 4, 4, 64, 64, "bh", {"mask": "b"}, True),
    "f16-b16-d64-2d-t:64,16-500": (F16, F16, "bshd", 1, 500, 500, 4, 2, 64, 64, "2d", {"mask": "t:64,16"}, True),
    "f16-b32-d64-lastb-none": (F16, F32, "bshd", 2, 253, 130, 2, 2, 64, 64, "lastb", {}, True),
    "f16-b16-d64-1h-causal-1000-gqa2": (F16, F16, "bshd", 1, 1000, 1000, 4, 2, 64, 64, "1h", {"causal": True}, True),
    "bf16-bbf-d128-11-none-253x130": (BF16, BF16, "bshd", 2, 253, 130, 4, 4, 128, 128, "11", {}, True),
    "bf16-b32-d128-1h-b-500x253-gqa2": (BF16, F32, "bhsd", 1, 500, 253, 4, 2, 128, 128, "1h", {"mask": "b"}, True),
    "bf16-b16-d128-bh-t:32,8-130x253": (BF16, F16, "bshd", 2, 130, 253, 2, 2, 128, 128, "bh", {"mask": "t:32,8"}, True),
    "bf16-bbf-d128-2d-t-253": (BF16, BF16, "bshd", 1, 253, 253, 4, 4, 128, 128, "2d", {"mask": "t"}, True),
    "bf16-bbf-d128-rows-b:20,0": (BF16, BF16, "bshd", 2, 253, 130, 2, 2, 128, 128, "rows", {"mask": "b:20,0"}, True),
    "bf16-b16-d128-bh-xb:64-17x500-nodbias": (BF16, F16, "bshd", 1, 17, 500, 4, 4, 128, 128, "bh", {"mask": "xb:64"}, False),
    # mma.sync head dims
    "f16-b16-d32-bh-none-253x130": (F16, F16, "bshd", 2, 253, 130, 4, 4, 32, 32, "bh", {}, True),
    "f16-bbf-d32-11-t-gqa2": (F16, BF16, "bshd", 1, 253, 253, 4, 2, 32, 32, "11", {"mask": "t"}, True),
    "f16-b32-d96-1h-b-130x253": (F16, F32, "bshd", 2, 130, 253, 2, 2, 96, 96, "1h", {"mask": "b"}, True),
    "bf16-bbf-d96-2d-t:50,10-bhsd": (BF16, BF16, "bhsd", 1, 253, 253, 2, 2, 96, 96, "2d", {"mask": "t:50,10"}, True),
    "f16-b16-d256-bh-none-253x130": (F16, F16, "bshd", 1, 253, 130, 2, 2, 256, 256, "bh", {}, True),
    "bf16-b32-d256-1h-t-gqa2": (BF16, F32, "bshd", 2, 130, 253, 2, 1, 256, 256, "1h", {"mask": "t"}, True),
    "bf16-bbf-d256-lastb-b": (BF16, BF16, "bshd", 1, 253, 253, 2, 2, 256, 256, "lastb", {"mask": "b"}, True),
    "f16-b32-d192x128-11-none": (F16, F32, "bshd", 2, 253, 130, 2, 2, 192, 128, "11", {}, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bias_matches_reference(case):
    dtype, bdt, layout, b, sq, sk, hq, hk, d, dv, kind, mkw, dbias = CASES[case]
    shape = BIAS_SHAPES[kind](b, hq, sq, sk)
    pb = BiasInputs(dtype, bdt, layout, b, sq, sk, hq, hk, d, dv, shape, seed_for(case))
    before = {n: x.copy() for n, x in pb.dev.items()}
    bias_before = pb.dev_bias.copy()
    kw = dict(mkw, layout=layout)
    o, lse, g = _run(pb, kw, dbias=dbias)
    check(pb, o, lse, g, kw, dbias=dbias)
    for n, x in pb.dev.items():  # inputs untouched
        assert bool((x == before[n]).all()), n
    if isinstance(bias_before, cp.ndarray):
        assert bool((pb.dev_bias.view(cp.uint8) == bias_before.view(cp.uint8)).all())


@pytest.mark.parametrize("d", [64, 96])
def test_strided_bias_and_deterministic_dbias(d):
    # a transposed (non-contiguous) device view must give bit-identical results to a contiguous
    # copy, and dBias (plain stores + one CuPy reduction) is the same on every run
    b, sq, sk, h = 2, 253, 130, 2
    pb = BiasInputs(F16, F32, "bshd", b, sq, sk, h, h, d, d, (1, h, sq, sk), seed_for("strided", d))
    view = cp.ascontiguousarray(cp.asarray(pb.bias).transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert not view.flags.c_contiguous and view.shape == pb.bias.shape
    kw = {"mask": "t", "layout": "bshd"}
    o1, lse1, g1 = _run(pb, kw, bias=view)
    o2, lse2, g2 = _run(pb, kw)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())
    assert bool((g1.dk == g2.dk).all()) and bool((g1.dv == g2.dv).all())
    assert bool((g1.dbias == g2.dbias).all())
    _, _, g3 = _run(pb, kw)
    assert bool((g3.dbias == g2.dbias).all())
    check(pb, o1, lse1, g1, kw, dbias=True)


@pytest.mark.parametrize("d", [64, 128, 96])
def test_large_negative_bias(d):
    # -120 (plus a little noise) on every key: every row's lse is below -100; the backward must
    # recompute P exactly as the forward did and give finite, correct gradients
    b, sq, sk, h = 1, 253, 130, 2
    rng = np.random.default_rng(seed_for("neg", d))
    bias = -120.0 + 0.5 * rng.standard_normal((sq, sk))
    pb = BiasInputs(F16, F32, "bshd", b, sq, sk, h, h, d, d, None, seed_for("neg-in", d), bias_host=bias)
    kw = {"layout": "bshd"}
    o, lse, g = _run(pb, kw)
    lse_h = cp.asnumpy(lse)
    assert np.all(lse_h < -100) and np.all(np.isfinite(lse_h))
    for x in (g.dq, g.dk, g.dv):
        assert np.all(np.isfinite(cp.asnumpy(x).astype(np.float32)))
    assert np.all(np.isfinite(cp.asnumpy(g.dbias)))
    check(pb, o, lse, g, kw, dbias=True)


@pytest.mark.parametrize("d, dtype", [(64, F16), (128, BF16), (96, F16)])
def test_rows_without_keys_with_bias(d, dtype):
    # bottom-right causal with sq > sk: the first sq - sk rows see no key, bias or not
    b, sq, sk, h = 2, 253, 130, 2
    pb = BiasInputs(dtype, F32, "bshd", b, sq, sk, h, h, d, d, (b, h, sq, sk), seed_for("empty", d))
    kw = {"mask": "b", "layout": "bshd"}
    o, lse, g = _run(pb, kw)
    outs = check(pb, o, lse, g, kw, dbias=True)
    n = sq - sk
    o_f, dq_f = outs["o"][0], outs["dq"][0]
    for name in ("o", "dq", "dk", "dv", "dbias"):
        assert not np.isnan(outs[name][0]).any(), name
    assert np.all(o_f[:, :n] == 0) and np.all(dq_f[:, :n] == 0)
    lse_h = cp.asnumpy(lse)
    assert np.all(np.isneginf(lse_h[:, :, :n])) and np.all(np.isfinite(lse_h[:, :, n:]))
    assert np.all(outs["dbias"][0][:, :, :n] == 0)


def test_minus_inf_bias_acts_as_a_mask():
    # -inf above the diagonal is the top-left causal mask
    b, s, h, d = 1, 253, 2, 64
    tri = np.where(np.arange(s)[None, :] > np.arange(s)[:, None], -np.inf, 0.0)
    pb = BiasInputs(F16, F16, "bshd", b, s, s, h, h, d, d, None, seed_for("inf"), bias_host=tri)
    o1, lse1, g1 = _run(pb, {"layout": "bshd"})
    outs = check(pb, o1, lse1, g1, {"layout": "bshd"}, dbias=True)
    ref_o, ref_lse = R.attention_forward(pb.host["q"], pb.host["k"], pb.host["v"], mask="t")
    assert compare("o", outs["o"][0], ref_o, dtype=F16, hdim_q=d, hdim_v=d).ok
    assert np.all(outs["dbias"][0][tri == -np.inf] == 0)


def test_bias_validation_on_gpu_arrays():
    rng = np.random.default_rng(5)
    q = cp.asarray(rng.standard_normal((1, 16, 2, 64)).astype(np.float16))
    with pytest.raises(ValueError, match="bias"):
        cupy_fmha.attention_forward(q, q, q, bias=cp.zeros((1, 2, 16, 17), cp.float32))
    with pytest.raises(TypeError, match="bias"):
        cupy_fmha.attention_forward(q, q, q, bias=cp.zeros((16, 16), cp.uint16))  # bits need bf16
    with pytest.raises(ValueError, match="alibi_slopes"):
        cupy_fmha.attention_forward(q, q, q, bias=cp.zeros((16, 16), cp.float16),
                                    alibi_slopes=np.ones(2, np.float32))
    o, lse = cupy_fmha.attention_forward(q, q, q, bias=cp.zeros((16, 16), cp.float16))
    with pytest.raises(ValueError, match="return_dbias"):
        cupy_fmha.attention_backward(q, q, q, q, o, lse, return_dbias=True)
