"""A model of the ws forward's turn-taking across a CTA's row blocks (kernels/fmha_fwd_sm90_ws.cu,
PINGPONG, bench/NOTES.md step 80), run on the CPU: each MMA warpgroup is
a program of named-barrier operations, executed under many random interleavings.

Named barrier 2 + w is warpgroup w's turn: w waits on it (bar.sync, 128 threads) and the warpgroup
before it arrives (bar.arrive, 128 threads); a phase completes at 256 arrivals. The model checks
that no interleaving deadlocks, that no warpgroup arrives twice on a barrier within one phase (the
phase would complete without the waiter), that a warpgroup issues its GEMMs only in its turn (one
issuer at a time, in round-robin order), and that no arrival is left pending when the CTA exits.
Group mode's tail zeroing (named barrier 1 over all MMA warpgroups, outside the turns) is in the
programs too, before the S GEMMs of the row blocks that have such a key block.

The model mirrors the kernel's control flow, so it fails when that protocol is wrong (the tests at the
end show it does: a row block without key blocks that still gives warpgroup 0 its first turn leaves
an arrival pending, and a last warpgroup that passes the turn on after its last P V as well as at the
next row block's start double-arrives)."""

from __future__ import annotations

import random

import pytest


def programs(nwg: int, n_per_row: list[int], zero_at=frozenset(), guard: bool = True):
    """The barrier operations of each MMA warpgroup over a CTA's row blocks with ``n_per_row`` key
    blocks each: ("arrive", b) / ("sync", b, count) / ("issue", (row, turn)), as the kernel's MMA
    loop makes them. ``zero_at``: (row, key block) pairs whose K tile is zeroed first (named barrier 1
    over every MMA warpgroup). ``guard=False`` is a broken loop whose row blocks without key blocks
    still give warpgroup 0 its first turn."""
    out = []
    for w in range(nwg):
        ops = []
        for r, n in enumerate(n_per_row):
            if n == 0 and guard:  # no key block: no turns
                continue
            if w == nwg - 1:  # warpgroup 0's first turn
                ops.append(("arrive", 2))
            for t in range(n + 1) if n else ():  # S_0; S_t with P_{t-1} V_{t-1}; the last P V
                if t < n and (r, t) in zero_at:
                    ops.append(("sync", 1, nwg))
                ops.append(("sync", 2 + w, 2))
                ops.append(("issue", (r, t)))
                if not (t == n and w == nwg - 1):  # (the last warpgroup's last pass is not made)
                    ops.append(("arrive", 2 + (w + 1) % nwg))
        out.append(ops)
    return out


def run(progs, nwg: int, rng: random.Random, stages: int = 2) -> None:
    """Execute the programs under a random interleaving; raise AssertionError on a protocol fault.
    With the ring (:func:`programs_skip`), for x = "k" (K's tiles, `k_empty`) and "v" (V's, `empty`): ("load", x,
    g) (the producer: key block g's tile into stage g % stages once that stage's hand-back barrier has completed
    its g // stages earlier phases), ("wait_full", x, g) (an MMA warpgroup until it has landed) and
    ("arrive_empty", x, g) (its hand-back, which must count in that block's own phase: arriving while an earlier
    use's phase is still open would complete it early)."""
    pc = [0] * len(progs)
    arrived: dict[int, list[int]] = {}  # barrier -> warpgroups arrived in the current phase
    waiting: dict[int, int] = {}  # warpgroup -> barrier it waits on (after arriving)
    order = []  # issue order (warpgroup, (row, turn))
    landed: set[tuple[str, int]] = set()
    empty_done = {x: [0] * stages for x in "kv"}  # completed phases of each stage's hand-back barrier
    empty_got = {x: [[] for _ in range(stages)] for x in "kv"}

    def blocked(w):
        op = progs[w][pc[w]]
        if op[0] == "wait_full":
            return op[1:] not in landed
        if op[0] == "load":
            return empty_done[op[1]][op[2] % stages] < op[2] // stages
        return False

    while True:
        ready = [w for w in range(len(progs)) if pc[w] < len(progs[w]) and w not in waiting and not blocked(w)]
        if not ready:
            if all(pc[w] == len(progs[w]) for w in range(len(progs))) and not waiting:
                break
            raise AssertionError(f"deadlock: waiting {waiting}, arrived {arrived}, pcs {pc}")
        w = rng.choice(ready)
        op = progs[w][pc[w]]
        pc[w] += 1
        if op[0] == "issue":
            order.append((w, op[1]))
            continue
        if op[0] == "load":
            landed.add(op[1:])
            continue
        if op[0] == "wait_full":
            continue
        if op[0] == "arrive_empty":
            x, g = op[1], op[2]
            st = g % stages
            assert empty_done[x][st] == g // stages, \
                f"warpgroup {w} hands back {x} of block {g} in phase {empty_done[x][st]} of stage {st}"
            assert w not in empty_got[x][st], f"warpgroup {w} hands back {x} of stage {st} twice in one phase"
            empty_got[x][st].append(w)
            if len(empty_got[x][st]) == nwg:
                empty_done[x][st] += 1
                empty_got[x][st] = []
            continue
        b = op[1]
        count = op[2] if op[0] == "sync" else (nwg if b == 1 else 2)
        got = arrived.setdefault(b, [])
        assert w not in got, f"warpgroup {w} arrives twice on barrier {b} in one phase"
        got.append(w)
        if op[0] == "sync":
            waiting[w] = b
        if len(got) == count:  # the phase completes: release its waiters
            for x in [x for x, bb in waiting.items() if bb == b]:
                del waiting[x]
            arrived[b] = []
    assert all(not v for v in arrived.values()), f"arrivals pending at exit: {arrived}"
    assert not any(any(v) for v in empty_got.values()), f"hand-backs pending at exit: {empty_got}"
    # turns: round robin over the warpgroups within each row block, in order over the row blocks
    for i, (w, _) in enumerate(order):
        if i:
            assert w == (order[i - 1][0] + 1) % nwg, f"turn order broken at {i}: {order[max(0, i - 3):i + 1]}"
    return order


ROWS = [[3, 1, 2, 2], [1, 1, 1, 1], [2, 0, 0, 3], [4, 0], [0, 2, 0, 1], [0, 0, 5], [1], [2, 3, 0]]


@pytest.mark.parametrize("nwg", [2, 3])
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: "-".join(map(str, r)))
def test_turns_protocol(nwg, rows):
    rng = random.Random(hash((nwg, tuple(rows))) & 0xFFFF)
    for trial in range(200):
        zero = {(r, t) for r, n in enumerate(rows) for t in range(n) if rng.random() < 0.2}
        order = run(programs(nwg, rows, zero), nwg, rng)
        assert len(order) == nwg * sum(n + 1 for n in rows if n)


def test_random_row_blocks():
    rng = random.Random(80)
    for _ in range(400):
        nwg = rng.choice([2, 3])
        rows = [rng.choice([0, 0, 1, 2, 3]) for _ in range(rng.randint(1, 6))]
        zero = {(r, t) for r, n in enumerate(rows) for t in range(n) if rng.random() < 0.15}
        run(programs(nwg, rows, zero), nwg, rng)


def test_model_catches_a_first_turn_in_a_row_block_without_keys():
    # a row block without key blocks whose last warpgroup still gives warpgroup 0 its first turn: nobody
    # waits for it, so the arrival is pending at the exit (or met by the next row block's wait out of turn)
    with pytest.raises(AssertionError, match="pending|deadlock|twice"):
        for seed in range(50):
            run(programs(2, [2, 0], guard=False), 2, random.Random(seed))


def test_model_catches_a_double_arrival():
    # the last warpgroup passing at the end and also arriving at the next row block's start
    def doubled(nwg, rows):
        progs = programs(nwg, rows)
        w = nwg - 1
        ops = progs[w]
        # pass after its last P V of row block 0 as well as at row block 1's start
        last0 = max(i for i, op in enumerate(ops) if op[0] == "issue" and op[1][0] == 0)
        ops.insert(last0 + 1, ("arrive", 2))
        return progs
    with pytest.raises(AssertionError, match="twice|pending|deadlock|order"):
        for seed in range(50):
            run(doubled(2, [2, 2]), 2, random.Random(seed))


def programs_skip(nwg: int, rows: list[tuple[int, list[tuple[int, int]]]], stages: int = 2, fault: str = "",
                  zero_rows=frozenset()):
    """The MMA warpgroups' programs with WG_SKIP (bench/NOTES.md row 130) and the ring, plus the producer's:
    ``rows`` holds each row block's key blocks n and every warpgroup's own range [ib, ie) of them. A warpgroup
    runs the overlapped pipeline over its range (block ib: K's wait, its turn, K back; each later block i: K_i's
    and V_{i-1}'s waits, V_{i-2} back, its turn, K_i back; the last P V: V's wait, V_{ie-2} back, its turn,
    V_{ie-1} back) and meets every other block with a turn of its own, then its K and V landing and handed back
    (skip_block); with an empty range one more turn (the last P V's). The producer loads K_g once K's stage is
    back, then V_g once V's is. ``zero_rows``: row blocks whose last key block crosses the sequence's end (group
    mode): each wait for its K, then for its V, is a barrier over every MMA warpgroup (named barrier 1, zeroing
    the tile's tail), whether the warpgroup computes that block or skips it; a warpgroup with blocks of its own then
    computes that last one too (its range extended to n), so that the zeroing barriers fall before the same turns
    in every warpgroup (a warpgroup that skipped it after its own last P V would meet them one turn later: a
    deadlock against one that computes it). ``fault``: "zero_skipped" leaves that extension out, "no_extra_turn" leaves
    the last turn out, "early_handback" hands a skipped block back before waiting for it to land, "turn_first"
    takes a skipped block's turn before its K's wait."""
    progs, g0 = [], 0
    for w in range(nwg):
        ops, g0 = [], 0
        for r, (n, ranges) in enumerate(rows):
            if n == 0:
                continue
            ib, ie = ranges[w]
            if r in zero_rows and ie > ib and fault != "zero_skipped":
                ie = n  # (a warpgroup that computes blocks computes the zeroed last one too)
            last_wg = w == nwg - 1

            def take(t, last):
                ops.append(("sync", 2 + w, 2))
                ops.append(("issue", t))
                if not (last and last_wg):
                    ops.append(("arrive", 2 + (w + 1) % nwg))

            def wait(x, i):
                ops.append(("wait_full", x, g0 + i))
                if r in zero_rows and i == n - 1:
                    ops.append(("sync", 1, nwg))

            def skip(i, last):
                if fault == "turn_first":
                    take((g0, "skip", i), last)
                for x in "kv":
                    if fault != "early_handback":
                        wait(x, i)
                    ops.append(("arrive_empty", x, g0 + i))
                    if x == "k" and fault != "turn_first":
                        take((g0, "skip", i), last)

            if last_wg:
                ops.append(("arrive", 2))
            for i in range(ib):
                skip(i, False)
            if ie > ib:
                wait("k", ib)
                take((g0, ib), False)
                ops.append(("arrive_empty", "k", g0 + ib))
                for i in range(ib + 1, ie):
                    wait("k", i)
                    wait("v", i - 1)
                    if i >= ib + 2:
                        ops.append(("arrive_empty", "v", g0 + i - 2))
                    take((g0, i), False)
                    ops.append(("arrive_empty", "k", g0 + i))
                wait("v", ie - 1)
                if ie >= ib + 2:
                    ops.append(("arrive_empty", "v", g0 + ie - 2))
                take((g0, "tail"), ie == n)
                ops.append(("arrive_empty", "v", g0 + ie - 1))
            for i in range(ie, n):
                skip(i, i == n - 1 and ie > ib)
            if ie == ib and fault != "no_extra_turn":
                take((g0, "tail"), True)
            g0 += n
        progs.append(ops)
    progs.append([("load", x, g) for g in range(g0) for x in "kv"])  # the producer
    return progs


def _random_ranges(rng: random.Random, nwg: int, n: int) -> list[tuple[int, int]]:
    out = []
    for _ in range(nwg):
        ib = rng.randint(0, n)
        out.append((ib, rng.randint(ib, n)) if rng.random() < 0.8 else (0, n))
    return out


@pytest.mark.parametrize("nwg", [2, 3])
def test_wg_skip_protocol(nwg):
    """Every warpgroup takes n + 1 turns a row block in round-robin order whatever its range (empty, a prefix, a
    suffix, the middle, all), and every hand-back counts in its block's own phase, under random interleavings."""
    rng = random.Random(130 + nwg)
    for _ in range(300):
        rows = [(n, _random_ranges(rng, nwg, n)) for n in (rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(1, 4)))]
        zero = {r for r, (n, _) in enumerate(rows) if n and rng.random() < 0.3}
        progs = programs_skip(nwg, rows, zero_rows=zero)
        order = run(progs, nwg, rng)
        assert len(order) == nwg * sum(n + 1 for n, _ in rows if n)


@pytest.mark.parametrize("fault", ["no_extra_turn", "early_handback", "turn_first", "zero_skipped"])
def test_model_catches_wg_skip_faults(fault):
    # an empty range without the last P V's turn leaves the turns one short (a deadlock or an arrival pending); a
    # skipped block handed back before it lands counts in the stage's earlier phase; in group mode a skipped block
    # whose turn comes before its K's zeroing barrier deadlocks with a warpgroup that zeroes before its turn (here
    # warpgroup 1, whose rows are all past the sequence's end), and so does a warpgroup that skips the zeroed last
    # block after its own last P V while one before it computes it (ranges no mask makes: a later warpgroup's rows
    # see keys at least as far right; the extension keeps the protocol safe for any)
    rows = {"no_extra_turn": [(3, [(0, 0), (0, 3)]), (4, [(0, 4), (1, 4)]), (2, [(0, 0), (0, 2)])],
            "early_handback": [(3, [(0, 0), (0, 3)]), (4, [(0, 4), (1, 4)]), (2, [(0, 0), (0, 2)])],
            "turn_first": [(1, [(0, 1), (0, 0)])],
            "zero_skipped": [(2, [(0, 2), (0, 1)])]}[fault]
    zero = {0} if fault in ("turn_first", "zero_skipped") else set()
    with pytest.raises(AssertionError, match="deadlock|pending|phase|twice|order"):
        for seed in range(200):
            run(programs_skip(2, rows, fault=fault, zero_rows=zero), 2, random.Random(seed))
