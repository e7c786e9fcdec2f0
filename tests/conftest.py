"""Shared pytest setup: ``gpu``-marked tests are skipped cleanly without CuPy or a CUDA device."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """``None`` when CuPy imports and sees at least one device, else why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library failing to load
        return f"CuPy not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    if n <= 0:
        return "no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def require_gpu():
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a GPU: {reason}")
