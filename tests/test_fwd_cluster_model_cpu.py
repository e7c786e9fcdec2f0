"""A model of the ws forward's K / V ring in clusters of two CTAs (kernels/fmha_fwd_sm90_ws.cu,
CLUSTER=2, bench/NOTES.md step 85), run on the CPU under random interleavings.

Each CTA has a producer (one thread) and NW MMA warps. Per key block the producer of each CTA
waits for the stage's release (its own `k_empty` / `empty`, which count one arrival per MMA warp of
both CTAs), posts the whole tile's bytes on its own `k_full` / `v_full` (arrive.expect_tx) and
issues half the tile to both CTAs (multicast): two deliveries that land later, at random, each
completing half the bytes on the barrier of its CTA. The MMA warps wait for K and V as the
overlapped pipeline does (K_i, then V_{i-1}; V_{i-2} released before K_i), and pass phantom blocks
(the union of the pair's key ranges outside their own) by waiting for both and releasing both.

Checked: no interleaving deadlocks; a delivery always lands in the phase it was issued for (bytes
of the next use never complete the current one) and never overwrites a stage before both CTAs'
warps released its previous use; a wait by parity is never ambiguous (the barrier is never a whole
phase ahead); both CTAs' rings end at the same position; nothing is left pending. Key ranges come
from a port of kernels/common.cuh's key_block_range over windows of every kind and row / key
counts; the last test shows the model catches the union bug a review found (an empty own range
past the peer's end)."""

from __future__ import annotations

import random

import pytest

STAGES, NW = 2, 2


def key_block_range(y, x, q0, m, n, seqlen_q, seqlen_k):
    lo = max(q0 - y + 1, 0)
    hi = min(min(q0 + m, seqlen_q) - 1 + x, seqlen_k)
    begin = lo // n
    return begin, ((hi + n - 1) // n if hi > lo else begin)


def union(own, peer, fixed=True):
    (a, b), (p0, p1) = own, peer
    if p1 <= p0:
        return a, b
    if b > a:
        return min(a, p0), max(b, p1)
    return (p0, p1) if fixed else (p0, max(b, p1))  # (the first version: max with an empty range's end)


class Barrier:
    def __init__(self, arrivals):
        self.count, self.pending, self.tx, self.done = arrivals, arrivals, 0, 0

    def arrive(self, tx=0):
        self.pending -= 1
        self.tx += tx
        assert self.pending >= 0, "more arrivals than the barrier's count in one phase"
        self._flip()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._flip()

    def _flip(self):
        if self.pending == 0 and self.tx == 0:
            self.done += 1
            self.pending = self.count

    def ready(self, use):
        """A parity wait for use ``use`` (phase ``use`` complete): never ambiguous."""
        assert self.done <= use + 1, "the barrier ran a whole phase ahead of a parity wait"
        return self.done >= use + 1


def programs(steps, rank):
    """Producer and MMA-warp programs of CTA ``rank``: ``steps`` lists, per row block, (own range,
    peer range); ops are ("wait", barrier name, stage, use), ("arrive", name, stage),
    ("load", kind, stage, use) and ("release", name, stage) (local and peer)."""
    prod, cons = [], []
    i = it = 0
    for own, peer in steps:
        lo, hi = union(own, peer, fixed=FIXED)
        for _ in range(lo, hi):
            s, u = i % STAGES, i // STAGES
            if i >= STAGES:
                prod.append(("wait", "k_empty", s, u - 1))
            prod.append(("load", "k", s, u))
            if i >= STAGES:
                prod.append(("wait", "empty", s, u - 1))
            prod.append(("load", "v", s, u))
            i += 1
        a, b = own
        n = b - a
        p0, p1 = peer
        lead = tail = 0
        if p1 > p0:
            lead = max(0, a - p0) if n > 0 else p1 - p0
            tail = max(0, p1 - b) if n > 0 else 0

        def phantom(c, it):
            for _ in range(c):
                s, u = it % STAGES, it // STAGES
                if PHANTOM_WAITS:
                    cons.extend([("wait", "k_full", s, u), ("wait", "v_full", s, u)])
                cons.extend([("release", "k_empty", s), ("release", "empty", s)])
                it += 1
            return it

        it = phantom(lead, it)
        pos = lambda k: ((it + k) % STAGES, (it + k) // STAGES)  # noqa: E731
        if n > 0:
            cons += [("wait", "k_full", *pos(0)), ("release", "k_empty", pos(0)[0])]
            for k in range(1, n):
                cons += [("wait", "k_full", *pos(k)), ("wait", "v_full", *pos(k - 1))]
                if k >= 2:
                    cons.append(("release", "empty", pos(k - 2)[0]))
                cons.append(("release", "k_empty", pos(k)[0]))
            cons.append(("wait", "v_full", *pos(n - 1)))
            if n >= 2:
                cons.append(("release", "empty", pos(n - 2)[0]))
            cons.append(("release", "empty", pos(n - 1)[0]))
        it = phantom(tail, it + n)
    return prod, cons, i, it


FIXED = True
PHANTOM_WAITS = True  # (False: a phantom released before its bytes landed, as a broken kernel would)


def simulate(steps_of, rng, tile=2, p_land=None):
    """``steps_of[rank]``: that CTA's (own, peer) ranges per row block; ``p_land``: the chance that
    a step lands a copy rather than runs an agent (random per run by default). Raises AssertionError."""
    p_land = rng.choice([0.05, 0.3, 0.7]) if p_land is None else p_land
    bars = [{name: [Barrier(1 if name.endswith("full") else 2 * NW) for _ in range(STAGES)]
             for name in ("k_full", "v_full", "k_empty", "empty")} for _ in range(2)]
    released = [[{"k": -1, "v": -1} for _ in range(STAGES)] for _ in range(2)]  # last use both CTAs released
    agents, ends = [], []
    for r in (0, 1):
        prod, cons, ni, nit = programs(steps_of[r], r)
        ends.append((ni, nit))
        agents.append((r, "p", prod))
        agents += [(r, "c", list(cons)) for _ in range(NW)]
    assert ends[0] == ends[1] and ends[0][0] == ends[0][1], f"rings end apart: {ends}"
    pc = [0] * len(agents)
    flights = []  # (cta, kind, stage, use, bytes)
    while True:
        runnable = []
        for a, (r, role, prog) in enumerate(agents):
            if pc[a] >= len(prog):
                continue
            op = prog[pc[a]]
            if op[0] == "wait" and not bars[r][op[1]][op[2]].ready(op[3]):
                continue
            runnable.append(a)
        if not runnable and not flights:
            break
        # (copies land late as often as not: with p_land small the producers run ahead of them)
        if flights and (not runnable or rng.random() < p_land):
            kind, k = "land", rng.randrange(len(flights))
        else:
            kind, k = "agent", rng.choice(runnable)
        if kind == "land":
            cta, what, s, u, nbytes = flights.pop(k)
            b = bars[cta][f"{what}_full"][s]
            assert b.done == u, f"CTA {cta} {what} stage {s}: bytes of use {u} landed in phase {b.done}"
            assert released[cta][s][what] >= u - 1, f"CTA {cta} {what} stage {s} overwritten before its release"
            b.complete_tx(nbytes)
            continue
        r, role, prog = agents[k]
        op = prog[pc[k]]
        pc[k] += 1
        if op[0] == "load":
            _, what, s, u = op
            bars[r][f"{what}_full"][s].arrive(tx=tile)
            for cta in (0, 1):
                flights.append((cta, what, s, u, tile // 2))
        elif op[0] == "release":
            _, name, s = op
            for cta in (0, 1):  # (lane 0: here and on the peer's barrier)
                bars[cta][name][s].arrive()
            for cta in (0, 1):
                done = bars[cta][name][s].done
                released[cta][s]["k" if name == "k_empty" else "v"] = done - 1
    stuck = [(agents[a][0], agents[a][1], agents[a][2][pc[a]]) for a in range(len(agents)) if pc[a] < len(agents[a][2])]
    assert not stuck, f"deadlock: {stuck[:4]}"
    for r in (0, 1):
        for name, per in bars[r].items():
            for b in per:
                assert b.pending == b.count and b.tx == 0, f"CTA {r} {name}: left pending"


def pair_steps(y, x, bm, bn, sq, sk, grid):
    """Per pair of CTAs (2c, 2c + 1) of a grid of ``grid`` CTAs along x: for each of the two, its
    (own, peer) ranges per row block."""
    nqb = -(-sq // bm)
    row0 = lambda xx: (nqb - 1 - xx) * bm  # noqa: E731
    pairs = []
    for c in range(grid // 2):
        out = {0: [], 1: []}
        for r in (0, 1):
            for xx in range(2 * c + r, nqb, grid):
                out[r].append((key_block_range(y, x, row0(xx), bm, bn, sq, sk),
                               key_block_range(y, x, row0(xx ^ 1), bm, bn, sq, sk)))
        pairs.append(out)
    return pairs


def simulate_all(pairs, rng):
    for steps in pairs:
        simulate(steps, rng)


INF = 1 << 30


def random_problem(rng):
    bm = rng.choice([128, 192])
    bn = rng.choice([80, 112, 128])
    nqb = 2 * rng.randint(1, 6)
    sq = rng.randint((nqb - 1) * bm + 1, nqb * bm)
    sk = rng.randint(1, 1600)
    kind = rng.choice(["none", "causal tl", "causal br", "window", "top-left", "generic"])
    if kind == "none":
        y, x = INF, INF
    elif kind == "causal tl":
        y, x = INF, 1
    elif kind == "causal br":
        y, x = INF, 1 + sk - sq
    elif kind == "window":
        left, right = rng.randint(0, 400), rng.randint(0, 200)
        y, x = 1 + left, 1 + right + (sk - sq)
    elif kind == "top-left":
        y, x = 1 + rng.randint(0, 300), 1
    else:
        y, x = rng.randint(-200, 600), rng.randint(-200, 600)
    return y, x, bm, bn, sq, sk, rng.choice(range(2, nqb + 1, 2))


def test_random_problems_and_interleavings():
    rng = random.Random(85)
    for _ in range(400):
        prob = random_problem(rng)
        pairs = pair_steps(*prob)
        for _ in range(3):
            simulate_all(pairs, rng)


@pytest.mark.parametrize("grid", [2, 4, 8])
def test_causal_and_windows_at_the_test_shapes(grid):
    """The GPU test's masked shapes (tests/test_gpu_fwd_ws_cluster.py), 128-row and 80-key blocks."""
    rng = random.Random(grid)
    for y, x, sq, sk in [(INF, 1, 1000, 1000), (201, 51 + 200, 1000, 1200), (INF, 1 - 700, 1000, 300),
                         (101, 1, 1000, 300), (101, 1, 1024, 160)]:
        for bn in (80, 112, 128):
            pairs = pair_steps(y, x, 128, bn, sq, sk, grid)
            for _ in range(5):
                simulate_all(pairs, rng)


def test_the_model_catches_the_union_bug():
    """hdim 256, mask "t:100,0" over 1024 x 160: row block 4 sees no key and its peer key block 1;
    with the first version's union the producers' rings drift apart."""
    global FIXED
    pairs = pair_steps(101, 1, 128, 80, 1024, 160, 8)
    simulate_all(pairs, random.Random(0))
    FIXED = False
    try:
        with pytest.raises(AssertionError, match="rings end apart"):
            simulate_all(pairs, random.Random(0))
    finally:
        FIXED = True


def test_the_model_catches_phantoms_released_before_they_land():
    """Releasing a phantom stage before its K and V have landed lets a producer refill it while a
    copy is in flight: the bytes of two uses meet in one phase (or the pair deadlocks)."""
    global PHANTOM_WAITS
    pairs = pair_steps(INF, 1, 128, 128, 1024, 1024, 2)  # (causal: a tail phantom per odd row block)
    PHANTOM_WAITS = False
    try:
        rng = random.Random(1)
        caught = 0
        for _ in range(50):
            try:
                simulate_all(pairs, rng)
            except AssertionError:
                caught += 1
        assert caught > 0
    finally:
        PHANTOM_WAITS = True
