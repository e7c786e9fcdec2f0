"""Refuse a run this machine cannot hold, before any input is drawn.

The host limit is ``--max-memory`` GiB, or half of this machine's RAM (or of the process's
cgroup memory limit, when that is lower). The need is estimated from the problem sizes with
:mod:`cupy_fmha.footprint`, phase by phase, following :mod:`.run`:

* the run: the inputs, and either the NumPy reference (``precision="low"``) on the whole
  problem (numpy backend) or the outputs copied back as float64 (cupy backend);
* the check (unless ``--no-verify``): inputs, the backend's float64 outputs, the checked subset
  of the inputs, the float64 reference on that subset (plus the ``low`` one on cupy, whose
  outputs are kept meanwhile), and :func:`cupy_fmha.verify.compare`'s temporaries.

On the cupy backend the GPU arrays (inputs and outputs, not the kernels' workspaces) must also
fit in the GPU's memory.
"""

from __future__ import annotations

import os
from dataclasses import replace

from cupy_fmha import footprint
from cupy_fmha.footprint import Sizes, format_bytes

from .config import RunConfig, UsageProblem
from .run import check_selection

GIB = 2**30


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    return None


def machine_memory() -> tuple[int | None, str]:
    """(bytes of RAM this process may use, what that figure is): the machine's RAM, or the
    cgroup's memory limit when that is lower; ``None`` when neither can be found."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        ram = None
    cg = _cgroup_limit()
    if cg is not None and (ram is None or cg < ram):
        return cg, "this process's cgroup memory limit"
    return ram, "this machine's RAM"


def host_limit(cfg: RunConfig) -> tuple[int | None, str]:
    """(bytes, where that figure comes from); ``None`` bytes when it cannot be found."""
    if cfg.max_memory_gib is not None:
        return int(cfg.max_memory_gib * GIB), "--max-memory"
    ram, what = machine_memory()
    if ram is None:
        return None, ""
    return ram // 2, f"1/2 of {what}"


def _features(cfg: RunConfig) -> dict:
    return dict(bias_shape=cfg.bias_shape, alibi=cfg.bias.startswith("a"),
                dropout=cfg.p_drop > 0.0, return_dbias=cfg.dbias)


def _subset(cfg: RunConfig) -> tuple[RunConfig, Sizes]:
    """The config and sizes of the problem the float64 reference checks."""
    batches, qh, kh = check_selection(cfg)
    bias_shape = cfg.bias_shape
    if bias_shape is not None:
        bias_shape = (len(batches) if bias_shape[0] > 1 else 1,
                      len(qh) if bias_shape[1] > 1 else 1, *bias_shape[2:])
    if cfg.group:
        s = Sizes.group([cfg.seqlens_q[b] for b in batches], [cfg.seqlens_k[b] for b in batches],
                        len(qh), len(kh), cfg.hdim, cfg.hdim_v)
        # lse keeps the full problem's longest length
        s = replace(s, seqlen_q=cfg.seqlen_q, seqlen_k=cfg.seqlen_k)
    else:
        s = Sizes(len(batches), len(qh), len(kh), cfg.seqlen_q, cfg.seqlen_k, cfg.hdim, cfg.hdim_v)
    return replace(cfg, bias_shape=bias_shape), s


def host_need(cfg: RunConfig) -> tuple[int, int]:
    """(bytes of the run, bytes of the check; 0 without ``--verify``) on the host."""
    s, mode, e = cfg.sizes, cfg.mode, cfg.itemsize
    inputs = footprint.input_bytes(s, mode, e, bias_shape=cfg.bias_shape)
    draw = 4 * max(s.q, s.k, s.v, s.o)  # one float32 draw before rounding to the input dtype
    outs = footprint.output_bytes(s, mode, 8, bias_shape=cfg.bias_shape, return_dbias=cfg.dbias)
    if cfg.backend == "numpy":
        ref = footprint.reference_host_bytes(s, mode, precision="low", itemsize=e, **_features(cfg))
        run = inputs + max(draw, ref)
    else:  # outputs copied back (input dtype), then made float64
        run = inputs + max(draw, outs + outs // 4)
    if not cfg.verify:
        return run, 0
    sub_cfg, sub = _subset(cfg)
    feats = _features(sub_cfg)
    sub_inputs = footprint.input_bytes(sub, mode, e, bias_shape=sub_cfg.bias_shape)
    sub_outs = footprint.output_bytes(sub, mode, 8, bias_shape=sub_cfg.bias_shape,
                                      return_dbias=cfg.dbias)
    ref64 = footprint.reference_host_bytes(sub, mode, precision="float64", itemsize=e, **feats)
    if cfg.backend == "cupy":
        low = footprint.reference_host_bytes(sub, mode, precision="low", itemsize=e, **feats)
        ref64 = max(ref64, sub_outs + low)
    compare = 10 * 8 * max(sub.q, sub.k, sub.v, sub.o)  # float64 copies, differences, masks
    check = inputs + outs + sub_inputs + max(ref64, 2 * sub_outs + compare)
    return run, check


def check(cfg: RunConfig, auto_picked: bool = False) -> None:
    """Raise :class:`UsageProblem` (one line) when the run would not fit.

    ``auto_picked``: the backend came from ``--backend auto`` (said so in the message)."""
    limit, why = host_limit(cfg)
    be = f"--backend {cfg.backend}" + (
        " (no usable CUDA GPU found)" if auto_picked and cfg.backend == "numpy" else "")
    if limit is not None:
        run, chk = host_need(cfg)
        if max(run, chk) > limit:
            where = (f"limit {format_bytes(limit)}: {why}"
                     + ("" if why == "--max-memory" else "; --max-memory to override"))
            if run > limit:
                raise UsageProblem(
                    f"{be}: this {cfg.mode} would need about {format_bytes(max(run, chk))} of host "
                    f"memory ({where})")
            raise UsageProblem(
                f"{be}: checking this {cfg.mode} against the float64 reference would need about "
                f"{format_bytes(chk)} of host memory ({where}; --no-verify skips the check)")
    if cfg.backend == "cupy":
        total = _gpu_memory()
        need = footprint.device_bytes(cfg.sizes, cfg.mode, cfg.itemsize, bias_shape=cfg.bias_shape,
                                      alibi_shape=_alibi_shape(cfg), return_dbias=cfg.dbias)
        if total is not None and need > total:
            raise UsageProblem(
                f"{be}: the inputs and outputs of this {cfg.mode} alone take about "
                f"{format_bytes(need)} of GPU memory (the GPU has {format_bytes(total)})")


def _alibi_shape(cfg: RunConfig):
    if not cfg.bias.startswith("a"):
        return None
    return (cfg.batch, cfg.nhead) if cfg.bias == "a:1" else (cfg.nhead,)


def _gpu_memory() -> int | None:
    try:
        import cupy

        return int(cupy.cuda.Device().mem_info[1])
    except Exception:  # noqa: BLE001 - no figure, no check
        return None
