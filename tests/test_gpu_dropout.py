"""Dropout on the GPU against cupy_fmha.philox and the NumPy reference.

Marked ``gpu`` (skipped without a device). Modeled on test_gpu_attention.py: fresh random inputs,
NaN-poisoned ``out=`` buffers, :func:`cupy_fmha.verify.compare` against the float64 and the
``precision="low"`` references run with the same ``dropout_p``, ``seed`` and ``offset``.

* the keep mask (``return_dropout_mask=True``, kernel fmha_dropout_mask.cu) is bit-exact with
  :mod:`cupy_fmha.philox` on odd shapes, seeds above 2^32 and offsets near 2^64, and its keep
  rate is within a binomial bound;
* forward + backward match the reference at p = 0.2 / 0.5 for head dims 64, 128 (wgmma kernels
  on sm_90) and 32, 96, 256 (mma.sync), masks 0 / t / b / t:l,r, GQA, fp16 and bf16: since the
  references draw their masks from cupy_fmha.philox, this also checks that the attention kernels
  apply exactly that mask (a wrong keep bit moves O and the gradients far beyond tolerance);
* rows with no visible key stay o = 0, lse = -inf, gradients 0, no NaN;
* p = 0 is the kernel without dropout.
"""

from __future__ import annotations

import numpy as np
import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

from cupy_fmha import philox
from cupy_fmha import reference as R

from test_gpu_attention import BF16, F16, Inputs, _seed, cp_fmha, poison_pool  # noqa: F401

pytestmark = pytest.mark.gpu

U64 = 2**64


def _run(inp, nan_like, kw, want_keep=False):
    q, k, v, do = (inp.dev[n] for n in ("q", "k", "v", "do"))
    bshd = kw.get("layout", "bshd") == "bshd"
    b, sq, hq = (q.shape[0], q.shape[1], q.shape[2]) if bshd else (q.shape[0], q.shape[2], q.shape[1])
    o_out, lse_out = nan_like(do.shape, q.dtype), nan_like((b, hq, sq), cp.float32)
    res = cp_fmha().attention_forward(q, k, v, **kw, dtype=inp.dtype_arg, out=(o_out, lse_out),
                                      return_dropout_mask=want_keep)
    o, lse = res[0], res[1]
    assert o is o_out and lse is lse_out
    grads_out = tuple(nan_like(x.shape, q.dtype) for x in (q, k, v))
    g = cp_fmha().attention_backward(do, q, k, v, o, lse, **kw, dtype=inp.dtype_arg, out=grads_out)
    assert all(x is y for x, y in zip(g, grads_out))
    cp.cuda.get_current_stream().synchronize()
    return o, lse, g, (res[2] if want_keep else None)


def _check(inp, o, lse, g, kw, d, dv):
    from cupy_fmha.verify import compare

    h = inp.host
    ref_o, ref_lse = R.attention_forward(h["q"], h["k"], h["v"], **kw)
    low_o, low_lse = R.attention_forward(h["q"], h["k"], h["v"], precision="low", **kw)
    ref_g = R.attention_backward(h["do"], h["q"], h["k"], h["v"], **kw)
    low_g = R.attention_backward(h["do"], h["q"], h["k"], h["v"], precision="low", **kw)
    outs = {
        "o": (inp.to_float(o), ref_o, low_o),
        "lse": (cp.asnumpy(lse).astype(np.float64), ref_lse, low_lse),
        "dq": (inp.to_float(g.dq), ref_g[0], low_g[0]),
        "dk": (inp.to_float(g.dk), ref_g[1], low_g[1]),
        "dv": (inp.to_float(g.dv), ref_g[2], low_g[2]),
    }
    checks = [compare(n, out, ref, low, dtype=inp.dtype, hdim_q=d, hdim_v=dv) for n, (out, ref, low) in outs.items()]
    bad = [str(c) for c in checks if not c.ok]
    assert not bad, "\n".join(bad)
    return outs


def _keep_ref(b, hq, sq, sk, p, seed, offset):
    return np.stack([philox.dropout_keep_block(seed, offset, i, hq, sq, sk, p) for i in range(b)])


# --------------------------------------------------------------------------- the keep mask

# id: (b, hq, sq, sk, p, seed, offset)
MASKS = {
    "37x91-seed0": (2, 3, 37, 91, 0.2, 0, 0),
    "1x13-seed>2^32": (1, 2, 1, 13, 0.5, 2**32 + 12345, 7),
    "129x7-offset-near-2^64": (3, 5, 129, 7, 0.3, 2**63 + 99, U64 - 4),  # t wraps past 2^64
    "200x333-max-seed": (1, 4, 200, 333, 0.1, U64 - 1, U64 - 1),
    "65x17-p0.9": (2, 1, 65, 17, 0.9, 42, 2**40),
}


@pytest.mark.parametrize("case", list(MASKS))
def test_keep_mask_is_bit_exact(case):
    b, hq, sq, sk, p, seed, offset = MASKS[case]
    inp = Inputs(F16, "bshd", b, sq, sk, hq, hq, 64, 64, _seed("mask", case))
    o, lse, keep = cp_fmha().attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], dropout_p=p, seed=seed,
                                               offset=offset, return_dropout_mask=True)
    assert isinstance(keep, cp.ndarray) and keep.dtype == cp.bool_ and keep.shape == (b, hq, sq, sk)
    want = _keep_ref(b, hq, sq, sk, p, seed, offset)
    got = cp.asnumpy(keep)
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {got.size} keep bits differ"
    h = inp.host
    _, _, ref_keep = R.attention_forward(h["q"], h["k"], h["v"], dropout_p=p, seed=seed, offset=offset,
                                         return_dropout_mask=True)
    assert np.array_equal(got, ref_keep)


def test_keep_rate_within_binomial_bound():
    b, hq, sq, sk, p = 2, 4, 512, 512, 0.2
    inp = Inputs(F16, "bshd", b, sq, sk, hq, hq, 64, 64, _seed("rate"))
    _, _, keep = cp_fmha().attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], dropout_p=p, seed=1234,
                                             offset=5, return_dropout_mask=True)
    n = keep.size
    q = philox.keep_threshold(p) / 65536.0
    rate = float(keep.mean())
    assert abs(rate - q) <= 5.0 * np.sqrt(q * (1 - q) / n), (rate, q)
    per_head = cp.asnumpy(keep.mean(axis=(2, 3)))  # each (b, h) stream on its own
    assert np.all(np.abs(per_head - q) <= 5.0 * np.sqrt(q * (1 - q) / (sq * sk)))


# --------------------------------------------------------------------------- forward + backward

# id: (dtype, layout, b, sq, sk, hq, hk, d, dv, kwargs incl. dropout)
CASES = {
    # wgmma kernels on sm_90 (head dims 64, 128)
    "f16-d64-none-253": (F16, "bshd", 2, 253, 253, 4, 4, 64, 64, {"dropout_p": 0.2, "seed": 1}),
    "f16-d64-t-300x600-gqa2": (F16, "bshd", 1, 300, 600, 4, 2, 64, 64, {"mask": "t", "dropout_p": 0.2, "seed": 2}),
    "bf16-d64-b-p0.5": (BF16, "bhsd", 2, 200, 333, 2, 2, 64, 64, {"mask": "b", "dropout_p": 0.5, "seed": 3}),
    "f16-d128-b-bhsd": (F16, "bhsd", 1, 253, 500, 4, 4, 128, 128, {"mask": "b", "dropout_p": 0.2, "seed": 4}),
    "bf16-d128-causal-gqa2": (BF16, "bshd", 1, 500, 500, 4, 2, 128, 128,
                              {"causal": True, "dropout_p": 0.2, "seed": 2**33 + 5, "offset": U64 - 3}),
    "bf16-d128-t:64,16-p0.5": (BF16, "bshd", 2, 253, 253, 2, 2, 128, 128,
                               {"mask": "t:64,16", "dropout_p": 0.5, "seed": 6}),
    # mma.sync kernels (head dims 32, 96, 256)
    "f16-d32-none-500": (F16, "bshd", 1, 500, 500, 4, 4, 32, 32, {"dropout_p": 0.2, "seed": 7}),
    "bf16-d32-t-17x253-gqa2": (BF16, "bhsd", 2, 17, 253, 4, 2, 32, 32, {"mask": "t", "dropout_p": 0.2, "seed": 8}),
    "f16-d96-b:50,10-p0.5": (F16, "bshd", 1, 333, 200, 2, 1, 96, 96,
                             {"mask": "b:50,10", "dropout_p": 0.5, "seed": 9, "offset": 2**40}),
    "bf16-d96-causal": (BF16, "bshd", 1, 300, 300, 4, 4, 96, 96, {"causal": True, "dropout_p": 0.2, "seed": 10}),
    "f16-d256-none-253": (F16, "bshd", 1, 253, 253, 2, 2, 256, 256, {"dropout_p": 0.2, "seed": 11}),
    "bf16-d256-t-300x200-gqa2": (BF16, "bhsd", 1, 300, 200, 4, 2, 256, 256,
                                 {"mask": "t", "dropout_p": 0.2, "seed": U64 - 1, "offset": U64 - 1}),
    # short sides
    "f16-d64-sq1-sk253": (F16, "bshd", 3, 1, 253, 4, 4, 64, 64, {"dropout_p": 0.2, "seed": 12}),
    "f16-d128-sq253-sk9": (F16, "bshd", 1, 253, 9, 2, 2, 128, 128, {"dropout_p": 0.2, "seed": 13}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dropout_forward_backward_matches_reference(case, poison_pool):  # noqa: F811
    dtype, layout, b, sq, sk, hq, hk, d, dv, extra = CASES[case]
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, dv, _seed("dropout", case))
    kw = dict(extra, layout=layout)
    o, lse, g, keep = _run(inp, poison_pool, kw, want_keep=True)
    _check(inp, o, lse, g, kw, d, dv)
    want = _keep_ref(b, hq, sq, sk, kw["dropout_p"], kw.get("seed", 0), kw.get("offset", 0))
    assert np.array_equal(cp.asnumpy(keep), want)


@pytest.mark.parametrize("d", [64, 32])
def test_rows_without_keys_stay_zero_with_dropout(d, poison_pool):  # noqa: F811
    # bottom-right causal with sq > sk: the first sq - sk rows see nothing
    b, sq, sk, h = 2, 300, 120, 2
    inp = Inputs(F16, "bshd", b, sq, sk, h, h, d, d, _seed("empty-dropout", d))
    kw = {"mask": "b", "dropout_p": 0.3, "seed": 77, "offset": 3}
    o, lse, g, _ = _run(inp, poison_pool, kw)
    o, lse, dq = cp.asnumpy(o), cp.asnumpy(lse), cp.asnumpy(g.dq)
    for x in (o, dq, cp.asnumpy(g.dk), cp.asnumpy(g.dv)):
        assert not np.isnan(x.astype(np.float32)).any()
    n = sq - sk
    assert np.all(o[:, :n] == 0) and np.all(dq[:, :n] == 0)
    assert np.all(np.isneginf(lse[:, :, :n])) and np.all(np.isfinite(lse[:, :, n:]))
    _check(inp, *_run(inp, poison_pool, kw)[:3], kw, d, d)


@pytest.mark.parametrize("d", [64, 96])
def test_p0_is_the_kernel_without_dropout(d, poison_pool):  # noqa: F811
    inp = Inputs(BF16, "bshd", 1, 253, 253, 2, 2, d, d, _seed("p0", d))
    o0, lse0, g0, _ = _run(inp, poison_pool, {"causal": True})
    o1, lse1, g1, keep = _run(inp, poison_pool, {"causal": True, "dropout_p": 0.0, "seed": 9, "offset": 9},
                              want_keep=True)
    assert bool(keep.all())
    assert bool((o0 == o1).all()) and bool((lse0 == lse1).all())
    assert bool((g0.dk == g1.dk).all()) and bool((g0.dv == g1.dv).all())
    # a tiny p runs the dropout instance, which then keeps everything: same results up to
    # summation order (the dropout build may use other tiles)
    o2, lse2, g2, keep2 = _run(inp, poison_pool, {"causal": True, "dropout_p": 1e-9, "seed": 9}, want_keep=True)
    assert bool(keep2.all())
    for a, c in ((o0, o2), (g0.dq, g2.dq), (g0.dk, g2.dk), (g0.dv, g2.dv)):
        x, y = inp.to_float(a), inp.to_float(c)
        assert np.max(np.abs(x - y)) <= 2 * 2.0**-7 * np.max(np.abs(x)), np.max(np.abs(x - y))
    assert np.allclose(cp.asnumpy(lse0), cp.asnumpy(lse2), rtol=1e-5, atol=1e-5)


def test_dropout_changes_the_result(poison_pool):  # noqa: F811
    # guards the tests above against a dropout path that silently does nothing
    inp = Inputs(F16, "bshd", 1, 128, 128, 2, 2, 64, 64, _seed("changes"))
    o0, _, _, _ = _run(inp, poison_pool, {})
    o1, _, _, _ = _run(inp, poison_pool, {"dropout_p": 0.5, "seed": 1})
    o2, _, _, _ = _run(inp, poison_pool, {"dropout_p": 0.5, "seed": 2})
    x0, x1, x2 = (inp.to_float(x) for x in (o0, o1, o2))
    assert np.linalg.norm(x1 - x0) > 0.1 * np.linalg.norm(x0)
    assert np.linalg.norm(x1 - x2) > 0.1 * np.linalg.norm(x0)
