"""Which attention calls each rank makes at each step of the ring (pure Python, no GPU).

Notation. The global problem is self-attention over ``seqlen`` tokens under one mask, resolved
to CK's window ``(y, x)`` (:mod:`cupy_fmha.mask`): query ``i`` sees key ``j`` iff
``1 - x <= i - j <= y - 1``. With ``seqlen_q == seqlen_k`` globally, top-left and bottom-right
alignments coincide, so ``causal=True`` is ``(y, x) = (seqlen + 1, 1)`` and a sliding window
``(left, right)`` is ``(1 + left, 1 + right)``.

At step ``s`` rank ``r`` holds the K/V shard of rank ``(r - s) mod world`` (the ring passes K/V
to the next rank each step). Its query chunks and the visiting key chunks form a grid of chunk
pairs. A pair ``(query chunk at global start gq, key chunk at gk)`` seen as its own small problem
has the window shifted by the chunk offsets: in pair-local coordinates ``i' - j' = i - j -
(gq - gk)``, so the pair's window is ``(y - (gq - gk), x + (gq - gk))``, a CK generic window
(``mask="g:y,x"``). A pair is *skipped* when no ``i - j`` it can reach lies in the band, and
runs *unmasked* when all of them do.

Pairs are then grouped into as few calls as possible: a block of several chunk pairs (rows of
this shard times rows of the visiting shard, contiguous in local storage) is one call when its
visibility in block-local coordinates is itself a window. For each chunk pair the block-local
differences it can reach form an interval ``D`` and the visible ones an interval ``E`` inside
it; the only candidate window is the hull ``[L, U]`` of all the ``E``s (any window that fits
must contain it, and if a larger one fits so does the hull), and it fits iff ``[L, U] ∩ D ==
E`` for every pair. Of the groupings tried (the whole grid, one call per query chunk, one per
key chunk, one per pair) the plan takes the fewest calls, then the least area. Under the
zigzag layout with a causal mask this gives one call per step: the own step is one causal
(top-left) call over the whole shard, every other step one unmasked call of half the area
(``2c x c`` or ``c x 2c`` for chunks of ``c`` tokens), so each rank does the same work.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .._checks import check_int
from ..flops import visible_pairs
from ..mask import MaskSpec, Window
from .layout import check_scheme, check_world, chunk_len, num_chunks, rank_chunks

__all__ = ["Call", "Step", "RankPlan", "global_window", "region_window", "plan_rank", "plan_ring"]


@dataclass(frozen=True)
class Call:
    """One attention call of a ring step.

    q0, q1: rows ``[q0, q1)`` of this rank's shard (queries; also o, lse, do, dq, dlse).
    k0, k1: rows ``[k0, k1)`` of the visiting K/V shard (also its dK/dV).
    window: the mask in the call's own coordinates (row ``q0`` is 0, key ``k0`` is 0), a CK
        generic window; ``None`` = no mask.
    visible: visible (query, key) pairs per (batch, head).
    """

    q0: int
    q1: int
    k0: int
    k1: int
    window: Window | None
    visible: int

    @property
    def mask(self) -> MaskSpec:
        """The call's mask for :func:`cupy_fmha.attention_forward` (``mask=``)."""
        if self.window is None:
            return MaskSpec()
        return MaskSpec("generic", int(self.window.y), int(self.window.x))

    @property
    def area(self) -> int:
        return (self.q1 - self.q0) * (self.k1 - self.k0)


@dataclass(frozen=True)
class Step:
    """Step ``index`` of a rank: the K/V shard of rank ``source`` is visiting."""

    index: int
    source: int
    calls: tuple[Call, ...]

    @property
    def visible(self) -> int:
        return sum(c.visible for c in self.calls)


@dataclass(frozen=True)
class RankPlan:
    """Every step of one rank's ring pass (the same calls serve forward and backward)."""

    rank: int
    world: int
    seqlen: int
    scheme: str
    chunk: int
    window: Window | None
    steps: tuple[Step, ...]

    @property
    def visible(self) -> int:
        return sum(s.visible for s in self.steps)


def global_window(spec: MaskSpec | None, seqlen: int) -> Window | None:
    """The global problem's window (``seqlen_q == seqlen_k == seqlen``, an int >= 1); None = no
    mask."""
    if spec is None:
        return None
    if not isinstance(spec, MaskSpec):
        raise TypeError(f"spec: expected a MaskSpec or None (cupy_fmha.mask.resolve_mask), got {spec!r}")
    seqlen = check_int("seqlen", seqlen, 1, what="an int sequence length")
    return spec.window(seqlen, seqlen)


def _cap(a, b):
    """Intersection of two inclusive integer intervals (None = empty)."""
    if a is None or b is None:
        return None
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo <= hi else None


#: ``region_window`` results besides a Window / None (no mask)
EMPTY, INVALID = "empty", "invalid"


def region_window(q_parts, k_parts, window: Window | None):
    """The mask of one call covering several chunk pairs, in the call's coordinates.

    Args:
        q_parts: ``(global start, length)`` of the query chunks the call's rows hold, in row
            order (the rows are their concatenation); k_parts likewise for the keys.
        window: the global window (None = no mask).

    Returns:
        ``None`` when every pair is visible (no mask), a :class:`Window` when the call's
        visibility is that window, ``EMPTY`` when nothing is visible, ``INVALID`` when no single
        window describes it.
    """
    band = None if window is None else (1 - int(window.x), int(window.y) - 1)
    parts = []
    oq = 0
    for gq, m in q_parts:
        ok = 0
        for gk, n in k_parts:
            reach = (oq - ok - n + 1, oq + m - 1 - ok)  # block-local i - j this pair can reach
            if band is None:
                seen = reach
            else:
                shift = (gq - oq) - (gk - ok)  # global i - j = local i - j + shift
                seen = _cap((band[0] - shift, band[1] - shift), reach)
            parts.append((reach, seen))
            ok += n
        oq += m
    seen_all = [e for _, e in parts if e is not None]
    if not seen_all:
        return EMPTY
    hull = (min(e[0] for e in seen_all), max(e[1] for e in seen_all))
    if any(_cap(hull, d) != e for d, e in parts):
        return INVALID
    if hull == (min(d[0] for d, _ in parts), max(d[1] for d, _ in parts)):
        return None
    return Window(hull[1] + 1, 1 - hull[0])


def _block_call(q_sel, k_sel, qc, kc, c, window):
    """A Call for the chunk-index ranges ``q_sel``/``k_sel`` (slots in the shards), or EMPTY /
    INVALID."""
    qa, qb = q_sel
    ka, kb = k_sel
    win = region_window([(qc[i] * c, c) for i in range(qa, qb)], [(kc[j] * c, c) for j in range(ka, kb)], window)
    if win in (EMPTY, INVALID):
        return win
    rows, cols = (qb - qa) * c, (kb - ka) * c
    return Call(qa * c, qb * c, ka * c, kb * c, win, visible_pairs(win, rows, cols))


def _groupings(nq: int, nk: int, seen):
    """Candidate groupings of the chunk-pair grid as lists of (q slot range, k slot range)."""
    yield [((0, nq), (0, nk))]
    rows = []
    for a in range(nq):
        cols = [b for b in range(nk) if seen[a][b]]
        if cols:
            rows.append(((a, a + 1), (cols[0], cols[-1] + 1)))
    yield rows
    cols = []
    for b in range(nk):
        rs = [a for a in range(nq) if seen[a][b]]
        if rs:
            cols.append(((rs[0], rs[-1] + 1), (b, b + 1)))
    yield cols
    yield [((a, a + 1), (b, b + 1)) for a in range(nq) for b in range(nk) if seen[a][b]]


def _plan_step(rank: int, step: int, world: int, c: int, scheme: str, window: Window | None) -> Step:
    source = (rank - step) % world
    qc, kc = rank_chunks(rank, world, scheme), rank_chunks(source, world, scheme)
    nq, nk = len(qc), len(kc)
    seen = [[_block_call((a, a + 1), (b, b + 1), qc, kc, c, window) != EMPTY for b in range(nk)] for a in range(nq)]
    best = None
    for grouping in _groupings(nq, nk, seen):
        calls = [_block_call(qs, ks, qc, kc, c, window) for qs, ks in grouping]
        if any(x == INVALID for x in calls):
            continue
        calls = tuple(x for x in calls if x != EMPTY)
        key = (len(calls), sum(x.area for x in calls))
        if best is None or key < best[0]:
            best = (key, calls)
    return Step(step, source, best[1])  # one call per pair always fits, so best is set


def plan_rank(rank: int, world: int, seqlen: int, window: Window | None, scheme: str = "zigzag") -> RankPlan:
    """The calls rank ``rank`` makes at every step (cached).

    Args:
        rank, world: this rank and the ring size.
        seqlen: the global sequence length (a multiple of the scheme's chunk count).
        window: the global window (:func:`global_window`), None = no mask.
        scheme: ``"zigzag"`` or ``"contiguous"`` (:mod:`cupy_fmha.parallel.layout`).

    Raises:
        ValueError, TypeError: bad rank/world/scheme/window, seqlen not splitting into equal
            chunks (checked on every call, before the cache: ``True == 1`` and ``8.0 == 8`` as
            cache keys).
    """
    world = check_world(world, rank)
    check_scheme(scheme)
    if window is not None:
        if not isinstance(window, Window):
            raise TypeError(f"window: expected a Window or None (global_window), got {window!r}")
        window = Window(check_int("window.y", window.y), check_int("window.x", window.x))
    c = chunk_len(seqlen, world, scheme)
    return _plan_rank(int(rank), world, c, window, scheme)


@functools.lru_cache(maxsize=256)
def _plan_rank(rank: int, world: int, c: int, window: Window | None, scheme: str) -> RankPlan:
    steps = tuple(_plan_step(rank, s, world, c, scheme, window) for s in range(world))
    return RankPlan(rank, world, c * num_chunks(world, scheme), scheme, c, window, steps)


def plan_ring(world: int, seqlen: int, window: Window | None, scheme: str = "zigzag") -> tuple[RankPlan, ...]:
    """:func:`plan_rank` for every rank."""
    return tuple(plan_rank(r, world, seqlen, window, scheme) for r in range(check_world(world)))
