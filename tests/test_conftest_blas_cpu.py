"""tests/conftest.py's BLAS-pool share under pytest-xdist (``_share_blas_threads``): each worker starts
with ``OPENBLAS_NUM_THREADS`` (and the OpenMP / MKL counts) at its share of the cores, also where a
plugin imports NumPy before the conftest (it then cannot set them itself: OpenBLAS has loaded), so
the controller sets them before it starts the workers. On the GPU machine a worker's OpenBLAS had
kept all 16 threads (2026-12-06: ~13 busy threads in each of the 16 workers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parent
PROBE = '''
import os
def test_env():
    got = {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    assert os.environ.get("PYTEST_XDIST_WORKER"), "not in a worker"
    assert got == dict.fromkeys(got, os.environ["EXPECT"] or None), got
'''


def _run(tmp_path, expect: str | None, **env_extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    # (the outer run's xdist variables go too: this test may itself run in a worker)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")
           and k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUPY_FMHA_TEST_BLAS_THREADS")}
    env.update(env_extra, EXPECT=expect or "", PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
    # -p numpy: a plugin that imports NumPy first; -p conftest: this suite's conftest, loaded as a plugin
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "numpy",
                           "-p", "conftest", "-n", "2", "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_workers_get_their_share_even_after_numpy(tmp_path):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    r = _run(tmp_path, str(max(1, cores // 2)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.parametrize("want, expect", [("3", "3"), ("0", None)])
def test_switch(tmp_path, want, expect):
    r = _run(tmp_path, expect, CUPY_FMHA_TEST_BLAS_THREADS=want)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
