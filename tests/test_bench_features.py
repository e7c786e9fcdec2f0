"""bench/features.py without a GPU: row keywords, the "not available" detection, the records."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def F():
    spec = importlib.util.spec_from_file_location("bench_features", BENCH / "features.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_features"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_missing_keywords(F):
    def api(q, *, causal=False, deterministic=False):
        return q

    assert F.missing_keywords(api, {"causal": True, "deterministic": True}) == []
    assert F.missing_keywords(api, {"dropout_p": 0.1, "causal": True}) == ["dropout_p"]
    assert F.missing_keywords(lambda q, **kw: q, {"anything": 1}) == []
    assert F._unknown_keyword_error(TypeError("f() got an unexpected keyword argument 'bias'"))
    assert not F._unknown_keyword_error(ValueError("bias: bad shape"))


def test_rows_and_records(F):
    names = [r["name"] for r in F.ROWS]
    assert names[:2] == ["plain", "deterministic"]
    assert {"varlen", "dropout p=0.1", "alibi"} <= set(names) and any(n.startswith("bias") for n in names)
    assert F.row_kwargs(F.ROWS[1], "fwd") is None and F.row_kwargs(F.ROWS[1], "bwd") == {"deterministic": True}
    p = F.Problem("bfloat16", 4, 16, 4096, 128, False)
    res = {
        "plain": {"status": "ok", "fwd": {"median_ms": 2.0}, "bwd": {"median_ms": 4.0}},
        "deterministic": {"status": "ok", "fwd": None, "bwd": {"median_ms": 6.0}, "note": ""},
        "varlen": {"status": "not available", "fwd": None, "bwd": None, "note": "API lacks: cu_seqlens_q"},
    }
    recs = {r["row"]: r for r in F.build_records(p, res)}
    assert recs["plain"]["bwd_vs_plain"] == 1.0 and recs["deterministic"]["bwd_vs_plain"] == 1.5
    assert recs["deterministic"]["fwd_ms"] is None
    assert recs["plain"]["fwd_tflops"] == pytest.approx(4 * 4 * 16 * 4096**2 * 128 / 2e-3 / 1e12)
    assert recs["varlen"]["status"] == "not available"
    F.print_table(p, list(recs.values()))


def test_list_runs_without_a_gpu():
    root = BENCH.parent
    res = subprocess.run([sys.executable, str(BENCH / "features.py"), "--list"], capture_output=True, text=True,
                         cwd=root, timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("plain:") and lines[0].endswith("available")
    assert any(x.startswith("deterministic:") and x.endswith("| available") for x in lines)
