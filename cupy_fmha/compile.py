"""Kernel sources, NVRTC options, the per-device compile cache, and the offline compile check.

Sources live in ``kernels/`` (package ``cupy_fmha.kernels``). Local ``#include "x.cuh"`` lines
are expanded here, so the text handed to NVRTC is self-contained: CuPy's on-disk cache
(``CUPY_CACHE_DIR``) keys on that text and the options, so editing a header can never leave a
stale binary behind. Compiled functions are also memoized per (spec, device) in this process, and
processes that need the same kernel at once compile it once (a file lock beside the cache).

Without a GPU, :func:`offline_compile` drives NVRTC directly (``cupy.cuda.nvrtc``) to build a
cubin for a named architecture and returns ptxas's resource report (registers, spills, shared
memory), which CI uses to reject any kernel that spills to local memory; where ``nvdisasm`` is
installed (the ``nvidia-cuda-nvdisasm`` wheel, in the test extra), also the number of generic
loads and stores in the machine code (:attr:`CompileReport.generic_accesses`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .spec import KernelSpec

__all__ = [
    "kernel_dir",
    "load_source",
    "expand_includes",
    "nvrtc_options",
    "get_function",
    "cache_dir",
    "nvrtc_version",
    "offline_compile",
    "CompileReport",
    "disassemble",
    "sass_instructions",
]

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def kernel_dir() -> Path:
    """Directory holding the ``.cu``/``.cuh`` sources: ``kernels/`` next to the package in a
    source checkout (so a second checkout or git worktree on ``PYTHONPATH`` uses its own kernels,
    not those of the editable install), else the installed ``cupy_fmha.kernels`` package data."""
    src = Path(__file__).resolve().parent.parent / "kernels"
    if (src / "common.cuh").is_file():
        return src
    return Path(str(resources.files("cupy_fmha.kernels")))


@functools.lru_cache(maxsize=None)
def load_source(stem: str) -> str:
    """Source of ``kernels/<stem>.cu`` with local includes expanded (each header once), so the text
    is self-contained. An include names a path relative to the including file's folder
    (``arch/arch.cuh`` from ``kernels/``, ``../../common.cuh`` from ``kernels/arch/sm80/``). The
    expansion does not evaluate ``#if``: a header that appears first inside a conditional block
    (``arch/arch.cuh``'s CUDA or HIP branch) is missing from the other branch, so shared headers
    must first be included outside such blocks."""
    return _expand(kernel_dir().resolve() / f"{stem}.cu", set())


def expand_includes(text: str) -> str:
    """``text`` (a kernel source outside ``kernels/``, e.g. a test's probe kernel) with its local
    includes expanded as :func:`load_source` does, each resolved against ``kernels/``."""
    done: set[Path] = set()
    base = kernel_dir().resolve()
    return _INCLUDE.sub(lambda m: _expand(base / m.group(1), done), text)


def _expand(path: Path, done: set) -> str:
    path = path.resolve()
    if path in done:
        return ""
    done.add(path)
    text = path.read_text().replace("#pragma once", "")
    return _INCLUDE.sub(lambda m: _expand(path.parent / m.group(1), done), text)


def nvrtc_options(spec: KernelSpec, arch: str | None = None) -> tuple[str, ...]:
    """NVRTC options for ``spec`` (its backend's); ``arch`` like ``sm_90a`` (omit to let CuPy
    pick the device's)."""
    from .backends import cuda

    return cuda.compile_options(spec, arch)


def cache_dir() -> Path:
    """Where CuPy keeps compiled kernels (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``)."""
    return Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))


def nvrtc_version() -> tuple[int, int] | None:
    """NVRTC (major, minor), or None when NVRTC cannot be loaded."""
    try:
        from cupy.cuda import nvrtc

        return tuple(nvrtc.getVersion())
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None


_functions: dict = {}


@contextlib.contextmanager
def _host_lock(path: Path):
    """Hold an exclusive ``flock`` on the file ``path`` (created if missing) for the ``with`` block:
    one holder at a time among the processes and threads of this host. Where that is not possible
    (no ``fcntl``, a folder that cannot be written) the block runs without the lock."""
    fd = None
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):  # no lock
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # (closing the last descriptor releases the lock)


@contextlib.contextmanager
def _compile_lock(code: str, options: tuple[str, ...], entry: str):
    """Hold the :func:`_host_lock` named after one kernel's source and options, in
    :func:`cache_dir`, while it is compiled and loaded.

    Processes on one host that need the same kernel at once (pytest-xdist workers, one process per
    GPU) would each run NVRTC on it; with the lock the first compiles and writes CuPy's disk cache,
    and the others wait, then load the cached binary. Different kernels compile in parallel. Where
    locking is not possible (no ``fcntl``, a cache folder that cannot be written,
    ``CUPY_FMHA_COMPILE_LOCK=0``) or useful (``CUPY_CACHE_IN_MEMORY``: no disk cache to wait for), the
    kernel compiles without it, as before.
    """
    if os.environ.get("CUPY_FMHA_COMPILE_LOCK", "1") == "0" or os.environ.get("CUPY_CACHE_IN_MEMORY", "0") != "0":
        yield
        return
    key = hashlib.sha1("\0".join((code, *options, entry)).encode()).hexdigest()[:24]
    with _host_lock(cache_dir() / f"cupy_fmha-{key}.lock"):
        yield


def get_function(spec: KernelSpec):
    """The compiled ``cupy.RawKernel`` for ``spec`` on the current device (compiled on first use):
    NVRTC on NVIDIA, hiprtc with :func:`cupy_fmha.backends.rocm.compile_options` on ROCm.

    Raises:
        RuntimeError: when NVRTC rejects the source (the log is included).
    """
    import cupy

    dev = cupy.cuda.Device()
    key = (spec, dev.id)
    fn = _functions.get(key)
    if fn is None:
        from .backends import rocm

        if rocm.is_hip(cupy):  # cupy-rocm: hiprtc
            options = rocm.compile_options(spec, rocm.device_target(cupy, dev.id))
        else:
            from .spec import backend_for

            options = nvrtc_options(spec, backend_for(int(dev.compute_capability)).compile_arch(spec))
        code = load_source(spec.source)
        try:
            with _compile_lock(code, options, spec.entry):
                mod = cupy.RawModule(code=code, options=options)
                fn = mod.get_function(spec.entry)
        except cupy.cuda.compiler.CompileException as exc:  # pragma: no cover - needs a GPU
            raise RuntimeError(f"cupy-fmha: compiling {spec.name} failed:\n{exc}") from exc
        _functions[key] = fn
    return fn


@dataclass
class CompileReport:
    """ptxas's resource report for one kernel instance and architecture."""

    name: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_static: int
    log: str
    #: generic (address-space-less) LD/ST instructions in the SASS; None without nvdisasm. Shared
    #: or global accesses the compiler could not place become these (bench/NOTES.md step 19).
    generic_accesses: int | None = None

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0 or self.stack_frame > 0

    @property
    def wgmma_serialized(self) -> bool:
        """ptxas warned that it serialized wgmma instructions (its C7510-C7519 family, "Potential
        Performance Loss: wgmma.mma_async instructions are serialized ..."): each warpgroup MMA
        then waits for the one before, whatever the kernel's fences say."""
        return bool(_WGMMA_SERIALIZED.search(self.log))


_WGMMA_SERIALIZED = re.compile(r"\(C751\d\)|wgmma[^\n]*serializ", re.I)


def _nvrtc_include_dirs() -> list[str]:
    dirs = []
    try:
        import cupy

        path = cupy.cuda.get_cuda_path()
        if path:
            dirs.append(os.path.join(path, "include"))
    except Exception:  # noqa: BLE001
        pass
    return [f"-I{d}" for d in dirs if os.path.isdir(d)]


@functools.lru_cache(maxsize=None)
def nvdisasm_path() -> str | None:
    """``nvdisasm`` on PATH, or from the ``nvidia-cuda-nvdisasm`` wheel; None if neither."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cu12", "cuda_nvdisasm"):
            cand = Path(root) / sub / "bin" / "nvdisasm"
            if cand.is_file():
                return str(cand)
    return None


def _whole_elf(cubin: bytes) -> bytes:
    """``cubin`` padded with zero bytes to the length its ELF header declares (CuPy's getCUBIN
    can drop a trailing zero byte, which nvdisasm then rejects as truncated)."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF":
        return cubin
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    need = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return cubin + b"\0" * max(0, need - len(cubin))


_GENERIC = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(?:LD|ST)(?:\.[A-Z0-9.]+)?\s", re.M)


def disassemble(cubin: bytes) -> str | None:
    """nvdisasm's SASS of ``cubin`` (code sections), or None without nvdisasm."""
    tool = nvdisasm_path()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(_whole_elf(cubin))
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout


def generic_accesses(cubin: bytes) -> int | None:
    """Generic LD/ST instructions in ``cubin`` (nvdisasm's SASS), or None without nvdisasm."""
    sass = disassemble(cubin)
    return None if sass is None else len(_GENERIC.findall(sass))


def sass_text(spec: KernelSpec, arch: str = "sm_90a") -> str | None:
    """nvdisasm's listing of ``spec`` built offline for ``arch`` (NVRTC, then nvdisasm): addresses,
    labels and instructions, as :func:`disassemble` gives them; None without nvdisasm. For reading a
    loop's structure (bench/probe/fa3_sass.py).

    Raises:
        RuntimeError: with NVRTC's log when compilation fails.
    """
    from cupy.cuda import nvrtc

    if nvdisasm_path() is None:
        return None
    prog = nvrtc.createProgram(load_source(spec.source), f"{spec.name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*nvrtc_options(spec, arch), *_nvrtc_include_dirs()])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC failed for {spec.name} ({arch}): {exc}\n{nvrtc.getProgramLog(prog)}") from exc
        return disassemble(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


def sass_instructions(spec: KernelSpec, arch: str = "sm_90a") -> list[str] | None:
    """The machine instructions of ``spec`` built offline for ``arch`` (:func:`sass_text`), one
    string per instruction without address or trailing ``;``, in code order; None without
    nvdisasm. For checks of what the compiler scheduled (tests/test_fwd_ws_sass.py).

    Raises:
        RuntimeError: with NVRTC's log when compilation fails.
    """
    sass = sass_text(spec, arch)
    return None if sass is None else [m.group(1) for m in _INSTRUCTION.finditer(sass)]


_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", re.M)


def offline_compile(spec: KernelSpec, arch: str = "sm_90a") -> CompileReport:
    """Compile ``spec`` to a cubin for ``arch`` with NVRTC alone (no GPU needed).

    Raises:
        RuntimeError: with NVRTC's log when compilation fails.
    """
    from cupy.cuda import nvrtc

    src = load_source(spec.source)
    opts = [*nvrtc_options(spec, arch), "-Xptxas=-v", *_nvrtc_include_dirs()]
    prog = nvrtc.createProgram(src, f"{spec.name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(
                f"NVRTC failed for {spec.name} ({arch}): {exc}\n{nvrtc.getProgramLog(prog)}"
            ) from exc
        log = nvrtc.getProgramLog(prog)
        generic = generic_accesses(nvrtc.getCUBIN(prog)) if nvdisasm_path() else None
    finally:
        nvrtc.destroyProgram(prog)

    def num(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return CompileReport(
        name=spec.name,
        arch=arch,
        registers=num(r"Used (\d+) registers"),
        spill_stores=num(r"(\d+) bytes spill stores"),
        spill_loads=num(r"(\d+) bytes spill loads"),
        stack_frame=num(r"(\d+) bytes stack frame"),
        shared_static=num(r"(\d+) bytes smem"),
        log=log,
        generic_accesses=generic,
    )
