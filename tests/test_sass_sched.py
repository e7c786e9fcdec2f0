"""tools/sass_sched.py (bench/NOTES.md step 87): the decoding of sm_90's scheduling controls from
nvdisasm's ``-hex`` listing, the one-warp simulation, several warps sharing a sub-partition (step 88),
the walk along branches, and (with NVRTC and
nvdisasm) the default hdim-128 forward's softmax as the step measured it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from cupy_fmha import compile as C

_PATH = Path(__file__).resolve().parent.parent / "tools" / "sass_sched.py"
_spec = importlib.util.spec_from_file_location("sass_sched", _PATH)
S = importlib.util.module_from_spec(_spec)
sys.modules["sass_sched"] = S
_spec.loader.exec_module(S)


def _hi(stall, wb=7, rb=7, wait=0, yld=0):
    """The second 64-bit word of an instruction with these controls (bits 41.. of it)."""
    ctl = stall | yld << 4 | wb << 5 | rb << 8 | wait << 11
    return f"0x{ctl << 41:016x}"


def _listing(rows):
    """nvdisasm -c -hex style text: rows of (text, hi word) or a label string."""
    out, addr = [], 0
    for r in rows:
        if isinstance(r, str):
            out.append(f"{r}:")
            continue
        text, hi = r
        out.append(f"        /*{addr:04x}*/                   {text} ;    /* 0x000000000000000000 */")
        out.append(f"                                                          /* {hi} */")
        addr += 16
    return "\n".join(out)


def test_controls_decode():
    ins, labels = S.parse(_listing([("FADD R1, R2, R3", _hi(4)), ".L_x_1",
                                    ("SHFL.BFLY PT, R9, R8, 0x1, 0x1f", _hi(2, wb=1, yld=1)),
                                    ("FMNMX R12, R8, R9, !PT", _hi(5, rb=3, wait=0b10))]))
    assert [(i.stall, i.wb, i.rb, i.wait) for i in ins] == [(4, 7, 7, 0), (2, 1, 7, 0), (5, 7, 3, 2)]
    assert labels == {".L_x_1": 1} and ins[1].op == "SHFL.BFLY" and ins[2].addr == 0x20


def test_simulation_counts_stalls_scoreboards_and_mufu():
    ins, _ = S.parse(_listing([("FMUL R1, R1, R2", _hi(3)),  # 2 cycles of fixed stall
                               ("MUFU.EX2 R4, R1", _hi(1, wb=0)),
                               ("MUFU.EX2 R5, R1", _hi(1, wb=1)),  # waits for the unit: 8 - 1
                               ("FADD R6, R4, R5", _hi(1, wait=0b11))]))
    r = S.simulate(ins)
    mufu = S.LATENCY["MUFU"]
    # FMUL at 0, MUFU at 3, MUFU at 11 (the unit), FADD when the second MUFU's result is ready
    assert (r.mufu, r.mufu_wait, r.fixed_wait) == (2, 7, 2)
    assert r.cycles == 11 + mufu + 1 and r.scoreboard_wait == 11 + mufu - 12


def test_walk_takes_and_flips_branches():
    rows = [("WARPGROUP.DEPBAR.LE gsb0, 0x1", _hi(1)), ("@!P0 BRA `(.L_x_2)", _hi(1)), ("FSEL R1, R1, -INF , P1", _hi(1)),
            ".L_x_2", ("@P1 BRA `(.L_x_3)", _hi(1)), ("FMUL R2, R2, R2", _hi(1)), ".L_x_3",
            ("MUFU.EX2 R3, R3", _hi(1)), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12], R3", _hi(1))]
    ins, labels = S.parse(_listing(rows))
    ops = lambda path: [i.op for i in path]  # noqa: E731
    assert ops(S.softmax_path(ins, labels)) == ["BRA", "BRA", "MUFU.EX2"]
    assert ops(S.softmax_path(ins, labels, frozenset({0}))) == ["BRA", "FSEL", "BRA", "MUFU.EX2"]
    assert ops(S.softmax_path(ins, labels, frozenset({1}))) == ["BRA", "BRA", "FMUL", "MUFU.EX2"]


def test_loop_path_spans_the_whole_iteration():
    rows = [("WARPGROUP.DEPBAR.LE gsb0, 0x0", _hi(1)), ("FMUL R1, R1, R2", _hi(1)), ("WARPGROUP.ARRIVE", _hi(1)),
            ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, gsb0", _hi(1)), ("IMAD.WIDE.U32 R4, R5, R6, RZ", _hi(1)),
            ("WARPGROUP.DEPBAR.LE gsb0, 0x1", _hi(1)), ("MUFU.EX2 R3, R3", _hi(1)),
            ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12], R3", _hi(1))]
    ins, labels = S.parse(_listing(rows))
    loop = [i.op for i in S.loop_path(ins, labels)]
    assert loop[0] == "WARPGROUP.DEPBAR.LE" and loop[-1] == "MUFU.EX2" and "IMAD.WIDE.U32" in loop and len(loop) == 7
    assert [S.pipe_of(i) for i in ins[1:7]] == ["other", "other", "other", "fmaheavy", "other", "mufu"]


def test_warps_share_the_issue_slot_and_the_pipes():
    # one warp: FFMA, MUFU (own stall 8), MUFU; alone 1 + 8 + 1 = 10 cycles to the last issue's end
    rows = [("FFMA R1, R1, R2, R3", _hi(1)), ("MUFU.EX2 R4, R1", _hi(8, wb=0)), ("MUFU.EX2 R5, R1", _hi(1, wb=1))]
    ins, _ = S.parse(_listing(rows))
    one = S.simulate_warps([ins])
    assert one.cycles == 10 and one.issue_slots == 3
    # two together: one issue a cycle (warp 0's FFMA at 0 and MUFU at 1, warp 1's FFMA at 2), and the four
    # MUFUs 8 cycles apart on the unit (at 1, 9, 17, 25), so the last warp is done at 26, not 10
    two = S.simulate_warps([ins, ins])
    assert two.pipe_busy["mufu"] == 4 * S.MUFU_INTERVAL and two.issue_slots == 6
    assert two.cycles == 1 + 3 * S.MUFU_INTERVAL + 1 and sorted(two.finish) == [1 + 2 * S.MUFU_INTERVAL + 1, two.cycles]
    # FMNMX on the 16-lane ALU pipe, one every 2 cycles: two warps' two each issue at 0, 2, 4, 6
    alu = S.parse(_listing([("FMNMX R1, R1, R2, !PT", _hi(1)), ("FMNMX R3, R3, R2, !PT", _hi(1))]))[0]
    r = S.simulate_warps([alu, alu])
    assert r.pipe_busy["alu"] == 8 and r.cycles == 7 and sorted(r.finish) == [3, 7]
    # a start offset delays that warp only
    late = S.simulate_warps([alu, alu], [0, 100])
    assert late.finish == [3, 103]
    # loose round robin alternates the warps where greedy-then-oldest keeps the one that issued last
    assert S.simulate_warps([alu, alu], policy="lrr").finish == [5, 7]
    assert S.simulate_warps([alu, alu], policy="gto").finish == [3, 7]


@pytest.mark.skipif(C.nvrtc_version() is None or C.nvdisasm_path() is None, reason="needs NVRTC and nvdisasm")
def test_default_hdim128_softmax(monkeypatch):
    """The steady-state softmax of the default hdim-128 build: every score's exponential on the MUFU
    unit (64 per thread, plus the two row factors) between the wait for S and the loop's next
    mbarrier wait, and more cycles than the unit's own pace."""
    from cupy_fmha.backends.cuda import fwd_ws_spec

    monkeypatch.delenv("CUPY_FMHA_FWD_WS_TILES", raising=False)
    ins, labels = S.parse(S.sass_hex(fwd_ws_spec("bf16", 128, 128)))
    r = S.simulate(S.softmax_path(ins, labels))
    assert r.mufu == 66 and r.cycles > S.MUFU_INTERVAL * r.mufu and r.instructions > 300
    edge = S.simulate(S.softmax_path(ins, labels, frozenset({0})))
    assert edge.instructions > r.instructions and edge.mufu == r.mufu
