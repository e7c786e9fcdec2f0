"""Dropout combined with the other features on the GPU, against the NumPy reference.

The instances built with ``-D DROPOUT=1`` also come with ``ALIBI=1`` or ``BIAS=1``; group mode
keys the Philox stream by the sequence index and positions inside the sequence; the deterministic
backward must stay bit-identical with dropout. Each case uses the helpers in conftest.py that the
feature's own test file uses (fresh random inputs, NaN-poisoned ``out=`` buffers,
:func:`cupy_fmha.verify.compare` against the float64 and ``precision="low"`` references run with
the same dropout arguments).
Marked ``gpu`` (skipped without a device).
"""

from __future__ import annotations

import numpy as np
import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

import cupy_fmha
from conftest import (BF16, BIAS_SHAPES, F16, LK, LK2, LK3, LQ, LQ2, LQ3, BiasInputs, Inputs, Packed, check,
                      check_group, keep_reference, run, seed_for)
from cupy_fmha import philox

pytestmark = pytest.mark.gpu

U64 = 2**64


# --------------------------------------------------------------------------- elementwise bias

# id: (dtype, bias dtype, layout, b, sq, sk, hq, hk, d, dv, bias shape, kwargs incl. dropout)
BIAS = {
    "f16-b16-d64-bh-t-p0.2": (F16, F16, "bshd", 2, 253, 130, 2, 2, 64, 64, "bh",
                              {"mask": "t", "dropout_p": 0.2, "seed": 5}),
    "bf16-b32-d128-1h-none-gqa2-p0.3": (BF16, np.float32, "bshd", 1, 253, 253, 4, 2, 128, 128, "1h",
                                        {"dropout_p": 0.3, "seed": 2**40 + 1, "offset": U64 - 2}),
    "f16-b16-d32-11-b-p0.2": (F16, F16, "bhsd", 2, 130, 253, 2, 2, 32, 32, "11",
                              {"mask": "b", "dropout_p": 0.2, "seed": 7}),
    "bf16-bbf-d96-bh-t:40,8-p0.5": (BF16, BF16, "bshd", 1, 253, 253, 2, 2, 96, 96, "bh",
                                    {"mask": "t:40,8", "dropout_p": 0.5, "seed": 8}),
    # head dims above 128 with a bias: the forward steps 16 keys at a time (half a keep group)
    "f16-b32-d256-1h-none-p0.2": (F16, np.float32, "bshd", 1, 253, 130, 2, 1, 256, 256, "1h",
                                  {"dropout_p": 0.2, "seed": 9}),
}


@pytest.mark.parametrize("case", list(BIAS))
def test_dropout_with_bias_and_dbias(case):
    dtype, bdt, layout, b, sq, sk, hq, hk, d, dv, kind, kw = BIAS[case]
    pb = BiasInputs(dtype, bdt, layout, b, sq, sk, hq, hk, d, dv, BIAS_SHAPES[kind](b, hq, sq, sk),
                    seed_for("drop-bias", case))
    kw = dict(kw, layout=layout)
    o, lse, g = run(pb, kw, bias=pb.dev_bias, dbias=True)
    check(pb, o, lse, g, kw, dbias=True)


# --------------------------------------------------------------------------- ALiBi

ALIBI = {
    "f16-d64-b-gqa2": (F16, "bshd", 2, 253, 300, 4, 2, 64, {"mask": "b", "dropout_p": 0.2, "seed": 3}),
    "bf16-d128-causal-per-batch": (BF16, "bhsd", 2, 253, 253, 2, 2, 128,
                                   {"causal": True, "dropout_p": 0.3, "seed": 4, "offset": 99}),
    "f16-d96-none": (F16, "bshd", 1, 300, 130, 2, 2, 96, {"dropout_p": 0.2, "seed": 5}),
    "bf16-d240-t": (BF16, "bshd", 1, 130, 253, 2, 1, 240, {"mask": "t", "dropout_p": 0.2, "seed": 6}),
}


@pytest.mark.parametrize("case", list(ALIBI))
def test_dropout_with_alibi(case):
    dtype, layout, b, sq, sk, hq, hk, d, kw = ALIBI[case]
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, d, seed_for("drop-alibi", case))
    rng = np.random.default_rng(seed_for("slopes", case))
    shape = (b, hq) if "per-batch" in case else (hq,)
    kw = dict(kw, layout=layout, alibi_slopes=rng.uniform(0.01, 0.5, shape).astype(np.float32))
    o, lse, g, keep = run(inp, kw, want_keep=True)
    check(inp, o, lse, g, kw)
    want = keep_reference(b, hq, sq, sk, kw["dropout_p"], kw["seed"], kw.get("offset", 0))
    assert np.array_equal(cp.asnumpy(keep), want)


# --------------------------------------------------------------------------- other head dims

@pytest.mark.parametrize("d, dtype", [(104, F16), (40, BF16), (240, F16), (192, BF16)])
def test_dropout_odd_head_dims(d, dtype):
    inp = Inputs(dtype, "bshd", 1, 253, 200, 2, 2, d, d, seed_for("drop-hdim", d))
    kw = {"mask": "b", "dropout_p": 0.25, "seed": 11, "offset": 2**33, "layout": "bshd"}
    o, lse, g = run(inp, kw)
    check(inp, o, lse, g, kw)


# --------------------------------------------------------------------------- group mode

VARLEN = {
    "f16-d64-t-gqa2": (F16, LQ, LK, 4, 2, 64, {"mask": "t", "dropout_p": 0.2, "seed": 1}),
    "bf16-d128-b": (BF16, LQ2, LK2, 2, 2, 128, {"mask": "b", "dropout_p": 0.3, "seed": 2, "offset": U64 - 1}),
    "f16-d32-none": (F16, LQ3, LK3, 2, 1, 32, {"dropout_p": 0.5, "seed": 3}),
    "bf16-d96-b:20,5": (BF16, LQ, LK, 2, 2, 96, {"mask": "b:20,5", "dropout_p": 0.2, "seed": 4}),
}


@pytest.mark.parametrize("case", list(VARLEN))
def test_dropout_group_mode(case):
    dtype, lq, lk, hq, hk, d, kw = VARLEN[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, d, seed_for("drop-varlen", case))
    o, lse, g = run(inp, kw)
    check_group(inp, o, lse, g, kw)
    # the keep mask: sequence b's in the top-left corner of [max_seqlen_q, max_seqlen_k], keyed
    # by the sequence index and positions inside the sequence
    cu = (cp.asarray(inp.cq), cp.asarray(inp.ck))
    res = cupy_fmha.attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], layout="thd", cu_seqlens_q=cu[0],
                                      cu_seqlens_k=cu[1], dtype=inp.dtype_arg, return_dropout_mask=True, **kw)
    keep = cp.asnumpy(res[2])
    msq, msk = max(lq), max(lk)
    assert keep.shape == (len(lq), hq, msq, msk)
    for b, (a, c) in enumerate(zip(lq, lk)):
        want = philox.dropout_keep_block(kw["seed"], kw.get("offset", 0), b, hq, a, c, kw["dropout_p"])
        assert np.array_equal(keep[b, :, :a, :c], want), b


# --------------------------------------------------------------------------- deterministic

@pytest.mark.parametrize("d, layout", [(64, "bshd"), (128, "bhsd"), (96, "bshd")])
def test_dropout_deterministic_is_bit_identical(d, layout):
    inp = Inputs(BF16, layout, 2, 300, 253, 4, 2, d, d, seed_for("drop-det", d))
    kw = {"mask": "t", "dropout_p": 0.2, "seed": 21, "offset": 5, "layout": layout}
    q, k, v, do = (inp.dev[n] for n in ("q", "k", "v", "do"))
    o, lse = cupy_fmha.attention_forward(q, k, v, dtype=inp.dtype_arg, **kw)
    first = cupy_fmha.attention_backward(do, q, k, v, o, lse, dtype=inp.dtype_arg, deterministic=True, **kw)
    for _ in range(9):  # 10 runs in all
        again = cupy_fmha.attention_backward(do, q, k, v, o, lse, dtype=inp.dtype_arg, deterministic=True, **kw)
        for a, c in zip(first, again):
            assert bool((a == c).all())
    # and it is the right answer
    o2, lse2, g = run(inp, kw)
    check(inp, o2, lse2, first, kw)
