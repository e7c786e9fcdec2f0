"""CK mask strings, FlashAttention arguments, and the tile helpers against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupy_fmha.mask import (
    MaskSpec,
    Window,
    dense_mask,
    k_tile_range,
    parse_mask,
    q_tile_range,
    resolve_mask,
    tile_needs_mask,
)


@pytest.mark.parametrize(
    "text, spec",
    [
        ("0", MaskSpec()),
        (None, MaskSpec()),
        ("t", MaskSpec("top_left", -1, 0)),
        ("1", MaskSpec("top_left", -1, 0)),
        ("b", MaskSpec("bottom_right", -1, 0)),
        ("2", MaskSpec("bottom_right", -1, 0)),
        ("t:3,5", MaskSpec("top_left", 3, 5)),
        ("b:-1,4", MaskSpec("bottom_right", -1, 4)),
        ("xt:8", MaskSpec("top_left", 4, 3)),
        ("xb:7", MaskSpec("bottom_right", 3, 3)),
        ("xt:0", MaskSpec("top_left", -1, 0)),
        ("xb:-2", MaskSpec("bottom_right", -1, 0)),
        ("g:5,2", MaskSpec("generic", 5, 2)),
    ],
)
def test_parse_every_ck_string(text, spec):
    assert parse_mask(text) == spec
    assert parse_mask(spec.describe()) == spec


@pytest.mark.parametrize("bad", ["x", "t:1", "t:a,b", "b:1,2,3", "xt:", "g:1", "q:1,2"])
def test_parse_errors_name_mask(bad):
    with pytest.raises(ValueError, match="mask"):
        parse_mask(bad)


def _brute(sq, sk, keep):
    return np.array([[keep(i, j) for j in range(sk)] for i in range(sq)], dtype=bool)


@pytest.mark.parametrize("sq, sk", [(6, 6), (4, 9), (9, 4), (1, 5), (5, 1)])
def test_dense_mask_semantics(sq, sk):
    off = sk - sq
    np.testing.assert_array_equal(dense_mask(parse_mask("t"), sq, sk), _brute(sq, sk, lambda i, j: j <= i))
    np.testing.assert_array_equal(dense_mask(parse_mask("b"), sq, sk), _brute(sq, sk, lambda i, j: j <= i + off))
    np.testing.assert_array_equal(dense_mask(parse_mask("t:1,2"), sq, sk),
                                  _brute(sq, sk, lambda i, j: i - 1 <= j <= i + 2))
    np.testing.assert_array_equal(dense_mask(parse_mask("b:2,1"), sq, sk),
                                  _brute(sq, sk, lambda i, j: i + off - 2 <= j <= i + off + 1))
    np.testing.assert_array_equal(dense_mask(parse_mask("g:3,2"), sq, sk),
                                  _brute(sq, sk, lambda i, j: i - 2 <= j < i + 2))
    assert dense_mask(None, sq, sk).all()


def test_resolve_with_flash_attention_args():
    assert resolve_mask(None) == MaskSpec()
    assert resolve_mask(None, causal=True) == MaskSpec("bottom_right", -1, 0)
    assert resolve_mask(None, window_size=(4, 0)) == MaskSpec("bottom_right", 4, 0)
    assert resolve_mask(None, causal=True, window_size=(4, 7)) == MaskSpec("bottom_right", 4, 0)
    assert resolve_mask(None, window_size=(-1, 3)) == MaskSpec("bottom_right", -1, 3)
    assert resolve_mask("t:2,3") == MaskSpec("top_left", 2, 3)
    assert resolve_mask("0", causal=True) == MaskSpec("bottom_right", -1, 0)
    assert resolve_mask(0, causal=True) == MaskSpec("bottom_right", -1, 0)
    assert resolve_mask(MaskSpec(), window_size=(1, 1)) == MaskSpec("bottom_right", 1, 1)
    # FlashAttention: key j visible iff i + sk - sq - left <= j <= i + sk - sq + right
    sq, sk, left, right = 5, 9, 2, 1
    want = _brute(sq, sk, lambda i, j: i + sk - sq - left <= j <= i + sk - sq + right)
    np.testing.assert_array_equal(dense_mask(resolve_mask(None, window_size=(left, right)), sq, sk), want)
    with pytest.raises(ValueError, match="mask"):
        resolve_mask("t", causal=True)
    with pytest.raises(ValueError, match="mask"):
        resolve_mask("b:1,1", window_size=(2, 2))
    with pytest.raises(ValueError, match="window_size"):
        resolve_mask(None, window_size=(-3, 0))
    with pytest.raises(ValueError, match="window_size"):
        resolve_mask(None, window_size="ab")


masks = st.one_of(
    st.just(None),
    st.builds(MaskSpec, st.sampled_from(["top_left", "bottom_right"]),
              st.integers(-1, 40), st.integers(-1, 40)),
    st.builds(MaskSpec, st.just("generic"), st.integers(-20, 60), st.integers(-20, 60)),
)


@settings(max_examples=150, deadline=None)
@given(
    spec=masks,
    sq=st.integers(1, 70),
    sk=st.integers(1, 70),
    kM0=st.sampled_from([1, 4, 8, 16, 32]),
    kN0=st.sampled_from([1, 8, 16, 64]),
)
def test_tile_helpers_against_brute_force(spec, sq, sk, kM0, kN0):
    win = spec.window(sq, sk) if spec is not None else None
    dense = dense_mask(win, sq, sk)
    q_tiles = range(0, sq, kM0)
    k_tiles = range(0, sk, kN0)
    for k0 in k_tiles:
        lo, hi = q_tile_range(win, k0, kN0, kM0, sq)
        assert lo % kM0 == 0 and lo <= hi
        cols = dense[:, k0:k0 + kN0]
        rows_seen = np.nonzero(cols.any(axis=1))[0]
        if rows_seen.size:  # every row that sees a key of this block lies in the range
            assert lo <= rows_seen.min() and rows_seen.max() < hi
    for q0 in q_tiles:
        lo, hi = k_tile_range(win, q0, kM0, kN0, sk)
        assert lo % kN0 == 0 and lo <= hi
        rows = dense[q0:q0 + kM0]
        cols_seen = np.nonzero(rows.any(axis=0))[0]
        if cols_seen.size:
            assert lo <= cols_seen.min() and cols_seen.max() < hi
        for k0 in k_tiles:
            tile = dense[q0:q0 + kM0, k0:k0 + kN0]
            full = tile.shape == (kM0, kN0) and tile.all()
            needs = tile_needs_mask(win, q0, k0, kM0, kN0, sq, sk)
            if not needs:
                assert full, (q0, k0)
            # the test is exact for whole tiles: a fully visible, in-bounds tile needs no mask
            assert needs == (not full), (q0, k0)
            klo, khi = k_tile_range(win, q0, kM0, kN0, sk)
            if not (klo <= k0 < khi):
                assert not tile.any()


def test_window_key_range():
    w = Window(3, 2)
    assert w.key_range(0, 10) == (0, 2)
    assert w.key_range(5, 10) == (3, 7)
    assert w.key_range(9, 10) == (7, 10)


# ---------------------------------------------------------------------------------------------
# sizes beyond 2**62 (window arithmetic in int64): a named ValueError, not NumPy's OverflowError


@pytest.mark.parametrize("text", ["t:9999999999999999999999,0", "b:0,-9999999999999999999999",
                                  "xt:9999999999999999999999", f"xb:{2**62 + 1}", f"g:1,{-2**62 - 1}"])
def test_sizes_beyond_2_62_name_mask(text):
    with pytest.raises(ValueError, match=r"^mask: .*out of range"):
        parse_mask(text)
    with pytest.raises(ValueError, match=r"^mask: "):
        resolve_mask(text)


@pytest.mark.parametrize("window", [(9999999999999999999999, 0), (0, 2**62 + 1), (-(2**63), 0)])
def test_window_beyond_2_62_names_window_size(window):
    with pytest.raises(ValueError, match=r"^window_size: .*out of range"):
        resolve_mask(None, False, window)


def test_sizes_at_the_edge_are_unlimited_in_effect():
    big = 2**62
    for text in (f"t:{big},{big}", f"b:{big},{big}", f"xb:{big}", f"g:{big},{big}"):
        assert dense_mask(parse_mask(text), 5, 7).all()
    assert dense_mask(resolve_mask(None, False, (big, big)), 5, 7).all()
    assert parse_mask(f"t:{-big},0") == MaskSpec("top_left", -1, 0)
    assert not dense_mask(parse_mask(f"g:{-big},{-big}"), 5, 7).any()


def test_ck_meanings_of_numeric_aliases_and_nonpositive_widths():
    # CK tile's example decodes "1"/"2" as "t"/"b", and xt:w / xb:w with w <= 0 as causal
    # (left = -1, right = 0) from that corner
    assert parse_mask("1") == parse_mask("t") and parse_mask("2") == parse_mask("b")
    for w in (0, -3):
        assert parse_mask(f"xt:{w}") == parse_mask("t")
        assert parse_mask(f"xb:{w}") == parse_mask("b")
