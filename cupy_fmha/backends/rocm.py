"""The ROCm backend for AMD Instinct GPUs (gfx90a: MI200; gfx942: MI300; gfx950: MI350), issue 12,
in progress: the targets, their limits, and the offline compile check (clang's HIP device
compile, no GPU and no ROCm install needed). The kernels do not build for these targets yet: only
the architecture layer under ``kernels/arch/gfx9/`` (MFMA wrappers, fragment layouts, row
reductions) and the kernels without matrix instructions (:data:`PORTED_SOURCES`) do. Nothing here
has run on an AMD GPU.

Facts: LDS per workgroup 64 KiB (gfx90a, gfx942) and 160 KiB (gfx950); 64-lane wavefronts; up
to 512 VGPRs + AGPRs per lane (unified register file on these CDNA parts).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TARGETS", "LDS_LIMIT", "WAVE_SIZE", "REGISTERS_PER_LANE", "ResourceReport", "clang", "offline_compile_hip",
           "PORTED_SOURCES", "ported_specs", "hip_defines"]

TARGETS = ("gfx90a", "gfx942", "gfx950")
#: bytes of LDS (shared memory) one workgroup may use
LDS_LIMIT = {"gfx90a": 65536, "gfx942": 65536, "gfx950": 163840}
WAVE_SIZE = 64
REGISTERS_PER_LANE = 512  # VGPR + AGPR


@dataclass(frozen=True)
class ResourceReport:
    """clang's per-kernel resource report (``-Rpass-analysis=kernel-resource-usage``)."""

    kernel: str
    target: str
    vgprs: int
    agprs: int
    scratch: int       # bytes per lane (spills and stack)
    lds: int           # bytes per workgroup
    occupancy: int     # waves per SIMD
    log: str

    @property
    def ok(self) -> bool:
        return self.scratch == 0 and self.lds <= LDS_LIMIT[self.target] and self.vgprs + self.agprs <= REGISTERS_PER_LANE


def clang() -> str | None:
    """A clang able to compile HIP for AMD targets (Debian's ``clang-22``, or ``clang++``)."""
    for name in ("clang++-22", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


_REMARK = re.compile(r"remark:\s+(?:Function Name: (\S+)|([A-Za-z ]+?)(?: \[[^\]]*\])?: (\d+))")


def offline_compile_hip(source: str, target: str, include_dirs=(), defines=()) -> list[ResourceReport]:
    """Compile ``source`` (HIP C++) for ``target`` with clang (device code only, no GPU libraries
    or headers) and return one :class:`ResourceReport` per kernel.

    Raises:
        RuntimeError: no clang, or the compile failed (with its output).
        ValueError: ``target`` not one of :data:`TARGETS`.
    """
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    cc = clang()
    if cc is None:
        raise RuntimeError("no clang++-22 / clang++ to compile HIP for AMD targets (Debian: apt-get install clang-22 lld-22)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.hip"
        src.write_text(source)
        cmd = [cc, "-x", "hip", f"--offload-arch={target}", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib",
               "-nogpuinc", "-O3", "-std=c++17", "-c", str(src), "-o", str(Path(tmp) / "k.o"),
               "-Rpass-analysis=kernel-resource-usage", *(f"-I{d}" for d in include_dirs), *(f"-D{d}" for d in defines)]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"clang failed for {target}:\n{run.stderr[-4000:]}")
    reports, cur = [], None
    for line in run.stderr.splitlines():
        m = _REMARK.search(line)
        if not m:
            continue
        if m.group(1):
            cur = {"kernel": m.group(1)}
            reports.append(cur)
        elif cur is not None:
            cur[m.group(2).strip()] = int(m.group(3))
    out = []
    for r in reports:
        out.append(ResourceReport(
            kernel=r["kernel"], target=target, vgprs=r.get("VGPRs", 0), agprs=r.get("AGPRs", 0),
            scratch=r.get("ScratchSize", 0), lds=r.get("LDS Size", 0), occupancy=r.get("Occupancy", 0),
            log=run.stderr))
    return out


#: kernel sources that build for AMD so far (no matrix instructions): the same files as for CUDA
PORTED_SOURCES = ("fmha_bwd_dot_do_o", "fmha_bwd_convert_dq", "fmha_dropout_mask")


def hip_defines(spec) -> tuple[str, ...]:
    """``-D`` values (without the ``-D``) for a HIP build of ``spec``: its CUDA macros with the
    thread count for 64-lane wavefronts (dot_do_o runs one wavefront per row), and
    ``FMHA_HIP_SHIM`` for the offline compile without HIP headers."""
    defs = [d[2:] for d in spec.defines() if not d.startswith("-DNTHREADS=")]
    threads = spec.macro("ROWS") * WAVE_SIZE if spec.source == "fmha_bwd_dot_do_o" else spec.macro("NTHREADS")
    return (*defs, f"NTHREADS={threads}", "FMHA_HIP_SHIM")


def ported_specs() -> list:
    """The dispatch table's instances of :data:`PORTED_SOURCES`."""
    from ..spec import default_dispatch_table

    return [s for s in default_dispatch_table() if s.source in PORTED_SOURCES]
