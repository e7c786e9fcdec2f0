"""A lane-by-lane model of kernels/arch/sm80/fragment.cuh's dropout keep bits (the layout the
mma.sync kernels and the Hopper wgmma kernels share), checked against the Philox host replica
cupy_fmha.philox, so the exchange logic is tested without a GPU:

* ``row_keep_bits`` (the forwards): each quad thread t makes the call of keys 16 (jg0 / 2 + t),
  one xor exchange completes a half, a second brings the other; bits 2m, 2m + 1 of the result are
  the thread's columns of n8 tile m (m = 0..7).
* ``keep_bits_t`` (the warp-specialized backward): per round u the lanes make the calls of the
  warp's 16 keys for 32 query rows, sixteen ballots spread the bits; ``keep_bit_t`` reads element
  (n, e) of the S^T fragment.

The model mirrors the C++ statement by statement (the same index expressions); the GPU tests
check the kernels themselves."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_fmha import philox

SEED, OFFSET, B, NH, H = 0x0123_4567_89AB_CDEF, 11, 1, 3, 2


def keep16(i: int, jg16: int, p: float) -> int:
    """philox.cuh Dropout::keep16: bit c iff key 16 jg16 + c of row i is kept."""
    keys = 16 * jg16 + np.arange(16)
    keep = philox.dropout_keep(SEED, OFFSET, B, NH, H, i, keys, p)
    return sum(int(k) << c for c, k in enumerate(keep))


def row_keep_bits(lanes_i: dict[int, int], jg0: int, p: float) -> dict[int, int]:
    """AccFrag::row_keep_bits for every lane of a warp (lanes_i: lane -> its row i); shuffles
    within the quad (lanes 4g .. 4g + 3)."""
    t_of = {lane: lane & 3 for lane in lanes_i}
    w = {lane: keep16(lanes_i[lane], (jg0 >> 1) + t_of[lane], p) << (16 * (t_of[lane] & 1)) for lane in lanes_i}
    w = {lane: w[lane] | w[lane ^ 1] for lane in w}  # w |= shfl_xor_u32(w, 1)
    other = {lane: w[lane ^ 2] for lane in w}  # shfl_xor_u32(w, 2)
    out = {}
    for lane in w:
        t = t_of[lane]
        lo, hi = (w[lane], other[lane]) if t < 2 else (other[lane], w[lane])

        def mine(x):  # one multiply gathers the 2-bit fields (32-bit wraparound as in C++)
            return (((x >> (2 * t)) & 0x03030303) * 0x00041041) & 0xFFFFFFFF

        out[lane] = ((mine(lo) >> 18) & 0xFF) | ((mine(hi) >> 10) & 0xFF00)
    return out


@pytest.mark.parametrize("k0", [0, 128, 80, 4096 + 48])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])  # (not 0: every bit 1 would hide a wrong mapping)
def test_row_keep_bits(k0, p):
    row0 = 37
    lanes_i = {lane: row0 + (lane >> 2) for lane in range(32)}  # row slot 0: row g
    bits = row_keep_bits(lanes_i, k0 >> 3, p)
    for lane, i in lanes_i.items():
        t = lane & 3
        for m in range(8):  # n8 tile m: columns 8 m + 2 t + c
            for c in range(2):
                j = k0 + 8 * m + 2 * t + c
                want = bool(philox.dropout_keep(SEED, OFFSET, B, NH, H, i, j, p))
                assert bool((bits[lane] >> (2 * m + c)) & 1) == want, (lane, m, c)


def keep_bits_t(key0: int, q0: int, nq: int, p: float) -> dict[int, list[int]]:
    """AccFrag::keep_bits_t for every lane: words w[0 .. nq / 2)."""
    w = {lane: [0] * (nq // 2) for lane in range(32)}
    for u in range(nq // 4):
        bits = {}
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            bits[lane] = keep16(q0 + 8 * (g + 8 * (u >> 1)) + 2 * t + (u & 1), key0 >> 4, p)
        ballot = [sum(((bits[lane] >> r) & 1) << lane for lane in range(32)) for r in range(16)]
        k0 = 4 * (u >> 1) + (u & 1)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            lo, hi = ballot[g] >> t, ballot[g + 8] >> t
            w[lane][k0], w[lane][k0 + 2] = lo, hi
    return w


def keep_bit_t(w: list[int], n: int, e: int) -> bool:
    return bool((w[4 * (n >> 3) + 2 * (e >> 1) + (e & 1)] >> (4 * (n & 7))) & 1)


@pytest.mark.parametrize("nq", [8, 16])
@pytest.mark.parametrize("p", [0.2, 0.7])
def test_keep_bits_t(nq, p):
    key0, q0 = 48, 64
    w = keep_bits_t(key0, q0, nq, p)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for n in range(nq):  # S^T tile n: rows are the warp's keys (row(e) = g + 8 (e >> 1)), columns query rows
            for e in range(4):
                key = key0 + g + 8 * (e >> 1)
                query = q0 + 8 * n + 2 * t + (e & 1)
                want = bool(philox.dropout_keep(SEED, OFFSET, B, NH, H, query, key, p))
                assert keep_bit_t(w[lane], n, e) == want, (lane, n, e)


@pytest.mark.parametrize("nq", [8, 16])
def test_keep_bits_t_makes_each_call_once(nq):
    """keep_bits_t's calls (round u, lane (g, t): query row q0 + 8 (g + 8 (u >> 1)) + 2t + (u & 1),
    the warp's 16 keys) cover each query row of the warp's S^T tile exactly once: 8 nq calls."""
    key0, q0 = 32, 64
    calls = [(q0 + 8 * (g + 8 * (u >> 1)) + 2 * t + (u & 1), key0 >> 4)
             for u in range(nq // 4) for g in range(8) for t in range(4)]
    assert len(calls) == len(set(calls)) == 8 * nq
    assert {i for i, _ in calls} == set(range(q0, q0 + 8 * nq))
