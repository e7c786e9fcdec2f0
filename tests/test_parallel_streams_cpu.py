"""The ordering of ring attention's GPU work, checked on the CPU with a stream simulator.

The GPU ring runs each rank's attention on a compute stream and its transfers on a
communication stream, ordered only by CUDA events; a missing wait is a race that a GPU run may
or may not show. Here the same generator code (cupy_fmha/parallel/ring.py) runs with the NumPy
model's maths under a simulator of CUDA streams and events (vector clocks): every read and write
of a buffer is logged with its stream and that stream's clock, and two accesses from different
streams (one of them a write) must be ordered by the events waited on in between. The
simulator stands in for CuPy in the LocalRing's device mode (copies between the ranks on the
receiver's communication stream, the sender's stream waiting for the copy: NCCL's semantics) and
for the compute side (``SimOps``). The caller writes the inputs on its own stream and reads the
results there, so the ordering at the boundaries is checked too. A planted bug (a dropped wait)
must be caught.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from cupy_fmha.parallel import LocalRing, shard
from cupy_fmha.parallel import ring as RG
from cupy_fmha.parallel.ops import NumpyOps


class _Stream:
    def __init__(self, idx):
        self.idx = idx
        self.clock = {idx: 0}


class _Event:
    def __init__(self, clock):
        self.clock = dict(clock)


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Sim:
    """CUDA streams and events as vector clocks, with a race check on every logged access."""

    def __init__(self):
        self.streams = []
        self.caller = self.stream()
        self.current = self.caller
        self.log: dict = {}
        self.races: list = []

    # the LocalRing's device primitives (comm._CupyCuda's interface)
    def device(self, dev):
        return contextlib.nullcontext()

    def stream(self):
        s = _Stream(len(self.streams))
        self.streams.append(s)
        return s

    @contextlib.contextmanager
    def stream_context(self, s):
        prev, self.current = self.current, s
        try:
            yield s
        finally:
            self.current = prev

    def current_stream(self):
        return self.current

    def record(self, s):
        return _Event(s.clock)

    def wait(self, s, ev):
        for k, v in ev.clock.items():
            s.clock[k] = max(s.clock.get(k, 0), v)

    def copy(self, dst, src, s):
        self.access(s, src, "r")
        self.access(s, dst, "w")
        np.copyto(dst, src)

    def access(self, s, a, kind, what=""):
        s.clock[s.idx] += 1
        snap = dict(s.clock)
        root = _root(a)
        entry = self.log.setdefault(id(root), (root, []))
        for k2, idx2, c2, what2 in entry[1]:
            if idx2 == s.idx or (kind == "r" and k2 == "r"):
                continue
            if c2[idx2] > snap.get(idx2, 0):
                self.races.append(f"{kind} {what} on stream {s.idx} vs earlier {k2} {what2} on stream {idx2}")
        entry[1].append((kind, s.idx, snap, what))


class SimOps(NumpyOps):
    """The NumPy model's maths, with every buffer access logged on the simulated current stream."""

    def __init__(self, sim, drop_wait=None):
        self.sim = sim
        self.drop_wait = drop_wait  # a planted bug: which waits to skip
        self.waits = 0
        self.dlse_reads = 0

    def _r(self, *arrays, what=""):
        for a in arrays:
            self.sim.access(self.sim.current, a, "r", what)

    def current_stream(self):
        return self.sim.current

    def record(self, stream):
        return self.sim.record(stream)

    def wait(self, stream, event):
        self.waits += 1
        if event is None or (self.drop_wait is not None and self.drop_wait(self, stream)):
            return
        self.sim.wait(stream, event)

    def forward(self, q, k, v, *a):
        self._r(q, k, v, what="forward")
        return super().forward(q, k, v, *a)

    def backward(self, do, q, k, v, o, lse, *a, dlse=None):
        self._r(do, q, k, v, o, lse, *(() if dlse is None else (dlse,)), what="backward")
        self.dlse_reads += dlse is not None
        return super().backward(do, q, k, v, o, lse, *a, dlse=dlse)

    def accumulate(self, dst, src):
        self._r(src, what="accumulate")
        self.sim.access(self.sim.current, dst, "w", "accumulate")
        super().accumulate(dst, src)

    def cast(self, a, dtype):
        self._r(a, what="cast")
        return super().cast(a, dtype)

    def zeros(self, shape, dtype):
        z = super().zeros(shape, dtype)
        self.sim.access(self.sim.current, z, "w", "zeros")
        return z

    def contiguous(self, a):
        self._r(a, what="contiguous")
        return super().contiguous(a)


def _run(n, causal, drop_wait=None, scheme="zigzag", with_dlse=False):
    rng = np.random.default_rng(n)
    b, s, hq, hk, d = 1, 4 * n, 2, 1, 8
    q, k, v, do = (rng.standard_normal((b, s, h, d)) for h in (hq, hk, hk, hq))
    sh = lambda x, axis=1: [shard(x, r, n, scheme=scheme, axis=axis) for r in range(n)]  # noqa: E731
    qs, ks, vs, dos = sh(q), sh(k), sh(v), sh(do)
    dlses = sh(rng.standard_normal((b, hq, s)).astype(np.float32), 2) if with_dlse else [None] * n
    sim = Sim()
    for a in qs + ks + vs + dos + [x for x in dlses if x is not None]:  # the caller made the inputs on its stream
        sim.access(sim.caller, a, "w", "input")
    host = LocalRing(n)  # the checks want a host ring for NumPy arrays; the run uses the simulator
    kw = {"causal": causal, "scheme": scheme}
    ops = SimOps(sim, drop_wait)
    ring = LocalRing(n, device=0, _cuda=sim)
    ops.comm_ids = {st.idx for st in ring.comm_streams}
    setups = [dataclasses.replace(RG._check_forward(qs[r], ks[r], vs[r], host.ranks[r], **kw), ops=ops) for r in range(n)]
    fw = ring.drive([RG._forward_steps(setups[r], qs[r], ks[r], vs[r], ring.ranks[r], None) for r in range(n)])
    os_, lses = [f[0] for f in fw], [f[1] for f in fw]
    for a in os_ + lses:
        sim.access(sim.caller, a, "r", "result")
    setups = [dataclasses.replace(RG._check_backward(dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], host.ranks[r],
                                                     dlse=dlses[r], **kw), ops=ops) for r in range(n)]
    bw = ring.drive([RG._backward_steps(setups[r], dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r], None,
                                        dlses[r]) for r in range(n)])
    for g in bw:
        for a in g:
            sim.access(sim.caller, a, "r", "result")
    for a in qs + ks + vs + [x for x in dlses if x is not None]:  # the caller may overwrite its inputs now
        sim.access(sim.caller, a, "w", "reuse")
    return sim, ops


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
def test_ring_streams_are_ordered(n, causal, scheme):
    sim, ops = _run(n, causal, scheme=scheme)
    assert not sim.races, "\n".join(sim.races[:10])
    if n > 1:
        assert ops.waits > 0


@pytest.mark.parametrize("n", [2, 3])
def test_ring_streams_are_ordered_with_dlse(n):
    """lse's cotangent is read by every backward call (on the compute streams), ordered after the
    caller's writes and before its reuse like the other inputs."""
    sim, ops = _run(n, True, with_dlse=True)
    assert not sim.races, "\n".join(sim.races[:10])
    assert ops.dlse_reads > 0


@pytest.mark.parametrize("which", ["compute", "comm"])
def test_a_dropped_wait_is_caught(which):
    """Skipping every wait of the compute stream on the communication stream (or the reverse)
    is a race the simulator reports: the check is not vacuous."""
    def drop(ops, stream):
        return (stream.idx in ops.comm_ids) == (which == "comm")

    sim, _ = _run(3, True, drop_wait=drop)
    assert sim.races


@pytest.mark.parametrize("n", [2, 3])
def test_every_compute_wait_is_needed(n):
    """Each single wait of a compute stream for a transfer (K/V arrived, dK/dV buffer arrived),
    dropped alone, is caught; the waits of the communication streams that go uncaught guard
    buffers on their first use only (fresh receive buffers), as expected."""
    _, ops = _run(n, True)
    compute_waits = []

    def spy(o, stream):
        if stream.idx not in o.comm_ids:
            compute_waits.append(o.waits - 1)
        return False

    _run(n, True, drop_wait=spy)
    assert compute_waits
    for i in compute_waits:
        sim, _ = _run(n, True, drop_wait=lambda o, s, i=i: o.waits - 1 == i)
        assert sim.races, f"dropping wait {i} went unnoticed"
