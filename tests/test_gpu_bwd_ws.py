"""The warp-specialized Hopper backward (kernels/fmha_bwd_dq_dk_dv_sm90_ws.cu; the default at equal
padded head dims 64/128 in atomic mode, CUPY_FMHA_BWD_WS=1 takes it wherever it applies) against
the NumPy reference: the cases of the main GPU suites (batch mode: masks, GQA, both layouts,
lengths that are not multiples of any tile; group mode; ALiBi; deterministic mode, which by
default runs the other kernel) rerun with the switch on, plus a check that the switch really
selects the kernel. Its dropout build (the MMA threads fill a word tile of keep bits: fill_keep_words)
is the default at these head dims, so the dropout suites test it as they are (test_gpu_dropout.py
reruns its cases on the older kernel, CUPY_FMHA_BWD_WS=0). Configurations it does not take (bias
with dropout, bias at hdim 128, head dims above 128, devices before sm_90) run the usual kernels
under the switch too.

The kernel's variants (SWIZZLE, on by default: backends/cuda.py BWD_WS_VARIANTS) are chosen by
CUPY_FMHA_BWD_WS_TILES for the whole run (SWIZZLE=0 runs this file on the column-blocked build); test_switch_selects_the_ws_kernel checks the instance carries them. EXTRA adds what the
swizzled tiles need beyond the shared cases: head dims 56 and 120 (padded to 64 / 128: the columns
past the head dim come from TMA's zero fill, in boxes of 64 columns), lengths one past a block (65
query rows, 129 keys), many query blocks through the two-stage ring, and group-mode sequences that
end inside a query or key block with more blocks before them (the swizzled zero-rows path)."""

from __future__ import annotations

import os

import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

import test_gpu_attention as A
import test_gpu_deterministic as D
import test_gpu_varlen as V
import conftest
from conftest import BF16, F16, Packed, check_group, run, seed_for
from cupy_fmha.backends import cuda

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _ws_on(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", "1")


def test_switch_selects_the_ws_kernel():
    if not conftest.is_sm90():
        pytest.skip("sm_90 only")
    assert cuda.bwd_specs("bf16", 128, 128, 90).dq_dk_dv.source == "fmha_bwd_dq_dk_dv_sm90_ws"
    drop = cuda.bwd_specs("bf16", 128, 128, 90, dropout=True).dq_dk_dv
    assert (drop.source, drop.macro("DROPOUT")) == ("fmha_bwd_dq_dk_dv_sm90_ws", 1)
    assert cuda.bwd_specs("bf16", 64, 64, 90, dropout=True, bias=True, bias_tma=2).dq_dk_dv.source == "fmha_bwd_dq_dk_dv_sm90"
    want = dict(cuda.BWD_WS_VARIANTS)
    for item in os.environ.get("CUPY_FMHA_BWD_WS_TILES", "").split(","):
        if item.strip():
            key, _, val = item.partition("=")
            want[key.strip()] = int(val)
    for d in (56, 120):  # padded to 64 / 128 (BLOCK_M=128: hdim 64 only; 80: hdim 128 only)
        spec = cuda.bwd_specs("fp16", d, d, 90).dq_dk_dv
        for key, val in want.items():
            if key == "BLOCK_M" and val != {56: 128, 120: 80}[d]:
                val = 64
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


@pytest.mark.parametrize("case", list(D.CASES))
def test_deterministic(case):
    D.test_deterministic_is_bit_identical_and_correct(case)


def test_group_mode_empty_sides():
    V.test_varlen_all_keys_empty()
    V.test_varlen_all_queries_empty()


@pytest.mark.parametrize("case", list(V.DETERMINISTIC))
def test_group_mode_deterministic(case):
    V.test_varlen_deterministic_is_bit_identical_and_correct(case)


@pytest.mark.parametrize("d", [64, 128, 96, 136, 256])  # (136 and 256: the wide build's zeroing)
def test_group_mode_inf_neighbour(d):
    V.test_inf_in_one_sequence_leaves_its_neighbours_alone(d)


# id: (dtype, layout, b, sq, sk, hq, hk, d, dv, mask kwargs), as test_gpu_attention.CASES
EXTRA = {
    "f16-d120-none-65x129-gqa2": (F16, "bshd", 2, 65, 129, 4, 2, 120, 120, {}),
    "bf16-d120-causal-700-bhsd": (BF16, "bhsd", 1, 700, 700, 2, 1, 120, 120, {"causal": True}),
    "bf16-d56-t:100,20-300x1100": (BF16, "bshd", 1, 300, 1100, 4, 4, 56, 56, {"mask": "t:100,20"}),
    "f16-d64-b-257x129": (F16, "bshd", 1, 257, 129, 2, 2, 64, 64, {"mask": "b"}),
    "bf16-d128-none-1537x257": (BF16, "bhsd", 1, 1537, 257, 2, 2, 128, 128, {}),
    "bf16-d64-causal-1100-gqa4": (BF16, "bshd", 1, 1100, 1100, 4, 1, 64, 64, {"causal": True}),
    # head dims that round up to 128 (the default there since bench/NOTES.md step 45)
    "f16-d96-causal-333x257": (F16, "bshd", 1, 333, 257, 4, 2, 96, 96, {"causal": True}),
    "bf16-d72-none-129x700-bhsd": (BF16, "bhsd", 2, 129, 700, 2, 2, 72, 72, {}),
    # the wide build (fmha_bwd_dq_dk_dv_sm90_ws_wide: 64-key blocks, the warpgroups splitting rows
    # and columns): hdim 256, 224 and 160 (rounded up to 256), many key and query blocks, GQA
    "bf16-d256-causal-1100-gqa4": (BF16, "bshd", 1, 1100, 1100, 4, 1, 256, 256, {"causal": True}),
    "f16-d256-none-65x333": (F16, "bhsd", 2, 65, 333, 2, 2, 256, 256, {}),
    "f16-d224-window100,30-700": (F16, "bshd", 1, 700, 700, 2, 2, 224, 224, {"window_size": (100, 30)}),
    "bf16-d160-b-300x129-gqa2": (BF16, "bshd", 1, 300, 129, 4, 2, 160, 160, {"mask": "b"}),
    "bf16-d256x128-t-300x700": (BF16, "bshd", 1, 300, 700, 2, 2, 256, 128, {"mask": "t"}),
    "f16-d128x256-none-200x333-gqa2": (F16, "bhsd", 1, 200, 333, 4, 2, 128, 256, {}),
}


@pytest.mark.parametrize("case", list(EXTRA))
def test_batch_mode_extra(case, monkeypatch):
    monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


# id: (dtype, lengths q, lengths k, hq, hk, d, dv, mask kwargs), as test_gpu_varlen.CASES
EXTRA_GROUP = {
    "bf16-d120-b-ends-mid-block": (BF16, [129, 300, 7], [385, 129, 1], 2, 1, 120, 120, {"mask": "b"}),
    "f16-d64-none-65-rows": (F16, [65, 3, 130], [257, 700, 1], 4, 2, 64, 64, {}),
    "bf16-d128-t-many-blocks": (BF16, [600, 1], [900, 255], 2, 2, 128, 128, {"mask": "t"}),
    "f16-d56-causal-mid-block": (F16, [200, 77], [200, 77], 2, 2, 56, 56, {"causal": True}),
    "bf16-d104-b-mid-block": (BF16, [129, 300, 7], [385, 129, 1], 2, 1, 104, 104, {"mask": "b"}),
    "f16-d256-causal-mid-block": (F16, [200, 77, 5], [200, 77, 64], 2, 1, 256, 256, {"causal": True}),
}


@pytest.mark.parametrize("case", list(EXTRA_GROUP))
def test_group_mode_extra(case):
    dtype, lq, lk, hq, hk, d, dv, mkw = EXTRA_GROUP[case]
    inp = Packed(dtype, lq, lk, hq, hk, d, dv, seed_for("bwd-ws-varlen", case))
    o, lse, g = run(inp, mkw)
    check_group(inp, o, lse, g, mkw)


# The grouped start order (HEADS_X = 2: the heavy key blocks first within groups of two heads;
# bench/NOTES.md step 65), which the plan takes for causal masks at 4097-8192 keys when nhead_q is
# even: forced here at small shapes through the tile variable, on cases with even head counts (GQA,
# both layouts, lengths one past a block, a mask that is not causal), and in deterministic mode,
# where the ordered dQ adds admit key blocks 0, 1, ... of a head, which this order still starts first.
HEADS_GROUP = {
    "bf16-d128-causal-700-h4-gqa2": (BF16, "bshd", 2, 700, 700, 4, 2, 128, 128, {"causal": True}),
    "f16-d64-causal-1100-h6-bhsd": (F16, "bhsd", 1, 1100, 1100, 6, 6, 64, 64, {"causal": True}),
    "bf16-d120-b-300x900-h2": (BF16, "bshd", 1, 300, 900, 2, 1, 120, 120, {"mask": "b"}),
    "f16-d56-none-65x129-h8": (F16, "bshd", 2, 65, 129, 8, 4, 56, 56, {}),
}


@pytest.mark.parametrize("case", list(HEADS_GROUP))
def test_heads_group_order(case, monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "HEADS_X=2")
    if conftest.is_sm90():
        d = HEADS_GROUP[case][7]
        assert cuda.bwd_specs("bf16", d, d, 90).dq_dk_dv.macro("HEADS_X") == 2
    monkeypatch.setitem(A.CASES, case, HEADS_GROUP[case])
    A.test_forward_backward_matches_reference(case)


@pytest.mark.parametrize("case", ["f16-d64-causal-1000-gqa4", "bf16-d128-causal-253x1000-gqa4"])
def test_heads_group_order_deterministic(case, monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "HEADS_X=2")
    D.test_deterministic_is_bit_identical_and_correct(case)


# The wide build's dQ writer warp (DQ_WRITER=1, a variant the plan does not dispatch yet:
# bench/NOTES.md step 75): the wide cases above in batch mode, group mode (sequences ending inside
# a block, a CTA of one query block), deterministic mode (the writer waits for the tile's
# semaphore and releases it), and its twenty bit-identical runs, with the writer switched on.
WRITER_BATCH = [c for c in EXTRA if max(EXTRA[c][7], EXTRA[c][8]) > 128]
WRITER_DETERMINISTIC = [c for c in D.CASES if D.CASES[c][7] == 256]


@pytest.fixture
def _dq_writer(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_WIDE_TILES", "DQ_WRITER=1")
    if conftest.is_sm90():
        for hq, hv, writer in ((256, 256, 1), (128, 256, 1), (256, 128, 0)):  # (256 / 128: dQ is not staged)
            spec = cuda.bwd_specs("bf16", hq, hv, 90).dq_dk_dv
            assert spec.source == "fmha_bwd_dq_dk_dv_sm90_ws_wide" and spec.macro("DQ_WRITER") == 1
            assert spec.macro("DQ_TILED") == writer, spec.name


@pytest.mark.parametrize("case", WRITER_BATCH)
def test_wide_dq_writer(case, monkeypatch, _dq_writer):
    monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


def test_wide_dq_writer_group_mode(_dq_writer):
    test_group_mode_extra("f16-d256-causal-mid-block")
    V.test_varlen_deterministic_is_bit_identical_and_correct("f16-d256-causal-gqa2")


@pytest.mark.parametrize("case", WRITER_DETERMINISTIC)
def test_wide_dq_writer_deterministic(case, _dq_writer):
    D.test_deterministic_is_bit_identical_and_correct(case)


def test_wide_dq_writer_twenty_runs(_dq_writer):
    D.test_deterministic_twenty_runs("bf16-d256-causal-1000x253-gqa4")


# Deterministic mode adds the same tiles in the same order with or without the writer, so dQ, dK and
# dV are bit-identical to the default build's (the wide build at 256; the ws build at 64 and 128)
WRITER_BITS = {"f16-d256-window128,16-1000": "CUPY_FMHA_BWD_WS_WIDE_TILES",
               "bf16-d256-causal-1000x253-gqa4": "CUPY_FMHA_BWD_WS_WIDE_TILES",
               "f16-d64-causal-1000-gqa4": "CUPY_FMHA_BWD_WS_TILES",
               "bf16-d128-causal-253x1000-gqa4": "CUPY_FMHA_BWD_WS_TILES",
               "f16-d128-window100,0-1000": "CUPY_FMHA_BWD_WS_TILES"}


@pytest.mark.parametrize("case", list(WRITER_BITS))
def test_dq_writer_bits_equal_thread0_adds(case, monkeypatch):
    dtype, layout, b, sq, sk, hq, hk, d, mkw = D.CASES[case]
    c = D.Case(case, dtype, layout, b, sq, sk, hq, hk, d, mkw)
    default = [D._bits(x) for x in c.backward(True)]
    monkeypatch.setenv(WRITER_BITS[case], "DQ_WRITER=1")
    if conftest.is_sm90():
        assert cuda.bwd_specs("bf16", d, d, 90).dq_dk_dv.macro("DQ_WRITER") == 1
    for name, want, x in zip(("dq", "dk", "dv"), default, c.backward(True)):
        same = want == D._bits(x)
        assert same.all(), f"{name} differs from the default build at {int((~same).sum())} elements"


# The ws build's dQ writer (DQ_WRITER=1 in CUPY_FMHA_BWD_WS_TILES, a variant not dispatched yet:
# bench/NOTES.md step 76; not with the bias or dropout): the deterministic cases at hdim 64 and 128
# (ordered adds through the writer), twenty runs, group mode, and batch cases in atomic mode.
WS_WRITER_DETERMINISTIC = [c for c in D.CASES if D.CASES[c][7] in (64, 128)]
WS_WRITER_BATCH = ["f16-d120-none-65x129-gqa2", "bf16-d64-causal-1100-gqa4", "bf16-d128-none-1537x257"]


@pytest.fixture
def _ws_dq_writer(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DQ_WRITER=1")
    if conftest.is_sm90():
        for d in (64, 128):
            assert cuda.bwd_specs("fp16", d, d, 90).dq_dk_dv.macro("DQ_WRITER") == 1
        assert cuda.bwd_specs("fp16", 64, 64, 90, dropout=True).dq_dk_dv.macro("DQ_WRITER", 0) == 0


@pytest.mark.parametrize("case", WS_WRITER_DETERMINISTIC)
def test_ws_dq_writer_deterministic(case, _ws_dq_writer):
    D.test_deterministic_is_bit_identical_and_correct(case)


def test_ws_dq_writer_twenty_runs(_ws_dq_writer):
    D.test_deterministic_twenty_runs("bf16-d128-causal-253x1000-gqa4")


def test_ws_dq_writer_group_mode(_ws_dq_writer):
    test_group_mode_extra("bf16-d128-t-many-blocks")
    for case in V.DETERMINISTIC:
        if V.DETERMINISTIC[case][5] in (64, 128):
            V.test_varlen_deterministic_is_bit_identical_and_correct(case)


@pytest.mark.parametrize("case", WS_WRITER_BATCH)
def test_ws_dq_writer_batch(case, monkeypatch, _ws_dq_writer):
    monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


# 80 query rows per step at hdim 128 (the default there without a short diagonal mask, forced here
# under every mask through CUPY_FMHA_BWD_WS_TILES: GEMM4 as dQ^T = K^T dS^T, the fragments staged
# transposed into the workspace's kind-2 chunks, the dQ writer; bench/NOTES.md step 100): the
# hdim-128 cases (120 and 96 padded to 128: TMA's zero fill), lengths that are no multiple of 80 (65,
# 700, 1537 query rows: a last tile of 17, 60, 17 rows), masks, GQA, group mode with sequences ending
# inside a tile, deterministic mode (ordered adds of 80-row tiles) with and without the dQ writer, and
# twenty bit-identical runs. hdim_q 64 keeps 64 rows (GEMM4's M would be 32): checked too.
BM80 = "BLOCK_M=80,SPLIT_PDS=2,DQ_WRITER=1"
BM80_BATCH = [c for c in EXTRA if EXTRA[c][7] in (96, 120, 128) and EXTRA[c][8] <= 128] + \
    [c for c in A.CASES if A.CASES[c][7] in (96, 120, 128) and A.CASES[c][8] <= 128]
BM80_DETERMINISTIC = [c for c in D.CASES if D.CASES[c][7] == 128]


@pytest.fixture
def _bm80(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", BM80)
    if conftest.is_sm90():
        for hq, hv, want in ((128, 128, 80), (120, 120, 80), (128, 64, 80), (64, 128, 64), (64, 64, 64)):
            spec = cuda.bwd_specs("bf16", hq, hv, 90).dq_dk_dv
            assert spec.macro("BLOCK_M") == want, spec.name
        for kw in (dict(dropout=True), dict(bias=True, bias_tma=2)):
            assert cuda.bwd_specs("bf16", 128, 128, 90, **kw).dq_dk_dv.macro("BLOCK_M") == 64


@pytest.mark.parametrize("case", BM80_BATCH)
def test_bm80_batch(case, monkeypatch, _bm80):
    if case in EXTRA:
        monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


def test_bm80_group_mode(_bm80):
    for case in ("bf16-d120-b-ends-mid-block", "bf16-d128-t-many-blocks", "bf16-d104-b-mid-block"):
        test_group_mode_extra(case)
    for case in V.DETERMINISTIC:
        if V.DETERMINISTIC[case][5] in (96, 128):
            V.test_varlen_deterministic_is_bit_identical_and_correct(case)


@pytest.mark.parametrize("case", BM80_DETERMINISTIC)
def test_bm80_deterministic(case, _bm80):
    D.test_deterministic_is_bit_identical_and_correct(case)


@pytest.mark.parametrize("writer", [0, 1])
def test_bm80_twenty_runs(writer, monkeypatch, _bm80):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", f"BLOCK_M=80,SPLIT_PDS=2,DQ_WRITER={writer}")
    D.test_deterministic_twenty_runs("bf16-d128-causal-253x1000-gqa4")


# DESC_ADDR (bench/NOTES.md step 102, the default since step 104): the loop's wgmma descriptors from one
# 32-bit address plus constant offsets instead of the tile pointers. The descriptors are the same values, so
# the pointer-formed build's (DESC_ADDR=0) dK and dV must be bit-identical to the default build's, at the
# 80-row default, the 64-row diagonal entries and hdim 64, and so must dQ in deterministic mode (the writer
# builds the address form removes 60-67 R2UR from); in atomic mode dQ's fp32 adds from several key blocks
# land in no fixed order, so there dQ is compared as test_gpu_deterministic compares the two modes (a few
# output ulps).
DESC_ADDR_BITS = ["bf16-d128-none-1000", "f16-d128-b-1000x253-gqa4-empty-rows", "bf16-d128-causal-253x1000-gqa4",
                  "f16-d128-window100,0-1000", "f16-d64-none-253", "f16-d64-causal-1000-gqa4",
                  "f16-d120-none-65x129-gqa2", "bf16-d64-causal-1100-gqa4", "bf16-d128-none-1537x257"]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", [c for c in DESC_ADDR_BITS if c in D.CASES])
def test_desc_addr_bits_equal_default(case, deterministic, monkeypatch):
    dtype, layout, b, sq, sk, hq, hk, d, mkw = D.CASES[case]
    c = D.Case(case, dtype, layout, b, sq, sk, hq, hk, d, mkw)
    monkeypatch.delenv("CUPY_FMHA_BWD_WS_TILES", raising=False)
    base = c.backward(deterministic)
    default = [D._bits(x) for x in base]
    if conftest.is_sm90():
        assert cuda.bwd_specs("bf16", d, d, 90).dq_dk_dv.macro("DESC_ADDR") == 1
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DESC_ADDR=0")
    if conftest.is_sm90():
        assert cuda.bwd_specs("bf16", d, d, 90).dq_dk_dv.macro("DESC_ADDR") is None
    got = c.backward(deterministic)
    for name, want, x in zip(("dq", "dk", "dv"), default, got):
        if name == "dq" and not deterministic:  # (the fp32 adds' order: a few output ulps)
            import numpy as np
            x_f, w_f = c.to_float(x), c.to_float(base.dq)
            ulp = 2.0**-10 if dtype == F16 else 2.0**-7
            assert np.max(np.abs(x_f - w_f)) <= 4 * ulp * np.max(np.abs(w_f)), "dq beyond the fp32 adds' order"
            continue
        same = want == D._bits(x)
        assert same.all(), f"{name} differs from the default build at {int((~same).sum())} elements"


@pytest.mark.parametrize("case", [c for c in DESC_ADDR_BITS if c in EXTRA])
def test_desc_addr_batch(case, monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DESC_ADDR=0")  # (the comparison build; the default runs everywhere)
    monkeypatch.setitem(A.CASES, case, EXTRA[case])
    A.test_forward_backward_matches_reference(case)


def test_desc_addr_group_mode(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_BWD_WS_TILES", "DESC_ADDR=0")
    for case in ("bf16-d120-b-ends-mid-block", "bf16-d128-t-many-blocks", "bf16-d104-b-mid-block"):
        test_group_mode_extra(case)
    for case in V.DETERMINISTIC:
        if V.DETERMINISTIC[case][5] in (64, 96, 128):
            V.test_varlen_deterministic_is_bit_identical_and_correct(case)
