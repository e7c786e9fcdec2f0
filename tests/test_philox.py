"""Philox-4x32 (cupy_fmha.philox): Random123 known-answer vectors at 7 and 10 rounds, the dropout keying, the keep
rate, and independence from how the computation is chunked (tile sizes, launch order)."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_fmha import philox as P

U32 = 0xFFFFFFFF

# Random123's kat_vectors for philox4x32 with 7 rounds (the dropout generator's count): (counter, key) -> output
KAT7 = [
    ((0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    ((U32, U32, U32, U32), (U32, U32), (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A),
    ),
]

# ... and with 10 rounds (Random123's standard generator)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((U32, U32, U32, U32), (U32, U32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("rounds, ctr, key, want", [(10, *v) for v in KAT] + [(7, *v) for v in KAT7],
                         ids=[f"{r}-{n}" for r in (10, 7) for n in ("zeros", "ones", "pi")])
def test_known_answers(rounds, ctr, key, want):
    assert P.DROPOUT_ROUNDS == 7
    # at 7 rounds through the default (the dropout's rounds), at 10 explicitly
    out = P.philox4x32(np.array(ctr, np.uint32), np.array(key, np.uint32), *([] if rounds == 7 else [rounds]))
    assert out.dtype == np.uint32 and out.shape == (4,)
    assert [int(x) for x in out] == list(want)


def test_vectorized_and_broadcast():
    ctrs = np.array([k[0] for k in KAT], np.uint32)
    keys = np.array([k[1] for k in KAT], np.uint32)
    out = P.philox4x32(ctrs, keys, rounds=10)
    np.testing.assert_array_equal(out, np.array([k[2] for k in KAT], np.uint32))
    # one key broadcast over a [2, 3] grid of counters equals one call per counter
    rng = np.random.default_rng(0)
    c = rng.integers(0, 2**32, size=(2, 3, 4), dtype=np.uint64).astype(np.uint32)
    key = np.array([0x12345678, 0x9ABCDEF0], np.uint32)
    out = P.philox4x32(c, key)
    assert out.shape == (2, 3, 4)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(out[i, j], P.philox4x32(c[i, j], key))
    with pytest.raises(ValueError, match="counter"):
        P.philox4x32(np.zeros(3, np.uint32), key)


def test_keying_by_hand():
    """Element (b, h, i, j): counter (4 (j >> 5) + ((j >> 1) & 3), i & ~8, lo(t), hi(t)) with
    t = offset + b*nhead_q + h, key (seed lo, seed hi); the element takes draw
    d = 8 ((i >> 3) & 1) + 2 ((j >> 3) & 3) + (j & 1), byte d & 3 of word d >> 2 of the output."""
    seed, offset, b, nhq, h = 0x0123456789ABCDEF, 0xFFFFFFFF, 3, 5, 4  # t carries into word 3
    t = offset + b * nhq + h
    for i, j in [(0, 0), (7, 5), (130, 8), (2, 15), (1000, 1003), (3, 16), (4, 31), (9, 33), (15, 63)]:
        words = P.philox4x32(
            np.array([4 * (j >> 5) + ((j >> 1) & 3), i & ~8, t & U32, t >> 32], np.uint32),
            np.array([seed & U32, seed >> 32], np.uint32),
            rounds=7,
        )
        d = 8 * ((i >> 3) & 1) + 2 * ((j >> 3) & 3) + (j & 1)
        u = (int(words[d >> 2]) >> (8 * (d & 3))) & 0xFF
        assert int(P.dropout_random(seed, offset, b, nhq, h, i, j)) == u
        assert bool(P.dropout_keep(seed, offset, b, nhq, h, i, j, 0.3)) == (u < 179)  # floor(179.2 + 0.5)


def test_offset_wraps_around_64_bits():
    big = 2**64 - 2  # offset + 1*4 + 1 = 2**64 + 3 -> 3
    np.testing.assert_array_equal(
        P.dropout_random_block(9, big, 1, 4, 6, 20, heads=[1]),
        P.dropout_random_block(9, 3, 0, 4, 6, 20, heads=[0]),
    )
    # the same (offset + b * nhead_q + h) gives the same stream: callers advance offset by
    # batch * nhead_q between calls to get fresh masks
    np.testing.assert_array_equal(
        P.dropout_random_block(9, 10, 1, 4, 5, 9, heads=[2]),
        P.dropout_random_block(9, 16, 0, 4, 5, 9, heads=[0]),
    )


def test_thresholds():
    assert P.keep_threshold(0.0) == 256
    assert P.keep_threshold(0.5) == 128
    assert P.keep_threshold(0.2) == 205  # 204.8 rounds up
    assert P.keep_threshold(0.1) == 230  # 230.4
    assert P.keep_threshold(1 - 2**-9) == 1  # 0.5 rounds half up
    assert P.keep_threshold(1 - 2**-10) == 0 and P.keep_scale(1 - 2**-10) == 0.0  # everything dropped, no infinity
    assert P.keep_threshold(2**-10) == 256 and P.keep_scale(2**-10) == 1.0  # p < 1/512 drops nothing
    assert P.keep_scale(0.5) == 2.0 and P.keep_scale(0.1) == 256 / 230  # the inverse of the applied keep rate
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="dropout_p"):
            P.keep_threshold(bad)
    assert P.dropout_keep_block(1, 2, 0, 2, 9, 17, 0.0).all()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate(p):
    keep = P.dropout_keep_block(1234, 77, 2, 8, 256, 250, p)
    assert keep.shape == (8, 256, 250) and keep.dtype == bool
    n = keep.size
    want = P.keep_threshold(p) / 256
    sigma = np.sqrt(want * (1 - want) / n)
    assert abs(keep.mean() - want) < 5 * sigma, (keep.mean(), want)
    # per head, per draw index (the byte of its call an element takes) and per call index mod 4 too
    for h in range(8):
        assert abs(keep[h].mean() - want) < 5 * np.sqrt(want * (1 - want) / keep[h].size)
    ii, jj = np.meshgrid(np.arange(256), np.arange(250), indexing="ij")
    for sel in [P.draw_index(ii, jj) == d for d in range(16)] + [P.call_index(jj) % 4 == u for u in range(4)]:
        sub = keep[:, sel]
        assert abs(sub.mean() - want) < 5 * np.sqrt(want * (1 - want) / sub.size)


def test_uint8_draws_look_uniform():
    u = P.dropout_random_block(5, 0, 0, 4, 128, 128).astype(np.int64)
    assert u.dtype == np.int64 and u.min() >= 0 and u.max() <= 255
    hist = np.bincount(u.ravel() >> 4, minlength=16)  # 16 bins of 16
    expect = u.size / 16
    chi2 = ((hist - expect) ** 2 / expect).sum()
    assert chi2 < 50  # 15 degrees of freedom; p ~ 1e-5
    # neighbouring columns (draws d, d + 1 of one Philox call) are not equal more often than chance (1/256)
    assert abs(np.mean(u[..., 0::2] == u[..., 1::2]) - 1 / 256) < 1e-3


@pytest.mark.parametrize("tile", [(16, 24), (7, 13), (64, 8), (3, 5)])
def test_independent_of_chunking(tile):
    seed, offset, nhq, b, p = 2**63 + 11, 2**40 + 3, 3, 2, 0.37
    sq, sk = 37, 45
    whole = P.dropout_keep_block(seed, offset, b, nhq, sq, sk, p)
    tm, tn = tile
    # tiles computed element-wise, visited in reverse ("launch order"), heads one at a time
    out = np.zeros_like(whole)
    for h in reversed(range(nhq)):
        for i0 in reversed(range(0, sq, tm)):
            for j0 in range(0, sk, tn):
                i = np.arange(i0, min(i0 + tm, sq))[:, None]
                j = np.arange(j0, min(j0 + tn, sk))[None, :]
                out[h, i, j] = P.dropout_keep(seed, offset, b, nhq, h, i, j, p)
    np.testing.assert_array_equal(out, whole)
    # a longer row (more columns) has the shorter one as its prefix; a head subset matches
    np.testing.assert_array_equal(P.dropout_keep_block(seed, offset, b, nhq, sq, 61, p)[..., :sk], whole)
    np.testing.assert_array_equal(
        P.dropout_keep_block(seed, offset, b, nhq, sq, sk, p, heads=[2, 0]), whole[[2, 0]]
    )


def test_streams_differ():
    base = P.dropout_random_block(1, 0, 0, 2, 16, 16)
    for kw in ({"seed": 2}, {"seed": 1 + 2**32}, {"offset": 2}, {"offset": 2**32}, {"batch_index": 1}):
        args = dict(seed=1, offset=0, batch_index=0)
        args.update(kw)
        other = P.dropout_random_block(args["seed"], args["offset"], args["batch_index"], 2, 16, 16)
        assert np.mean(other == base) < 0.01, kw
    assert np.mean(base[0] == base[1]) < 0.01  # heads differ


def test_seed_offset_checks():
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="seed"):
            P.dropout_random(bad, 0, 0, 1, 0, 0, 0)
        with pytest.raises(ValueError, match="offset"):
            P.dropout_random(0, bad, 0, 1, 0, 0, 0)
    for bad in (1.0, True, "3"):
        with pytest.raises(TypeError, match="seed"):
            P.dropout_random(bad, 0, 0, 1, 0, 0, 0)
    assert P.dropout_random(np.uint64(2**64 - 1), np.int32(5), 0, 1, 0, 0, 0).dtype == np.uint8


def test_odd_arguments_are_refused_not_wrapped():
    """Words outside 32 bits, float indices, negative sizes and heads beyond nhead_q used to wrap,
    truncate or come back empty."""
    from cupy_fmha import philox as P

    with pytest.raises(ValueError, match=r"counter: words must be in \[0, 2\*\*32\)"):
        P.philox4x32([2**32, 0, 0, 0], [0, 0])
    with pytest.raises(ValueError, match="key: words must be in"):
        P.philox4x32([0, 0, 0, 0], [-1, 0])
    with pytest.raises(TypeError, match="counter: expected integer words"):
        P.philox4x32([1.7, 0, 0, 0], [0, 0])
    with pytest.raises(ValueError, match="rounds: expected an int >= 0"):
        P.philox4x32([0, 0, 0, 0], [0, 0], rounds=-1)
    with pytest.raises(ValueError, match="head: expected values below 2"):
        P.dropout_random(1, 2, 0, 2, 3, 0, 0)
    with pytest.raises(TypeError, match="rows: expected integers"):
        P.dropout_random(1, 2, 0, 2, 0, 1.9, 0)
    with pytest.raises(ValueError, match="seqlen_q: expected an int >= 0"):
        P.dropout_random_block(1, 2, 0, 2, -5, 4)
    with pytest.raises(ValueError, match="heads: expected values below 2"):
        P.dropout_random_block(1, 2, 0, 2, 5, 4, heads=[7])
    with pytest.raises(TypeError, match="dropout_p: expected a number"):
        P.keep_threshold("0.5")
