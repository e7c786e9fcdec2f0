"""The edge cases that have broken attention backward kernels elsewhere (issue 3's list), on the
GPU against the NumPy reference. Where another file already covers an item, it is named here:

1. rows with no visible key (bottom-right causal with seqlen_q > seqlen_k; a sliding window that
   empties some rows), also with a bias and with dropout: here, and test_gpu_attention /
   test_gpu_bias / test_gpu_dropout (``*rows_without_keys*``);
2. seqlen_q = seqlen_k = 1 at hdim 32 and 64: here;
3. varlen batches with empty query / key sequences in the middle: test_gpu_varlen;
4. seqlen 704 (64 past a multiple of 128), hdim 64, batch 1, one head, causal and an all-visible
   sliding window: here;
5. every row's lse below -100 (a bias of -120 on every key): test_gpu_bias (test_large_negative_bias);
6. strided dO and q/k/v views into a packed qkv tensor: test_gpu_attention (test_strided_inputs_*);
7. hdim 40, 72, 104: test_gpu_attention (CASES);
8. GQA ratios 2, 3, 4 with seqlen_q 500, seqlen_k 251, causal, both layouts: here;
9. more than 2^31 elements in one tensor: test_gpu_large_tensors;
10. broadcast (zero-stride) k / v and a bias broadcast along the keys by a zero stride (the Hopper
    kernels read copies or the non-TMA bias build), and out= buffers that are interleaved views of
    one packed buffer: here.

Every case: fresh random inputs, NaN-poisoned ``out=`` buffers, :func:`cupy_fmha.verify.compare`
against the float64 and ``precision="low"`` references; rows with no visible key must be exactly
o = 0, lse = -inf, dq = 0, with no NaN anywhere. Marked ``gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_fmha

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

from conftest import BF16, F16, BiasInputs, Inputs, check, nan_like, run, seed_for
from cupy_fmha import mask as M

pytestmark = pytest.mark.gpu


def _empty_rows(kw, sq, sk):
    """Boolean [sq]: rows that see no key under the mask keywords ``kw`` (from cupy_fmha.mask)."""
    spec = M.resolve_mask(kw.get("mask"), causal=kw.get("causal", False),
                          window_size=kw.get("window_size", (-1, -1)))
    return ~M.dense_mask(spec, sq, sk).any(axis=1)


def _assert_empty_rows_zero(inp_layout, o, lse, dq, empty):
    """o, dq rows with no key are exactly 0; lse -inf there, finite elsewhere; no NaN."""
    o, dq, lse = (np.asarray(x, dtype=np.float64) for x in (o, dq, lse))
    assert not np.isnan(o).any() and not np.isnan(dq).any() and not np.isnan(lse).any()
    rows = np.nonzero(empty)[0]
    assert rows.size, "the case must leave some rows without keys"
    if inp_layout == "bshd":
        assert np.all(o[:, rows] == 0) and np.all(dq[:, rows] == 0)
    else:
        assert np.all(o[:, :, rows] == 0) and np.all(dq[:, :, rows] == 0)
    assert np.all(np.isneginf(lse[:, :, rows]))
    assert np.all(np.isfinite(lse[:, :, ~empty]))


# --------------------------------------------------------------------------- 1. empty rows

EMPTY = {
    # bottom-right causal, sq > sk: the first sq - sk rows see nothing
    "causal-br-300x120-d64": (F16, "bshd", 300, 120, 64, {"mask": "b"}),
    # a bottom-right window (20, 0) with sq > sk: rows before the diagonal band's start are empty
    "window20,0-300x120-d128": (BF16, "bhsd", 300, 120, 128, {"window_size": (20, 0)}),
    # a top-left window t:5,5 with sq > sk + 5: the last rows see nothing
    "t:5,5-253x100-d32": (F16, "bshd", 253, 100, 32, {"mask": "t:5,5"}),
    "t:5,5-253x100-d96-dropout": (BF16, "bshd", 253, 100, 96, {"mask": "t:5,5", "dropout_p": 0.2, "seed": 3}),
    "window20,0-300x120-d64-dropout": (F16, "bshd", 300, 120, 64,
                                        {"window_size": (20, 0), "dropout_p": 0.3, "seed": 4}),
}


@pytest.mark.parametrize("case", list(EMPTY))
def test_rows_without_keys(case):
    dtype, layout, sq, sk, d, mkw = EMPTY[case]
    inp = Inputs(dtype, layout, 2, sq, sk, 2, 2, d, d, seed_for("edge-empty", case))
    kw = dict(mkw, layout=layout)
    o, lse, g = run(inp, kw)
    outs = check(inp, o, lse, g, kw)
    _assert_empty_rows_zero(layout, outs["o"][0], cp.asnumpy(lse), outs["dq"][0], _empty_rows(mkw, sq, sk))
    for name in ("dk", "dv"):
        assert not np.isnan(outs[name][0]).any(), name


@pytest.mark.parametrize("mkw", [{"window_size": (20, 0)}, {"mask": "t:5,5"}], ids=["window20,0", "t:5,5"])
def test_rows_without_keys_with_bias_window(mkw):
    sq, sk, d, h = 300, 120, 64, 2
    pb = BiasInputs(F16, np.float32, "bshd", 2, sq, sk, h, h, d, d, (2, h, sq, sk), seed_for("edge-bias", str(mkw)))
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=True)
    outs = check(pb, o, lse, g, kw, dbias=True)
    empty = _empty_rows(mkw, sq, sk)
    _assert_empty_rows_zero("bshd", outs["o"][0], cp.asnumpy(lse), outs["dq"][0], empty)
    assert np.all(outs["dbias"][0][:, :, empty] == 0) and not np.isnan(outs["dbias"][0]).any()


# --------------------------------------------------------------------------- 2. one query, one key

@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("mkw", [{}, {"causal": True}], ids=["none", "causal"])
def test_single_query_single_key(d, dtype, mkw):
    inp = Inputs(dtype, "bshd", 3, 1, 1, 4, 2, d, d, seed_for("edge-1x1", d, str(dtype), str(mkw)))
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(inp, kw)
    outs = check(inp, o, lse, g, kw)
    for name, (out, _, _) in outs.items():
        assert np.all(np.isfinite(out)), name
    # one key: softmax is 1, so o is v (exactly: P = 1 and v is already in the output dtype)
    v = inp.host["v"].astype(np.float64)
    assert np.array_equal(outs["o"][0], np.repeat(v, 2, axis=2)), "o must equal v (GQA 2)"


# --------------------------------------------------------------------------- 4. seqlen 704

@pytest.mark.parametrize("mkw", [{"causal": True}, {"window_size": (704, 704)}, {"mask": "t:1000,1000"}],
                         ids=["causal", "window-all-visible", "t-window-all-visible"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_seqlen_704(mkw, dtype):
    inp = Inputs(dtype, "bshd", 1, 704, 704, 1, 1, 64, 64, seed_for("edge-704", str(mkw), str(dtype)))
    kw = dict(mkw, layout="bshd")
    o, lse, g = run(inp, kw)
    outs = check(inp, o, lse, g, kw)
    for name, (out, _, _) in outs.items():
        assert np.all(np.isfinite(out)), name


# --------------------------------------------------------------------------- 8. GQA ratios

@pytest.mark.parametrize("ratio", [2, 3, 4])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("d, dtype", [(64, F16), (128, BF16), (96, BF16)], ids=["d64-f16", "d128-bf16", "d96-bf16"])
def test_gqa_ratios_500x251_causal(ratio, layout, d, dtype):
    hk = 2
    inp = Inputs(dtype, layout, 2, 500, 251, hk * ratio, hk, d, d, seed_for("edge-gqa", ratio, layout, d))
    kw = {"causal": True, "layout": layout}
    o, lse, g = run(inp, kw)
    check(inp, o, lse, g, kw)
    # bottom-right causal with sq > sk: the first 249 rows see nothing
    _assert_empty_rows_zero(layout, inp.to_float(o), cp.asnumpy(lse), inp.to_float(g.dq), _empty_rows(kw, 500, 251))


# --------------------------------------------------------------------------- 10. broadcast views, packed outputs


def _broadcast(inp, name, axis, shape):
    """Make ``inp``'s tensor ``name`` a zero-stride broadcast of its index 0 along ``axis``: on the
    device a broadcast view, on the host (the reference) the same values materialized."""
    cut = tuple(slice(0, 1) if i == axis else slice(None) for i in range(len(shape)))
    inp.host[name] = np.ascontiguousarray(np.broadcast_to(inp.host[name][cut], shape))
    view = cp.broadcast_to(inp.dev[name][cut], shape)
    assert view.strides[axis] == 0
    return view


@pytest.mark.parametrize("d", [64, 128, 96])
@pytest.mark.parametrize("kw", [{}, {"causal": True}], ids=["none", "causal"])
def test_broadcast_kv_views(d, kw):
    """k shared by every batch entry and v by every key, as zero-stride views (the sm_90 kernels'
    tensor maps need positive strides: the API reads dense copies there), against the reference."""
    inp = Inputs(F16, "bshd", 3, 200, 170, 4, 2, d, d, seed_for("edge-bcast", d, str(kw)))
    dev = dict(inp.dev)
    dev["k"] = _broadcast(inp, "k", 0, inp.host["k"].shape)
    dev["v"] = _broadcast(inp, "v", 1, inp.host["v"].shape)
    o, lse, g = run(inp, kw, dev=dev)
    check(inp, o, lse, g, kw)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("kw", [{}, {"causal": True}], ids=["none", "causal"])
def test_reversed_views(d, kw):
    """q reversed along the sequence, k along the heads and do along the batch, as negative-stride
    views (the API copies them before the kernels read them), against the reference on the same
    values."""
    inp = Inputs(F16, "bshd", 2, 190, 150, 4, 2, d, d, seed_for("edge-reversed", d, str(kw)))
    dev = dict(inp.dev)
    for name, axis in (("q", 1), ("k", 2), ("do", 0)):
        idx = tuple(slice(None, None, -1) if i == axis else slice(None) for i in range(4))
        dev[name] = inp.dev[name][idx]
        inp.host[name] = np.ascontiguousarray(inp.host[name][idx])
        assert dev[name].strides[axis] < 0
    o, lse, g = run(inp, kw, dev=dev)
    check(inp, o, lse, g, kw)


@pytest.mark.parametrize("d", [64, 128])
def test_bias_broadcast_along_keys_by_zero_stride(d):
    """A [b, h, sq, sk] bias whose key stride is 0 is a bias broadcast along the keys: the same
    results as the reference with that bias materialized, dbias in the view's full shape."""
    b, h, sq, sk = 2, 2, 150, 130
    inp = BiasInputs(F16, np.float32, "bshd", b, sq, sk, h, h, d, d, (b, h, sq, 1), seed_for("edge-bias-k0", d))
    view = cp.broadcast_to(inp.dev_bias, (b, h, sq, sk))
    assert view.strides[-1] == 0
    inp.bias = np.ascontiguousarray(np.broadcast_to(inp.bias, (b, h, sq, sk)))
    kw = {"causal": True}
    o, lse, g = run(inp, kw, bias=view, dbias=True)
    check(inp, o, lse, g, kw, dbias=True)


@pytest.mark.parametrize("d, dtype", [(64, F16), (128, BF16)], ids=["d64-f16", "d128-bf16"])
def test_outputs_into_interleaved_views_of_one_buffer(d, dtype):
    """o into slot 0 and dq, dk, dv into slots 0-2 of NaN-poisoned packed [b, s, 3, h, d] buffers
    (views that share no element, which out= accepts), against the reference; the other slot
    of the forward's buffer stays NaN."""
    b, s, h = 2, 190, 4
    inp = Inputs(dtype, "bshd", b, s, s, h, h, d, d, seed_for("edge-packed-out", d))
    q, k, v, do = (inp.dev[n] for n in ("q", "k", "v", "do"))
    fwd_buf = nan_like((b, s, 3, h, d), q.dtype)
    kw = {"causal": True}
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw, dtype=inp.dtype_arg,
                                         out=(fwd_buf[:, :, 1], nan_like((b, h, s), cp.float32)))
    grad_buf = nan_like((b, s, 3, h, d), q.dtype)
    g = cupy_fmha.attention_backward(do, q, k, v, o, lse, **kw, dtype=inp.dtype_arg,
                                     out=tuple(grad_buf[:, :, i] for i in range(3)))
    cp.cuda.get_current_stream().synchronize()
    check(inp, o, lse, g, kw)
    assert (fwd_buf[:, :, (0, 2)].view(cp.uint16) == 0xFFFF).all()  # written only where o lives
