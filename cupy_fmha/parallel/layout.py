"""How a sequence is split across the ranks of a ring (pure Python/NumPy, no GPU).

The global sequence of ``seqlen`` tokens is cut into equal chunks; each rank holds some of them,
concatenated in increasing order along its shard's sequence axis:

* ``"zigzag"`` (the default): ``2 * world`` chunks of ``seqlen / (2 * world)`` tokens; rank
  ``r`` holds chunks ``r`` and ``2 * world - 1 - r`` (one early, one late). Under a causal mask
  every rank then does the same work at every step of the ring: the early chunk sees fewer
  keys, the late one more. This balancing is the one published context-parallel designs use for
  causal ring attention (e.g. the "zigzag" ring of open-source ring-attention implementations
  and the load-balanced context parallelism of Megatron-LM / Llama 3 training); the code here is
  our own.
* ``"contiguous"``: ``world`` chunks; rank ``r`` holds chunk ``r``. Natural for masks without a
  causal structure; under a causal mask the last rank does all but ``1 / world`` of the work of
  its step while the first waits.

Users shard their tokens with :func:`shard` (and put results back with :func:`unshard`);
positional encodings must use the tokens' global positions (:func:`shard_positions`).
"""

from __future__ import annotations

import numpy as np

from .._checks import check_int

__all__ = ["SCHEMES", "check_scheme", "chunks_per_rank", "num_chunks", "rank_chunks", "chunk_len",
           "shard_positions", "shard", "unshard"]

SCHEMES = ("zigzag", "contiguous")


def check_scheme(scheme) -> str:
    """``scheme`` if it is one of :data:`SCHEMES`; ValueError naming ``scheme`` otherwise."""
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {', '.join(map(repr, SCHEMES))}, got {scheme!r}")
    return scheme


def check_world(world, rank=None) -> int:
    """``world`` as an int >= 1 (and ``0 <= rank < world`` when given), else ValueError/TypeError
    naming the argument."""
    world = check_int("world_size", world, 1)
    if rank is not None:
        if not 0 <= check_int("rank", rank) < world:
            raise ValueError(f"rank: expected 0 <= rank < world_size = {world}, got {rank}")
    return world


def chunks_per_rank(scheme: str) -> int:
    """2 for ``"zigzag"``, 1 for ``"contiguous"``."""
    return 2 if check_scheme(scheme) == "zigzag" else 1


def num_chunks(world: int, scheme: str = "zigzag") -> int:
    """Chunks the global sequence is cut into."""
    return check_world(world) * chunks_per_rank(scheme)


def rank_chunks(rank: int, world: int, scheme: str = "zigzag") -> tuple[int, ...]:
    """Global indices of the chunks rank ``rank`` holds, in the order they sit in its shard."""
    check_world(world, rank)
    if check_scheme(scheme) == "zigzag":
        return (int(rank), 2 * int(world) - 1 - int(rank))
    return (int(rank),)


def chunk_len(seqlen: int, world: int, scheme: str = "zigzag", name: str = "seqlen") -> int:
    """Tokens per chunk; ValueError naming ``name`` when ``seqlen`` does not split evenly."""
    n = num_chunks(world, scheme)
    seqlen = check_int(name, seqlen, what="an int sequence length")
    if seqlen <= 0 or seqlen % n:
        raise ValueError(f"{name}: the sequence length {seqlen} must be a positive multiple of {n} "
                         f"({scheme} scheme over {world} ranks: {n} equal chunks); pad the sequence")
    return seqlen // n


def shard_positions(rank: int, world: int, seqlen: int, scheme: str = "zigzag") -> np.ndarray:
    """int64 global token positions held by ``rank``, in its shard's order (for positional
    encodings such as RoPE, which must see global positions)."""
    c = chunk_len(seqlen, world, scheme)
    return np.concatenate([np.arange(j * c, (j + 1) * c, dtype=np.int64)
                           for j in rank_chunks(rank, world, scheme)])


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _check_axis(axis, x, name: str) -> int:
    """``axis`` of the array ``x`` (named ``name``) as a non-negative int; negative counts from the
    end as in NumPy, but one outside [-ndim, ndim) is an error, not wrapped.

    Raises:
        TypeError: ``x`` is not an array, ``axis`` not an int; ValueError: ``axis`` out of range."""
    if not all(hasattr(x, a) for a in ("shape", "ndim")):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(x).__name__}")
    axis = check_int("axis", axis)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis: {axis} is out of range for {name} of rank {x.ndim} (shape {tuple(x.shape)})")
    return axis % x.ndim


def _take(x, start: int, stop: int, axis: int):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, stop)
    return x[tuple(idx)]


def shard(x, rank: int, world: int, *, scheme: str = "zigzag", axis: int = 1):
    """The part of the global array ``x`` that rank ``rank`` holds: its chunks along ``axis``
    (the sequence axis: 1 for ``bshd``, 2 for ``bhsd``, 2 for an lse or a dlse [batch, heads, seqlen]),
    concatenated in order. NumPy or CuPy in, the same out (a new contiguous array).

    Raises:
        ValueError: the length along ``axis`` does not split into equal chunks; bad
            ``rank``/``world``/``scheme``; ``axis`` out of range.
        TypeError: ``x`` not an array, ``axis`` not an int.
    """
    axis = _check_axis(axis, x, "x")
    c = chunk_len(x.shape[axis], world, scheme, name="x")
    parts = [_take(x, j * c, (j + 1) * c, axis) for j in rank_chunks(rank, world, scheme)]
    return _xp(x).ascontiguousarray(_xp(x).concatenate(parts, axis=axis))


def unshard(shards, *, scheme: str = "zigzag", axis: int = 1):
    """Inverse of :func:`shard`: the global array from the list of every rank's shard (rank
    order). NumPy or CuPy (all the same kind).

    Raises:
        ValueError: an empty list, shards of different shapes, a shard length that does not
            split into the scheme's chunks, ``axis`` out of range. TypeError: ``shards`` an
            array rather than a list of them (it would be split along its first axis), or not
            iterable; a shard that is not an array, or of another dtype or array library than
            rank 0's; ``axis`` not an int.
    """
    if hasattr(shards, "shape") or isinstance(shards, (str, bytes)) or not hasattr(shards, "__iter__"):
        raise TypeError(f"shards: expected a list with one array per rank, got {type(shards).__name__}"
                        + (" (one array; pass [shard_0, shard_1, ...])" if hasattr(shards, "shape") else ""))
    shards = list(shards)
    if not shards:
        raise ValueError("shards: expected one array per rank, got none")
    world = len(shards)
    first = shards[0]
    axis = _check_axis(axis, first, "shards[0]")
    for r, s in enumerate(shards):
        _check_axis(axis, s, f"shards[{r}]")
        if tuple(s.shape) != tuple(first.shape):
            raise ValueError(f"shards: rank {r}'s shape {tuple(s.shape)} differs from rank 0's {tuple(first.shape)}")
        if s.dtype != first.dtype or _xp(s) is not _xp(first):
            raise TypeError(f"shards: rank {r}'s array ({type(s).__module__}, {s.dtype}) is not of rank 0's kind "
                            f"({type(first).__module__}, {first.dtype})")
    per = chunks_per_rank(scheme)
    if first.shape[axis] % per:
        raise ValueError(f"shards: length {first.shape[axis]} along axis {axis} does not hold {per} equal chunks")
    c = first.shape[axis] // per
    pieces = [None] * (world * per)
    for r, s in enumerate(shards):
        for slot, j in enumerate(rank_chunks(r, world, scheme)):
            pieces[j] = _take(s, slot * c, (slot + 1) * c, axis)
    return _xp(first).concatenate(pieces, axis=axis)
