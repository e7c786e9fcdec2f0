"""NumPy model of the gfx9 forward's index maps (kernels/arch/gfx9/fragment.cuh and tile.cuh,
mirrored here formula by formula over the layouts of cupy_fmha.backends.gfx9_layout): the
wavefront's S = Q K^T through v_mfma_f32_16x16x16 with K's rows as the A operand and Q's row
fragments as B, the accumulator read back through AccFrag's row / col, P fed from that
accumulator as the B operand of O^T = V^T P^T (acc_to_a, mma_row_kmajor), the lanes sharing a
row (reduce_max / reduce_sum's xor 16, 32), the O staging store, and the keep words of
fwd_keep_words (the dropout keying of bench/NOTES.md step 96: two Philox calls per lane and tile)
against the Philox host replica. tests/test_gfx9_bwd_model.py's host build of the C++ checks
fwd_keep_words against fwd_keep_sources below. CPU only; the kernels themselves have not run on an
AMD GPU."""

from __future__ import annotations

import functools

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


# -- dropout: philox.cuh's keying (Dropout::call_of, draw_of, keep16) and AccFrag::fwd_keep_words --
KEEP_TILES = 8  # AccFrag::KEEP_TILES: tiles per word, 4 bits each
SEED, OFFSET, B, NH, H = 0x1234_5678_9ABC, 77, 1, 3, 2


def call_of(j):  # Dropout::call_of
    return 4 * (j >> 5) + ((j >> 1) & 3)


def draw_of(i, j):  # Dropout::draw_of
    return 8 * ((i >> 3) & 1) + 2 * ((j >> 3) & 3) + (j & 1)


@functools.lru_cache(maxsize=None)
def keep16(ip, c, p):
    """Dropout::keep16 of (SEED, OFFSET, B, NH, H): bit d iff draw d of call c of row pair ip is
    below the threshold (the counter built here, not through the replica's keying)."""
    t = OFFSET + B * NH + H
    key = np.array([SEED & 0xFFFFFFFF, SEED >> 32], np.uint32)
    r = philox.philox4x32(np.array([c, ip, t & 0xFFFFFFFF, t >> 32], np.uint32), key, philox.DROPOUT_ROUNDS)
    thr = philox.keep_threshold(p)
    return sum(int(((int(r[d >> 2]) >> (8 * (d & 3))) & 0xFF) < thr) << d for d in range(16))


def _fwd_keep_terms(l, ns, row0, k0):
    """fwd_keep_words' loop for lane l: (a, m, ip, c, d) per tile 8a + m (row pair ip, calls c and
    c + 1, draws d and d + 1 of each); with NS even (whole 32-key spans, k0 % 32 == 0) tile m + 1
    takes the calls of tile m (m even), draws d + 4 and d + 5."""
    pair = 2 if ns % 2 == 0 else 1
    i = row0 + frag_row(l, 0)
    for a in range((ns + KEEP_TILES - 1) // KEEP_TILES):
        for m in range(0, KEEP_TILES, pair):
            if KEEP_TILES * a + m >= ns:
                break
            jb = k0 + frag_col(l, KEEP_TILES * a + m, 0)
            for u in range(pair):
                yield a, m + u, i & ~8, call_of(jb), draw_of(i, jb) + 4 * u


def fwd_keep_words(l, ns, row0, k0, p):
    """AccFrag::fwd_keep_words<NS> for lane l: w[0][a] (ROW_SLOTS = 1)."""
    w = [0] * ((ns + KEEP_TILES - 1) // KEEP_TILES)
    for a, m, ip, c, d in _fwd_keep_terms(l, ns, row0, k0):
        x, y = (keep16(ip, c, p) >> d) & 3, (keep16(ip, c + 1, p) >> d) & 3
        w[a] |= (x | (y << 2)) << (4 * m)
    return w


def fwd_keep_sources(l, ns, row0, k0):
    """Where fwd_keep_words takes each bit of lane l: {32 a + 4 m + c: (row pair, call, draw)}
    (bits c = 0, 1 from draws d, d + 1 of call c0, bits 2, 3 from those of call c0 + 1)."""
    return {32 * a + 4 * m + c: (ip, c0 + (c >> 1), d + (c & 1))
            for a, m, ip, c0, d in _fwd_keep_terms(l, ns, row0, k0) for c in range(4)}


def test_keying_helpers_are_the_replicas():
    """call_of / draw_of (philox.cuh's expressions) are the replica's call_index / draw_index, and
    keep16's bit draw_of(i, j) of call call_of(j) of row pair i & ~8 is dropout_keep(i, j)."""
    i, j = np.meshgrid(np.arange(0, 48), np.arange(4064, 4160), indexing="ij")
    np.testing.assert_array_equal(call_of(j), philox.call_index(j))
    np.testing.assert_array_equal(draw_of(i, j), philox.draw_index(i, j))
    for ii, jj in ((0, 0), (9, 37), (27, 4100), (40, 4159)):
        want = bool(philox.dropout_keep(SEED, OFFSET, B, NH, H, ii, jj, 0.4))
        assert bool((keep16(ii & ~8, call_of(jj), 0.4) >> draw_of(ii, jj)) & 1) == want


# key blocks of the gfx9 forward (BLOCK_N = 16, 32 or 64: NS = 1, 2, 4; k0 a multiple of BLOCK_N), an
# odd NS starting on or half-way into a 32-key span; NS = 10 fills a second word
@pytest.mark.parametrize("ns, row0, k0", [(1, 0, 16), (1, 0, 32), (2, 16, 0), (4, 48, 64), (4, 32, 4096 + 128),
                                          (10, 5, 4096 + 32), (3, 64, 4096 + 96), (3, 16, 48)])
@pytest.mark.parametrize("p", [0.3, 0.8])  # (not 0: every bit 1 would hide a wrong mapping)
def test_keep_words_match_the_host_replica(ns, row0, k0, p):
    """fwd_keep_words: bit 4m + c of word a of lane l is the keep decision of (row0 + row(0),
    k0 + col(8a + m, c)), as softmax_p_scaled reads it (attention.cuh: bits E m + c of keep.w[0][a]
    zero s[4 (8a + m) + c])."""
    rows = row0 + np.arange(16)
    keys = k0 + np.arange(16 * ns)
    want = philox.dropout_keep(SEED, OFFSET, B, NH, H, rows[:, None], keys[None, :], p)
    assert 0 < want.sum() < want.size
    for l in LANES:
        w = fwd_keep_words(l, ns, row0, k0, p)
        assert all(x < (1 << 32) for x in w)
        for t in range(ns):
            a, m = divmod(t, KEEP_TILES)
            for c in range(4):
                got = bool((w[a] >> (4 * m + c)) & 1)
                assert got == bool(want[frag_row(l, c), frag_col(l, t, c)]), (l, t, c)
        # bits past the last tile are 0
        assert w[-1] >> (4 * (ns - KEEP_TILES * (len(w) - 1))) == 0


@pytest.mark.parametrize("ns, row0, k0", [(10, 16, 64), (4, 0, 0), (2, 80, 4096 + 32), (1, 16, 48)])
def test_keep_word_sources_are_the_keying(ns, row0, k0):
    """Each bit of fwd_keep_words is the draw the replica's keying gives its element (row pair,
    call_index, draw_index), independent of p; per lane and tile two calls, 2 draws of each, and
    across the wavefront each of a tile's (row pair, call) made by 4 lanes (32 distinct calls: the
    16 rows' 4 calls of the tile's half of a 32-key span)."""
    made = {}
    for l in LANES:
        src = fwd_keep_sources(l, ns, row0, k0)
        assert sorted(src) == [32 * (t // KEEP_TILES) + 4 * (t % KEEP_TILES) + c for t in range(ns) for c in range(4)]
        i = row0 + frag_row(l, 0)
        for t in range(ns):
            bits = [32 * (t // KEEP_TILES) + 4 * (t % KEEP_TILES) + c for c in range(4)]
            for c, bit in enumerate(bits):
                j = k0 + frag_col(l, t, c)
                assert src[bit] == (i & ~8, int(philox.call_index(j)), int(philox.draw_index(i, j))), (l, t, c)
            calls = {src[bit][:2] for bit in bits}
            assert len(calls) == 2
            for call in calls:
                made.setdefault((t, call), []).append(l)
    for t in range(ns):
        assert len([k for k in made if k[0] == t]) == 32
    assert all(len(v) == 4 for v in made.values())
