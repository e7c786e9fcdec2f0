"""The examples in ``examples/`` without a GPU: the JAX transformer trains a few steps with JAX's
own attention on the CPU backend and writes its JSON; its cupy-fmha model traces (two
buffer_callbacks per layer); the plot mode reads two JSONs; the CuPy example's float64
gradient check passes and both scripts refuse a GPU run here with a plain message."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TINY = ["--steps", "3", "--batch", "2", "--seq", "32", "--layers", "1", "--dmodel", "32", "--heads", "1",
        "--warmup", "1", "--eval-batches", "0", "--log-every", "1"]


def _run(*args, timeout=180):
    # XLA's CPU compiler without its expensive LLVM passes: the tiny train step compiles in a
    # few seconds instead of ~10 (the timeout is for a CI machine shared with other work)
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def test_jax_example_trains_on_cpu_and_writes_json(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "run.json"
    res = _run(EXAMPLES / "jax_transformer.py", "--attention", "jax", "--optimizer", "builtin", *TINY, "--out", out)
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(out.read_text())
    assert r["attention"] == "jax" and r["config"]["steps"] == 3 and r["config"]["seq"] == 32
    assert len(r["losses"]) == 3 and len(r["step_s"]) == 3
    assert all(3.0 < x < 7.0 for x in r["losses"])  # near ln(256) = 5.55 at the start
    assert r["median_step_s"] > 0 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
    assert r["median_step_s"] == pytest.approx(statistics.median(r["step_s"][1:]))  # after 1 warm-up step
    assert r["optimizer"] == "builtin adamw" and r["eval_loss"] is None  # --eval-batches 0

    b = tmp_path / "b.json"
    r2 = dict(r, median_step_s=2 * r["median_step_s"], losses=[x + 0.25 for x in r["losses"]])
    b.write_text(json.dumps(r2))
    png = tmp_path / "loss.png"
    res = _run(EXAMPLES / "jax_transformer.py", "--plot", out, b, "--png", png)
    if res.returncode == 2 and "needs matplotlib" in res.stderr:
        assert "Traceback" not in res.stderr and "max |loss difference|" in res.stdout  # the table came first
        pytest.skip("matplotlib is not installed")
    assert res.returncode == 0, res.stdout + res.stderr
    assert png.stat().st_size > 1000
    assert "max |loss difference|" in res.stdout and "0.2500" in res.stdout and "2.000" in res.stdout


def test_jax_example_counts_the_warm_up_it_left_out():
    # fewer steps than --warmup: the median is the last step's, after the others (it used to say
    # "after 5 warm-up" for a 2-step run)
    pytest.importorskip("jax")
    args = [a if a != "3" else "2" for a in TINY[:2]] + TINY[2:]
    args[args.index("--warmup") + 1] = "5"
    res = _run(EXAMPLES / "jax_transformer.py", "--attention", "jax", "--optimizer", "builtin", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "over 1 steps after 1 warm-up" in res.stdout, res.stdout


def test_jax_example_cupy_model_traces():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import jax_transformer as T
    finally:
        sys.path.remove(str(EXAMPLES))
    args = T.parse_args(["--layers", "2", "--dmodel", "128", "--heads", "2", "--seq", "64", "--steps", "3",
                         "--optimizer", "builtin"])
    init, loss_fn = T.make_model(jax, jnp, args, "cupy", "auto")
    _, opt_init, opt_update = T.make_optimizer(jax, jnp, args)

    def step(p, s, t, y):
        loss, g = jax.value_and_grad(loss_fn)(p, t, y)
        return (*opt_update(g, s, p), loss)

    params = jax.eval_shape(init, jax.random.PRNGKey(0))
    state = jax.eval_shape(opt_init, params)
    tok = jax.ShapeDtypeStruct((2, 64), jnp.int32)
    text = str(jax.make_jaxpr(step)(params, state, tok, tok))
    assert text.count("buffer_callback") == 4  # forward and backward of each of the 2 layers


@pytest.mark.skipif(_has_gpu(), reason="checks the message given without a GPU")
def test_gpu_runs_are_refused_with_a_message():
    res = _run(EXAMPLES / "cupy_train_step.py", "--steps", "1")
    assert res.returncode != 0 and "--device cpu" in res.stderr
    pytest.importorskip("jax")
    res = _run(EXAMPLES / "jax_transformer.py", "--attention", "cupy", *TINY)
    assert res.returncode != 0 and "needs a CUDA GPU" in res.stderr


def test_cupy_example_gradient_check_float64():
    res = _run(EXAMPLES / "cupy_train_step.py", "--check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(" ok") >= 6 and "FAIL" not in res.stdout


def test_cupy_example_trains_on_cpu():
    res = _run(EXAMPLES / "cupy_train_step.py", "--device", "cpu", "--steps", "60", "--batch", "8", "--seq", "8",
               "--heads", "1", "--hdim", "16", "--vocab", "8", "--lr", "1e-2", "--log-every", "20")
    assert res.returncode == 0, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    first, final = (float(x) for x in last.split(",")[0].removeprefix("loss ").split(" -> "))
    assert final < 0.7 * first, last
