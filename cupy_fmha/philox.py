"""Philox-4x32 (Salmon et al., SC'11) in vectorized NumPy, and the dropout keep mask built on it.

This is the bit-exact host replica of the generator the GPU kernels use for dropout, so a
kernel's keep mask can be checked element by element.

Generator: Philox-4x32 with :data:`DROPOUT_ROUNDS` = 7 rounds, the round count of the dropout in
FlashAttention-2 and in AMD's Composable Kernel (ck_tile's philox), which Salmon et al. report as
passing TestU01's BigCrush (10, Random123's default, adds a safety margin; 7 saves 30% of the
generator's work in every dropout kernel, bench/NOTES.md step 73; before it this project used 10).
:func:`philox4x32` computes any round count (Random123's known answers at 7 and 10 rounds are
tests). One round maps counter words (c0, c1, c2, c3) and key words (k0, k1) to::

    hi0:lo0 = 0xD2511F53 * c0            (64-bit product)
    hi1:lo1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

and the key is bumped by (0x9E3779B9, 0xBB67AE85) (mod 2^32) between rounds.

Dropout keying (independent of tile sizes and launch order): for the attention element
(b, h, i, j) -- b the batch index (the sequence index in varlen mode), h the query head, i the
query row and j the key column, both local to the sequence -- with 64-bit ``seed`` and
``offset``::

    key     = (seed & 0xffffffff, seed >> 32)
    t       = (offset + b * nhead_q + h) mod 2^64
    counter = (4 * (j >> 5) + ((j >> 1) & 3), i & ~8, t & 0xffffffff, t >> 32)
    draw    = 8 * ((i >> 3) & 1) + 2 * ((j >> 3) & 3) + (j & 1)

One call serves the 16 elements of rows ``i & ~8`` and ``(i & ~8) + 8`` and keys
``32 s + 8 m + 2 u + e`` (m = 0..3, e = 0, 1) for its first counter word ``4 s + u``: its output
words r0..r3 give the uint8 draws ``u[4 w + k] = (r_w >> 8 k) & 0xff`` (byte k of word w), and the
element uses ``u[draw]``. These are the 16 scores one thread holds of a 16-row, 32-key span of an
mma.sync / wgmma accumulator (rows g and g + 8, columns 8 m + 2 u + e of quad thread u), so the
forward kernels use a call's bits where they are made (bench/NOTES.md step 96; before it a call
served 16 consecutive keys of one row, and the bits were exchanged across the quad). The element is kept iff ``u < threshold`` with
``threshold = floor((1 - p) * 256 + 0.5)`` (an integer in [0, 256]; 256 keeps all), and a kept
element is scaled by ``256 / threshold`` (:func:`keep_scale`: the inverse of the keep probability
actually applied, so the expectation is exact; p is in effect rounded to a multiple of 1/256, and
p <= 1/512 keeps everything; p > 1 - 1/512 keeps nothing, and keep_scale is then 0). FlashAttention-2 also draws 8 bits per element; 16-bit draws (8
columns per call, this project's mask before bench/NOTES.md step 68) cost twice the Philox calls.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._checks import check_int

__all__ = [
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "DROPOUT_ROUNDS",
    "philox4x32",
    "keep_threshold",
    "keep_scale",
    "KEEP_RANGE",
    "KEYS_PER_CALL",
    "SPAN_KEYS",
    "call_index",
    "draw_index",
    "check_uint64",
    "dropout_counter_key",
    "dropout_random",
    "dropout_keep",
    "dropout_random_block",
    "dropout_keep_block",
]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_U64_MAX = (1 << 64) - 1
#: rounds of the dropout generator (kernels/philox.cuh's DROPOUT_PHILOX_ROUNDS)
DROPOUT_ROUNDS = 7
#: draws take values 0 .. KEEP_RANGE - 1 (8 bits); one Philox call serves 2 rows x KEYS_PER_CALL keys of a
#: span of SPAN_KEYS keys (draws per call: 2 * KEYS_PER_CALL = 16; before bench/NOTES.md step 96
#: KEYS_PER_CALL was 16, the consecutive keys of one row a call served)
KEEP_RANGE, KEYS_PER_CALL, SPAN_KEYS = 256, 8, 32


def _words(name: str, x) -> np.ndarray:
    """``x`` as an array of 32-bit words; a value outside [0, 2**32) or a non-integer is an error
    (a cast would wrap or truncate it into another word)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer words in [0, 2**32), got dtype {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
        raise ValueError(f"{name}: words must be in [0, 2**32), got values in [{int(a.min())}, {int(a.max())}]")
    return a


def _index(name: str, x, upper: int | None = None) -> np.ndarray:
    """``x`` (an int or an integer array) as int64, each value >= 0 (and < ``upper``)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got {x!r}" if a.ndim == 0 else
                        f"{name}: expected an integer array, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and int(a.min()) < 0:
        raise ValueError(f"{name}: expected values >= 0, got {int(a.min())}")
    if upper is not None and a.size and int(a.max()) >= upper:
        raise ValueError(f"{name}: expected values below {upper}, got {int(a.max())}")
    return a


def philox4x32(counter, key, rounds: int = DROPOUT_ROUNDS) -> np.ndarray:
    """Philox-4x32-``rounds`` of every counter under its key.

    Args:
        counter: uint32-valued array [..., 4] (words c0..c3).
        key: uint32-valued array [..., 2] (words k0, k1); broadcast against ``counter``'s
            leading dimensions.
        rounds: number of rounds (default :data:`DROPOUT_ROUNDS`, the dropout generator's; 10 for
            Random123's standard Philox-4x32-10).

    Returns:
        uint32 array [..., 4] (leading dimensions broadcast).
    """
    c = _words("counter", counter)
    k = _words("key", key)
    if c.shape[-1:] != (4,) or k.shape[-1:] != (2,):
        raise ValueError(
            f"philox4x32: counter must be [..., 4] and key [..., 2], got {c.shape} and {k.shape}"
        )
    rounds = check_int("rounds", rounds, 0)
    c = c.astype(np.uint32).astype(np.uint64)
    k = k.astype(np.uint32).astype(np.uint64)
    lead = np.broadcast_shapes(c.shape[:-1], k.shape[:-1])
    c0, c1, c2, c3 = (np.broadcast_to(c[..., n], lead) for n in range(4))
    k0, k1 = (np.broadcast_to(k[..., n], lead) for n in range(2))
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    w0, w1 = np.uint64(PHILOX_W0), np.uint64(PHILOX_W1)
    for r in range(rounds):
        if r:
            k0 = (k0 + w0) & _M32
            k1 = (k1 + w1) & _M32
        p0 = m0 * c0  # < 2^64: no wrap-around
        p1 = m1 * c2
        c0, c1, c2, c3 = (p1 >> _S32) ^ c1 ^ k0, p1 & _M32, (p0 >> _S32) ^ c3 ^ k1, p0 & _M32
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def keep_threshold(p: float) -> int:
    """``floor((1 - p) * 256 + 0.5)``: an element is kept iff its uint8 draw is below it."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout_p: expected a number in [0, 1), got {p!r}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p: expected a number in [0, 1), got {p!r}")
    return int(math.floor((1.0 - p) * KEEP_RANGE + 0.5))


def keep_scale(p: float) -> float:
    """The factor of a kept element: ``256 / keep_threshold(p)``, the inverse of the keep
    probability the 8-bit draws apply (1 where nothing is dropped; 0 where everything is, p within
    1/512 of 1, so that no infinity reaches the kernels).

    Raises:
        ValueError: ``p`` outside [0, 1).
    """
    thr = keep_threshold(p)
    return KEEP_RANGE / thr if thr else 0.0


def check_uint64(name: str, x) -> int:
    """``x`` as a Python int, checked to be an integer (not bool) in [0, 2**64)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer in [0, 2**64), got {x!r}")
    x = int(x)
    if not 0 <= x <= _U64_MAX:
        raise ValueError(f"{name}: expected an integer in [0, 2**64), got {x}")
    return x


def _indices(*xs):
    return np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in xs))


def call_index(cols):
    """The first counter word of the Philox call that holds key column ``cols``' draws:
    ``4 * (j >> 5) + ((j >> 1) & 3)`` (bench/NOTES.md step 96).

    Args:
        cols: non-negative integer or integer array of key columns (local to the sequence).

    Returns:
        int64 array of ``cols``' shape.
    """
    j = np.asarray(cols, dtype=np.int64)
    return 4 * (j >> 5) + ((j >> 1) & 3)


def draw_index(rows, cols):
    """Which of its call's 16 uint8 draws element (rows, cols) takes:
    ``8 * ((i >> 3) & 1) + 2 * ((j >> 3) & 3) + (j & 1)`` (byte ``d & 3`` of output word ``d >> 2``).

    Args:
        rows, cols: non-negative integers or integer arrays (query rows and key columns, local to the
            sequence), broadcast together.

    Returns:
        int64 array of values 0..15 with the broadcast shape.
    """
    i, j = _indices(rows, cols)
    return 8 * ((i >> 3) & 1) + 2 * ((j >> 3) & 3) + (j & 1)


def dropout_counter_key(seed, offset, batch_index, nhead_q, head, rows, cols):
    """Philox counters [..., 4] and key [2] for the elements (batch_index, head, rows, cols)
    (integers or integer arrays, broadcast together)."""
    seed, offset = check_uint64("seed", seed), check_uint64("offset", offset)
    nhead_q = check_int("nhead_q", nhead_q, 1)
    b, h, i, j = _indices(_index("batch_index", batch_index), _index("head", head, nhead_q),
                          _index("rows", rows), _index("cols", cols))
    with np.errstate(over="ignore"):
        t = (
            np.uint64(offset)
            + b.astype(np.uint64) * np.uint64(int(nhead_q))
            + h.astype(np.uint64)
        )
    counter = np.stack(
        [call_index(j).astype(np.uint64), (i & ~8).astype(np.uint64), t & _M32, t >> _S32], axis=-1
    ).astype(np.uint32)
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)
    return counter, key


def _select_u8(words: np.ndarray, lane) -> np.ndarray:
    """uint8 draw ``lane`` (0..15) of the 4 words [..., 4]: byte ``lane & 3`` of word ``lane >> 2``."""
    lane = np.asarray(lane)
    w = np.take_along_axis(words, (lane >> 2)[..., None].astype(np.intp), axis=-1)[..., 0]
    return ((w >> ((lane & 3) * 8).astype(np.uint32)) & np.uint32(0xFF)).astype(np.uint8)


def dropout_random(seed, offset, batch_index, nhead_q, head, rows, cols) -> np.ndarray:
    """The uint8 draw of each element (batch_index, head, rows, cols) (broadcast together)."""
    counter, key = dropout_counter_key(seed, offset, batch_index, nhead_q, head, rows, cols)
    words = philox4x32(counter, key, DROPOUT_ROUNDS)
    _, _, i, j = _indices(batch_index, head, rows, cols)
    return _select_u8(words, draw_index(i, j))


def dropout_keep(seed, offset, batch_index, nhead_q, head, rows, cols, p) -> np.ndarray:
    """Boolean keep mask of the elements (batch_index, head, rows, cols) (integers or integer
    arrays, broadcast together) for dropout probability ``p``."""
    return dropout_random(seed, offset, batch_index, nhead_q, head, rows, cols).astype(np.int32) < keep_threshold(p)


def dropout_random_block(seed, offset, batch_index, nhead_q, seqlen_q, seqlen_k, heads=None):
    """uint8 draws [len(heads), seqlen_q, seqlen_k] of one batch entry (one Philox call per row pair
    and call; same values as :func:`dropout_random`). ``heads`` defaults to all query heads."""
    nhead_q = check_int("nhead_q", nhead_q, 1)
    heads = np.arange(nhead_q) if heads is None else _index("heads", heads, nhead_q)
    if heads.ndim != 1:
        raise ValueError(f"heads: expected a 1-D list of head indices, got shape {heads.shape}")
    seqlen_q, seqlen_k = check_int("seqlen_q", seqlen_q, 0), check_int("seqlen_k", seqlen_k, 0)
    na = -(-int(seqlen_q) // 16)  # 16-row tiles
    ns = -(-int(seqlen_k) // SPAN_KEYS)  # 32-key spans
    h = heads[:, None, None, None, None]
    a = np.arange(na)[None, :, None, None, None]
    g = np.arange(8)[None, None, :, None, None]
    s = np.arange(ns)[None, None, None, :, None]
    u = np.arange(4)[None, None, None, None, :]
    # the call of row pair 16 a + g and first counter word 4 s + u is that of row 16 a + g, key 32 s + 2 u
    counter, key = dropout_counter_key(seed, offset, batch_index, nhead_q, h, 16 * a + g, SPAN_KEYS * s + 2 * u)
    words = philox4x32(counter, key, DROPOUT_ROUNDS)  # [H, a, g, s, u, 4]
    d = np.stack([(words >> np.uint32(8 * k)) & np.uint32(0xFF) for k in range(4)], axis=-1)  # [..., w, k]
    # draw 4 w + k = 8 r + 2 m + e: row 16 a + 8 r + g, key 32 s + 8 m + 2 u + e
    d = d.reshape(*words.shape[:-1], 2, 4, 2)  # [H, a, g, s, u, r, m, e]
    d = d.transpose(0, 1, 5, 2, 3, 6, 4, 7)  # [H, a, r, g, s, m, u, e]
    return d.reshape(len(heads), 16 * na, SPAN_KEYS * ns)[:, : int(seqlen_q), : int(seqlen_k)].astype(np.uint8)


def dropout_keep_block(seed, offset, batch_index, nhead_q, seqlen_q, seqlen_k, p, heads=None):
    """Boolean keep mask [len(heads), seqlen_q, seqlen_k] of one batch entry (see
    :func:`dropout_random_block`)."""
    thr = keep_threshold(p)
    return dropout_random_block(seed, offset, batch_index, nhead_q, seqlen_q, seqlen_k, heads).astype(np.int32) < thr
