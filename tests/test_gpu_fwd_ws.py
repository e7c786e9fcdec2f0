"""The warp-specialized Hopper forward (kernels/fmha_fwd_sm90_ws.cu; the default when both head dims
round up to the same of 64/128/192/256, CUPY_FMHA_FWD_WS=1 takes it wherever it applies) against
the NumPy reference:
the forward cases of
the main GPU suites (batch mode: masks, GQA, both layouts, lengths that are not multiples of any
tile; strided inputs; group mode with empty sequences; ALiBi; Inf in a neighbouring sequence)
rerun with the switch on, plus a check that the switch really selects the kernel. The backward
runs as usual (it reads this forward's O and LSE). Configurations it does not take (a bias with dropout,
a bias broadcast along the keys, a bias at head dims above 128, devices before sm_90) run the usual kernels
under the switch too; its bias build has its own file, test_gpu_fwd_ws_bias.py.

The pipeline variants (SWIZZLE, PV_OVERLAP, PINGPONG: backends/cuda.py FWD_WS_VARIANTS) are
chosen by CUPY_FMHA_FWD_WS_TILES for the whole run (bench/probe/fwd2_gpu.sh runs this file once per
variant); test_switch_selects_the_ws_kernel checks the instance carries them. EXTRA adds what the
variants' tile handling needs beyond the shared cases: head dims 56 and 120 (padded to 64 / 128:
the columns past the head dim come from TMA's zero fill), lengths one past a 128 block, many key
blocks through the two-stage ring, group-mode sequences whose keys end inside a block with
more blocks before it, and a negative softmax_scale with masks."""

from __future__ import annotations

import os

import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

import test_gpu_attention as A
import test_gpu_varlen as V
import conftest
from conftest import BF16, F16, Packed, check_group, run, seed_for
from cupy_fmha.backends import cuda

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _ws_on(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "1")


def test_switch_selects_the_ws_kernel():
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    assert cuda.fwd_spec("bf16", 128, 128, 90).source == "fmha_fwd_sm90_ws"
    assert cuda.fwd_spec("bf16", 64, 64, 90, alibi=True).source == "fmha_fwd_sm90_ws"
    assert cuda.fwd_spec("bf16", 128, 128, 90, dropout=True).source == "fmha_fwd_sm90_ws"
    assert cuda.fwd_spec("bf16", 128, 128, 90, dropout=True, bias=True, bias_tma=2).source == "fmha_fwd_sm90"
    want = dict(cuda.FWD_WS_VARIANTS)
    for item in os.environ.get("CUPY_FMHA_FWD_WS_TILES", "").split(","):
        if item.strip():
            key, _, val = item.partition("=")
            want[key.strip()] = int(val)
    spec = cuda.fwd_spec("fp16", 120, 120, 90)
    for key, val in want.items():
        assert spec.macro(key, 0) == val, (key, spec.name)
    print(spec.name)


@pytest.mark.parametrize("case", list(A.CASES))
def test_batch_mode(case):
    A.test_forward_backward_matches_reference(case)


@pytest.mark.parametrize("case", list(A.STRIDED))
def test_strided(case):
    A.test_strided_inputs_match_contiguous(case)


@pytest.mark.parametrize("case", list(V.CASES))
def test_group_mode(case):
    V.test_varlen_matches_reference(case)


@pytest.mark.parametrize("case", list(V.ALIBI))
def test_group_mode_alibi(case):
    V.test_varlen_alibi_matches_reference(case)


def test_group_mode_empty_sides():
    V.test_varlen_all_keys_empty()
    V.test_varlen_all_queries_empty()


@pytest.mark.parametrize("d", [64, 128, 96, 192, 256])
def test_group_mode_inf_neighbour(d):
    V.test_inf_in_one_sequence_leaves_its_neighbours_alone(d)


# id: (dtype, layout, b, sq, sk, hq, hk, d, dv, mask kwargs), as test_gpu_attention.CASES
EXTRA = {
    "f16-d120-none-129x385-gqa2": (F16, "bshd", 2, 129, 385, 4, 2, 120, 120, {}),
    "bf16-d120-causal-700-bhsd": (BF16, "bhsd", 1, 700, 700, 2, 1, 120, 120, {"causal": True}),
    "bf16-d56-t:100,20-300x1100": (BF16, "bshd", 1, 300, 1100, 4, 4, 56, 56, {"mask": "t:100,20"}),
    "f16-d64-b-257x1025": (F16, "bshd", 1, 257, 1025, 2, 2, 64, 64, {"mask": "b"}),
    "bf16-d128-none-128x1537": (BF16, "bhsd", 1, 128, 1537, 2, 2, 128, 128, {}),
    "bf16-d128-window300,0-1100": (BF16, "bshd", 1, 1100, 1100, 2, 1, 128, 128, {"window_size": (300, 0)}),
    # a negative softmax_scale: at hdim 64 the folded softmax (FOLD, bench/NOTES.md step 37) takes
    # each row's minimum score and masks with +inf there (hdim 128: the unfolded form); with causal
    # and bottom-right edges crossing the blocks
    "bf16-d64-causal-negscale-300": (BF16, "bshd", 1, 300, 300, 2, 2, 64, 64, {"causal": True, "softmax_scale": -0.1}),
    "f16-d128-b-negscale-200x333": (F16, "bhsd", 1, 200, 333, 2, 1, 128, 128, {"mask": "b", "softmax_scale": -0.07}),
    # head dims 192 and 256 (112- and 80-key blocks: lengths that are no multiple of either, many
    # blocks through the ring) and ones that round up to them (160 -> 192, 224 -> 256, 96 -> 128),
    # unequal pairs (under the switch)
    "bf16-d256-none-129x1000": (BF16, "bshd", 1, 129, 1000, 4, 2, 256, 256, {}),
    "f16-d256-causal-700-bhsd": (F16, "bhsd", 1, 700, 700, 2, 2, 256, 256, {"causal": True}),
    "bf16-d224-b-300x481": (BF16, "bshd", 2, 300, 481, 2, 1, 224, 224, {"mask": "b"}),
    "f16-d192-window100,20-600": (F16, "bshd", 1, 600, 600, 2, 2, 192, 192, {"window_size": (100, 20)}),
    "bf16-d160-causal-negscale-333": (BF16, "bhsd", 1, 333, 333, 2, 1, 160, 160, {"causal": True, "softmax_scale": -0.09}),
    "f16-d96-none-257x900": (F16, "bshd", 1, 257, 900, 2, 2, 96, 96, {}),
    "bf16-d256x128-t-300x700": (BF16, "bshd", 1, 300, 700, 2, 2, 256, 128, {"mask": "t"}),
    "f16-d128x256-none-200x333-gqa2": (F16, "bhsd", 1, 200, 333, 4, 2, 128, 256, {}),
    # the smallest head dims, rounded up to 64 (rows of 16 and 32 bytes; TMA zero-fills the rest)
    "f16-d8-causal-300": (F16, "bshd", 1, 300, 300, 2, 1, 8, 8, {"causal": True}),
    "bf16-d16-none-200x333-bhsd": (BF16, "bhsd", 2, 200, 333, 2, 2, 16, 16, {}),
}


@pytest.mark.parametrize("case", list(EXTRA))
def test_batch_mode_extra(case, monkeypatch):
    monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


# Diagonal masks over at most 2048 query rows took two MMA warpgroups at hdim 64 until step 118 (backends/cuda.py
# FWD_WS_SHORT_BY_HDIM, empty since: three with ALIGN_END); these ran them on three (192-row blocks, forced through
# CUPY_FMHA_FWD_WS_TILES), so causal, bottom-right, sliding-window and GQA masks meet the 192-row blocks (several per
# CTA under the default PERSIST at 700-1100 rows); now the table's build, kept as cases of it
THREE_WG = {
    "f16-d64-b-257x1025": EXTRA["f16-d64-b-257x1025"],
    "bf16-d56-t:100,20-300x1100": EXTRA["bf16-d56-t:100,20-300x1100"],
    "bf16-d64-causal-700-bhsd-gqa2": (BF16, "bhsd", 1, 700, 700, 4, 2, 64, 64, {"causal": True}),
    "f16-d64-window300,0-1100": (F16, "bshd", 1, 1100, 1100, 2, 1, 64, 64, {"window_size": (300, 0)}),
}


@pytest.mark.parametrize("case", list(THREE_WG))
def test_three_warpgroups_under_short_diagonal_masks(case, monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "NWG=3")
    assert cuda.fwd_spec("fp16", 64, 64, 90, short=True).macro("NWG") == 3  # (the variable wins over the table)
    monkeypatch.setitem(A.CASES, case, THREE_WG[case])
    A.test_forward_backward_matches_reference(case)


# id: (dtype, lengths q, lengths k, hq, hk, d, dv, mask kwargs), as test_gpu_varlen.CASES
EXTRA_GROUP = {
    "bf16-d120-b-ends-mid-block": (BF16, [129, 300, 7], [385, 129, 1], 2, 1, 120, 120, {"mask": "b"}),
    "f16-d64-none-257-keys": (F16, [256, 3, 130], [257, 700, 1], 4, 2, 64, 64, {}),
    "bf16-d128-t-many-blocks": (BF16, [600, 1], [900, 255], 2, 2, 128, 128, {"mask": "t"}),
    "f16-d256-b-ends-mid-block": (F16, [129, 300, 7], [385, 161, 1], 2, 1, 256, 256, {"mask": "b"}),
    "bf16-d192-none-ends-mid-block": (BF16, [200, 5], [113, 500], 2, 2, 192, 192, {}),
}


@pytest.mark.parametrize("case", list(EXTRA_GROUP))
def test_group_mode_extra(case):
    dtype, lq, lk, hq, hk, d, dv, mkw = EXTRA_GROUP[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, dv, seed_for("fwd-ws-varlen", case))
    o, lse, g = run(inp, mkw)
    check_group(inp, o, lse, g, mkw)


def _group_300(len_key, data_key):
    """Group mode over 300 sequences of 0 to 1024 tokens (the first three 1024, 0 and 129; 2 heads,
    hdim 128, fp16, causal): q, k, v and the API keywords, lengths and data seeded by the keys."""
    import numpy as np

    lens = np.random.default_rng(seed_for(len_key)).integers(0, 1025, size=300)
    lens[:3] = (1024, 0, 129)
    cu = cp.asarray(np.concatenate([[0], np.cumsum(lens)]), dtype=cp.int32)
    rng = cp.random.default_rng(seed_for(*data_key))
    q, k, v = (rng.standard_normal((int(lens.sum()), 2, 128), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    return q, k, v, dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1024, max_seqlen_k=1024, causal=True)


def _persist_pair(monkeypatch, q, k, v, kw):
    """O and LSE of the default launch (FWD_WS_PERSIST's choice) written into poisoned outputs,
    then of one row block per CTA (PERSIST=0)."""
    import cupy_fmha

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    o, lse = cupy_fmha.attention_forward(q, k, v, **kw)
    o.view(cp.uint16).fill(0xFFFF)  # (NaN bits, as conftest.nan_like)
    lse.fill(cp.nan)
    cupy_fmha.attention_forward(q, k, v, **kw, out=(o, lse))
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "PERSIST=0")
    o0, lse0 = cupy_fmha.attention_forward(q, k, v, **kw)
    return o, lse, o0, lse0


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_persist_default_matches_one_row_block_per_cta(monkeypatch, d, causal):
    """Batch mode at a shape where the default launch gives each ws-forward CTA several row blocks (4 at hdim 64,
    2 at 128: backends/cuda.py FWD_WS_PERSIST, bench/NOTES.md steps 39 and 115: seqlen <= 1024, batch * heads >= 198):
    O and LSE bit-identical to one row block per CTA (the same arithmetic per block; the cross-block
    ring, Q reuse and phases are what differ), every element written over the poison."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    from cupy_fmha import launch as L

    b, s, h = 4, 1000, 64  # 8 row blocks of 128 (6 of 192 at hdim 64 without a mask); 256 (batch, head) pairs
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)  # (the default launch, whatever variant this file runs under)
    spec = cuda.fwd_spec("fp16", d, d, 90)
    # (4 per CTA at 64; 2 at 128, FWD_WS_PERSIST_BY_HDIM since step 115)
    assert spec.source == "fmha_fwd_sm90_ws" and L.fwd_launch(spec, b, h, s).grid[0] == (2 if d == 64 else 4)
    rng = cp.random.default_rng(seed_for("fwd-ws-persist", d, causal))
    q, k, v = (rng.standard_normal((b, s, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    o, lse, o0, lse0 = _persist_pair(monkeypatch, q, k, v, dict(causal=causal))
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all()) and bool((lse == lse0).all())
    assert bool(cp.isfinite(o).all())


def test_persist_default_group_mode(monkeypatch):
    """Group mode under the default launch with several row blocks per CTA: 300 sequences of 0 to
    1024 tokens (max 1024: 8 row blocks, 300 x 2 (batch, head) pairs), so a CTA's later row blocks
    are often past its sequence's end (skipped by producer and MMA warps alike) or cut mid-block;
    bit-identical to one row block per CTA, LSE's -inf tails and every O row written."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    from cupy_fmha import launch as L

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    spec = cuda.fwd_spec("fp16", 128, 128, 90)
    assert L.fwd_launch(spec, 300, 2, 1024).grid[0] == 4  # (2 per CTA at hdim 128 since step 115; 4 before)
    q, k, v, kw = _group_300("fwd-ws-persist-group", ("fwd-ws-persist-group-x",))
    o, lse, o0, lse0 = _persist_pair(monkeypatch, q, k, v, kw)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all()) and bool((lse == lse0).all())
    assert bool(cp.isneginf(lse[1]).all()) and bool(cp.isfinite(lse[0]).all())


# --------------------------------------------------------------------------- variants against the default build
# Shapes on which a variant of the ws forward must give O and LSE bit-identical to the default build's
# (O_IN_Q, the exact softmax variants), at the same row blocks per CTA. "no keys" puts row blocks without
# any key block (bottom-right causal, 1000 query rows over 300 keys: the first 700 rows see none) after
# ones with keys in the same CTA (PERSIST=4; a CTA takes its row blocks last first); "keys after none"
# the other way round (a top-left window of 100 keys over 300: rows from 400 on see none), so a row
# block with keys follows ones without any (no turns taken there; O_IN_Q's hand-back of Q after them).
VARIANT_SHAPES = {  # b, seqlen_q, seqlen_k, heads, keywords, the rows that see no key
    "plain": (2, 1000, 1000, 3, dict(), slice(0)),
    "causal": (2, 1000, 1000, 3, dict(causal=True), slice(0)),
    "no keys": (2, 1000, 300, 3, dict(causal=True), slice(700)),
    "keys after none": (2, 1000, 300, 3, dict(mask="t:100,0"), slice(400, None)),
    "window": (1, 1000, 1200, 2, dict(window_size=(200, 0)), slice(0)),
    # past FWD_WS_SHORT_SEQLEN, so a diagonal mask at hdim 64 takes three MMA warpgroups too
    "causal long": (1, 2600, 2600, 2, dict(causal=True), slice(0)),
    "no keys long": (1, 2600, 700, 2, dict(causal=True), slice(1900)),
}


def _variant_pair(monkeypatch, variant, q, k, v, kw, persist=4, **extra):
    """O and LSE at PERSIST=``persist`` of the default build, then of ``variant`` into poisoned outputs."""
    import cupy_fmha

    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist}")
    o0, lse0 = cupy_fmha.attention_forward(q, k, v, **kw, **extra)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist},{variant}")
    o = conftest.nan_like(o0.shape, o0.dtype)
    lse = conftest.nan_like(lse0.shape, lse0.dtype)
    cupy_fmha.attention_forward(q, k, v, **kw, **extra, out=(o, lse))
    return o0, lse0, o, lse


def _bias_pair(monkeypatch, tag, variant, d, persist):
    """:func:`_variant_pair` on a causal fp16 forward with a [b, h, s, s] fp16 bias (the TMA bias
    build at hdim ``d``), and the variant's instance spec."""
    rng = cp.random.default_rng(seed_for(tag, variant, d))
    b, s, h = 2, 1000, 2
    q, k, v = (rng.standard_normal((b, s, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    bias = rng.standard_normal((b, h, s, s), dtype=cp.float32).astype(cp.float16)
    pair = _variant_pair(monkeypatch, variant, q, k, v, dict(causal=True), persist, bias=bias)
    return (*pair, cuda.fwd_spec("fp16", d, d, 90, bias=True, bias_tma=2))


def _group_case(tag, d, fixed=()):
    """q, k, v (fp16, thd) and keywords of a causal group-mode forward: 40 sequences of 0-700 rows, so
    row blocks end inside sequences and some sequences have none (``fixed``: (index, length) pairs set after
    the draw)."""
    import numpy as np

    lens = np.random.default_rng(seed_for(tag)).integers(0, 700, size=40)
    for i, n in fixed:
        lens[i] = n
    cu = cp.asarray(np.concatenate([[0], np.cumsum(lens)]), dtype=cp.int32)
    rng = cp.random.default_rng(seed_for(tag + "-x"))
    q, k, v = (rng.standard_normal((int(lens.sum()), 2, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    return q, k, v, dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=700, max_seqlen_k=700, causal=True)


@pytest.mark.parametrize("persist", [0, 4])
@pytest.mark.parametrize("d", [64, 256, 128])
@pytest.mark.parametrize("shape", list(VARIANT_SHAPES))
def test_o_in_q_bit_identical(monkeypatch, d, shape, persist):
    """O_IN_Q (step 86: O staged in Q's buffer where its own stage is off, hdim 64 and 256; Q handed
    back after the epilogue; at 128 with a third K/V stage in the room of O's own, step 107) stores the
    same rounded values: bit-identical to the default build, also when the next row block's Q waits for
    that hand-back (PERSIST=4) and for rows without keys."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    b, sq, sk, h, kw, dark = VARIANT_SHAPES[shape]
    variant = "STAGES=3,O_IN_Q=1" if d == 128 else "O_IN_Q=1"
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist},{variant}")
    assert cuda.fwd_spec("fp16", d, d, 90).macro("O_IN_Q") == 1
    assert cuda.fwd_spec("fp16", d, d, 90).macro("STAGES", 2) == (3 if d == 128 else 2)
    rng = cp.random.default_rng(seed_for("fwd-o-in-q", d, shape))
    q = rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(cp.float16)
    k, v = (rng.standard_normal((b, sk, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o0, lse0, o, lse = _variant_pair(monkeypatch, variant, q, k, v, kw, persist)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())
    assert bool((o[:, dark] == 0).all()) and bool(cp.isneginf(lse[:, :, dark]).all())
    lit = cp.ones(sq, dtype=bool)
    lit[dark] = False
    assert bool(cp.isfinite(lse[:, :, lit]).all())


def test_o_in_q_group_mode(monkeypatch):
    """O_IN_Q in group mode at hdim 256 (rows past a sequence's end skipped; O's alignment fallback
    never taken here): bit-identical to the default build."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    o0, lse0, o, lse = _variant_pair(monkeypatch, "O_IN_Q=1", *_group_case("fwd-o-in-q-group", 256), 2)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())


# Step 111: longer key blocks at hdim 128 (FlashAttention-3 takes 176 keys there without a mask), O staged in
# Q's buffer (O's own stage does not fit beside two stages of 176- or 192-key K and V). A different block length
# sums the online softmax in another order, so these are checked against the reference, not bit for bit:
# batch mode (masks, GQA, rows without keys, bhsd) and group mode. With dropout fwd_ws_spec keeps 128 keys
# (tests/test_launch.py).
KEY_BLOCK_VARIANTS = ["BLOCK_N=176,O_IN_Q=1", "BLOCK_N=192,O_IN_Q=1"]
_HD128 = ("-d96-", "-d120-", "-d128-")


def _key_block_on(monkeypatch, variant):
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", variant)
    spec = cuda.fwd_spec("fp16", 128, 128, 90)
    assert spec.macro("BLOCK_N") == int(variant.split(",")[0].split("=")[1]) and spec.macro("O_IN_Q") == 1, spec.name


@pytest.mark.parametrize("variant", KEY_BLOCK_VARIANTS)
@pytest.mark.parametrize("case", [c for c in A.CASES if any(t in c for t in _HD128)])
def test_key_block_variants_batch_mode(monkeypatch, variant, case):
    _key_block_on(monkeypatch, variant)
    A.test_forward_backward_matches_reference(case)


@pytest.mark.parametrize("variant", KEY_BLOCK_VARIANTS)
@pytest.mark.parametrize("case", [c for c in V.CASES if any(t in c for t in _HD128)])
def test_key_block_variants_group_mode(monkeypatch, variant, case):
    _key_block_on(monkeypatch, variant)
    V.test_varlen_matches_reference(case)


# Step 113 made the folded softmax the default at hdim 128 (FOLD=1: each exponent one FFMA, s * scale_log2 - max,
# with SMAX_TREE=1: a negative scale's sign test around the whole step) together with LAZY_RESCALE=8; the whole
# suite tests that default. The softmax before it (unfolded, chain maxima, O rescaled every block) stays a build
# for comparisons (bench/ab.py), so it keeps its check against the reference: the shared batch- and group-mode
# cases at the head dims that pad to 128 (96, 120, 128), and this file's own ones there, a negative
# softmax_scale included.
PREV_SOFTMAX = "FOLD=0,SMAX_TREE=0,LAZY_RESCALE=0"
_PREV_EXTRA = [c for c in EXTRA if any(t in c for t in ("-d96-", "-d120-", "-d128-"))]
_PREV_GROUP_EXTRA = [c for c in EXTRA_GROUP if any(t in c for t in ("-d120-", "-d128-"))]


def _prev_softmax_on(monkeypatch):
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", PREV_SOFTMAX)
    spec = cuda.fwd_spec("fp16", 128, 128, 90)
    assert all(spec.macro(k, 0) == 0 for k in ("FOLD", "SMAX_TREE", "LAZY_RESCALE")), spec.name


@pytest.mark.parametrize("case", [*(c for c in A.CASES if any(t in c for t in _HD128)), *_PREV_EXTRA])
def test_prev_softmax128_batch_mode(monkeypatch, case):
    _prev_softmax_on(monkeypatch)
    if case in EXTRA:
        monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


@pytest.mark.parametrize("case", [*(c for c in V.CASES if any(t in c for t in _HD128)), *_PREV_GROUP_EXTRA])
def test_prev_softmax128_group_mode(monkeypatch, case):
    _prev_softmax_on(monkeypatch)
    if case in EXTRA_GROUP:
        test_group_mode_extra(case)
    else:
        V.test_varlen_matches_reference(case)


def test_prev_softmax128_list_is_not_empty():
    """(a filter that matched nothing would leave the variant untested while the file still passed)"""
    assert "f16-d128-b-negscale-200x333" in _PREV_EXTRA and _PREV_GROUP_EXTRA
    assert [c for c in A.CASES if any(t in c for t in _HD128)] and [c for c in V.CASES if any(t in c for t in _HD128)]


# SMAX_TREE (step 87: each row slot's maximum by a pairwise tree, both slots before their shuffles, the
# folded softmax's sign test around the whole step) takes the maxima in another order, and MASK_ROWS
# (an edge tile's mask test from each row's visible columns, the lower bound only where it crosses)
# decides the same elements: a maximum does not round, so O and LSE must be bit-identical to the default
# build's, with windows crossing both bounds, ALiBi, dropout, a negative softmax_scale (the folded form's
# minimum at hdim 64) and group mode too.
# (SMAX_TREE with MASK_ROWS=1, as experimental_table builds them: identity of the pair implies each one's,
# and a failure is bisected with the single switches by hand; MASK_ROWS=2, the causal loop, at 64 and 128, where it
# is the default since step 115: there the other form, MASK_ROWS=0, is the variant; at 192 and 256 MASK_ROWS=2, which
# spilled 4 bytes at 256 in step 87 and compiles without spills since (NVRTC 13.0, 2026-12-07))
# DESC_ADDR (step 103: the loop's wgmma descriptors from one 32-bit address plus constant offsets; the default
# at 192 and 256 since step 104) forms the same descriptors, so the other form than the table's must be
# bit-identical as well, at every head dim (DESC_ADDR=1 at 64 and 128, DESC_ADDR=0, the pointers, at 192 and
# 256) and on the bias builds.
# ALIGN_END (step 118: row blocks counted back from each sequence's last row rounded up to 16, the partial block
# first; the table's at 64, so there the variant is ALIGN_END=0) changes only which rows share a block and a warp: a
# row's key blocks past its own diagonal (P = 0, maxima unmoved) are the only other difference, so O and LSE stay
# bit-identical too (the dropout keep mask as well: its row pairs start at multiples of 16 either way), and the rows
# before the sequence are never stored.
# O_IN_KV (bench/NOTES.md row 127: O staged in the last key block's K and V tiles, Q handed back after the last S GEMM)
# rounds the same values into a different place: bit-identical to the register stores at 192 (O_IN_KV the table's
# there since row 128, so O_IN_KV=0 is the variant) and to O_IN_Q at 256;
# a build of the overlapped pipeline at 192 / 256 only (_variant_skip), with its own tests at PERSIST=4 and in group mode
# below.
# WG_SKIP (row 130: each MMA warpgroup leaves out the key blocks none of its rows sees; the table's at 64 and 256 but not
# in the dropout builds) drops only blocks masked for all of the warpgroup's rows: bit-identical to the other form; the
# overlapped pipeline's builds without O_IN_KV (_variant_skip); in group mode the kernel runs every block (batch mode
# only), with its own test at PERSIST=4 below.
EXACT_VARIANTS = ["SMAX_TREE=1,MASK_ROWS=1", "MASK_ROWS=other", "DESC_ADDR=other", "ALIGN_END=other", "O_IN_KV=other",
                  "WG_SKIP=other"]


def _variant_skip(variant: str, d: int, alibi: bool = False, dropout: bool = False) -> None:
    """Skips an O_IN_KV or WG_SKIP case where fwd_ws_spec drops the switch. O_IN_KV: hdim 64 (three MMA
    warpgroups) and 128 (O's own stage), and the serial pipeline's builds (ALiBi at 256, dropout at 192 and 256);
    WG_SKIP: the serial builds and 192 (the table's O_IN_KV)."""
    if "WG_SKIP" in variant:
        tiles = cuda.fwd_ws_tiles(d, alibi, dropout)
        if not tiles.get("PV_OVERLAP"):
            pytest.skip("WG_SKIP: the overlapped pipeline only (this build is the serial one)")
        if tiles.get("O_IN_KV"):
            pytest.skip("WG_SKIP: not beside O_IN_KV (the table's at 192)")
    if "O_IN_KV" not in variant:
        return
    if d not in (192, 256):
        pytest.skip("O_IN_KV: hdim 192 and 256 only (64: three MMA warpgroups, 128: O has its own stage)")
    if not cuda.fwd_ws_tiles(d, alibi, dropout).get("PV_OVERLAP"):
        pytest.skip("O_IN_KV: the overlapped pipeline only (this build is the serial one)")


def _concrete(variant: str, d: int, alibi: bool = False, dropout: bool = False) -> str:
    """``variant`` with ``DESC_ADDR=other`` made the other descriptor form than the table's at ``d``,
    ``MASK_ROWS=other`` the other of MASK_ROWS 0 and 2 (2 the table's at 64 and 128), ``ALIGN_END=other`` the other
    row alignment (1, from the end, the table's at 64), ``O_IN_KV=other`` the other place for O (O_IN_KV the table's at
    192; at 256 O_IN_KV against the table's O_IN_Q), ``WG_SKIP=other`` the other of WG_SKIP 0 and 1 in the build with
    ``alibi`` / ``dropout`` (1 the table's at 64 and 256 without dropout)."""
    tiles = cuda.fwd_ws_tiles(d)
    skip = cuda.fwd_ws_tiles(d, alibi, dropout).get("WG_SKIP", 0)
    return (variant.replace("WG_SKIP=other", f"WG_SKIP={1 - skip}")
            .replace("DESC_ADDR=other", f"DESC_ADDR={1 - tiles.get('DESC_ADDR', 0)}")
            .replace("MASK_ROWS=other", f"MASK_ROWS={2 - tiles.get('MASK_ROWS', 0)}")
            .replace("ALIGN_END=other", f"ALIGN_END={1 - tiles.get('ALIGN_END', 0)}")
            .replace("O_IN_KV=other", "O_IN_KV=0" if tiles.get("O_IN_KV") else "O_IN_KV=1,O_IN_Q=0"))
EXACT_EXTRA = {
    "alibi": dict(causal=True),
    "dropout": dict(dropout_p=0.2, seed=7, offset=3),
    "negscale": dict(mask="b", softmax_scale=-0.07),
    "two bounds": dict(mask="t:130,40"),
}


@pytest.mark.parametrize("variant", EXACT_VARIANTS)
@pytest.mark.parametrize("d", [64, 128, 192, 256])
@pytest.mark.parametrize("shape", [*VARIANT_SHAPES, *EXACT_EXTRA])
def test_exact_softmax_variants_bit_identical(monkeypatch, variant, d, shape):
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    if shape in EXACT_EXTRA:
        b, sq, sk, h, kw, dark = 2, 1000, 1100, 3, dict(EXACT_EXTRA[shape]), slice(0)
        if shape == "alibi":
            kw["alibi_slopes"] = cp.asarray([0.5, 0.25, 0.125], dtype=cp.float32)
    else:
        b, sq, sk, h, kw, dark = VARIANT_SHAPES[shape]
    variant = _concrete(variant, d, "alibi_slopes" in kw, "dropout_p" in kw)
    _variant_skip(variant, d, "alibi_slopes" in kw, "dropout_p" in kw)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", variant)
    spec = cuda.fwd_spec("fp16", d, d, 90, alibi="alibi_slopes" in kw, dropout="dropout_p" in kw)
    for item in variant.split(","):
        key, _, val = item.partition("=")
        assert spec.macro(key, 0) == int(val), spec.name
    rng = cp.random.default_rng(seed_for("fwd-exact-softmax", variant, d, shape))
    q = rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(cp.float16)
    k, v = (rng.standard_normal((b, sk, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o0, lse0, o, lse = _variant_pair(monkeypatch, variant, q, k, v, kw, 0)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())
    assert bool((o[:, dark] == 0).all()) and bool(cp.isneginf(lse[:, :, dark]).all())


@pytest.mark.parametrize("mask", ["causal", "window"])
@pytest.mark.parametrize("variant", EXACT_VARIANTS)
@pytest.mark.parametrize("d", [64, 128])
def test_exact_softmax_variants_group_mode(monkeypatch, variant, d, mask):
    """... in group mode (sequences ending inside key blocks: the seqlen_k bound of MASK_ROWS), causal
    with equal lengths, and a sliding window (200, 0) over other key lengths (the lower bound inside
    tiles, per sequence)."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    import numpy as np

    variant = _concrete(variant, d)
    _variant_skip(variant, d)  # (its group-mode cases at 192 / 256: test_o_in_kv_group_mode)
    g = np.random.default_rng(seed_for("fwd-exact-group", d, mask))
    lq = g.integers(0, 700, size=30)
    lk = lq if mask == "causal" else g.integers(0, 900, size=30)
    cq = cp.asarray(np.concatenate([[0], np.cumsum(lq)]), dtype=cp.int32)
    ck = cp.asarray(np.concatenate([[0], np.cumsum(lk)]), dtype=cp.int32)
    rng = cp.random.default_rng(seed_for("fwd-exact-group-x", d, mask))
    q = rng.standard_normal((int(lq.sum()), 2, d), dtype=cp.float32).astype(cp.float16)
    k, v = (rng.standard_normal((int(lk.sum()), 2, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    kw = dict(layout="thd", cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=int(lq.max()), max_seqlen_k=int(lk.max()),
              **(dict(causal=True) if mask == "causal" else dict(window_size=(200, 0))))
    o0, lse0, o, lse = _variant_pair(monkeypatch, variant, q, k, v, kw, 0)
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())


@pytest.mark.parametrize("variant", EXACT_VARIANTS)
@pytest.mark.parametrize("d", [64, 128])
def test_exact_softmax_variants_bias(monkeypatch, variant, d):
    """... on the TMA bias builds (at hdim 64 BIAS_ACC's folded softmax, at 128 the scaled one with the
    bias tile added), causal. (A variant that made ptxas contract the bias add differently would show
    here as a one-ulp difference, as step 80's Q_EARLY did: bench/NOTES.md step 83.)"""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    variant = _concrete(variant, d)
    _variant_skip(variant, d)  # (no bias builds at 192 / 256)
    if "WG_SKIP" in variant:
        pytest.skip("WG_SKIP: not on the bias builds (their ring of bias tiles)")
    o0, lse0, o, lse, spec = _bias_pair(monkeypatch, "fwd-exact-bias", variant, d, 0)
    for item in variant.split(","):
        key, _, val = item.partition("=")
        assert spec.macro(key, 0) == int(val), spec.name
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())


def _o_in_kv_other(monkeypatch, d, persist):
    """The other place for O than the table's at ``d`` (:func:`_concrete`), checked: of the default build and the
    variant at PERSIST=``persist``, exactly one stages O in the last key block's stage, and that one not in Q's buffer."""
    variant = _concrete("O_IN_KV=other", d)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist}")
    default = cuda.fwd_spec("fp16", d, d, 90)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST={persist},{variant}")
    other = cuda.fwd_spec("fp16", d, d, 90)
    assert sorted(s.macro("O_IN_KV", 0) for s in (default, other)) == [0, 1], (default.name, other.name)
    assert all(s.macro("O_IN_Q", 0) == 0 for s in (default, other) if s.macro("O_IN_KV", 0)), (default.name, other.name)
    return variant


def _o_in_kv_check(o0, lse0, o, lse, dark=slice(0)):
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())
    assert bool((o[:, dark] == 0).all()) and bool(cp.isneginf(lse[:, :, dark]).all())


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("shape", [*VARIANT_SHAPES, "dropout"])
def test_wg_skip_persist(monkeypatch, d, shape):
    """WG_SKIP at 4 row blocks per CTA: warpgroups that leave out blocks at a row block's start (the window's lower
    bound) or end (the causal diagonal; rows past the end or, ALIGN_END at 64, before the start) still take their turns
    and hand the ring's stages back in order, so the next row block's blocks land where the others expect them. O and
    LSE bit-identical to the other form (WG_SKIP=other: the table's has it at 64 and 256 without dropout) at the same
    PERSIST, into poisoned outputs; the rows that see no key zero."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    if shape == "dropout":
        b, sq, sk, h, kw, dark = 2, 1000, 1100, 3, dict(causal=True, dropout_p=0.2, seed=7, offset=3), slice(0)
    else:
        b, sq, sk, h, kw, dark = VARIANT_SHAPES[shape]
    drop = "dropout_p" in kw
    _variant_skip("WG_SKIP=1", d, dropout=drop)
    variant = _concrete("WG_SKIP=other", d, dropout=drop)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", "PERSIST=4")
    default = cuda.fwd_spec("fp16", d, d, 90, dropout=drop)
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"PERSIST=4,{variant}")
    other = cuda.fwd_spec("fp16", d, d, 90, dropout=drop)
    assert sorted(s.macro("WG_SKIP", 0) for s in (default, other)) == [0, 1], (default.name, other.name)
    rng = cp.random.default_rng(seed_for("fwd-wg-skip-persist", d, shape))
    q = rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(cp.float16)
    k, v = (rng.standard_normal((b, sk, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o0, lse0, o, lse = _variant_pair(monkeypatch, variant, q, k, v, kw, 4)
    _o_in_kv_check(o0, lse0, o, lse, dark)


@pytest.mark.parametrize("d", [192, 256])
@pytest.mark.parametrize("shape", list(VARIANT_SHAPES))
def test_o_in_kv_persist(monkeypatch, d, shape):
    """O_IN_KV at 4 row blocks per CTA: the next row block's Q lands while O is still in the last key block's stage,
    its first key block goes to the other stage and its second waits for that stage's late hand-back (the ring runs
    on across row blocks); row blocks without keys (no stage: O from the registers) before and after ones with keys,
    and one-key-block row blocks (K_0's hand-back held too). O and LSE bit-identical to the default build at the same
    PERSIST, into poisoned outputs."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    b, sq, sk, h, kw, dark = VARIANT_SHAPES[shape]
    variant = _o_in_kv_other(monkeypatch, d, 4)
    rng = cp.random.default_rng(seed_for("fwd-o-in-kv", d, shape))
    q = rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(cp.float16)
    k, v = (rng.standard_normal((b, sk, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    _o_in_kv_check(*_variant_pair(monkeypatch, variant, q, k, v, kw, 4), dark)


@pytest.mark.parametrize("persist", [0, 4])
@pytest.mark.parametrize("d", [192, 256])
def test_o_in_kv_group_mode(monkeypatch, d, persist):
    """O_IN_KV in group mode: sequences ending inside a key block (their last block's tail rows zeroed before the
    GEMMs read them, then O written over the stage), of one key (one key block), one key past a block (the last
    block holds one key), none, and the longest, 700 (60 / 28 keys into the last 80 / 112-key block);
    bit-identical to the default build, one and four row blocks per CTA."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    n = cuda.fwd_ws_tiles(d)["BLOCK_N"]
    q, k, v, kw = _group_case(f"fwd-o-in-kv-group-{d}", d, fixed=((0, 700), (3, 1), (7, n + 1), (11, 0), (13, 2 * n - 5)))
    variant = _o_in_kv_other(monkeypatch, d, persist)
    _o_in_kv_check(*_variant_pair(monkeypatch, variant, q, k, v, kw, persist))


@pytest.mark.parametrize("base", ["", "NWG=2"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("shape", ["causal", "no keys", "keys after none", "causal long", "group", "dropout", "group dropout"])
def test_align_end_persist(monkeypatch, d, shape, base):
    """ALIGN_END (step 118; the table's at 64) against the other alignment at 4 row blocks per CTA, where a CTA's
    blocks include the partial one (with ALIGN_END the first rows', from a multiple of 16 before the sequence: zeros
    by TMA in batch mode, the previous sequence's in group mode, where every block also writes its share of the LSE
    rows past the sequence, up to the longest's length): O and LSE bit-identical, into poisoned outputs, dropout's
    keep mask included (1,000 rows: not a multiple of 16). ``NWG=2``: hdim 64's two MMA warpgroups (128-row blocks;
    the short-diagonal build before step 118) both ways too."""
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    if base and d != 64:
        pytest.skip("two MMA warpgroups: the variant at hdim 64 only")
    drop = dict(dropout_p=0.2, seed=7, offset=3) if "dropout" in shape else {}
    if shape.startswith("group"):  # (with sequences of 0, 1, 16 and 700 rows: none, one row, a multiple of 16, the pitch)
        q, k, v, kw = _group_case(f"fwd-align-end-{d}", d, fixed=((0, 0), (5, 1), (9, 16), (17, 700)))
        dark = slice(0)
    else:
        b, sq, sk, h, kw, dark = VARIANT_SHAPES["causal" if shape == "dropout" else shape]
        rng = cp.random.default_rng(seed_for("fwd-align-end", d, shape))
        q = rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(cp.float16)
        k, v = (rng.standard_normal((b, sk, h, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    kw = {**kw, **drop}
    import cupy_fmha

    pre = f"PERSIST=4{',' + base if base else ''}"
    monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", pre)
    table = cuda.fwd_spec("fp16", d, d, 90, dropout=bool(drop)).macro("ALIGN_END", 0)
    o_any, lse_any = cupy_fmha.attention_forward(q, k, v, **kw)  # (for the shapes and dtypes; then both runs into poison)
    outs = {}
    for form in (table, 1 - table):
        monkeypatch.setenv("CUPY_FMHA_FWD_WS_TILES", f"{pre},ALIGN_END={form}")
        spec = cuda.fwd_spec("fp16", d, d, 90, dropout=bool(drop))
        assert spec.macro("ALIGN_END", 0) == form and (not base or spec.macro("NWG") == 2), spec.name
        outs[form] = (conftest.nan_like(o_any.shape, o_any.dtype), conftest.nan_like(lse_any.shape, lse_any.dtype))
        cupy_fmha.attention_forward(q, k, v, **kw, out=outs[form])
    assert table == (d == 64 and not drop)  # (not the dropout build at 64: FWD_WS_DROPOUT_BY_HDIM)
    (o0, lse0), (o, lse) = outs[0], outs[1]
    assert bool((o.view(cp.uint16) == o0.view(cp.uint16)).all())
    assert bool((lse.view(cp.uint32) == lse0.view(cp.uint32)).all())
    if shape.startswith("group"):  # (LSE: [batch, heads, max_seqlen_q], -inf past each sequence's end)
        lens = cp.asnumpy(kw["cu_seqlens_q"][1:] - kw["cu_seqlens_q"][:-1])
        assert lse.shape[-1] == kw["max_seqlen_q"] and 0 in lens
        for i, n in enumerate(lens):
            assert bool(cp.isneginf(lse[i, :, int(n):]).all()) and bool(cp.isfinite(lse[i, :, :int(n)]).all()), (i, n)
    else:
        assert bool((o[:, dark] == 0).all()) and bool(cp.isneginf(lse[:, :, dark]).all())


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128, 192])
def test_lazy_rescale_moving_maxima(monkeypatch, d, dtype):
    """LAZY_RESCALE=8 (step 87; the default at 64 / 128 / 256 since step 113, at 192 since step 115) where it matters:
    every other query row scores a ramp over the keys, so its maximum rises by more than 8 (log2) per key block and moves every
    block, while the rows beside it in the same warps keep theirs (O rescaled for some rows of a warp, with corr 1
    for the others); against the float64 reference and within rounding of the build without it (LAZY_RESCALE=0)."""
    import ml_dtypes
    import numpy as np

    from cupy_fmha import reference as R
    from cupy_fmha.verify import compare

    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    npdt = np.float16 if dtype == "fp16" else ml_dtypes.bfloat16
    g = np.random.default_rng(seed_for("fwd-lazy", d, dtype))
    b, s, h = 1, 1000, 2
    q = g.standard_normal((b, s, h, d)) * 0.5
    k = g.standard_normal((b, s, h, d)) * 0.5
    v = g.standard_normal((b, s, h, d))
    q[:, 0::2, :, 0], q[:, 1::2, :, 0] = 1.0, 0.0
    # (0.6 * 128 / sqrt(d) * log2(e) > 8 per 128-key block at 64 and 128; 1.0 * 112 / sqrt(192) * log2(e) = 11.7 at 192)
    k[..., 0] = (0.6 if d <= 128 else 1.0) * np.arange(s)[None, :, None]
    hq, hk, hv = (x.astype(npdt) for x in (q, k, v))
    dq, dk, dv = (cp.asarray(x) if dtype == "fp16" else cp.asarray(x.view(np.uint16)) for x in (hq, hk, hv))
    kw = {} if dtype == "fp16" else dict(dtype="bfloat16")
    o, lse, o0, lse0 = _variant_pair(monkeypatch, "LAZY_RESCALE=0", dq, dk, dv, kw, 0)  # (o, lse: the default's)
    assert cuda.fwd_spec(dtype, d, d, 90).macro("LAZY_RESCALE", 0) == 0
    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES")
    spec = cuda.fwd_spec(dtype, d, d, 90)
    assert spec.macro("LAZY_RESCALE") == 8, spec.name
    to64 = lambda x: (cp.asnumpy(x).astype(np.float64) if dtype == "fp16"  # noqa: E731
                      else cp.asnumpy(x).view(ml_dtypes.bfloat16).astype(np.float64))
    ref_o, ref_lse = R.attention_forward(hq.astype(np.float64), hk.astype(np.float64), hv.astype(np.float64))
    low_o, low_lse = R.attention_forward(hq, hk, hv, precision="low")
    for name, got, ref, low in (("o", to64(o), ref_o, low_o), ("lse", cp.asnumpy(lse).astype(np.float64), ref_lse, low_lse)):
        c = compare(name, got, ref, low, dtype=npdt, hdim_q=d, hdim_v=d)
        assert c.ok, str(c)
    assert float(cp.abs(lse - lse0).max()) < 1e-3


_EXP2_PROBE = r"""
#include "arch/arch.cuh"
extern "C" __global__ void poly_exp2_probe(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmha::poly_exp2(x[i]);
}
"""


def test_poly_exp2_on_the_device():
    """The EXP_EMU exponential (kernels/arch/sm80/instr.cuh poly_exp2, step 87) against its NumPy
    replica (cupy_fmha.softmax_exp), from below -127 to past LAZY_RESCALE's range above 0: within one
    float32 unit (the replica's fma rounds twice), the special values exactly (+0.0 below -126 and for
    -inf, NaN kept, the integers' exact powers of two), and within the replica's error bound of 2^x."""
    import numpy as np

    from cupy_fmha import compile as C
    from cupy_fmha import softmax_exp as E

    if not conftest.is_sm90():
        pytest.skip("sm_90 only (the variant's kernels)")
    rng = np.random.default_rng(seed_for("poly-exp2"))
    x = np.concatenate([rng.uniform(-130, 0, 1 << 20), np.linspace(-127.5, 16, 1 << 18), np.arange(-130, 128),
                        [-np.inf, np.nan, -0.0, 1e-7, -1e-30, -3e38]]).astype(np.float32)
    mod = cp.RawModule(code=C.expand_includes(_EXP2_PROBE), options=("-std=c++17", "-arch=sm_90a"))
    y = cp.full(x.size, cp.nan, dtype=cp.float32)
    mod.get_function("poly_exp2_probe")(((x.size + 255) // 256,), (256,), (cp.asarray(x), y, np.int32(x.size)))
    got, want = cp.asnumpy(y), E.poly_exp2(x)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got), nan)
    ulps = np.abs(got[~nan].view(np.int32).astype(np.int64) - want[~nan].view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, (ulps.max(), x[~nan][ulps.argmax()])  # (0 in a review's exact-fma emulation)
    low = x < -126
    assert np.all(got[low] == 0) and not np.signbit(got[low]).any()
    ints = (x == np.round(x)) & (x >= -126) & (x < 128)
    assert np.array_equal(got[ints], np.exp2(x[ints].astype(np.float64)).astype(np.float32))
    ok = (x >= -126) & (x < 128)
    rel = np.abs(got[ok].astype(np.float64) / np.exp2(x[ok].astype(np.float64)) - 1)
    assert rel.max() <= E.MAX_REL_ERROR + 1.2e-7, rel.max()
