"""The ``cupy-fmha`` command line on the NumPy backend (no GPU needed), plus one GPU smoke run.

Every CPU test forces "no GPU" (``device.gpu_available`` patched to ``False``) so the results are
the same on machines with and without one.
"""

from __future__ import annotations

import dataclasses
import json
import numpy as np

import pytest
from typer.testing import CliRunner

from cupy_fmha import device, timing
from cupy_fmha.cli import app as cli
from cupy_fmha.cli import config, run

runner = CliRunner()

SMALL = ["-b", "2", "--nhead", "2", "-s", "48", "-d", "32", "--backend", "numpy"]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(device, "gpu_available", lambda: False)


def invoke(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


def assert_valid_line(res):
    assert res.exit_code == 0, (res.stdout, res.stderr)
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    assert lines[0].endswith("valid: y"), lines[0]
    return lines[0]


def assert_usage_error(res, *words):
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("cupy-fmha: error:"), err
    assert "Traceback" not in res.output
    for w in words:
        assert w in err, (w, err)


# ---------------------------------------------------------------------------------------------
# runs that must pass


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_small_run_is_valid(no_gpu, mode, dtype):
    line = assert_valid_line(invoke(mode, *SMALL, "--dtype", dtype))
    assert line.startswith(f"{mode} {dtype} bshd b=2 h=2/2 sq=48 sk=48 d=32/32")
    for name in ("o", "lse") if mode == "fwd" else ("dq", "dk", "dv"):
        assert f" {name} " in line
    assert "ms," in line and "TFLOP/s" in line and "GB/s" in line


@pytest.mark.parametrize(
    "mask_args",
    [
        ["--mask", "0"],
        ["--mask", "t"],
        ["--mask", "b"],
        ["--mask", "t:8,0"],
        ["--mask", "b:4,4"],
        ["--mask", "xt:16"],
        ["--mask", "xb:0"],
        ["--mask", "g:20,10"],
        ["--causal"],
        ["--window", "8,0"],
        ["--causal", "--window", "16,-1"],
    ],
)
def test_masks(no_gpu, mask_args):
    # sq != sk so top-left and bottom-right differ
    assert_valid_line(invoke("bwd", *SMALL, "--seqlen-k", 64, *mask_args))


@pytest.mark.parametrize("nhead_k", [1, 2])
def test_gqa_mqa(no_gpu, nhead_k):
    line = assert_valid_line(
        invoke("bwd", "-b", 1, "--nhead", 4, "--nhead-k", nhead_k, "-s", 32, "-d", 16,
               "--backend", "numpy", "--mask", "b")
    )
    assert f"h=4/{nhead_k}" in line


def test_bhsd_layout_and_hdim_v(no_gpu):
    line = assert_valid_line(
        invoke("bwd", *SMALL, "--layout", "bhsd", "--hdim-v", 16, "--seqlen-k", 40)
    )
    assert " bhsd " in line and "d=32/16" in line and "sk=40" in line


def test_scale_and_seed(no_gpu):
    assert_valid_line(invoke("fwd", *SMALL, "--scale", 0.05, "--seed", 7))


def test_json_output(no_gpu):
    res = invoke("bwd", *SMALL, "--nhead", 4, "--nhead-k", 2, "--json", "--mask", "t")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["mode"] == "bwd" and obj["backend"] == "numpy"
    assert obj["config"]["nhead"] == 4 and obj["config"]["nhead_k"] == 2
    assert [c["name"] for c in obj["checks"]] == ["dq", "dk", "dv"]
    assert all(c["ok"] for c in obj["checks"]) and obj["valid"] is True
    assert obj["timing"]["median_ms"] > 0 and obj["flops"] > 0 and obj["bytes"] > 0
    assert obj["checked"]["full"] is True


def test_large_problem_checks_a_subset(no_gpu, monkeypatch):
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    res = invoke("fwd", "-b", 3, "--nhead", 4, "--nhead-k", 2, "-s", 16, "-d", 8,
                 "--backend", "numpy", "--json")
    obj = json.loads(res.stdout)
    assert res.exit_code == 0 and obj["valid"] is True
    # first and last batch; first and last K/V head with their whole query-head groups
    assert obj["checked"] == {"batches": [0, 2], "heads_q": [0, 1, 2, 3], "full": False}
    res = invoke("fwd", "-b", 3, "--nhead", 6, "--nhead-k", 3, "-s", 16, "-d", 8,
                 "--backend", "numpy", "--json")
    assert json.loads(res.stdout)["checked"]["heads_q"] == [0, 1, 4, 5]
    res = invoke("fwd", "-b", 3, "--nhead", 6, "-s", 16, "-d", 8, "--backend", "numpy",
                 "--json", "--full-check")
    assert json.loads(res.stdout)["checked"]["full"] is True


def test_no_verify(no_gpu):
    res = invoke("fwd", *SMALL, "--no-verify")
    assert res.exit_code == 0
    assert res.stdout.strip().endswith("valid: -")


def test_repeat_and_warmup(no_gpu):
    res = invoke("fwd", *SMALL, "--warmup", 1, "--repeat", 3, "--json")
    obj = json.loads(res.stdout)
    assert obj["warmup"] == 1 and obj["repeat"] == 3 and obj["timing"]["samples"] == 3


def test_auto_backend_without_gpu_falls_back_with_notice(no_gpu):
    res = invoke("fwd", "-b", 1, "--nhead", 1, "-s", 16, "-d", 8)
    assert_valid_line(res)
    assert "[numpy]" in res.stdout
    notice = res.stderr.strip().splitlines()
    assert len(notice) == 1 and "numpy" in notice[0]


def test_failed_check_exits_nonzero(no_gpu, monkeypatch):
    from cupy_fmha import verify

    real = verify.compare

    def failing(*args, **kwargs):
        c = real(*args, **kwargs)
        if dataclasses.is_dataclass(c):
            return dataclasses.replace(c, ok=False)
        return c._replace(ok=False)

    monkeypatch.setattr(verify, "compare", failing)
    res = invoke("fwd", *SMALL)
    assert res.exit_code == 1
    assert res.stdout.strip().endswith("valid: n")


# ---------------------------------------------------------------------------------------------
# argument errors: one line on stderr, exit 2


@pytest.mark.parametrize(
    "args, words",
    [
        (["--dtype", "fp32"], ["--dtype"]),
        (["--layout", "sbhd"], ["--layout"]),
        (["--backend", "gpu"], ["--backend"]),
        (["--nhead", 3, "--nhead-k", 2], ["--nhead-k"]),
        (["--batch", 0], ["--batch"]),
        (["--batch", "abc"], ["--batch"]),
        (["--no-such-option"], ["--no-such-option"]),
        (["--mask", "zz"], ["--mask"]),
        (["--mask", "t", "--causal"], ["--mask"]),
        (["--window", "3"], ["--window"]),
        (["--window", "-5,0"], ["--window"]),
        (["--scale", "nan"], ["--scale"]),
        (["--hdim", 12], ["head dim"]),
        (["--hdim", 512], ["head dim"]),
        (["--repeat", 0], ["--repeat"]),
    ],
)
def test_bad_arguments(no_gpu, args, words):
    assert_usage_error(invoke("bwd", *SMALL, *args), *words)


def test_cupy_backend_without_gpu_is_a_clear_error(no_gpu):
    res = invoke("bwd", *SMALL[:-2], "--backend", "cupy")
    assert_usage_error(res, "--backend cupy", "GPU")


# ---------------------------------------------------------------------------------------------
# info, device, timing


def test_info_without_gpu(no_gpu):
    res = invoke("info")
    assert res.exit_code == 0, res.stderr
    assert "gpu_available" in res.stdout and "kernel_cache_dir" in res.stdout
    res = invoke("info", "--json")
    d = json.loads(res.stdout)
    assert d["gpu_available"] is False and "note" in d


def test_describe_keys():
    d = device.describe()
    for key in ("gpu_available", "device", "compute_capability", "sm_count", "memory_gib",
                "cupy", "cuda_runtime", "cuda_driver", "nvrtc", "kernel_cache_dir"):
        assert key in d
    assert isinstance(device.gpu_available(), bool)


def test_time_host_counts_and_rotation():
    calls = []
    t = timing.time_host(lambda x: calls.append(x), warmup=2, repeat=5, rotate=[(1,), (2,)])
    assert calls == [1, 2, 1, 2, 1, 2, 1]
    assert len(t.samples) == 5
    assert t.min_ms <= t.p20 <= t.median_ms <= t.p80 <= max(t.samples)
    with pytest.raises(ValueError, match="repeat"):
        timing.time_host(lambda: None, repeat=0)


def test_timing_percentiles():
    t = timing.Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.min_ms, t.p20, t.median_ms, t.p80) == pytest.approx((1.0, 1.8, 3.0, 4.2))


# ---------------------------------------------------------------------------------------------
# on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_cupy_backend_small(mode):
    if not device.gpu_available():
        pytest.skip("needs a CUDA GPU with CuPy")
    res = invoke(mode, "-b", 2, "--nhead", 4, "--nhead-k", 2, "-s", 128, "--seqlen-k", 160,
                 "-d", 64, "--mask", "b", "--backend", "cupy", "--warmup", 1, "--repeat", 3,
                 "--json")
    assert res.exit_code == 0, (res.stdout, res.stderr)
    obj = json.loads(res.stdout)
    assert obj["backend"] == "cupy" and obj["valid"] is True


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("bias", ["a", "a:0", "a:1"])
def test_alibi_bias_option(no_gpu, mode, bias):
    line = assert_valid_line(invoke(mode, "-b", 2, "--nhead", 4, "--nhead-k", 2, "-s", 24,
                                    "--seqlen-k", 17, "-d", 16, "--causal", "--bias", bias,
                                    "--backend", "numpy"))
    assert f"bias={'a:1' if bias == 'a:1' else 'a:0'}" in line


def test_alibi_with_subset_check(no_gpu, monkeypatch):
    # the reference's subset must take the matching slopes (batch and head) along
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    res = invoke("bwd", "-b", 3, "--nhead", 6, "--nhead-k", 3, "-s", 16, "-d", 8, "--bias", "a:1",
                 "--backend", "numpy", "--json")
    obj = json.loads(res.stdout)
    assert res.exit_code == 0 and obj["valid"] is True and obj["config"]["bias"] == "a:1"
    assert obj["checked"]["full"] is False


def test_alibi_slopes_differ_by_head_and_batch():
    s = config.alibi_slopes("a:1", 3, 4)
    assert s.shape == (3, 4) and s.dtype == np.float32
    assert len(np.unique(s)) == 12
    assert config.alibi_slopes("a:0", 3, 4).shape == (4,)
    assert config.alibi_slopes(None, 3, 4) is None
    cfg = config.build("fwd", batch=3, nhead=4, seqlen_q="8", hdim=8, bias="a:1")
    assert np.array_equal(cfg.alibi_slopes, s)


@pytest.mark.parametrize("bias, words", [("e:3", ["--bias", "e:2"]), ("x", ["--bias"]),
                                         ("a:2", ["--bias"])])
def test_bias_option_errors(no_gpu, bias, words):
    assert_usage_error(invoke("bwd", "-s", 8, "-d", 8, "--bias", bias, "--backend", "numpy"), *words)


# ---------------------------------------------------------------------------------------------
# group mode (variable-length sequences, layout thd)

GROUP = ["--mode", "group", "--nhead", "2", "-d", "32", "--backend", "numpy"]


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_group_mode_run_is_valid(no_gpu, mode, dtype):
    line = assert_valid_line(invoke(mode, *GROUP, "-s", "40,17,0,60", "--seqlen-k", "30,0,21,60",
                                    "--dtype", dtype))
    assert line.startswith(f"{mode} {dtype} thd b=4 h=2/2 sq=40,17,0,60 sk=30,0,21,60 d=32/32")


@pytest.mark.parametrize("mask_args", [["--mask", "t"], ["--mask", "b"], ["--mask", "t:8,0"],
                                       ["--mask", "b:4,4"], ["--causal"], ["--window", "6,2"]])
def test_group_mode_masks(no_gpu, mask_args):
    assert_valid_line(invoke("bwd", *GROUP, "-s", "25,0,40", "--seqlen-k", "0,33,19", *mask_args))


def test_group_mode_gqa_alibi_and_default_key_lengths(no_gpu):
    line = assert_valid_line(invoke("bwd", "--mode", "group", "--nhead", 4, "--nhead-k", 2, "-d", 16,
                                    "-s", "12,0,30", "--bias", "a:1", "--mask", "b", "--backend", "numpy"))
    assert "h=4/2 sq=12,0,30 sk=12,0,30" in line and "bias=a:1" in line


def test_group_mode_json_and_subset(no_gpu, monkeypatch):
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    res = invoke("bwd", "--mode", "group", "--nhead", 4, "--nhead-k", 2, "-d", 16, "-s", "9,0,20,7",
                 "--seqlen-k", "0,5,20,11", "--backend", "numpy", "--json", "--mask", "b")
    assert res.exit_code == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["valid"] is True and obj["seq_mode"] == "group" and obj["config"]["layout"] == "thd"
    assert obj["seqlens_q"] == [9, 0, 20, 7] and obj["seqlens_k"] == [0, 5, 20, 11]
    assert obj["config"]["batch"] == 4 and obj["config"]["seqlen_q"] == 20
    assert obj["checked"] == {"batches": [0, 3], "heads_q": [0, 1, 2, 3], "full": False}
    assert obj["flops"] > 0


def test_group_mode_flops_sum_the_sequences(no_gpu):
    from cupy_fmha import flops

    res = invoke("fwd", *GROUP, "-s", "10,0,7", "--seqlen-k", "5,4,7", "--json", "--mask", "b")
    obj = json.loads(res.stdout)
    want = sum(flops.attention_flops(1, 2, a, b, 32, 32, "b", "fwd") for a, b in ((10, 5), (0, 4), (7, 7)))
    assert obj["flops"] == want
# dropout


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_dropout_run_is_valid(no_gpu, mode):
    line = assert_valid_line(invoke(mode, *SMALL, "--mask", "t", "--p-drop", 0.2, "--drop-seed", 2**40 + 3,
                                    "--drop-offset", 2**64 - 5))
    assert " p_drop=0.2 " in line


def test_dropout_json_config(no_gpu):
    res = invoke("fwd", *SMALL, "--p-drop", 0.5, "--drop-seed", 9, "--drop-offset", 11, "--json")
    obj = json.loads(res.stdout)
    assert obj["valid"] is True
    assert (obj["config"]["p_drop"], obj["config"]["drop_seed"], obj["config"]["drop_offset"]) == (0.5, 9, 11)


def test_dropout_subset_check_uses_the_full_problems_masks(no_gpu, monkeypatch):
    # the keep mask depends on (batch, head): subset checks must key the reference as the
    # full problem does (batches 0, 2 and K/V heads 0, 2 of 3, with their query-head groups)
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    for mode in ("fwd", "bwd"):
        res = invoke(mode, "-b", 3, "--nhead", 6, "--nhead-k", 3, "-s", 24, "-d", 16, "--backend", "numpy",
                     "--json", "--p-drop", 0.3, "--drop-seed", 5, "--drop-offset", 2**64 - 7)
        obj = json.loads(res.stdout)
        assert res.exit_code == 0 and obj["valid"] is True, res.stdout
        assert obj["checked"] == {"batches": [0, 2], "heads_q": [0, 1, 4, 5], "full": False}


def test_dropout_subset_pieces_match_the_full_reference(monkeypatch):
    # the per-(batch, K/V head) reference pieces with moved offsets equal the full problem's
    from cupy_fmha import reference

    cfg = config.build("fwd", batch=3, nhead=6, nhead_k=3, seqlen_q="20", seqlen_k="28", hdim=16,
                       hdim_v=16, dtype="fp16", layout="bshd", mask="t", seed=1, p_drop=0.4,
                       drop_seed=2**33 + 1, drop_offset=2**64 - 3)
    cfg = config.with_backend(cfg, "numpy")
    inputs = run.make_inputs(cfg)
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    full = reference.attention_forward(inputs["q"], inputs["k"], inputs["v"], precision="low",
                                       **run.mask_kwargs(cfg), **run.dropout_kwargs(cfg))
    outs = {"o": full[0], "lse": full[1]}
    checks, checked = run.verify(cfg, inputs, outs, False)
    assert not checked["full"] and all(c.ok for c in checks), [str(c) for c in checks]
    # and a mask drawn with the wrong keying does fail the check
    wrong = reference.attention_forward(inputs["q"], inputs["k"], inputs["v"], precision="low",
                                        **run.mask_kwargs(cfg), **run.dropout_kwargs(cfg, offset=12345))
    checks, _ = run.verify(cfg, inputs, {"o": wrong[0], "lse": wrong[1]}, False)
    assert not checks[0].ok


@pytest.mark.parametrize(
    "args, words",
    [
        (["--mode", "group", "-s", "10,x"], ["--seqlen-q"]),
        (["--mode", "group", "-s", "10,-1"], ["--seqlen-q"]),
        (["--mode", "group", "-s", "0,0"], ["--seqlen-q", "non-empty"]),
        (["--mode", "group", "-s", "10,5", "--seqlen-k", "3"], ["--seqlen-k"]),
        (["--mode", "group", "-s", "10,5", "--seqlen-k", "0,0"], ["--seqlen-k", "non-empty"]),
        (["--mode", "group", "-b", "3", "-s", "10,5"], ["--batch"]),
        (["--mode", "group", "-s", "10,5", "--layout", "bshd"], ["--layout"]),
        (["-s", "10,5"], ["--seqlen-q", "--mode group"]),
        (["-s", "16", "--layout", "thd"], ["--layout", "--mode group"]),
        (["--mode", "ragged"], ["--mode"]),
        (["--mode", "group", "-s", "10,5", "--hdim", 12], ["head dim"]),
    ],
)
def test_group_mode_bad_arguments(no_gpu, args, words):
    assert_usage_error(invoke("bwd", "--nhead", 2, "-d", 32, "--backend", "numpy", *args), *words)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_cupy_backend_group_mode(mode):
    if not device.gpu_available():
        pytest.skip("needs a CUDA GPU with CuPy")
    res = invoke(mode, "--mode", "group", "--nhead", 4, "--nhead-k", 2, "-s", "100,37,0,250",
                 "--seqlen-k", "80,0,51,250", "-d", 64, "--mask", "b", "--bias", "a:1", "--backend", "cupy",
                 "--warmup", 1, "--repeat", 3, "--json")
    assert res.exit_code == 0, (res.stdout, res.stderr)
    obj = json.loads(res.stdout)
    assert obj["backend"] == "cupy" and obj["valid"] is True and obj["seq_mode"] == "group"
@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("bias, name", [("e", "e:0"), ("e:0", "e:0"), ("e:1", "e:1"), ("e:2", "e:2")])
def test_elementwise_bias_option(no_gpu, mode, bias, name):
    res = invoke(mode, "-b", 2, "--nhead", 4, "--nhead-k", 2, "-s", 24, "--seqlen-k", 17, "-d", 16,
                 "--mask", "t", "--bias", bias, "--backend", "numpy", "--json")
    assert res.exit_code == 0, (res.stdout, res.stderr)
    obj = json.loads(res.stdout)
    assert obj["valid"] is True and obj["config"]["bias"] == name and obj["config"]["dbias"] is False
    names = [c["name"] for c in obj["checks"]]
    assert names == (["o", "lse"] if mode == "fwd" else ["dq", "dk", "dv"])


@pytest.mark.parametrize("bias", ["e:0", "e:1", "e:2"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dbias_option(no_gpu, bias, dtype):
    line = assert_valid_line(invoke("bwd", "-b", 2, "--nhead", 2, "-s", 20, "--seqlen-k", 33, "-d", 16,
                                    "--dtype", dtype, "--mask", "b:5,3", "--bias", bias, "--dbias",
                                    "--backend", "numpy"))
    assert f"bias={bias}" in line and " dbias " in line


def test_dbias_subset_check(no_gpu, monkeypatch):
    # e:2: dBias is checked on the subset; e:0 / e:1 sum over batches and heads: the whole problem
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    for bias, full in (("e:2", False), ("e:1", True), ("e:0", True)):
        res = invoke("bwd", "-b", 3, "--nhead", 6, "--nhead-k", 3, "-s", 16, "-d", 8, "--bias", bias,
                     "--dbias", "--backend", "numpy", "--json")
        assert res.exit_code == 0, (res.stdout, res.stderr)
        obj = json.loads(res.stdout)
        assert obj["valid"] is True and obj["checked"]["full"] is full, (bias, obj["checked"])
        assert [c["name"] for c in obj["checks"]] == ["dq", "dk", "dv", "dbias"]
    # subset without dBias: the bias is sliced along the batches / heads it does not broadcast
    res = invoke("fwd", "-b", 3, "--nhead", 6, "-s", 16, "-d", 8, "--bias", "e:2", "--backend", "numpy",
                 "--json")
    obj = json.loads(res.stdout)
    assert res.exit_code == 0 and obj["valid"] is True and obj["checked"]["full"] is False


@pytest.mark.parametrize("bias", ["n", "a", "a:1"])
def test_dbias_needs_elementwise_bias(no_gpu, bias):
    assert_usage_error(invoke("bwd", "-s", 8, "-d", 8, "--bias", bias, "--dbias", "--backend", "numpy"),
                       "--dbias", "elementwise")


def test_dbias_is_not_a_forward_option(no_gpu):
    res = invoke("fwd", "-s", 8, "-d", 8, "--bias", "e", "--dbias", "--backend", "numpy")
    assert res.exit_code == 2 and "--dbias" in res.stderr


def test_elementwise_bias_draws():
    opts = dict(batch=2, nhead=4, seqlen_q="8", seqlen_k="5", hdim=16, dtype="bf16", layout="bshd",
                seed=7, bias="e:1")
    cfg = config.build("fwd", **opts)
    a = run.make_inputs(cfg)["bias"]
    assert a.shape == (1, 4, 8, 5) and a.dtype == np.dtype("bfloat16")
    assert np.array_equal(a, run.make_inputs(config.build("bwd", **opts))["bias"])  # same draws in both modes
    assert len(np.unique(a.astype(np.float32))) > 100
    kw = run.bias_kwargs(dataclasses.replace(cfg, dbias=True), {"bias": np.zeros((3, 4, 8, 5))}, [0, 2], [1, 3])
    assert kw["bias"].shape == (2, 2, 8, 5) and kw["return_dbias"] is True
    assert run.bias_kwargs(cfg, {"bias": np.zeros((1, 1, 8, 5))}, [0, 2], [1])["bias"].shape == (1, 1, 8, 5)


@pytest.mark.parametrize(
    "args, words",
    [
        (("--p-drop", 1.0), ("--p-drop",)),
        (("--p-drop", -0.5), ("--p-drop",)),
        (("--p-drop", 0.1, "--drop-seed", -1), ("--drop-seed",)),
        (("--p-drop", 0.1, "--drop-offset", 2**64), ("--drop-offset",)),
    ],
)
def test_dropout_bad_options(no_gpu, args, words):
    assert_usage_error(invoke("fwd", *SMALL, *args), *words)


# ---------------------------------------------------------------------------------------------
# elementwise bias in group mode: [.., max_seqlen_q, max_seqlen_k], each sequence its corner


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("bias, name", [("e", "e:0"), ("e:1", "e:1"), ("e:2", "e:2")])
def test_group_mode_elementwise_bias(no_gpu, mode, bias, name):
    extra = ["--dbias"] if mode == "bwd" else []
    res = invoke(mode, "--mode", "group", "--nhead", 4, "--nhead-k", 2, "-d", 16, "-s", "12,0,30,7",
                 "--seqlen-k", "9,5,0,21", "--mask", "b", "--bias", bias, *extra, "--backend", "numpy",
                 "--json")
    assert res.exit_code == 0, (res.stdout, res.stderr)
    obj = json.loads(res.stdout)
    assert obj["valid"] is True and obj["config"]["bias"] == name and obj["seq_mode"] == "group"
    names = [c["name"] for c in obj["checks"]]
    assert names == (["o", "lse"] if mode == "fwd" else ["dq", "dk", "dv", "dbias"])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mask_args", [[], ["--mask", "t:4,2"], ["--causal"]])
def test_group_mode_dbias_summary_line(no_gpu, dtype, mask_args):
    line = assert_valid_line(invoke("bwd", *GROUP, "-s", "25,0,40", "--seqlen-k", "0,33,19", "--dtype", dtype,
                                    "--bias", "e:2", "--dbias", *mask_args))
    assert "thd b=3" in line and "bias=e:2" in line and " dbias " in line


def test_group_mode_dbias_subset_check(no_gpu, monkeypatch):
    # e:2: the first and last sequence (bias sliced along the batch); e:0 / e:1 with dBias sum over
    # sequences and heads: the whole problem
    monkeypatch.setattr(run, "FULL_CHECK_LIMIT", 0)
    for bias, full in (("e:2", False), ("e:1", True), ("e:0", True)):
        res = invoke("bwd", "--mode", "group", "--nhead", 6, "--nhead-k", 3, "-d", 8, "-s", "9,0,20,7",
                     "--seqlen-k", "0,5,20,11", "--mask", "b", "--bias", bias, "--dbias", "--backend", "numpy",
                     "--json")
        assert res.exit_code == 0, (res.stdout, res.stderr)
        obj = json.loads(res.stdout)
        assert obj["valid"] is True and obj["checked"]["full"] is full, (bias, obj["checked"])
        if not full:
            assert obj["checked"]["batches"] == [0, 3]
        assert [c["name"] for c in obj["checks"]] == ["dq", "dk", "dv", "dbias"]
    for bias in ("e:0", "e:2"):  # the forward on a subset, the bias sliced where it does not broadcast
        res = invoke("fwd", "--mode", "group", "--nhead", 6, "-d", 8, "-s", "9,0,20,7", "--bias", bias,
                     "--backend", "numpy", "--json")
        obj = json.loads(res.stdout)
        assert res.exit_code == 0 and obj["valid"] is True and obj["checked"]["full"] is False


def test_group_mode_elementwise_bias_draws():
    opts = dict(nhead=4, nhead_k=2, seqlen_q="12,0,30", seqlen_k="9,5,21", hdim=16, seed=3,
                seq_mode="group")
    cfg = config.build("bwd", dtype="fp16", bias="e:2", dbias=True, **opts)
    assert cfg.bias_shape == (3, 4, 30, 21)  # the max lengths
    inputs = run.make_inputs(cfg)
    assert inputs["bias"].shape == (3, 4, 30, 21) and inputs["bias"].dtype == np.float16
    plain = run.make_inputs(dataclasses.replace(cfg, bias_shape=None))
    assert set(plain) == {"q", "k", "v", "do"}
    for n in plain:  # the bias has its own stream: q, k, v, dO are the same draws with or without it
        assert np.array_equal(plain[n], inputs[n])
    for kind, shape in (("e:0", (1, 1, 30, 21)), ("e:1", (1, 4, 30, 21))):
        c = config.build("fwd", dtype="bf16", bias=kind, **opts)
        assert c.bias_shape == shape


@pytest.mark.gpu
@pytest.mark.parametrize("bias", ["e:0", "e:2"])
def test_cupy_backend_group_mode_elementwise_bias(bias):
    if not device.gpu_available():
        pytest.skip("needs a CUDA GPU with CuPy")
    res = invoke("bwd", "--mode", "group", "--nhead", 4, "--nhead-k", 2, "-s", "100,37,0,250",
                 "--seqlen-k", "80,0,51,250", "-d", 64, "--mask", "b", "--bias", bias, "--dbias",
                 "--backend", "cupy", "--warmup", 1, "--repeat", 3, "--json")
    assert res.exit_code == 0, (res.stdout, res.stderr)
    obj = json.loads(res.stdout)
    assert obj["backend"] == "cupy" and obj["valid"] is True and obj["seq_mode"] == "group"
    assert [c["name"] for c in obj["checks"]] == ["dq", "dk", "dv", "dbias"]


@pytest.mark.parametrize("args, flag", [(("-d", 12), "--hdim"), (("-d", 16, "--hdim-v", 12), "--hdim-v")])
def test_head_dim_errors_name_the_option(no_gpu, args, flag):
    res = invoke("bwd", "-s", 16, "--nhead", 2, "--backend", "numpy", *args)
    assert_usage_error(res, flag)
    assert f"{flag} (" in (res.stderr or res.stdout)


# ---------------------------------------------------------------------------------------------
# the split: a frozen configuration built with the library's own checks


def test_config_is_frozen_and_uses_the_library_checks(monkeypatch):
    from cupy_fmha import validate

    calls = []
    for name in ("check_forward_inputs", "check_varlen_inputs", "check_bias", "check_alibi_slopes",
                 "check_dropout"):
        real = getattr(validate, name)
        monkeypatch.setattr(validate, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    cfg = config.build("bwd", batch=2, nhead=4, nhead_k=2, seqlen_q="32", hdim=16, bias="e:1",
                       mask="b:3,0", p_drop=0.1)
    assert calls == ["check_forward_inputs", "check_bias", "check_dropout"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch = 3
    assert cfg.bias_shape == (1, 4, 32, 32) and cfg.mask_spec.describe() == "b:3,0"
    calls.clear()
    config.build("fwd", nhead=2, seqlen_q="5,0,7", hdim=8, bias="a:1", seq_mode="group")
    assert calls == ["check_varlen_inputs", "check_alibi_slopes", "check_dropout"]


@pytest.mark.parametrize("msg, want", [
    ("mask: give either mask= or causal=/window_size=, not both",
     "--mask: give either --mask or --causal/--window, not both"),
    ("softmax_scale: 1e+300 is too large: softmax_scale * log2(e) must be finite",
     "--scale: 1e+300 is too large: scale * log2(e) must be finite"),
    ("q: seqlen 5 exceeds the kernels' limit", "--seqlen-q (q): seqlen 5 exceeds the kernels' limit"),
    ("max_seqlen_k: seqlen 5 exceeds", "--seqlen-k: seqlen 5 exceeds"),
    ("k: number of heads 2 must divide q's number of heads 3", "--nhead-k (k): number of heads 2 "
     "must divide q's number of heads 3"),
    ("dropout_p: expected a number in [0, 1), got 2", "--p-drop: expected a number in [0, 1), got 2"),
    ("something else: unchanged", "something else: unchanged"),
])
def test_library_names_become_option_names(msg, want):
    assert config.option_names(msg) == want


# ---------------------------------------------------------------------------------------------
# issue 9, item 11: what a new user hit without a GPU

GIB = 2**30


@pytest.fixture
def no_inputs(monkeypatch):
    """Every refusal must come before the inputs are drawn."""
    def drawn(cfg):
        raise AssertionError("inputs were drawn")

    monkeypatch.setattr(run, "make_inputs", drawn)


@pytest.fixture
def ram16(monkeypatch):
    from cupy_fmha.cli import memory

    monkeypatch.setattr(memory, "machine_memory", lambda: (16 * GIB, "this machine's RAM"))


@pytest.mark.parametrize("args", [
    ["bwd", "-s", 16384],
    ["fwd", "--seqlen-q", 65536, "--hdim", 128],
    ["bwd", "--bias", "e:2", "-s", 8192, "-b", 8],
])
def test_too_big_for_host_memory_is_refused_up_front(no_gpu, no_inputs, ram16, args):
    res = invoke(*args)
    assert_usage_error(res, "--backend numpy (no usable CUDA GPU found):", f"{args[0]} would need about",
                       "GiB of host memory", "(limit 8.0 GiB: 1/2 of this machine's RAM; --max-memory to override)")
    assert "using the numpy backend" not in res.stderr  # the one line is the refusal


def test_refusal_message_sizes(no_gpu, no_inputs, ram16):
    from cupy_fmha.cli import memory

    cfg = run.pick_backend(config.build("bwd", seqlen_q="16384", backend="numpy"))
    need = max(memory.host_need(cfg))
    assert 60 * GIB < need < 120 * GIB  # about 16 heads x 16384^2 x 4 bytes x 4.6 arrays
    res = invoke("bwd", "-s", 16384, "--backend", "numpy")
    assert f"about {need / GIB:.1f} GiB" in res.stderr


def test_max_memory_overrides_the_limit(no_gpu, ram16, monkeypatch):
    ran = []

    def fake_execute(cfg):
        ran.append(cfg)
        return run.Outcome(timing.Timing.from_samples([1.0]), None, None, None)

    monkeypatch.setattr(run, "execute", fake_execute)
    res = invoke("bwd", "-s", 16384, "--backend", "numpy", "--max-memory", 1000)
    assert res.exit_code == 0, res.stderr
    assert ran and ran[0].max_memory_gib == 1000
    # and a small limit refuses a small run, saying where the limit came from
    res = invoke("fwd", *SMALL, "--max-memory", 0.0001)
    assert_usage_error(res, "(limit 0.1 MiB: --max-memory)")
    assert "to override" not in res.stderr
    for bad in ("0", "-1", "nan", "inf"):
        assert_usage_error(invoke("fwd", *SMALL, "--max-memory", bad), "--max-memory")


def test_check_alone_too_big_says_no_verify_helps(no_gpu, no_inputs, monkeypatch):
    from cupy_fmha.cli import memory

    cfg = run.pick_backend(config.build("bwd", seqlen_q="1024", nhead=4, hdim=64, full_check=True,
                                        backend="numpy"))
    need_run, need_check = memory.host_need(cfg)
    assert need_check > need_run
    limit = (need_run + need_check) / 2 / GIB
    args = ("bwd", "-s", 1024, "--nhead", 4, "-d", 64, "--full-check", "--backend", "numpy",
            "--max-memory", limit)
    assert_usage_error(invoke(*args), "checking this bwd against the float64 reference", "--no-verify")
    monkeypatch.setattr(run, "execute", lambda cfg: run.Outcome(timing.Timing.from_samples([1.0]),
                                                                None, None, None))
    res = invoke(*args, "--no-verify")
    assert res.exit_code == 0 and res.stdout.strip().endswith("valid: -")


def test_kernel_limits_come_before_the_inputs(no_gpu, no_inputs):
    assert_usage_error(invoke("fwd", "-b", 100000, "--nhead", 1, "-s", 4096, "-d", 8),
                       "--batch (q): batch size 100000 exceeds the kernels' limit of 65535")
    assert_usage_error(invoke("fwd", "--nhead", 70000, "-s", 16, "-d", 8, "--backend", "numpy"),
                       "--nhead (q)", "65535")


def test_memory_error_is_one_line(no_gpu, monkeypatch):
    def oom(cfg):
        raise MemoryError("Unable to allocate 16.0 GiB")

    monkeypatch.setattr(run, "make_inputs", oom)
    assert_usage_error(invoke("fwd", *SMALL), "--backend numpy: ran out of host memory",
                       "Unable to allocate 16.0 GiB")


@pytest.mark.parametrize("args, words", [
    (["--window=9999999999999999999999,0"], ["--window:", "out of range"]),
    (["--mask", "t:9999999999999999999999,0"], ["--mask:", "out of range"]),
    (["--mask", "xt:9999999999999999999999"], ["--mask:", "out of range"]),
    (["--seed", "-1"], ["--seed:", "[0, 2**64)"]),
    (["-s", "99999999999999999999"], ["--seqlen-q (q):", "limit"]),
    (["--seqlen-k", "99999999999999999999"], ["--seqlen-k (k):", "limit"]),
    (["--scale", "1e300"], ["--scale:", "float32"]),
    (["--mask", "t", "--causal"], ["--mask: give either --mask or --causal/--window, not both"]),
    (["--mask", "b", "--window", "3,0"], ["--mask: give either --mask or --causal/--window"]),
    (["--warmup", "99999999999999999999999"], ["--warmup:", "100000"]),
    (["--repeat", "1000000000000"], ["--repeat:", "100000"]),
])
def test_item11_errors_name_the_option(no_gpu, no_inputs, args, words):
    res = invoke("fwd", *SMALL, *args)
    assert_usage_error(res, *words)
    assert "mask=" not in res.stderr and "causal=" not in res.stderr


def test_group_mode_huge_lengths_name_the_option(no_gpu, no_inputs):
    assert_usage_error(invoke("fwd", *GROUP, "-s", "99999999999999999999,3"), "--seqlen-q", "int32")
    assert_usage_error(invoke("fwd", *GROUP, "-s", "2000000000,3"), "--seqlen-q", "limit")


@pytest.mark.parametrize("mask, shown", [("xt:0", "t"), ("xb:-3", "b"), ("1", "t"), ("2", "b"),
                                         ("xt:5", "t:2,2")])
def test_mask_strings_keep_cks_meaning(no_gpu, mask, shown):
    line = assert_valid_line(invoke("fwd", *SMALL, "--seqlen-k", 64, "--mask", mask))
    assert f" mask={shown} " in line


def _help(*args):
    res = runner.invoke(cli.app, [*args, "--help"], env={"COLUMNS": "240", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("cmd", ["fwd", "bwd"])
def test_help_shows_choices_and_defaults_not_bool(cmd):
    text = _help(cmd)
    assert "<bool>" not in text and "<str>  " not in text.split("--dtype")[1].split("\n")[0]
    for choices in ("<fp16|bf16>", "<bshd|bhsd|thd>", "<auto|cupy|numpy>", "<batch|group>"):
        assert choices in text, choices
    for default in ("[default: bf16]", "[default: auto]", "[default: (1/sqrt(hdim))]",
                    "[default: (5 on cupy, 0 on numpy)]", "[default: (20 on cupy, 1 on numpy)]",
                    "[default: (--nhead)]", "[default: (--hdim)]", "[default: (0, no mask)]",
                    "1/2 of this machine's RAM", "--max-memory", "w <= 0 is causal"):
        assert default in text, default
    assert "<bool>" not in _help() and "<bool>" not in _help("info")


def test_no_command_is_a_usage_error():
    res = runner.invoke(cli.app, [])
    assert res.exit_code == 2
    assert "Usage" in res.stderr and "fwd" in res.stderr and res.stdout == ""


def test_no_gpu_notice_is_plain(no_gpu):
    res = invoke("fwd", "-b", 1, "--nhead", 1, "-s", 16, "-d", 8)
    assert res.exit_code == 0
    notice = res.stderr.strip()
    assert notice == "cupy-fmha: no usable CUDA GPU found: using the numpy backend (the NumPy reference; slow)"
    res = invoke("fwd", "-b", 1, "--nhead", 1, "-s", 16, "-d", 8, "--backend", "cupy")
    assert_usage_error(res, "--backend cupy: no usable CUDA GPU was found")
    assert "driver" not in res.stderr.lower()


def test_bad_choice_message_is_plain():
    res = invoke("bwd", "--dtype", "fp32")
    assert_usage_error(res, "--dtype", "'fp32'")
    assert "Value error" not in res.stderr


def test_backend_cupy_without_cupy_says_so(no_gpu, monkeypatch):
    # a plain `pip install -e .` has no CuPy: the refusal names that and the extra to install, not
    # a missing GPU
    real = run.importlib.util.find_spec
    monkeypatch.setattr(run.importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a))
    res = invoke("fwd", "-b", 1, "--nhead", 1, "-s", 16, "-d", 8, "--backend", "cupy")
    assert_usage_error(res, "--backend cupy: no usable CUDA GPU was found (CuPy is not installed; "
                            "install cupy-fmha[cuda13]")


def test_gpu_problem_names_the_switch(monkeypatch):
    monkeypatch.setenv("CUPY_FMHA_NO_GPU", "1")
    device.gpu_problem.cache_clear()
    try:
        assert device.gpu_problem() == "CUPY_FMHA_NO_GPU is set" and device.gpu_available() is False
    finally:
        monkeypatch.delenv("CUPY_FMHA_NO_GPU")
        device.gpu_problem.cache_clear()


def test_refusal_imports_neither_cupy_nor_ml_dtypes():
    # importing CuPy or ml_dtypes takes seconds each on a small machine: the up-front refusal of
    # a too-big numpy run must not need them
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cupy_fmha.cli.app import main\n"
        "sys.argv = ['cupy-fmha', 'bwd', '-s', '16384', '--backend', 'numpy', '--max-memory', '1']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, [m for m in ('cupy', 'ml_dtypes') if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.strip() == "2 []", (res.stdout, res.stderr)
    assert "would need about" in res.stderr


def test_unwritable_output_is_one_line(monkeypatch, capsys):
    """A full disk (`> /dev/full`) while writing the result: one line on stderr, exit 1, no traceback."""
    import errno

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli, "app", full)
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 1
    assert capsys.readouterr().err.strip() == "cupy-fmha: cannot write the output: No space left on device"


def test_python_m_cupy_fmha_cli_runs_the_app():
    # `python -m cupy_fmha.cli` works like the `cupy-fmha` console script (no installed script needed)
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "cupy_fmha.cli", "fwd", "--warmup", "-1"],
                         capture_output=True, text=True)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.strip() == "cupy-fmha: error: --warmup: must be in [0, 100000], got -1"
