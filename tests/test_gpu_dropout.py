"""Dropout on the GPU against cupy_fmha.philox and the NumPy reference.

Marked ``gpu`` (skipped without a device). Modeled on test_gpu_attention.py: fresh random inputs,
NaN-poisoned ``out=`` buffers, :func:`cupy_fmha.verify.compare` against the float64 and the
``precision="low"`` references run with the same ``dropout_p``, ``seed`` and ``offset``.

* the keep mask (``return_dropout_mask=True``, kernel fmha_dropout_mask.cu) is bit-exact with
  :mod:`cupy_fmha.philox` on odd shapes, seeds above 2^32 and offsets near 2^64, and its keep
  rate is within a binomial bound;
* forward + backward match the reference at p = 0.2 / 0.5 for head dims 64, 96, 128, 160, 192,
  256 and 192 / 128 (on sm_90 the warp-specialized forward, which computes the keep bits in its MMA
  warps; the warp-specialized backward up to 128, whose warps make their own keep bits, the
  mma.sync one above) and 32 (mma.sync), masks 0 / t / b / t:l,r, GQA, fp16 and bf16, and the cases
  up to 128 again on the older backward (``CUPY_FMHA_BWD_WS=0``): since the
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

import cupy_fmha
from conftest import BF16, F16, Inputs, check, is_sm90, keep_reference, run, seed_for
from cupy_fmha import philox
from cupy_fmha import reference as R

pytestmark = pytest.mark.gpu

U64 = 2**64


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
    inp = Inputs(F16, "bshd", b, sq, sk, hq, hq, 64, 64, seed_for("mask", case))
    o, lse, keep = cupy_fmha.attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], dropout_p=p, seed=seed,
                                               offset=offset, return_dropout_mask=True)
    assert isinstance(keep, cp.ndarray) and keep.dtype == cp.bool_ and keep.shape == (b, hq, sq, sk)
    want = keep_reference(b, hq, sq, sk, p, seed, offset)
    got = cp.asnumpy(keep)
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {got.size} keep bits differ"
    h = inp.host
    _, _, ref_keep = R.attention_forward(h["q"], h["k"], h["v"], dropout_p=p, seed=seed, offset=offset,
                                         return_dropout_mask=True)
    assert np.array_equal(got, ref_keep)


def test_keep_rate_within_binomial_bound():
    b, hq, sq, sk, p = 2, 4, 512, 512, 0.2
    inp = Inputs(F16, "bshd", b, sq, sk, hq, hq, 64, 64, seed_for("rate"))
    _, _, keep = cupy_fmha.attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], dropout_p=p, seed=1234,
                                             offset=5, return_dropout_mask=True)
    n = keep.size
    q = philox.keep_threshold(p) / 256.0
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
    # head dims above 128 on the ws forward (96-key blocks at 192, 80 at 256; the serial pipeline)
    "bf16-d192-causal-253": (BF16, "bshd", 1, 253, 253, 4, 4, 192, 192, {"causal": True, "dropout_p": 0.2, "seed": 14}),
    "f16-d160-t-300x200-gqa2": (F16, "bhsd", 1, 300, 200, 4, 2, 160, 160, {"mask": "t", "dropout_p": 0.3, "seed": 15}),
    "bf16-d192x128-b-129x257": (BF16, "bshd", 2, 129, 257, 2, 2, 192, 128, {"mask": "b", "dropout_p": 0.2, "seed": 16}),
    # short sides
    "f16-d64-sq1-sk253": (F16, "bshd", 3, 1, 253, 4, 4, 64, 64, {"dropout_p": 0.2, "seed": 12}),
    "f16-d128-sq253-sk9": (F16, "bshd", 1, 253, 9, 2, 2, 128, 128, {"dropout_p": 0.2, "seed": 13}),
}


def _check_case(spec, seed):
    """One CASES-style entry: forward and backward against the reference, the keep mask against the replica."""
    dtype, layout, b, sq, sk, hq, hk, d, dv, extra = spec
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, dv, seed)
    kw = dict(extra, layout=layout)
    o, lse, g, keep = run(inp, kw, want_keep=True)
    check(inp, o, lse, g, kw)
    want = keep_reference(b, hq, sq, sk, kw["dropout_p"], kw.get("seed", 0), kw.get("offset", 0))
    assert np.array_equal(cp.asnumpy(keep), want)


@pytest.mark.parametrize("case", list(CASES))
def test_dropout_forward_backward_matches_reference(case):
    _check_case(CASES[case], seed_for("dropout", case))


@pytest.mark.parametrize("case", [c for c, v in CASES.items() if max(v[7], v[8]) <= 128])
def test_dropout_on_the_older_backward(case, monkeypatch):
    """The cases up to hdim 128 with the warp-specialized backward switched off: the kernels its
    DROPOUT build replaced by default (fmha_bwd_dq_dk_dv_sm90 on sm_90, where dropout with a bias
    still runs; mma.sync elsewhere)."""
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "0")
    test_dropout_forward_backward_matches_reference(case)


# Step 114: the ws forward's folded softmax with dropout (FOLD=1 in CUPY_FMHA_FWD_WS_TILES; the table's dropout
# builds keep the scaled form until it is timed). Its overlapped pipeline at the head dims that pad to 64 and 128
# (the dropped elements leave as P is packed, KEEP_MSB): the cases above there, and a negative softmax_scale (the
# folded form then takes each row's minimum), against the reference with the replica's keep mask.
FOLD_DROPOUT = {
    **{c: v for c, v in CASES.items() if 64 <= max(v[7], v[8]) <= 128},
    "f16-d64-b-negscale": (F16, "bshd", 1, 300, 333, 2, 2, 64, 64,
                           {"mask": "b", "softmax_scale": -0.07, "dropout_p": 0.2, "seed": 21}),
    "bf16-d128-causal-negscale": (BF16, "bshd", 2, 253, 253, 2, 2, 128, 128,
                                  {"causal": True, "softmax_scale": -0.05, "dropout_p": 0.3, "seed": 22, "offset": 5}),
}


@pytest.mark.parametrize("case", list(FOLD_DROPOUT))
def test_dropout_folded_softmax_variant(case, monkeypatch):
    from cupy_fmha.backends import cuda

    if not is_sm90():
        pytest.skip("sm_90 only")
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "FOLD=1")
    dtype, d, dv = FOLD_DROPOUT[case][0], FOLD_DROPOUT[case][7], FOLD_DROPOUT[case][8]
    spec = cuda.fwd_spec("fp16" if dtype == F16 else "bf16", d, dv, 90, dropout=True)
    assert spec.macro("FOLD") == 1 and spec.macro("DROPOUT") == 1 and spec.macro("PV_OVERLAP") == 1, spec.name
    _check_case(FOLD_DROPOUT[case], seed_for("dropout-fold", case))


# Step 116: the keep decisions made inside the softmax (KEEP_SINK=1: the softmax's gen hook, where ptxas interleaves
# the Philox work with the maxima and exponentials; the default at hdim 64), under the S GEMM (KEEP_SINK=0), or half and
# half (KEEP_SINK=2, step 117; the default at 128 since step 119). The same decisions and the same softmax arithmetic,
# only scheduled elsewhere: each form other than the table's gives O and LSE bit-identical to the default build's, and
# the whole case (forward, backward, keep mask) against the reference, on the FOLD_DROPOUT cases (the overlapped
# pipeline at 64 and 128), with FOLD as the table has it.
@pytest.mark.parametrize("form", [0, 1, 2])
@pytest.mark.parametrize("case", list(FOLD_DROPOUT))
def test_dropout_keep_sink_variant(case, form, monkeypatch):
    """(form: KEEP_SINK 0, 1 or 2; the table's own skipped)"""
    from cupy_fmha.backends import cuda

    if not is_sm90():
        pytest.skip("sm_90 only")
    dtype, layout, b, sq, sk, hq, hk, d, dv, extra = FOLD_DROPOUT[case]
    inp = Inputs(dtype, layout, b, sq, sk, hq, hk, d, dv, seed_for("dropout-keep-sink", case))
    kw = dict(inp.api_kw(dict(extra, layout=layout)), dtype=inp.dtype_arg)
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    name = "fp16" if dtype == F16 else "bf16"
    table = cuda.fwd_spec(name, d, dv, 90, dropout=True).macro("KEEP_SINK", 0)
    assert table == (1 if max(d, dv) <= 64 else 2)
    if form == table:
        pytest.skip("the table's own form")
    o0, lse0 = cupy_fmha.attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], **kw)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"KEEP_SINK={form}")
    spec = cuda.fwd_spec(name, d, dv, 90, dropout=True)
    assert spec.macro("KEEP_SINK", 0) == form and spec.macro("DROPOUT") == 1 and spec.macro("PV_OVERLAP") == 1, spec.name
    o, lse = cupy_fmha.attention_forward(inp.dev["q"], inp.dev["k"], inp.dev["v"], **kw)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())
    _check_case(FOLD_DROPOUT[case], seed_for("dropout-keep-sink", case, form))


def test_dropout_folded_list_is_not_empty():
    """(a filter that matched nothing would leave the variant untested while the file still passed)"""
    assert sum(max(v[7], v[8]) == 64 for v in FOLD_DROPOUT.values()) >= 3
    assert sum(max(v[7], v[8]) == 128 for v in FOLD_DROPOUT.values()) >= 4


@pytest.mark.parametrize("d", [64, 32])
def test_rows_without_keys_stay_zero_with_dropout(d):
    # bottom-right causal with sq > sk: the first sq - sk rows see nothing
    b, sq, sk, h = 2, 300, 120, 2
    inp = Inputs(F16, "bshd", b, sq, sk, h, h, d, d, seed_for("empty-dropout", d))
    kw = {"mask": "b", "dropout_p": 0.3, "seed": 77, "offset": 3}
    o, lse, g = run(inp, kw)
    o, lse, dq = cp.asnumpy(o), cp.asnumpy(lse), cp.asnumpy(g.dq)
    for x in (o, dq, cp.asnumpy(g.dk), cp.asnumpy(g.dv)):
        assert not np.isnan(x.astype(np.float32)).any()
    n = sq - sk
    assert np.all(o[:, :n] == 0) and np.all(dq[:, :n] == 0)
    assert np.all(np.isneginf(lse[:, :, :n])) and np.all(np.isfinite(lse[:, :, n:]))
    check(inp, *run(inp, kw), kw)


@pytest.mark.parametrize("d", [64, 96])
def test_p0_is_the_kernel_without_dropout(d):
    inp = Inputs(BF16, "bshd", 1, 253, 253, 2, 2, d, d, seed_for("p0", d))
    o0, lse0, g0 = run(inp, {"causal": True})
    o1, lse1, g1, keep = run(inp, {"causal": True, "dropout_p": 0.0, "seed": 9, "offset": 9}, want_keep=True)
    assert bool(keep.all())
    assert bool((o0 == o1).all()) and bool((lse0 == lse1).all())
    assert bool((g0.dk == g1.dk).all()) and bool((g0.dv == g1.dv).all())
    # a tiny p runs the dropout instance, which then keeps everything: same results up to
    # summation order (the dropout build may use other tiles)
    o2, lse2, g2, keep2 = run(inp, {"causal": True, "dropout_p": 1e-9, "seed": 9}, want_keep=True)
    assert bool(keep2.all())
    for a, c in ((o0, o2), (g0.dq, g2.dq), (g0.dk, g2.dk), (g0.dv, g2.dv)):
        x, y = inp.to_float(a), inp.to_float(c)
        assert np.max(np.abs(x - y)) <= 2 * 2.0**-7 * np.max(np.abs(x)), np.max(np.abs(x - y))
    assert np.allclose(cp.asnumpy(lse0), cp.asnumpy(lse2), rtol=1e-5, atol=1e-5)


def test_dropout_changes_the_result():
    # guards the tests above against a dropout path that silently does nothing
    inp = Inputs(F16, "bshd", 1, 128, 128, 2, 2, 64, 64, seed_for("changes"))
    o0, _, _ = run(inp, {})
    o1, _, _ = run(inp, {"dropout_p": 0.5, "seed": 1})
    o2, _, _ = run(inp, {"dropout_p": 0.5, "seed": 2})
    x0, x1, x2 = (inp.to_float(x) for x in (o0, o1, o2))
    assert np.linalg.norm(x1 - x0) > 0.1 * np.linalg.norm(x0)
    assert np.linalg.norm(x1 - x2) > 0.1 * np.linalg.norm(x0)
