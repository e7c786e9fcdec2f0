"""GPU API (cupy_fmha.attention_forward / attention_backward) against the NumPy reference.

Every test is marked ``gpu`` and skipped without CuPy or a device (see conftest.py). Cases are a
hand-picked list, not a cartesian product: kernels are JIT-compiled per (dtype, hdim_q, hdim_v),
so most mask / GQA / layout / seqlen variety is on fp16 hdim 64 and bf16 hdim 128, and every other
(dtype, hdim) appears in one to eight cases (17 distinct combinations in all; hdim 40, 72 and
104, multiples of 8 but not 16, in both dtypes at 131 x 77).

Judging: :func:`cupy_fmha.verify.compare` against the float64 reference and the emulated
same-precision reference (``precision="low"``). The backward with lse's cotangent (``dlse``) is
judged against the references run with the same dlse (fp16 / bf16, hdim 64 / 128, 77 x 133 and
133 x 77, causal and not, GQA, dropout, group mode, dBias), and each such case first shows that the
reference without it would fail. Outputs are poisoned: before each GPU call the
outputs are written into NaN-filled ``out=`` buffers, so elements a kernel fails to write stay NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # the conftest hook skips these tests without a device; this keeps collection clean
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

import cupy_fmha
from conftest import (BF16, BIAS_SHAPES, F16, LK2, LQ2, BiasInputs, Inputs, Packed, assert_close, check, check_group,
                      nan_block_in_pool, reference_outputs, run, seed_for)
from cupy_fmha import reference as R
from cupy_fmha.verify import compare, float_to_bf16_bits

pytestmark = pytest.mark.gpu


def _check_all(inp, o, lse, g, kw):
    """The shapes and dtypes of every output, then :func:`conftest.assert_close`."""
    outs = reference_outputs(inp, o, lse, g, kw)
    assert lse.dtype == cp.float32 and lse.shape == outs["lse"][1].shape
    assert o.shape == outs["o"][1].shape and o.dtype == inp.dev["q"].dtype
    h = inp.host
    assert g.dq.shape == h["q"].shape and g.dk.shape == h["k"].shape and g.dv.shape == h["v"].shape
    assert_close(inp, outs)
    return outs


# --------------------------------------------------------------------------- cases

# id: (dtype, layout, b, sq, sk, hq, hk, d, dv, mask kwargs)
CASES = {
    # fp16, hdim 64: masks, seqlens, GQA, layouts
    "f16-d64-none-253": (F16, "bshd", 2, 253, 253, 4, 4, 64, 64, {}),
    "f16-d64-t-500x1000-gqa2": (F16, "bshd", 1, 500, 1000, 4, 2, 64, 64, {"mask": "t"}),
    "f16-d64-b-1000x500-empty-rows": (F16, "bhsd", 1, 1000, 500, 2, 2, 64, 64, {"mask": "b"}),
    "f16-d64-t:100,50-1000": (F16, "bshd", 1, 1000, 1000, 2, 1, 64, 64, {"mask": "t:100,50"}),
    "f16-d64-b:30,0-17x253": (F16, "bhsd", 3, 17, 253, 8, 2, 64, 64, {"mask": "b:30,0"}),
    "f16-d64-xt:64-500": (F16, "bshd", 1, 500, 500, 4, 1, 64, 64, {"mask": "xt:64"}),
    "f16-d64-xb:33-253x500": (F16, "bshd", 2, 253, 500, 2, 2, 64, 64, {"mask": "xb:33"}),
    "f16-d64-g:200,10-500x253": (F16, "bhsd", 1, 500, 253, 4, 4, 64, 64, {"mask": "g:200,10"}),
    "f16-d64-causal-1000-mqa8": (F16, "bshd", 1, 1000, 1000, 8, 1, 64, 64, {"causal": True}),
    "f16-d64-window128,0-1000x500": (F16, "bshd", 1, 1000, 500, 2, 2, 64, 64,
                                     {"window_size": (128, 0)}),
    "f16-d64-window64,64-bhsd": (F16, "bhsd", 2, 253, 253, 4, 2, 64, 64, {"window_size": (64, 64)}),
    "f16-d64-sq1-sk253": (F16, "bshd", 4, 1, 253, 4, 4, 64, 64, {}),
    "f16-d64-sq253-sk1": (F16, "bshd", 1, 253, 1, 4, 4, 64, 64, {}),
    "f16-d64-sq1-sk1-causal": (F16, "bhsd", 2, 1, 1, 2, 2, 64, 64, {"causal": True}),
    "f16-d64-17-b": (F16, "bshd", 2, 17, 17, 2, 2, 64, 64, {"mask": "b"}),
    # fp16, other head dims
    "f16-d32-none-500": (F16, "bshd", 1, 500, 500, 4, 4, 32, 32, {}),
    "f16-d32-causal-17x253": (F16, "bhsd", 2, 17, 253, 4, 1, 32, 32, {"causal": True}),
    "f16-d72-none-253x17": (F16, "bshd", 2, 253, 17, 2, 2, 72, 72, {}),
    "f16-d72-t-253": (F16, "bshd", 1, 253, 253, 4, 2, 72, 72, {"mask": "t"}),
    "f16-d96-causal-500": (F16, "bshd", 1, 500, 500, 4, 4, 96, 96, {"causal": True}),
    "f16-d128-none-1000-gqa8": (F16, "bshd", 1, 1000, 1000, 8, 1, 128, 128, {}),
    "f16-d128-b-bhsd": (F16, "bhsd", 2, 253, 500, 4, 4, 128, 128, {"mask": "b"}),
    "f16-d192-none-253": (F16, "bshd", 1, 253, 253, 4, 4, 192, 192, {}),
    "f16-d192x128-causal-500": (F16, "bshd", 1, 500, 500, 4, 2, 192, 128, {"causal": True}),
    "f16-d192x128-none-17x500": (F16, "bhsd", 2, 17, 500, 2, 2, 192, 128, {}),
    "f16-d256-none-253": (F16, "bshd", 1, 253, 253, 2, 2, 256, 256, {}),
    "f16-d256-causal-500x253": (F16, "bshd", 1, 500, 253, 2, 1, 256, 256, {"causal": True}),
    # bf16, hdim 128: masks, GQA, layouts, empty rows
    "bf16-d128-none-500": (BF16, "bshd", 2, 500, 500, 4, 4, 128, 128, {}),
    "bf16-d128-causal-1000-gqa4": (BF16, "bshd", 1, 1000, 1000, 8, 2, 128, 128, {"causal": True}),
    "bf16-d128-b-500x253-empty-rows": (BF16, "bhsd", 1, 500, 253, 4, 4, 128, 128, {"mask": "b"}),
    "bf16-d128-t:64,0-bhsd": (BF16, "bhsd", 2, 253, 253, 2, 2, 128, 128, {"mask": "t:64,0"}),
    "bf16-d128-xb:100-17x1000": (BF16, "bshd", 1, 17, 1000, 4, 1, 128, 128, {"mask": "xb:100"}),
    "bf16-d128-g:50,50-sq1": (BF16, "bshd", 2, 1, 253, 2, 2, 128, 128, {"mask": "g:50,50"}),
    "bf16-d64-b:10,10-gqa2": (BF16, "bshd", 2, 253, 500, 4, 2, 64, 64, {"mask": "b:10,10"}),
    "bf16-d192x128-none-253": (BF16, "bshd", 1, 253, 253, 4, 4, 192, 128, {}),
    "bf16-d256-causal-500": (BF16, "bhsd", 1, 500, 500, 2, 2, 256, 256, {"causal": True}),
    # head dims that are multiples of 8 but not of 16 (issue 3, item 7): padded to 48/80/112 in
    # the kernels, so the last 8 columns of every Q/K/V/dO tile are zero-filled and the dQ/dK/dV
    # stores are masked by column. Unaligned lengths (131 x 77: partial tiles on both axes; causal
    # is bottom-right, so the first 54 rows see no key). hdim 104 covers every dtype x mask x
    # layout; 40 and 72 an orthogonal half of it (each pair of factors appears once).
    "f16-d40-none-131x77": (F16, "bshd", 2, 131, 77, 4, 2, 40, 40, {}),
    "f16-d40-causal-131x77-bhsd": (F16, "bhsd", 1, 131, 77, 2, 2, 40, 40, {"causal": True}),
    "bf16-d40-none-131x77-bhsd": (BF16, "bhsd", 1, 131, 77, 4, 1, 40, 40, {}),
    "bf16-d40-causal-131x77": (BF16, "bshd", 2, 131, 77, 2, 2, 40, 40, {"causal": True}),
    "f16-d72-none-131x77-bhsd": (F16, "bhsd", 2, 131, 77, 2, 2, 72, 72, {}),
    "f16-d72-causal-131x77": (F16, "bshd", 1, 131, 77, 4, 2, 72, 72, {"causal": True}),
    "bf16-d72-none-131x77": (BF16, "bshd", 1, 131, 77, 4, 4, 72, 72, {}),
    "bf16-d72-causal-131x77-bhsd": (BF16, "bhsd", 2, 131, 77, 2, 1, 72, 72, {"causal": True}),
    "f16-d104-none-131x77": (F16, "bshd", 2, 131, 77, 2, 2, 104, 104, {}),
    "f16-d104-none-131x77-bhsd": (F16, "bhsd", 1, 131, 77, 4, 2, 104, 104, {}),
    "f16-d104-causal-131x77": (F16, "bshd", 1, 131, 77, 4, 4, 104, 104, {"causal": True}),
    "f16-d104-causal-131x77-bhsd": (F16, "bhsd", 2, 131, 77, 2, 2, 104, 104, {"causal": True}),
    "bf16-d104-none-131x77": (BF16, "bshd", 1, 131, 77, 4, 1, 104, 104, {}),
    "bf16-d104-none-131x77-bhsd": (BF16, "bhsd", 2, 131, 77, 2, 2, 104, 104, {}),
    "bf16-d104-causal-131x77": (BF16, "bshd", 2, 131, 77, 2, 2, 104, 104, {"causal": True}),
    "bf16-d104-causal-131x77-bhsd": (BF16, "bhsd", 1, 131, 77, 4, 2, 104, 104, {"causal": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_backward_matches_reference(case):
    dtype, layout, b, sq, sk, hq, hk, d, dv, mkw = CASES[case]
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, dv, seed_for(case))
    before = {n: x.copy() for n, x in inp.dev.items()}
    kw = dict(mkw, layout=layout)
    o, lse, g = run(inp, kw)
    outs = _check_all(inp, o, lse, g, kw)
    for n, x in inp.dev.items():  # inputs untouched
        assert bool((x == before[n]).all()), n
    ref_lse = outs["lse"][1]
    empty = np.isneginf(ref_lse)  # [b, hq, sq]
    if empty.any():
        o_f, dq_f = outs["o"][0], outs["dq"][0]
        if layout == "bshd":
            o_f, dq_f = o_f.transpose(0, 2, 1, 3), dq_f.transpose(0, 2, 1, 3)
        assert np.all(o_f[empty] == 0)
        assert np.all(dq_f[empty] == 0)
        assert np.all(np.isneginf(outs["lse"][0][empty]))


def test_rows_without_keys_are_zero():
    # bottom-right causal with sq > sk: the first sq - sk rows see nothing
    b, sq, sk, h, d = 2, 500, 253, 2, 64
    inp = Inputs(F16, "bshd", b, sq, sk, h, h, d, d, seed_for("empty"))
    o, lse, g = run(inp, {"mask": "b"})
    o, lse, dq = cp.asnumpy(o), cp.asnumpy(lse), cp.asnumpy(g.dq)
    n = sq - sk
    for x in (o, dq, cp.asnumpy(g.dk), cp.asnumpy(g.dv)):
        assert not np.isnan(x.astype(np.float32)).any()
    assert np.all(o[:, :n] == 0) and np.all(dq[:, :n] == 0)
    assert np.all(np.isneginf(lse[:, :, :n])) and np.all(np.isfinite(lse[:, :, n:]))


STRIDED = {
    "f16-d64-bshd-causal": (F16, "bshd", 2, 253, 4, 64, {"causal": True}),
    "bf16-d128-bshd-none": (BF16, "bshd", 1, 500, 2, 128, {}),
    "f16-d64-bhsd-t:32,8": (F16, "bhsd", 2, 253, 2, 64, {"mask": "t:32,8"}),
}


@pytest.mark.parametrize("case", list(STRIDED))
def test_strided_inputs_match_contiguous(case):
    dtype, layout, b, s, h, d, mkw = STRIDED[case]
    inp = Inputs(dtype, layout, b, s, s, h, h, d, d, seed_for(case))
    # packed qkv: [b, s, 3, h, d] (bshd) or [b, 3, h, s, d] (bhsd); q, k, v are views into it
    axis = 2 if layout == "bshd" else 1
    packed = cp.stack([inp.dev["q"], inp.dev["k"], inp.dev["v"]], axis=axis)
    take = (lambda i: packed[:, :, i]) if layout == "bshd" else (lambda i: packed[:, i])
    do = inp.dev["do"]
    # dO with other strides than O: a transposed copy viewed back
    perm = (0, 2, 1, 3)
    do_strided = cp.ascontiguousarray(do.transpose(perm)).transpose(perm)
    strided = {"q": take(0), "k": take(1), "v": take(2), "do": do_strided}
    assert not strided["q"].flags.c_contiguous and do_strided.strides != do.strides
    kw = dict(mkw, layout=layout)
    o1, lse1, g1 = run(inp, kw, dev=strided)
    o2, lse2, g2 = run(inp, kw)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())  # -inf == -inf holds
    # dK, dV: written once per K block, deterministic; dQ: fp32 atomics may reorder additions
    assert bool((g1.dk == g2.dk).all()) and bool((g1.dv == g2.dv).all())
    dq1, dq2 = inp.to_float(g1.dq), inp.to_float(g2.dq)
    ulp = 2.0**-10 if dtype == F16 else 2.0**-7
    assert np.max(np.abs(dq1 - dq2)) <= 2 * ulp * np.max(np.abs(dq2))
    _check_all(inp, o1, lse1, g1, kw)


def test_numpy_inputs_are_copied():
    inp = Inputs(F16, "bshd", 1, 64, 64, 2, 2, 64, 64, seed_for("numpy"))
    h = inp.host
    o, lse = cupy_fmha.attention_forward(h["q"], h["k"], h["v"], causal=True)
    assert isinstance(o, cp.ndarray) and isinstance(lse, cp.ndarray)
    ref_o, _ = R.attention_forward(h["q"], h["k"], h["v"], causal=True)
    assert compare("o", cp.asnumpy(o), ref_o, dtype=F16, hdim_q=64, hdim_v=64).ok


def _bad_inputs():
    rng = np.random.default_rng(0)
    mk = lambda *s: cp.asarray(rng.standard_normal(s).astype(np.float16))  # noqa: E731
    q, k, v = mk(1, 16, 2, 64), mk(1, 16, 2, 64), mk(1, 16, 2, 64)
    return q, k, v


@pytest.mark.parametrize(
    "arg, exc, mutate",
    [
        ("q", ValueError, lambda q, k, v: (q[0], k, v, {})),
        ("k", TypeError, lambda q, k, v: (q, k.astype(cp.float32), v, {})),
        ("q", TypeError, lambda q, k, v: (q.view(cp.uint16), k.view(cp.uint16), v.view(cp.uint16), {})),
        ("q", ValueError, lambda q, k, v: (q[..., :60], k[..., :60], v, {})),
        ("q", ValueError, lambda q, k, v: (cp.repeat(q, 2, axis=3)[..., ::2], k, v, {})),
        ("k", ValueError, lambda q, k, v: (q, cp.concatenate([k] * 3, axis=2), cp.concatenate([v] * 3, axis=2), {})),
        ("v", ValueError, lambda q, k, v: (q, k, v[:, :8], {})),
        ("layout", ValueError, lambda q, k, v: (q, k, v, {"layout": "sbhd"})),
        ("mask", ValueError, lambda q, k, v: (q, k, v, {"mask": "t", "causal": True})),
        ("softmax_scale", ValueError, lambda q, k, v: (q, k, v, {"softmax_scale": float("nan")})),
    ],
)
def test_bad_inputs_rejected(arg, exc, mutate):
    q, k, v, kw = mutate(*_bad_inputs())
    with pytest.raises(exc, match=arg):
        cupy_fmha.attention_forward(q, k, v, **kw)


def test_bad_backward_inputs_rejected():
    q, k, v = _bad_inputs()
    o, lse = cupy_fmha.attention_forward(q, k, v)
    do = cp.ones_like(o)
    with pytest.raises(TypeError, match="lse"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse.astype(cp.float16))
    with pytest.raises(ValueError, match="lse"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse[:, :, :8])
    with pytest.raises(ValueError, match="do"):
        cupy_fmha.attention_backward(do[:, :8], q, k, v, o, lse)
    with pytest.raises(ValueError, match="o"):
        cupy_fmha.attention_backward(do, q, k, v, o[..., :32], lse)


def test_arrays_on_different_devices_rejected():
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    q, k, v = _bad_inputs()
    with cp.cuda.Device(1):
        v1 = cp.asarray(v)
    with pytest.raises(ValueError, match="v"):
        cupy_fmha.attention_forward(q, k, v1)


def test_bf16_bits_need_dtype():
    rng = np.random.default_rng(3)
    x = float_to_bf16_bits(rng.standard_normal((1, 16, 2, 64)))
    q = cp.asarray(x)
    with pytest.raises(TypeError, match="bfloat16"):
        cupy_fmha.attention_forward(q, q, q)
    o, lse = cupy_fmha.attention_forward(q, q, q, dtype="bfloat16")
    assert o.dtype == cp.uint16


def test_bad_out_buffers_rejected():
    q, k, v = _bad_inputs()
    o, lse = cupy_fmha.attention_forward(q, k, v)
    with pytest.raises(ValueError, match="out"):
        cupy_fmha.attention_forward(q, k, v, out=(cp.empty((1, 16, 2, 32), cp.float16), lse))
    with pytest.raises(TypeError, match="out"):
        cupy_fmha.attention_forward(q, k, v, out=(o, lse.astype(cp.float16)))
    with pytest.raises(TypeError, match="out"):
        cupy_fmha.attention_backward(cp.ones_like(o), q, k, v, o, lse, out=(q, k))


# ALiBi: id -> (dtype, layout, b, sq, sk, hq, hk, d, slopes per batch?, mask kwargs)
ALIBI = {
    "f16-d64-causal-gqa2-500": (F16, "bshd", 1, 500, 500, 4, 2, 64, False, {"causal": True}),
    "bf16-d128-none-bhsd-253x500": (BF16, "bhsd", 2, 253, 500, 2, 2, 128, True, {}),
    "f16-d96-b:50,10-1000x333": (F16, "bshd", 1, 1000, 333, 2, 1, 96, False, {"mask": "b:50,10"}),
    "bf16-d256-t-300": (BF16, "bshd", 2, 300, 300, 2, 2, 256, True, {"mask": "t"}),
    "f16-d128-xb:64-17x253": (F16, "bshd", 2, 17, 253, 4, 4, 128, True, {"mask": "xb:64"}),
}


@pytest.mark.parametrize("case", list(ALIBI))
def test_alibi_matches_reference(case):
    dtype, layout, b, sq, sk, hq, hk, d, per_batch, mkw = ALIBI[case]
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, d, seed_for("alibi", case))
    rng = np.random.default_rng(seed_for("slopes", case))
    slopes = rng.uniform(0.01, 0.5, (b, hq) if per_batch else (hq,)).astype(np.float32)
    kw = dict(mkw, layout=layout, alibi_slopes=slopes)
    o, lse, g = run(inp, kw)
    _check_all(inp, o, lse, g, kw)


def test_alibi_bad_slopes_rejected():
    q, k, v = _bad_inputs()
    with pytest.raises(ValueError, match="alibi_slopes"):
        cupy_fmha.attention_forward(q, k, v, alibi_slopes=np.ones((3,), np.float32))
    with pytest.raises(TypeError, match="alibi_slopes"):
        cupy_fmha.attention_forward(q, k, v, alibi_slopes=np.ones((2,), np.float16))


@pytest.mark.parametrize("d", [64, 96, 128], ids=["d64-wgmma", "d96-mma", "d128-wgmma"])
def test_dq_workspace_is_cleared_by_dot_do_o(d):
    """The atomic-mode dQ workspace is a ``cp.empty`` block that dot_do_o zero-fills (no memset
    launch): with a NaN block of exactly its size waiting in the pool, every dQ row must still
    come out right."""
    b, sq, sk, hq, hk = 2, 253, 500, 4, 2
    inp = Inputs(F16, "bshd", b, sq, sk, hq, hk, d, d, seed_for("dq workspace", d))
    kw = {"causal": True}
    o, lse, g = run(inp, kw, before_backward=nan_block_in_pool((b, hq, sq, d)))
    assert not bool(cp.isnan(g.dq.astype(cp.float32)).any())
    _check_all(inp, o, lse, g, kw)


# --------------------------------------------------------------------------- lse's cotangent (dlse)

# id: (dtype, layout, b, sq, sk, hq, hk, d, kwargs); lengths that are no multiple of any tile (77, 133)
DLSE = {
    "f16-d64-none-77x133": (F16, "bshd", 2, 77, 133, 4, 4, 64, {}),
    "f16-d64-causal-133x77-empty-rows-bhsd": (F16, "bhsd", 1, 133, 77, 2, 2, 64, {"causal": True}),
    "bf16-d64-window-133": (BF16, "bshd", 2, 133, 133, 2, 2, 64, {"window_size": (32, 8)}),
    "bf16-d64-causal-77x133-gqa2": (BF16, "bshd", 1, 77, 133, 4, 2, 64, {"causal": True}),
    "f16-d128-causal-133": (F16, "bshd", 1, 133, 133, 4, 4, 128, {"causal": True}),
    "f16-d128-none-133x77-gqa4": (F16, "bhsd", 2, 133, 77, 8, 2, 128, {}),
    "bf16-d128-none-77x133-bhsd": (BF16, "bhsd", 2, 77, 133, 2, 2, 128, {}),
    "bf16-d128-causal-133x77": (BF16, "bshd", 1, 133, 77, 4, 4, 128, {"causal": True}),
    # dropout: lse is that of the undropped P, so the same D - dlse holds (dS = P (dP Z - D + dlse))
    "f16-d64-dropout-133x77-gqa2": (F16, "bshd", 2, 133, 77, 4, 2, 64, {"dropout_p": 0.2, "seed": 21, "offset": 5}),
    "bf16-d128-causal-dropout-133": (BF16, "bshd", 1, 133, 133, 2, 2, 128,
                                     {"causal": True, "dropout_p": 0.3, "seed": 2**33 + 1}),
}


def _dlse_host(rng, shape):
    """lse's cotangent: float32 4 * N(0, 1), the size of dP - D, so that dropping it moves dq and dk
    far beyond the tolerance (checked in the test)."""
    return (4.0 * rng.standard_normal(shape)).astype(np.float32)


def _lse_term_matters(inp, outs, kw, dlse_host):
    """The result misses the reference without dlse by more than the tolerance (dq and dk), so the
    comparison with dlse could tell a dropped lse term."""
    h = inp.host
    plain = R.attention_backward(h["do"], h["q"], h["k"], h["v"], **inp.reference_kw(kw))
    for name, i in (("dq", 0), ("dk", 1)):
        out, ref_with = outs[name][0], outs[name][1]
        assert not np.allclose(plain[i], ref_with), name
        assert not compare(name, out, plain[i], dtype=inp.dtype, hdim_q=inp.d, hdim_v=inp.dv).ok, name


@pytest.mark.parametrize("case", list(DLSE))
def test_backward_with_dlse_matches_reference(case):
    """attention_backward(..., dlse=g) against the reference backward with the same g: fresh random
    inputs and g, NaN-poisoned outputs and a NaN block in the pool for the D workspace; g untouched;
    rows that see no key keep dq = 0 whatever their g."""
    dtype, layout, b, sq, sk, hq, hk, d, extra = DLSE[case]
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, d, seed_for("dlse", case))
    kw = dict(extra, layout=layout)
    host = _dlse_host(inp.rng, (b, hq, sq))
    dlse = cp.asarray(host)
    o, lse, g = run(inp, kw, dlse=dlse, before_backward=nan_block_in_pool((b, hq, sq)))
    assert bool((dlse == cp.asarray(host)).all())  # the caller's dlse untouched
    outs = reference_outputs(inp, o, lse, g, kw, dlse=host)
    assert_close(inp, outs)
    _lse_term_matters(inp, outs, kw, host)
    empty = np.isneginf(outs["lse"][1])  # [b, hq, sq]
    if empty.any():
        dq_f = outs["dq"][0] if layout == "bhsd" else outs["dq"][0].transpose(0, 2, 1, 3)
        assert np.all(dq_f[empty] == 0) and np.all(host[empty] != 0)


def test_backward_with_dlse_in_group_mode():
    """Group mode (GQA, empty sequences, max_seqlen_q above the longest): dlse [batch, nhead_q,
    max_seqlen_q], NaN in the rows past each sequence's length (never read: D's rows there are not
    either); a sequence without keys keeps dq = 0 (check_group)."""
    inp = Packed(BF16, LQ2, LK2, 4, 2, 64, 64, seed_for("dlse group"))
    mq = int(np.diff(inp.cq).max())
    kw = {"causal": True, "max_seqlen_q": mq + 3}
    shape = (inp.batch, inp.hq, mq + 3)
    host = _dlse_host(inp.rng, shape)
    for i, n in enumerate(np.diff(inp.cq)):
        host[i, :, n:] = np.nan
    dlse = cp.asarray(host)
    o, lse, g = run(inp, kw, dlse=dlse, before_backward=nan_block_in_pool(shape))
    outs = check_group(inp, o, lse, g, kw, dlse=host)
    assert np.array_equal(cp.asnumpy(dlse), host, equal_nan=True)  # untouched
    assert not compare("dq", outs["dq"][0], R.attention_backward(
        inp.host["do"], inp.host["q"], inp.host["k"], inp.host["v"], **inp.reference_kw(kw))[0],
        dtype=inp.dtype, hdim_q=64, hdim_v=64).ok


def test_backward_with_dlse_and_bias_dbias():
    """dBias = dS carries the lse term too (a bias that broadcasts along nothing: the kernel stores
    dS as dBias; and one shared over batch and heads: the fp32 workspace, reduced)."""
    for shape in ("bh", "11"):
        b, sq, sk, hq, hk, d = 2, 133, 77, 4, 2, 64
        inp = BiasInputs(F16, np.float32, "bshd", b, sq, sk, hq, hk, d, d, BIAS_SHAPES[shape](b, hq, sq, sk),
                         seed_for("dlse bias", shape))
        kw = {"causal": True}
        host = _dlse_host(inp.rng, (b, hq, sq))
        o, lse, g = run(inp, kw, bias=inp.dev_bias, dbias=True, dlse=cp.asarray(host))
        outs = check(inp, o, lse, g, kw, dbias=True, dlse=host)
        plain = R.attention_backward(inp.host["do"], inp.host["q"], inp.host["k"], inp.host["v"], return_dbias=True,
                                     **inp.reference_kw(kw))
        assert not compare("dbias", outs["dbias"][0], plain[3], dtype=np.float32, hdim_q=d, hdim_v=d).ok, shape


@pytest.mark.parametrize("d", [64, 128])
def test_dlse_zeros_equal_no_dlse_bit_for_bit(d):
    """D - 0 is D: with deterministic=True, dlse of zeros (CuPy or NumPy) gives the same bits as none."""
    inp = Inputs(BF16, "bshd", 2, 133, 77, 4, 2, d, d, seed_for("dlse zeros", d))
    q, k, v, do = (inp.dev[n] for n in ("q", "k", "v", "do"))
    kw = dict(dtype=inp.dtype_arg, causal=True, deterministic=True)
    o, lse = cupy_fmha.attention_forward(q, k, v, dtype=inp.dtype_arg, causal=True)
    base = cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw)
    for zeros in (cp.zeros(lse.shape, cp.float32), np.zeros(lse.shape, np.float32)):
        g = cupy_fmha.attention_backward(do, q, k, v, o, lse, dlse=zeros, **kw)
        for a, x in zip(base, g):
            assert bool((a == x).all())


def test_bad_dlse_rejected():
    q, k, v = _bad_inputs()
    o, lse = cupy_fmha.attention_forward(q, k, v)
    do = cp.ones_like(o)
    with pytest.raises(TypeError, match="dlse: expected float32"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse, dlse=lse.astype(cp.float16))
    with pytest.raises(ValueError, match="dlse: expected lse's shape"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse, dlse=lse[:, :, :8])
    with pytest.raises(TypeError, match="dlse: expected a float32 array"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse, dlse=[0.0])
