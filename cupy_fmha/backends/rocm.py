"""The ROCm backend for AMD Instinct GPUs (gfx90a: MI200; gfx942: MI300; gfx950: MI350), issue 12,
in progress: the targets, their limits, the forward's tile table, and the offline compile check
(clang's HIP device compile, no GPU and no ROCm install needed). What builds for these targets
(:data:`PORTED_SOURCES`, :func:`ported_specs`): the architecture layer under ``kernels/arch/gfx9/``,
the kernels without matrix instructions, and the mma.sync-family forward ``fmha_fwd`` on MFMA
(:func:`fwd_tiles`); the backward's main kernel does not yet. Nothing here has run on an AMD GPU.

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
           "PORTED_SOURCES", "ported_specs", "hip_defines", "device_asm", "fwd_tiles", "fwd_spec", "FWD_HDIMS", "with_dynamic_lds"]

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


def _clang_cmd(cc: str, src: Path, out: Path, target: str, include_dirs, defines) -> list[str]:
    return [cc, "-x", "hip", f"--offload-arch={target}", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib",
            "-nogpuinc", "-O3", "-std=c++17", "-c", str(src), "-o", str(out),
            *(f"-I{d}" for d in include_dirs), *(f"-D{d}" for d in defines)]


def _clang_or_raise(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    cc = clang()
    if cc is None:
        raise RuntimeError("no clang++-22 / clang++ to compile HIP for AMD targets (Debian: apt-get install clang-22 lld-22)")
    return cc


def offline_compile_hip(source: str, target: str, include_dirs=(), defines=()) -> list[ResourceReport]:
    """Compile ``source`` (HIP C++) for ``target`` with clang (device code only, no GPU libraries
    or headers) and return one :class:`ResourceReport` per kernel.

    Raises:
        RuntimeError: no clang, or the compile failed (with its output).
        ValueError: ``target`` not one of :data:`TARGETS`.
    """
    cc = _clang_or_raise(target)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.hip"
        src.write_text(source)
        cmd = [*_clang_cmd(cc, src, Path(tmp) / "k.o", target, include_dirs, defines), "-Rpass-analysis=kernel-resource-usage"]
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


def with_dynamic_lds(report: ResourceReport, lds_bytes: int, threads: int) -> ResourceReport:
    """``report`` with a kernel's dynamic LDS (its ``extern __shared__`` layout, which clang's
    report leaves out) added, and the occupancy lowered to what that LDS allows: workgroups of
    ``threads`` per CU (LDS per CU = :data:`LDS_LIMIT`), over 4 SIMDs: a workgroup of fewer than 4
    wavefronts alone on a CU counts as 1 per SIMD, though it leaves SIMDs idle."""
    lds = report.lds + lds_bytes
    occ = report.occupancy
    if lds:  # workgroups per CU times their wavefronts, spread over the 4 SIMDs (rounded up)
        waves = (LDS_LIMIT[report.target] // lds) * (-(-threads // WAVE_SIZE))
        occ = min(occ, -(-waves // 4))
    return ResourceReport(report.kernel, report.target, report.vgprs, report.agprs, report.scratch, lds, occ, report.log)


def device_asm(source: str, target: str, include_dirs=(), defines=()) -> str:
    """The AMDGPU assembly clang makes of ``source`` for ``target`` (as :func:`offline_compile_hip`
    compiles it, with ``-S``)."""
    cc = _clang_or_raise(target)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.hip", Path(tmp) / "k.s"
        src.write_text(source)
        run = subprocess.run([*_clang_cmd(cc, src, out, target, include_dirs, defines), "-S"], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"clang failed for {target}:\n{run.stderr[-4000:]}")
        return out.read_text()


#: kernel sources that build for AMD so far: the same files as for CUDA
PORTED_SOURCES = ("fmha_bwd_dot_do_o", "fmha_bwd_convert_dq", "fmha_dropout_mask", "fmha_fwd")

#: padded head dims of the gfx9 forward: head dims round up to one of these (as CK's buckets;
#: fewer instances than CUDA's multiples of 16 while the port is compile-checked only)
FWD_HDIMS = (32, 64, 128, 256)


def _bucket(hdim: int) -> int:
    for d in FWD_HDIMS:
        if hdim <= d:
            return d
    raise ValueError(f"head dim {hdim} above {FWD_HDIMS[-1]}")


def fwd_tiles(hdim_q: int, hdim_v: int, target: str) -> dict[str, int]:
    """Forward tiles on gfx9 (``fmha_fwd`` over MFMA, 16 query rows per wavefront): 4 wavefronts
    and the largest key block of 64, 32 or 16 whose LDS (Q, K and V double-buffered) fits the
    target (64 KiB on gfx90a / gfx942, 160 KiB on gfx950); else 3, then 2 wavefronts at 16 keys
    (head dim 256 on the 64 KiB targets: 3 wavefronts, 59,136 B; 4 would need 67,584 B)."""
    from . import cuda

    dq, dv = _bucket(hdim_q), _bucket(hdim_v)
    for nwarps, bn in ((4, 64), (4, 32), (4, 16), (3, 16), (2, 16)):
        tiles = dict(NWARPS=nwarps, BLOCK_N=bn, Q_IN_REGS=1)
        if cuda.derived_macros("fmha_fwd", dict(HDIM_Q=dq, HDIM_V=dv, **tiles))["SMEM_BYTES"] <= LDS_LIMIT[target]:
            return tiles
    raise ValueError(f"no forward tile fits {target}'s LDS at head dims {dq}, {dv}")


def fwd_spec(dtype: str, hdim_q: int, hdim_v: int, target: str, *, alibi: bool = False, bias: bool = False,
             dropout: bool = False):
    """The gfx9 forward instance (``fmha_fwd``, target ``gfx9``) for these head dims and features on
    ``target``: padded head dims from :data:`FWD_HDIMS`, tiles from :func:`fwd_tiles`, the shared
    memory layout of the CUDA build's (the same Smem struct) and 64 threads per wavefront."""
    from dataclasses import replace

    from ..spec import _mk, feature_macros

    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    spec = _mk("fmha_fwd", dtype, HDIM_Q=_bucket(hdim_q), HDIM_V=_bucket(hdim_v),
               **fwd_tiles(hdim_q, hdim_v, target), **feature_macros(alibi, bias, dropout))
    derived = dict(spec.derived, NTHREADS=WAVE_SIZE * spec.macro("NWARPS"))
    return replace(spec, target="gfx9", derived=tuple(sorted(derived.items())))


def hip_defines(spec) -> tuple[str, ...]:
    """``-D`` values (without the ``-D``) for a HIP build of ``spec``: its CUDA macros with the
    thread count for 64-lane wavefronts (dot_do_o runs one wavefront per row; the gfx9 forward
    specs carry theirs), and ``FMHA_HIP_SHIM`` for the offline compile without HIP headers."""
    defs = [d[2:] for d in spec.defines() if not d.startswith("-DNTHREADS=")]
    threads = spec.macro("ROWS") * WAVE_SIZE if spec.source == "fmha_bwd_dot_do_o" else spec.macro("NTHREADS")
    return (*defs, f"NTHREADS={threads}", "FMHA_HIP_SHIM")


def ported_specs(target: str) -> list:
    """The instances of :data:`PORTED_SOURCES` for ``target``: the CUDA dispatch table's for the
    kernels without matrix instructions, and the gfx9 forward's for every head-dim bucket (and the
    (192, 128) pair), dtype and feature set of the CUDA table."""
    from ..spec import DTYPES, default_dispatch_table
    from .cuda import FEATURE_SETS

    out = [s for s in default_dispatch_table() if s.source in PORTED_SOURCES and s.source != "fmha_fwd"]
    pairs = [(d, d) for d in FWD_HDIMS] + [(192, 128)]
    out += [fwd_spec(dtype, hq, hv, target, **feats) for feats in FEATURE_SETS for dtype in DTYPES for hq, hv in pairs]
    return out
