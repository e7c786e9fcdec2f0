"""Kernel instances: one frozen dataclass per compiled specialization, and the dispatch front.

A :class:`KernelSpec` names one kernel source in ``kernels/`` plus the ``-D`` macros that
specialize it (dtype, padded head dims, tile sizes, warps, features). Everything that shapes
register arrays is compile-time; sequence lengths, strides and the mask window are run-time
parameters, so one instance serves every shape and mask of its (dtype, head dims, features).

Which instances serve a device is its GPU family's decision: :func:`fwd_spec`,
:func:`bwd_specs` and :func:`default_dispatch_table` ask the backend module of the device
(:mod:`cupy_fmha.backends.cuda` for NVIDIA), whose tile table is the only place tile sizes are
chosen.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["KernelSpec", "BwdSpecs", "pad_hdim", "fwd_spec", "bwd_specs", "use_heads_x", "dropout_mask_spec",
           "default_dispatch_table", "backend_for", "use_wg_skip", "use_fwd_ws_short", "feature_macros", "tuning_key", "DTYPES"]

DTYPES = ("fp16", "bf16")


def pad_hdim(hdim: int, multiple: int = 16) -> int:
    """Head dim rounded up to the mma k-step (16), or to 32 where the backward splits columns."""
    return -(-hdim // multiple) * multiple


@dataclass(frozen=True)
class KernelSpec:
    """One kernel instance: source file stem, entry point, and its ``-D`` macros."""

    source: str
    dtype: str  # "fp16" | "bf16"
    macros: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    #: architectures the instance builds for: "sm80" (sm_80 and newer, mma.sync) or "sm90a"
    #: (Hopper only: wgmma)
    target: str = "sm80"
    #: macros that follow from ``macros`` (the backend's ``derived_macros``: block sizes, threads
    #: per block, dynamic shared memory): passed to the kernel like the others, left out of the name
    derived: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    @property
    def entry(self) -> str:
        return self.source

    def macro(self, name: str, default: int | None = None) -> int | None:
        return dict(self.macros + self.derived).get(name, default)

    def defines(self) -> list[str]:
        """NVRTC options ``-DNAME=VALUE`` for this instance."""
        out = [f"-DFMHA_BF16={1 if self.dtype == 'bf16' else 0}"]
        out += [f"-D{k}={v}" for k, v in self.macros + self.derived]
        return out

    @property
    def name(self) -> str:
        """Readable name, e.g. ``fmha_bwd_dq_dk_dv_bf16_HDIM_Q128_HDIM_V128_BLOCK_M64_NWARPS8``."""
        return "_".join([self.source, self.dtype] + [f"{k}{v}" for k, v in self.macros])


def _mk(source: str, dtype: str, target: str = "sm80", **macros: int) -> KernelSpec:
    """An instance of ``source`` with these table macros; what follows from them (block sizes,
    threads, shared memory) is added by the target's backend (``derived_macros``), computed once
    there for the kernel (``-D``) and the launcher alike."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    from .backends import cuda  # the only family today; a target names its backend

    derived = cuda.derived_macros(source, macros)
    macros = {k: v for k, v in macros.items() if k not in derived}  # recomputed, never the caller's
    return KernelSpec(source, dtype, tuple(sorted(macros.items())), target, tuple(sorted(derived.items())))


#: Environment variables the tile table and the kernel choice read (tuning only); callers that
#: memoize specs key them by these values (:func:`tuning_key`).
TUNING_VARS = ("CUPY_FMHA_FWD_TILES", "CUPY_FMHA_BWD_TILES", "CUPY_FMHA_FWD_SM90_TILES",
               "CUPY_FMHA_BWD_SM90_TILES", "CUPY_FMHA_DISABLE_WGMMA", "CUPY_FMHA_BWD_WS",
               "CUPY_FMHA_FWD_WS", "CUPY_FMHA_FWD_WS_TILES", "CUPY_FMHA_BWD_WS_TILES",
               "CUPY_FMHA_BWD_WS_WIDE_TILES")


def tuning_key() -> tuple[str, ...]:
    """The current values of :data:`TUNING_VARS` (a cache key for spec lookups)."""
    return tuple(os.environ.get(v, "") for v in TUNING_VARS)


@dataclass(frozen=True)
class BwdSpecs:
    dot_do_o: KernelSpec
    dq_dk_dv: KernelSpec
    convert_dq: KernelSpec
    #: convert_dq summing per-key-block dQ slabs (``deterministic=True``)
    convert_dq_split: KernelSpec


def feature_macros(alibi: bool = False, bias: bool = False, dropout: bool = False) -> dict[str, int]:
    """Compile-time feature macros of the main kernels: only those switched on, so the plain
    instances keep their names and their code (a feature costs nothing unless used)."""
    for name, val in (("alibi", alibi), ("bias", bias), ("dropout", dropout)):
        if not isinstance(val, bool):
            raise TypeError(f"{name}: expected a bool, got {val!r}")
    out = {}
    if alibi:
        out["ALIBI"] = 1
    if bias:
        out["BIAS"] = 1
    if dropout:
        out["DROPOUT"] = 1
    return out




def backend_for(cc):
    """The backend module serving a device whose key is ``cc``: an NVIDIA compute capability (an
    int, e.g. 90) or an AMD gfx target (a str, e.g. ``"gfx942"``: :mod:`cupy_fmha.backends.rocm`)."""
    if isinstance(cc, str) and cc.startswith("gfx"):
        from .backends import rocm

        return rocm
    from .backends import cuda

    return cuda


def fwd_spec(dtype: str, hdim_q: int, hdim_v: int, cc: int = 80, *, alibi: bool = False,
             bias: bool = False, dropout: bool = False, wg_skip: bool = False, bias_tma: int = 0,
             short: bool = False) -> KernelSpec:
    """The forward kernel instance for these head dims and features on a device of compute
    capability ``cc`` (see the backend's ``fwd_spec``; ``bias_tma``, the bytes per element of a
    bias that TMA can load, only the CUDA backend uses; ``wg_skip`` from :func:`use_wg_skip`,
    ``short`` from :func:`use_fwd_ws_short`)."""
    return backend_for(cc).fwd_spec(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout,
                                    wg_skip=wg_skip, bias_tma=bias_tma, short=short)


def bwd_specs(dtype: str, hdim_q: int, hdim_v: int, cc: int = 80, *, alibi: bool = False,
              bias: bool = False, dropout: bool = False, deterministic: bool = False, bias_tma: int = 0,
              heads_x: int = 0, diagonal: bool = False) -> BwdSpecs:
    """The backward's kernel instances (dot_do_o, dq_dk_dv, convert_dq and its slab-summing
    build) on a device of compute capability ``cc`` (see the backend's ``bwd_specs``;
    ``bias_tma`` as in :func:`fwd_spec`; ``heads_x`` from :func:`use_heads_x`; ``diagonal`` from
    :func:`use_bwd_ws_diagonal`)."""
    return backend_for(cc).bwd_specs(dtype, hdim_q, hdim_v, cc, alibi=alibi, bias=bias, dropout=dropout,
                                     deterministic=deterministic, bias_tma=bias_tma, heads_x=heads_x,
                                     diagonal=diagonal)


def use_heads_x(causal: bool, seqlen_k: int, cc: int = 90, nhead_q: int = 1, hdim: int = 128) -> int:
    """The order in which the backward of a causal mask (``causal``) at ``seqlen_k`` keys, ``nhead_q``
    query heads and head dim ``hdim`` (the larger) starts its CTAs: 0 key blocks first, 1 the heavy
    key blocks of every head first, n >= 2 within groups of n heads (the backend's tuning decision;
    see :func:`cupy_fmha.backends.cuda.use_heads_x`)."""
    return backend_for(cc).use_heads_x(causal, seqlen_k, nhead_q, hdim)


def use_bwd_ws_diagonal(diagonal: bool, causal: bool, seqlen_k: int, cc: int = 90) -> bool:
    """Whether the backward of a mask with a diagonal (``diagonal``; ``causal``: causal-like) over
    ``seqlen_k`` keys (the max in group mode) should take the warp-specialized backward's entries
    for such masks (the backend's tuning decision; see
    :func:`cupy_fmha.backends.cuda.use_bwd_ws_diagonal`)."""
    return backend_for(cc).use_bwd_ws_diagonal(diagonal, causal, seqlen_k)


def use_wg_skip(diagonal: bool, seqlen_q: int, cc: int = 90) -> bool:
    """Whether the forward of a mask with a diagonal (``diagonal``) at ``seqlen_q`` rows should
    take the build whose warpgroups skip key blocks none of their rows sees (the backend's
    tuning decision; see :func:`cupy_fmha.backends.cuda.use_wg_skip`)."""
    return backend_for(cc).use_wg_skip(diagonal, seqlen_q)


def use_fwd_ws_short(diagonal: bool, seqlen_q: int, cc: int = 90) -> bool:
    """Whether the forward of a mask with a diagonal (``diagonal``, batch or group mode) over
    ``seqlen_q`` query rows (the max in group mode) should take the warp-specialized forward's
    entries for short masks (the backend's tuning decision; see
    :func:`cupy_fmha.backends.cuda.use_fwd_ws_short`)."""
    return backend_for(cc).use_fwd_ws_short(diagonal, seqlen_q)


def dropout_mask_spec(cc: int = 80) -> KernelSpec:
    """The keep-mask kernel (``fmha_dropout_mask``)."""
    return backend_for(cc).dropout_mask_spec()


def default_dispatch_table() -> list[KernelSpec]:
    """Every kernel instance the library dispatches to, over every backend (what CI compiles
    offline)."""
    from .backends import cuda

    return cuda.dispatch_table()
