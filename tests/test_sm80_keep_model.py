"""A lane-by-lane model of kernels/arch/sm80/fragment.cuh's dropout keep bits (the layout the
mma.sync kernels and the Hopper wgmma kernels share) and of philox.cuh's word tile, checked against
the Philox host replica cupy_fmha.philox, so the index logic is tested without a GPU:

* ``fwd_keep_words`` (the forwards): lane (g, t) makes calls 4 s + t of row pair row0 + g for the
  32-key spans s of its key block and puts two calls' bytes r side by side (PRMT), or, for key
  blocks of 16-key multiples that start half-way into a span, shifts the calls' bytes into place;
  bit 2m + c of word [r][a] is column c of n8 tile 8a + m in row slot r.
* ``fill_keep_words`` + ``keep_bit`` (the backwards): a tile's words [call][row pair], read as
  32-bit pairs of words by the lanes that hold S^T's elements (rows: keys, columns: query rows).

The model mirrors the C++ expressions (the same index formulas); the GPU tests check the kernels
themselves (bench/NOTES.md step 96)."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_fmha import philox

SEED, OFFSET, B, NH, H = 0x0123_4567_89AB_CDEF, 11, 1, 3, 2


def keep16(ip: int, c: int, p: float) -> int:
    """philox.cuh Dropout::keep16: bit d iff draw d of call c of row pair ip is below the threshold."""
    counter, key = philox.dropout_counter_key(SEED, OFFSET, B, NH, H, ip, 0)
    counter = counter.copy()
    counter[0] = c
    words = philox.philox4x32(counter, key, philox.DROPOUT_ROUNDS)
    thr = philox.keep_threshold(p)
    return sum(int(((int(words[d >> 2]) >> (8 * (d & 3))) & 0xFF) < thr) << d for d in range(16))


def byte_perm(x: int, y: int, s: int) -> int:
    """CUDA __byte_perm: result byte n is byte (s >> 4n) & 7 of y:x."""
    b = [(x >> (8 * k)) & 0xFF for k in range(4)] + [(y >> (8 * k)) & 0xFF for k in range(4)]
    return sum(b[(s >> (4 * n)) & 7] << (8 * n) for n in range(4))


def fwd_keep_words(ns: int, row0: int, k0: int, g: int, t: int, p: float) -> list[list[int]]:
    """AccFrag::fwd_keep_words<NS> for lane (g, t): words w[r][a]."""
    nw = (ns + 7) // 8
    ip, c0 = row0 + g, 4 * (k0 >> 5) + t
    w = [[0] * nw for _ in range(2)]
    if ns % 4 == 0:
        for a in range(nw):
            x = keep16(ip, c0 + 8 * a, p)
            y = keep16(ip, c0 + 8 * a + 4, p) if 8 * a + 4 < ns else 0
            w[0][a], w[1][a] = byte_perm(x, y, 0x0040), byte_perm(x, y, 0x0051)
    else:
        nc = (ns + 2 + 3) // 4
        b0 = b1 = 0
        for q in range(nc):
            x = keep16(ip, c0 + 4 * q, p)
            b0 |= (x & 0xFF) << (8 * q)
            b1 |= ((x >> 8) & 0xFF) << (8 * q)
        o = 2 * ((k0 >> 3) & 3)
        b0, b1 = b0 >> o, b1 >> o
        for a in range(nw):
            w[0][a], w[1][a] = (b0 >> (16 * a)) & 0xFFFF, (b1 >> (16 * a)) & 0xFFFF
    return w


@pytest.mark.parametrize("ns,k0", [(16, 0), (16, 256), (8, 64), (12, 96), (2, 16), (2, 32), (10, 80), (10, 160)])
@pytest.mark.parametrize("p", [0.1, 0.5])  # (not 0: every bit 1 would hide a wrong mapping)
def test_fwd_keep_words(ns, k0, p):
    row0 = 48  # a multiple of 16
    for lane in range(0, 32, 3):
        g, t = lane >> 2, lane & 3
        w = fwd_keep_words(ns, row0, k0, g, t, p)
        for r in range(2):
            i = row0 + g + 8 * r
            for n in range(ns):  # n8 tile n: columns 8 n + 2 t + c
                for c in range(2):
                    j = k0 + 8 * n + 2 * t + c
                    want = bool(philox.dropout_keep(SEED, OFFSET, B, NH, H, i, j, p))
                    assert bool((w[r][n >> 3] >> (2 * (n & 7) + c)) & 1) == want, (lane, r, n, c)


def fill_keep_words(m: int, n: int, q0: int, k0: int, p: float) -> list[int]:
    """philox.cuh fill_keep_words<M, N, NT>: the tile's words (every unit, any thread order)."""
    words = [0] * ((m // 2) * (n // 8))
    for x in range(len(words)):
        pp, c = x % (m // 2), x // (m // 2)
        words[x] = keep16(q0 + 16 * (pp >> 3) + (pp & 7), 4 * (k0 >> 5) + c, p)
    return words


def keep_bit(words: list[int], m: int, key0l: int, n: int, e: int, g: int, t: int) -> bool:
    """AccFrag::keep_bit: one 32-bit read of two words, then the element's bit."""
    base = (4 * (key0l >> 5) + ((g >> 1) & 3)) * (m // 2) + 8 * (n >> 1) + 2 * t
    pair = words[base] | (words[base + 1] << 16)
    return bool((pair >> (16 * (e & 1) + 8 * (n & 1) + 2 * ((key0l >> 3) & 3) + 2 * (e >> 1) + (g & 1))) & 1)


@pytest.mark.parametrize("m,n,q0,k0", [(64, 128, 64, 128), (16, 64, 32, 0), (128, 128, 0, 256)])
@pytest.mark.parametrize("p", [0.2, 0.7])
def test_keep_bit_reads_the_word_tile(m, n, q0, k0, p):
    words = fill_keep_words(m, n, q0, k0, p)
    for key0l in range(0, n, 16):  # the warps' keys inside the tile
        for lane in range(0, 32, 5):
            g, t = lane >> 2, lane & 3
            for nn in range(m // 8):  # S^T tile nn: rows are keys (row(e) = g + 8 (e >> 1)), columns query rows
                for e in range(4):
                    key = k0 + key0l + g + 8 * (e >> 1)
                    query = q0 + 8 * nn + 2 * t + (e & 1)
                    want = bool(philox.dropout_keep(SEED, OFFSET, B, NH, H, query, key, p))
                    assert keep_bit(words, m, key0l, nn, e, g, t) == want, (key0l, lane, nn, e)


def test_one_call_serves_one_threads_sixteen_scores():
    """The keying's point: the 16 draws of call 4s + t of row pair 16a + g are exactly lane (g, t)'s
    elements (rows 16a + g, + 8; columns 8m + 2t + c of the span's 4 n8 tiles), each once."""
    for g in range(8):
        for t in range(4):
            elems = {(16 + g + 8 * r, 32 * 3 + 8 * m + 2 * t + c) for r in range(2) for m in range(4) for c in range(2)}
            i = np.array([e[0] for e in elems])
            j = np.array([e[1] for e in elems])
            assert set(philox.call_index(j)) == {4 * 3 + t}
            assert set(i & ~8) == {16 + g}
            assert sorted(philox.draw_index(i, j)) == list(range(16))
