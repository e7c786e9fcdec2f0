"""When the ws forward runs in clusters of two CTAs (CLUSTER=2, backends.cuda.fwd_ws_cluster; bench/NOTES.md
step 85), on the CPU: the plan's choice, the tensor maps' boxes (each CTA loads half of a K / V
tile) and the launcher's refusal of grids the pairs could not share. The kernel's bit-identity to
the default build is in test_gpu_fwd_ws_cluster.py."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import launch as L
from cupy_fmha import plan as P
from cupy_fmha.backends import cuda


def _kw(**over):
    kw = {n: p.default for n, p in inspect.signature(cupy_fmha.attention_forward).parameters.items()
          if p.default is not inspect.Parameter.empty and n not in ("bias", "alibi_slopes", "out")}
    kw.update(over)
    return kw


def _plan(b=2, s=1000, h=2, d=128, bias=None, **over):
    q = np.zeros((b, s, h, d), np.float16)
    return P.plan_forward(q, q, q, cc=lambda: 90, bias=bias, **_kw(**over))


@pytest.fixture
def asked(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "CLUSTER=2")


def test_not_by_default(monkeypatch):
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    for d in (64, 128, 256):
        want = 2 if d in cuda.FWD_WS_CLUSTER_HDIMS else 1
        assert _plan(d=d).spec.macro("CLUSTER", 1) == want


@pytest.mark.parametrize("d", [64, 128, 192, 256])
def test_taken_without_a_mask(asked, d):
    plan = _plan(d=d)
    spec = plan.spec
    assert spec.source == "fmha_fwd_sm90_ws" and spec.macro("CLUSTER") == 2, spec.name
    # the same build otherwise: every other macro of the plain instance
    plain = cuda.fwd_spec("fp16", d, d, 90)
    assert dict(spec.macros) == {**dict(plain.macros), "CLUSTER": 2}
    assert spec.macro("SMEM_BYTES") == plain.macro("SMEM_BYTES")
    # K and V maps in boxes of half a tile, Q's whole
    boxes = dict(zip(("q", "k", "v"), plan.maps))
    assert boxes["k"][5] == boxes["v"][5] == spec.macro("BLOCK_N") // 2
    assert boxes["q"][5] == spec.macro("BLOCK_M")
    assert plan.launch.grid[0] % 2 == 0


@pytest.mark.parametrize("over", [dict(causal=True), dict(window_size=(100, 100)), dict(mask="t:100,0")])
def test_taken_with_a_mask(asked, over):
    """(the pair walks the union of its key ranges)"""
    spec = _plan(**over).spec
    assert spec.macro("CLUSTER") == 2, spec.name


def test_not_taken_with_dropout(asked):
    spec = _plan(dropout_p=0.1).spec
    assert spec.macro("DROPOUT") == 1 and spec.macro("CLUSTER", 1) == 1, spec.name


def test_not_taken_with_a_bias_ring(asked):
    bias = np.zeros((2, 2, 1000, 1000), np.float16)
    spec = _plan(bias=bias).spec
    assert spec.macro("BIAS") == 1 and spec.macro("CLUSTER", 1) == 1, spec.name


def test_not_taken_in_group_mode(asked):
    q = np.zeros((2000, 2, 128), np.float16)
    cu = np.asarray([0, 1000, 2000], np.int32)
    spec = P.plan_forward(q, q, q, cc=lambda: 90, **_kw(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                         max_seqlen_q=1000, max_seqlen_k=1000)).spec
    assert spec.macro("CLUSTER", 1) == 1, spec.name


@pytest.mark.parametrize("s, persist, taken", [(300, 0, False),   # 3 row blocks
                                               (1000, 0, True),   # 8
                                               (1000, 3, False),  # 3 CTAs along x
                                               (1000, 4, True),   # 2
                                               (2048, 8, True),   # 2
                                               (1280, 4, False)])  # 10 row blocks in 3 CTAs
def test_even_row_blocks_and_ctas(monkeypatch, s, persist, taken):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"CLUSTER=2,PERSIST={persist}")
    plan = _plan(s=s)
    assert (plan.spec.macro("CLUSTER", 1) == 2) == taken, plan.spec.name


def test_launcher_refuses_odd_grids(monkeypatch):
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    spec = cuda.fwd_ws_cluster(cuda.fwd_spec("fp16", 128, 128, 90), 2, 2, 1000, False)
    assert spec.macro("CLUSTER", 1) == 1  # (not asked for: the table is empty)
    clustered = cuda._mk(spec.source, spec.dtype, spec.target, **dict(spec.macros), CLUSTER=2, PERSIST=0)
    with pytest.raises(ValueError, match="even number of row blocks"):
        L.fwd_launch(clustered, 2, 2, 300)
    assert L.fwd_launch(clustered, 2, 2, 1000).grid == (8, 2, 2)


def test_cluster_one_asks_for_none(monkeypatch):
    monkeypatch.setattr(cuda, "FWD_WS_CLUSTER_HDIMS", (128,))
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    P._fwd_cluster.cache_clear()
    P._KERNELS.clear()  # (plans are memoized per input signature and tuning variables, not the table)
    assert _plan().spec.macro("CLUSTER") == 2
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "CLUSTER=1")
    assert _plan().spec.macro("CLUSTER", 1) == 1
    # (a name without CLUSTER1: fwd_ws_tiles never carries it)
    assert "CLUSTER" not in cuda.fwd_spec("fp16", 128, 128, 90).name
    P._fwd_cluster.cache_clear()
    P._KERNELS.clear()
