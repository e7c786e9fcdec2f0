"""Memory footprints of an attention problem, computed from its sizes alone.

Pure functions (no arrays are made, no GPU is touched) so that a caller can refuse a problem
before it allocates anything:

* :func:`reference_host_bytes`: an upper bound (within about 2x) of the host memory one call of
  :func:`cupy_fmha.reference.attention_forward` / ``attention_backward`` allocates at its peak,
  not counting the input arrays it is given. The reference works on one batch entry (or one
  sequence, in group mode) at a time with all query heads at once, so its peak is a few
  ``[nhead_q, seqlen_q, seqlen_k]`` arrays in the working dtype (float32 for
  ``precision="low"``, float64 otherwise) on top of float64 outputs of the whole problem.
* :func:`input_bytes`, :func:`output_bytes`: the problem's tensors in a given element size.
* :func:`device_bytes`: the GPU arrays of one forward or backward call (inputs and outputs;
  workspaces are the caller's ``workspace_bytes``).

Sizes are Python ints throughout, so absurd sizes give absurd byte counts, never an overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ._checks import check_int

__all__ = [
    "Sizes",
    "reference_host_bytes",
    "input_bytes",
    "output_bytes",
    "device_bytes",
    "format_bytes",
]

_MODES = ("fwd", "bwd")


def _size(name: str, value) -> int:
    return check_int(name, value, 0)


@dataclass(frozen=True)
class Sizes:
    """The sizes of one attention problem.

    Batch mode: ``batch`` entries of ``seqlen_q`` queries and ``seqlen_k`` keys. Group mode
    (variable lengths, layout ``thd``): ``seqlens_q`` / ``seqlens_k`` hold one length per
    sequence; ``batch`` is their number and ``seqlen_q`` / ``seqlen_k`` the longest (use
    :meth:`group`).
    """

    batch: int
    nhead_q: int
    nhead_k: int
    seqlen_q: int
    seqlen_k: int
    hdim_q: int
    hdim_v: int
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None

    def __post_init__(self):
        """Sizes are non-negative ints (NumPy ints become Python ints): a negative one would give
        a negative estimate, which passes any memory limit.

        Raises:
            TypeError, ValueError: naming the field."""
        for name in ("batch", "nhead_q", "nhead_k", "seqlen_q", "seqlen_k", "hdim_q", "hdim_v"):
            object.__setattr__(self, name, _size(name, getattr(self, name)))
        for name in ("seqlens_q", "seqlens_k"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, tuple(_size(f"{name}[{i}]", n) for i, n in enumerate(v)))

    @classmethod
    def group(cls, seqlens_q, seqlens_k, nhead_q: int, nhead_k: int, hdim_q: int,
              hdim_v: int) -> "Sizes":
        lq = tuple(_size(f"seqlens_q[{i}]", n) for i, n in enumerate(seqlens_q))
        lk = tuple(_size(f"seqlens_k[{i}]", n) for i, n in enumerate(seqlens_k))
        if len(lq) != len(lk) or not lq:
            raise ValueError("seqlens_k: expected as many lengths as seqlens_q (at least one)")
        return cls(len(lq), nhead_q, nhead_k, max(lq), max(lk), hdim_q, hdim_v, lq, lk)

    @property
    def varlen(self) -> bool:
        return self.seqlens_q is not None

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """(seqlen_q, seqlen_k) of each batch entry / sequence."""
        if self.varlen:
            return list(zip(self.seqlens_q, self.seqlens_k))
        return [(self.seqlen_q, self.seqlen_k)] * min(self.batch, 1)

    @property
    def rows_q(self) -> int:
        """Query rows of the whole problem (batch * seqlen_q, or the packed total)."""
        return sum(self.seqlens_q) if self.varlen else self.batch * self.seqlen_q

    @property
    def rows_k(self) -> int:
        return sum(self.seqlens_k) if self.varlen else self.batch * self.seqlen_k

    # element counts of the tensors
    @property
    def q(self) -> int:
        return self.rows_q * self.nhead_q * self.hdim_q

    @property
    def k(self) -> int:
        return self.rows_k * self.nhead_k * self.hdim_q

    @property
    def v(self) -> int:
        return self.rows_k * self.nhead_k * self.hdim_v

    @property
    def o(self) -> int:
        """o, do (and dq's rows with hdim_v): [rows_q, nhead_q, hdim_v]."""
        return self.rows_q * self.nhead_q * self.hdim_v

    @property
    def lse(self) -> int:
        """lse (and D): [batch, nhead_q, seqlen_q] (group mode: the longest length)."""
        return self.batch * self.nhead_q * self.seqlen_q


def _check_mode(mode: str) -> str:
    if mode not in _MODES:
        raise ValueError(f"mode: expected 'fwd' or 'bwd', got {mode!r}")
    return mode


def input_bytes(s: Sizes, mode: str, itemsize: int = 2, *, bias_shape=None,
                bias_itemsize: int | None = None) -> int:
    """q, k, v (and do for ``"bwd"``) in ``itemsize`` bytes, plus an elementwise bias of
    ``bias_shape`` (``bias_itemsize``, default ``itemsize``)."""
    n = s.q + s.k + s.v + (s.o if _check_mode(mode) == "bwd" else 0)
    total = n * itemsize
    if bias_shape is not None:
        total += prod(bias_shape) * (itemsize if bias_itemsize is None else bias_itemsize)
    return total


def output_bytes(s: Sizes, mode: str, itemsize: int = 8, *, bias_shape=None,
                 return_dbias: bool = False, lse_itemsize: int | None = None) -> int:
    """Outputs in ``itemsize`` bytes: o and lse (``"fwd"``; lse in ``lse_itemsize``, default
    ``itemsize``), or dq, dk, dv and, with ``return_dbias``, dbias of ``bias_shape``."""
    if _check_mode(mode) == "fwd":
        return s.o * itemsize + s.lse * (itemsize if lse_itemsize is None else lse_itemsize)
    n = s.q + s.k + s.v
    if return_dbias and bias_shape is not None:
        n += prod(bias_shape)
    return n * itemsize


def reference_host_bytes(
    s: Sizes,
    mode: str,
    *,
    precision: str = "float64",
    itemsize: int = 2,
    bias_shape=None,
    alibi: bool = False,
    dropout: bool = False,
    return_dropout_mask: bool = False,
    return_dbias: bool = False,
) -> int:
    """Upper bound of the host bytes one reference call allocates at its peak (inputs not
    counted; within about 2x of the real peak, checked by ``tests/test_footprint.py``).

    The model follows :mod:`cupy_fmha.reference`: the inputs converted to the working dtype
    (and one transposed copy while converting), the float64 outputs (and their final copy into
    the caller's layout), the bias in the working dtype, the dense mask, and per batch entry /
    sequence a few ``[nhead_q, seqlen_q, seqlen_k]`` working arrays (S, exp(S), P, the
    rounding temporaries of ``precision="low"``; dP and dS in the backward; the keep mask,
    its multiplier and P * Z with dropout; the ALiBi term).

    Args:
        s: the problem's sizes.
        mode: ``"fwd"`` or ``"bwd"``.
        precision: ``"float64"`` or ``"low"`` (as the reference's argument).
        itemsize: bytes per input element (2 for fp16 / bf16).
        bias_shape: shape of an elementwise bias, or ``None``.
        alibi: ALiBi slopes are given.
        dropout: ``dropout_p > 0``.
        return_dropout_mask: the forward returns its keep masks (bool, the whole problem).
        return_dbias: the backward returns dbias.
    """
    _check_mode(mode)
    if precision not in ("float64", "low"):
        raise ValueError(f"precision: expected 'float64' or 'low', got {precision!r}")
    w = 8 if precision == "float64" else 4
    if precision == "float64":
        rt = 0  # no rounding: no temporaries
    elif itemsize < 4:
        rt = itemsize + w  # x.astype(fp16 / bf16).astype(float32)
    else:
        rt = w  # x.astype(float32)
    hq, d, dv = s.nhead_q, s.hdim_q, s.hdim_v
    nb = prod(bias_shape) if bias_shape is not None else 0

    # alive for the whole call
    n_in = s.q + s.k + s.v + (s.o if mode == "bwd" else 0)
    persistent = w * n_in + w * nb
    if mode == "fwd":
        out = 8 * (s.o + s.lse)
        if return_dropout_mask:
            persistent += sum(hq * a * b for a, b in s.pairs) * (1 if s.varlen else s.batch)
    else:
        out = 8 * (s.q + s.k + s.v)
        if return_dbias:
            persistent += w * nb
    persistent += out
    if not s.varlen:
        persistent += s.seqlen_q * s.seqlen_k  # the one dense mask (bool)

    # while converting the inputs: one transposed working copy, the mask's comparisons
    setup = w * max(s.q, s.k, s.v, s.o if mode == "bwd" else 0) + 3 * s.seqlen_q * s.seqlen_k

    # per batch entry / sequence: the score-sized working set and the per-head GEMM results
    per_score = 3 * w + rt  # S, exp(S), P and a rounding temporary (dP, dS in the backward)
    if dropout:
        per_score += 1 + 2 * w  # keep, its multiplier Z, P * Z
    elif mode == "fwd" and return_dropout_mask:
        per_score += 1  # the keep block, drawn to be returned
    if dropout or (mode == "fwd" and return_dropout_mask):
        # the Philox draw took about 20 bytes per element with 16-bit draws (about 10 with the 8-bit
        # ones since bench/NOTES.md step 68; the bound is kept), while the backward still holds the
        # previous entry's P, P * Z, dP, dS and Z
        per_score = max(per_score, (5 * w if mode == "bwd" else 1) + 21)
    if alibi:
        per_score += w  # the ALiBi term
    if mode == "bwd" and return_dbias:
        per_score += w  # dS summed over the bias's broadcast dimensions
    loop = 0
    for sq, sk in s.pairs:
        a = hq * sq * sk
        # kx, vx (GQA), q/do/k/v slices, the per-head GEMM results (dK, dV per query head)
        lin = w * (2 if mode == "fwd" else 4) * hq * (sq + sk) * (d + dv)
        mask = (4 if s.varlen else 0) * sq * sk + (w * sq * sk if alibi else 0)
        loop = max(loop, a * per_score + lin + mask)

    # at the end, with the last batch entry's working set still referenced: the outputs copied
    # into the caller's layout, dbias rounded and made float64
    end = out + ((rt + 8) * nb if mode == "bwd" and return_dbias else 0)
    return persistent + max(setup, loop + end)


def device_bytes(
    s: Sizes,
    mode: str,
    itemsize: int = 2,
    *,
    bias_shape=None,
    bias_itemsize: int | None = None,
    alibi_shape=None,
    return_dbias: bool = False,
    workspace_bytes: int = 0,
) -> int:
    """GPU bytes of the arrays one call touches: inputs and outputs, plus ``workspace_bytes``.

    ``"fwd"``: q, k, v (bias, ALiBi slopes, cu_seqlens) in, o and lse (float32) out.
    ``"bwd"``: q, k, v, o, do, lse (bias, slopes, cu_seqlens) in, D (float32, like lse), dq,
    dk, dv (and dbias in the bias's shape, float32) out. Workspaces the kernels need besides
    (the float32 dQ accumulator, GQA's per-query-head dK/dV, deterministic slabs) are not
    modelled here: pass them as ``workspace_bytes``.
    """
    _check_mode(mode)
    total = (s.q + s.k + s.v + s.o) * itemsize + 4 * s.lse
    if bias_shape is not None:
        total += prod(bias_shape) * (itemsize if bias_itemsize is None else bias_itemsize)
    if alibi_shape is not None:
        total += 4 * prod(alibi_shape)
    if s.varlen:
        total += 2 * 4 * (s.batch + 1)
    if mode == "bwd":
        total += (s.o + s.q + s.k + s.v) * itemsize + 4 * s.lse  # do; dq, dk, dv; D
        if return_dbias and bias_shape is not None:
            total += 4 * prod(bias_shape)
    return total + int(workspace_bytes)


def format_bytes(n: int) -> str:
    """``n`` bytes in GiB with one decimal (MiB below 1 GiB), e.g. ``'16.0 GiB'``."""
    if n < 2**30:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**30:.1f} GiB"
