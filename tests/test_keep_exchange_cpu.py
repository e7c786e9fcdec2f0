"""The warp-level exchanges that hand dropout keep bits to the threads holding the elements
(kernels/arch/sm80/fragment.cuh), replayed in NumPy for one warp of 32 lanes: whatever the Philox
output, every thread must end up with the bit of exactly its own accumulator elements.

* ``AccFrag::row_keep_bits`` (forward, row-major S tiles): lane (g, t) makes the call of n8 tile
  jg0 + t, places its 8 bits in byte t of a word, the quad ORs the words (two xor shuffles) and the
  lane keeps bits 2t, 2t + 1 of each byte.
* ``AccFrag::keep_bits_t`` / ``keep_bit_t`` (the warp-specialized backward, S^T tiles: rows are
  keys, columns query rows): round u, lane (g, t) makes the call of key group (key0 >> 3) +
  ((u >> 1) & 1) and query row q0 + 8 (g + 8 (u >> 2)) + 2t + (u & 1); ballot r collects bit r of
  every lane's byte and lane (g, t) keeps ballot g shifted right by t.

The element layout is the m16n8 accumulator's (AccFrag::row / col): element e of tile n sits at row
g + 8 (e >> 1), column 8 n + 2 t + (e & 1). A random keep matrix stands in for the generator
(``keep8(i, jg)``: bit r is keep[i, 8 jg + r]); a mapping error gives some thread another element's
bit, which the comparison catches.
"""

from __future__ import annotations

import numpy as np
import pytest

LANES = [(lane >> 2, lane & 3) for lane in range(32)]  # (g, t)


def _keep8(keep, i, jg):
    return sum(int(keep[i, 8 * jg + r]) << r for r in range(8))


def _row_keep_bits(keep, i_of_g, jg0):
    """row_keep_bits for the 32 lanes; i_of_g(g): the query row of lane row g."""
    words = [_keep8(keep, i_of_g(g), jg0 + t) << (8 * t) for g, t in LANES]
    for m in (1, 2):  # all |= shfl_xor(all, m)
        words = [words[lane] | words[lane ^ m] for lane in range(32)]
    out = []
    for lane, (g, t) in enumerate(LANES):
        x = words[lane] >> (2 * t)
        out.append((x & 0x3) | ((x >> 6) & 0xC) | ((x >> 12) & 0x30) | ((x >> 18) & 0xC0))
    return out


@pytest.mark.parametrize("jg0", [0, 4, 9])
def test_row_keep_bits_gives_each_thread_its_columns(jg0):
    rng = np.random.default_rng(jg0)
    keep = rng.random((16, 8 * (jg0 + 4))) < 0.5
    bits = _row_keep_bits(keep, lambda g: g, jg0)
    for lane, (g, t) in enumerate(LANES):
        for m in range(4):  # tile jg0 + m, this thread's columns 2t, 2t + 1
            for c in range(2):
                want = keep[g, 8 * (jg0 + m) + 2 * t + c]
                assert (bits[lane] >> (2 * m + c)) & 1 == want, (lane, m, c)


def _keep_bits_t(keep, key0, q0, nq):
    """keep_bits_t for the 32 lanes: words[lane][u]."""
    words = [[0] * (nq // 2) for _ in range(32)]
    for u in range(nq // 2):
        byte = [_keep8(keep, q0 + 8 * (g + 8 * (u >> 2)) + 2 * t + (u & 1), (key0 >> 3) + ((u >> 1) & 1))
                for g, t in LANES]
        ballots = [sum(((byte[lane] >> r) & 1) << lane for lane in range(32)) for r in range(8)]
        for lane, (g, t) in enumerate(LANES):
            words[lane][u] = ballots[g] >> t
    return words


def _keep_bit_t(w, n, e):
    return (w[4 * (n >> 3) + 2 * (e >> 1) + (e & 1)] >> (4 * (n & 7))) & 1


@pytest.mark.parametrize("nq, key0, q0", [(8, 0, 0), (8, 48, 64), (16, 16, 128), (16, 112, 0)])
def test_keep_bits_t_gives_each_thread_its_elements(nq, key0, q0):
    rng = np.random.default_rng(nq + key0 + q0)
    keep = rng.random((q0 + 8 * nq, key0 + 16)) < 0.5  # [query row i, key j]
    words = _keep_bits_t(keep, key0, q0, nq)
    for lane, (g, t) in enumerate(LANES):
        for n in range(nq):
            for e in range(4):
                i, j = q0 + 8 * n + 2 * t + (e & 1), key0 + g + 8 * (e >> 1)
                assert _keep_bit_t(words[lane], n, e) == keep[i, j], (lane, n, e)


def test_keep_bits_t_makes_each_call_once():
    # every (key group, query row) of the warp's tile is called by exactly one lane in one round
    nq, key0, q0 = 16, 32, 64
    calls = [(q0 + 8 * (g + 8 * (u >> 2)) + 2 * t + (u & 1), (key0 >> 3) + ((u >> 1) & 1))
             for u in range(nq // 2) for g, t in LANES]
    assert len(calls) == len(set(calls)) == 2 * 8 * nq
