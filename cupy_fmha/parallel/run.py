"""Launcher for ring attention: one process per GPU, NCCL between them.

``python -m cupy_fmha.parallel.run --nproc N [options]`` runs a ring attention forward and
backward on a random problem (bf16, causal, zigzag shards by default) on N GPUs, checks every
rank's shards against a one-GPU ``attention_forward`` / ``attention_backward`` of the whole
problem (computed on each rank's own GPU) and times the ring. ``--help`` lists the options.

From Python, :func:`launch` runs any function ``fn(comm, *args)`` that way: it starts ``nproc``
processes with ``multiprocessing``'s *spawn* method (CUDA cannot be forked), each bound to its
GPU; rank 0 makes the NCCL unique id and sends it to every other rank through a
``multiprocessing`` pipe; each process builds its :class:`~cupy_fmha.parallel.comm.NcclRing`,
runs ``fn`` and sends back the result (picklable: numbers, NumPy arrays, dicts). ``NCCL_NVLS_ENABLE=0``
(NVLink multicast off) is set in the launcher and in every process it starts. A failure in any
rank stops the others and raises with that rank's traceback.

Functions given to :func:`launch` must be importable by the children (defined at module level,
in a module or in a ``__main__`` script guarded by ``if __name__ == "__main__":``).
"""

from __future__ import annotations

import argparse
import json
import numbers
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace

import numpy as np

from .._checks import check_int
from .comm import NcclRing, nccl_unique_id
from ..mask import check_causal, resolve_mask
from ..validate import _check_head_dims
from .layout import check_scheme, chunk_len

__all__ = ["launch", "RunConfig", "run_rank", "run_many", "run_local", "timeline_report", "main"]

NVLS_ENV = ("NCCL_NVLS_ENABLE", "0")


# --------------------------------------------------------------------------- launching


def _nccl_comm(world_size, rank, unique_id, device):
    import cupy

    cupy.cuda.Device(device).use()
    return NcclRing(world_size, rank, unique_id, device=device)


def _worker(rank, nproc, device, fn, args, id_conns, results, make_id, make_comm):
    os.environ[NVLS_ENV[0]] = NVLS_ENV[1]
    try:
        if rank == 0:
            if make_id is nccl_unique_id:  # the device first: NCCL initializes against it
                import cupy

                cupy.cuda.Device(device).use()
            uid = make_id()
            for conn in id_conns:
                conn.send(uid)
        else:
            uid = id_conns[0].recv()
        comm = make_comm(nproc, rank, uid, device)
        results.put((rank, True, fn(comm, *args)))
    except BaseException:  # noqa: BLE001 - every failure goes back to the launcher
        results.put((rank, False, traceback.format_exc()))


def _visible_gpus() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver
        return 0


def launch(fn, nproc: int, args=(), *, devices=None, timeout: float | None = None, make_id=None, make_comm=None):
    """Run ``fn(comm, *args)`` in ``nproc`` new processes, one per GPU, and return the results in
    rank order.

    Args:
        fn: a module-level function ``fn(comm, *args)``; ``comm`` is the process's
            :class:`~cupy_fmha.parallel.comm.NcclRing` (its device is current when fn runs).
        nproc: number of ranks (>= 1).
        args: extra arguments for fn (picklable).
        devices: the GPU of each rank (default ``range(nproc)``); distinct (NCCL refuses two
            ranks on one GPU: use :class:`~cupy_fmha.parallel.comm.LocalRing` to emulate a ring
            on one GPU).
        timeout: seconds to wait for all results, a number > 0 (None: no limit).
        make_id, make_comm: for tests: replace :func:`~cupy_fmha.parallel.comm.nccl_unique_id`
            and the NcclRing constructor ``make_comm(world_size, rank, unique_id, device)``.

    Raises:
        TypeError, ValueError: bad ``nproc`` / ``devices`` / ``timeout``, fewer GPUs than ranks
            (with NCCL); before any process starts.
        RuntimeError: a rank failed (its traceback in the message), died, or the wait timed out.
    """
    import multiprocessing as mp

    nproc = check_int("nproc", nproc, 1)
    if timeout is not None:
        if isinstance(timeout, (bool, np.bool_)) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout: expected a number of seconds or None, got {timeout!r}")
        if not timeout > 0:  # NaN too: it never compared past the deadline
            raise ValueError(f"timeout: expected a number of seconds > 0, got {timeout!r}")
    if devices is None:
        devices = list(range(nproc))
    else:
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
            raise TypeError(f"devices: expected a list of {nproc} GPU ids, got {devices!r}")
        devices = list(devices)
        if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0 for d in devices):
            raise ValueError(f"devices: expected non-negative int GPU ids, got {devices}")
        devices = [int(d) for d in devices]
    if len(devices) != nproc or len(set(devices)) != nproc:
        raise ValueError(f"devices: expected {nproc} distinct GPU ids, got {devices}")
    default_nccl = make_comm is None
    make_id = nccl_unique_id if make_id is None else make_id
    make_comm = _nccl_comm if make_comm is None else make_comm
    if default_nccl:
        have = _visible_gpus()
        if max(devices) >= have:
            raise ValueError(f"nproc: {nproc} ranks on GPUs {devices} need {max(devices) + 1} visible GPUs, found "
                             f"{have} (NCCL refuses two ranks on one GPU; emulate a ring on one GPU with LocalRing, "
                             "or bench/context_parallel.py --local N)")
    os.environ[NVLS_ENV[0]] = NVLS_ENV[1]  # inherited by the children too
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    pipes = [ctx.Pipe(duplex=False) for _ in range(nproc - 1)]  # (receive end, send end) per rank >= 1
    procs = []
    for rank in range(nproc):
        conns = [p[1] for p in pipes] if rank == 0 else [pipes[rank - 1][0]]
        procs.append(ctx.Process(target=_worker, name=f"ring-rank-{rank}",
                                 args=(rank, nproc, devices[rank], fn, tuple(args), conns, results, make_id,
                                       make_comm)))
    for p in procs:
        p.start()
    out, deadline = {}, None if timeout is None else time.monotonic() + timeout
    try:
        while len(out) < nproc:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except Exception:  # queue.Empty: check for dead ranks and the deadline
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"launch: {', '.join(dead)} exited without a result "
                                       f"(exit codes {[p.exitcode for p in procs]})") from None
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"launch: no result from every rank within {timeout} s") from None
                continue
            if not ok:
                raise RuntimeError(f"launch: rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            if p.is_alive() and len(out) < nproc:
                p.terminate()
        for p in procs:
            p.join(timeout=30)
    return [out[r] for r in range(nproc)]


# --------------------------------------------------------------------------- the demo / benchmark rank


@dataclass(frozen=True)
class RunConfig:
    """One ring attention problem and how to run it (every rank gets the same config)."""

    seqlen: int = 16384
    batch: int = 1
    nhead: int = 16
    nhead_k: int | None = None
    hdim: int = 128
    dtype: str = "bf16"
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    layout: str = "bshd"
    scheme: str = "zigzag"
    warmup: int = 2
    repeat: int = 5
    check: bool = True
    single: bool = False  #: rank 0 also times plain attention on the whole sequence
    seed: int = 0

    def mask_kw(self) -> dict:
        return {"causal": bool(self.causal), "window_size": tuple(self.window)}

    def validate(self, world: int) -> "RunConfig":
        """Checks that need no GPU (the options the ranks' attention calls would refuse among them);
        ValueError naming the option."""
        for name in ("seqlen", "batch", "nhead", "hdim", "repeat", "warmup", "seed"):
            try:
                check_int(f"--{name}", getattr(self, name), 1 if name in ("seqlen", "batch", "nhead", "hdim", "repeat")
                          else None, what="an integer")
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        try:
            _check_head_dims(self.hdim, self.hdim, ("--hdim", "--hdim"))
            check_causal(self.causal)
            resolve_mask(None, self.causal, tuple(self.window))
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc).replace("causal:", "--causal:").replace("window_size:", "--window:")) from None
        if self.warmup < 0:
            raise ValueError(f"--warmup: expected >= 0, got {self.warmup}")
        if not 0 <= self.seed < 2 ** 64:  # cupy.random.RandomState's range; it raised in every rank
            raise ValueError(f"--seed: expected 0 <= seed < 2**64, got {self.seed}")
        for name in ("check", "single"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"--{name}: expected a bool, got {getattr(self, name)!r}")
        if self.nhead_k is not None:
            try:
                check_int("--nhead-k", self.nhead_k, what="an integer")
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        hk = self.nhead if self.nhead_k is None else int(self.nhead_k)
        if hk < 1 or self.nhead % hk:
            raise ValueError(f"--nhead-k: {hk} must divide --nhead {self.nhead}")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"--dtype: expected bf16 or fp16, got {self.dtype!r}")
        if self.layout not in ("bshd", "bhsd"):
            raise ValueError(f"--layout: expected bshd or bhsd, got {self.layout!r}")
        try:
            check_scheme(self.scheme)
            chunk_len(self.seqlen, world, self.scheme)
        except ValueError as exc:
            raise ValueError(f"--seqlen/--scheme: {exc}") from None
        return replace(self, nhead_k=hk)


def _shapes(cfg: RunConfig):
    b, s, h, hk, d = cfg.batch, cfg.seqlen, cfg.nhead, cfg.nhead_k or cfg.nhead, cfg.hdim
    f = (lambda hh: (b, s, hh, d)) if cfg.layout == "bshd" else (lambda hh: (b, hh, s, d))
    return f(h), f(hk)


def _global_inputs(cfg: RunConfig):
    """q, k, v, do of the whole problem, the same on every rank (seeded CuPy generator)."""
    import cupy as cp

    from ..validate import _BF16

    dt = _BF16 if cfg.dtype == "bf16" else np.float16
    qs, ks = _shapes(cfg)
    try:  # cuRAND on the device; NumPy on the host where CuPy has no cuRAND
        rs = cp.random.RandomState(cfg.seed)

        def draw(shape):
            return rs.standard_normal(shape, dtype=cp.float32)
    except ImportError:
        rng = np.random.default_rng(cfg.seed)

        def draw(shape):
            return cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    q = (1.5 * draw(qs)).astype(dt)  # scores ~ N(0, 1.5^2), as the GPU tests draw them
    k, v, do = draw(ks).astype(dt), draw(ks).astype(dt), draw(qs).astype(dt)
    return q, k, v, do


def _rel(a, b) -> float:
    import cupy as cp

    a32, b32 = a.astype(cp.float32), b.astype(cp.float32)
    fin = cp.isfinite(b32)  # lse of rows that see nothing: -inf on both sides
    a32, b32 = cp.where(fin, a32, 0), cp.where(fin, b32, 0)
    den = float(cp.linalg.norm(b32))
    return float(cp.linalg.norm(a32 - b32)) / (den if den > 0 else 1.0)


def timeline_report(rows: list[dict]) -> dict:
    """Summary of one rank's :meth:`~cupy_fmha.parallel.ring.Timeline.summary`: per-step compute
    and transfer times, the idle time of the compute stream between steps (``exposed_ms``: what
    the transfers did not hide, plus launch gaps), and for the backward the final dK/dV hop home,
    which no compute overlaps (``tail_ms``)."""
    comp = sorted((r for r in rows if r["kind"] == "compute"), key=lambda r: r["step"])
    comm = [r for r in rows if r["kind"] != "compute"]
    gaps = [max(0.0, comp[i]["start_ms"] - comp[i - 1]["end_ms"]) for i in range(1, len(comp))]
    last_end = comp[-1]["end_ms"] if comp else 0.0
    tail = max([r["end_ms"] - last_end for r in comm if r["end_ms"] > last_end] + [0.0])
    comm_ms = sum(r["ms"] for r in comm)
    exposed = sum(gaps) + tail
    return {
        "compute_ms": [round(r["ms"], 4) for r in comp],
        "comm_ms": {f"{r['kind']}{r['step']}": round(r["ms"], 4) for r in comm},
        "gap_ms": [round(g, 4) for g in gaps],
        "tail_ms": round(tail, 4),
        "total_ms": round(max([r["end_ms"] for r in rows] + [0.0]), 4),
        "comm_total_ms": round(comm_ms, 4),
        "exposed_ms": round(exposed, 4),
        "hidden_fraction": round(1.0 - min(exposed, comm_ms) / comm_ms, 4) if comm_ms > 0 else None,
    }


def _one_gpu(cfg: RunConfig, inputs, kw, ranks, n, ax, time_it: bool):
    """The whole problem on this GPU with plain attention: the shards of its outputs and
    gradients for each rank in ``ranks`` (for the check; ``{}`` without ``cfg.check``) and, with
    ``time_it``, its median times."""
    from ..api import attention_backward, attention_forward
    from ..timing import time_cuda
    from .layout import shard

    q, k, v, do = inputs
    o1, lse1 = attention_forward(q, k, v, **kw)
    g1 = attention_backward(do, q, k, v, o1, lse1, **kw)
    refs = {}
    if cfg.check:
        for r in ranks:
            refs[r] = [shard(x, r, n, scheme=cfg.scheme, axis=a) for x, a in
                       ((o1, ax), (lse1, 2), (g1.dq, ax), (g1.dk, ax), (g1.dv, ax))]
    single = {}
    if time_it:
        t_f = time_cuda(lambda: attention_forward(q, k, v, **kw), warmup=cfg.warmup, repeat=cfg.repeat, progress=False)
        t_b = time_cuda(lambda: attention_backward(do, q, k, v, o1, lse1, **kw), warmup=cfg.warmup, repeat=cfg.repeat,
                        progress=False)
        single = {"fwd_ms": t_f.median_ms, "bwd_ms": t_b.median_ms}
    return refs, single


def run_rank(comm, cfg: RunConfig) -> dict:
    """One rank of the demo/benchmark: build the same global problem as every rank, keep this
    rank's shards, optionally check the ring against one-GPU attention of the whole problem (on
    this GPU), time the ring forward and backward, and record one timeline of each. Returns a
    dict of plain numbers."""
    import cupy as cp

    from ..flops import attention_flops
    from ..mask import resolve_mask
    from ..timing import time_cuda
    from ..verify import rel_limit
    from .layout import shard
    from .ring import Timeline, ring_attention_backward, ring_attention_forward

    n, r = comm.world_size, comm.rank
    ax = 1 if cfg.layout == "bshd" else 2
    kw = dict(cfg.mask_kw(), layout=cfg.layout)
    q, k, v, do = _global_inputs(cfg)
    sh = [shard(x, r, n, scheme=cfg.scheme, axis=ax) for x in (q, k, v, do)]
    out: dict = {"rank": r, "world": n, "device": comm.device}
    ref, single = None, {}
    if cfg.check or (cfg.single and r == 0):
        refs, single = _one_gpu(cfg, (q, k, v, do), kw, [r], n, ax, cfg.single and r == 0)
        ref = refs.pop(r, None)
    del q, k, v, do
    cp.get_default_memory_pool().free_all_blocks()
    qs, ks, vs, dos = sh
    rkw = dict(kw, scheme=cfg.scheme)
    o, lse = ring_attention_forward(qs, ks, vs, comm, **rkw)
    grads = ring_attention_backward(dos, qs, ks, vs, o, lse, comm, **rkw)
    if ref is not None:
        names = ("o", "lse", "dq", "dk", "dv")
        got = (o, lse) + tuple(grads)
        out["rel_err"] = {nm: _rel(a, b) for nm, a, b in zip(names, got, ref)}
        out["rel_limit"] = rel_limit("bfloat16" if cfg.dtype == "bf16" else "float16", cfg.hdim, cfg.hdim)
        del ref
    t_f = time_cuda(lambda: ring_attention_forward(qs, ks, vs, comm, **rkw), warmup=cfg.warmup, repeat=cfg.repeat,
                    progress=False)
    t_b = time_cuda(lambda: ring_attention_backward(dos, qs, ks, vs, o, lse, comm, **rkw), warmup=cfg.warmup,
                    repeat=cfg.repeat, progress=False)
    tl_f, tl_b = Timeline(), Timeline()
    ring_attention_forward(qs, ks, vs, comm, timeline=tl_f, **rkw)
    ring_attention_backward(dos, qs, ks, vs, o, lse, comm, timeline=tl_b, **rkw)
    cp.cuda.get_current_stream().synchronize()
    spec = resolve_mask(None, cfg.causal, tuple(cfg.window))
    flops = {m: attention_flops(cfg.batch, cfg.nhead, cfg.seqlen, cfg.seqlen, cfg.hdim, cfg.hdim, spec, m)
             for m in ("fwd", "bwd")}
    out.update({
        "ring": {"fwd_ms": t_f.median_ms, "bwd_ms": t_b.median_ms},
        "single": single,
        "flops": flops,
        "timeline": {"fwd": timeline_report(tl_f.summary()), "bwd": timeline_report(tl_b.summary())},
    })
    return out


def run_many(comm, cfgs) -> list[dict]:
    """:func:`run_rank` for each config in turn (one launch, one NCCL set-up, for a sweep)."""
    import cupy as cp

    out = []
    for cfg in cfgs:
        out.append(run_rank(comm, cfg))
        cp.get_default_memory_pool().free_all_blocks()
    return out


def run_local(cfg: RunConfig, world: int) -> dict:
    """:func:`run_rank`'s work for a :class:`~cupy_fmha.parallel.comm.LocalRing` of ``world``
    ranks on the current GPU (all ranks in this process, sharing the GPU): the check against
    one-GPU attention, the time of the whole emulated ring (every rank's work, one after the
    other on one GPU: no speed-up to expect) and each rank's timeline."""
    import cupy as cp

    from ..flops import attention_flops
    from ..mask import resolve_mask
    from ..timing import time_cuda
    from ..verify import rel_limit
    from .comm import LocalRing
    from .layout import shard
    from .ring import Timeline, local_ring_attention_backward, local_ring_attention_forward

    ax = 1 if cfg.layout == "bshd" else 2
    kw = dict(cfg.mask_kw(), layout=cfg.layout)
    q, k, v, do = _global_inputs(cfg)
    sh = [[shard(x, r, world, scheme=cfg.scheme, axis=ax) for r in range(world)] for x in (q, k, v, do)]
    out: dict = {"world": world, "device": cp.cuda.Device().id, "local": True}
    refs, single = {}, {}
    if cfg.check or cfg.single:
        refs, single = _one_gpu(cfg, (q, k, v, do), kw, range(world), world, ax, cfg.single)
    del q, k, v, do
    cp.get_default_memory_pool().free_all_blocks()
    qs, ks, vs, dos = sh
    ring = LocalRing(world, device=cp.cuda.Device().id)
    rkw = dict(kw, scheme=cfg.scheme, ring=ring)
    fw = local_ring_attention_forward(qs, ks, vs, **rkw)
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    bw = local_ring_attention_backward(dos, qs, ks, vs, os_, lses, **rkw)
    if cfg.check:
        names = ("o", "lse", "dq", "dk", "dv")
        got = [(os_[r], lses[r]) + tuple(bw[r]) for r in range(world)]
        out["rel_err"] = {nm: max(_rel(got[r][i], refs[r][i]) for r in range(world)) for i, nm in enumerate(names)}
        out["rel_limit"] = rel_limit("bfloat16" if cfg.dtype == "bf16" else "float16", cfg.hdim, cfg.hdim)
    del refs
    t_f = time_cuda(lambda: local_ring_attention_forward(qs, ks, vs, **rkw), warmup=cfg.warmup, repeat=cfg.repeat,
                    progress=False)
    t_b = time_cuda(lambda: local_ring_attention_backward(dos, qs, ks, vs, os_, lses, **rkw), warmup=cfg.warmup,
                    repeat=cfg.repeat, progress=False)
    tl_f, tl_b = [Timeline() for _ in range(world)], [Timeline() for _ in range(world)]
    local_ring_attention_forward(qs, ks, vs, timelines=tl_f, **rkw)
    local_ring_attention_backward(dos, qs, ks, vs, os_, lses, timelines=tl_b, **rkw)
    cp.cuda.get_current_stream().synchronize()
    spec = resolve_mask(None, cfg.causal, tuple(cfg.window))
    out.update({
        "ring": {"fwd_ms": t_f.median_ms, "bwd_ms": t_b.median_ms},
        "single": single,
        "flops": {m: attention_flops(cfg.batch, cfg.nhead, cfg.seqlen, cfg.seqlen, cfg.hdim, cfg.hdim, spec, m)
                  for m in ("fwd", "bwd")},
        "timeline": [{"rank": r, "fwd": timeline_report(tl_f[r].summary()), "bwd": timeline_report(tl_b[r].summary())}
                     for r in range(world)],
    })
    return out


# --------------------------------------------------------------------------- command line


def _window(text: str) -> tuple[int, int]:
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected L,R (two integers, -1 = unlimited), got {text!r}") from None
    return left, right


class _Parser(argparse.ArgumentParser):
    """argparse takes the ``-1,0`` of ``--window -1,0`` for an option (it starts with ``-`` and is
    not a plain negative number) and reports that --window expected one argument; such a value
    is joined to its option (``--window=-1,0``) first."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        out, i = [], 0
        while i < len(args):
            if args[i] == "--window" and i + 1 < len(args) and re.fullmatch(r"\s*-\d+\s*,\s*-?\d+\s*", args[i + 1]):
                out.append(f"--window={args[i + 1]}")
                i += 2
            else:
                out.append(args[i])
                i += 1
        return super().parse_known_args(out, namespace)


def build_parser(prog: str = "python -m cupy_fmha.parallel.run") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Ring attention over NCCL, one process per GPU: check "
                "against one-GPU attention and time forward and backward.")
    p.add_argument("--nproc", type=int, required=True, help="ranks (processes, one GPU each)")
    p.add_argument("--seqlen", "-s", type=int, default=RunConfig.seqlen, help="global sequence length")
    p.add_argument("--batch", "-b", type=int, default=RunConfig.batch)
    p.add_argument("--nhead", type=int, default=RunConfig.nhead)
    p.add_argument("--nhead-k", type=int, default=None, help="K/V heads (GQA); default --nhead")
    p.add_argument("--hdim", "-d", type=int, default=RunConfig.hdim)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default=RunConfig.dtype)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=RunConfig.causal)
    p.add_argument("--window", type=_window, default=(-1, -1), help="sliding window L,R (-1 = unlimited)")
    p.add_argument("--layout", choices=("bshd", "bhsd"), default=RunConfig.layout)
    p.add_argument("--scheme", choices=("zigzag", "contiguous"), default=RunConfig.scheme)
    p.add_argument("--warmup", type=int, default=RunConfig.warmup)
    p.add_argument("--repeat", type=int, default=RunConfig.repeat)
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare with one-GPU attention of the whole problem (on every rank's GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait for the ranks")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def config_from_args(a) -> RunConfig:
    return RunConfig(seqlen=a.seqlen, batch=a.batch, nhead=a.nhead, nhead_k=a.nhead_k, hdim=a.hdim, dtype=a.dtype,
                     causal=a.causal, window=tuple(a.window), layout=a.layout, scheme=a.scheme, warmup=a.warmup,
                     repeat=a.repeat, check=a.check, seed=a.seed)


def main(argv=None) -> int:
    """The command line; exit status 0 when every check passes, 1 when one fails, 2 for bad
    arguments or a launch that could not run."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        if a.nproc < 1:
            raise ValueError(f"--nproc: expected at least 1, got {a.nproc}")
        cfg = config_from_args(a).validate(a.nproc)
        res = launch(run_rank, a.nproc, (cfg,), timeout=a.timeout)
    except (ValueError, TypeError, RuntimeError) as exc:
        print(f"cupy_fmha.parallel.run: error: {exc}", file=sys.stderr)
        return 2
    ok = all(all(e <= r["rel_limit"] for e in r.get("rel_err", {}).values()) for r in res)
    if a.json:
        print(json.dumps({"config": asdict(cfg), "ranks": res, "ok": ok}))
    else:
        print(f"ring attention: {a.nproc} ranks, {cfg.dtype} b={cfg.batch} h={cfg.nhead}/{cfg.nhead_k} "
              f"s={cfg.seqlen} d={cfg.hdim} causal={cfg.causal} window={cfg.window} {cfg.scheme}")
        for r in res:
            errs = " ".join(f"{k} {v:.2e}" for k, v in r.get("rel_err", {}).items())
            print(f"  rank {r['rank']} (GPU {r['device']}): fwd {r['ring']['fwd_ms']:.3f} ms, bwd "
                  f"{r['ring']['bwd_ms']:.3f} ms" + (f" | rel err vs one GPU: {errs}" if errs else ""))
        print("check: " + ("passed" if ok else "FAILED") if cfg.check else "check: skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
