"""cupy_fmha.parallel's pure parts on the CPU: how tokens are sharded (layout), which attention
calls each rank makes per ring step (plan: every visible global pair computed exactly once,
zigzag causal balanced) and the log-sum-exp merge of partial results against a one-shot
softmax.
"""

from __future__ import annotations

import numpy as np
import pytest

from cupy_fmha.mask import MaskSpec, Window, dense_mask, resolve_mask
from cupy_fmha.parallel import (
    global_window,
    merge_into,
    merge_partials,
    plan_rank,
    plan_ring,
    rank_chunks,
    shard,
    shard_positions,
    unshard,
)
from cupy_fmha.parallel.plan import EMPTY, INVALID, region_window

MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window5,0": {"window_size": (5, 0)},
    "window3,7": {"window_size": (3, 7)},
    "causal-left9": {"causal": True, "window_size": (9, -1)},
    "t:2,1": {"mask": "t:2,1"},
    "g:-2,9": {"mask": "g:-2,9"},  # a generic window off the diagonal (rows see keys ahead of them)
}


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_zigzag_chunks(n):
    held = sorted(j for r in range(n) for j in rank_chunks(r, n, "zigzag"))
    assert held == list(range(2 * n))
    assert [rank_chunks(r, n, "zigzag") for r in range(n)] == [(r, 2 * n - 1 - r) for r in range(n)]
    assert [rank_chunks(r, n, "contiguous") for r in range(n)] == [(r,) for r in range(n)]


@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
@pytest.mark.parametrize("axis", [1, 2])
def test_shard_unshard_roundtrip(scheme, axis):
    n = 3
    x = np.arange(2 * 6 * n * 4 * 2).reshape(2, 6 * n, 4, 2) if axis == 1 else np.arange(2 * 4 * 6 * n * 2).reshape(2, 4, 6 * n, 2)
    shards = [shard(x, r, n, scheme=scheme, axis=axis) for r in range(n)]
    assert all(s.shape[axis] == x.shape[axis] // n for s in shards)
    assert np.array_equal(unshard(shards, scheme=scheme, axis=axis), x)
    seq = x.shape[axis]
    for r in range(n):  # positions say which global tokens a shard holds
        pos = shard_positions(r, n, seq, scheme)
        assert np.array_equal(shards[r], np.take(x, pos, axis=axis))


def test_layout_errors():
    with pytest.raises(ValueError, match="scheme"):
        rank_chunks(0, 2, "ring")
    with pytest.raises(ValueError, match="rank"):
        rank_chunks(2, 2)
    with pytest.raises(ValueError, match="world_size"):
        rank_chunks(0, 0)
    with pytest.raises(ValueError, match="x: the sequence length 10 must be a positive multiple of 4"):
        shard(np.zeros((1, 10, 1, 8)), 0, 2)
    with pytest.raises(ValueError, match="shards"):
        unshard([np.zeros((1, 4, 1, 8)), np.zeros((1, 6, 1, 8))])
    with pytest.raises(ValueError, match="shards"):
        unshard([])


# --------------------------------------------------------------------------- plan


def _coverage(n, seqlen, window, scheme):
    """How many times each global (query, key) pair is computed by the plan, and the check that
    every call's recorded counts and masks are right."""
    count = np.zeros((seqlen, seqlen), dtype=np.int64)
    for p in plan_ring(n, seqlen, window, scheme):
        for step in p.steps:
            assert step.source == (p.rank - step.index) % n
            pq = shard_positions(p.rank, n, seqlen, scheme)
            pk = shard_positions(step.source, n, seqlen, scheme)
            for c in step.calls:
                local = dense_mask(c.window, c.q1 - c.q0, c.k1 - c.k0)
                assert local.any(), "a call with nothing visible"
                assert c.visible == int(local.sum())
                count[np.ix_(pq[c.q0:c.q1], pk[c.k0:c.k1])] += local
    return count


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("c", [1, 3, 5])
def test_plan_covers_every_visible_pair_once(n, scheme, mask, c):
    seqlen = c * n * (2 if scheme == "zigzag" else 1)
    kw = MASKS[mask]
    spec = resolve_mask(kw.get("mask"), kw.get("causal", False), kw.get("window_size", (-1, -1)))
    window = global_window(spec, seqlen)
    count = _coverage(n, seqlen, window, scheme)
    assert np.array_equal(count, dense_mask(window, seqlen, seqlen).astype(np.int64))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("c", [1, 4, 200])
def test_zigzag_causal_is_balanced_one_call_per_step(n, c):
    seqlen = 2 * n * c
    window = global_window(resolve_mask(causal=True), seqlen)
    plans = plan_ring(n, seqlen, window, "zigzag")
    for p in plans:
        assert all(len(s.calls) == 1 for s in p.steps)
        own = p.steps[0].calls[0]
        assert (own.q0, own.q1, own.k0, own.k1) == (0, 2 * c, 0, 2 * c) and own.window.x == 1  # causal
        assert own.visible == 2 * c * c + c
        for s in p.steps[1:]:
            assert s.calls[0].window is None and s.visible == 2 * c * c  # unmasked, half the area
    # every rank does the same work at every step
    assert len({tuple(s.visible for s in p.steps) for p in plans}) == 1


def test_contiguous_causal_is_unbalanced():
    n, c = 4, 8
    window = global_window(resolve_mask(causal=True), n * c)
    work = [p.visible for p in plan_ring(n, n * c, window, "contiguous")]
    assert work == sorted(work) and work[0] < work[-1]


def test_region_window_cases():
    causal = Window(1 << 20, 1)
    assert region_window([(0, 4)], [(0, 4)], None) is None
    assert region_window([(4, 4)], [(0, 4)], causal) is None  # below the diagonal: all visible
    assert region_window([(0, 4)], [(4, 4)], causal) == EMPTY
    assert region_window([(0, 4)], [(0, 4)], causal) == Window(4, 1)
    # zigzag own step of rank 0 of 2 (chunks 0 and 3 of 4): causal over the whole shard
    assert region_window([(0, 4), (12, 4)], [(0, 4), (12, 4)], causal) == Window(8, 1)
    # queries of chunks 0 and 3 against keys of chunks 1 and 2: rows of chunk 0 see nothing,
    # rows of chunk 3 see everything: no single window
    assert region_window([(0, 4), (12, 4)], [(4, 4), (8, 4)], causal) == INVALID


def test_plan_errors():
    with pytest.raises(ValueError, match="seqlen"):
        plan_rank(0, 2, 10, None, "zigzag")
    with pytest.raises(ValueError, match="scheme"):
        plan_rank(0, 2, 8, None, "spiral")


# --------------------------------------------------------------------------- merge maths


def _softmax_parts(q, k, v, visible, bounds, scale):
    """(o_i, lse_i) of each key block [a, b) (dense NumPy, [b, h, s, d] layout)."""
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    s = np.where(visible, s, -np.inf)
    parts = []
    for a, b in bounds:
        blk = s[..., a:b]
        m = blk.max(axis=-1, keepdims=True) if b > a else np.full(blk.shape[:-1] + (1,), -np.inf)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(blk - m)
        den = e.sum(axis=-1, keepdims=True)
        lse = np.where(den > 0, m + np.log(np.where(den > 0, den, 1.0)), -np.inf)[..., 0]
        o = np.einsum("bhqk,bhkd->bhqd", e / np.where(den > 0, den, 1.0), v[:, :, a:b])
        parts.append((o, lse))
    return parts


@pytest.mark.parametrize("cuts", [[0, 7], [0, 3, 7], [0, 1, 2, 5, 7], [0, 0, 4, 7]])
def test_merge_partials_equals_one_shot(cuts):
    rng = np.random.default_rng(len(cuts))
    b, h, sq, sk, d = 2, 3, 6, 7, 8
    q, k, v = (rng.standard_normal((b, h, n, d)) for n in (sq, sk, sk))
    visible = dense_mask(MaskSpec("generic", 2, 1), sq, sk)  # rows 0..: a narrow band
    visible[3] = False  # a row that sees nothing at all
    bounds = list(zip(cuts[:-1], cuts[1:]))
    parts = _softmax_parts(q, k, v, visible, bounds, 0.3)
    o, lse = merge_partials(parts, layout="bhsd")
    (ref_o, ref_lse), = _softmax_parts(q, k, v, visible, [(0, sk)], 0.3)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)) and np.isneginf(lse[:, :, 3]).all()
    fin = np.isfinite(ref_lse)
    assert np.allclose(lse[fin], ref_lse[fin], rtol=0, atol=1e-12)
    assert np.allclose(o, ref_o, rtol=0, atol=1e-12) and np.all(o[:, :, 3] == 0)


def test_merge_layouts_agree():
    rng = np.random.default_rng(3)
    parts = [(rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5))) for _ in range(3)]
    o1, l1 = merge_partials(parts, layout="bhsd")
    o2, l2 = merge_partials([(o.transpose(0, 2, 1, 3), lse) for o, lse in parts], layout="bshd")
    assert np.allclose(o1, o2.transpose(0, 2, 1, 3)) and np.allclose(l1, l2)


def test_shard_axis_and_shards_are_checked():
    """An axis outside [-ndim, ndim) is an error (it used to wrap and split another axis), and so
    are a non-array, a non-int axis, and shards of mixed dtypes."""
    x = np.zeros((1, 8, 4, 16))
    assert shard(x, 0, 2, axis=-3).shape == (1, 4, 4, 16)  # negative counts from the end, as NumPy
    for bad in (-5, 4, 7):
        with pytest.raises(ValueError, match=f"axis: {bad} is out of range for x of rank 4"):
            shard(x, 0, 2, axis=bad)
    with pytest.raises(ValueError, match="axis: 7 is out of range for shards"):
        unshard([x[:, :4], x[:, 4:]], axis=7)
    with pytest.raises(TypeError, match="axis: expected an int"):
        shard(x, 0, 2, axis=1.0)
    with pytest.raises(TypeError, match="x: expected a NumPy or CuPy array"):
        shard([[1, 2]], 0, 2)
    with pytest.raises(TypeError, match="shards: rank 1's array .* is not of rank 0's kind"):
        unshard([x[:, :4], x[:, 4:].astype(np.float32)])


def test_unshard_refuses_one_array():
    """unshard(o) with one array (not a list of shards) used to iterate over its batch axis and
    return a silently wrong array of another rank: [2, 8, 4, 4] -> [8, 8, 4]."""
    x = np.random.default_rng(0).standard_normal((2, 8, 4, 4))
    with pytest.raises(TypeError, match=r"shards: expected a list with one array per rank, got ndarray \(one array"):
        unshard(x)
    with pytest.raises(TypeError, match="shards: expected a list with one array per rank, got NoneType"):
        unshard(None)
    assert np.array_equal(unshard(tuple(shard(x, r, 2) for r in range(2))), x)


def test_merge_refuses_mismatched_shapes():
    """merge_partials / merge_into broadcast nothing: an o or lse of another shape is an error."""
    o, lse = np.ones((1, 4, 2, 3)), np.zeros((1, 2, 4))
    with pytest.raises(ValueError, match="o_part: shape .* differs from o_acc's"):
        merge_partials([(o, lse), (np.full((1, 4, 2, 1), 5.0), lse)])
    with pytest.raises(ValueError, match=r"parts\[1\]\[1\]: expected shape \(1, 2, 4\)"):
        merge_partials([(o, lse), (o, np.zeros((1, 2, 1)))])
    with pytest.raises(ValueError, match=r"parts\[0\]\[1\]: expected shape \(1, 4, 2\)"):
        merge_partials([(o, lse)], layout="bhsd")
    with pytest.raises(ValueError, match=r"lse_part: expected shape \(1, 2, 4\)"):
        merge_into(np.zeros_like(o), np.zeros_like(lse), o, np.zeros((1, 2, 1)))
    with pytest.raises(TypeError, match=r"parts\[0\]: expected an \(o, lse\) pair"):
        merge_partials([o])


def test_merge_checks_the_accumulators_before_writing():
    """An int lse_acc used to take the merged lse truncated to an integer, silently; a read-only
    lse_acc failed only after o_acc had been rescaled. merge_partials' entries and dtype used to
    fail inside NumPy (an AttributeError for a non-array)."""
    o_part, lse_part = np.ones((1, 3, 2, 4)), np.zeros((1, 2, 3))
    o_acc, lse_acc = np.full((1, 3, 2, 4), 3.0), np.zeros((1, 2, 3), dtype=np.int64)
    with pytest.raises(TypeError, match="lse_acc: expected a float32 or float64 accumulator, got dtype int64"):
        merge_into(o_acc, lse_acc, o_part, lse_part)
    lse_acc = np.zeros((1, 2, 3))
    lse_acc.flags.writeable = False
    with pytest.raises(ValueError, match="lse_acc: the accumulator is read-only"):
        merge_into(o_acc, lse_acc, o_part, lse_part)
    assert np.all(o_acc == 3.0)  # untouched
    with pytest.raises(TypeError, match="lse_acc: dtype float64 differs from o_acc's float32"):
        merge_into(o_acc.astype(np.float32), np.zeros((1, 2, 3)), o_part, lse_part)
    with pytest.raises(TypeError, match=r"parts\[1\]\[0\]: expected a NumPy or CuPy array, got int"):
        merge_partials([(o_part, lse_part), (1, 2)])
    with pytest.raises(TypeError, match="parts: expected a list of"):
        merge_partials(None)
    for bad in (int, np.float16, "foo"):
        with pytest.raises(TypeError, match="dtype: expected float32 or float64"):
            merge_partials([(o_part, lse_part)], dtype=bad)
    o, lse = merge_partials([(o_part, lse_part), (o_part, lse_part)], dtype=np.float32)
    assert o.dtype == lse.dtype == np.float32 and np.allclose(lse, np.log(2)) and np.allclose(o, 1)


def test_plan_arguments_are_typed():
    with pytest.raises(TypeError, match="window: expected a Window or None"):
        plan_rank(0, 2, 8, (9, 1))
    with pytest.raises(TypeError, match="spec: expected a MaskSpec or None"):
        global_window("t", 8)
    with pytest.raises(TypeError, match="seqlen: expected an int sequence length, got 8.5"):
        plan_rank(0, 2, 8.5, None)
    with pytest.raises(TypeError, match="seqlen: expected an int sequence length"):
        shard_positions(0, 2, "8")


def test_plan_checks_do_not_depend_on_the_cache():
    """plan_rank's checks ran inside its lru_cache: after plan_rank(1, 2, 8, None), a call with
    rank=True or seqlen=8.0 (equal keys) got the cached plan instead of the TypeError; a list
    window or scheme failed with "unhashable type". global_window took seqlen "8" or 8.7 (int())."""
    plan_rank(1, 2, 8, None)
    plan_rank(0, 2, 8, None)
    with pytest.raises(TypeError, match="rank: expected an int, got True"):
        plan_rank(True, 2, 8, None)
    with pytest.raises(TypeError, match="seqlen: expected an int sequence length, got 8.0"):
        plan_rank(0, 2, 8.0, None)
    with pytest.raises(TypeError, match="window: expected a Window or None"):
        plan_rank(0, 2, 8, [3, 1])
    with pytest.raises(ValueError, match="scheme: expected one of"):
        plan_rank(0, 2, 8, None, ["zigzag"])
    with pytest.raises(TypeError, match="window.y: expected an int, got 3.5"):
        plan_rank(0, 2, 8, Window(3.5, 1))
    spec = MaskSpec("top_left", -1, 0)
    for bad in ("8", 8.7):
        with pytest.raises(TypeError, match="seqlen: expected an int sequence length"):
            global_window(spec, bad)
    with pytest.raises(ValueError, match="seqlen: expected an int sequence length >= 1, got 0"):
        global_window(spec, 0)
    assert plan_rank(np.int64(1), np.int32(2), np.int64(8), global_window(spec, 8)) == \
        plan_rank(1, 2, 8, global_window(spec, 8))
