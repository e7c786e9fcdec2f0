"""NumPy model of the gfx9 forward's index maps (kernels/arch/gfx9/fragment.cuh and tile.cuh,
mirrored here formula by formula over the layouts of cupy_fmha.backends.gfx9_layout): the
wavefront's S = Q K^T through v_mfma_f32_16x16x16 with K's rows as the A operand and Q's row
fragments as B, the accumulator read back through AccFrag's row / col, P fed from that
accumulator as the B operand of O^T = V^T P^T (acc_to_a, mma_row_kmajor), the lanes sharing a
row (reduce_max / reduce_sum's xor 16, 32), the O staging store, and the keep bits of
row_keep_bits against the Philox host replica. CPU only; the kernels themselves have not run on an
AMD GPU."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_fmha import philox
from cupy_fmha.backends import gfx9_layout as G

S16 = next(s for s in G.LAYOUTS if s.name == "16x16x16")
LANES = range(G.WAVE)


# -- the maps of fragment.cuh / tile.cuh (L = Mfma16x16x16: a_row, a_k, b_k, b_col, d_row, d_col) --
def a_row(l, i=0): return G.a_coords(S16, l, i)[0]
def a_k(l, i): return G.a_coords(S16, l, i)[1]
def b_k(l, i): return G.b_coords(S16, l, i)[0]
def b_col(l, i=0): return G.b_coords(S16, l, i)[1]
def d_row(l, r): return G.d_coords(S16, l, r)[0]
def d_col(l, r=0): return G.d_coords(S16, l, r)[1]


def frag_row(l, e):  # AccFrag::row
    return d_col(l, e)


def frag_col(l, n, e):  # AccFrag::col
    return 16 * n + d_row(l, e)


def load_a(tile, m0, k0):  # load_a: row m0 + b_col, columns k0 + b_k(lane, 0) + i
    return np.array([[tile[m0 + b_col(l), k0 + b_k(l, 0) + i] for i in range(4)] for l in LANES], dtype=np.float32)


def kmajor_operand(tile, n0, k0):  # mma_row_kmajor's A operand: tile[k0 + a_k(lane, 0) + i][n0 + a_row]
    return np.array([[tile[k0 + a_k(l, 0) + i, n0 + a_row(l)] for i in range(4)] for l in LANES], dtype=np.float32)


def acc_to_a(acc_tile):  # the 4 accumulator elements of a tile, in order
    return np.array(acc_tile, dtype=np.float32)


def mfma(ra, rb, rc):
    return G.mfma_model(S16, ra, rb, rc)


def test_the_composition_needs_these_layout_identities():
    """tile.cuh reads K's rows with load_a (so A's (row, k) must be B's (col, k)) and hands S's
    accumulator to acc_to_a as P's B operand (so D's (row, col) must be B's (k, col))."""
    for l in LANES:
        for i in range(4):
            assert (a_row(l, i), a_k(l, i)) == (b_col(l, i), b_k(l, i))
            assert (d_row(l, i), d_col(l, i)) == (b_k(l, i), b_col(l, i))
            assert a_k(l, i) == a_k(l, 0) + i  # 4 consecutive k per lane (one 8-byte read)


def test_forward_products_of_one_wavefront():
    rng = np.random.default_rng(12)
    hq, hv, bn = 32, 48, 32  # two k-steps of Q, three O tiles, two S tiles
    q = rng.standard_normal((16, hq)).astype(np.float32)
    k = rng.standard_normal((bn, hq)).astype(np.float32)
    v = rng.standard_normal((bn, hv)).astype(np.float32)
    # S = Q K^T: per S tile n, per k-step, D += K rows (A) x Q fragment (B)
    s = [np.zeros((64, 4), np.float32) for _ in range(bn // 16)]
    for kk in range(hq // 16):
        qf = load_a(q, 0, 16 * kk)
        for n in range(bn // 16):
            s[n] = mfma(load_a(k, 16 * n, 16 * kk), qf, s[n])
    want = q @ k.T
    for n in range(bn // 16):
        for l in LANES:
            for e in range(4):
                assert s[n][l, e] == pytest.approx(want[frag_row(l, e), frag_col(l, n, e)], rel=1e-5, abs=1e-5)
    # O = P V with P = S (any values): per k-step kk, B = acc_to_a(S tile kk), A = V^T columns
    o = [np.zeros((64, 4), np.float32) for _ in range(hv // 16)]
    for kk in range(bn // 16):
        pa = acc_to_a(s[kk])
        for n in range(hv // 16):
            o[n] = mfma(kmajor_operand(v, 16 * n, 16 * kk), pa, o[n])
    want_o = want @ v
    for n in range(hv // 16):
        got = np.zeros((16, 16), np.float32)
        for l in LANES:
            for e in range(4):  # store_16bit: row(0), columns col(n, 0) .. + 3
                assert frag_row(l, e) == frag_row(l, 0) and frag_col(l, n, e) == frag_col(l, n, 0) + e
                got[frag_row(l, 0), frag_col(l, n, e) - 16 * n] = o[n][l, e]
        np.testing.assert_allclose(got, want_o[:, 16 * n:16 * n + 16], rtol=1e-4, atol=1e-4)


def test_row_reductions_cover_each_row():
    """AccFrag::reduce_*: xor 16 and xor 32 reach exactly the lanes holding the same row, which
    together hold each of a tile's 16 columns once; row_leader is one lane per row."""
    for l in LANES:
        group = {l, l ^ 16, l ^ 32, l ^ 48}
        assert {m for m in LANES if frag_row(m, 0) == frag_row(l, 0)} == group
        assert sorted(frag_col(m, 0, e) for m in group for e in range(4)) == list(range(16))
    assert sorted(frag_row(l, 0) for l in LANES if l < 16) == list(range(16))


@pytest.mark.parametrize("k0, tiles", [(0, 8), (48, 3), (4096 + 16, 2)])
def test_keep_bits_match_the_host_replica(k0, tiles):
    """row_keep_bits: bit 4m + c of lane l is the keep decision of (row, k0 + col(l, m, c)); one
    Philox call per lane and tile (16 keys: keep16 of group k0 / 16 + m), of which the lane takes
    bits c0 .. c0 + 3."""
    seed, offset, b, nh, h, p = 0x1234_5678_9ABC, 77, 1, 3, 2, 0.3
    thr = philox.keep_threshold(p)
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32)
    t = offset + b * nh + h
    for l in LANES:
        i = 5 + frag_row(l, 0)
        c0 = d_row(l, 0)
        bits = 0
        for m in range(tiles):
            jg16 = (k0 >> 4) + m  # keep16(i, (jg0 >> 1) + m): the tile's 16 keys are one call
            r = philox.philox4x32(np.array([jg16, i, t & 0xFFFFFFFF, t >> 32], np.uint32), key, philox.DROPOUT_ROUNDS)
            k16 = sum(int(((int(r[c >> 2]) >> (8 * (c & 3))) & 0xFF) < thr) << c for c in range(16))
            bits |= ((k16 >> c0) & 0xF) << (4 * m)
        for m in range(tiles):
            for c in range(4):
                j = k0 + frag_col(l, m, c)
                want = philox.dropout_keep(seed, offset, b, nh, h, i, j, p)
                assert bool((bits >> (4 * m + c)) & 1) == bool(want), (l, m, c)
