"""Group mode (varlen, ``layout="thd"`` with cu_seqlens) on the GPU against the NumPy reference.

Modeled on test_gpu_attention.py: fresh random inputs per case, outputs written into NaN-poisoned
``out=`` buffers, results judged by :func:`cupy_fmha.verify.compare` against the float64 and the
``precision="low"`` reference (which implements group mode itself: it is the spec). Sequence
lengths include zero-length query and key sequences in the middle of the batch; on top of the
tolerance rule, rows of sequences without keys must be exactly o = 0, lse = -inf, dq = 0, and
keys of sequences without queries exactly dk = dv = 0.

Head dims 64 and 128 run the wgmma kernels on an H100/H200 (mma.sync elsewhere); 96 rounds up to the
128 warp-specialized kernels there; 240 and 256 run the warp-specialized forward and the wide
warp-specialized backward (deterministic: ordered adds) on the H100/H200; 32 runs mma.sync everywhere. Every test is marked ``gpu`` (skipped without a device).

The elementwise bias in group mode (the ``test_varlen_bias_*`` tests): a bias broadcastable to
[batch, nhead_q, max_seqlen_q, max_seqlen_k] ([1, 1, ..], [1, h, ..], [b, h, ..], [sq, sk],
[b, 1, 1, sk]; fp16 / bf16 / fp32), sequence i reading its top-left corner; dBias against the
references, exactly 0 outside every sequence's corner; NaN/inf in the padding must not change a
bit of any output; equal lengths give batch mode's results bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # the conftest hook skips these tests without a device; this keeps collection clean
    import cupy as cp
except Exception:  # pragma: no cover - no CuPy at all
    cp = None

import cupy_fmha
from conftest import (BF16, F16, F32, LK, LK2, LK3, LQ, LQ2, LQ3, Packed, bias_to_device, check_group,
                      nan_block_in_pool, nan_like, run, seed_for)

pytestmark = pytest.mark.gpu


# id: (dtype, lengths q, lengths k, hq, hk, d, dv, mask kwargs)
CASES = {
    # wgmma-eligible head dims (64, 128): every mask form, GQA 1/2/4
    "f16-d64-none": (F16, LQ, LK, 2, 2, 64, 64, {}),
    "f16-d64-t-gqa2": (F16, LQ, LK, 4, 2, 64, 64, {"mask": "t"}),
    "f16-d64-b-gqa4": (F16, LQ, LK, 4, 1, 64, 64, {"mask": "b"}),
    "f16-d64-t:20,5": (F16, LQ2, LK2, 2, 2, 64, 64, {"mask": "t:20,5"}),
    "f16-d64-b:20,5-gqa2": (F16, LQ, LK, 2, 1, 64, 64, {"mask": "b:20,5"}),
    "f16-d64-causal-both-empty": (F16, LQ3, LK3, 2, 1, 64, 64, {"causal": True}),
    "bf16-d64-window16,-1": (BF16, LQ2, LK2, 2, 2, 64, 64, {"window_size": (16, -1)}),
    "bf16-d128-none-gqa2": (BF16, LQ, LK, 2, 1, 128, 128, {}),
    "bf16-d128-t": (BF16, LQ2, LK2, 2, 2, 128, 128, {"mask": "t"}),
    "bf16-d128-b-gqa4": (BF16, LQ, LK, 4, 1, 128, 128, {"mask": "b"}),
    "bf16-d128-t:30,0": (BF16, LQ3, LK3, 2, 2, 128, 128, {"mask": "t:30,0"}),
    "bf16-d128-b:10,40": (BF16, LQ, LK, 2, 1, 128, 128, {"mask": "b:10,40"}),
    "f16-d128-xb:33-gqa2": (F16, LQ2, LK2, 2, 1, 128, 128, {"mask": "xb:33"}),
    # mma.sync head dims (32, 96, 256)
    "f16-d32-b-gqa2": (F16, LQ, LK, 2, 1, 32, 32, {"mask": "b"}),
    "bf16-d32-t:8,8": (BF16, LQ2, LK2, 2, 2, 32, 32, {"mask": "t:8,8"}),
    "f16-d96-none-gqa4": (F16, LQ2, LK2, 4, 1, 96, 96, {}),
    "bf16-d96-b:40,0": (BF16, LQ, LK, 2, 2, 96, 96, {"mask": "b:40,0"}),
    "f16-d256-t": (F16, LQ3, LK3, 2, 1, 256, 256, {"mask": "t"}),
    "bf16-d256-b-gqa2": (BF16, LQ2, LK2, 2, 1, 256, 256, {"mask": "b"}),
    "f16-d240-b:30,0": (F16, LQ3, LK3, 2, 2, 240, 240, {"mask": "b:30,0"}),  # forward BLOCK_N=16
    # longer sequences (several key blocks per CTA), one sequence only, sq != sk
    "f16-d64-b-single-300x700": (F16, [300], [700], 2, 2, 64, 64, {"mask": "b"}),
    "bf16-d128-t-700x300": (BF16, [700, 5], [300, 9], 2, 1, 128, 128, {"mask": "t"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_varlen_matches_reference(case):
    dtype, lq, lk, hq, hk, d, dv, mkw = CASES[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, dv, seed_for("varlen", case))
    before = {n: x.copy() for n, x in inp.dev.items()}
    # cu_seqlens as CuPy arrays in most cases, as NumPy arrays in every third
    o, lse, g = run(inp, mkw, cu_on_device=list(CASES).index(case) % 3 != 0)
    check_group(inp, o, lse, g, mkw)
    for n, x in inp.dev.items():  # inputs untouched
        assert bool((x == before[n]).all()), n


# ALiBi per sequence: id -> (dtype, lq, lk, hq, hk, d, slopes per sequence?, mask kwargs)
ALIBI = {
    "f16-d64-b-gqa2": (F16, LQ, LK, 4, 2, 64, False, {"mask": "b"}),
    "bf16-d128-none-per-seq": (BF16, LQ2, LK2, 2, 2, 128, True, {}),
    "f16-d96-t:30,10-per-seq": (F16, LQ, LK, 2, 1, 96, True, {"mask": "t:30,10"}),
    "bf16-d256-b-per-seq": (BF16, LQ2, LK2, 2, 1, 256, True, {"mask": "b"}),
}


@pytest.mark.parametrize("case", list(ALIBI))
def test_varlen_alibi_matches_reference(case):
    dtype, lq, lk, hq, hk, d, per_seq, mkw = ALIBI[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, d, seed_for("alibi", case))
    rng = np.random.default_rng(seed_for("slopes", case))
    slopes = rng.uniform(0.01, 0.5, (len(lq), hq) if per_seq else (hq,)).astype(np.float32)
    kw = dict(mkw, alibi_slopes=slopes)
    o, lse, g = run(inp, kw)
    check_group(inp, o, lse, g, kw)


@pytest.mark.parametrize("d", [64, 96])
def test_varlen_dq_workspace_is_cleared_by_dot_do_o(d):
    """Group mode: dot_do_o zero-fills each sequence's rows of the dQ workspace, which is handed
    a NaN block from the pool (see test_gpu_attention.test_dq_workspace_is_cleared_by_dot_do_o)."""
    inp = Packed(F16, LQ2, LK2, 4, 2, d, d, seed_for("dq workspace", d))
    kw = {"mask": "b"}
    shape = (inp.batch, inp.hq, int(np.diff(inp.cq).max()), d)
    o, lse, g = run(inp, kw, before_backward=nan_block_in_pool(shape))
    check_group(inp, o, lse, g, kw)


def test_varlen_larger_max_seqlen_pads_lse():
    inp = Packed(F16, LQ3, LK3, 2, 2, 64, 64, seed_for("max_seqlen"))
    kw = {"mask": "b", "max_seqlen_q": 80, "max_seqlen_k": 300}
    o, lse, g = run(inp, kw)
    assert lse.shape == (3, 2, 80)
    check_group(inp, o, lse, g, kw)


def test_varlen_all_keys_empty():
    inp = Packed(BF16, [10, 20], [0, 0], 2, 1, 64, 64, seed_for("no keys"))
    o, lse, g = run(inp, {})
    assert g.dk.shape == (0, 1, 64) and g.dv.shape == (0, 1, 64)
    assert bool((o == 0).all()) and bool(cp.isneginf(lse).all()) and bool((g.dq == 0).all())


def test_varlen_all_queries_empty():
    inp = Packed(F16, [0, 0], [10, 5], 4, 2, 32, 32, seed_for("no queries"))
    o, lse, g = run(inp, {"causal": True}, cu_on_device=False)
    assert o.shape == (0, 4, 32) and lse.shape == (2, 4, 0) and g.dq.shape == (0, 4, 32)
    assert bool((g.dk == 0).all()) and bool((g.dv == 0).all())


def test_varlen_strided_inputs_match_contiguous():
    inp = Packed(F16, LQ, LQ, 2, 2, 64, 64, seed_for("strided"))
    packed = cp.stack([inp.dev["q"], inp.dev["k"], inp.dev["v"]], axis=1)  # [t, 3, h, d]
    strided = {"q": packed[:, 0], "k": packed[:, 1], "v": packed[:, 2], "do": inp.dev["do"]}
    assert not strided["q"].flags.c_contiguous
    kw = {"mask": "b"}
    o1, lse1, g1 = run(inp, kw, dev=strided)
    o2, lse2, g2 = run(inp, kw)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())
    assert bool((g1.dk == g2.dk).all()) and bool((g1.dv == g2.dv).all())
    check_group(inp, o1, lse1, g1, kw)


def test_varlen_equal_lengths_match_batch_mode():
    b, s, h, d = 3, 130, 2, 64
    inp = Packed(BF16, [s] * b, [s] * b, h, h, d, d, seed_for("batch"))
    kw = {"mask": "b:16,0"}
    o, lse, g = run(inp, kw)
    as_batch = {n: x.reshape(b, s, *x.shape[1:]) for n, x in inp.dev.items()}
    ob, lseb = cupy_fmha.attention_forward(as_batch["q"], as_batch["k"], as_batch["v"], dtype="bfloat16", **kw)
    gb = cupy_fmha.attention_backward(as_batch["do"], as_batch["q"], as_batch["k"], as_batch["v"], ob, lseb,
                                      dtype="bfloat16", **kw)
    assert bool((o.reshape(ob.shape) == ob).all()) and bool((lse == lseb).all())
    assert bool((g.dk.reshape(gb.dk.shape) == gb.dk).all()) and bool((g.dv.reshape(gb.dv.shape) == gb.dv).all())


def test_varlen_bad_out_buffers_rejected():
    inp = Packed(F16, LQ3, LK3, 2, 2, 64, 64, seed_for("bad out"))
    q, k, v = inp.dev["q"], inp.dev["k"], inp.dev["v"]
    kw = dict(layout="thd", cu_seqlens_q=inp.cq, cu_seqlens_k=inp.ck)
    with pytest.raises(ValueError, match="out"):  # lse pitch is max_seqlen_q (50), not 33
        cupy_fmha.attention_forward(q, k, v, **kw, out=(cp.empty_like(q), cp.empty((3, 2, 33), cp.float32)))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        cupy_fmha.attention_forward(q, k, v, layout="thd", cu_seqlens_q=cp.asarray(inp.cq[::-1].copy()),
                                    cu_seqlens_k=inp.ck)


# deterministic dQ in group mode: slabs (or the ws kernels' ordered adds) pitched by max_seqlen_q, per-sequence key blocks
DETERMINISTIC = {
    "f16-d64-b-gqa2": (F16, LQ, LK, 4, 2, 64, {"mask": "b"}),
    "bf16-d128-t:30,0": (BF16, LQ2, LK2, 2, 2, 128, {"mask": "t:30,0"}),
    "f16-d96-none": (F16, LQ3, LK3, 2, 1, 96, {}),
    "bf16-d64-long-causal": (BF16, [700, 5, 0], [300, 9, 40], 2, 1, 64, {"causal": True}),
    # the wide backward's ordered adds (hdim 256 on the H100/H200; bench/NOTES.md step 56)
    "f16-d256-causal-gqa2": (F16, [200, 77, 5, 0], [200, 77, 64, 9], 4, 2, 256, {"causal": True}),
    "bf16-d200-b": (BF16, [300, 1, 129], [129, 300, 64], 2, 2, 200, {"mask": "b"}),
}


@pytest.mark.parametrize("case", list(DETERMINISTIC))
def test_varlen_deterministic_is_bit_identical_and_correct(case):
    dtype, lq, lk, hq, hk, d, mkw = DETERMINISTIC[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, d, seed_for("det", case))
    kw = dict(mkw, deterministic=True)
    fw = {k: v for k, v in kw.items() if k != "deterministic"}
    o, lse, g = _run_det(inp, fw, kw)
    check_group(inp, o, lse, g, fw)
    for _ in range(4):
        o2, lse2, g2 = _run_det(inp, fw, kw)
        for a, b in zip(g, g2):
            assert bool((a == b).all())


def _run_det(inp, fw, bw):
    dev = inp.dev
    cu = dict(layout="thd", cu_seqlens_q=cp.asarray(inp.cq), cu_seqlens_k=cp.asarray(inp.ck),
              dtype=inp.dtype_arg)
    o, lse = cupy_fmha.attention_forward(dev["q"], dev["k"], dev["v"], **fw, **cu)
    g_out = tuple(nan_like(x.shape, dev["q"].dtype) for x in (dev["q"], dev["k"], dev["v"]))
    g = cupy_fmha.attention_backward(dev["do"], dev["q"], dev["k"], dev["v"], o, lse, **bw, **cu, out=g_out)
    cp.cuda.get_current_stream().synchronize()
    return o, lse, g


# --------------------------------------------------------------------------- elementwise bias
# Group mode with an elementwise bias: broadcastable to [batch, nhead_q, max_seqlen_q,
# max_seqlen_k]; sequence i reads bias[i, :, :seqlen_q_i, :seqlen_k_i] (its top-left corner), and
# dBias comes back in the bias's shape with 0 outside every sequence's corner.


#: bias shape kinds -> shape from (batch, nhead_q, max_seqlen_q, max_seqlen_k)
GROUP_BIAS_SHAPES = {
    "11": lambda b, h, sq, sk: (1, 1, sq, sk),   # CK e:0
    "1h": lambda b, h, sq, sk: (1, h, sq, sk),   # CK e:1
    "bh": lambda b, h, sq, sk: (b, h, sq, sk),   # CK e:2
    "2d": lambda b, h, sq, sk: (sq, sk),
    "rows": lambda b, h, sq, sk: (b, 1, 1, sk),  # one row per sequence, broadcast over heads and rows
}


def _bias_host(shape, bias_dtype, seed, scale=2.0):
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(shape)).astype(np.float32).astype(bias_dtype)


def _check_bias(inp, o, lse, g, kw, bias, dbias=True):
    """:func:`conftest.check_group` with the bias (dBias included), plus exact zeros of dBias
    outside the corners for a [batch, h, ...] bias."""
    outs = check_group(inp, o, lse, g, dict(kw, bias=bias), dbias=dbias)
    if dbias and bias.ndim == 4 and bias.shape[0] == inp.batch and bias.shape[2] > 1 and bias.shape[3] > 1:
        db = outs["dbias"][0]
        lq, lk = np.diff(inp.cq), np.diff(inp.ck)
        for b in range(inp.batch):
            assert np.all(db[b, :, lq[b]:] == 0) and np.all(db[b, :, :, lk[b]:] == 0), f"dbias padding of {b}"
    return outs


# id: (dtype, bias dtype, lengths q, lengths k, hq, hk, d, bias shape, mask kwargs, dbias)
BIAS_CASES = {
    # wgmma-eligible head dims (64, 128) on sm_90
    "f16-b16-d64-11-none": (F16, F16, LQ, LK, 2, 2, 64, "11", {}, True),
    "f16-b32-d64-1h-t-gqa2": (F16, F32, LQ, LK, 4, 2, 64, "1h", {"mask": "t"}, True),
    "f16-bbf-d64-bh-b": (F16, BF16, LQ2, LK2, 2, 2, 64, "bh", {"mask": "b"}, True),
    "f16-b16-d64-bh-window16,-1": (F16, F16, LQ3, LK3, 2, 1, 64, "bh", {"window_size": (16, -1)}, True),
    "bf16-bbf-d128-11-causal": (BF16, BF16, LQ2, LK2, 2, 2, 128, "11", {"causal": True}, True),
    "bf16-b32-d128-bh-b:20,5-gqa2": (BF16, F32, LQ, LK, 4, 2, 128, "bh", {"mask": "b:20,5"}, True),
    "bf16-b16-d128-1h-t:30,0": (BF16, F16, LQ3, LK3, 2, 2, 128, "1h", {"mask": "t:30,0"}, True),
    "bf16-bbf-d128-2d-xb:33": (BF16, BF16, LQ, LK, 2, 1, 128, "2d", {"mask": "xb:33"}, True),
    "bf16-b32-d64-rows-none": (BF16, F32, LQ2, LK2, 2, 2, 64, "rows", {}, True),
    "f16-b16-d128-bh-b-nodbias": (F16, F16, LQ, LK, 2, 2, 128, "bh", {"mask": "b"}, False),
    # mma.sync head dims (32, 96, 256)
    "f16-b32-d32-bh-t:8,8": (F16, F32, LQ2, LK2, 2, 2, 32, "bh", {"mask": "t:8,8"}, True),
    "bf16-bbf-d96-1h-b-gqa2": (BF16, BF16, LQ, LK, 4, 2, 96, "1h", {"mask": "b"}, True),
    "f16-b16-d256-bh-t": (F16, F16, LQ3, LK3, 2, 1, 256, "bh", {"mask": "t"}, True),
    "bf16-b32-d256-11-causal": (BF16, F32, LQ2, LK2, 2, 2, 256, "11", {"causal": True}, True),
    # several key and query blocks per sequence, sq != sk
    "f16-b16-d64-bh-b-300x700": (F16, F16, [300, 5, 0], [700, 9, 40], 2, 2, 64, "bh", {"mask": "b"}, True),
    "bf16-b32-d128-1h-t-700x300": (BF16, F32, [700, 0, 5], [300, 17, 9], 2, 1, 128, "1h", {"mask": "t"}, True),
}


@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_varlen_bias_matches_reference(case):
    dtype, bdt, lq, lk, hq, hk, d, kind, mkw, dbias = BIAS_CASES[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, d, seed_for("bias", case))
    bias = _bias_host(GROUP_BIAS_SHAPES[kind](len(lq), hq, max(lq), max(lk)), bdt, seed_for("bias values", case))
    bias_dev = bias_to_device(inp, bias)
    before = {n: x.copy() for n, x in inp.dev.items()}
    bias_before = bias_dev.copy()
    o, lse, g = run(inp, mkw, bias=bias_dev, dbias=dbias)
    _check_bias(inp, o, lse, g, mkw, bias, dbias)
    for n, x in inp.dev.items():  # inputs untouched
        assert bool((x == before[n]).all()), n
    if isinstance(bias_dev, cp.ndarray):
        assert bool((bias_dev.view(cp.uint8) == bias_before.view(cp.uint8)).all())


@pytest.mark.parametrize("d", [64, 128, 96])
def test_varlen_bias_padding_is_never_read(d):
    # NaN and inf outside every sequence's corner (and in the padding rows/columns that larger
    # max lengths add) must not reach any output: results are bit-identical to a clean bias
    lq, lk = LQ, LK
    inp = Packed(F16, lq, lk, 2, 2, d, d, seed_for("pad", d))
    mq, mk = max(lq) + 7, max(lk) + 33
    clean = _bias_host((len(lq), 2, mq, mk), F32, seed_for("pad bias", d))
    dirty = clean.copy()
    for b in range(len(lq)):
        dirty[b, :, lq[b]:] = np.nan
        dirty[b, :, :, lk[b]:] = np.inf
    kw = {"mask": "b", "max_seqlen_q": mq, "max_seqlen_k": mk}
    o1, lse1, g1 = run(inp, kw, bias=cp.asarray(clean), dbias=True)
    o2, lse2, g2 = run(inp, kw, bias=cp.asarray(dirty), dbias=True)
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())
    for a, b in zip(g1, g2):
        assert bool((a == b).all())
    assert lse1.shape == (len(lq), 2, mq) and g1.dbias.shape == (len(lq), 2, mq, mk)
    _check_bias(inp, o1, lse1, g1, kw, clean)


@pytest.mark.parametrize("dtype, d", [(BF16, 64), (F16, 128), (BF16, 96)])
def test_varlen_bias_equal_lengths_match_batch_mode(dtype, d):
    # equal lengths: group mode with a [b, h, s, s] bias is batch mode, bit for bit (dbias too)
    b, s, h = 3, 130, 2
    inp = Packed(dtype, [s] * b, [s] * b, h, h, d, d, seed_for("bias batch", d))
    bias = _bias_host((b, h, s, s), F32, seed_for("bias batch values", d))
    kw = {"mask": "b:16,0"}
    o, lse, g = run(inp, kw, bias=cp.asarray(bias), dbias=True)
    as_batch = {n: x.reshape(b, s, *x.shape[1:]) for n, x in inp.dev.items()}
    bkw = dict(kw, dtype=inp.dtype_arg, bias=cp.asarray(bias))
    ob, lseb = cupy_fmha.attention_forward(as_batch["q"], as_batch["k"], as_batch["v"], **bkw)
    gb = cupy_fmha.attention_backward(as_batch["do"], as_batch["q"], as_batch["k"], as_batch["v"], ob, lseb,
                                      return_dbias=True, **bkw)
    assert bool((o.reshape(ob.shape) == ob).all()) and bool((lse == lseb).all())
    assert bool((g.dk.reshape(gb.dk.shape) == gb.dk).all()) and bool((g.dv.reshape(gb.dv.shape) == gb.dv).all())
    assert bool((g.dbias == gb.dbias).all())


@pytest.mark.parametrize("d", [64, 96])
def test_varlen_bias_deterministic_dbias(d):
    # deterministic dQ and dBias (plain stores + one reduction): bit-identical over runs
    inp = Packed(BF16, LQ2, LK2, 4, 2, d, d, seed_for("bias det", d))
    bias = _bias_host((1, 4, max(LQ2), max(LK2)), F32, seed_for("bias det values", d))
    kw = {"mask": "t", "deterministic": True}
    fw = {"mask": "t"}
    bias_dev = cp.asarray(bias)
    cu = dict(layout="thd", cu_seqlens_q=cp.asarray(inp.cq), cu_seqlens_k=cp.asarray(inp.ck),
              dtype=inp.dtype_arg, bias=bias_dev)
    dev = inp.dev
    o, lse = cupy_fmha.attention_forward(dev["q"], dev["k"], dev["v"], **fw, **cu)
    runs = [cupy_fmha.attention_backward(dev["do"], dev["q"], dev["k"], dev["v"], o, lse, **kw, **cu,
                                         return_dbias=True) for _ in range(4)]
    cp.cuda.get_current_stream().synchronize()
    for g in runs[1:]:
        for a, b in zip(runs[0], g):
            assert bool((a == b).all())
    _check_bias(inp, o, lse, runs[0], fw, bias)


def test_varlen_bias_rejected_shapes_on_gpu_arrays():
    inp = Packed(F16, LQ3, LK3, 2, 2, 64, 64, seed_for("bias bad"))
    q, k, v = inp.dev["q"], inp.dev["k"], inp.dev["v"]
    kw = dict(layout="thd", cu_seqlens_q=cp.asarray(inp.cq), cu_seqlens_k=cp.asarray(inp.ck))
    with pytest.raises(ValueError, match="max_seqlen_k dimension is 34"):  # max lengths 50 x 40
        cupy_fmha.attention_forward(q, k, v, bias=cp.zeros((3, 2, 50, 34), cp.float32), **kw)
    with pytest.raises(ValueError, match="batch dimension is 2"):
        cupy_fmha.attention_forward(q, k, v, bias=cp.zeros((2, 2, 50, 40), cp.float32), **kw)
    with pytest.raises(TypeError, match="bias"):
        cupy_fmha.attention_forward(q, k, v, bias=cp.zeros((50, 40), cp.uint16), **kw)
    o, lse = cupy_fmha.attention_forward(q, k, v, bias=cp.zeros((50, 40), cp.float16), **kw)
    with pytest.raises(ValueError, match="return_dbias"):
        cupy_fmha.attention_backward(inp.dev["do"], q, k, v, o, lse, return_dbias=True, **kw)


@pytest.mark.parametrize("d", [64, 128])
def test_inf_in_one_sequence_leaves_its_neighbours_alone(d):
    """Inf in one sequence's q, k, v and dO (its own outputs turn NaN) must not change a bit of
    any other sequence's outputs: the kernels' tiles past a sequence's end hold the next
    sequence's tokens (TMA loads them; 0 * Inf is NaN in a GEMM) unless they are zeroed."""
    lens = [70, 50, 90]
    cu = cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    rng = np.random.default_rng(seed_for(f"inf-neighbour-{d}"))
    t, h = sum(lens), 2

    def inputs():
        return [cp.asarray(rng.standard_normal((t, h, d)).astype(np.float16)) for _ in range(4)]

    def both(q, k, v, do):
        kw = dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu)
        o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
        return (o, *cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw))

    clean = inputs()
    ref = both(*clean)
    poisoned = [x.copy() for x in clean]
    for x in poisoned:
        x[lens[0]:lens[0] + lens[1]] = np.inf
    got = both(*poisoned)
    for name, a, b in zip(("o", "dq", "dk", "dv"), ref, got):
        for lo, hi in ((0, lens[0]), (lens[0] + lens[1], t)):
            assert bool(cp.isfinite(b[lo:hi]).all()), f"{name} rows {lo}:{hi} not finite"
            assert bool((a[lo:hi] == b[lo:hi]).all()), f"{name} rows {lo}:{hi} changed"
