"""The parameter structs the GPU API builds, checked on the CPU against a stand-in CuPy
(tests/fake_cupy.py): batch mode in both layouts, GQA workspaces, deterministic slabs, the
feature groups, and the output dtypes (native bf16 in, bf16 out; uint16 bits in, bits out)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api
from cupy_fmha import launch as L
from cupy_fmha.launch import dq_dk_dv_blocks
from fake_cupy import FakeArray, Recorder, _fake, fake_cupy

BF16 = np.dtype(ml_dtypes.bfloat16)
LOG2E = 1.4426950408889634


@pytest.fixture(params=["90", "80"])
def rec(request, monkeypatch):
    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy(request.param))
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    r = Recorder()
    monkeypatch.setattr(api, "get_function", r)
    # the warp-specialized backward's tensor maps need the driver: the argument checks run, the
    # encoding is replaced by zero bytes
    from cupy_fmha.backends import tma
    monkeypatch.setattr(tma, "encode_tile_map", lambda args: np.zeros(1, np.dtype((np.void, 128))))
    return r


def _inputs(layout, b=2, sq=37, sk=53, hq=4, hk=2, d=64, dv=64, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    shape = (lambda s, h, x: (b, s, h, x)) if layout == "bshd" else (lambda s, h, x: (b, h, s, x))
    q = rng.standard_normal(shape(sq, hq, d)).astype(dtype)
    k = rng.standard_normal(shape(sk, hk, d)).astype(dtype)
    v = rng.standard_normal(shape(sk, hk, dv)).astype(dtype)
    do = rng.standard_normal(shape(sq, hq, dv)).astype(dtype)
    return q, k, v, do


def _strides(a, layout):
    st = [s // a.itemsize for s in a.strides]
    return (st[0], st[2], st[1]) if layout == "bshd" else (st[0], st[1], st[2])


def _launches(rec, stem):
    return [x for x in rec.launches if x["spec"].source.startswith(stem)]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_forward_params(rec, layout):
    q, k, v, _ = _inputs(layout)
    o, lse = cupy_fmha.attention_forward(q, k, v, layout=layout, causal=True, softmax_scale=0.3)
    (f,) = rec.launches
    a = f["args"]
    assert o.shape == q.shape and o.dtype == np.float16 and lse.shape == (2, 4, 37)
    assert (a["seqlen_q"], a["seqlen_k"]) == (37, 53) and int(a["cu_seqlens_q"]) == 0
    assert (a["q_sb"], a["q_sh"], a["q_ss"]) == _strides(q, layout)
    assert (a["k_sb"], a["k_sh"], a["k_ss"]) == _strides(k, layout)
    assert (a["o_sb"], a["o_sh"], a["o_ss"]) == _strides(o, layout)
    assert a["q"] is not None and a["lse"].shape == lse.shape
    assert (a["hdim_q"], a["hdim_v"], a["group"]) == (64, 64, 2)
    assert a["scale_log2"] == np.float32(0.3 * LOG2E)
    # causal, bottom-right: row i sees keys j <= i + sk - sq (x = 1 + 16), every key to the left
    # (row 0 already sees key 0: y - 1 >= 0 + ... any y > sq - 1 + 0 hides nothing on the left)
    assert a["mask_win_x"] == 17 and a["mask_win_y"] >= 37 and a["mask_bottom_right"] == 0
    assert int(a["alibi_slopes"]) == 0 and a["bias_kind"] == 0 and a["dropout_keep_threshold"] == 256
    assert f["grid"][1:] == (4, 2)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_params_with_gqa(rec, layout, deterministic):
    q, k, v, do = _inputs(layout)
    lse = np.zeros((2, 4, 37), np.float32)
    g = cupy_fmha.attention_backward(do, q, k, v, do, lse, layout=layout, deterministic=deterministic)
    assert g.dq.shape == q.shape and g.dk.shape == k.shape and g.dv.shape == v.shape
    (dot,) = _launches(rec, "fmha_bwd_dot_do_o")
    (main,) = _launches(rec, "fmha_bwd_dq_dk_dv")
    conv = _launches(rec, "fmha_bwd_convert_dq")
    assert len(conv) == 3  # dQ, then the GQA sums of dK and dV
    m = main["args"]
    # GQA: fp32 per-query-head dK/dV workspaces [b, hq, sk, d], summed by convert_dq
    assert m["dkdv_fp32"] == 1 and m["dk"].shape == (2, 4, 53, 64) and m["dk"].dtype == np.float32
    assert (m["dk_sb"], m["dk_sh"], m["dk_ss"]) == (4 * 53 * 64, 53 * 64, 64)
    assert (m["dout_sb"], m["dout_sh"], m["dout_ss"]) == _strides(do, layout)
    assert m["lse"].shape == (2, 4, 37) and m["delta"] is dot["args"]["delta"]
    block_n, block_m = dq_dk_dv_blocks(main["spec"])
    if deterministic and main["spec"].macro("DQ_ORDERED", 0):  # the ws kernel: ordered adds, no slabs
        ntiles = -(-37 // block_m)
        assert m["dq_split_stride"] == 0 and m["dq_sem"].shape == (2 * 4 * ntiles,) and m["dq_sem"].dtype == np.int32
        assert not m["dq_sem"].any()  # zeros
        assert dot["args"]["dq_acc"] is m["dq_acc"]  # zero-filled: the ordered adds add into it
        assert conv[0]["spec"].macro("DQ_SPLIT", 0) == 0 and conv[0]["args"]["nsplit"] == 0
    elif deterministic:
        nsplit = -(-53 // block_n)
        assert m["dq_split_stride"] == 2 * 4 * 37 * 64 and m["dq_acc"].shape == (nsplit, 2, 4, 37, 64)
        assert int(dot["args"]["dq_acc"]) == 0  # slabs are stored, not zero-filled
        assert conv[0]["spec"].macro("DQ_SPLIT") == 1 and conv[0]["args"]["nsplit"] == nsplit
    else:
        assert m["dq_split_stride"] == 0 and dot["args"]["dq_acc"] is m["dq_acc"] and int(m["dq_sem"]) == 0
        assert conv[0]["args"]["nsplit"] == 0
    c = conv[0]["args"]
    assert c["acc"] is m["dq_acc"] and (c["seqlen_q"], c["nsum"]) == (37, 1)
    assert (c["out_sb"], c["out_sh"], c["out_ss"]) == _strides(g.dq, layout)
    assert c["scale"] == np.float32(1 / 8) and (c["block_n"], c["block_m"]) == (block_n, block_m)
    for x, out, d in ((conv[1], g.dk, 64), (conv[2], g.dv, 64)):
        a = x["args"]
        assert (a["seqlen_q"], a["hdim"], a["nsum"], a["scale"]) == (53, d, 2, 1.0)
        assert (a["out_sb"], a["out_sh"], a["out_ss"]) == _strides(out, layout)
        assert x["grid"][1:] == (2, 2)


def test_features_fill_their_groups(rec):
    q, k, v, _ = _inputs("bshd", hk=4)
    slopes = np.linspace(0.1, 0.4, 4).astype(np.float32)[None].repeat(2, 0)
    cupy_fmha.attention_forward(q, k, v, alibi_slopes=slopes, dropout_p=0.1, seed=7, offset=9,
                                window_size=(3, 2))
    a = rec.launches[-1]["args"]
    assert rec.launches[-1]["spec"].macro("ALIBI") == 1 and rec.launches[-1]["spec"].macro("DROPOUT") == 1
    assert a["alibi_sb"] == 4 and np.array_equal(a["alibi_slopes"].reshape(2, 4), slopes)
    # p = 0.1: threshold floor(0.9 * 256 + 0.5) = 230 and the kept factor 256 / 230, not 1 / 0.9
    assert (a["dropout_seed"], a["dropout_offset"], a["dropout_keep_threshold"]) == (7, 9, 230)
    assert a["dropout_rp_keep"] == np.float32(256 / 230) and a["dropout_rp_keep"] != np.float32(1 / 0.9)
    assert (a["mask_win_y"], a["mask_win_x"]) == (4 - 16, 3 + 16)  # bottom-right window, sq - sk = -16
    bias = np.ones((37, 53), np.float32)
    cupy_fmha.attention_forward(q, k, v, bias=bias)
    a = rec.launches[-1]["args"]
    # on sm_90 the warp-specialized forward loads the bias through TMA: rows of 53 fp32 (212 bytes)
    # are not a multiple of 16 bytes, so it reads a copy padded to 56
    ws = rec.launches[-1]["spec"].source == "fmha_fwd_sm90_ws"
    assert ws == (rec.launches[-1]["spec"].target == "sm90a") and rec.launches[-1]["spec"].macro("BIAS_TMA", 0) == (4 if ws else 0)
    assert a["bias_kind"] == 3 and (a["bias_sb"], a["bias_sh"], a["bias_sq"], a["bias_sk"]) == (0, 0, 56 if ws else 53, 1)


def test_native_bf16_round_trip_keeps_the_dtype(rec):
    q, k, v, do = _inputs("bshd", dtype=BF16)
    o, lse = cupy_fmha.attention_forward(q, k, v)
    assert o.dtype == BF16 and rec.launches[-1]["spec"].dtype == "bf16"
    g = cupy_fmha.attention_backward(do, q, k, v, o, lse)  # no dtype=: the forward's o is accepted
    assert {x.dtype for x in g} == {BF16}


def test_uint16_bits_stay_bits(rec):
    q, k, v, do = (x.view(np.uint16) for x in _inputs("bshd", dtype=BF16))
    o, lse = cupy_fmha.attention_forward(q, k, v, dtype="bfloat16")
    assert o.dtype == np.uint16 and rec.launches[-1]["spec"].dtype == "bf16"
    g = cupy_fmha.attention_backward(do, q, k, v, o, lse, dtype="bfloat16")
    assert {x.dtype for x in g} == {np.dtype(np.uint16)}
    with pytest.raises(TypeError, match="got a uint16 array"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse)


def test_dlpack_objects_are_adopted(rec, monkeypatch):
    # an object that is neither NumPy nor CuPy but has __dlpack__ goes through cupy.from_dlpack
    q, k, v, _ = _inputs("bshd")

    class Foreign:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            raise AssertionError("the fake from_dlpack takes .a")

    calls = []

    def from_dlpack(x):
        calls.append(x)
        return api._cupy().asarray(x.a)

    cp = fake_cupy("90")
    cp.from_dlpack = from_dlpack
    monkeypatch.setattr(api, "_cupy", lambda: cp)
    o, lse = cupy_fmha.attention_forward(Foreign(q), Foreign(k), Foreign(v))
    assert len(calls) == 3 and isinstance(o, cp.ndarray)


def _ws_inputs(layout, hq, hk, d, seed):
    """fp16 Q, K, V, dO for the ws-backward map tests: batch 2 x 37 query / 53 key rows, or in group
    mode ("thd") two sequences of 37 + 5 query and 53 + 20 key tokens; returns them with the
    group-mode keywords and the maps' expected (rows_q, rows_k, batch)."""
    if layout != "thd":
        q, k, v, do = _inputs(layout, hq=hq, hk=hk, d=d, dv=d)
        return q, k, v, do, {}, 37, 53, 2
    lq, lk = [37, 5], [53, 20]
    rng = np.random.default_rng(seed)
    q, do = (rng.standard_normal((sum(lq), hq, d)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((sum(lk), hk, d)).astype(np.float16) for _ in range(2))
    cu = dict(cu_seqlens_q=np.cumsum([0] + lq).astype(np.int32), cu_seqlens_k=np.cumsum([0] + lk).astype(np.int32),
              max_seqlen_q=max(lq), max_seqlen_k=max(lk))
    return q, k, v, do, cu, sum(lq), sum(lk), 1


def _ws_backward_launches(monkeypatch, tiles: str) -> list:
    """Sets up a stand-in sm_90 device with the ws backward under CUPY_FMHA_BWD_WS_TILES=``tiles``
    (and the ws forward off: the forward only makes o and lse) and returns the list every launch
    appends (spec, args, shared_mem, block) to; the tensor maps stay unencoded (the driver call
    needs a GPU), and the ws kernel's four map arguments are dropped before the params recorder."""
    from cupy_fmha.backends import tma

    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy("90"))
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "1")
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", tiles)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "0")
    monkeypatch.setattr(tma, "encode_tile_map", lambda a: a)
    api._tile_map.cache_clear()
    raw = []

    class Raw(Recorder):
        def __call__(self, spec):
            inner = super().__call__(spec)

            class Fn:
                max_dynamic_shared_size_bytes = 1 << 20

                def __call__(self, grid, block, args, shared_mem=0):
                    raw.append((spec, args, shared_mem, block))
                    if spec.source == "fmha_bwd_dq_dk_dv_sm90_ws":
                        args = args[4:]
                    inner(grid, block, args, shared_mem=shared_mem)

            return Fn()

    monkeypatch.setattr(api, "get_function", Raw())
    return raw


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
def test_ws_backward_tensor_maps(monkeypatch, layout):
    """CUPY_FMHA_BWD_WS=1 on sm_90: the warp-specialized backward gets four TMA maps before its
    flattened params, each the column-blocked 5-D view (batch, hdim / 8, rows, heads, 8) of Q, K,
    V, dO whose element (b, c, s, h, e) is element (b, s, h, 8c + e) of the tensor (packed tokens
    as one batch entry in group mode), with one box per tile."""
    from cupy_fmha.backends import tma

    raw = _ws_backward_launches(monkeypatch, "SWIZZLE=0")  # the column-blocked build
    hq, hk, d = 4, 2, 128
    q, k, v, do, cu, rows_q, rows_k, batch = _ws_inputs(layout, hq, hk, d, seed=1)
    o, lse = cupy_fmha.attention_forward(q, k, v, layout=layout, **cu)
    raw.clear()
    cupy_fmha.attention_backward(do, q, k, v, o, lse, layout=layout, **cu)
    (spec, args, smem, block), = [r for r in raw if r[0].source == "fmha_bwd_dq_dk_dv_sm90_ws"]
    assert block == (384, 1, 1) and smem == spec.macro("SMEM_BYTES")
    for m, rows, heads, box_rows in zip(args[:4], (rows_q, rows_k, rows_k, rows_q), (hq, hk, hk, hq),
                                         (64, 128, 128, 64)):
        assert isinstance(m, tma.TileMapArgs) and m.swizzle == 0 and m.data_type == "float16"
        assert m.shape == (batch, d // 8, rows, heads, 8)
        assert m.box == (1, d // 8, box_rows, 1, 8)
        assert m.strides[1] == 16 and m.strides[4] == 2
        if layout == "bshd":
            assert m.strides[2] == heads * d * 2 and m.strides[3] == d * 2
        elif layout == "bhsd":
            assert m.strides[2] == d * 2 and m.strides[3] == m.shape[2] * d * 2
        else:
            assert m.strides[2] == heads * d * 2 and m.strides[3] == d * 2


def test_ws_backward_empty_and_unit_axes(monkeypatch):
    """The maps of the warp-specialized backward for a tensor with no rows (group mode, every
    query sequence empty: no launch at all) and for size-1 axes with stride 0 (x[None]): no error,
    and every stride a positive multiple of 16."""
    from cupy_fmha.backends import tma

    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy("90"))
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "1")
    seen = []
    monkeypatch.setattr(tma, "encode_tile_map", lambda a: seen.append(a) or np.zeros(1, np.dtype((np.void, 128))))
    monkeypatch.setattr(api, "get_function", Recorder())
    rng = np.random.default_rng(2)
    # every query sequence empty
    q = rng.standard_normal((0, 2, 64)).astype(np.float16)
    k = rng.standard_normal((15, 2, 64)).astype(np.float16)
    cu = dict(cu_seqlens_q=np.array([0, 0, 0], np.int32), cu_seqlens_k=np.array([0, 10, 15], np.int32),
              max_seqlen_q=0, max_seqlen_k=10)
    o, lse = cupy_fmha.attention_forward(q, k, k, layout="thd", **cu)
    cupy_fmha.attention_backward(q, q, k, k, o, lse, layout="thd", **cu)
    # batch 1 and one head, from x[None]: size-1 axes
    x = rng.standard_normal((33, 1, 64)).astype(np.float16)[None]
    o, lse = cupy_fmha.attention_forward(x, x, x)
    seen.clear()
    api._tile_map.cache_clear()
    cupy_fmha.attention_backward(x, x, x, x, o, lse)
    # one buffer for all four: the Q and dO maps (boxes of BLOCK_M rows) are one cached encoding, K
    # and V (128-row boxes) another, or the same one where BLOCK_M is 128 too (the default build at
    # hdim 64); the rows are axis 1 of the swizzled 4-D box (the default build), axis 2 of the
    # column-blocked 5-D one
    from cupy_fmha.backends import cuda

    rows = sorted({cuda.bwd_ws_spec("fp16", 64, 64).macro("BLOCK_M"), 128})
    assert len(seen) == len(rows) and all(s > 0 and s % 16 == 0 for a in seen for s in a.strides[:-1])
    assert sorted(a.box[1] if a.swizzle else a.box[2] for a in seen) == rows


def test_forward_ws_params_and_maps(rec, monkeypatch):
    """Under CUPY_FMHA_FWD_WS=1 the Hopper forward launches fmha_fwd_sm90_ws with four tensor maps
    (Q, K, V, and the bias's: zeros without one) before the same FwdParams; sm_80 devices keep
    fmha_fwd."""
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "1")
    q, k, v, _ = _inputs("bshd")
    cupy_fmha.attention_forward(q, k, v, causal=True)
    (f,) = rec.launches
    if f["spec"].target == "sm90a":
        assert f["spec"].source == "fmha_fwd_sm90_ws" and f["maps"] == 4
        assert f["grid"] == (1, 4, 2)  # 37 rows in one block of 128
    else:
        assert f["spec"].source == "fmha_fwd" and f["maps"] == 0
    assert (f["args"]["q_sb"], f["args"]["q_sh"], f["args"]["q_ss"]) == _strides(q, "bshd")


def test_forward_three_mma_warpgroups_at_hdim_64(monkeypatch, request):
    """At hdim 64 the ws forward's plain and ALiBi builds take three MMA warpgroups (NWG=3, 192
    query rows, 512 threads; bench/NOTES.md step 67); the dropout builds two taking turns (ping-pong:
    step 74; three serial ones, step 71, were slower once the keep mask got cheaper, step 73); the
    16-bit bias build three (step 92), the fp32 bias build and a bias with ALiBi two (three spill
    there); a diagonal mask over at most 2048 query rows the same builds since step 118 (ALIGN_END;
    FWD_WS_SHORT_BY_HDIM is empty: two had measured faster there before), in batch and group mode.
    Other head dims keep two."""
    from cupy_fmha.backends import cuda, tma

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    nwg = lambda spec: (spec.macro("NWG"), spec.macro("BLOCK_M"), spec.macro("NTHREADS"))  # noqa: E731
    for spec in (cuda.fwd_spec("bf16", 64, 64, 90), cuda.fwd_spec("fp16", 64, 64, 90, alibi=True),
                 cuda.fwd_spec("bf16", 64, 64, 90, wg_skip=True),
                 cuda.fwd_spec("bf16", 64, 64, 90, bias=True, bias_tma=2),
                 cuda.fwd_spec("bf16", 64, 64, 90, short=True),
                 cuda.fwd_spec("bf16", 64, 64, 90, bias=True, bias_tma=2, short=True)):
        assert spec.source == "fmha_fwd_sm90_ws" and nwg(spec) == (3, 192, 512), spec.name
        assert spec.macro("ALIGN_END") == 1, spec.name
    assert cuda.fwd_spec("bf16", 64, 64, 90, short=True).name == cuda.fwd_spec("bf16", 64, 64, 90).name
    pipeline = lambda spec: (spec.macro("PV_OVERLAP"), spec.macro("PINGPONG"))  # noqa: E731
    for spec in (cuda.fwd_spec("bf16", 64, 64, 90, dropout=True), cuda.fwd_spec("fp16", 64, 64, 90, alibi=True, dropout=True),
                 cuda.fwd_spec("bf16", 64, 64, 90, dropout=True, short=True),
                 cuda.fwd_spec("bf16", 64, 64, 90, alibi=True, dropout=True, short=True)):
        assert spec.source == "fmha_fwd_sm90_ws" and nwg(spec) == (2, 128, 384) and pipeline(spec) == (1, 1), spec.name
    for spec in (cuda.fwd_spec("bf16", 64, 64, 90, bias=True, bias_tma=2, alibi=True),
                 cuda.fwd_spec("fp16", 64, 64, 90, bias=True, bias_tma=4),
                 cuda.fwd_spec("bf16", 128, 128, 90), cuda.fwd_spec("bf16", 256, 256, 90)):
        assert spec.source == "fmha_fwd_sm90_ws" and nwg(spec) == (2, 128, 384), spec.name
    assert cuda.use_fwd_ws_short(True, 2048) and not cuda.use_fwd_ws_short(True, 2049)
    assert not cuda.use_fwd_ws_short(False, 100)
    # through the API: the plan passes use_fwd_ws_short(diagonal mask, seqlen_q) on, in group mode too (seen through
    # an entry put into the table for this test: since step 118 it has none)
    monkeypatch.setitem(cuda.FWD_WS_SHORT_BY_HDIM, 64, dict(NWG=2))
    from cupy_fmha import plan

    plan._fwd_spec.cache_clear()
    request.addfinalizer(plan._fwd_spec.cache_clear)  # (the entry's specs out of the cache after the test, too)
    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy("90"))
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    monkeypatch.setattr(tma, "encode_tile_map", lambda a: a)
    api._tile_map.cache_clear()
    seen = []

    class Rec(Recorder):
        def __call__(self, spec):
            seen.append(spec)
            inner = super().__call__(spec)
            if spec.source != "fmha_fwd_sm90_ws":
                return inner

            class Fn:  # (the ws forward's first four arguments are its tensor maps)
                max_dynamic_shared_size_bytes = 1 << 20

                def __call__(self, grid, block, args, shared_mem=0):
                    inner(grid, block, args[4:], shared_mem=shared_mem)

            return Fn()

    monkeypatch.setattr(api, "get_function", Rec())
    for sq, causal, want in ((300, True, 2), (2049, True, 3), (300, False, 3)):
        q, k, v, _ = _inputs("bshd", b=1, sq=sq, sk=64, hq=2, hk=2)
        seen.clear()
        cupy_fmha.attention_forward(q, k, v, causal=causal)
        assert [s.macro("NWG") for s in seen if s.source == "fmha_fwd_sm90_ws"] == [want], (sq, causal)
    for lq, causal, want in (([300, 40], True, 2), ([2049, 40], True, 3), ([300, 40], False, 3)):
        rng = np.random.default_rng(1)
        q = rng.standard_normal((sum(lq), 2, 64)).astype(np.float16)
        k, v = (rng.standard_normal((sum(lq), 2, 64)).astype(np.float16) for _ in range(2))
        cu = np.cumsum([0] + lq).astype(np.int32)
        seen.clear()
        cupy_fmha.attention_forward(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lq),
                                    max_seqlen_k=max(lq), causal=causal)
        assert [s.macro("NWG") for s in seen if s.source == "fmha_fwd_sm90_ws"] == [want], (lq, causal)


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("d", [64, 120])
def test_forward_ws_swizzled_maps(monkeypatch, layout, d):
    """CUPY_FMHA_FWD_WS_TILES=SWIZZLE=1: the ws forward's three maps are the tensors themselves as
    4-D (batch, rows, heads, hdim) views with 128-byte swizzle and boxes of 64 columns (a padded
    head dim of 128 takes two per tile; columns past hdim 120 fall outside the tensor, so TMA
    zero-fills them), rows BLOCK_M for Q and BLOCK_N for K and V; the instance carries SWIZZLE=1
    and 1024 bytes more shared memory than the column-blocked build."""
    from cupy_fmha.backends import cuda, tma

    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy("90"))
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "1")
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "SWIZZLE=1,PV_OVERLAP=1")
    monkeypatch.setattr(tma, "encode_tile_map", lambda a: a)
    api._tile_map.cache_clear()
    raw = []

    class Raw(Recorder):
        def __call__(self, spec):
            inner = super().__call__(spec)

            class Fn:
                max_dynamic_shared_size_bytes = 1 << 20

                def __call__(self, grid, block, args, shared_mem=0):
                    raw.append((spec, args, shared_mem))
                    inner(grid, block, args[4:], shared_mem=shared_mem)

            return Fn()

    monkeypatch.setattr(api, "get_function", Raw())
    hq, hk = 4, 2
    if layout == "thd":
        lq, lk = [37, 5], [53, 20]
        rng = np.random.default_rng(3)
        q = rng.standard_normal((sum(lq), hq, d)).astype(np.float16)
        k, v = (rng.standard_normal((sum(lk), hk, d)).astype(np.float16) for _ in range(2))
        cu = dict(cu_seqlens_q=np.cumsum([0] + lq).astype(np.int32), cu_seqlens_k=np.cumsum([0] + lk).astype(np.int32),
                  max_seqlen_q=max(lq), max_seqlen_k=max(lk))
        rows_q, rows_k, batch = sum(lq), sum(lk), 1
    else:
        q, k, v, _ = _inputs(layout, hq=hq, hk=hk, d=d, dv=d)
        cu, rows_q, rows_k, batch = {}, 37, 53, 2
    cupy_fmha.attention_forward(q, k, v, layout=layout, causal=True, **cu)
    (spec, args, smem), = raw
    assert spec.source == "fmha_fwd_sm90_ws" and spec.macro("SWIZZLE") == 1 and spec.macro("PV_OVERLAP") == 1
    plain = cuda.fwd_ws_spec("fp16", d, d, tiles=dict(NWG=spec.macro("NWG"), BLOCK_N=128, PV_OVERLAP=1,
                                                     O_REG=1 - spec.macro("O_STAGE")))
    assert smem == spec.macro("SMEM_BYTES") == plain.macro("SMEM_BYTES") + 1024
    bm = 64 * spec.macro("NWG")  # Q's box: the CTA's query rows (at hdim 64 three MMA warpgroups since step 118, also
    assert bm == spec.macro("BLOCK_M") == (192 if d == 64 else 128)  # under a causal mask over 37 or 53 rows)
    for m, rows, heads, box_rows, x in zip(args[:3], (rows_q, rows_k, rows_k), (hq, hk, hk), (bm, 128, 128), (q, k, v)):
        assert isinstance(m, tma.TileMapArgs) and m.swizzle == 128 and m.data_type == "float16"
        assert m.shape == (batch, rows, heads, d) and m.box == (1, box_rows, 1, 64)
        assert m.box_bytes == box_rows * 128 and m.strides[3] == 2
        if layout == "bhsd":
            assert m.strides[1:3] == (d * 2, rows * d * 2)
        else:
            assert m.strides[1:3] == (heads * d * 2, d * 2)
    assert not np.asarray(args[3]).tobytes().strip(b"\0")  # the bias's map: zeros without a bias
    api._tile_map.cache_clear()


def _sm90_recorder(monkeypatch):
    """A stand-in sm_90 device: (the launch recorder, the TileMapArgs each map was encoded from,
    encoded as zeros); the map caches are emptied."""
    from cupy_fmha.backends import tma

    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy("90"))
    monkeypatch.setattr(api, "_CC", {})
    monkeypatch.delenv("CUPY_FMHA_DISABLE_WGMMA", raising=False)
    encoded = []
    monkeypatch.setattr(tma, "encode_tile_map", lambda a: (encoded.append(a), np.zeros(1, np.dtype((np.void, 128))))[1])
    api._bias_map_cached.cache_clear()
    api._tile_map.cache_clear()
    rec = Recorder()
    monkeypatch.setattr(api, "get_function", rec)
    return rec, encoded


@pytest.mark.parametrize("bias_shape, bias_dtype, dims, box_rows, copied", [
    ((2, 4, 37, 64), np.float16, (2, 4, 37, 64), None, False),  # rows of 128 bytes: read in place
    ((4, 37, 64), np.float32, (1, 4, 37, 64), None, False),     # broadcast over the batch: 1
    ((2, 1, 1, 64), np.float32, (2, 1, 1, 64), 1, False),       # broadcast along the rows: one-row boxes
    ((37, 53), np.float16, (1, 1, 37, 53), None, True),         # 106-byte rows: a padded copy (56)
])
def test_forward_ws_bias_map(monkeypatch, bias_shape, bias_dtype, dims, box_rows, copied):
    """The ws forward's 4th map (api._bias_map): the bias as a 4-D (batch, heads, rows, keys) map,
    1 along broadcast dimensions, boxes of 128 bytes of keys (64 16-bit or 32 fp32 elements) by
    BLOCK_M rows (``box_rows`` None; 192 for the 16-bit bias at hdim 64, 128 for fp32; 1 for a bias
    broadcast along the rows), 128-byte swizzle; rows that are not
    16-byte multiples are read from a padded copy (the BiasArg then carries the copy's strides);
    a bias broadcast along the keys runs on fmha_fwd_sm90 without maps."""
    rec, encoded = _sm90_recorder(monkeypatch)
    q, k, v, _ = _inputs("bshd", sk=dims[3])
    bias = np.random.default_rng(1).standard_normal(bias_shape).astype(bias_dtype)
    cupy_fmha.attention_forward(q, k, v, bias=bias)
    (f,) = rec.launches
    item = np.dtype(bias_dtype).itemsize
    assert f["spec"].source == "fmha_fwd_sm90_ws" and f["spec"].macro("BIAS_TMA") == item
    assert f["maps"] == 4
    (m,) = [a for a in encoded if a.data_type != "float16"]  # (q, k, v: float16)
    assert m.swizzle == 128
    assert m.data_type == ("float32" if item == 4 else "uint16")
    assert f["spec"].macro("BLOCK_M") == (192 if item == 2 else 128)  # (FWD_WS_BIAS_BY_HDIM at hdim 64)
    assert m.shape == dims and m.box == (1, 1, f["spec"].macro("BLOCK_M") if box_rows is None else box_rows, 128 // item)
    pitch = -(-dims[3] * item // 16) * 16 if copied else dims[3] * item
    assert m.strides[2:] == ((pitch if dims[2] > 1 else 16), item)
    assert f["args"]["bias_sq"] == (pitch // item if dims[2] > 1 else 0) and f["args"]["bias_sk"] == 1
    api._bias_map_cached.cache_clear()
    api._tile_map.cache_clear()
    rec.launches.clear()
    cupy_fmha.attention_forward(q, k, v, bias=np.zeros((37, 1), np.float16))  # along the keys
    (f,) = rec.launches
    assert f["spec"].source == "fmha_fwd_sm90" and f["maps"] == 0


def test_forward_ws_variant_switch(monkeypatch):
    """CUPY_FMHA_FWD_WS_TILES picks the ws forward's pipeline variants (all three on by default);
    macros at 0 stay out of the instance (all at 0 is the first ws forward's name); PINGPONG
    without PV_OVERLAP is refused."""
    from cupy_fmha.backends import cuda

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    base = cuda.fwd_ws_spec("bf16", 128, 128)
    assert (base.macro("SWIZZLE"), base.macro("PV_OVERLAP"), base.macro("PINGPONG")) == (1, 1, 1)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "SWIZZLE=0,PV_OVERLAP=0,PINGPONG=0")
    first = cuda.fwd_ws_spec("bf16", 128, 128)
    assert all(first.macro(k) is None for k in cuda.FWD_WS_VARIANTS)
    assert first.name == cuda.fwd_ws_spec("bf16", 128, 128, tiles=dict(NWG=2, BLOCK_N=128, MASK_ROWS=2, **cuda.FWD_WS_SOFTMAX)).name
    assert base.macro("SMEM_BYTES") == first.macro("SMEM_BYTES") + 1024
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "SWIZZLE=1,PV_OVERLAP=1,PINGPONG=1")
    assert cuda.fwd_ws_spec("bf16", 128, 128).name == base.name
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "PV_OVERLAP=0")
    with pytest.raises(ValueError, match="PINGPONG=1 needs PV_OVERLAP=1"):
        cuda.fwd_ws_spec("bf16", 128, 128)


def test_ws_softmax_variant_switches(monkeypatch):
    """The step-87 softmax variants (SMAX_TREE, MASK_ROWS, EXP_EMU, LAZY_RESCALE): named in the instance
    when on, left out at 0 (the name of an instance without them), EXP_EMU and LAZY_RESCALE bounded (tiles of 8;
    P up to 2^LAZY_RESCALE, which float16 holds to 15); since step 113 the default at 128 has FOLD, SMAX_TREE
    and LAZY_RESCALE=8 (FWD_WS_SOFTMAX)."""
    from cupy_fmha.backends import cuda

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    base = cuda.fwd_ws_spec("bf16", 128, 128)
    assert [base.macro(k) for k in ("FOLD", "SMAX_TREE", "LAZY_RESCALE")] == [1, 1, 8], base.name
    plain = cuda.fwd_ws_spec("bf16", 128, 128, tiles=dict(NWG=2, BLOCK_N=128, **cuda.FWD_WS_VARIANTS))
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "FOLD=0,SMAX_TREE=0,MASK_ROWS=0,EXP_EMU=0,LAZY_RESCALE=0")
    assert cuda.fwd_ws_spec("bf16", 128, 128).name == plain.name
    assert not any(k in plain.name for k in ("FOLD", "SMAX_TREE", "MASK_ROWS", "EXP_EMU", "LAZY_RESCALE"))
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "SMAX_TREE=1,MASK_ROWS=1,EXP_EMU=2,LAZY_RESCALE=8")
    spec = cuda.fwd_ws_spec("bf16", 128, 128)
    assert [spec.macro(k) for k in ("SMAX_TREE", "MASK_ROWS", "EXP_EMU", "LAZY_RESCALE")] == [1, 1, 2, 8]
    # KEEP_SINK (step 116; the default at 64): the dropout builds' overlapped pipeline only; left out of the others' names
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "KEEP_SINK=0")
    assert cuda.fwd_ws_spec("bf16", 64, 64, dropout=True).macro("KEEP_SINK") is None
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "KEEP_SINK=1")
    assert cuda.fwd_ws_spec("bf16", 128, 128, dropout=True).macro("KEEP_SINK") == 1
    assert cuda.fwd_ws_spec("bf16", 64, 64, dropout=True).macro("KEEP_SINK") == 1
    assert cuda.fwd_ws_spec("bf16", 128, 128).name == base.name
    assert "KEEP_SINK" not in cuda.fwd_ws_spec("bf16", 256, 256, dropout=True).name  # (the serial pipeline)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "KEEP_SINK=2")
    assert cuda.fwd_ws_spec("bf16", 128, 128, dropout=True).macro("KEEP_SINK") == 2
    for bad in ("EXP_EMU=9", "EXP_EMU=-1", "LAZY_RESCALE=16", "LAZY_RESCALE=-2", "MASK_ROWS=3", "KEEP_SINK=3"):
        monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", bad)
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            cuda.fwd_ws_spec("bf16", 128, 128)


def test_ws_switches_by_head_dim(monkeypatch):
    """The measured per-head-dim switches (bench/NOTES.md steps 36, 37, 113): the ws backward's LSE2 is
    on at hdim 64 (also for head dims that pad to 64) and out of the hdim-128 instances, whose names (and
    code) stay as before; the ws forward's FOLD is on at 64, 128 and 256 (step 113, with SMAX_TREE and
    LAZY_RESCALE) and at 192 (step 115); the tile variables turn them off for A/B runs; the
    ALiBi build of the forward keeps the unfolded softmax in the kernel."""
    from cupy_fmha.backends import cuda

    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES", raising=False)
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    for dq in (64, 56):
        assert cuda.bwd_ws_spec("bf16", dq, dq).macro("LSE2") == 1
        assert cuda.fwd_ws_spec("fp16", dq, dq).macro("FOLD") == 1
    b128 = cuda.bwd_ws_spec("bf16", 128, 128)
    assert b128.macro("LSE2") is None and "LSE2" not in b128.name
    for dq in (120, 128, 160, 192, 256):
        assert cuda.fwd_ws_spec("bf16", dq, dq).macro("FOLD") == 1
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "LSE2=0")
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "FOLD=0")
    assert cuda.bwd_ws_spec("bf16", 64, 64).macro("LSE2") is None
    assert cuda.fwd_ws_spec("bf16", 64, 64).macro("FOLD") is None
    assert cuda.bwd_ws_spec("bf16", 64, 64).macro("BLOCK_M") == 128  # (the other entries stay)
    src = (Path(__file__).parents[1] / "kernels" / "fmha_fwd_sm90_ws.cu").read_text()
    assert "FOLD && !ALIBI" in src


def test_forward_o_stage_by_head_dim(monkeypatch):
    """The ws forward's O leaves through the shared-memory stage (derived macro O_STAGE, bench/NOTES.md
    step 63) at hdim 128 (its dropout and ALiBi builds too), not at 64 (O_REG=1, measured slower
    there), nor where the stage does not fit (192, 256, the bias builds at 128, an fp32 bias at 64);
    the variable's O_REG switches it for A/B runs, and the stage's bytes are in SMEM_BYTES."""
    from cupy_fmha.backends import cuda

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    staged = cuda.fwd_ws_spec("bf16", 128, 128)
    assert staged.macro("O_STAGE") == 1 and "O_REG" not in staged.name
    assert cuda.fwd_ws_spec("fp16", 120, 120, dropout=True).macro("O_STAGE") == 1
    assert cuda.fwd_ws_spec("bf16", 128, 128, alibi=True).macro("O_STAGE") == 1
    for spec in (cuda.fwd_ws_spec("bf16", 64, 64), cuda.fwd_ws_spec("bf16", 192, 192), cuda.fwd_ws_spec("bf16", 256, 256),
                 cuda.fwd_ws_spec("bf16", 128, 128, bias_tma=2), cuda.fwd_ws_spec("bf16", 64, 64, bias_tma=4)):
        assert spec.macro("O_STAGE") == 0, spec.name
        assert spec.macro("SMEM_BYTES") <= cuda.SMEM_LIMIT
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "O_REG=1")
    plain = cuda.fwd_ws_spec("bf16", 128, 128)
    assert plain.macro("O_STAGE") == 0 and plain.name != staged.name
    assert staged.macro("SMEM_BYTES") == plain.macro("SMEM_BYTES") + 2 * 128 * (128 + 8)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "O_REG=0")
    assert cuda.fwd_ws_spec("bf16", 64, 64).macro("O_STAGE") == 1


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("d", [64, 120])
def test_ws_backward_swizzled_maps(monkeypatch, layout, d):
    """CUPY_FMHA_BWD_WS_TILES=SWIZZLE=1: the ws backward's four maps (Q, K, V, dO) are the tensors
    themselves as 4-D (batch, rows, heads, hdim) views with 128-byte swizzle and boxes of 64
    columns (a padded head dim of 128 takes two per tile; columns past hdim 120 fall outside the
    tensor, so TMA zero-fills them), rows BLOCK_M for Q and dO (128 at hdim 64, 64 at 120) and
    BLOCK_N = 128 for K and V
    (packed tokens as one batch entry in group mode); the instance carries SWIZZLE=1 and 1024 bytes
    more shared memory than the column-blocked build, and the launch passes that size."""
    from cupy_fmha.backends import cuda, tma

    raw = _ws_backward_launches(monkeypatch, "SWIZZLE=1")
    hq, hk = 4, 2
    q, k, v, do, cu, rows_q, rows_k, batch = _ws_inputs(layout, hq, hk, d, seed=4)
    o, lse = cupy_fmha.attention_forward(q, k, v, layout=layout, causal=True, **cu)
    raw.clear()
    cupy_fmha.attention_backward(do, q, k, v, o, lse, layout=layout, causal=True, **cu)
    (spec, args, smem, block), = [r for r in raw if r[0].source == "fmha_bwd_dq_dk_dv_sm90_ws"]
    assert spec.macro("SWIZZLE") == 1 and block == (384, 1, 1)
    bm = spec.macro("BLOCK_M")
    assert bm == (128 if d == 64 else 64)
    plain = cuda.derived_macros(spec.source, {**dict(spec.macros), "SWIZZLE": 0})["SMEM_BYTES"]
    assert smem == spec.macro("SMEM_BYTES") == plain + 1024
    for m, rows, heads, box_rows in zip(args[:4], (rows_q, rows_k, rows_k, rows_q), (hq, hk, hk, hq),
                                         (bm, 128, 128, bm)):
        assert isinstance(m, tma.TileMapArgs) and m.swizzle == 128 and m.data_type == "float16"
        assert m.shape == (batch, rows, heads, d) and m.box == (1, box_rows, 1, 64)
        assert m.box_bytes == box_rows * 128 and m.strides[3] == 2
        if layout == "bhsd":
            assert m.strides[1:3] == (d * 2, rows * d * 2)
        else:
            assert m.strides[1:3] == (heads * d * 2, d * 2)
    api._tile_map.cache_clear()


def test_ws_backward_variant_switch(monkeypatch):
    """CUPY_FMHA_BWD_WS_TILES picks the ws backward's variants (SWIZZLE, on by default since the
    H200 measured it faster, bench/NOTES.md step 30; SWIZZLE=0 gives the column-blocked build,
    whose instance keeps the old name); an unknown entry is refused; the plan cache keys on the
    variable (a process can A/B both builds); the shared memory of both builds fits the 227 KB of
    sm_90 at hdim 128 with two stages (SWIZZLE: 1024 bytes more, to align the tiles)."""
    from cupy_fmha.backends import cuda
    from cupy_fmha.spec import TUNING_VARS

    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES", raising=False)
    sw = cuda.bwd_ws_spec("bf16", 128, 128)
    # (and DESC_ADDR, the descriptors from one 32-bit address, since step 104; DESC_ADDR=0 the pointer-formed build)
    assert sw.macro("SWIZZLE") == 1 and cuda.BWD_WS_VARIANTS == dict(SWIZZLE=1, DESC_ADDR=1)
    plain_name = "fmha_bwd_dq_dk_dv_sm90_ws_bf16_BLOCK_M64_BLOCK_N128_HDIM_Q128_HDIM_V128_NWG2"
    # (80 rows, SPLIT_PDS=2 and the dQ writer at hdim 128: BWD_WS_BY_HDIM, step 100; under a short
    # diagonal mask the 64-row build with SPLIT_PDS=1, step 57)
    assert sw.name == ("fmha_bwd_dq_dk_dv_sm90_ws_bf16_BLOCK_M80_BLOCK_N128_DESC_ADDR1_DQ_WRITER1_HDIM_Q128_HDIM_V128"
                       "_NWG2_SPLIT_PDS2_SWIZZLE1")
    assert cuda.bwd_ws_spec("bf16", 128, 128, diagonal=True).name == (
        plain_name.replace("_BLOCK_N128_", "_BLOCK_N128_DESC_ADDR1_") + "_SPLIT_PDS1_SWIZZLE1")
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "SPLIT_PDS=0,DESC_ADDR=0")
    assert cuda.bwd_ws_spec("bf16", 128, 128, diagonal=True).name == plain_name + "_SWIZZLE1"
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "SWIZZLE=1")
    assert cuda.bwd_ws_spec("bf16", 128, 128).name == sw.name
    assert cuda.bwd_specs("bf16", 120, 120, 90).dq_dk_dv.name == sw.name
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "SWIZZLE=0,DESC_ADDR=0")
    base = cuda.bwd_ws_spec("bf16", 128, 128)
    assert base.macro("SWIZZLE") is None and base.name == plain_name + "_SPLIT_PDS1"
    assert cuda.bwd_specs("bf16", 120, 120, 90).dq_dk_dv.name == base.name
    # K, V 2 x 32 KB; Q, dO 2 stages x 2 x 16 KB; dS^T 2 x 16 KB; dQ 32 KB; LSE, D 1 KB; 5 mbarriers
    # (the 80-row build: Q, dO, dS^T 20 KB each, dQ 40 KB, LSE, D 1.25 KB, the writer's 40 bytes)
    assert base.macro("SMEM_BYTES") == 197672 and sw.macro("SMEM_BYTES") == 231760 <= cuda.SMEM_LIMIT
    # (column-blocked: 64 rows, the short-diagonal entries, with or without a diagonal)
    assert cuda.bwd_ws_spec("bf16", 128, 128, diagonal=True).name == base.name
    assert cuda.bwd_ws_spec("bf16", 64, 64).macro("SMEM_BYTES") == 115752
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES")
    # (the default at hdim 64: 128 query rows per step, BWD_WS_BY_HDIM; the 64-row build is 116,776 B)
    assert cuda.bwd_ws_spec("bf16", 64, 64).macro("SMEM_BYTES") == 199720
    assert "CUPY_FMHA_BWD_WS_TILES" in TUNING_VARS
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "SWIZLE=1")
    with pytest.raises(ValueError, match="unknown entries"):
        cuda.bwd_ws_spec("bf16", 128, 128)
    # the experimental table compiles the column-blocked builds (hdim 64/128, both dtypes, ALiBi
    # or not); the default table the SWIZZLE ones
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES")
    names = {s.name for s in cuda.experimental_table()}
    assert plain_name in names and sw.name not in names
    blocked = [n for n in names if "sm90_ws" in n and "bwd" in n and "SWIZZLE" not in n]
    assert sum("DESC_ADDR" not in n for n in blocked) == 8 and sum("DESC_ADDR" in n for n in blocked) == 8
    # 128 query rows per step at hdim 64 by default (BWD_WS_BY_HDIM, step 35), 64 at hdim 128 even
    # when asked for 128 (320 KB of shared memory) and in the column-blocked build; the swizzled
    # 64-row builds of hdim 64 (the default before step 35) stay in the experimental table
    bm128 = [cuda.bwd_ws_spec(dt, 64, 64, alibi=a) for dt in ("bf16", "fp16") for a in (False, True)]
    assert all(s.macro("BLOCK_M") == 128 and s.macro("SWIZZLE") == 1 for s in bm128)
    assert max(s.macro("SMEM_BYTES") for s in bm128) == 199720 <= cuda.SMEM_LIMIT
    assert not {s.name for s in bm128} & names
    bm64 = [cuda.bwd_ws_spec(dt, 64, 64, alibi=a, tiles=dict(NWG=2, BLOCK_N=128, BLOCK_M=64, SWIZZLE=1))
            for dt in ("bf16", "fp16") for a in (False, True)]
    assert sorted(n for n in names if "BLOCK_M64" in n and "HDIM_Q64" in n and "ws" in n and "SWIZZLE1" in n
                  and "bwd" in n and "DROPOUT" not in n) == sorted(s.name for s in bm64)
    # the dropout builds it replaced (CUPY_FMHA_BWD_WS=0 only) at both dims
    drops = [n for n in names if "bwd_dq_dk_dv_sm90_" in n and "ws" not in n and "DROPOUT1" in n]
    assert len(drops) == 8 and all("DQ_BULK0" in n for n in drops)
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "BLOCK_M=128")
    assert cuda.bwd_ws_spec("bf16", 64, 64).macro("BLOCK_M") == 128
    # (128 rows do not fit at hdim 128: the 64-row entries, as under a short diagonal)
    assert cuda.bwd_ws_spec("bf16", 128, 128).name == cuda.bwd_ws_spec("bf16", 128, 128, diagonal=True).name
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "BLOCK_M=64,LSE2=0,DESC_ADDR=0")
    assert cuda.bwd_ws_spec("bf16", 64, 64).name == bm64[0].name
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "SWIZZLE=0")
    assert cuda.bwd_ws_spec("bf16", 64, 64).macro("BLOCK_M") == 64
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "BLOCK_M=96")
    with pytest.raises(ValueError, match="BLOCK_M must be 64, 80 or 128"):
        cuda.bwd_ws_spec("bf16", 64, 64)
    # 80 rows (GEMM4 as dQ^T, bench/NOTES.md step 100) where hdim_q pads to 128 and the tiles are
    # swizzled, without the bias or dropout; elsewhere 64 rows; the workspace's chunks then kind 2
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "BLOCK_M=80,SPLIT_PDS=0")
    bm80 = cuda.bwd_ws_spec("bf16", 128, 128)
    assert bm80.macro("BLOCK_M") == 80 and bm80.macro("SMEM_BYTES") == 231760 <= cuda.SMEM_LIMIT  # (with the writer)
    assert L.dq_tile_kind(bm80) == L.dq_tile_kind(sw) == 2 and L.dq_tile_kind(cuda.bwd_ws_spec("bf16", 64, 64)) == 1
    assert L.dq_workspace(bm80, 2, 3, 161, 200, 128, False).shape == (2, 3, 240, 128)
    assert cuda.bwd_ws_spec("bf16", 120, 64).macro("BLOCK_M") == 80
    for hq, hv, kw in ((64, 64, {}), (64, 128, {}), (128, 128, dict(dropout=True)), (128, 128, dict(bias_tma=2))):
        assert cuda.bwd_ws_spec("bf16", hq, hv, **kw).macro("BLOCK_M") == 64
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "BLOCK_M=80,SWIZZLE=0")
    assert cuda.bwd_ws_spec("bf16", 128, 128).macro("BLOCK_M") == 64


def test_ws_backward_switch_reaches_the_launch(rec, monkeypatch):
    """The same process, one call with the default (SWIZZLE) build and one under
    CUPY_FMHA_BWD_WS_TILES=SWIZZLE=0: the plan cache keys on the variable, so the second call
    launches the column-blocked build
    (what bench/ab.py --env-b and bench/probe/bwd_variants.py rely on)."""
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "1")
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES", raising=False)
    q, k, v, do = _inputs("bshd", d=128, dv=128)
    o, lse = cupy_fmha.attention_forward(q, k, v, causal=True)
    seen = []
    for val in ("", "SWIZZLE=0", ""):
        monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", val)
        rec.launches.clear()
        cupy_fmha.attention_backward(do, q, k, v, o, lse, causal=True)
        seen += [x["spec"].macro("SWIZZLE", 0) for x in _launches(rec, "fmha_bwd_dq_dk_dv_sm90")]
    if any(x["spec"].target == "sm90a" for x in rec.launches):
        assert seen == [1, 0, 1]
    else:
        assert seen == []


@pytest.mark.parametrize("d, bias_shape, ws, bias_dtype", [
    (64, (2, 4, 37, 53), True, np.float16),    # 106-byte rows: the padded copy, BLOCK_M 64
    (64, (4, 1, 53), True, np.float16),        # broadcast along the rows
    (64, (37, 1), False, np.float16),          # broadcast along the keys: fmha_bwd_dq_dk_dv_sm90
    (128, (2, 4, 37, 53), True, np.float16),   # hdim 128 too (BWD_WS_BIAS_HDIMS, step 52)
    (128, (4, 1, 53), True, np.float16),
    (128, (2, 4, 37, 53), False, np.float32),  # an fp32 bias at hdim 128: its tiles do not fit
    (64, (2, 4, 37, 64), True, np.float16),    # 128-byte rows, dBias in the inputs' dtype: its TMA store
    (128, (2, 4, 37, 64), True, np.float16),
    (64, (2, 4, 37, 64), True, np.float32),    # an fp32 dBias: stored element by element
])
def test_backward_ws_bias_routing_and_maps(monkeypatch, d, bias_shape, ws, bias_dtype):
    """The ws backward takes a bias TMA can read at hdim 64 and 128 (its BIAS build, 64 query rows per
    step, six tensor maps: Q, K, V, dO, the bias's, whose boxes are BLOCK_M rows, and dBias's); other
    biases (and fp32 ones at hdim 128) run fmha_bwd_dq_dk_dv_sm90 without maps. dBias of a bias that
    broadcasts along nothing, in the inputs' dtype, with rows of a 16-byte multiple, leaves through
    the 6th map (ds_kind DS_KIND_TMA, boxes of 64 keys x BLOCK_M rows, a null dbias_acc); otherwise
    dBias (or its workspace) is handed over as dbias_acc and the 6th map is zeros."""
    rec, encoded = _sm90_recorder(monkeypatch)
    sk = bias_shape[-1] if bias_shape[-1] > 1 else 53
    q, k, v, do = _inputs("bshd", d=d, dv=d, sk=sk)
    bias = np.random.default_rng(2).standard_normal(bias_shape).astype(bias_dtype)
    o, lse = cupy_fmha.attention_forward(q, k, v, bias=bias)
    encoded.clear()
    rec.launches.clear()
    cupy_fmha.attention_backward(do, q, k, v, o, lse, bias=bias, return_dbias=True)
    (m,) = _launches(rec, "fmha_bwd_dq_dk_dv")
    assert (m["spec"].source == "fmha_bwd_dq_dk_dv_sm90_ws") == ws, m["spec"].name
    tma_store = ws and sk == 64 and bias_dtype == np.float16
    if tma_store:
        assert int(m["args"]["bias_ds_kind"]) == api.DS_KIND_TMA and not m["args"]["dbias_acc"]
    else:
        assert m["args"]["dbias_acc"].shape == (2, 4, 37, sk)
        assert int(m["args"]["bias_ds_kind"]) in (0, 1)
    if ws:
        assert m["maps"] == 6 and m["spec"].macro("BIAS_TMA") == np.dtype(bias_dtype).itemsize
        assert m["spec"].macro("BLOCK_M") == 64
        maps = [a for a in encoded if a.data_type in ("uint16", "float32")]
        assert len(maps) == (2 if tma_store else 1)
        assert maps[0].box == (1, 1, 64 if bias_shape[-2] != 1 else 1, 128 // np.dtype(bias_dtype).itemsize)
        if tma_store:
            assert maps[1].shape == (2, 4, 37, 64) and maps[1].box == (1, 1, 64, 64) and maps[1].swizzle == 128
        assert m["args"]["bias_sk"] == 1 and m["args"]["bias_sq"] in (0, 56, 64)
    else:
        assert m["maps"] == 0
    api._bias_map_cached.cache_clear()
    api._tile_map.cache_clear()


@pytest.mark.parametrize("d", [256, 200])
def test_backward_wide_ws_maps(monkeypatch, d):
    """Head dims above 128 run the wide ws backward (rounded up to 256): four tensor maps (Q, K, V, dO)
    of the plain tensors in 128-byte-swizzled boxes of 64 rows x 64 columns, as its tiles are laid
    out (a map of the column-blocked view here is an illegal instruction on the GPU), the true head
    dim as the map's extent (TMA zero-fills the rest); the tiled dQ workspace (rows of the padded head
    dim, whole 64-row tiles: the kernel stages dQ in its Q and dO buffers and adds whole tiles)."""
    rec, encoded = _sm90_recorder(monkeypatch)
    q, k, v, do = _inputs("bshd", d=d, dv=d)
    o, lse = cupy_fmha.attention_forward(q, k, v)
    encoded.clear()
    rec.launches.clear()
    cupy_fmha.attention_backward(do, q, k, v, o, lse)
    (m,) = _launches(rec, "fmha_bwd_dq_dk_dv")
    assert m["spec"].source == "fmha_bwd_dq_dk_dv_sm90_ws_wide" and m["maps"] == 4
    assert len(encoded) == 4 and all(a.swizzle == 128 and a.box == (1, 64, 1, 64) and a.shape[-1] == d for a in encoded)
    assert m["args"]["dq_acc"].shape[-1] == 256 and m["args"]["dq_acc"].shape[-2] % 64 == 0
    assert m["spec"].macro("DQ_TILED") == 1 and int(m["args"]["dq_sem"]) == 0  # (no semaphores outside deterministic mode)
    api._tile_map.cache_clear()


def _on_device(x):
    """``x`` as a (stand-in) CuPy array, so that the API reads it in place instead of copying it."""
    return _fake(np.ascontiguousarray(x) if not isinstance(x, FakeArray) else x)


def _broadcast_view(x, shape):
    return _fake(np.broadcast_to(_on_device(x), shape))


def test_backward_refuses_a_missing_lse(rec):
    q, k, v, do = _inputs("bshd")
    with pytest.raises(TypeError, match="lse: expected the forward's float32 log-sum-exp"):
        cupy_fmha.attention_backward(do, q, k, v, do, None)
    cu = np.array([0, 5, 12], np.int32)
    x = np.zeros((12, 4, 64), np.float16)
    with pytest.raises(TypeError, match="lse: expected the forward's float32 log-sum-exp"):
        cupy_fmha.attention_backward(x, x, x, x, x, None, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert not rec.launches


def test_out_buffers_may_not_alias(rec):
    """Outputs that share memory with an input the kernels read, with each other, or between their own
    elements (a broadcast view) are refused before any launch, naming the buffer; interleaved views of
    one buffer that share no element (dq, dk, dv of a packed [b, s, 3, h, d] gradient) are fine."""
    q, k, v, do = (_on_device(x) for x in _inputs("bshd", sk=37, hk=4))  # each [2, 37, 4, 64]
    lse = _on_device(np.zeros((2, 4, 37), np.float32))
    v_before = np.array(v)

    def fresh():
        return _on_device(np.zeros(q.shape, np.float16))

    def lse_buf():
        return _on_device(np.zeros((2, 4, 37), np.float32))

    with pytest.raises(ValueError, match="out: o shares memory with the input v"):
        cupy_fmha.attention_forward(q, k, v, out=(v, lse_buf()))
    with pytest.raises(ValueError, match="out: o shares memory with the input q"):  # q itself through a view
        cupy_fmha.attention_forward(q, k, v, out=(_fake(q[:, :, :]), lse_buf()))
    with pytest.raises(ValueError, match="out: lse shares memory with the input q"):  # lse inside q's bytes
        inside_q = _fake(q.reshape(-1).view(np.float32)[:2 * 4 * 37].reshape(2, 4, 37))
        cupy_fmha.attention_forward(q, k, v, out=(fresh(), inside_q))
    x = fresh()
    with pytest.raises(ValueError, match="out: dq and dk share memory"):
        cupy_fmha.attention_backward(do, q, k, v, do, lse, out=(x, x, fresh()))
    with pytest.raises(ValueError, match="out: dk shares memory with the input k"):
        cupy_fmha.attention_backward(do, q, k, v, do, lse, out=(fresh(), k, fresh()))
    with pytest.raises(ValueError, match="out: dv shares memory with the input do"):
        cupy_fmha.attention_backward(do, q, k, v, do, lse, out=(fresh(), fresh(), do))
    with pytest.raises(ValueError, match="out: o's strides .* let elements share memory"):
        cupy_fmha.attention_forward(q, k, v, out=(_broadcast_view(np.zeros((1, 37, 4, 64), np.float16), q.shape), lse))
    assert not rec.launches and np.array_equal(v, v_before)
    g = _on_device(np.zeros((2, 37, 3, 4, 64), np.float16))
    views = tuple(_fake(g[:, :, i]) for i in range(3))
    res = cupy_fmha.attention_backward(do, q, k, v, do, lse, out=views)
    assert all(r is w for r, w in zip(res, views)) and rec.launches
    rec.launches.clear()
    o, lse2 = cupy_fmha.attention_forward(q, k, v, out=(_fake(g[:, :, 0]), lse))  # writes lse, which it only writes
    assert rec.launches and lse2 is lse


def test_broadcast_inputs(rec):
    """Zero-stride (broadcast) q / k / v are read in place by the mma.sync kernels and from a dense copy
    by the TMA kernels (tensor maps need positive strides); a bias broadcast along the keys by a zero
    stride runs on the build without TMA bias loads, as a bias of shape [..., 1] does."""
    q, k, v, do = (_on_device(x) for x in _inputs("bshd", hk=4))
    kb, vb = _broadcast_view(k[:1], k.shape), _broadcast_view(v[:, :1], v.shape)
    cupy_fmha.attention_forward(q, kb, vb)
    (f,) = rec.launches
    a, tma = f["args"], f["spec"].target == "sm90a"
    assert (a["k_sb"] != 0, a["v_ss"] != 0) == (tma, tma)
    assert (a["k"] is kb) == (not tma) and np.array_equal(a["k"], kb) and np.array_equal(a["v"], vb)
    rec.launches.clear()
    bias = _broadcast_view(np.linspace(-1, 1, 37, dtype=np.float32)[:, None], (37, 53))
    cupy_fmha.attention_forward(q, k, v, bias=bias)
    (f,) = rec.launches
    assert f["spec"].macro("BIAS_TMA", 0) == 0 and f["maps"] in (0, 3)
    assert (f["args"]["bias_sq"], f["args"]["bias_sk"]) == (1, 0) and f["args"]["bias"] is bias
    rec.launches.clear()
    lse = _on_device(np.zeros((2, 4, 37), np.float32))
    g = cupy_fmha.attention_backward(do, q, k, v, do, lse, bias=bias, return_dbias=True)
    assert g.dbias.shape == (37, 53) and any(x["spec"].source.startswith("fmha_bwd_dq_dk_dv") for x in rec.launches)


def test_reversed_inputs_are_copied_and_reversed_outputs_refused(rec):
    """A reversed view (negative stride) of q / k / v / o / do is copied before the kernels read it
    (it used to be refused with "pass a copy", although NumPy inputs are copied anyway); an ``out=``
    buffer with a negative stride is refused by name before any launch (TMA stores take positive
    strides only)."""
    q, k, v, do = (_on_device(x) for x in _inputs("bshd", sk=37, hk=4))
    k_rev = _fake(_on_device(np.ascontiguousarray(k[:, ::-1]))[:, ::-1])  # equal to k, strides negative
    assert k_rev.strides[1] < 0 and np.array_equal(k_rev, k)
    cupy_fmha.attention_forward(q, k_rev, v)
    (f,) = rec.launches
    assert f["args"]["k"] is not k_rev and np.array_equal(f["args"]["k"], k) and f["args"]["k_ss"] > 0
    rec.launches.clear()
    o, lse = cupy_fmha.attention_forward(q, k, v)
    rec.launches.clear()
    o_rev = _fake(_on_device(np.ascontiguousarray(o[:, :, ::-1]))[:, :, ::-1])
    cupy_fmha.attention_backward(do, q, k, v, o_rev, lse)
    assert rec.launches and all(x["args"].get("o") is not o_rev for x in rec.launches)
    rec.launches.clear()
    buf = _on_device(np.full(q.shape, np.nan, np.float16))
    lse_buf = _on_device(np.zeros(lse.shape, np.float32))
    with pytest.raises(ValueError, match=r"out: o has negative strides"):
        cupy_fmha.attention_forward(q, k, v, out=(_fake(buf[:, ::-1]), lse_buf))
    with pytest.raises(ValueError, match=r"out: dv has negative strides"):
        cupy_fmha.attention_backward(do, q, k, v, o, lse, out=(_on_device(np.zeros(q.shape, np.float16)),
                                                            _on_device(np.zeros(k.shape, np.float16)),
                                                            _fake(_on_device(np.zeros(v.shape, np.float16))[:, :, ::-1])))
    assert not rec.launches and np.isnan(buf).all()
