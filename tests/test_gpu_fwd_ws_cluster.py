"""The ws forward in clusters of two CTAs (``CLUSTER=2``, kernels/fmha_fwd_sm90_ws.cu; bench/NOTES.md
step 85): each CTA of a pair loads half of every K and V tile into both CTAs (TMA multicast), and a
stage is refilled only after the MMA warps of both have released it. Under a mask both CTAs walk
the union of their row blocks' key ranges and pass over the blocks outside their own (phantoms).

The arithmetic of a row block is the default build's, so O and LSE must be bit-identical to it at
the same row blocks per CTA, written over poisoned outputs: key counts that end inside a tile (so a
CTA's half of the last tile is partly or wholly past the keys), fewer keys than one tile, query and
key lengths that differ, 1, 2 and 4 row blocks per CTA (PERSIST; the ring runs on across row
blocks in both CTAs in step), every head dim (64: three MMA warpgroups), ALiBi, GQA, both layouts,
causal masks (a phantom at the end of the lower row block's range), a sliding window (phantoms at
both ends), bottom-right causal over fewer keys (row blocks without keys beside ones with: all
phantoms) and a top-left window (keys again after rows without). One case also goes against the
NumPy reference. Where the pairs could not stay in step (group mode, a bias ring, dropout, an odd
number of row blocks or of CTAs) the plan keeps the build without clusters (``backends.cuda.fwd_ws_cluster``; its CPU tests are in test_fwd_ws_cluster_cpu.py)."""

from __future__ import annotations

import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

import conftest
from conftest import seed_for
from cupy_fmha import plan as P

pytestmark = pytest.mark.gpu


def _fwd_kw(over):
    """attention_forward's keyword defaults (what plan_forward receives) with ``over`` applied."""
    import inspect

    import cupy_fmha

    kw = {n: p.default for n, p in inspect.signature(cupy_fmha.attention_forward).parameters.items()
          if p.default is not inspect.Parameter.empty and n not in ("bias", "alibi_slopes", "out")}
    kw.update(over)
    return kw


def _inputs(key, b, sq, sk, hq, hk, d, layout="bshd", dtype=None):
    rng = cp.random.default_rng(seed_for("fwd-ws-cluster", *key))
    dtype = dtype or cp.float16
    shape = (lambda s, h: (b, s, h, d)) if layout == "bshd" else (lambda s, h: (b, h, s, d))
    q = (1.5 * rng.standard_normal(shape(sq, hq), dtype=cp.float32)).astype(dtype)
    k, v = (rng.standard_normal(shape(sk, hk), dtype=cp.float32).astype(dtype) for _ in range(2))
    return q, k, v


def _pair(monkeypatch, q, k, v, persist, kw):
    """O and LSE of the default build at PERSIST=``persist``, then of CLUSTER=2 into poisoned outputs;
    the second call's instance."""
    import cupy_fmha

    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist}")
    o0, lse0 = cupy_fmha.attention_forward(q, k, v, **kw)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist},CLUSTER=2")
    o = conftest.nan_like(o0.shape, o0.dtype)
    lse = conftest.nan_like(lse0.shape, lse0.dtype)
    cupy_fmha.attention_forward(q, k, v, **kw, out=(o, lse))
    spec = P.plan_forward(q, k, v, cc=lambda: 90, **_fwd_kw(kw)).spec
    return o0, lse0, o, lse, spec


# b, seqlen_q, seqlen_k, heads q / k, keywords (128-row blocks, 192 at hdim 64: 1000 rows are 8 / 6
# row blocks, 2000 rows 16 / 11, 250 rows 2 / 2); a case whose row blocks or CTAs along x are odd skips
SHAPES = {
    "plain": (2, 1000, 1000, 3, 3, dict()),
    "keys end inside a tile": (1, 1000, 1500, 2, 2, dict()),
    "fewer keys than a tile": (2, 250, 37, 2, 2, dict()),
    "long": (1, 2000, 2000, 2, 2, dict()),
    "gqa": (1, 1000, 700, 4, 2, dict()),
    "alibi": (2, 1000, 1000, 2, 2, dict(alibi=True)),
    "bhsd": (1, 1000, 1000, 2, 2, dict(layout="bhsd")),
    "causal": (2, 1000, 1000, 2, 2, dict(causal=True)),
    "causal keys end inside a tile": (1, 1000, 1000, 2, 2, dict(causal=True, alibi=True)),
    "window": (1, 1000, 1200, 2, 2, dict(window_size=(200, 50))),
    "no keys": (2, 1000, 300, 2, 2, dict(causal=True)),  # (bottom-right: rows 0-699 see no key)
    "top-left window": (2, 1000, 300, 2, 2, dict(mask="t:100,0")),  # (rows from 400 see none)
    # a row block without keys after its peer's (its empty range [a, a) lies past the peer's end: 80- and
    # 112-key blocks at hdim 256 / 192, rows 384-511 see none while 256-383 see key block 1)
    "top-left window, short keys": (1, 1024, 160, 2, 2, dict(mask="t:100,0")),
    # past FWD_WS_SHORT_SEQLEN, so hdim 64 takes three MMA warpgroups (192-row blocks: 14) under the mask
    "causal long": (1, 2600, 2600, 2, 2, dict(causal=True)),
}


@pytest.mark.parametrize("persist", [0, 2, 3, 4])  # (3: two row blocks per CTA at hdim 64)
@pytest.mark.parametrize("d", [64, 128, 192, 256])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_cluster_bit_identical(monkeypatch, shape, d, persist):
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    b, sq, sk, hq, hk, extra = SHAPES[shape]
    kw = dict(extra)
    layout = kw.get("layout", "bshd")
    q, k, v = _inputs((shape, d, persist), b, sq, sk, hq, hk, d, layout)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = cp.asarray([0.5 ** (i + 1) for i in range(hq)], dtype=cp.float32)
    o0, lse0, o, lse, spec = _pair(monkeypatch, q, k, v, persist, kw)
    nqb = -(-sq // spec.macro("BLOCK_M"))
    grid_x = -(-nqb // persist) if persist else nqb
    if nqb % 2 or grid_x % 2:
        assert spec.macro("CLUSTER", 1) == 1, spec.name
        pytest.skip(f"{nqb} row blocks in {grid_x} CTAs along x: no pairs (the plan keeps the build without)")
    assert spec.macro("CLUSTER") == 2, spec.name
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())
    # (every element written: O finite, LSE finite or -inf for rows that see no key; the default's too)
    assert bool(cp.isfinite(o.astype(cp.float32)).all()) and not bool(cp.isnan(lse).any())


def test_cluster_matches_reference(monkeypatch):
    """One clustered case against the float64 NumPy reference (bf16, hdim 128, keys ending inside a
    tile), besides the bit-identity to the default build."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    import numpy as np

    import cupy_fmha
    from cupy_fmha import reference as R

    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "CLUSTER=2")
    rng = np.random.default_rng(seed_for("fwd-ws-cluster-ref"))
    b, sq, sk, h, d = 2, 1000, 900, 2, 128
    qh = (1.5 * rng.standard_normal((b, sq, h, d))).astype(np.float16)
    kh, vh = (rng.standard_normal((b, sk, h, d)).astype(np.float16) for _ in range(2))
    q, k, v = (cp.asarray(x) for x in (qh, kh, vh))
    assert P.plan_forward(q, k, v, cc=lambda: 90, **_fwd_kw({})).spec.macro("CLUSTER") == 2
    o = conftest.nan_like((b, sq, h, d), cp.float16)
    lse = conftest.nan_like((b, h, sq), cp.float32)
    cupy_fmha.attention_forward(q, k, v, out=(o, lse))
    ro, rlse = R.attention_forward(qh.astype(np.float64), kh.astype(np.float64), vh.astype(np.float64))
    assert float(np.abs(cp.asnumpy(o).astype(np.float64) - ro).max()) < 4e-3
    assert float(np.abs(cp.asnumpy(lse) - rlse).max()) < 1e-3


@pytest.mark.parametrize("case", ["odd row blocks", "group mode", "bias", "dropout"])
def test_cluster_not_taken(monkeypatch, case):
    """Where the pair could not walk the same key blocks, CLUSTER=2 is not taken, and the result is
    the default build's."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    import cupy_fmha

    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "CLUSTER=2")
    sq = 300 if case == "odd row blocks" else 1000  # (3 row blocks of 128)
    q, k, v = _inputs((case,), 2, sq, sq, 2, 2, 128)
    kw = {"dropout": dict(dropout_p=0.1, seed=3)}.get(case, {})
    if case == "bias":
        kw["bias"] = cp.asarray(cp.random.default_rng(1).standard_normal((2, 2, sq, sq), dtype=cp.float32)).astype(cp.float16)
    if case == "group mode":
        cu = cp.asarray([0, 1000, 2000], dtype=cp.int32)
        q, k, v = (x.reshape(2000, 2, 128) for x in (q, k, v))
        kw = dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1000, max_seqlen_k=1000)
    spec = P.plan_forward(q, k, v, cc=lambda: 90, **_fwd_kw(kw)).spec
    assert spec.macro("CLUSTER", 1) == 1, spec.name
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES")
    o0, lse0 = cupy_fmha.attention_forward(q, k, v, **kw)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all()) and bool((lse == lse0).all())
