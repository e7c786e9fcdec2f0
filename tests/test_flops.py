"""FLOP and byte counts: exact pair counts against dense_mask, FlashAttention's convention."""

from __future__ import annotations

import time

import numpy as np

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupy_fmha.flops import attention_bytes, attention_flops, is_plain_causal, visible_pairs
from cupy_fmha.mask import MaskSpec, dense_mask, parse_mask


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["none", "top_left", "bottom_right", "generic"]),
    a=st.integers(-1, 50),
    b=st.integers(-1, 50),
    sq=st.integers(0, 60),
    sk=st.integers(0, 60),
)
def test_visible_pairs_matches_dense(kind, a, b, sq, sk):
    spec = MaskSpec(kind, a, b)
    assert visible_pairs(spec, sq, sk) == int(dense_mask(spec, sq, sk).sum())
    win = spec.window(sq, sk)
    assert visible_pairs(win, sq, sk) == int(dense_mask(spec, sq, sk).sum())


@pytest.mark.parametrize("text", ["0", "t", "b", "t:3,5", "b:7,0", "xt:16", "xb:9", "g:10,3"])
def test_visible_pairs_strings(text):
    for sq, sk in [(33, 33), (20, 50), (50, 20)]:
        assert visible_pairs(text, sq, sk) == int(dense_mask(parse_mask(text), sq, sk).sum())


@settings(max_examples=300, deadline=None)
@given(y=st.integers(-80, 80), x=st.integers(-80, 80), sq=st.integers(0, 30), sk=st.integers(0, 30),
       far=st.sampled_from([0, 2**62, 2**80]))
def test_visible_pairs_huge_windows(y, x, sq, sk, far):
    """Window sides far beyond the sequences (MaskSpec allows up to 2**62; a Window any int) count
    like ones just past them: the int64 sums used to overflow into nonsense."""
    from cupy_fmha.mask import Window

    def grow(n):
        return n if abs(n) <= 40 or not far else (far if n > 0 else -far)

    y2, x2 = grow(y), grow(x)
    want = sum(1 for i in range(sq) for j in range(sk) if i - y2 + 1 <= j < i + x2)
    assert visible_pairs(Window(y2, x2), sq, sk) == want


def test_visible_pairs_fast_for_million_rows():
    t = time.perf_counter()
    n = visible_pairs(parse_mask("b:4096,0"), 1 << 20, 1 << 20)
    assert time.perf_counter() - t < 1.0
    s = 1 << 20
    assert n == 4097 * s - 4096 * 4097 // 2


def test_flash_attention_convention():
    s, d = 1024, 64
    assert attention_flops(1, 1, s, s, d, d, None, "fwd") == 4 * s * s * d
    assert attention_flops(1, 1, s, s, d, d, None, "bwd") == 10 * s * s * d  # 2.5x fwd
    for causal in (parse_mask("t"), parse_mask("b"), MaskSpec("bottom_right", -1, 0), "xt:0"):
        assert is_plain_causal(causal)
        assert attention_flops(2, 8, s, s, d, d, causal, "fwd") == 2 * 8 * 4 * s * s * d // 2
        assert attention_flops(2, 8, s, s, d, d, causal, "bwd") == 2 * 8 * 10 * s * s * d // 2
    # causal with sq != sk: still half of sq * sk (FlashAttention's benchmark convention)
    assert attention_flops(1, 1, 128, 512, d, d, "b", "fwd") == 4 * 128 * 512 * d // 2
    # sliding window: exact pairs
    w = parse_mask("b:255,0")
    assert not is_plain_causal(w) and not is_plain_causal("g:1024,1") and not is_plain_causal(None)
    pairs = visible_pairs(w, s, s)
    assert attention_flops(3, 4, s, s, d, d, w, "fwd") == 3 * 4 * 4 * pairs * d
    # d != dv
    assert attention_flops(1, 2, s, s, 192, 128, None, "fwd") == 2 * 2 * s * s * (192 + 128)
    assert attention_flops(1, 2, s, s, 192, 128, None, "bwd") == 2 * 2 * s * s * (3 * 192 + 2 * 128)
    assert attention_flops(1, 1, s, s, 192, 128, "t", "bwd") == s * s * (3 * 192 + 2 * 128)
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 1, s, s, d, d, None, "both")


def test_bytes():
    b, hq, hk, sq, sk, d, dv = 2, 8, 2, 100, 300, 64, 32
    q, k, v, o = b * hq * sq * d, b * hk * sk * d, b * hk * sk * dv, b * hq * sq * dv
    lse = b * hq * sq * 4
    assert attention_bytes(b, hq, sq, sk, d, dv, "fwd", 2, nhead_k=hk) == 2 * (q + k + v + o) + lse
    assert attention_bytes(b, hq, sq, sk, d, dv, "bwd", 2, nhead_k=hk) == 2 * 2 * (q + k + v + o) + lse
    assert attention_bytes(1, 1, 8, 8, 8, 8, "fwd") == 2 * 4 * 64 + 32
    with pytest.raises(ValueError, match="mode"):
        attention_bytes(1, 1, 8, 8, 8, 8, "x")


def test_any_visible_agrees_with_visible_pairs():
    # the O(1) emptiness test used by argument validation, against the exact count
    from cupy_fmha.flops import any_visible, visible_pairs
    from cupy_fmha.mask import Window

    rng = np.random.default_rng(7)
    for _ in range(3000):
        sq, sk = int(rng.integers(0, 40)), int(rng.integers(0, 40))
        y, x = int(rng.integers(-50, 50)), int(rng.integers(-50, 50))
        win = Window(y, x)
        assert any_visible(win, sq, sk) == (visible_pairs(win, sq, sk) > 0), (sq, sk, y, x)
    for m in ("0", "t", "b", "t:3,0", "b:0,0", "xt:4", "g:5,2"):
        for sq, sk in ((1, 1), (300, 120), (5, 900), (64, 0)):
            assert any_visible(m, sq, sk) == (visible_pairs(m, sq, sk) > 0), (m, sq, sk)
