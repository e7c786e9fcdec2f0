"""The ROCm backend for AMD Instinct GPUs (gfx90a: MI200; gfx942: MI300; gfx950: MI350), issue 12,
in progress: the targets, their limits, the forward's and backward's tile tables, the offline
compile check (clang's HIP device compile, no GPU and no ROCm install needed), and the run-time
path through cupy-rocm (hiprtc options, the device's target, the backend interface of
:mod:`cupy_fmha.spec`). What builds for these targets (:data:`PORTED_SOURCES`,
:func:`ported_specs`): the architecture layer under ``kernels/arch/gfx9/``, the kernels without
matrix instructions, and the mma.sync-family forward ``fmha_fwd`` and backward main kernel
``fmha_bwd_dq_dk_dv`` on MFMA (:func:`fwd_tiles`, :func:`bwd_tiles`). Nothing here has run on an
AMD GPU: the run-time path is unit-tested on the CPU against a stand-in CuPy only.

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
           "PORTED_SOURCES", "ported_specs", "hip_defines", "device_asm", "fwd_tiles", "fwd_spec", "bwd_tiles", "bwd_spec",
           "bwd_specs", "dropout_mask_spec", "use_wg_skip", "use_fwd_ws_short", "compile_arch", "compile_options", "target_of",
           "device_target", "FWD_HDIMS", "HDIM_PAIRS", "HIP_CODEGEN_OPTIONS", "with_dynamic_lds"]

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


#: code-generation options every HIP build of the kernels takes (the offline clang check here and
#: hiprtc alike): native fp32 atomic adds for the dQ workspace (``global_atomic_add_f32``; without
#: it clang makes each add a compare-and-swap loop on gfx90a; the workspace is coarse-grained
#: device memory, where the native add is exact)
HIP_CODEGEN_OPTIONS = ("-munsafe-fp-atomics",)


def _clang_cmd(cc: str, src: Path, out: Path, target: str, include_dirs, defines) -> list[str]:
    return [cc, "-x", "hip", f"--offload-arch={target}", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib",
            "-nogpuinc", "-O3", "-std=c++17", *HIP_CODEGEN_OPTIONS, "-c", str(src), "-o", str(out),
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
PORTED_SOURCES = ("fmha_bwd_dot_do_o", "fmha_bwd_convert_dq", "fmha_dropout_mask", "fmha_fwd", "fmha_bwd_dq_dk_dv")

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
             dropout: bool = False, wg_skip: bool = False, bias_tma: int = 0, short: bool = False):
    """The gfx9 forward instance (``fmha_fwd``, target ``gfx9``) for these head dims and features on
    ``target``: padded head dims from :data:`FWD_HDIMS`, tiles from :func:`fwd_tiles`, the shared
    memory layout of the CUDA build's (the same Smem struct) and 64 threads per wavefront
    (``wg_skip``, ``bias_tma`` and ``short``, Hopper kernels' options, are ignored)."""
    from dataclasses import replace

    from ..spec import _mk, feature_macros

    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    spec = _mk("fmha_fwd", dtype, HDIM_Q=_bucket(hdim_q), HDIM_V=_bucket(hdim_v),
               **fwd_tiles(hdim_q, hdim_v, target), **feature_macros(alibi, bias, dropout))
    derived = dict(spec.derived, NTHREADS=WAVE_SIZE * spec.macro("NWARPS"))
    return replace(spec, target="gfx9", derived=tuple(sorted(derived.items())))


#: (wavefronts, query rows per step) of the gfx9 backward, most preferred first
_BWD_TILES = ((4, 64), (4, 32), (4, 16), (2, 32), (2, 16), (1, 16))


def bwd_tiles(hdim_q: int, hdim_v: int, target: str, *, dropout: bool = False) -> dict[str, int]:
    """Backward (``fmha_bwd_dq_dk_dv`` over MFMA, 16 keys per wavefront) tiles on gfx9: 4
    wavefronts and the largest query block of 64, 32 or 16 rows whose LDS (K, V, Q and dO
    double-buffered, dS^T, LSE and D, the dropout keep bits) fits the target; else 2, then 1
    wavefront. One workgroup per column set (NSPLIT 1): the accumulators of hdim 256 fit the
    register file (512 VGPRs + AGPRs per lane)."""
    from . import cuda

    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    dq, dv = _bucket(hdim_q), _bucket(hdim_v)
    for nwarps, bm in _BWD_TILES:
        tiles = dict(NWARPS=nwarps, BLOCK_M=bm, NSPLIT=1, MIN_BLOCKS=1)
        m = dict(HDIM_Q=dq, HDIM_V=dv, **tiles, **({"DROPOUT": 1} if dropout else {}))
        if cuda.derived_macros("fmha_bwd_dq_dk_dv", m)["SMEM_BYTES"] <= LDS_LIMIT[target]:
            return tiles
    raise ValueError(f"no backward tile fits {target}'s LDS at head dims {dq}, {dv}")


def bwd_spec(dtype: str, hdim_q: int, hdim_v: int, target: str, *, alibi: bool = False, bias: bool = False,
             dropout: bool = False):
    """The gfx9 backward main kernel (``fmha_bwd_dq_dk_dv``, target ``gfx9``) for these head dims
    and features on ``target``: padded head dims from :data:`FWD_HDIMS`, tiles from
    :func:`bwd_tiles`, the CUDA build's shared-memory layout (the same Smem struct) and 64 threads
    per wavefront. Deterministic mode, GQA and group mode are run-time parameters of the same
    instance, as on CUDA."""
    from dataclasses import replace

    from ..spec import _mk, feature_macros

    spec = _mk("fmha_bwd_dq_dk_dv", dtype, HDIM_Q=_bucket(hdim_q), HDIM_V=_bucket(hdim_v),
               **bwd_tiles(hdim_q, hdim_v, target, dropout=dropout), **feature_macros(alibi, bias, dropout))
    derived = dict(spec.derived, NTHREADS=WAVE_SIZE * spec.macro("NWARPS"))
    return replace(spec, target="gfx9", derived=tuple(sorted(derived.items())))


def hip_defines(spec, shim: bool = True) -> tuple[str, ...]:
    """``-D`` values (without the ``-D``) for a HIP build of ``spec``: its CUDA macros with the
    thread count for 64-lane wavefronts (dot_do_o runs one wavefront per row; the gfx9 specs carry
    theirs), and with ``shim`` ``FMHA_HIP_SHIM`` for the offline compile without HIP headers
    (hiprtc brings HIP's own: :func:`compile_options` leaves it out)."""
    defs = [d[2:] for d in spec.defines() if not d.startswith("-DNTHREADS=")]
    if spec.source == "fmha_bwd_dot_do_o" and spec.target != "gfx9":
        threads = spec.macro("ROWS") * WAVE_SIZE
    else:
        threads = spec.macro("NTHREADS")
    return (*defs, f"NTHREADS={threads}", *(("FMHA_HIP_SHIM",) if shim else ()))


# -- the run-time path on an AMD GPU (cupy-rocm; written and unit-tested on the CPU, never run) --

def is_hip(cupy) -> bool:
    """Whether ``cupy`` is cupy-rocm (HIP underneath: ``cupy.cuda.runtime.is_hip``), so that the
    device's gfx target, not the compute capability CuPy reports for it, picks the kernels."""
    return bool(getattr(getattr(cupy.cuda, "runtime", None), "is_hip", False))


def target_of(gcn_arch_name) -> str:
    """The target of a device from HIP's ``gcnArchName`` property (``"gfx90a:sramecc+:xnack-"``,
    str or bytes): ``"gfx90a"``, ``"gfx942"`` or ``"gfx950"``.

    Raises:
        ValueError: a target the kernels are not built for (naming it).
    """
    name = gcn_arch_name.decode() if isinstance(gcn_arch_name, (bytes, bytearray)) else str(gcn_arch_name)
    target = name.split(":")[0].strip().rstrip("\x00")
    if target not in TARGETS:
        raise ValueError(f"cupy_fmha: AMD target {target!r} ({name!r}) is not one the kernels build for {TARGETS}")
    return target


def device_target(cupy, device_id: int) -> str:
    """The gfx target of CuPy's device ``device_id`` on ROCm (cupy-rocm's
    ``runtime.getDeviceProperties``; the compute capability CuPy reports there, e.g. "90" for an
    MI200, would read as an NVIDIA Hopper)."""
    return target_of(cupy.cuda.runtime.getDeviceProperties(device_id)["gcnArchName"])


def compile_options(spec, target: str) -> tuple[str, ...]:
    """hiprtc options for ``spec`` on ``target`` (cupy-rocm's ``RawModule(options=...)``: the
    source is :func:`cupy_fmha.compile.load_source`'s, includes already expanded, so no ``-I`` of
    ours; CuPy adds HIP's include directories): C++17, -O3, ``--offload-arch``,
    :data:`HIP_CODEGEN_OPTIONS` (native fp32 atomics), ``__grid_constant__`` defined away (a CUDA
    keyword HIP lacks), and :func:`hip_defines` without the offline shim. The sources reach no
    inline PTX under HIP (arch/arch.cuh selects arch/gfx9 when ``__HIP__`` is defined).

    Raises:
        ValueError: ``target`` not one of :data:`TARGETS`.
    """
    if target not in TARGETS:
        raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
    return ("-std=c++17", "-O3", f"--offload-arch={target}", *HIP_CODEGEN_OPTIONS, "-D__grid_constant__=",
            *(f"-D{d}" for d in hip_defines(spec, shim=False)))


def _gfx9(spec, **derived):
    """``spec`` as a gfx9 instance (target ``gfx9``, derived macros such as NTHREADS replaced)."""
    from dataclasses import replace

    return replace(spec, target="gfx9", derived=tuple(sorted({**dict(spec.derived), **derived}.items())))


# The backend interface of cupy_fmha.spec (the same functions as backends/cuda.py), for a device
# whose key is its gfx target (spec.backend_for).

def compile_arch(spec) -> None:
    """No NVRTC ``-arch`` on ROCm (:func:`compile_options` names the target)."""
    return None


def use_wg_skip(diagonal: bool, seqlen_q: int) -> bool:
    """The warpgroup-skipping build is a Hopper kernel's: never on gfx9."""
    return False


def use_fwd_ws_short(diagonal: bool, seqlen_q: int) -> bool:
    """The warp-specialized forward's short-mask entries are a Hopper kernel's: never on gfx9."""
    return False


def use_heads_x(causal: bool, seqlen_k: int, nhead_q: int = 1, hdim: int = 128) -> int:
    """The heads-first grid is the warp-specialized Hopper backward's: never on gfx9 (0)."""
    return 0


def use_bwd_ws_diagonal(diagonal: bool, causal: bool, seqlen_k: int) -> bool:
    """The short-diagonal entries are the warp-specialized Hopper backward's: never on gfx9."""
    return False


def dropout_mask_spec():
    """The keep-mask kernel (no matrix instructions: the CUDA instance's macros, 256 threads)."""
    from . import cuda

    return _gfx9(cuda.dropout_mask_spec())


def bwd_specs(dtype: str, hdim_q: int, hdim_v: int, target: str, *, alibi: bool = False, bias: bool = False,
              dropout: bool = False, deterministic: bool = False, bias_tma: int = 0, heads_x: int = 0,
              diagonal: bool = False):
    """The backward's gfx9 instances on ``target``: dot_do_o (one 64-lane wavefront per row, 8
    rows), the main kernel (:func:`bwd_spec`; deterministic mode is its run-time dQ-slab path, as
    on CUDA's mma.sync kernel), convert_dq and its slab-summing build (``bias_tma``, a Hopper
    kernel's option, is ignored, as are ``heads_x`` and ``diagonal``)."""
    from ..spec import BwdSpecs, _mk

    dot = _mk("fmha_bwd_dot_do_o", dtype, ROWS=8)
    return BwdSpecs(
        dot_do_o=_gfx9(dot, NTHREADS=WAVE_SIZE * dot.macro("ROWS")),
        dq_dk_dv=bwd_spec(dtype, hdim_q, hdim_v, target, alibi=alibi, bias=bias, dropout=dropout),
        convert_dq=_gfx9(_mk("fmha_bwd_convert_dq", dtype, ROWS=16)),
        convert_dq_split=_gfx9(_mk("fmha_bwd_convert_dq", dtype, ROWS=16, DQ_SPLIT=1)),
    )


#: head-dim pairs the gfx9 tables build (each bucketed by :data:`FWD_HDIMS`: (192, 128) builds as (256, 128))
HDIM_PAIRS = tuple((d, d) for d in FWD_HDIMS) + ((192, 128),)


def ported_specs(target: str) -> list:
    """The instances of :data:`PORTED_SOURCES` for ``target``: the CUDA dispatch table's for the
    kernels without matrix instructions, and the gfx9 forward's and backward main kernel's for
    every head-dim bucket (and the (192, 128) pair), dtype and feature set of the CUDA table
    (deterministic mode, GQA and group mode are run-time parameters of the same instances)."""
    from ..spec import DTYPES, default_dispatch_table
    from .cuda import FEATURE_SETS

    mfma = ("fmha_fwd", "fmha_bwd_dq_dk_dv")
    out = [s for s in default_dispatch_table() if s.source in PORTED_SOURCES and s.source not in mfma]
    for make in (fwd_spec, bwd_spec):
        out += [make(dtype, hq, hv, target, **feats) for feats in FEATURE_SETS for dtype in DTYPES for hq, hv in HDIM_PAIRS]
    return out
