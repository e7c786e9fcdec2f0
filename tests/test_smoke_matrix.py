"""bench/smoke_matrix.py without a GPU: the matrix's elementwise-bias points in group mode are
run by the CLI (they used to be refused with a usage error and counted as unsupported)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cupy_fmha.cli import app as cli

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def M():
    spec = importlib.util.spec_from_file_location("bench_smoke_matrix", BENCH / "smoke_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_matrix_has_group_mode_elementwise_bias(M):
    points = [(cmd, o) for cmd, o in M.matrix(quick=True, p_drops=(0.0,))
              if o["mode"] == "group" and o["bias"] == "e"]
    # fwd and bwd without dBias, bwd with it; per dtype, head dim and mask
    assert len(points) == 2 * 2 * 3 * 3
    assert {(cmd, o["dbias"]) for cmd, o in points} == {("fwd", False), ("bwd", False), ("bwd", True)}


@pytest.mark.parametrize("prec", ["fp16", "bf16"])
def test_group_mode_elementwise_bias_points_run_and_pass(M, prec):
    runner = CliRunner()
    ran = 0
    for index, (cmd, o) in enumerate(M.matrix(quick=True, p_drops=(0.0,))):
        if o["mode"] != "group" or o["bias"] != "e" or o["prec"] != prec or o["hdim"] != 64:
            continue
        args = M.cli_args(cmd, o, "numpy", index)
        res = runner.invoke(cli.app, args)
        assert res.exit_code != 2, ("refused", args, res.stderr)
        assert res.exit_code == 0, (args, res.stdout, res.stderr)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["valid"] is True and out["config"]["bias"] == "e:0"
        assert [c["name"] for c in out["checks"]][-1] == ("dbias" if o["dbias"] else ("lse" if cmd == "fwd" else "dv"))
        ran += 1
    assert ran == 9
