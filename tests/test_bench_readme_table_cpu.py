"""bench/readme_table.py without a GPU: the README's performance cells and summary ranges from sweep JSON,
the later file winning where two hold the same point, and passes kept apart."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
_spec = importlib.util.spec_from_file_location("_bench_readme_table", BENCH / "readme_table.py")
rt = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rt
_spec.loader.exec_module(rt)


def _point(seqlen, causal, mode, ours, flash, cudnn, dtype="bfloat16", hdim=128):
    return {"dtype": dtype, "hdim": hdim, "causal": causal, "seqlen": seqlen,
            "ours": {f"{mode}_tflops": ours}, "flash": {f"{mode}_tflops": flash}, "cudnn": {f"{mode}_tflops": cudnn}}


def _write(path: Path, points) -> Path:
    path.write_text(json.dumps({"meta": {}, "points": points}))
    return path


def test_cells_summary_and_later_file_wins(tmp_path):
    fwd = _write(tmp_path / "fwd.json", [_point(1024, False, "fwd", 500, 330, 625), _point(2048, False, "fwd", 600, 350, 600),
                                         _point(4096, False, "fwd", 660, 350, 600)])
    bwd_old = _write(tmp_path / "bwd-old.json", [_point(2048, False, "bwd", 100, 50, 400)])
    bwd = _write(tmp_path / "bwd.json", [_point(2048, False, "bwd", 520, 280, 500)])
    points = rt.load([fwd, bwd_old, bwd])
    rows = rt.table(points, "bfloat16", [1024, 2048])
    assert rows[2] == "| 128 | no | 1024 | **500** / 330 / 625 (0.80x) | - |"
    assert rows[3] == "| 128 | no | 2048 | **600** / 350 / 600 (1.00x) | **520** / 280 / 500 (1.04x) |"
    assert len(rows) == 4  # the 4096 row is not asked for
    lines = rt.summary(points)
    assert lines[0] == ("forward hdim 128 bfloat16 no mask: ours/cuDNN 1.00-1.10x from seqlen 2048, 0.80x below; "
                        "ours/flash 1.52-1.89x")
    assert lines[1].startswith("backward hdim 128 bfloat16 no mask: ours/cuDNN 1.04x from seqlen 2048, - below")


def test_missing_peer_prints_a_dash(tmp_path):
    p = _point(1024, True, "bwd", 300, None, 320)
    p["flash"] = {}
    points = rt.load([_write(tmp_path / "b.json", [p])])
    assert rt.table(points, "bfloat16", [1024])[2] == "| 128 | yes | 1024 | - | **300** / - / 320 (0.94x) |"
