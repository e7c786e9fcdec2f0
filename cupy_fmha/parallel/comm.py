"""Communicators for ring attention: each rank sends to the next rank and receives from the
previous one, on a communication stream of its own.

* :class:`NcclRing`: one process per GPU over NCCL point-to-point (``cupy.cuda.nccl``: a
  ``NcclCommunicator`` made from a unique id that rank 0 creates with :func:`nccl_unique_id` and
  hands to every other process, e.g. through a ``multiprocessing`` pipe as
  :mod:`cupy_fmha.parallel.run` does; the sends and receives of one exchange go inside
  ``groupStart()`` / ``groupEnd()`` so they cannot deadlock). A ring of size 1 is a 1-rank
  communicator (ring attention then never exchanges anything).
* :class:`LocalRing`: ``world_size`` ranks inside one process, for tests and for emulating a
  ring on one GPU (NCCL refuses two ranks on one GPU, "Duplicate GPU detected"). Sends become
  device-to-device copies (NumPy copies for host arrays) between the ranks' buffers, ordered by
  CUDA events as NCCL would order them: the copy waits until the sender's stream reaches the
  exchange, and the sender's stream waits until the copy is done before reusing the buffer.
  The ranks run in lockstep in one thread (:meth:`LocalRing.drive`).

The interface ring attention needs is :class:`Communicator`: ``rank``, ``world_size``,
``stream`` (the CuPy stream transfers run on; None on the host) and ``exchange(sends, recvs)``.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from .._checks import check_int
from .layout import check_world

__all__ = ["Communicator", "NcclRing", "LocalRing", "LocalRank", "nccl_unique_id", "nccl_available"]


class Communicator:
    """A rank's view of a ring: send to ``(rank + 1) % world_size``, receive from
    ``(rank - 1) % world_size``.

    Attributes:
        rank, world_size: ints, ``0 <= rank < world_size``.
        stream: the CuPy stream exchanges are enqueued on (None for host arrays).
        device: the CUDA device id the rank's arrays live on (None for host arrays).
    """

    rank: int = 0
    world_size: int = 1
    stream = None
    device = None

    @property
    def next_rank(self) -> int:
        return (self.rank + 1) % self.world_size

    @property
    def prev_rank(self) -> int:
        return (self.rank - 1) % self.world_size

    def exchange(self, sends, recvs) -> None:
        """Enqueue on :attr:`stream`: send each array of ``sends`` to the next rank and receive
        into each array of ``recvs`` from the previous rank (``recvs[i]`` gets the previous
        rank's ``sends[i]``; same shapes and dtypes on every rank). Contiguous arrays only.
        Returns at once; work that reads ``recvs`` must wait for an event recorded on
        :attr:`stream` after this call (and, for :class:`LocalRing`, after every rank posted)."""
        raise NotImplementedError


def _check_buffers(sends, recvs, what: str) -> None:
    sends, recvs = list(sends), list(recvs)
    if len(sends) != len(recvs):
        raise ValueError(f"{what}: {len(sends)} sends but {len(recvs)} receives")
    for i, (s, r) in enumerate(zip(sends, recvs)):
        if s.nbytes != r.nbytes or s.dtype != r.dtype:
            raise ValueError(f"{what}: send {i} ({s.dtype}, {s.nbytes} B) does not match receive {i} "
                             f"({r.dtype}, {r.nbytes} B)")
        for name, a in (("send", s), ("receive", r)):
            if not a.flags.c_contiguous:
                raise ValueError(f"{what}: {name} buffer {i} is not contiguous")


# --------------------------------------------------------------------------- NCCL


def nccl_available() -> bool:
    """Whether ``cupy.cuda.nccl`` loaded its library (False without CuPy or libnccl)."""
    try:
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - CuPy missing or broken
        return False
    return bool(getattr(nccl, "available", False))


def _nccl():
    if not nccl_available():
        raise RuntimeError("NCCL is not available: cupy.cuda.nccl could not load libnccl (install "
                           "nvidia-nccl-cu13 or nvidia-nccl-cu12 to match your CuPy)")
    from cupy.cuda import nccl

    return nccl


def nccl_unique_id():
    """A new NCCL unique id (``cupy.cuda.nccl.get_unique_id()``), made once by rank 0 and sent to
    every other rank (it pickles). Sets ``NCCL_NVLS_ENABLE=0`` in this process unless set."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    return _nccl().get_unique_id()


class NcclRing(Communicator):
    """One process's rank of a ring over NCCL.

    Args:
        world_size: ranks in the ring (processes, one GPU each).
        rank: this process's rank.
        unique_id: :func:`nccl_unique_id` from rank 0 (the same object on every rank).
        device: the CUDA device of this rank (default: the current device). The communicator,
            its stream and every array handed to ring attention live there.

    ``NCCL_NVLS_ENABLE`` is set to 0 in this process unless already set (ring attention needs
    only point-to-point transfers; NVLink multicast is kept off). Collective: every rank must
    construct its communicator (``ncclCommInitRank`` blocks until all have joined).

    Raises:
        TypeError, ValueError: bad ``world_size`` / ``rank`` / ``device`` (a non-negative int).
        RuntimeError: NCCL not available.
    """

    def __init__(self, world_size: int, rank: int, unique_id, *, device: int | None = None):
        self.world_size = check_world(world_size, rank)
        self.rank = int(rank)
        device = None if device is None else check_int("device", device, 0, what="a CUDA device id (int)")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        nccl = _nccl()
        import cupy

        self.device = cupy.cuda.Device().id if device is None else device
        with cupy.cuda.Device(self.device):
            self._comm = nccl.NcclCommunicator(self.world_size, unique_id, self.rank)
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self._nccl = nccl

    def exchange(self, sends, recvs) -> None:
        _check_buffers(sends, recvs, "exchange")
        nccl, comm, sp = self._nccl, self._comm, self.stream.ptr
        nccl.groupStart()
        try:
            for s in sends:
                comm.send(s.data.ptr, s.nbytes, nccl.NCCL_UINT8, self.next_rank, sp)
            for r in recvs:
                comm.recv(r.data.ptr, r.nbytes, nccl.NCCL_UINT8, self.prev_rank, sp)
        finally:
            nccl.groupEnd()

    def close(self) -> None:
        """Free the NCCL communicator (after the stream's work is done)."""
        if getattr(self, "_comm", None) is not None:
            self.stream.synchronize()
            self._comm.destroy()
            self._comm = None


# --------------------------------------------------------------------------- in-process ring


class _CupyCuda:
    """The few CUDA primitives a device LocalRing uses, through CuPy (a test substitutes a
    simulator that checks the ordering)."""

    def __init__(self):
        import cupy

        self._cp = cupy

    def device(self, dev):
        return self._cp.cuda.Device(dev)

    def stream(self):
        return self._cp.cuda.Stream(non_blocking=True)

    def stream_context(self, stream):
        return stream

    def current_stream(self):
        return self._cp.cuda.get_current_stream()

    def record(self, stream):
        ev = self._cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def copy(self, dst, src, stream) -> None:
        if src.nbytes:
            dst.data.copy_from_device_async(src.data, src.nbytes, stream)


class LocalRank(Communicator):
    """One rank of a :class:`LocalRing` (made by it; not constructed directly)."""

    def __init__(self, ring: "LocalRing", rank: int):
        self._ring = ring
        self.rank = rank
        self.world_size = ring.world_size
        self.device = ring.device
        self.stream = ring.comm_streams[rank] if ring.comm_streams else None

    def exchange(self, sends, recvs) -> None:
        self._ring._post(self.rank, list(sends), list(recvs))


class LocalRing:
    """``world_size`` ranks of a ring in one process.

    Args:
        world_size: ranks (>= 1).
        device: None for host (NumPy) arrays; a CUDA device id (an int >= 0) for CuPy arrays
            on that device (every rank's arrays live there; each rank gets a compute stream and
            a communication stream of its own, non-blocking).

    ``ranks[r]`` is rank r's :class:`Communicator`; :meth:`drive` runs one generator per rank in
    lockstep (each generator yields right after posting an exchange; when every rank has posted,
    the copies are enqueued).
    """

    def __init__(self, world_size: int, *, device: int | None = None, _cuda=None):
        self.world_size = check_world(world_size)
        self.device = None if device is None else check_int("device", device, 0, what="a CUDA device id (int)")
        self.comm_streams = self.compute_streams = None
        self._cuda = None
        if self.device is not None:
            self._cuda = _cuda if _cuda is not None else _CupyCuda()
            with self._cuda.device(self.device):
                self.comm_streams = [self._cuda.stream() for _ in range(self.world_size)]
                self.compute_streams = [self._cuda.stream() for _ in range(self.world_size)]
        self.ranks = [LocalRank(self, r) for r in range(self.world_size)]
        self._posted: dict = {}
        self.exchanges = 0  #: completed exchanges (every rank posted), for tests

    # -- exchanges
    def _post(self, rank: int, sends, recvs) -> None:
        if rank in self._posted:
            raise RuntimeError(f"local ring: rank {rank} posted a second exchange before every rank posted its "
                               "first (ranks out of step)")
        _check_buffers(sends, recvs, f"exchange (rank {rank})")
        ev = None if self._cuda is None else self._cuda.record(self.comm_streams[rank])
        self._posted[rank] = (sends, recvs, ev)
        if len(self._posted) == self.world_size:
            self._flush()

    def _flush(self) -> None:
        n, posted = self.world_size, self._posted
        for r in range(n):
            src_sends = posted[(r - 1) % n][0]
            recvs = posted[r][1]
            if len(src_sends) != len(recvs):
                raise RuntimeError(f"local ring: rank {(r - 1) % n} sends {len(src_sends)} arrays, rank {r} "
                                   f"receives {len(recvs)}")
            for i, (s, d) in enumerate(zip(src_sends, recvs)):
                if s.shape != d.shape or s.dtype != d.dtype:
                    raise RuntimeError(f"local ring: rank {(r - 1) % n}'s send {i} {s.shape} {s.dtype} does not "
                                       f"match rank {r}'s receive {d.shape} {d.dtype}")
        cuda = self._cuda
        if cuda is None:
            # every source is read before any destination is written: a rank's send buffer is
            # never another's receive buffer, so plain copies in any order are right
            for r in range(n):
                for s, d in zip(posted[(r - 1) % n][0], posted[r][1]):
                    np.copyto(d, s)
        else:
            done = []
            with cuda.device(self.device):
                for r in range(n):  # the receiver's stream copies once the sender's reached the exchange
                    stream = self.comm_streams[r]
                    cuda.wait(stream, posted[(r - 1) % n][2])
                    for s, d in zip(posted[(r - 1) % n][0], posted[r][1]):
                        cuda.copy(d, s, stream)
                    done.append(cuda.record(stream))
                for r in range(n):  # a sender reuses its buffers only after its receiver copied
                    cuda.wait(self.comm_streams[r], done[(r + 1) % n])
        self._posted = {}
        self.exchanges += 1

    # -- running the ranks
    def rank_context(self, rank: int):
        """The device and rank ``rank``'s compute stream (a null context on the host)."""
        if self._cuda is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self._cuda.device(self.device))
        stack.enter_context(self._cuda.stream_context(self.compute_streams[rank]))
        return stack

    def drive(self, gens) -> list:
        """Run one generator per rank (rank order) to completion in lockstep; returns their
        return values. On the GPU the ranks' streams first wait for the caller's current stream,
        and the caller's current stream then waits for every rank's compute stream, so inputs
        and results are ordered with the caller's work.

        Raises:
            RuntimeError: the ranks did not post the same number of exchanges.
        """
        gens = list(gens)
        if len(gens) != self.world_size:
            raise ValueError(f"gens: expected {self.world_size} generators (one per rank), got {len(gens)}")
        results, live = [None] * self.world_size, list(range(self.world_size))
        self._posted = {}
        cuda = self._cuda
        if cuda is not None:
            with cuda.device(self.device):
                ready = cuda.record(cuda.current_stream())
                for s in self.compute_streams + self.comm_streams:
                    cuda.wait(s, ready)
        while live:
            finished = []
            for r in live:
                with self.rank_context(r):
                    try:
                        next(gens[r])
                    except StopIteration as stop:
                        results[r] = stop.value
                        finished.append(r)
            if finished and len(finished) != len(live):
                raise RuntimeError(f"local ring: ranks {finished} finished while ranks "
                                   f"{sorted(set(live) - set(finished))} still exchange (ranks out of step)")
            if self._posted:
                raise RuntimeError(f"local ring: ranks {sorted(self._posted)} posted an exchange that not every "
                                   "rank joined (ranks out of step)")
            live = [r for r in live if r not in finished]
        if cuda is not None:
            with cuda.device(self.device):
                caller = cuda.current_stream()
                for s in self.compute_streams:
                    cuda.wait(caller, cuda.record(s))
        return results
