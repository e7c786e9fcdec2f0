"""Dropout on the GPU path, the parts that need no GPU: argument checks (before any launch),
the kernel instances and launch sizes it selects, and the dispatch table."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import launch as L
from cupy_fmha import spec as S
from cupy_fmha.backends import cuda as cuda_be

Q = np.random.default_rng(0).standard_normal((1, 16, 2, 64)).astype(np.float16)


@pytest.mark.parametrize(
    "kw, exc, name",
    [
        ({"dropout_p": 1.0}, ValueError, "dropout_p"),
        ({"dropout_p": -0.1}, ValueError, "dropout_p"),
        ({"dropout_p": float("nan")}, ValueError, "dropout_p"),
        ({"dropout_p": "0.1"}, TypeError, "dropout_p"),
        ({"dropout_p": True}, TypeError, "dropout_p"),
        ({"dropout_p": 0.1, "seed": -1}, ValueError, "seed"),
        ({"dropout_p": 0.1, "seed": 2**64}, ValueError, "seed"),
        ({"dropout_p": 0.1, "seed": 1.5}, TypeError, "seed"),
        ({"dropout_p": 0.1, "offset": 2**64}, ValueError, "offset"),
        ({"dropout_p": 0.1, "offset": None}, TypeError, "offset"),
        ({"return_dropout_mask": 1}, TypeError, "return_dropout_mask"),
    ],
)
def test_forward_rejects_bad_dropout_arguments_before_any_launch(kw, exc, name):
    with pytest.raises(exc, match=name):
        cupy_fmha.attention_forward(Q, Q, Q, **kw)


@pytest.mark.parametrize(
    "kw, exc, name",
    [
        ({"dropout_p": 1.5}, ValueError, "dropout_p"),
        ({"dropout_p": 0.2, "seed": -3}, ValueError, "seed"),
        ({"dropout_p": 0.2, "offset": "7"}, TypeError, "offset"),
    ],
)
def test_backward_rejects_bad_dropout_arguments(kw, exc, name):
    lse = np.zeros((1, 2, 16), np.float32)
    with pytest.raises(exc, match=name):
        cupy_fmha.attention_backward(Q, Q, Q, Q, Q, lse, **kw)


def test_dropout_instances_are_separate_specs():
    for cc in (80, 90):
        for d in (32, 64, 128, 256):
            plain, drop = S.fwd_spec("fp16", d, d, cc), S.fwd_spec("fp16", d, d, cc, dropout=True)
            assert plain.macro("DROPOUT") is None and "DROPOUT" not in plain.name
            # the same kernel family (the ws forward on sm_90 from hdim 64 on, bench/NOTES.md step 48)
            assert drop.macro("DROPOUT") == 1 and "DROPOUT1" in drop.name
            assert drop.source == plain.source
            b0, b1 = S.bwd_specs("bf16", d, d, cc), S.bwd_specs("bf16", d, d, cc, dropout=True)
            assert b1.dq_dk_dv.macro("DROPOUT") == 1 and b0.dq_dk_dv.macro("DROPOUT") is None
            assert b1.dot_do_o == b0.dot_do_o and b1.convert_dq == b0.convert_dq
    with pytest.raises(TypeError, match="dropout"):
        S.fwd_spec("fp16", 64, 64, 80, dropout=1)


def test_sm90_forward_dropout_tiles_fit_registers(monkeypatch):
    # the plain fmha_fwd_sm90 instances (the default under CUPY_FMHA_FWD_WS=0) are unchanged; the
    # dropout ones trade warpgroups for registers
    monkeypatch.setenv("CUPY_FMHA_FWD_WS", "0")
    assert S.fwd_spec("fp16", 128, 128, 90).macro("NWG") == 3
    assert S.fwd_spec("fp16", 64, 64, 90).macro("MIN_BLOCKS") == 2
    assert S.fwd_spec("fp16", 128, 128, 90, dropout=True).macro("NWG") == 2
    assert S.fwd_spec("fp16", 64, 64, 90, dropout=True).macro("MIN_BLOCKS") == 1


def test_dispatch_table_has_dropout_instances_and_mask_kernel():
    names = [s.name for s in S.default_dispatch_table()]
    assert len(names) == len(set(names))
    assert S.dropout_mask_spec().name in names
    drop = [n for n in names if "DROPOUT1" in n]
    for src in ("fmha_fwd_", "fmha_fwd_sm90_", "fmha_bwd_dq_dk_dv_", "fmha_bwd_dq_dk_dv_sm90_"):
        assert any(n.startswith(src) for n in drop), src
    assert not any(n.startswith(("fmha_bwd_dot_do_o", "fmha_bwd_convert_dq")) for n in drop)


@pytest.mark.parametrize("ws", ["", "0"])
def test_backward_launch_reserves_keep_bits(ws, monkeypatch):
    """Every dq_dk_dv kernel reserves two word tiles of 1 byte per 8 scores of a block for the keep
    bits (fill_keep_words: the current block's and the next one's); the ws backward (the default at 64
    and 128 on sm_90; ``CUPY_FMHA_BWD_WS=0``: the older kernel) too since bench/NOTES.md step 96."""
    monkeypatch.setenv("CUPY_FMHA_BWD_WS", ws)
    for cc in (80, 90):
        for d in (32, 64, 128, 256):
            drop = S.bwd_specs("fp16", d, d, cc, dropout=True).dq_dk_dv
            # the same instance without dropout (dropout may pick other tiles or the other kernel)
            plain = S._mk(drop.source, drop.dtype, drop.target,
                          **{k: v for k, v in drop.macros if k != "DROPOUT"})
            l0, l1 = L.dq_dk_dv_launch(plain, 2, 4, 1000), L.dq_dk_dv_launch(drop, 2, 4, 1000)
            assert l0.grid == l1.grid and l0.block == l1.block
            if drop.source.endswith("_ws"):
                bm, bn = drop.macro("BLOCK_M"), drop.macro("BLOCK_N")
            elif drop.target == "sm90a":
                bm, bn = 64, 128
            else:
                bm, bn = drop.macro("BLOCK_M"), 16 * drop.macro("NWARPS")
            assert l1.smem - l0.smem == 2 * (max(bn, 32) // 8) * bm == cuda_be._keep_bits_bytes({"DROPOUT": 1}, bm, bn)
            assert l1.smem <= L.SMEM_LIMIT
            fd = S.fwd_spec("fp16", d, d, cc, dropout=True)
            assert L.fwd_launch(fd, 2, 4, 1000).smem <= L.SMEM_LIMIT


def test_dropout_mask_launch_covers_every_call():
    for sq, sk in ((1, 1), (37, 91), (1000, 8), (5, 1025)):
        grid, block, smem = L.dropout_mask_launch(2, 3, sq, sk)
        assert grid[1:] == (3, 2) and smem == 0
        assert grid[0] * block[0] >= sq * -(-sk // 8) > (grid[0] - 1) * block[0]
