"""FlashAttention-3 as a benchmark peer (bench/fa3_peer.py, bench/sweep.py --peers ...,fa3), without
a GPU: the peer script's answer where JAX or the wheel is missing, its argument checks, its burst
timing arithmetic and head-dim gate, and the sweep's merge of its results into records, tables
and TFLOP/s."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


fa3 = _load("fa3_peer")
sweep = _load("sweep")

POINT = dict(dtype="bfloat16", hdim=128, causal=False, seqlen=4096, batch=4, nhead=16)


def _run(*args):
    return subprocess.run([sys.executable, str(BENCH / "fa3_peer.py"), *args], capture_output=True, text=True,
                          timeout=120)


def test_peer_without_jax_or_wheel_answers_unavailable(tmp_path):
    try:
        import flash_attn3_jax  # noqa: F401
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("JAX with the wheel and a GPU: the peer would time for real")
    except Exception:  # noqa: BLE001 - the case this test is about
        pass
    out = tmp_path / "fa3.json"
    done = _run("--points", json.dumps([POINT]), "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["available"] is False and doc["error"] and doc["results"] == []
    assert json.loads(out.read_text()) == doc


@pytest.mark.parametrize("args, what", [
    (["--points", "not json"], "--points"),
    (["--points", json.dumps([{**POINT, "dtype": "float32"}])], "dtype"),
    (["--points", json.dumps([{"dtype": "bfloat16"}])], "lacks"),
    (["--points", json.dumps([POINT]), "--modes", "sideways"], "--modes"),
])
def test_peer_rejects_bad_arguments(args, what):
    done = _run(*args)
    assert done.returncode == 2 and what in done.stderr, done.stderr


def test_burst_time_divides_by_the_burst(monkeypatch):
    calls, blocked = [], []
    clock = iter(range(0, 10**6, 10))  # perf_counter: +10 s per reading

    def call(x):
        calls.append(x)
        return x

    monkeypatch.setattr(fa3.time, "perf_counter", lambda: next(clock))
    t = fa3.burst_time(blocked.append, call, [(1,), (2,), (3,)], warmup=2, repeat=4, burst=5)
    monkeypatch.undo()
    assert len(calls) == 2 + 4 * 5 and len(blocked) == 1 + 4
    assert calls[:2] == [1, 2] and calls[2:7] == [1, 2, 3, 1, 2]  # inputs rotate
    assert t["samples"] == 4 and t["median_ms"] == t["min_ms"] == 10 / 5 * 1e3


def test_peer_answers_other_head_dims_with_an_error():
    r = fa3.measure(None, None, None, {**POINT, "hdim": 64}, {"fwd", "bwd"}, None)
    assert "head dim 128" in r["fwd_error"] and "head dim 128" in r["bwd_error"] and "fwd_ms" not in r


def test_sweep_merges_fa3_results():
    rec = {"dtype": "bfloat16", "hdim": 128, "causal": False, "seqlen": 4096, "batch": 4, "nhead": 16,
           "flops_fwd": 2 * 10**12, "flops_bwd": 5 * 10**12,
           "ours": {"fwd_ms": 4.0, "fwd_tflops": 500.0, "bwd_ms": 10.0, "bwd_tflops": 500.0}}
    results = {sweep.fa3_key("bfloat16", 128, False, 4096): {**POINT, "fwd_ms": 2.0, "bwd_error": "boom"}}
    entry = sweep.fa3_entry(results, rec, {"fwd", "bwd"})
    assert entry == {"fwd_ms": 2.0, "fwd_tflops": pytest.approx(1000.0), "bwd_error": "boom"}
    assert sweep.fa3_entry(results, {**rec, "seqlen": 1024}, {"fwd"}) is None
    rec["fa3"] = entry
    assert "fa3: fwd 1000, bwd ERR(boom)" in sweep.point_line(rec, {"fwd", "bwd"})
    from rich.console import Console

    buf = io.StringIO()
    sweep.print_tables(Console(file=buf, width=250), [rec], {"fwd"})
    text = buf.getvalue()
    assert "ours/fa3" in text and "0.50" in text


def test_sweep_run_fa3_reports_a_missing_peer():
    doc = sweep.run_fa3([sweep.Point("bfloat16", 128, True, 1024)], {"fwd"}, warmup=1, repeat=3, timeout=120)
    if doc.get("available"):
        pytest.skip("the peer is installed here")
    assert doc["available"] is False and doc["error"]


def test_sweep_without_a_gpu_stops_before_writing(tmp_path, monkeypatch):
    # every point would fail: the sweep says why and exits 2, leaving no JSON behind (it used to
    # print one CUDA error per point, write the file and exit 0)
    from typer.testing import CliRunner

    from cupy_fmha import device

    monkeypatch.setattr(device, "gpu_problem", lambda: "no NVIDIA driver or CUDA device found")
    res = CliRunner().invoke(sweep.app, ["--quick", "--out-dir", str(tmp_path), "--peers", ""])
    assert res.exit_code == 2, res.output
    assert "the sweep needs CuPy and a CUDA GPU: no NVIDIA driver" in res.output
    assert list(tmp_path.iterdir()) == []
