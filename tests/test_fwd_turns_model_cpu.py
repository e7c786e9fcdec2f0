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


def run(progs, nwg: int, rng: random.Random) -> None:
    """Execute the programs under a random interleaving; raise AssertionError on a protocol fault."""
    pc = [0] * len(progs)
    arrived: dict[int, list[int]] = {}  # barrier -> warpgroups arrived in the current phase
    waiting: dict[int, int] = {}  # warpgroup -> barrier it waits on (after arriving)
    order = []  # issue order (warpgroup, (row, turn))
    while True:
        ready = [w for w in range(len(progs)) if pc[w] < len(progs[w]) and w not in waiting]
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
