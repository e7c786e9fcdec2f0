"""cupy_fmha.footprint: the reference's host memory (measured with tracemalloc: the estimate must
bound the real peak from above, within 2x), and the plain byte counts."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cupy_fmha import reference as R
from cupy_fmha.footprint import (
    Sizes,
    device_bytes,
    format_bytes,
    input_bytes,
    output_bytes,
    reference_host_bytes,
)


def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _measure(mode, precision, s: Sizes, *, layout="bshd", bias_shape=None, alibi=False,
             p=0.0, dbias=False, keep=False):
    rng = np.random.default_rng(0)
    f16 = np.float16

    def draw(*shape):
        return rng.standard_normal(shape).astype(f16)

    kw = {}
    if s.varlen:
        tq, tk = sum(s.seqlens_q), sum(s.seqlens_k)
        q, k, v, do = (draw(tq, s.nhead_q, s.hdim_q), draw(tk, s.nhead_k, s.hdim_q),
                       draw(tk, s.nhead_k, s.hdim_v), draw(tq, s.nhead_q, s.hdim_v))
        kw.update(layout="thd", cu_seqlens_q=_cu(s.seqlens_q), cu_seqlens_k=_cu(s.seqlens_k))
    else:
        def shp(n, h, d):
            return (s.batch, n, h, d) if layout == "bshd" else (s.batch, h, n, d)

        q, k, v, do = (draw(*shp(s.seqlen_q, s.nhead_q, s.hdim_q)),
                       draw(*shp(s.seqlen_k, s.nhead_k, s.hdim_q)),
                       draw(*shp(s.seqlen_k, s.nhead_k, s.hdim_v)),
                       draw(*shp(s.seqlen_q, s.nhead_q, s.hdim_v)))
        kw["layout"] = layout
    if bias_shape is not None:
        kw["bias"] = draw(*bias_shape)
    if alibi:
        kw["alibi_slopes"] = np.full((s.nhead_q,), 0.5, np.float32)
    if p:
        kw.update(dropout_p=p, seed=1, offset=2)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    if mode == "fwd":
        R.attention_forward(q, k, v, precision=precision, return_dropout_mask=keep, **kw)
    else:
        R.attention_backward(do, q, k, v, precision=precision, return_dbias=dbias, **kw)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


CASES = [
    # (sizes, features): score-dominated, head-dim dominated, GQA, long keys, group mode
    (Sizes(1, 4, 4, 384, 384, 64, 64), {}),
    (Sizes(2, 4, 2, 256, 320, 128, 64), {"p": 0.2}),
    (Sizes(2, 2, 1, 512, 96, 256, 256), {"alibi": True}),
    (Sizes(3, 8, 8, 48, 48, 256, 256), {"layout": "bhsd"}),
    (Sizes(2, 2, 2, 64, 1200, 32, 32), {"bias_shape": (2, 2, 64, 1200)}),
    (Sizes(1, 1, 1, 1024, 1024, 8, 8), {"bias_shape": (1, 1, 1024, 1024), "dbias": True}),
    (Sizes.group([100, 0, 500, 200], [60, 400, 500, 0], 4, 2, 64, 64), {}),
    (Sizes.group([600, 30], [500, 700], 2, 2, 128, 128), {"p": 0.3}),
]


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("precision", ["low", "float64"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_reference_estimate_bounds_the_measured_peak(mode, precision, case):
    s, feats = CASES[case]
    feats = dict(feats)
    if mode == "fwd" and feats.pop("dbias", False):
        feats["keep"] = True  # the forward's counterpart: the returned keep masks
    measured = _measure(mode, precision, s, **feats)
    est = reference_host_bytes(
        s, mode, precision=precision, itemsize=2, bias_shape=feats.get("bias_shape"),
        alibi=feats.get("alibi", False), dropout=bool(feats.get("p")),
        return_dropout_mask=feats.get("keep", False), return_dbias=feats.get("dbias", False),
    )
    assert measured <= est <= 2 * measured, (measured, est, est / measured)


def test_sizes_and_counts():
    s = Sizes(2, 8, 2, 100, 300, 64, 32)
    assert (s.q, s.k, s.v, s.o, s.lse) == (2 * 100 * 8 * 64, 2 * 300 * 2 * 64, 2 * 300 * 2 * 32,
                                          2 * 100 * 8 * 32, 2 * 8 * 100)
    assert input_bytes(s, "fwd") == 2 * (s.q + s.k + s.v)
    assert input_bytes(s, "bwd", bias_shape=(1, 8, 100, 300), bias_itemsize=4) == (
        2 * (s.q + s.k + s.v + s.o) + 4 * 8 * 100 * 300)
    assert output_bytes(s, "fwd") == 8 * (s.o + s.lse)
    assert output_bytes(s, "bwd", 2, bias_shape=(1, 1, 100, 300), return_dbias=True) == 2 * (
        s.q + s.k + s.v + 100 * 300)
    g = Sizes.group([3, 0, 5], [4, 4, 1], 2, 1, 8, 16)
    assert (g.batch, g.seqlen_q, g.seqlen_k, g.rows_q, g.rows_k) == (3, 5, 4, 8, 9)
    assert g.q == 8 * 2 * 8 and g.lse == 3 * 2 * 5
    with pytest.raises(ValueError, match="seqlens_k"):
        Sizes.group([1, 2], [1], 1, 1, 8, 8)
    with pytest.raises(ValueError, match="mode"):
        input_bytes(s, "both")


def test_device_bytes():
    s = Sizes(1, 2, 1, 4, 6, 8, 8)
    fwd = (s.q + s.k + s.v + s.o) * 2 + 4 * s.lse
    assert device_bytes(s, "fwd") == fwd
    bwd = fwd + (s.o + s.q + s.k + s.v) * 2 + 4 * s.lse
    assert device_bytes(s, "bwd") == bwd
    assert device_bytes(s, "bwd", workspace_bytes=1000) == bwd + 1000
    assert device_bytes(s, "bwd", bias_shape=(1, 2, 4, 6), return_dbias=True) == (
        bwd + 2 * 48 + 4 * 48)
    assert device_bytes(s, "fwd", alibi_shape=(2,)) == fwd + 8


def test_huge_sizes_stay_exact_python_ints():
    s = Sizes(65535, 65535, 1, (1 << 30) - (1 << 16), (1 << 30) - (1 << 16), 256, 256)
    n = reference_host_bytes(s, "bwd", precision="float64")
    assert isinstance(n, int) and n > 2**80


def test_format_bytes():
    assert format_bytes(16 * 2**30) == "16.0 GiB"
    assert format_bytes(3 * 2**20 // 2) == "1.5 MiB"


def test_sizes_are_non_negative_ints():
    """A negative size gave a negative estimate, which passes any memory limit; floats gave float bytes."""
    from cupy_fmha.footprint import Sizes

    with pytest.raises(ValueError, match="batch: expected an int >= 0, got -2"):
        Sizes(-2, 16, 16, 1024, 1024, 128, 128)
    with pytest.raises(TypeError, match="hdim_q: expected an int, got 2.5"):
        Sizes(2, 16, 16, 1024, 1024, 2.5, 128)
    with pytest.raises(ValueError, match=r"seqlens_q\[1\]: expected an int >= 0, got -3"):
        Sizes.group([5, -3], [5, 3], 2, 2, 64, 64)
    assert type(Sizes(np.int64(2), 16, 16, 1024, 1024, 128, 128).batch) is int
