"""The run-time path on an AMD GPU, on the CPU: cupy_fmha.spec routes a gfx target to the ROCm
backend (its gfx9 instances, 64-lane wavefronts), get_function compiles with hiprtc's options
through cupy-rocm's RawModule (a stand-in that records what it is given), and the GPU API, on a
stand-in cupy-rocm device, launches the gfx9 instances with their own block sizes and LDS. Nothing
here has run on an AMD GPU or with cupy-rocm: these check the host side only."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import cupy_fmha
from cupy_fmha import api
from cupy_fmha import compile as C
from cupy_fmha import spec as S
from cupy_fmha.backends import cuda, rocm
from fake_cupy import Recorder, fake_cupy


def test_target_of_the_device_property():
    assert rocm.target_of("gfx90a:sramecc+:xnack-") == "gfx90a"
    assert rocm.target_of(b"gfx942:sramecc+:xnack-") == "gfx942"
    assert rocm.target_of("gfx950") == "gfx950"
    with pytest.raises(ValueError, match="gfx1100"):
        rocm.target_of("gfx1100")


def test_spec_front_routes_gfx_targets_to_rocm():
    assert S.backend_for("gfx942") is rocm and S.backend_for(90) is cuda and S.backend_for(80) is cuda
    for t in rocm.TARGETS:
        f = S.fwd_spec("bf16", 128, 128, t, dropout=True, wg_skip=True)
        assert f == rocm.fwd_spec("bf16", 128, 128, t, dropout=True) and f.target == "gfx9"
        b = S.bwd_specs("fp16", 96, 96, t, alibi=True, deterministic=True)
        assert b.dq_dk_dv == rocm.bwd_spec("fp16", 96, 96, t, alibi=True)
        assert b.dq_dk_dv.macro("NTHREADS") == 64 * b.dq_dk_dv.macro("NWARPS")
        assert b.dot_do_o.macro("NTHREADS") == 64 * b.dot_do_o.macro("ROWS")  # one wavefront per row
        assert {x.target for x in (b.dot_do_o, b.convert_dq, b.convert_dq_split)} == {"gfx9"}
        assert b.convert_dq.macro("NTHREADS") == 256 and b.convert_dq_split.macro("DQ_SPLIT") == 1
        assert S.dropout_mask_spec(t).target == "gfx9" and not S.use_wg_skip(True, 1024, t)


def test_hiprtc_options():
    for t in rocm.TARGETS:
        b = rocm.bwd_specs("bf16", 128, 128, t, dropout=True)
        opts = rocm.compile_options(b.dq_dk_dv, t)
        assert opts[:3] == ("-std=c++17", "-O3", f"--offload-arch={t}")
        assert "-munsafe-fp-atomics" in opts and "-D__grid_constant__=" in opts
        assert f"-DNTHREADS={b.dq_dk_dv.macro('NTHREADS')}" in opts and "-DDROPOUT=1" in opts and "-DFMHA_BF16=1" in opts
        assert not any("FMHA_HIP_SHIM" in o for o in opts)
        assert "-DNTHREADS=512" in rocm.compile_options(b.dot_do_o, t)
    with pytest.raises(ValueError, match="target"):
        rocm.compile_options(b.dq_dk_dv, "gfx1100")
    # the offline check compiles with the shim and the same thread counts
    assert rocm.hip_defines(b.dot_do_o)[-2:] == ("NTHREADS=512", "FMHA_HIP_SHIM")


class _RawModule:
    """cupy.RawModule's stand-in: records its code and options; get_function names the entry."""

    made: list = []

    def __init__(self, code, options):
        _RawModule.made.append((code, tuple(options)))

    def get_function(self, name):
        return ("fn", name)


def _fake_module(cc: str, hip_arch: str | None):
    runtime = types.SimpleNamespace(is_hip=hip_arch is not None,
                                    getDeviceProperties=lambda i: {"gcnArchName": (hip_arch or "").encode()})
    return types.SimpleNamespace(
        RawModule=_RawModule,
        cuda=types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0, compute_capability=cc), runtime=runtime,
                                   compiler=types.SimpleNamespace(CompileException=RuntimeError)))


@pytest.mark.parametrize("hip_arch, cc", [("gfx90a:sramecc+:xnack-", "90"), ("gfx950:sramecc+:xnack-", "95"), (None, "90")])
def test_get_function_compiles_with_the_devices_compiler(monkeypatch, hip_arch, cc):
    """On cupy-rocm (runtime.is_hip) RawModule gets the self-contained source and hiprtc's options
    for the device's gfx target, whatever compute capability CuPy reports there ("90" on an MI200
    would be a Hopper); on CUDA the NVRTC options as before."""
    monkeypatch.setitem(sys.modules, "cupy", _fake_module(cc, hip_arch))
    monkeypatch.setattr(C, "_functions", {})
    _RawModule.made.clear()
    if hip_arch:
        target = rocm.target_of(hip_arch)
        spec = rocm.bwd_spec("bf16", 64, 64, target, bias=True)
        want = rocm.compile_options(spec, target)
    else:
        spec = cuda.bwd_specs("bf16", 64, 64, 90).dq_dk_dv
        want = C.nvrtc_options(spec, cuda.compile_arch(spec))
    assert C.get_function(spec) == ("fn", spec.entry)
    assert C.get_function(spec) == ("fn", spec.entry)  # memoized: one compile
    (code, options), = _RawModule.made
    assert code == C.load_source(spec.source) and options == want


@pytest.fixture
def rocm_rec(monkeypatch):
    monkeypatch.setattr(api, "_cupy", lambda: fake_cupy("94", hip_arch="gfx942:sramecc+:xnack-"))
    monkeypatch.setattr(api, "_CC", {})
    r = Recorder()
    monkeypatch.setattr(api, "get_function", r)
    return r


@pytest.mark.parametrize("deterministic", [False, True])
def test_api_launches_the_gfx9_instances(rocm_rec, deterministic):
    """A forward and a backward (GQA, causal, dropout) on a stand-in MI300: every launch is a gfx9
    instance for gfx942, with NTHREADS threads (64 per wavefront) and its layout's LDS; the main
    backward kernel covers the keys in blocks of 16 per wavefront."""
    rng = np.random.default_rng(1)
    b, sq, sk, hq, hk, d = 2, 70, 45, 4, 2, 64
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
    k = rng.standard_normal((b, sk, hk, d)).astype(np.float16)
    v = rng.standard_normal((b, sk, hk, d)).astype(np.float16)
    o, lse = cupy_fmha.attention_forward(q, k, v, causal=True, dropout_p=0.1, seed=3)
    cupy_fmha.attention_backward(o, q, k, v, o, np.zeros((b, hq, sq), np.float32), causal=True, dropout_p=0.1, seed=3,
                                 deterministic=deterministic)
    names = [x["spec"].source for x in rocm_rec.launches]
    assert names[:4] == ["fmha_fwd", "fmha_bwd_dot_do_o", "fmha_bwd_dq_dk_dv", "fmha_bwd_convert_dq"], names
    for x in rocm_rec.launches:
        spec = x["spec"]
        assert spec.target == "gfx9", spec.name
        assert x["block"] == (spec.macro("NTHREADS"), 1, 1) and x["smem"] == spec.macro("SMEM_BYTES", 0)
    fwd, dot, main = rocm_rec.launches[:3]
    assert fwd["spec"] == rocm.fwd_spec("fp16", d, d, "gfx942", dropout=True)
    assert main["spec"] == rocm.bwd_spec("fp16", d, d, "gfx942", dropout=True)
    assert dot["block"] == (512, 1, 1)
    bn = main["spec"].macro("BLOCK_N")
    assert bn == 16 * main["spec"].macro("NWARPS") and main["grid"] == (-(-sk // bn), hq, b)
    assert (int(main["args"]["dq_split_stride"]) != 0) == deterministic


def test_describe_names_the_gfx_target(monkeypatch):
    """`cupy-fmha info` on cupy-rocm (stand-in module): the gfx target next to the compute
    capability CuPy reports there."""
    from cupy_fmha import device

    props = {"name": b"AMD Instinct MI300X", "gcnArchName": b"gfx942:sramecc+:xnack-", "multiProcessorCount": 304,
             "totalGlobalMem": 192 * 2**30}
    runtime = types.SimpleNamespace(is_hip=True, runtimeGetVersion=lambda: 60400000, driverGetVersion=lambda: 60400000,
                                    getDeviceProperties=lambda i: props, getDeviceCount=lambda: 1)
    fake = types.SimpleNamespace(__version__="14.0.0", cuda=types.SimpleNamespace(
        runtime=runtime, Device=lambda *a: types.SimpleNamespace(id=0, compute_capability="94")))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    d = device.describe()
    assert d["gfx_target"] == "gfx942" and d["device"] == "AMD Instinct MI300X" and d["sm_count"] == 304
    props["gcnArchName"] = b"gfx1100"
    assert device.describe()["gfx_target"] == "gfx1100"  # named as HIP names it; no kernels for it


@pytest.mark.parametrize("cc, hip_arch, sm90", [("90", None, True), ("80", None, False), ("100", None, False),
                                                 ("90", "gfx90a:sramecc+:xnack-", False),
                                                 ("94", "gfx942:sramecc+:xnack-", False)])
def test_gpu_tests_know_sm90_from_rocm(monkeypatch, cc, hip_arch, sm90):
    """The GPU tests' sm_90 check (conftest.is_sm90, which the Hopper-only tests skip on) goes through
    the library's device key, so cupy-rocm's compute capability ("90" on gfx90a, "94" on gfx942) does
    not pass for sm_90 on an Instinct GPU."""
    import conftest
    from cupy_fmha import api

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(cc, hip_arch))
    monkeypatch.setattr(api, "_CC", {})
    assert conftest.is_sm90() is sm90
    assert conftest.device_key() == (hip_arch.split(":")[0] if hip_arch else int(cc))
