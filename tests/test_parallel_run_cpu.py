"""The ring attention launcher (cupy_fmha.parallel.run) on the CPU: process spawning, the unique
id travelling from rank 0 to every rank through pipes, NCCL_NVLS_ENABLE=0 in every child,
failures reported with the rank's traceback (with stand-ins for the NCCL id and communicator,
which need a GPU); the command line's argument errors; the timeline summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cupy_fmha.parallel import run as RUN


def fake_id():
    return ("uid", os.getpid())


def fake_comm(world_size, rank, unique_id, device):
    return types.SimpleNamespace(world_size=world_size, rank=rank, unique_id=unique_id, device=device)


def report(comm, extra):
    return {"rank": comm.rank, "world": comm.world_size, "uid": comm.unique_id, "device": comm.device,
            "nvls": os.environ.get("NCCL_NVLS_ENABLE"), "extra": extra, "pid": os.getpid()}


def fail_on_rank_1(comm):
    if comm.rank == 1:
        raise ValueError("planted failure")
    return comm.rank


def test_launch_passes_the_id_from_rank_0():
    res = RUN.launch(report, 3, ("x",), make_id=fake_id, make_comm=fake_comm, timeout=120)
    assert [r["rank"] for r in res] == [0, 1, 2] and all(r["world"] == 3 for r in res)
    assert [r["device"] for r in res] == [0, 1, 2]
    assert len({r["uid"] for r in res}) == 1 and res[0]["uid"][1] == res[0]["pid"]  # made by rank 0
    assert all(r["nvls"] == "0" for r in res) and all(r["extra"] == "x" for r in res)
    assert len({r["pid"] for r in res}) == 3 and os.getpid() not in {r["pid"] for r in res}


def test_launch_reports_a_failing_rank():
    with pytest.raises(RuntimeError, match=r"rank 1 failed:(.|\n)*ValueError: planted failure"):
        RUN.launch(fail_on_rank_1, 2, make_id=fake_id, make_comm=fake_comm, timeout=120)


def test_launch_argument_errors():
    with pytest.raises(ValueError, match="nproc"):
        RUN.launch(report, 0)
    with pytest.raises(TypeError, match="nproc"):
        RUN.launch(report, 1.5)
    with pytest.raises(ValueError, match="devices"):
        RUN.launch(report, 2, devices=[0, 0], make_id=fake_id, make_comm=fake_comm)
    for bad in ([-1], [0.7], ["a"]):  # (0.7 used to mean GPU 0, -1 to reach a rank process)
        with pytest.raises(ValueError, match="devices: expected non-negative int GPU ids"):
            RUN.launch(report, 1, devices=bad, make_id=fake_id, make_comm=fake_comm)
    with pytest.raises(TypeError, match="devices: expected a list of 1 GPU ids"):
        RUN.launch(report, 1, devices=5, make_id=fake_id, make_comm=fake_comm)


def test_launch_checks_timeout_before_starting(monkeypatch):
    """timeout="5" failed with "unsupported operand type(s) for +" after the ranks had started;
    a NaN timeout never expired, a negative one expired at the first wait."""
    import multiprocessing as mp

    def no_spawn(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp, "get_context", no_spawn)
    for bad, err in (("5", TypeError), (True, TypeError), (-5, ValueError), (0, ValueError),
                     (float("nan"), ValueError)):
        with pytest.raises(err, match="timeout: expected a number of seconds"):
            RUN.launch(report, 1, make_id=fake_id, make_comm=fake_comm, timeout=bad)


def test_launch_needs_a_gpu_per_rank(monkeypatch):
    monkeypatch.setattr(RUN, "_visible_gpus", lambda: 1)
    with pytest.raises(ValueError, match="need 2 visible GPUs, found 1"):
        RUN.launch(report, 2)


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "0"], "--nproc: expected at least 1"),
    (["--nproc", "2", "-s", "1002"], "--seqlen/--scheme"),
    (["--nproc", "1", "--nhead", "6", "--nhead-k", "4"], "--nhead-k"),
    (["--nproc", "1", "--repeat", "0"], "--repeat"),
    (["--nproc", "1", "-s", "8", "--hdim", "7"], "--hdim: head dim must be a multiple of 8"),
    (["--nproc", "1", "-s", "8", "--window=-5,3"], "--window: sizes must be >= -1"),
])
def test_cli_argument_errors(argv, message, capsys):
    assert RUN.main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_without_enough_gpus(monkeypatch, capsys):
    monkeypatch.setattr(RUN, "_visible_gpus", lambda: 0)
    assert RUN.main(["--nproc", "1", "-s", "1024"]) == 2
    assert "visible GPUs" in capsys.readouterr().err


def test_cli_window_with_an_unlimited_side():
    """--window -1,0 (-1 = unlimited, as the help says) failed in argparse with "argument
    --window: expected one argument": it took -1,0 for an option."""
    p = RUN.build_parser()
    assert p.parse_args(["--nproc", "2", "--window", "-1,0"]).window == (-1, 0)
    assert p.parse_args(["--nproc", "2", "--window", "-1,-1", "--no-causal"]).window == (-1, -1)
    assert p.parse_args(["--nproc", "2", "--window=3,-1"]).window == (3, -1)
    assert p.parse_args(["--window", "4,2", "--nproc", "2"]).window == (4, 2)


def test_cli_help():
    with pytest.raises(SystemExit) as ex:
        RUN.build_parser().parse_args(["--help"])
    assert ex.value.code == 0


def test_timeline_report():
    rows = [
        {"kind": "kv", "step": 1, "start_ms": 0.1, "end_ms": 0.9, "ms": 0.8},
        {"kind": "compute", "step": 0, "start_ms": 0.0, "end_ms": 1.0, "ms": 1.0},
        {"kind": "dkv", "step": 0, "start_ms": 1.0, "end_ms": 1.3, "ms": 0.3},
        {"kind": "compute", "step": 1, "start_ms": 1.2, "end_ms": 2.2, "ms": 1.0},
        {"kind": "dkv", "step": 1, "start_ms": 2.2, "end_ms": 2.5, "ms": 0.3},
    ]
    rep = RUN.timeline_report(rows)
    assert rep["compute_ms"] == [1.0, 1.0] and rep["gap_ms"] == [0.2] and rep["tail_ms"] == pytest.approx(0.3)
    assert rep["comm_total_ms"] == pytest.approx(1.4) and rep["exposed_ms"] == pytest.approx(0.5)
    assert rep["hidden_fraction"] == pytest.approx(1 - 0.5 / 1.4, abs=1e-4)
    assert RUN.timeline_report([])["hidden_fraction"] is None


# --------------------------------------------------------------------------- bench/context_parallel.py

BENCH = Path(__file__).resolve().parent.parent / "bench" / "context_parallel.py"


def _bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300)


def test_bench_plan_only(tmp_path):
    out = tmp_path / "plan.json"
    p = _bench("--plan-only", "--nproc", "4", "--seqlen", "131072", "--out", str(out))
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["plan"]
    zig = next(r for r in rows if r["scheme"] == "zigzag")
    con = next(r for r in rows if r["scheme"] == "contiguous")
    assert zig["ideal_over_actual"] == 1.0 and con["ideal_over_actual"] < 0.6  # causal: zigzag balanced
    assert all(c == [1, 1, 1, 1] for c in zig["calls"])
    assert "balance 1.0" in p.stdout


def test_bench_window_with_an_unlimited_side(tmp_path):
    """`--window -1,0` (as the CLI and run.py take it): plain argparse read -1,0 as an option and
    exited 2 with "expected one argument"."""
    out = tmp_path / "plan.json"
    p = _bench("--plan-only", "--nproc", "2", "--seqlen", "4096", "--window", "-1,0", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["plan"]


def test_bench_argument_errors():
    p = _bench("--nproc", "2", "--seqlen", "1002")
    assert p.returncode == 2 and "--seqlen/--scheme" in p.stderr
    p = _bench("--seqlen", "1024")
    assert p.returncode == 2 and "--nproc" in p.stderr  # a mode is required


def test_bench_local_without_gpu_says_so():
    from cupy_fmha.api import _cupy

    try:
        _cupy()
        pytest.skip("a GPU is usable here")
    except RuntimeError:
        pass
    p = _bench("--local", "2", "--seqlen", "1024")
    assert p.returncode == 2 and "no usable CUDA GPU" in p.stderr


def test_run_config_checks_types():
    """bool('no') is True: a string causal used to mean causal; a float seqlen passed."""
    with pytest.raises(ValueError, match="--causal: expected a bool, got 'no'"):
        RUN.RunConfig(causal="no").validate(1)
    with pytest.raises(ValueError, match="--seqlen: expected an integer, got 16.5"):
        RUN.RunConfig(seqlen=16.5).validate(1)



def test_run_config_refuses_what_the_ranks_would_fail_on():
    """A negative (or >= 2**64) --seed passed and made cupy.random.RandomState raise in every
    rank after the launch; nhead_k=2.0 reached the shapes (a float dimension), nhead_k=True meant
    one K/V head; check="no" meant checking."""
    for seed in (-1, 2 ** 64):
        with pytest.raises(ValueError, match="--seed: expected 0 <= seed < 2\\*\\*64"):
            RUN.RunConfig(seed=seed).validate(1)
    for hk in (2.0, True):
        with pytest.raises(ValueError, match="--nhead-k: expected an integer"):
            RUN.RunConfig(nhead_k=hk).validate(1)
    with pytest.raises(ValueError, match="--check: expected a bool, got 'no'"):
        RUN.RunConfig(check="no").validate(1)
    with pytest.raises(ValueError, match="--single: expected a bool"):
        RUN.RunConfig(single=1).validate(1)
    assert RUN.RunConfig(seed=2 ** 64 - 1, nhead_k=4).validate(2).nhead_k == 4
    assert RUN.main(["--nproc", "1", "-s", "8", "--seed", "-1"]) == 2
