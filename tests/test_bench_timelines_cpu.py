"""The TIMING probes' analysis (bench/probe/fwd_timeline.py, wide_timeline.py), without a GPU: their
`report` on made-up rows laid out as the kernels write them (kernels/fmha_fwd_sm90_ws.cu TL_*,
fmha_bwd_dq_dk_dv_sm90_ws_wide.cu WT_*), so a device session does not spend its time on a probe that
cannot print. The figures they return are checked against the rows' construction."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

PROBE = Path(__file__).resolve().parent.parent / "bench" / "probe"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_probe_{name}", PROBE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


fwd = _load("fwd_timeline")
wide = _load("wide_timeline")


def test_kernel_layouts_match_the_probes():
    src = (PROBE.parent.parent / "kernels" / "fmha_fwd_sm90_ws.cu").read_text()
    assert f"TL_ROWS = {fwd.ROWS}, TL_EVENTS = {fwd.EVENTS}, TL_AT = 8 + TL_ROWS, TL_PHASES = {len(fwd.PHASES)}" in src
    assert "TL_PH_AT = TL_AT + 3 * TL_ROWS * TL_EVENTS" in src and "TL_WORDS = TL_PH_AT + 3 * (TL_PHASES + 1)" in src
    src = (PROBE.parent.parent / "kernels" / "fmha_bwd_dq_dk_dv_sm90_ws_wide.cu").read_text()
    assert f"WT_PHASES = {len(wide.PHASES)}, WT_WORDS = 8 + 2 * WT_PHASES" in src


def _fwd_rows(ctas=300, blocks=8, per_block=2200, outside=(500, 2500, 1200, 600)):
    """Rows of CTAs with up to 4 row blocks of ``blocks`` key blocks; the loop takes ``per_block``
    cycles per key block, and each row block spends ``outside`` (Q wait, S_0 + softmax, last P V,
    O) outside it."""
    rng = np.random.default_rng(0)
    rows = []
    for c in range(ctas):
        a = np.zeros(fwd.WORDS, np.int64)
        nr = 4 if c % 10 else 3
        a[0], a[2], a[3], a[4], a[7] = 10**6 + (c // 132) * 50_000 + int(rng.integers(0, 500)), c % 132, nr, 1000, 2
        a[8:8 + nr] = blocks
        t = 1000 + 2000
        for r in range(nr):
            for w in range(2):
                base = t + 300 * w
                ev = [base, base + outside[0], base + outside[0] + outside[1]]
                ev.append(ev[2] + (blocks - 1) * per_block)
                ev += [ev[3] + outside[2], ev[3] + outside[2] + outside[3]]
                at = fwd.AT + (w * fwd.ROWS + r) * fwd.EVENTS
                a[at:at + fwd.EVENTS] = ev
            t = ev[5] - 300 + 100  # (warpgroup 0's O issued, then the next row block)
        for w in range(2):  # the loop's phases: (10, 20, ..., 70) + 5 w cycles per iteration
            at = fwd.PH_AT + w * (len(fwd.PHASES) + 1)
            a[at:at + len(fwd.PHASES)] = (np.arange(1, len(fwd.PHASES) + 1) * 10 + 5 * w) * nr * (blocks - 1)
            a[at + len(fwd.PHASES)] = nr * (blocks - 1)
        a[5] = t + 400
        a[1] = a[0] + int((a[5] - a[4]) / 1.98)
        rows.append(a)
    return np.array(rows)


def test_fwd_timeline_report():
    lines = []
    heads = fwd.report(_fwd_rows(), 1980.0, out=lines.append)
    assert heads["per_block"] == pytest.approx(2200 / 1980.0)
    # a row block: Q wait, S_0 + softmax, last P V, O and the 100-cycle gap, less the one block S_0 counts for
    want = (500 + 2500 + 1200 + 600 + 100 - 2200) / 1980.0
    assert heads["outside"][0] == pytest.approx(want, abs=0.01)
    assert any("warpgroup 1 minus warpgroup 0" in line and "+0.15" in line for line in lines), lines
    assert any(line.startswith("gap between CTAs") for line in lines)
    assert heads["phases"][0]["K, V landed"] == pytest.approx(10) and heads["phases"][1]["softmax"] == pytest.approx(75)
    assert any("warpgroup 1, cycles per loop iteration" in line and "sum 315" in line for line in lines), lines


def test_wide_timeline_report():
    rows = []
    for c in range(200):
        a = np.zeros(wide.WORDS, np.int64)
        n = 32
        a[:8] = (1000, 61000, c % 132, n, 0, 3000, 3000 + n * 6900, 3000 + n * 6900 + 4000)
        a[8:15] = np.array([100, 1100, 600, 900, 1600, 500, 700]) * n
        a[15:22] = np.array([120, 1100, 650, 800, 1600, 450, 650]) * n
        rows.append(a)
    lines = []
    res = wide.report(np.array(rows), 1980.0, out=lines.append)
    assert res[(0, "barrier 1")] == 900 and res[(1, "dQ staging")] == 650
    assert "tensor work at peak 2560 (37% of the loop)" in lines[0], lines[0]
