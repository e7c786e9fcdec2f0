"""What GPU (if any) this process can use, and a description of the environment.

Everything here works without a GPU and without CuPy: ``gpu_available()`` never raises, and
``describe()`` fills what it can and says what is missing.
"""

from __future__ import annotations

import functools
import os
import platform

__all__ = ["gpu_available", "gpu_problem", "describe"]


@functools.lru_cache(maxsize=1)
def gpu_problem() -> str | None:
    """Why this process cannot use a GPU, in a few words (``None`` when it can: CuPy imports, sees
    at least one CUDA device, and a tiny allocation and kernel run on it). Never raises; the answer
    is cached for the life of the process.

    The reasons: ``CUPY_FMHA_NO_GPU`` is set (``=1`` forces the answer, useful to run the NumPy
    backend on a machine that has a GPU); CuPy is not importable (with the install hint); no NVIDIA
    driver or CUDA device; or the CUDA runtime's own error.
    """
    if os.environ.get("CUPY_FMHA_NO_GPU", "").strip() not in ("", "0"):
        return "CUPY_FMHA_NO_GPU is set"
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - missing, or a broken install
        return f"CuPy is not importable ({type(exc).__name__}); install cupy-fmha[cuda13] (or [cuda12])"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device found"
        a = cupy.arange(4, dtype=cupy.float32)
        a += 1
        ok = float(a.sum()) == 10.0
        cupy.cuda.Device().synchronize()
    except Exception as exc:  # noqa: BLE001 - CUDA runtime errors of every kind
        return runtime_problem(exc)
    return None if ok else "a test kernel on the device gave a wrong sum"


def runtime_problem(exc: BaseException) -> str:
    """A CUDA runtime error as a reason for having no GPU. Without an NVIDIA driver the runtime
    answers "insufficient driver": not a hint to upgrade one, there is none."""
    text = str(exc)
    if "InsufficientDriver" in text or "NoDevice" in text:
        return "no NVIDIA driver or CUDA device found"
    return f"{type(exc).__name__}: {text}"


def gpu_available() -> bool:
    """True when :func:`gpu_problem` finds none. Never raises; cached with it."""
    return gpu_problem() is None


def _try(fn, default=None):
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return default


def _version_str(v: int | None) -> str | None:
    """CUDA encodes versions as 1000 * major + 10 * minor."""
    if not v:  # None, or 0 (no driver installed)
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def _nvrtc_version(cupy_mod) -> str | None:
    try:
        from . import compile as _compile

        return ".".join(str(x) for x in _compile.nvrtc_version())
    except Exception:  # noqa: BLE001 - compile.py may be missing or NVRTC absent
        pass
    if cupy_mod is None:
        return None
    v = _try(lambda: cupy_mod.cuda.nvrtc.getVersion())
    return ".".join(str(x) for x in v) if v else None


def _cache_dir() -> str:
    try:
        from . import compile as _compile

        return str(_compile.cache_dir())
    except Exception:  # noqa: BLE001
        return os.environ.get(
            "CUPY_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")
        )


def describe() -> dict:
    """A flat dict describing the device and the software stack.

    Keys: ``gpu_available``, ``device``, ``compute_capability``, ``sm_count``, ``memory_gib``,
    ``cupy``, ``cuda_runtime``, ``cuda_driver``, ``nvrtc``, ``kernel_cache_dir``, ``python``,
    ``numpy``, on ROCm ``gfx_target`` (e.g. ``"gfx942"``; an unsupported one as HIP names it) and,
    without a GPU, ``note``. Values that cannot be found are ``None``.
    """
    import numpy as np

    from . import __version__

    info: dict = {
        "cupy_fmha": __version__,
        "gpu_available": gpu_available(),
        "device": None,
        "compute_capability": None,
        "sm_count": None,
        "memory_gib": None,
        "cupy": None,
        "cuda_runtime": None,
        "cuda_driver": None,
        "nvrtc": None,
        "kernel_cache_dir": _cache_dir(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        import cupy
    except Exception as e:  # noqa: BLE001
        cupy = None
        info["note"] = f"CuPy not importable ({type(e).__name__}); only the numpy backend works"
    if cupy is not None:
        info["cupy"] = cupy.__version__
        rt = cupy.cuda.runtime
        info["cuda_runtime"] = _version_str(_try(rt.runtimeGetVersion))
        info["cuda_driver"] = _version_str(_try(rt.driverGetVersion))
    info["nvrtc"] = _nvrtc_version(cupy)
    if info["gpu_available"]:
        rt = cupy.cuda.runtime
        dev = cupy.cuda.Device()
        props = _try(lambda: rt.getDeviceProperties(dev.id), {}) or {}
        name = props.get("name", b"")
        info["device"] = name.decode() if isinstance(name, bytes) else str(name) or None
        info["device_id"] = dev.id
        info["device_count"] = _try(rt.getDeviceCount)
        cc = _try(lambda: dev.compute_capability)
        info["compute_capability"] = f"{cc[:-1]}.{cc[-1]}" if cc else None
        from .backends import rocm

        if rocm.is_hip(cupy):  # cupy-rocm: the gfx target picks the kernels, not the cc
            arch = props.get("gcnArchName", b"")
            info["gfx_target"] = _try(lambda: rocm.target_of(arch)) or (arch.decode() if isinstance(arch, bytes) else arch)
        info["sm_count"] = props.get("multiProcessorCount")
        total = props.get("totalGlobalMem") or _try(lambda: dev.mem_info[1])
        info["memory_gib"] = round(total / 2**30, 1) if total else None
        smem = props.get("sharedMemPerBlockOptin")
        info["max_shared_mem_per_block_kib"] = smem // 1024 if smem else None
    elif "note" not in info:
        info["note"] = f"no usable CUDA GPU found ({gpu_problem() or 'gpu_available() is False'}); only the numpy backend works"
    return info
