"""Ring attention (cupy_fmha.parallel) run as the NumPy model on the CPU, against the one-shot
reference: the same generator code as the GPU path (cupy_fmha/parallel/ring.py) with
cupy_fmha.reference for each step's forward and a dense NumPy backward that takes the global o
and lse; a LocalRing moves K/V and dK/dV between the ranks with NumPy copies. Everything runs in
float64, so results must equal the one-shot reference to rounding (1e-10). Also: the errors
that name the argument, and the local ring's step checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cupy_fmha import reference as R
from cupy_fmha.mask import resolve_mask
from cupy_fmha.parallel import (
    LocalRing,
    Timeline,
    local_ring_attention_backward,
    local_ring_attention_forward,
    ring_attention_forward,
    shard,
    unshard,
)
from cupy_fmha.parallel import layout as LY
from cupy_fmha.parallel.ops import NumpyOps, partial_backward

MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window5,0": {"window_size": (5, 0)},
    "window3,7": {"window_size": (3, 7)},
    "causal-left9": {"causal": True, "window_size": (9, -1)},
    "t:2,1": {"mask": "t:2,1"},
    "g:-2,9": {"mask": "g:-2,9"},  # a generic window off the diagonal (rows see keys ahead of them)
}


def _shape(layout, b, s, h, d):
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def _problem(rng, layout, b, s, hq, hk, d, dv, dtype=np.float64):
    q = rng.standard_normal(_shape(layout, b, s, hq, d)).astype(dtype)
    k = rng.standard_normal(_shape(layout, b, s, hk, d)).astype(dtype)
    v = rng.standard_normal(_shape(layout, b, s, hk, dv)).astype(dtype)
    do = rng.standard_normal(_shape(layout, b, s, hq, dv)).astype(dtype)
    return q, k, v, do


def _ring(q, k, v, do, n, layout, scheme, kw, dlse=None):
    """Shard, run the ring forward and backward on the NumPy model, unshard. ``dlse``: the global
    [b, hq, s] cotangent of lse, sharded as lse (axis 2), or None."""
    ax = 1 if layout == "bshd" else 2

    def sh(x, axis=ax):
        return [shard(x, r, n, scheme=scheme, axis=axis) for r in range(n)]

    fw = local_ring_attention_forward(sh(q), sh(k), sh(v), layout=layout, scheme=scheme, **kw)
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    extra = {} if dlse is None else {"dlse": sh(dlse, 2)}
    bw = local_ring_attention_backward(sh(do), sh(q), sh(k), sh(v), os_, lses, layout=layout, scheme=scheme, **kw,
                                       **extra)
    o = unshard(os_, scheme=scheme, axis=ax)
    lse = unshard(lses, scheme=scheme, axis=2)
    grads = [unshard([g[i] for g in bw], scheme=scheme, axis=ax) for i in range(3)]
    return o, lse, grads


def _assert_matches(q, k, v, do, n, layout, scheme, kw, tol=1e-10, dlse=None):
    o, lse, grads = _ring(q, k, v, do, n, layout, scheme, kw, dlse=dlse)
    ref_o, ref_lse = R.attention_forward(q, k, v, layout=layout, **kw)
    ref_g = R.attention_backward(do, q, k, v, layout=layout, dlse=dlse, **kw)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(lse[fin] - ref_lse[fin]).max(initial=0) < tol
    assert not np.isnan(o).any() and not any(np.isnan(g).any() for g in grads)
    for name, got, ref in (("o", o, ref_o), ("dq", grads[0], ref_g[0]), ("dk", grads[1], ref_g[1]),
                           ("dv", grads[2], ref_g[2])):
        assert got.shape == ref.shape, name
        scale = max(1.0, float(np.abs(ref).max(initial=0)))
        assert np.abs(got - ref).max(initial=0) <= tol * scale, (name, float(np.abs(got - ref).max()))
    return grads


# --------------------------------------------------------------------------- one step's backward


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_partial_backward_is_the_reference_on_one_block(layout):
    rng = np.random.default_rng(5)
    q, k, v, do = _problem(rng, layout, 2, 9, 4, 2, 8, 16)
    kw = {"mask": "g:3,2"}
    o, lse = R.attention_forward(q, k, v, layout=layout, **kw)
    got = partial_backward(do, q, k, v, o, lse, mask=resolve_mask("g:3,2"), softmax_scale=8 ** -0.5, layout=layout)
    ref = R.attention_backward(do, q, k, v, layout=layout, **kw)
    for a, b in zip(got, ref):
        assert np.allclose(a, b, rtol=0, atol=1e-12)


def test_partial_backward_with_dlse_is_the_reference_on_one_block():
    rng = np.random.default_rng(6)
    q, k, v, do = _problem(rng, "bshd", 2, 9, 4, 2, 8, 16)
    dlse = rng.standard_normal((2, 4, 9)).astype(np.float32)
    keep = dlse.copy()
    o, lse = R.attention_forward(q, k, v, causal=True)
    got = partial_backward(do, q, k, v, o, lse, mask=resolve_mask("b"), softmax_scale=8 ** -0.5, dlse=dlse)
    ref = R.attention_backward(do, q, k, v, causal=True, dlse=dlse)
    for a, b in zip(got, ref):
        assert np.allclose(a, b, rtol=0, atol=1e-12)
    assert np.array_equal(dlse, keep)


# --------------------------------------------------------------------------- the ring (NumPy model)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
@pytest.mark.parametrize("mask", list(MASKS))
def test_ring_matches_reference(n, scheme, mask):
    rng = np.random.default_rng([n, len(mask)])
    layout = "bshd" if n % 2 else "bhsd"
    seqlen = 3 * n * 2
    q, k, v, do = _problem(rng, layout, 2, seqlen, 4, 2, 8, 16)
    _assert_matches(q, k, v, do, n, layout, scheme, MASKS[mask])


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_ring_mqa_and_scale(layout):
    rng = np.random.default_rng(11)
    q, k, v, do = _problem(rng, layout, 1, 16, 6, 1, 16, 8)
    _assert_matches(q, k, v, do, 4, layout, "zigzag", {"causal": True, "softmax_scale": 0.7})


def test_ring_bf16_inputs_cpu_model():
    """bf16 host inputs: the model computes in float64 from the rounded inputs, outputs bf16."""
    from cupy_fmha.validate import _BF16

    rng = np.random.default_rng(2)
    q, k, v, do = _problem(rng, "bshd", 1, 16, 2, 2, 8, 8, dtype=_BF16)
    o, lse, grads = _ring(q, k, v, do, 2, "bshd", "zigzag", {"causal": True})
    assert o.dtype == _BF16 and all(g.dtype == _BF16 for g in grads)
    ref_o, _ = R.attention_forward(q, k, v, causal=True)
    assert np.abs(o.astype(np.float64) - ref_o).max() < 2e-2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(n=3, c=1, b=1, hk=1, g=2, d=8, dv=8, scheme="zigzag", layout="bshd", causal=True, left=-1, right=-1,
         seed=1, with_dlse=True)
@given(n=st.integers(1, 4), c=st.integers(1, 5), b=st.integers(1, 2), hk=st.integers(1, 2), g=st.integers(1, 3),
       d=st.sampled_from([8, 16]), dv=st.sampled_from([8, 16]), scheme=st.sampled_from(["zigzag", "contiguous"]),
       layout=st.sampled_from(["bshd", "bhsd"]), causal=st.booleans(), left=st.integers(-1, 20),
       right=st.integers(-1, 20), seed=st.integers(0, 2**31), with_dlse=st.booleans())
def test_ring_hypothesis(n, c, b, hk, g, d, dv, scheme, layout, causal, left, right, seed, with_dlse):
    seqlen = c * n * (2 if scheme == "zigzag" else 1)
    kw = {"causal": causal, "window_size": (left, right)}
    rng = np.random.default_rng(seed)
    q, k, v, do = _problem(rng, layout, b, seqlen, hk * g, hk, d, dv)
    dlse = rng.standard_normal((b, hk * g, seqlen)).astype(np.float32) if with_dlse else None
    _assert_matches(q, k, v, do, n, layout, scheme, kw, tol=1e-9, dlse=dlse)


DLSE_MASKS = ["none", "causal", "window3,7", "causal-left9", "g:-2,9"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
@pytest.mark.parametrize("mask", DLSE_MASKS)
def test_ring_dlse_matches_reference(n, scheme, mask):
    """lse's cotangent through the ring: every call over a row subtracts that row's dlse from D,
    so the ring's gradients equal the one-shot reference backward with dlse (GQA; chunks of 5
    tokens, so the sequence length is a multiple of nothing but the scheme's chunk count)."""
    rng = np.random.default_rng([n, len(mask), 7])
    layout = "bhsd" if n % 2 else "bshd"
    seqlen = 5 * n * (2 if scheme == "zigzag" else 1)
    q, k, v, do = _problem(rng, layout, 2, seqlen, 4, 2, 8, 16)
    dlse = rng.standard_normal((2, 4, seqlen)).astype(np.float32)
    keep = dlse.copy()
    grads = _assert_matches(q, k, v, do, n, layout, scheme, MASKS[mask], dlse=dlse)
    assert np.array_equal(dlse, keep)
    # the lse term is there (dq, dk change; dv does not see lse): the comparison could fail
    _, _, plain = _ring(q, k, v, do, n, layout, scheme, MASKS[mask])
    assert not np.allclose(grads[0], plain[0]) and not np.allclose(grads[1], plain[1])
    np.testing.assert_allclose(grads[2], plain[2], rtol=0, atol=1e-12)


def test_ring_dlse_zeros_equals_none():
    rng = np.random.default_rng(3)
    q, k, v, do = _problem(rng, "bshd", 1, 12, 4, 1, 8, 8)
    _, _, plain = _ring(q, k, v, do, 3, "bshd", "zigzag", {"causal": True})
    _, _, zero = _ring(q, k, v, do, 3, "bshd", "zigzag", {"causal": True}, dlse=np.zeros((1, 4, 12), np.float32))
    for a, b in zip(plain, zero):
        np.testing.assert_array_equal(a, b)


def test_local_ring_exchange_counts_and_timeline():
    rng = np.random.default_rng(0)
    n = 3
    q, k, v, do = _problem(rng, "bshd", 1, 12, 2, 2, 8, 8)
    sh = lambda x: [shard(x, r, n) for r in range(n)]  # noqa: E731
    ring = LocalRing(n)
    tls = [Timeline() for _ in range(n)]
    fw = local_ring_attention_forward(sh(q), sh(k), sh(v), ring=ring, timelines=tls, causal=True)
    assert ring.exchanges == n - 1  # K/V hops
    rows = tls[0].summary()
    assert [r["step"] for r in rows if r["kind"] == "compute"] == [0, 1, 2]
    assert [r["step"] for r in rows if r["kind"] == "kv"] == [1, 2]
    assert all(r["ms"] >= 0 for r in rows)
    local_ring_attention_backward(sh(do), sh(q), sh(k), sh(v), [f[0] for f in fw], [f[1] for f in fw], ring=ring,
                                  causal=True)
    assert ring.exchanges == (n - 1) + (n - 1) + n  # then K/V hops and n dK/dV hops


# --------------------------------------------------------------------------- errors, before anything runs


def _shards(n=2, s=8, **over):
    rng = np.random.default_rng(0)
    q, k, v, do = _problem(rng, "bshd", 1, s, 2, 2, 8, 8)
    return [[shard(x, r, n) for r in range(n)] for x in (q, k, v)]


def test_errors_name_the_argument():
    q, k, v = _shards()
    with pytest.raises(NotImplementedError, match="cu_seqlens_q"):
        local_ring_attention_forward(q, k, v, cu_seqlens_q=np.array([0, 4], np.int32))
    with pytest.raises(NotImplementedError, match="layout"):
        local_ring_attention_forward(q, k, v, layout="thd")
    with pytest.raises(ValueError, match="scheme"):
        local_ring_attention_forward(q, k, v, scheme="spiral")
    with pytest.raises(ValueError, match="mask"):
        local_ring_attention_forward(q, k, v, mask="g:-20,-20")
    with pytest.raises(ValueError, match="window_size"):
        local_ring_attention_forward(q, k, v, window_size=(1, 2, 3))
    odd = [x[:, :3] for x in q]
    with pytest.raises(ValueError, match="q: this rank's shard holds 3 tokens"):
        local_ring_attention_forward(odd, [x[:, :3] for x in k], [x[:, :3] for x in v])
    with pytest.raises(ValueError, match="k: this rank's K/V shard holds 2 tokens"):
        local_ring_attention_forward(q, [x[:, :2] for x in k], [x[:, :2] for x in v])
    with pytest.raises(TypeError, match="k: dtype"):
        local_ring_attention_forward(q, [x.astype(np.float32) for x in k], v)
    with pytest.raises(ValueError, match="v: 1 shards"):
        local_ring_attention_forward(q, k, v[:1])
    # one rank's shard unlike rank 0's: named before any exchange (it was the ring's buffer error,
    # or accepted where only q's heads differed)
    with pytest.raises(ValueError, match="q: rank 1's shard .* differs from rank 0's"):
        local_ring_attention_forward([q[0], np.concatenate([q[1], q[1]], axis=2), *q[2:]], k, v)
    with pytest.raises(ValueError, match="k: rank 1's shard .* float32 differs from rank 0's"):
        local_ring_attention_forward(q, [k[0], k[1].astype(np.float32)], v)
    with pytest.raises(TypeError, match="bias: not an option of ring_attention_forward"):
        local_ring_attention_forward(q, k, v, bias=np.zeros(1))
    with pytest.raises(TypeError, match="q: expected a list"):
        local_ring_attention_forward(q[0], k, v)
    with pytest.raises(TypeError, match="q: ring attention takes CuPy arrays"):
        local_ring_attention_forward([x.tolist() for x in q], k, v)
    with pytest.raises(ValueError, match="ring: a LocalRing of 3 ranks"):
        local_ring_attention_forward(q, k, v, ring=LocalRing(3))
    for bad in (1, Timeline()):  # used to fail with Python's "'int' object is not iterable"
        with pytest.raises(TypeError, match="timelines: expected a list of 2 Timeline objects"):
            local_ring_attention_forward(q, k, v, timelines=bad)
    ring = LocalRing(2)
    with pytest.raises(TypeError, match="comm"):
        ring_attention_forward(q[0], k[0], v[0], object())
    with pytest.raises(ValueError, match="comm: a LocalRing rank cannot run alone"):
        ring_attention_forward(q[0], k[0], v[0], ring.ranks[0])


def test_backward_errors_name_the_argument():
    q, k, v = _shards()
    fw = local_ring_attention_forward(q, k, v, causal=True)
    o, lse = [f[0] for f in fw], [f[1] for f in fw]
    with pytest.raises(ValueError, match="lse"):
        local_ring_attention_backward(o, q, k, v, o, [x[:, :, :2] for x in lse], causal=True)
    with pytest.raises(ValueError, match="do"):
        local_ring_attention_backward([x[:, :2] for x in o], q, k, v, o, lse, causal=True)
    with pytest.raises(TypeError, match="deterministic"):
        local_ring_attention_backward(o, q, k, v, o, lse, causal=True, deterministic="yes")
    # the CPU model took an int lse (truncated: silently wrong gradients) and a complex one
    for dt in (np.int64, np.complex128, np.bool_):
        with pytest.raises(TypeError, match=f"lse: expected a floating-point array .*got dtype {np.dtype(dt)}"):
            local_ring_attention_backward(o, q, k, v, o, [x.astype(dt) for x in lse], causal=True)


def test_backward_dlse_errors_name_dlse():
    """Bad dlse is refused, naming dlse, before anything runs (no exchange), on the NumPy path
    (both the local ring and one rank alone); the caller's arrays are left as they were."""
    q, k, v = _shards()
    fw = local_ring_attention_forward(q, k, v, causal=True)
    o, lse = [f[0] for f in fw], [f[1] for f in fw]
    good = [np.full(x.shape, 0.5, np.float32) for x in lse]  # [1, 2, 4] per rank
    arrays = q + k + v + o + lse + good
    keep = [x.copy() for x in arrays]
    bad = {
        "shape": ([x[:, :, :3] for x in good], ValueError, r"dlse: expected lse's shape \(1, 2, 4\)"),
        "heads": ([np.concatenate([x, x], axis=1) for x in good], ValueError, "dlse: expected lse's shape"),
        "int": ([x.astype(np.int32) for x in good], TypeError, "dlse: expected float32.*int32"),
        "float16": ([x.astype(np.float16) for x in good], TypeError, "dlse: expected float32.*float16"),
        "float64": ([x.astype(np.float64) for x in good], TypeError, "dlse: expected float32.*float64"),
        "not-array": ([x.tolist() for x in good], TypeError, "dlse: expected a float32 array"),
        "one-array": (good[0], TypeError, "dlse: expected a list with one shard per rank"),
        "shards": (good[:1], ValueError, "dlse: 1 shards, but do has 2"),
        "rank1": ([good[0], good[1].astype(np.float16)], ValueError, "dlse: rank 1's shard .* differs from rank 0's"),
    }
    for name, (d, exc, msg) in bad.items():
        ring = LocalRing(2)
        with pytest.raises(exc, match=msg):
            local_ring_attention_backward(o, q, k, v, o, lse, causal=True, dlse=d, ring=ring)
        assert ring.exchanges == 0, name
    from cupy_fmha.parallel import ring_attention_backward

    q1, k1, v1 = _shards(n=1)
    o1, lse1 = ring_attention_forward(q1[0], k1[0], v1[0], LocalRing(1).ranks[0], causal=True)
    for d, exc, msg in ((lse1.astype(np.float16), TypeError, "dlse: expected float32"),
                        (np.zeros((1, 2, 3), np.float32), ValueError, "dlse: expected lse's shape"),
                        ("x", TypeError, "dlse: expected a float32 array")):
        with pytest.raises(exc, match=msg):
            ring_attention_backward(o1, q1[0], k1[0], v1[0], o1, lse1, LocalRing(1).ranks[0], causal=True, dlse=d)
    for a, b in zip(arrays, keep):
        np.testing.assert_array_equal(a, b)


def test_float64_dlse_on_the_cpu_model_is_refused_without_calling_float32_lse_s_dtype():
    """The CPU model's lse is float64, and its dlse must still be float32 (as on the GPU): the
    message said "expected float32 (lse's dtype)" there, naming a dtype lse does not have."""
    q, k, v = _shards()
    fw = local_ring_attention_forward(q, k, v, causal=True)
    o, lse = [f[0] for f in fw], [f[1] for f in fw]
    assert lse[0].dtype == np.float64
    with pytest.raises(TypeError, match="dlse: expected float32") as err:
        local_ring_attention_backward(o, q, k, v, o, lse, causal=True, dlse=[2 * x for x in lse])
    msg = str(err.value)
    assert "lse's dtype" not in msg and "float64" in msg and "CPU model" in msg, msg


def test_nan_lse_is_not_a_row_without_keys():
    """partial_backward treated every non-finite lse as a row that sees no key: a NaN lse gave
    zero gradients, silently, where the kernels give NaN. Only -inf means no key."""
    q, k, v = _shards()
    fw = local_ring_attention_forward(q, k, v, causal=True)
    o, lse = [f[0] for f in fw], [f[1].copy() for f in fw]
    lse[1][0, 1, 3] = np.nan
    bw = local_ring_attention_backward(o, q, k, v, o, lse, causal=True)
    dq1 = bw[1][0]  # [1, 4, 2, 8]: row 3, head 1 is the NaN one
    assert np.isnan(dq1[0, 3, 1]).all() and not np.isnan(dq1[0, 3, 0]).any()
    assert not np.isnan(np.delete(dq1, 3, axis=1)).any() and not np.isnan(bw[0][0]).any()


def test_single_rank_host_ring_runs_alone():
    q, k, v = _shards(n=1)
    o, lse = ring_attention_forward(q[0], k[0], v[0], LocalRing(1).ranks[0], causal=True)
    ref_o, ref_lse = R.attention_forward(q[0], k[0], v[0], causal=True)
    assert np.allclose(o, ref_o, atol=1e-12) and np.allclose(lse, ref_lse, atol=1e-12)
    with pytest.raises(TypeError, match="timeline"):
        ring_attention_forward(q[0], k[0], v[0], LocalRing(1).ranks[0], timeline=[])


def test_local_ring_detects_ranks_out_of_step():
    ring = LocalRing(2)
    a, b = np.zeros(4), np.zeros(4)
    ring.ranks[0].exchange([a], [b])
    with pytest.raises(RuntimeError, match="out of step"):
        ring.ranks[0].exchange([a], [b])
    ring = LocalRing(2)
    ring.ranks[0].exchange([a], [b])
    with pytest.raises(RuntimeError, match="does not match"):
        ring.ranks[1].exchange([np.zeros(3)], [np.zeros(3)])

    def gen(k):
        for _ in range(k):
            ring2.ranks[0 if k == 1 else 1].exchange([np.zeros(1)], [np.zeros(1)])
            yield

    ring2 = LocalRing(2)
    with pytest.raises(RuntimeError, match="out of step"):
        ring2.drive([gen(1), gen(2)])


def test_exchange_checks_buffers():
    ring = LocalRing(2)
    with pytest.raises(ValueError, match="1 sends but 2 receives"):
        ring.ranks[0].exchange([np.zeros(2)], [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match="not contiguous"):
        ring.ranks[0].exchange([np.zeros((4, 4))[:, :2]], [np.zeros((4, 2))])


def test_nccl_ring_without_nccl_says_so():
    from cupy_fmha.parallel import NcclRing, nccl_available

    if nccl_available():
        pytest.skip("NCCL is available here")
    with pytest.raises(RuntimeError, match="NCCL is not available"):
        NcclRing(1, 0, b"x")
    with pytest.raises(ValueError, match="rank"):
        NcclRing(2, 2, b"x")
    assert LY.chunks_per_rank("zigzag") == 2


def test_ring_device_is_an_int():
    """device=True / 0.5 / "0" went through int() (GPU 1, GPU 0, GPU 0) or into CUDA; -1 into
    CUDA. They are refused, naming device, before CUDA or NCCL is touched."""
    from cupy_fmha.parallel import NcclRing

    for bad in (True, 0.5, "0"):
        with pytest.raises(TypeError, match="device: expected a CUDA device id"):
            LocalRing(2, device=bad)
        with pytest.raises(TypeError, match="device: expected a CUDA device id"):
            NcclRing(1, 0, b"x", device=bad)
    with pytest.raises(ValueError, match="device: expected a CUDA device id \\(int\\) >= 0, got -1"):
        LocalRing(2, device=-1)


def test_cupy_ops_hand_the_api_each_calls_arguments(monkeypatch):
    """The GPU path's CupyOps, with NumPy standing in for CuPy and the API's two functions
    replaced by the reference maths: the ring's results must not change, so CupyOps passes each
    call's mask, scale and layout, and the backward the global o and lse (and deterministic, and
    each call's rows of dlse)."""
    import dataclasses

    from cupy_fmha import api
    from cupy_fmha.mask import MaskSpec
    from cupy_fmha.parallel import ring as RG
    from cupy_fmha.parallel.ops import CupyOps

    seen = []

    def fake_forward(q, k, v, *, mask, softmax_scale, layout):
        seen.append(("fwd", type(mask), layout))
        return R.attention_forward(q, k, v, mask=mask, softmax_scale=softmax_scale, layout=layout)

    def fake_backward(do, q, k, v, o, lse, *, mask, softmax_scale, layout, deterministic, dlse=None):
        seen.append(("bwd", type(mask), layout, deterministic, None if dlse is None else dlse.shape == lse.shape))
        return partial_backward(do, q, k, v, o, lse, mask=mask, softmax_scale=softmax_scale, layout=layout,
                                dlse=dlse)

    monkeypatch.setattr(api, "attention_forward", fake_forward)
    monkeypatch.setattr(api, "attention_backward", fake_backward)

    class HostCupyOps(CupyOps):
        def __init__(self):
            self.xp = np

        def current_stream(self):
            return None

        def record(self, stream):
            return None

        def wait(self, stream, event):
            pass

    n, layout, kw = 3, "bhsd", {"causal": True, "window_size": (7, -1)}
    rng = np.random.default_rng(4)
    q, k, v, do = _problem(rng, layout, 1, 18, 4, 2, 8, 8)
    sh = lambda x: [shard(x, r, n, axis=2) for r in range(n)]  # noqa: E731
    qs, ks, vs, dos = sh(q), sh(k), sh(v), sh(do)
    dlse = rng.standard_normal((1, 4, 18)).astype(np.float32)
    dlses = sh(dlse)
    ring = LocalRing(n)
    ops = HostCupyOps()
    st = [dataclasses.replace(RG._check_forward(qs[r], ks[r], vs[r], ring.ranks[r], layout=layout, **kw), ops=ops)
          for r in range(n)]
    fw = ring.drive([RG._forward_steps(st[r], qs[r], ks[r], vs[r], ring.ranks[r], None) for r in range(n)])
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    assert lses[0].dtype == np.float32
    st = [dataclasses.replace(RG._check_backward(dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r],
                                                 layout=layout, deterministic=True, dlse=dlses[r], **kw), ops=ops)
          for r in range(n)]
    bw = ring.drive([RG._backward_steps(st[r], dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r], None,
                                        dlses[r]) for r in range(n)])
    assert {s[1] for s in seen} == {MaskSpec} and {s[2] for s in seen} == {layout}
    assert all(s[3] is True for s in seen if s[0] == "bwd")
    assert all(s[4] is True for s in seen if s[0] == "bwd")  # each call got its rows of dlse
    ref_o, _ = R.attention_forward(q, k, v, layout=layout, **kw)
    ref_g = R.attention_backward(do, q, k, v, layout=layout, dlse=dlse, **kw)
    assert np.abs(unshard(os_, axis=2) - ref_o).max() < 1e-5
    for i in range(3):
        assert np.abs(unshard([g[i] for g in bw], axis=2) - ref_g[i]).max() < 1e-5


class _RoundingOps(NumpyOps):
    """The NumPy model with the GPU path's precision: each step's partial results rounded to the
    inputs' dtype (as the kernels return them), accumulation and lse in float32."""

    acc_dtype = np.dtype(np.float32)
    lse_dtype = np.dtype(np.float32)

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def forward(self, *args):
        o, lse = super().forward(*args)
        return o.astype(self.dtype), lse.astype(np.float32)

    def backward(self, *args, **kw):
        return tuple(g.astype(self.dtype) for g in super().backward(*args, **kw))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n, kw", [(4, {"causal": True}), (3, {"window_size": (70, 20)})])
def test_ring_rounding_passes_the_project_rule(dtype, n, kw):
    """The precision the GPU ring adds to the kernels' own (partials stored in fp16/bf16 before the
    float32 sums) stays within the rule the GPU tests apply (cupy_fmha.verify.compare: within
    twice the error of a plain same-precision implementation)."""
    import dataclasses

    from cupy_fmha.parallel import ring as RG
    from cupy_fmha.validate import _BF16
    from cupy_fmha.verify import compare

    dt = _BF16 if dtype == "bfloat16" else np.dtype(np.float16)
    rng = np.random.default_rng(n)
    s, d = 100 * n, 64
    q = (1.5 * rng.standard_normal((1, s, 4, d))).astype(np.float32).astype(dt)
    k, v = (rng.standard_normal((1, s, 2, d)).astype(np.float32).astype(dt) for _ in range(2))
    do = rng.standard_normal((1, s, 4, d)).astype(np.float32).astype(dt)
    sh = lambda x: [shard(x, r, n) for r in range(n)]  # noqa: E731
    qs, ks, vs, dos = sh(q), sh(k), sh(v), sh(do)
    ring, ops = LocalRing(n), _RoundingOps(dt)
    st = [dataclasses.replace(RG._check_forward(qs[r], ks[r], vs[r], ring.ranks[r], **kw), ops=ops) for r in range(n)]
    fw = ring.drive([RG._forward_steps(st[r], qs[r], ks[r], vs[r], ring.ranks[r], None) for r in range(n)])
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    st = [dataclasses.replace(RG._check_backward(dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r], **kw),
                              ops=ops) for r in range(n)]
    bw = ring.drive([RG._backward_steps(st[r], dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r], None)
                     for r in range(n)])
    got = [unshard(os_)] + [unshard([g[i] for g in bw]) for i in range(3)]
    ref_o, _ = R.attention_forward(q, k, v, **kw)
    low_o, _ = R.attention_forward(q, k, v, precision="low", **kw)
    ref_g = R.attention_backward(do, q, k, v, **kw)
    low_g = R.attention_backward(do, q, k, v, precision="low", **kw)
    for name, x, ref, low in zip(("o", "dq", "dk", "dv"), got, (ref_o, *ref_g), (low_o, *low_g)):
        c = compare(name, x.astype(np.float64), ref, low, dtype=dt, hdim_q=d, hdim_v=d)
        assert c.ok, str(c)
