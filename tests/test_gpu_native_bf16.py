"""Native bfloat16 and DLPack inputs on the GPU (issue 9, item 7), against the NumPy reference.

The contract: CuPy 14's bfloat16 arrays (dtype ``ml_dtypes.bfloat16``, from
``cupy.asarray(numpy_bf16)`` or ``x.astype(ml_dtypes.bfloat16)``) are accepted without
``dtype=`` and every output comes back in the input's dtype, so a backward takes its own
forward's outputs as they are; objects with ``__dlpack__`` (PyTorch tensors, JAX arrays) are
accepted directly and the outputs are CuPy arrays; uint16 bits with ``dtype="bfloat16"`` keep
working (uint16 outputs). Bias (bf16 native, or fp32 under bf16 inputs) and ALiBi slopes accept
the same, and dbias comes back in the bias's dtype.

Every case: fresh random inputs (:class:`conftest.Inputs` with ``bf16_bits=False``), lengths and
head dims that are not tile multiples (seqlen 77 / 131, hdim 64, 128, 72), outputs judged by
:func:`cupy_fmha.verify.compare` against the float64 and ``precision="low"`` references
(:func:`conftest.check`), once as the library allocates them and once through NaN-poisoned
``out=`` buffers (:func:`conftest.run`). Marked ``gpu``; the PyTorch tests also skip without
torch or without a CUDA build of it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

try:  # the conftest hook skips these tests without a device; this keeps collection clean
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

import cupy_fmha
from conftest import (BF16, F16, F32, LK, LQ, BiasInputs, Inputs, Packed, check, check_group, run,
                      seed_for)

pytestmark = pytest.mark.gpu

U16 = np.dtype(np.uint16)


def _native(inp, via):
    """Replace ``inp.dev`` by native bf16 CuPy arrays made ``via`` ``cupy.asarray`` of the NumPy
    ml_dtypes array (what :class:`conftest.Inputs` does with ``bf16_bits=False``) or
    ``.astype(ml_dtypes.bfloat16)`` of a float32 CuPy array (exact: the values are bf16 already)."""
    if via == "astype":
        inp.dev = {n: cp.asarray(x.astype(np.float32)).astype(ml_dtypes.bfloat16) for n, x in inp.host.items()}
    for n, x in inp.dev.items():
        assert isinstance(x, cp.ndarray) and x.dtype == BF16, (n, x.dtype)
    return inp


def _call(inp, kw, dev=None):
    """Forward then backward as a user writes them: no ``dtype=``, no ``out=``."""
    d = inp.dev if dev is None else dev
    o, lse = cupy_fmha.attention_forward(d["q"], d["k"], d["v"], **kw)
    g = cupy_fmha.attention_backward(d["do"], d["q"], d["k"], d["v"], o, lse, **kw)
    cp.cuda.get_current_stream().synchronize()
    return o, lse, g


def _assert_dtypes(o, lse, g, dtype):
    assert isinstance(o, cp.ndarray) and o.dtype == dtype, o.dtype
    assert isinstance(lse, cp.ndarray) and lse.dtype == cp.float32, lse.dtype
    for name, x in zip(("dq", "dk", "dv"), g):
        assert isinstance(x, cp.ndarray) and x.dtype == dtype, (name, x.dtype)


def _both_ways(inp, dtype, ref_kw, call_kw=None, run_kw=None, checker=check):
    """Forward and backward twice: as a user writes them (:func:`_call`, keywords ``call_kw``)
    and through NaN-poisoned ``out=`` buffers (:func:`conftest.run`, ``run_kw``); both default
    to ``ref_kw``, the keywords of the reference. Every output a CuPy array of ``dtype`` (lse
    float32) that passes ``checker``. Returns the two (o, lse, grads)."""
    results = []
    for go in (lambda: _call(inp, ref_kw if call_kw is None else call_kw),
               lambda: run(inp, ref_kw if run_kw is None else run_kw)):
        o, lse, g = go()
        _assert_dtypes(o, lse, g, dtype)
        checker(inp, o, lse, g, ref_kw)
        results.append((o, lse, g))
    return results


# --------------------------------------------------------------------------- (a) round trip

# id: (layout, b, sq, sk, hq, hk, d, mask kwargs, how the bf16 arrays are made)
ROUND_TRIP = {
    "d64-none-131x77": ("bshd", 2, 131, 77, 4, 4, 64, {}, "asarray"),
    "d64-causal-77x131-bhsd": ("bhsd", 2, 77, 131, 2, 2, 64, {"causal": True}, "astype"),
    "d128-causal-131-gqa2": ("bshd", 1, 131, 131, 4, 2, 128, {"causal": True}, "asarray"),
    "d128-none-77x131-bhsd": ("bhsd", 1, 77, 131, 2, 2, 128, {}, "astype"),
    "d72-causal-131x77": ("bshd", 2, 131, 77, 2, 2, 72, {"causal": True}, "asarray"),
    "d72-none-77x131": ("bshd", 1, 77, 131, 4, 4, 72, {}, "astype"),
}


@pytest.mark.parametrize("case", list(ROUND_TRIP))
def test_native_bf16_round_trip(case):
    layout, b, sq, sk, hq, hk, d, mkw, via = ROUND_TRIP[case]
    inp = _native(Inputs(BF16, layout, b, sq, sk, hq, hk, d, d, seed_for("native", case), bf16_bits=False), via)
    before = {n: x.copy() for n, x in inp.dev.items()}
    (o, lse, _), (o2, lse2, _) = _both_ways(inp, BF16, dict(mkw, layout=layout))
    assert bool((o2.view(cp.uint16) == o.view(cp.uint16)).all()) and bool((lse2 == lse).all())  # same kernel
    for n, x in inp.dev.items():  # inputs untouched
        assert bool((x.view(cp.uint16) == before[n].view(cp.uint16)).all()), n


@pytest.mark.parametrize("mkw", [{}, {"mask": "b"}], ids=["none", "causal-br"])
def test_native_bf16_group_mode(mkw):
    inp = Packed(BF16, LQ, LK, 4, 2, 72, 72, seed_for("native thd", str(mkw)), bf16_bits=False)
    _both_ways(inp, BF16, mkw, call_kw=inp.api_kw(mkw), checker=check_group)


def test_numpy_bf16_inputs_give_cupy_bf16():
    # NumPy ml_dtypes arrays are copied to the device; the outputs are native bf16 CuPy arrays
    inp = Inputs(BF16, "bshd", 1, 131, 77, 2, 2, 64, 64, seed_for("numpy bf16"), bf16_bits=False)
    o, lse, g = _call(inp, {"causal": True}, dev=inp.host)
    _assert_dtypes(o, lse, g, BF16)
    check(inp, o, lse, g, {"causal": True})


# --------------------------------------------------------------------------- (b) DLPack (PyTorch)


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return torch


def _to_torch(torch, x, dtype):
    """Host array (fp16 or bf16 values) -> CUDA tensor of ``dtype``, exactly (through float32)."""
    return torch.from_numpy(np.ascontiguousarray(x.astype(np.float32))).to(device="cuda", dtype=dtype)


# id: (dtype, layout, b, sq, sk, hq, hk, d, mask kwargs, variant): "plain" tensors; "packed-qkv",
# q, k, v as strided views of one [b, s, 3, h, d] tensor; "torch-o", the backward also gets o
# and lse back as torch tensors (all its array arguments are torch tensors)
DLPACK = {
    "bf16-d64-causal-131x77": (BF16, "bshd", 2, 131, 77, 4, 2, 64, {"causal": True}, "plain"),
    "bf16-d128-none-77x131-torch-o": (BF16, "bshd", 1, 77, 131, 2, 2, 128, {}, "torch-o"),
    "bf16-d72-none-131-packed-qkv": (BF16, "bshd", 1, 131, 131, 2, 2, 72, {}, "packed-qkv"),
    "f16-d64-none-131x77-bhsd": (F16, "bhsd", 2, 131, 77, 2, 2, 64, {}, "plain"),
    "f16-d128-causal-131-packed-qkv": (F16, "bshd", 1, 131, 131, 4, 4, 128, {"causal": True}, "packed-qkv"),
    "f16-d72-causal-77x131-torch-o": (F16, "bshd", 2, 77, 131, 2, 1, 72, {"causal": True}, "torch-o"),
}


@pytest.mark.parametrize("case", list(DLPACK))
def test_dlpack_torch_tensors(case):
    torch = _torch()
    dtype, layout, b, sq, sk, hq, hk, d, mkw, variant = DLPACK[case]
    tdt = torch.bfloat16 if dtype == BF16 else torch.float16
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, d, seed_for("dlpack", case), bf16_bits=False)
    if variant == "packed-qkv":
        qkv = torch.stack([_to_torch(torch, inp.host[n], tdt) for n in ("q", "k", "v")], dim=2)  # [b, s, 3, h, d]
        t = {"q": qkv[:, :, 0], "k": qkv[:, :, 1], "v": qkv[:, :, 2], "do": _to_torch(torch, inp.host["do"], tdt)}
        assert not t["q"].is_contiguous()
    else:
        t = {n: _to_torch(torch, x, tdt) for n, x in inp.host.items()}
    torch.cuda.synchronize()
    before = {n: x.clone() for n, x in t.items()}
    kw = dict(mkw, layout=layout)

    o, lse = cupy_fmha.attention_forward(t["q"], t["k"], t["v"], **kw)
    assert isinstance(o, cp.ndarray) and isinstance(lse, cp.ndarray)
    o_in, lse_in = (torch.from_dlpack(o), torch.from_dlpack(lse)) if variant == "torch-o" else (o, lse)
    g = cupy_fmha.attention_backward(t["do"], t["q"], t["k"], t["v"], o_in, lse_in, **kw)
    cp.cuda.get_current_stream().synchronize()
    torch.cuda.synchronize()

    _assert_dtypes(o, lse, g, dtype)
    check(inp, o, lse, g, kw)
    for n, x in t.items():  # the torch inputs are unchanged
        assert x.dtype == tdt and torch.equal(x, before[n]), n


def test_dlpack_torch_bias_and_slopes():
    # bias and ALiBi slopes accept torch tensors as well: a bf16 bias with return_dbias (dbias a
    # CuPy array of the bias's dtype), then float32 slopes
    torch = _torch()
    b, sq, sk, h, d = 2, 131, 77, 2, 64
    pb = BiasInputs(BF16, BF16, "bshd", b, sq, sk, h, h, d, d, (1, h, sq, sk), seed_for("dlpack bias"),
                    bf16_bits=False)
    t = {n: _to_torch(torch, x, torch.bfloat16) for n, x in pb.host.items()}
    bias = _to_torch(torch, pb.bias, torch.bfloat16)
    torch.cuda.synchronize()
    bias_before = bias.clone()
    kw = {"mask": "t", "layout": "bshd"}
    o, lse = cupy_fmha.attention_forward(t["q"], t["k"], t["v"], bias=bias, **kw)
    g = cupy_fmha.attention_backward(t["do"], t["q"], t["k"], t["v"], o, lse, bias=bias, return_dbias=True, **kw)
    cp.cuda.get_current_stream().synchronize()
    _assert_dtypes(o, lse, g[:3], BF16)
    assert isinstance(g.dbias, cp.ndarray) and g.dbias.dtype == BF16 and g.dbias.shape == pb.bias.shape
    check(pb, o, lse, g, kw, dbias=True)
    assert torch.equal(bias, bias_before)

    inp = Inputs(BF16, "bshd", b, sq, sk, h, h, d, d, seed_for("dlpack alibi"), bf16_bits=False)
    t = {n: _to_torch(torch, x, torch.bfloat16) for n, x in inp.host.items()}
    slopes = np.random.default_rng(seed_for("dlpack slopes")).uniform(0.01, 0.5, (b, h)).astype(np.float32)
    kw = {"causal": True, "layout": "bshd"}
    o, lse = cupy_fmha.attention_forward(t["q"], t["k"], t["v"], alibi_slopes=torch.from_numpy(slopes).cuda(), **kw)
    g = cupy_fmha.attention_backward(t["do"], t["q"], t["k"], t["v"], o, lse,
                                     alibi_slopes=torch.from_numpy(slopes).cuda(), **kw)
    cp.cuda.get_current_stream().synchronize()
    _assert_dtypes(o, lse, g, BF16)
    check(inp, o, lse, g, dict(kw, alibi_slopes=slopes))


# --------------------------------------------------------------------------- (c) bias and ALiBi

# id: (bias dtype, layout, b, sq, sk, hq, hk, d, bias shape, mask kwargs)
BIAS = {
    "bbf-d64-1h-causal-131x77": (BF16, "bshd", 2, 131, 77, 4, 2, 64, (1, 4, 131, 77), {"causal": True}),
    "bbf-d72-2d-none-77x131-bhsd": (BF16, "bhsd", 1, 77, 131, 2, 2, 72, (77, 131), {}),
    "b32-d128-bh-none-131x77-gqa2": (F32, "bshd", 2, 131, 77, 4, 2, 128, (2, 4, 131, 77), {}),
    "b32-d64-rows-t-77x131": (F32, "bshd", 1, 77, 131, 2, 2, 64, (2, 1, 131), {"mask": "t"}),
}


@pytest.mark.parametrize("case", list(BIAS))
def test_native_bf16_bias_and_dbias(case):
    bdt, layout, b, sq, sk, hq, hk, d, shape, mkw = BIAS[case]
    pb = BiasInputs(BF16, bdt, layout, b, sq, sk, hq, hk, d, d, shape, seed_for("native bias", case),
                    bf16_bits=False)
    assert isinstance(pb.dev_bias, cp.ndarray) and pb.dev_bias.dtype == bdt
    bias_before = pb.dev_bias.copy()
    kw = dict(mkw, layout=layout)
    # as a user writes it
    o, lse = cupy_fmha.attention_forward(pb.dev["q"], pb.dev["k"], pb.dev["v"], bias=pb.dev_bias, **kw)
    g = cupy_fmha.attention_backward(pb.dev["do"], pb.dev["q"], pb.dev["k"], pb.dev["v"], o, lse, bias=pb.dev_bias,
                                     return_dbias=True, **kw)
    cp.cuda.get_current_stream().synchronize()
    _assert_dtypes(o, lse, g[:3], BF16)
    assert isinstance(g.dbias, cp.ndarray) and g.dbias.dtype == bdt and g.dbias.shape == shape
    check(pb, o, lse, g, kw, dbias=True)
    # through poisoned out= buffers (run checks the type, shape and dtype of dbias)
    o2, lse2, g2 = run(pb, kw, bias=pb.dev_bias, dbias=True)
    check(pb, o2, lse2, g2, kw, dbias=True)
    assert bool((pb.dev_bias.view(cp.uint8) == bias_before.view(cp.uint8)).all())


# id: (layout, b, sq, sk, hq, hk, d, slopes per batch?, slopes on the device?, mask kwargs)
ALIBI = {
    "d64-causal-131x77-gqa2": ("bshd", 2, 131, 77, 4, 2, 64, False, False, {"causal": True}),
    "d128-none-77x131-per-batch-bhsd": ("bhsd", 2, 77, 131, 2, 2, 128, True, True, {}),
    "d72-b:20,0-131": ("bshd", 1, 131, 131, 2, 1, 72, False, True, {"mask": "b:20,0"}),
}


@pytest.mark.parametrize("case", list(ALIBI))
def test_native_bf16_alibi(case):
    layout, b, sq, sk, hq, hk, d, per_batch, on_device, mkw = ALIBI[case]
    inp = Inputs(BF16, layout, b, sq, sk, hq, hk, d, d, seed_for("native alibi", case), bf16_bits=False)
    slopes = np.random.default_rng(seed_for("native slopes", case)).uniform(
        0.01, 0.5, (b, hq) if per_batch else (hq,)).astype(np.float32)
    kw = dict(mkw, layout=layout)
    api_kw = dict(kw, alibi_slopes=cp.asarray(slopes) if on_device else slopes)
    _both_ways(inp, BF16, dict(kw, alibi_slopes=slopes), call_kw=api_kw, run_kw=api_kw)


# --------------------------------------------------------------------------- (d) uint16 bits


@pytest.mark.parametrize("d, mkw", [(64, {"causal": True}), (128, {}), (72, {"mask": "b"})],
                         ids=["d64-causal", "d128-none", "d72-causal-br"])
def test_bf16_bits_still_work(d, mkw):
    inp = Inputs(BF16, "bshd", 2, 131, 77, 4, 2, d, d, seed_for("bits", d), bf16_bits=True)
    assert inp.dev["q"].dtype == U16 and inp.dtype_arg == "bfloat16"
    kw = dict(mkw, layout="bshd")
    _both_ways(inp, U16, kw, call_kw=dict(kw, dtype="bfloat16"))  # run() passes dtype="bfloat16" itself


def test_bf16_bits_bias_gives_bits_dbias():
    pb = BiasInputs(BF16, BF16, "bshd", 1, 131, 77, 2, 2, 64, 64, (131, 77), seed_for("bits bias"))
    assert pb.dev_bias.dtype == U16
    kw = {"layout": "bshd", "mask": "b"}
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=True)  # checks dbias is uint16
    _assert_dtypes(o, lse, g[:3], U16)
    check(pb, o, lse, g, kw, dbias=True)
