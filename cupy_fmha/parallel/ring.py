"""Ring attention (context parallelism): one self-attention whose sequence is split across the
ranks of a ring, forward and backward.

Method: Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
Context" (2023). Each rank keeps its query shard; the K/V shards travel around the ring, one hop
per step, so after ``world`` steps every query has met every key. Per step a rank runs this
library's attention on the visiting shard (the calls of :mod:`cupy_fmha.parallel.plan`: chunk
pairs the mask hides are skipped, fully visible ones run unmasked, the rest with the mask shifted
by the chunk offsets) and folds the partial ``(o, lse)`` into float32 accumulators by their
log-sum-exp (:mod:`cupy_fmha.parallel.merge`). The next K/V shard is received while the current
one computes: K/V are double-buffered and the transfers run on the communicator's own stream,
ordered against the compute stream by CUDA events.

Backward: with the global ``o`` and ``lse`` every step's ``attention_backward`` gives the exact
share of that K/V shard in dQ, dK and dV (and so with lse's cotangent ``dlse``: it enters per row,
as ``D - dlse``, so every call over a row takes that row's dlse). dQ accumulates locally in float32; dK/dV shares travel
around the ring in float32 buffers that follow their K/V shard one step behind: at step ``s``
rank ``r`` adds its share for the shard of rank ``r - s`` into the buffer received from rank ``r -
1`` and passes it on; after the last step one more hop brings every buffer home to its owner,
summed over all ranks.

Data layout: each rank holds ``seqlen / world`` tokens of q, k, v (and o, lse, do, dq, dk, dv)
in the order :mod:`cupy_fmha.parallel.layout` gives (zigzag by default). The functions here take
this rank's shards and its :class:`~cupy_fmha.parallel.comm.Communicator`;
:func:`local_ring_attention_forward` / :func:`local_ring_attention_backward` run all ranks of a
:class:`~cupy_fmha.parallel.comm.LocalRing` in one process (one GPU, or NumPy on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validate import (
    _check_mask,
    _is_bf16,
    check_backward_inputs,
    check_dlse,
    check_forward_inputs,
    check_reference_inputs,
)
from .comm import Communicator, LocalRank, LocalRing
from .layout import check_scheme, chunks_per_rank
from .merge import merge_into
from .ops import CupyOps, NumpyOps, ops_for
from .plan import RankPlan, global_window, plan_rank

__all__ = ["ring_attention_forward", "ring_attention_backward", "local_ring_attention_forward",
           "local_ring_attention_backward", "Timeline"]


# --------------------------------------------------------------------------- timeline


class Timeline:
    """Per-step timing of one rank's ring pass: CUDA events on the compute and communication
    streams (host timestamps on the CPU model). Pass one as ``timeline=``; after the call,
    :meth:`summary` (which waits for the events) gives milliseconds from the pass's start.

    Kinds: ``"compute"`` (step ``s``'s attention calls and merges / accumulations), ``"kv"``
    (the transfer of the K/V shard used at step ``s``, which runs during step ``s - 1``),
    ``"dkv"`` (backward: the dK/dV buffer sent after step ``s``).
    """

    def __init__(self):
        self._ops = None
        self._start = None
        self._marks: list = []  # (kind, step, begin, end)
        self._open: dict = {}

    def _begin_pass(self, ops, stream):
        self._ops, self._start = ops, ops.timer(stream)
        self._marks.clear()

    def _begin(self, kind, step, stream):
        self._open[(kind, step)] = self._ops.timer(stream)

    def _end(self, kind, step, stream):
        self._marks.append((kind, step, self._open.pop((kind, step)), self._ops.timer(stream)))

    def summary(self) -> list[dict]:
        """``[{"kind", "step", "start_ms", "end_ms", "ms"}]`` in recording order."""
        if self._ops is None:
            return []
        ms = self._ops.elapsed_ms
        out = []
        for kind, step, b, e in self._marks:
            s0, s1 = ms(self._start, b), ms(self._start, e)
            out.append({"kind": kind, "step": step, "start_ms": s0, "end_ms": s1, "ms": s1 - s0})
        return out


class _NoTimeline:
    def _begin_pass(self, ops, stream):
        pass

    def _begin(self, kind, step, stream):
        pass

    def _end(self, kind, step, stream):
        pass


# --------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class _Setup:
    ops: object
    layout: str
    rank: int
    world: int
    plan: RankPlan
    scale: float
    dtype: np.dtype
    deterministic: bool


def _check_common(arrays, comm, layout, scheme, cu_seqlens_q, cu_seqlens_k):
    """The checks before the library's own: comm, group mode, scheme, array kind."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None or layout == "thd":
        name = "cu_seqlens_q" if cu_seqlens_q is not None else ("cu_seqlens_k" if cu_seqlens_k is not None else "layout")
        raise NotImplementedError(
            f"{name}: group mode (layout='thd' with cu_seqlens_q/cu_seqlens_k, packed variable-length "
            "sequences) is not implemented for ring attention; use batch mode (bshd/bhsd) with sequences "
            "padded to one length")
    if not isinstance(comm, Communicator):
        raise TypeError(f"comm: expected a cupy_fmha.parallel Communicator (NcclRing or a LocalRing rank), "
                        f"got {type(comm).__name__}")
    check_scheme(scheme)
    (first_name, first), *rest = arrays
    ops = ops_for(first)
    if ops is None:
        raise TypeError(f"{first_name}: ring attention takes CuPy arrays (or NumPy arrays for the CPU model), "
                        f"got {type(first).__module__}.{type(first).__name__}")
    for name, a in rest:
        if type(a) is not type(first):
            raise TypeError(f"{name}: a {type(a).__module__}.{type(a).__name__}, but {first_name} is a "
                            f"{type(first).__module__}.{type(first).__name__}; pass one kind of array")
    if isinstance(ops, CupyOps):
        if first.dtype == np.uint16:
            raise TypeError(f"{first_name}: ring attention takes native float16 or bfloat16 CuPy arrays (CuPy 14's "
                            "bfloat16), not uint16 bits")
        if comm.device is not None:
            for name, a in arrays:
                if a.device.id != comm.device:
                    raise ValueError(f"{name}: array is on GPU {a.device.id}, but the communicator's device is "
                                     f"{comm.device}")
            current = ops.xp.cuda.Device().id
            if current != comm.device and not isinstance(comm, LocalRank):
                raise ValueError(f"comm: its device is GPU {comm.device} but the current device is {current}; "
                                 f"call under `with cupy.cuda.Device({comm.device}):`")
        elif comm.world_size > 1:
            raise ValueError("comm: a host (NumPy) ring cannot carry CuPy arrays; make the LocalRing with "
                             "device=<GPU id>")
    elif comm.device is not None:
        raise ValueError(f"{first_name}: NumPy arrays need a host ring (LocalRing(world_size) without device=)")
    return ops


def _setup(ops, prob, comm, *, causal, window_size, mask, scheme, deterministic) -> _Setup:
    if prob.seqlen_q != prob.seqlen_k:
        raise ValueError(f"k: this rank's K/V shard holds {prob.seqlen_k} tokens but its query shard {prob.seqlen_q}; "
                         "ring attention splits one self-attention sequence, every shard holds seqlen / world "
                         "tokens")
    per = chunks_per_rank(scheme)
    if prob.seqlen_q % per:
        raise ValueError(f"q: this rank's shard holds {prob.seqlen_q} tokens; the {scheme} scheme needs a multiple "
                         f"of {per} (chunks of seqlen / {per * comm.world_size} tokens); pad the sequence")
    seqlen = prob.seqlen_q * comm.world_size
    spec = _check_mask(mask, causal, window_size, seqlen, seqlen, allow_empty=False)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic: expected a bool, got {deterministic!r}")
    plan = plan_rank(comm.rank, comm.world_size, seqlen, global_window(spec, seqlen), scheme)
    return _Setup(ops, prob.layout, comm.rank, comm.world_size, plan, float(prob.softmax_scale),
                  np.dtype(prob.dtype), bool(deterministic))


def _check_forward(q, k, v, comm, *, causal=False, window_size=(-1, -1), mask=None, softmax_scale=None,
                   layout="bshd", scheme="zigzag", cu_seqlens_q=None, cu_seqlens_k=None) -> _Setup:
    ops = _check_common([("q", q), ("k", k), ("v", v)], comm, layout, scheme, cu_seqlens_q, cu_seqlens_k)
    check = check_reference_inputs if isinstance(ops, NumpyOps) else check_forward_inputs
    prob = check(q, k, v, softmax_scale=softmax_scale, layout=layout)
    return _setup(ops, prob, comm, causal=causal, window_size=window_size, mask=mask, scheme=scheme,
                  deterministic=False)


def _check_backward(do, q, k, v, o, lse, comm, *, causal=False, window_size=(-1, -1), mask=None,
                    softmax_scale=None, layout="bshd", scheme="zigzag", deterministic=False, cu_seqlens_q=None,
                    cu_seqlens_k=None, dlse=None) -> _Setup:
    ops = _check_common([("do", do), ("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)], comm, layout, scheme,
                        cu_seqlens_q, cu_seqlens_k)
    if isinstance(ops, NumpyOps):
        prob = check_reference_inputs(q, k, v, [("o", o), ("do", do)], softmax_scale=softmax_scale, layout=layout)
        want = (prob.batch, prob.nhead_q, prob.seqlen_q)
        if lse.ndim != 3 or tuple(lse.shape) != want:
            raise ValueError(f"lse: expected shape {want} ([batch, nhead_q, seqlen_q]), got {tuple(lse.shape)}")
        # an int lse would be used truncated, a complex one without its imaginary part
        if lse.dtype.kind != "f" and not _is_bf16(lse.dtype):
            raise TypeError(f"lse: expected a floating-point array (the forward's lse), got dtype {lse.dtype}")
    else:
        prob = check_backward_inputs(do, q, k, v, o, lse, softmax_scale=softmax_scale, layout=layout)
    _check_ring_dlse(dlse, lse, ops, comm)
    return _setup(ops, prob, comm, causal=causal, window_size=window_size, mask=mask, scheme=scheme,
                  deterministic=deterministic)


def _check_ring_dlse(dlse, lse, ops, comm) -> None:
    """``dlse`` (None, or float32 of lse's shape: :func:`cupy_fmha.validate.check_dlse`, on both
    paths), and of lse's kind and device: the ring slices it per call, so a host array under CuPy
    would be copied over once per call, off the compute stream's order."""
    if dlse is None:
        return
    check_dlse(dlse, lse, [("lse", lse)])
    if type(dlse) is not type(lse):
        raise TypeError(f"dlse: a {type(dlse).__module__}.{type(dlse).__name__}, but lse is a "
                        f"{type(lse).__module__}.{type(lse).__name__}; pass one kind of array")
    if isinstance(ops, CupyOps) and comm.device is not None and dlse.device.id != comm.device:
        raise ValueError(f"dlse: array is on GPU {dlse.device.id}, but the communicator's device is {comm.device}")


# --------------------------------------------------------------------------- the ring passes


def _rows(a, start: int, stop: int, layout: str):
    """Rows [start, stop) of a q-like array in ``layout``."""
    return a[:, start:stop] if layout == "bshd" else a[:, :, start:stop]


def _forward_steps(st: _Setup, q, k, v, comm, timeline):
    """Generator: one rank's forward pass. Yields right after each exchange it posts (so that a
    LocalRing can run all ranks in lockstep); returns (o, lse)."""
    ops, xp, lay, n = st.ops, st.ops.xp, st.layout, st.world
    tl = timeline if timeline is not None else _NoTimeline()
    compute, cstream = ops.current_stream(), comm.stream
    tl._begin_pass(ops, compute)
    k0, v0 = ops.contiguous(k), ops.contiguous(v)
    # step 0 reads the caller's K/V (never written); later steps alternate between two buffers
    spare = [(xp.empty_like(k0), xp.empty_like(v0)) for _ in range(min(n - 1, 2))]
    kv = lambda s: (k0, v0) if s == 0 else spare[(s - 1) % 2]  # noqa: E731
    o_acc = xp.zeros(q.shape[:-1] + (v.shape[-1],), dtype=ops.acc_dtype)
    lse_acc = xp.full(_lse_shape(q, lay), -np.inf, dtype=ops.acc_dtype)
    prev_done = ops.record(compute)  # the K/V copies above, for the first send
    arrived = None
    for step in st.plan.steps:
        s = step.index
        kc, vc = kv(s)
        if s + 1 < n:  # receive the next shard while this one computes
            ops.wait(cstream, prev_done)
            tl._begin("kv", s + 1, cstream)
            comm.exchange([kc, vc], list(kv(s + 1)))
            yield
            tl._end("kv", s + 1, cstream)
            next_arrived = ops.record(cstream)
        if s > 0:
            ops.wait(compute, arrived)
        tl._begin("compute", s, compute)
        for c in step.calls:
            o_p, lse_p = ops.forward(_rows(q, c.q0, c.q1, lay), _rows(kc, c.k0, c.k1, lay),
                                     _rows(vc, c.k0, c.k1, lay), c.mask, st.scale, lay)
            merge_into(_rows(o_acc, c.q0, c.q1, lay), lse_acc[:, :, c.q0:c.q1], o_p, lse_p, lay)
        tl._end("compute", s, compute)
        prev_done = ops.record(compute)
        if s + 1 < n:
            arrived = next_arrived
    return ops.cast(o_acc, st.dtype), ops.cast(lse_acc, ops.lse_dtype)


def _backward_steps(st: _Setup, do, q, k, v, o, lse, comm, timeline, dlse=None):
    """Generator: one rank's backward pass (see :func:`_forward_steps`); returns (dq, dk, dv).
    ``dlse``: this rank's rows of lse's cotangent, or None."""
    ops, xp, lay, n = st.ops, st.ops.xp, st.layout, st.world
    tl = timeline if timeline is not None else _NoTimeline()
    compute, cstream = ops.current_stream(), comm.stream
    tl._begin_pass(ops, compute)
    k0, v0 = ops.contiguous(k), ops.contiguous(v)
    spare = [(xp.empty_like(k0), xp.empty_like(v0)) for _ in range(min(n - 1, 2))]
    kv = lambda s: (k0, v0) if s == 0 else spare[(s - 1) % 2]  # noqa: E731
    dq_acc = xp.zeros(q.shape, dtype=ops.acc_dtype)
    # dK/dV shares travelling with the K/V shards: [0] starts as zeros, [1] is the receive side
    dkv = [(ops.zeros(k0.shape, ops.acc_dtype), ops.zeros(v0.shape, ops.acc_dtype))]
    if n > 1:
        dkv.append((xp.empty_like(dkv[0][0]), xp.empty_like(dkv[0][1])))
    prev_done = ops.record(compute)
    arrived = dkv_arrived = None
    for step in st.plan.steps:
        s = step.index
        kc, vc = kv(s)
        if s + 1 < n:
            ops.wait(cstream, prev_done)
            tl._begin("kv", s + 1, cstream)
            comm.exchange([kc, vc], list(kv(s + 1)))
            yield
            tl._end("kv", s + 1, cstream)
            next_arrived = ops.record(cstream)
        if s > 0:
            ops.wait(compute, arrived)
        tl._begin("compute", s, compute)
        shares = []
        for c in step.calls:
            dq_p, dk_p, dv_p = ops.backward(
                _rows(do, c.q0, c.q1, lay), _rows(q, c.q0, c.q1, lay), _rows(kc, c.k0, c.k1, lay),
                _rows(vc, c.k0, c.k1, lay), _rows(o, c.q0, c.q1, lay), lse[:, :, c.q0:c.q1], c.mask, st.scale, lay,
                st.deterministic, dlse=None if dlse is None else dlse[:, :, c.q0:c.q1])
            ops.accumulate(_rows(dq_acc, c.q0, c.q1, lay), dq_p)
            shares.append((c, dk_p, dv_p))
        if s > 0:
            ops.wait(compute, dkv_arrived)  # the travelling buffer for this K/V shard is here
        tk, tv = dkv[s % 2]
        for c, dk_p, dv_p in shares:
            ops.accumulate(_rows(tk, c.k0, c.k1, lay), dk_p)
            ops.accumulate(_rows(tv, c.k0, c.k1, lay), dv_p)
        tl._end("compute", s, compute)
        prev_done = ops.record(compute)
        if n > 1:  # pass the buffer on (after the last step: home to its owner)
            ops.wait(cstream, prev_done)
            tl._begin("dkv", s, cstream)
            comm.exchange([tk, tv], list(dkv[(s + 1) % 2]))
            yield
            tl._end("dkv", s, cstream)
            dkv_arrived = ops.record(cstream)
        if s + 1 < n:
            arrived = next_arrived
    if n > 1:
        ops.wait(compute, dkv_arrived)
    dk_f, dv_f = dkv[n % 2] if n > 1 else dkv[0]
    return ops.cast(dq_acc, st.dtype), ops.cast(dk_f, st.dtype), ops.cast(dv_f, st.dtype)


def _lse_shape(q, layout):
    b = q.shape[0]
    return (b, q.shape[2], q.shape[1]) if layout == "bshd" else (b, q.shape[1], q.shape[2])


def _check_timeline(timeline):
    if timeline is not None and not isinstance(timeline, Timeline):
        raise TypeError(f"timeline: expected a cupy_fmha.parallel.Timeline or None, got {type(timeline).__name__}")
    return timeline


def _run_alone(gen, comm):
    """Run one rank's pass whose exchanges complete on their own (NCCL, or a 1-rank ring)."""
    if isinstance(comm, LocalRank) and comm.world_size > 1:
        raise ValueError("comm: a LocalRing rank cannot run alone (its exchanges need every rank); use "
                         "local_ring_attention_forward / local_ring_attention_backward")
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


# --------------------------------------------------------------------------- public


_DOC_SHARED = """
    Args (shared by the ring functions):
        comm: this rank's :class:`~cupy_fmha.parallel.comm.Communicator` (``NcclRing`` for one
            process per GPU; a ``LocalRing`` rank only through the ``local_*`` functions).
        causal, window_size, mask: the mask of the *global* problem, as in
            :func:`cupy_fmha.attention_forward`; with ``seqlen_q == seqlen_k`` bottom-right and
            top-left alignment coincide (causal: token ``i`` sees tokens ``j <= i`` in global
            positions).
        softmax_scale: default ``1 / sqrt(hdim_q)``.
        layout: ``"bshd"`` (default) or ``"bhsd"``; the sequence axis holds this rank's tokens.
        scheme: ``"zigzag"`` (default; this rank holds global chunks ``rank`` and
            ``2 * world - 1 - rank`` of ``seqlen / (2 * world)`` tokens, concatenated) or
            ``"contiguous"`` (chunk ``rank`` of ``seqlen / world``); see
            :mod:`cupy_fmha.parallel.layout` (``shard`` / ``unshard``).
        timeline: optional :class:`Timeline` that records per-step compute and transfer times.
        cu_seqlens_q, cu_seqlens_k: group mode is not implemented (``NotImplementedError``).
"""


def ring_attention_forward(q, k, v, comm, *, causal=False, window_size=(-1, -1), mask=None, softmax_scale=None,
                           layout="bshd", scheme="zigzag", timeline=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Ring attention forward for this rank: ``(o, lse)`` of its query shard over the whole
    sequence (every rank calls it with its own shards, collectively).

    Args:
        q: this rank's queries, [batch, seqlen / world, nhead_q, hdim_q] (``bshd``) or [batch,
            nhead_q, seqlen / world, hdim_q] (``bhsd``), in the scheme's token order; CuPy
            float16 or bfloat16 (native) on ``comm``'s device. NumPy arrays (any float dtype)
            run the CPU model of the same schedule (reference maths in float64).
        k, v: this rank's keys and values, [batch, seqlen / world, nhead_k, hdim_q / hdim_v]
            (``nhead_q % nhead_k == 0``: GQA/MQA).
    {shared}
    Returns:
        (o, lse): o like q with head dim hdim_v, q's dtype; lse float32 [batch, nhead_q, seqlen /
        world] (float64 on the CPU model), natural log, the log-sum-exp over the *whole*
        sequence (what :func:`ring_attention_backward` needs). Rows that see no key: o = 0,
        lse = -inf.

    Raises:
        TypeError, ValueError: bad input, named (shapes, dtypes, shard lengths that do not split
            into the scheme's chunks, a mask that hides everything, arrays on another device
            than ``comm``), before anything is sent or launched.
        NotImplementedError: group mode (``cu_seqlens_*``, ``layout="thd"``).
    """
    st = _check_forward(q, k, v, comm, causal=causal, window_size=window_size, mask=mask, softmax_scale=softmax_scale,
                        layout=layout, scheme=scheme, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return _run_alone(_forward_steps(st, q, k, v, comm, _check_timeline(timeline)), comm)


def ring_attention_backward(do, q, k, v, o, lse, comm, *, causal=False, window_size=(-1, -1), mask=None,
                            softmax_scale=None, layout="bshd", scheme="zigzag", deterministic=False, timeline=None,
                            cu_seqlens_q=None, cu_seqlens_k=None, dlse=None):
    """Ring attention backward for this rank: ``(dq, dk, dv)`` of its shards.

    Args:
        do: gradient of this rank's o, like o.
        q, k, v: as in :func:`ring_attention_forward`.
        o, lse: this rank's outputs of :func:`ring_attention_forward` (global lse).
        deterministic: passed to every :func:`cupy_fmha.attention_backward` call (the ring's own
            sums run in a fixed order).
        dlse: optional cotangent of this rank's lse (d loss / d lse, lse in natural-log units),
            float32 (on the CPU model too), lse's shape [batch, nhead_q, seqlen / world], the same
            kind of array as lse (CuPy on ``comm``'s device, or NumPy for the CPU model), any
            strides; sharded as lse (:func:`~cupy_fmha.parallel.layout.shard` with ``axis=2``).
            None (default): zero, a loss of o alone. Since d lse_i / d s_ij = P_ij it adds to dS
            (``dS = P * (dP - (D - dlse))``); D is per row, so every call over this rank's rows
            takes those rows' dlse (:func:`cupy_fmha.attention_backward`'s ``dlse``). dq and dk
            get the lse term, dv does not. Not modified.
    {shared}
    Returns:
        (dq, dk, dv) like q, k, v, in their dtype: dq of this rank's queries, dk/dv of this rank's
        keys and values summed over every rank's queries (and over each GQA group). Internally
        float32 (float64 on the CPU model); each step's partial gradients come out of the
        library's kernels in the inputs' dtype before they are added.

    Raises:
        As :func:`ring_attention_forward`; also do/o/lse shapes and dtypes; ``dlse`` (named) not
            an array (TypeError), not float32 (TypeError), not lse's shape (ValueError), not lse's
            kind of array (TypeError) or on another GPU (ValueError), before anything is sent or
            launched.
    """
    st = _check_backward(do, q, k, v, o, lse, comm, causal=causal, window_size=window_size, mask=mask,
                         softmax_scale=softmax_scale, layout=layout, scheme=scheme, deterministic=deterministic,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, dlse=dlse)
    return _run_alone(_backward_steps(st, do, q, k, v, o, lse, comm, _check_timeline(timeline), dlse), comm)


ring_attention_forward.__doc__ = ring_attention_forward.__doc__.replace("{shared}", _DOC_SHARED)
ring_attention_backward.__doc__ = ring_attention_backward.__doc__.replace("{shared}", _DOC_SHARED)


def _local_ring(ring, arrays):
    n = len(arrays)
    if ring is None:
        first = arrays[0]
        dev = None if isinstance(first, np.ndarray) else getattr(getattr(first, "device", None), "id", None)
        return LocalRing(n, device=dev)
    if not isinstance(ring, LocalRing):
        raise TypeError(f"ring: expected a LocalRing, got {type(ring).__name__}")
    if ring.world_size != n:
        raise ValueError(f"ring: a LocalRing of {ring.world_size} ranks, but {n} shards were given")
    return ring


def _shard_lists(named):
    lists = [(name, list(x) if isinstance(x, (list, tuple)) else None) for name, x in named]
    for name, x in lists:
        if x is None:
            raise TypeError(f"{name}: expected a list with one shard per rank")
    n = len(lists[0][1])
    if n == 0:
        raise ValueError(f"{lists[0][0]}: expected at least one shard")
    for name, x in lists:
        if len(x) != n:
            raise ValueError(f"{name}: {len(x)} shards, but {lists[0][0]} has {n}")
    return [x for _, x in lists]


def _same_on_every_rank(named_lists) -> None:
    """Every rank's shard of each tensor has rank 0's shape and dtype (the ring exchanges K/V
    buffers of one shape, and one problem is split across the ranks)."""
    def desc(x):
        return tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))

    for name, shards in named_lists:
        want = desc(shards[0])
        for r, x in enumerate(shards[1:], 1):
            if desc(x) != want:
                raise ValueError(f"{name}: rank {r}'s shard {desc(x)[0]} {desc(x)[1]} differs from rank 0's "
                                 f"{want[0]} {want[1]}")


def _check_keywords(kw, fn) -> None:
    """``kw`` holds only ``fn``'s keyword options (not comm / timeline, which the local ring sets)."""
    import inspect

    allowed = {n for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY} - {"timeline"}
    for name in kw:
        if name not in allowed:
            raise TypeError(f"{name}: not an option of {fn.__name__} (expected one of {', '.join(sorted(allowed))})")


def _timelines(timelines, n):
    if timelines is None:
        return [None] * n
    if isinstance(timelines, (str, bytes)) or not hasattr(timelines, "__iter__"):
        raise TypeError(f"timelines: expected a list of {n} Timeline objects, got {type(timelines).__name__}")
    timelines = list(timelines)
    if len(timelines) != n or not all(isinstance(t, Timeline) for t in timelines):
        raise ValueError(f"timelines: expected a list of {n} Timeline objects")
    return timelines


def local_ring_attention_forward(q, k, v, *, ring=None, timelines=None, **kw):
    """:func:`ring_attention_forward` for every rank of an in-process ring.

    Args:
        q, k, v: lists with one shard per rank (rank order), each as in
            :func:`ring_attention_forward`; CuPy arrays on one GPU (the ranks then share it:
            each has its own compute and communication streams, and K/V move by device copies),
            or NumPy arrays (the CPU model).
        ring: a :class:`~cupy_fmha.parallel.comm.LocalRing` of ``len(q)`` ranks (default: a new
            one on the arrays' device, or on the host).
        timelines: optional list of one :class:`Timeline` per rank.
        **kw: the keywords of :func:`ring_attention_forward` (not ``comm``, ``timeline``).

    Returns:
        list of (o, lse), one per rank. Every argument is checked for every rank before
        anything runs.
    """
    qs, ks, vs = _shard_lists([("q", q), ("k", k), ("v", v)])
    _check_keywords(kw, ring_attention_forward)
    _same_on_every_rank([("q", qs), ("k", ks), ("v", vs)])
    ring = _local_ring(ring, qs)
    tls = _timelines(timelines, len(qs))
    with ring.rank_context(0):
        setups = [_check_forward(qs[r], ks[r], vs[r], ring.ranks[r], **kw) for r in range(len(qs))]
    gens = [_forward_steps(setups[r], qs[r], ks[r], vs[r], ring.ranks[r], tls[r]) for r in range(len(qs))]
    return ring.drive(gens)


def local_ring_attention_backward(do, q, k, v, o, lse, *, ring=None, timelines=None, dlse=None, **kw):
    """:func:`ring_attention_backward` for every rank of an in-process ring (lists of shards, as
    :func:`local_ring_attention_forward`). Returns a list of (dq, dk, dv), one per rank.

    ``dlse``: None, or a list with one shard of lse's cotangent per rank (each as
    :func:`ring_attention_backward`'s ``dlse``: float32, that rank's lse's shape, lse's kind of
    array), checked with the other arguments before anything runs; errors name ``dlse``."""
    named = [("do", do), ("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)]
    if dlse is not None:
        named.append(("dlse", dlse))
    dos, qs, ks, vs, os_, lses, *rest = _shard_lists(named)
    dlses = rest[0] if rest else [None] * len(qs)
    _check_keywords(kw, ring_attention_backward)
    _same_on_every_rank([("do", dos), ("q", qs), ("k", ks), ("v", vs), ("o", os_), ("lse", lses)]
                        + ([("dlse", dlses)] if rest else []))
    ring = _local_ring(ring, qs)
    tls = _timelines(timelines, len(qs))
    with ring.rank_context(0):
        setups = [_check_backward(dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r], dlse=dlses[r], **kw)
                  for r in range(len(qs))]
    gens = [_backward_steps(setups[r], dos[r], qs[r], ks[r], vs[r], os_[r], lses[r], ring.ranks[r], tls[r], dlses[r])
            for r in range(len(qs))]
    return ring.drive(gens)
