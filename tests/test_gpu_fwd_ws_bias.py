"""The warp-specialized Hopper kernels' bias builds against the NumPy reference: the forward
(kernels/fmha_fwd_sm90_ws.cu with BIAS: the bias tile loaded by TMA into a ring of its own,
SwBiasTile in kernels/arch/sm90/tma_tile.cuh) and, at hdim 64, the backward
(kernels/fmha_bwd_dq_dk_dv_sm90_ws.cu with BIAS: the same tiles per query block, read
element by element in the S^T layout, dS stored for dBias, through TMA where dBias allows it;
deterministic mode too).

test_gpu_bias.py and test_gpu_varlen.py's bias cases run on it by default at hdim 64/128 on sm_90
(odd key counts there: the API's padded copy, :func:`cupy_fmha.api._tma_bias`). This file adds
what the tile path needs beyond them: key counts whose bias rows are 16-byte multiples (the
caller's bias read in place, no copy), many key blocks so the ring (two tiles, one for an fp32
bias at hdim 128) turns over many times, several row blocks per CTA (PERSIST), a bias broadcast
along the rows (one-row boxes) and along heads and batch (map dimensions of 1), a misaligned view
(copied), a bias broadcast by a zero stride (cut before the copy), and which kernel each takes.
Outputs go into NaN-poisoned buffers; the caller's bias must come back unchanged."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

import conftest
import cupy_fmha
from conftest import BF16, F16, F32, BiasInputs, check, run, seed_for
from cupy_fmha import api
from cupy_fmha.backends import cuda

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _sm90():
    if not conftest.is_sm90():
        pytest.skip("the ws forward's bias build runs on sm_90 only")


@pytest.fixture
def seen(monkeypatch):
    """The kernel instances launched (api.get_function's specs), in order."""
    specs, real = [], api.get_function

    def record(spec):
        specs.append(spec)
        return real(spec)

    monkeypatch.setattr(api, "get_function", record)
    return specs


def test_routing(seen):
    """Bias with contiguous keys: the ws forward with BIAS_TMA = the element size; broadcast along
    the keys: fmha_fwd_sm90 (the TMA box cannot repeat one column)."""
    q = cp.asarray(np.random.default_rng(3).standard_normal((1, 40, 2, 64)).astype(np.float16))
    cupy_fmha.attention_forward(q, q, q, bias=cp.zeros((2, 40, 1), cp.float16))
    cupy_fmha.attention_forward(q, q, q, bias=cp.zeros((2, 40, 40), cp.float16))
    assert [s.source for s in seen] == ["fmha_fwd_sm90", "fmha_fwd_sm90_ws"]
    assert cuda.fwd_spec("bf16", 128, 128, 90, bias=True, bias_tma=2).macro("BIAS_TMA") == 2
    f32 = cuda.fwd_spec("bf16", 128, 128, 90, bias=True, bias_tma=4)
    assert f32.source == "fmha_fwd_sm90_ws" and f32.macro("BIAS_STAGES") == 1  # 64 KB tiles: one fits
    assert cuda.fwd_spec("fp16", 64, 64, 90, bias=True, bias_tma=4).macro("BIAS_STAGES") == 2
    assert cuda.fwd_spec("fp16", 64, 64, 90, bias=True, bias_tma=2).macro("FOLD", 0) == 0
    assert cuda.fwd_spec("bf16", 128, 128, 90, bias=True).source == "fmha_fwd_sm90"


# id: (dtype, bias dtype, b, sq, sk, hq, hk, d, bias shape, mask kwargs)
CASES = {
    # rows of 16-byte multiples: read in place; many key blocks through the ring
    "bf16-bbf-d128-bh-none-300x1024": (BF16, BF16, 2, 300, 1024, 2, 2, 128, "bh", {}),
    "bf16-b32-d128-1h-causal-1024": (BF16, F32, 1, 1024, 1024, 4, 2, 128, "1h", {"causal": True}),
    "f16-b16-d64-11-b-520x776": (F16, F16, 2, 520, 776, 2, 1, 64, "11", {"mask": "b"}),
    "f16-b32-d64-bh-t:100,30-640": (F16, F32, 1, 640, 640, 2, 2, 64, "bh", {"mask": "t:100,30"}),
    # broadcast along the rows (boxes of one row), over heads and batch
    "bf16-b16-d128-rows1-none-200x512": (BF16, F16, 2, 200, 512, 2, 2, 128, (2, 1, 1, 512), {}),
    "f16-b32-d64-rowsh-causal-384": (F16, F32, 1, 384, 384, 4, 4, 64, (1, 4, 1, 384), {"causal": True}),
    # odd key counts: padded copies
    "bf16-b32-d128-bh-none-129x257": (BF16, F32, 1, 129, 257, 2, 2, 128, "bh", {}),
    "f16-bbf-d64-2d-b-257x129": (F16, BF16, 1, 257, 129, 2, 2, 64, "2d", {"mask": "b"}),
}

_SHAPES = dict(conftest.BIAS_SHAPES)


def _shape(kind, b, h, sq, sk):
    return _SHAPES[kind](b, h, sq, sk) if isinstance(kind, str) else kind


@pytest.mark.parametrize("case", list(CASES))
def test_bias_tile_matches_reference(case, seen):
    dtype, bdt, b, sq, sk, hq, hk, d, kind, mkw = CASES[case]
    pb = BiasInputs(dtype, bdt, "bshd", b, sq, sk, hq, hk, d, d, _shape(kind, b, hq, sq, sk), seed_for("wsb", case))
    before = pb.dev_bias.copy() if isinstance(pb.dev_bias, cp.ndarray) else None
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=False)
    fwd = seen[0]
    assert fwd.source == "fmha_fwd_sm90_ws" and fwd.macro("BIAS_TMA") == pb.bias_dtype.itemsize, fwd.name
    check(pb, o, lse, g, kw)
    if before is not None:
        assert bool((pb.dev_bias.view(cp.uint8) == before.view(cp.uint8)).all())


@pytest.mark.parametrize("per", [2, 3])
def test_bias_with_several_row_blocks_per_cta(monkeypatch, per):
    # the ring of bias tiles runs on across a CTA's row blocks
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={per}")
    pb = BiasInputs(BF16, BF16, "bshd", 1, 700, 384, 2, 2, 128, 128, (1, 2, 700, 384), seed_for("wsb-persist", per))
    kw = {"mask": "b", "layout": "bshd"}
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=False)
    check(pb, o, lse, g, kw)


def test_misaligned_and_zero_stride_views():
    # a view one element into its buffer (address not 16-byte aligned) and a bias broadcast by a
    # zero stride (cupy.broadcast_to) read through copies; the caller's arrays stay as they were
    b, sq, sk, h, d = 1, 200, 256, 2, 64
    pb = BiasInputs(F16, F32, "bshd", b, sq, sk, h, h, d, d, (b, h, sq, sk), seed_for("wsb-views"))
    big = cp.zeros((b, h, sq, sk + 1), cp.float32)
    big[..., 1:] = cp.asarray(pb.bias)
    view = big[..., 1:]
    assert view.data.ptr % 16 != 0
    kw = {"layout": "bshd", "causal": True}
    o1, lse1, _ = run(pb, kw, bias=view, dbias=False)
    o2, lse2, g2 = run(pb, kw, bias=cp.asarray(pb.bias), dbias=False)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())
    check(pb, o2, lse2, g2, kw)
    row = cp.asarray(pb.bias[:, :, :1, :])
    wide = cp.broadcast_to(row, (b, h, sq, sk))
    assert wide.strides[2] == 0
    pr = BiasInputs(F16, F32, "bshd", b, sq, sk, h, h, d, d, None, seed_for("wsb-views"),
                    bias_host=np.broadcast_to(pb.bias[:, :, :1, :], (b, h, sq, sk)))
    o3, lse3, g3 = run(pr, kw, bias=wide, dbias=False)
    check(pr, o3, lse3, g3, kw)


# BIAS_ACC (a variant the plan does not dispatch yet, bench/NOTES.md step 77): the bias tile as the
# starting value of S's accumulator (bias / softmax_scale) instead of an add in the softmax. The cases
# above under the switch, then -inf entries in the bias (a mask, and rows that see no key) with a
# negative softmax_scale and a small one.
@pytest.mark.parametrize("case", list(CASES))
def test_bias_acc_matches_reference(case, monkeypatch, seen):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "BIAS_ACC=1")
    test_bias_tile_matches_reference(case, seen)
    assert seen[0].macro("BIAS_ACC") == 1, seen[0].name


# Three MMA warpgroups for the hdim-64 16-bit bias build (bench/NOTES.md step 90: with BIAS_ACC it compiles
# without spills; the table's build since step 92, except under short diagonal masks): the hdim-64 cases with
# a 16-bit bias above (the short causal ones too, which the table gives two) and three more (bf16 inputs without
# a mask, a bias broadcast along the rows, a window; 192-row blocks: other tails than 128's), and -inf bias
# entries with a negative scale, all under NWG=3.
NWG3_CASES = {c: v for c, v in CASES.items() if v[7] == 64 and v[1] != F32}
NWG3_CASES.update({
    "bf16-bbf-d64-bh-none-600x640": (BF16, BF16, 2, 600, 640, 2, 2, 64, "bh", {}),
    "bf16-b16-d64-rows1-causal-450x700": (BF16, F16, 1, 450, 700, 4, 2, 64, (1, 1, 1, 700), {"causal": True}),
    "f16-b16-d64-bh-t:150,20-900": (F16, F16, 1, 900, 900, 2, 2, 64, "bh", {"mask": "t:150,20"}),
})


@pytest.mark.parametrize("case", list(NWG3_CASES))
def test_bias_three_warpgroups_matches_reference(case, monkeypatch, seen):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "NWG=3")
    dtype, bdt, b, sq, sk, hq, hk, d, kind, mkw = NWG3_CASES[case]
    pb = BiasInputs(dtype, bdt, "bshd", b, sq, sk, hq, hk, d, d, _shape(kind, b, hq, sq, sk), seed_for("wsb-nwg3", case))
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=False)
    assert (seen[0].source, seen[0].macro("NWG"), seen[0].macro("BIAS_ACC")) == ("fmha_fwd_sm90_ws", 3, 1), seen[0].name
    check(pb, o, lse, g, kw)


def test_bias_three_warpgroups_minus_inf(monkeypatch, seen):
    # a causal mask over more keys than rows (every row sees some: bottom-right alignment), so the first
    # five rows see none through the bias alone
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "NWG=3,PERSIST=2")
    b, sq, sk, h, d = 2, 500, 700, 2, 64
    rng = np.random.default_rng(90)
    bias = 2.0 * rng.standard_normal((b, h, sq, sk))
    bias[rng.random(bias.shape) < 0.3] = -np.inf
    bias[:, :, :5, :] = -np.inf  # rows that see no key
    pb = BiasInputs(F16, F16, "bshd", b, sq, sk, h, h, d, d, None, seed_for("nwg3-inf"), bias_host=bias)
    kw = {"layout": "bshd", "softmax_scale": -0.15, "causal": True}
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=False)
    assert seen[0].macro("NWG") == 3, seen[0].name
    check(pb, o, lse, g, kw)
    assert bool((o[:, :5] == 0).all()) and bool(cp.isneginf(lse[:, :, :5]).all())
    assert bool(cp.isfinite(lse[:, :, 5:]).all())


@pytest.mark.parametrize("scale", [-0.2, 1e-3])
@pytest.mark.parametrize("d", [64, 128])
def test_bias_acc_minus_inf_and_scales(d, scale, monkeypatch, seen):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "BIAS_ACC=1")
    b, sq, sk, h = 1, 300, 384, 2
    rng = np.random.default_rng(d)
    bias = 2.0 * rng.standard_normal((b, h, sq, sk))
    bias[rng.random(bias.shape) < 0.3] = -np.inf
    bias[:, :, :5, :] = -np.inf  # rows that see no key
    pb = BiasInputs(BF16, BF16, "bshd", b, sq, sk, h, h, d, d, None, seed_for("acc-inf", d), bias_host=bias)
    kw = {"layout": "bshd", "softmax_scale": scale}
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=False)
    assert seen[0].macro("BIAS_ACC") == 1, seen[0].name
    check(pb, o, lse, g, kw)
    assert bool((o[:, :5] == 0).all()) and bool(cp.isneginf(lse[:, :, :5]).all())


def test_bias_acc_negative_scale_masked_persistent(monkeypatch, seen):
    # a negative scale under a causal mask (masked scores take +inf before the folded minimum), several
    # row blocks per CTA (the bias ring across them), and a large offset per row (S's accumulator
    # starts at about 1000 / scale: Q K^T still has to count)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "BIAS_ACC=1,PERSIST=2")
    b, sq, sk, h, d = 1, 700, 700, 2, 64
    rng = np.random.default_rng(77)
    bias = 1000.0 * rng.standard_normal((b, h, sq, 1)) + rng.standard_normal((b, h, sq, sk))
    pb = BiasInputs(F16, F32, "bshd", b, sq, sk, h, h, d, d, None, seed_for("acc-neg"), bias_host=bias)
    for kw in ({"layout": "bshd", "causal": True, "softmax_scale": -0.125}, {"layout": "bshd", "mask": "b"}):
        seen.clear()
        o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=False)
        assert seen[0].macro("BIAS_ACC") == 1, seen[0].name
        check(pb, o, lse, g, kw)


# --------------------------------------------------------------------------- the ws backward's bias build
# (hdim 64 and 128: fmha_bwd_dq_dk_dv_sm90_ws with BIAS, 64 query rows per step, MMA thread 0 loading
# the bias tiles, cupy_fmha.backends.cuda.BWD_WS_BIAS_HDIMS; an fp32 bias at hdim 128, whose tiles do
# not fit beside the rest, keeps fmha_bwd_dq_dk_dv_sm90)

# id: (dtype, bias dtype, b, sq, sk, hq, hk, d, bias shape, mask kwargs, dbias)
BWD_CASES = {
    "f16-b16-d64-bh-causal-300x512-gqa2": (F16, F16, 2, 300, 512, 4, 2, 64, "bh", {"causal": True}, True),
    "bf16-b32-d64-1h-b-257x129": (BF16, F32, 1, 257, 129, 2, 2, 64, "1h", {"mask": "b"}, True),
    "f16-bbf-d64-rows1-none-200x384": (F16, BF16, 2, 200, 384, 2, 2, 64, (2, 1, 1, 384), {}, True),
    "bf16-b16-d64-2d-t:40,8-640-nodbias": (BF16, F16, 1, 640, 640, 2, 2, 64, "2d", {"mask": "t:40,8"}, False),
    "f16-b16-d56-bh-none-130x200": (F16, F16, 1, 130, 200, 2, 2, 56, "bh", {}, True),
    "bf16-bbf-d128-bh-causal-256": (BF16, BF16, 1, 256, 256, 2, 2, 128, "bh", {"causal": True}, True),
    "f16-b16-d128-bh-none-300x200-gqa2": (F16, F16, 1, 300, 200, 4, 2, 128, "bh", {}, True),
    "f16-bbf-d128-rows1-b-129x257": (F16, BF16, 2, 129, 257, 2, 2, 128, (2, 1, 1, 257), {"mask": "b"}, True),
    "bf16-b16-d120-2d-t:40,8-300-nodbias": (BF16, F16, 1, 300, 300, 2, 2, 120, "2d", {"mask": "t:40,8"}, False),
    "bf16-b32-d128-1h-causal-200x333": (BF16, F32, 1, 200, 333, 2, 2, 128, "1h", {"causal": True}, True),
}


@pytest.mark.parametrize("case", list(BWD_CASES))
def test_backward_bias_tile_matches_reference(case, seen):
    dtype, bdt, b, sq, sk, hq, hk, d, kind, mkw, dbias = BWD_CASES[case]
    pb = BiasInputs(dtype, bdt, "bshd", b, sq, sk, hq, hk, d, d, _shape(kind, b, hq, sq, sk), seed_for("wsbb", case))
    before = pb.dev_bias.copy() if isinstance(pb.dev_bias, cp.ndarray) else None
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=dbias)
    (main,) = [s for s in seen if s.source.startswith("fmha_bwd_dq_dk_dv")]
    if d <= 64 or pb.bias_dtype.itemsize == 2:
        assert main.source == "fmha_bwd_dq_dk_dv_sm90_ws" and main.macro("BIAS_TMA") == pb.bias_dtype.itemsize, main.name
    else:  # (fp32 bias tiles at hdim 128: more shared memory than there is)
        assert main.source == "fmha_bwd_dq_dk_dv_sm90", main.name
    check(pb, o, lse, g, kw, dbias=dbias)
    if before is not None:
        assert bool((pb.dev_bias.view(cp.uint8) == before.view(cp.uint8)).all())


def test_backward_bias_deterministic_repeats(seen):
    # ordered dQ adds with the bias build: bit-identical gradients, dBias included
    pb = BiasInputs(F16, F32, "bshd", 1, 400, 300, 2, 2, 64, 64, (1, 2, 400, 300), seed_for("wsbb-det"))
    q, k, v, do = (pb.dev[n] for n in ("q", "k", "v", "do"))
    kw = dict(pb.api_kw({"layout": "bshd", "causal": True}), dtype=pb.dtype_arg, bias=pb.dev_bias)
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
    gs = [cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw, deterministic=True, return_dbias=True)
          for _ in range(3)]
    main = [s for s in seen if s.source.startswith("fmha_bwd_dq_dk_dv")]
    assert {s.source for s in main} == {"fmha_bwd_dq_dk_dv_sm90_ws"} and main[0].macro("BIAS") == 1
    for g in gs[1:]:
        for name in ("dq", "dk", "dv", "dbias"):
            assert bool((getattr(g, name) == getattr(gs[0], name)).all()), name
    check(pb, o, lse, gs[0], {"layout": "bshd", "causal": True}, dbias=True)


# --------------------------------------------------------------------------- dBias through TMA
# (the BIAS build keeps its dS tile K-major and swizzled; for dBias in the inputs' dtype with rows of a
# 16-byte multiple, api._dbias_store hands it a map of dBias and MMA thread 0 stores each tile with two
# TMA stores, clipped at the tensor's edges; otherwise the kernel stores its dS elements one by one)

# id: (dtype, bias dtype, b, sq, sk, h, d, mask kwargs, through TMA)
DBIAS_CASES = {
    "f16-d64-none-130x200": (F16, F16, 2, 130, 200, 2, 64, {}, True),
    "bf16-d128-none-77x136": (BF16, BF16, 1, 77, 136, 3, 128, {}, True),
    "bf16-d64-causal-300x520": (BF16, BF16, 1, 300, 520, 2, 64, {"causal": True}, True),
    "f16-d120-t:40,8-200x264": (F16, F16, 2, 200, 264, 2, 120, {"mask": "t:40,8"}, True),
    "bf16-d128-b-129x72": (BF16, BF16, 1, 129, 72, 2, 128, {"mask": "b"}, True),
    "bf16-d128-none-100x129": (BF16, BF16, 1, 100, 129, 2, 128, {}, False),  # rows of 258 bytes
    "f16-bbf-d64-none-100x128": (F16, BF16, 1, 100, 128, 2, 64, {}, False),  # dBias not in the inputs' dtype
}


@pytest.mark.parametrize("case", list(DBIAS_CASES))
def test_backward_dbias_tma_store(case, monkeypatch, seen):
    """dBias of a bias that broadcasts along nothing: the NumPy reference's, every element written
    (dBias starts NaN-poisoned here without a mask and on the TMA store, which writes the zeros of the
    blocks the mask skips itself; the element-by-element store with a mask gets a zeroed dBias),
    and bit for bit what the same kernel's element-by-element store gives (api.DBIAS_TMA_STORE off),
    as dK and dV are."""
    dtype, bdt, b, sq, sk, h, d, mkw, tma = DBIAS_CASES[case]
    pb = BiasInputs(dtype, bdt, "bshd", b, sq, sk, h, h, d, d, (b, h, sq, sk), seed_for("wsbb-tma", case))
    kinds, real_store, real_direct = [], api._dbias_store, api._direct_dbias

    def store(plan, spec, bias_arg, dbias):
        out = real_store(plan, spec, bias_arg, dbias)
        kinds.append(int(out[0][6]))
        return out

    def poisoned(cp_, plan, bias_dev):
        out = real_direct(cp_, plan, bias_dev)
        # every element is stored without a mask, and by the TMA store (the skipped blocks' zeros too)
        if out is not None and (not mkw or api._dbias_tma(plan, plan.specs.dq_dk_dv, out)):
            out.view(cp.uint16).fill(0x7FC0)  # NaN in fp16 and bf16
        return out

    monkeypatch.setattr(api, "_dbias_store", store)
    monkeypatch.setattr(api, "_direct_dbias", poisoned)
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=True)
    main = [s for s in seen if s.source.startswith("fmha_bwd_dq_dk_dv")]
    assert [s.source for s in main] == ["fmha_bwd_dq_dk_dv_sm90_ws"] and main[0].macro("BIAS") == 1
    assert kinds == [api.DS_KIND_TMA if tma else {F16: 1, BF16: 2}[np.dtype(bdt)]]
    check(pb, o, lse, g, kw, dbias=True)
    monkeypatch.setattr(api, "DBIAS_TMA_STORE", False)
    q, k, v, do = (pb.dev[n] for n in ("q", "k", "v", "do"))
    g2 = cupy_fmha.attention_backward(do, q, k, v, o, lse, **pb.api_kw(kw), dtype=pb.dtype_arg, bias=pb.dev_bias,
                                      return_dbias=True)
    assert kinds[-1] != api.DS_KIND_TMA
    for name in ("dk", "dv", "dbias"):
        a, c = getattr(g, name), getattr(g2, name)
        assert bool((a.view(cp.uint16) == c.view(cp.uint16)).all()), name


def test_backward_dbias_tma_store_deterministic(monkeypatch, seen):
    """Deterministic mode (ordered dQ adds) with dBias through TMA and a causal mask: three runs bit for
    bit the same, dBias also equal to the default mode's, and the reference's."""
    pb = BiasInputs(BF16, BF16, "bshd", 1, 330, 264, 2, 2, 128, 128, (1, 2, 330, 264), seed_for("wsbb-tma-det"))
    q, k, v, do = (pb.dev[n] for n in ("q", "k", "v", "do"))
    kw = dict(pb.api_kw({"layout": "bshd", "causal": True}), dtype=pb.dtype_arg, bias=pb.dev_bias)
    kinds, real_store = [], api._dbias_store

    def store(plan, spec, bias_arg, dbias):
        out = real_store(plan, spec, bias_arg, dbias)
        kinds.append(int(out[0][6]))
        return out

    monkeypatch.setattr(api, "_dbias_store", store)
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
    gs = [cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw, deterministic=det, return_dbias=True)
          for det in (True, True, True, False)]
    assert kinds == [api.DS_KIND_TMA] * 4
    for g in gs[1:3]:
        for name in ("dq", "dk", "dv", "dbias"):
            assert bool((getattr(g, name).view(cp.uint16) == getattr(gs[0], name).view(cp.uint16)).all()), name
    assert bool((gs[3].dbias.view(cp.uint16) == gs[0].dbias.view(cp.uint16)).all())
    check(pb, o, lse, gs[0], {"layout": "bshd", "causal": True}, dbias=True)
