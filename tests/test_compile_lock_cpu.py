"""The compile lock (``cupy_fmha.compile._compile_lock``): processes that need the same kernel at
once compile it once. CPU only: the lock is a file beside CuPy's disk cache."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cupy_fmha import compile as C

fcntl = pytest.importorskip("fcntl")

CODE, OPTS, ENTRY = "extern \"C\" __global__ void k() {}", ("-DHDIM=128", "--std=c++17"), "k"


def _locks(folder):
    return sorted(p.name for p in folder.glob("cupy_fmha-*.lock"))


def _held(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.delenv("CUPY_FMHA_COMPILE_LOCK", raising=False)
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    return tmp_path / "kc"


def test_lock_is_held_while_compiling_and_released_after(cache):
    with C._compile_lock(CODE, OPTS, ENTRY):
        (name,) = _locks(cache)  # the cache folder is created when missing
        assert _held(cache / name)
    assert not _held(cache / name)
    with C._compile_lock(CODE, OPTS, ENTRY):  # the same kernel: the same lock file
        assert _locks(cache) == [name] and _held(cache / name)


def test_other_kernels_take_other_locks(cache):
    with C._compile_lock(CODE, OPTS, ENTRY):
        (first,) = _locks(cache)
        for code, opts, entry in [(CODE + " ", OPTS, ENTRY), (CODE, OPTS[:1], ENTRY), (CODE, OPTS, "k2")]:
            with C._compile_lock(code, opts, entry):  # would wait forever if it shared the held lock
                pass
        assert len(_locks(cache)) == 4 and _held(cache / first)


@pytest.mark.parametrize("env", [{"CUPY_FMHA_COMPILE_LOCK": "0"}, {"CUPY_CACHE_IN_MEMORY": "1"}])
def test_switched_off(cache, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with C._compile_lock(CODE, OPTS, ENTRY):
        pass
    assert not cache.exists()


def test_unwritable_cache_folder_compiles_without_lock(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CUPY_CACHE_DIR", str(blocker / "kc"))  # a folder below a file: mkdir fails
    ran = False
    with C._compile_lock(CODE, OPTS, ENTRY):
        ran = True
    assert ran


def test_second_process_waits_for_the_first(cache):
    """A process holding the lock for 1.5 s makes this one wait for it (then it would find the
    binary in CuPy's disk cache instead of compiling it again)."""
    holder = (
        "import sys, time; from cupy_fmha import compile as C\n"
        f"with C._compile_lock({CODE!r}, {OPTS!r}, {ENTRY!r}):\n"
        "    print('held', flush=True); time.sleep(1.5)\n"
    )
    env = {**os.environ, "CUPY_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with C._compile_lock(CODE, OPTS, ENTRY):
            waited = time.monotonic() - t0
    finally:
        p.wait(timeout=30)
    assert p.returncode == 0
    assert waited > 1.0, waited
