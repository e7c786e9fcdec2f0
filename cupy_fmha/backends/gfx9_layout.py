"""Fragment layouts of the AMD gfx9 (CDNA, wave64) matrix instructions the ROCm backend uses, as
one table, and a NumPy model of the instructions built from it.

Each MFMA instruction multiplies an M x K matrix A by a K x N matrix B into an M x N float32
accumulator D (D = A B + C) across the 64 lanes of a wavefront; every lane holds ``KPL``
consecutive K elements of one row of A, the same K elements of one column of B, and ``ACC``
accumulator elements of one column of D. Lane ``l`` splits as ``col = l % N`` (the row of A /
the column of B and D) and ``grp = l // N`` (one of 64 / N lane groups); then

    A[l % M][KPL * grp + i]        for i < KPL
    B[KPL * grp + i][l % N]        for i < KPL
    D[ROWS_PER_BLOCK * (r // 4) + 4 * grp + r % 4][l % N]   for r < ACC   (32x32 shapes)
    D[4 * grp + r][l % N]                                    for r < ACC   (16x16 shapes)

The 32x32 accumulator holds, per lane, 4 blocks of 4 consecutive rows, blocks 8 rows apart
(ROWS_PER_BLOCK = 8), lane groups 4 rows apart inside a block; the 16x16 one 4 consecutive rows
per lane. Source: AMD's CDNA instruction set architecture guides and the layouts the AMD matrix
instruction calculator prints for these instructions (facts; written here from them). The
gfx950 double-rate shapes (K 16 and 32) are listed with the same rule (8 consecutive K elements
per lane): **not yet checked against AMD's calculator or a GPU**; no AMD GPU is available to this
project.

gfx950's transposed LDS read ``ds_read_b64_tr_b16`` (:data:`TR16`, :func:`tr16_model`) gives each
lane 4 16-bit elements of one column of a 4 x 16 block that its group of 16 lanes reads, one 8-byte
address per lane: lane ``l`` (``j = l % 16``) addresses row ``j // 4``, columns ``4 (j % 4)`` ..
``+ 3`` of its group's block, and receives column ``j``, rows 0..3, in its elements 0..3. Source:
two public users of the instruction that agree on this addressing and result (Modular's MAX
kernels and a ROCm convolution library's lane map for it; facts, written here from them), **not
AMD's ISA guide text, and not run**.

``tools/gen_arch_gfx9.py`` writes ``kernels/arch/gfx9/layout.cuh`` from :data:`LAYOUTS`, and
``tests/test_gfx9_layout.py`` checks the header against the table and the model against ``A @ B``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Mfma", "LAYOUTS", "WAVE", "a_coords", "b_coords", "d_coords", "scatter_a", "scatter_b",
           "mfma_model", "gather_d", "TrRead", "TR16", "tr16_address", "tr16_source", "tr16_model"]

WAVE = 64


@dataclass(frozen=True)
class Mfma:
    """One MFMA shape: ``name`` (the C++ suffix), M x N x K, K elements per lane, accumulator
    elements per lane, the targets that have it, and the compiler builtins for fp16 and bf16."""

    name: str
    m: int
    n: int
    k: int
    targets: tuple[str, ...]
    builtin_f16: str
    builtin_bf16: str

    @property
    def kpl(self) -> int:  # K elements per lane
        return self.k * self.m // WAVE

    @property
    def acc(self) -> int:  # accumulator elements per lane
        return self.m * self.n // WAVE

    @property
    def groups(self) -> int:  # lane groups (64 / N)
        return WAVE // self.n


LAYOUTS = (
    Mfma("32x32x8", 32, 32, 8, ("gfx90a", "gfx942", "gfx950"),
         "__builtin_amdgcn_mfma_f32_32x32x8f16", "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k"),
    Mfma("16x16x16", 16, 16, 16, ("gfx90a", "gfx942", "gfx950"),
         "__builtin_amdgcn_mfma_f32_16x16x16f16", "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k"),
    Mfma("32x32x16", 32, 32, 16, ("gfx950",),
         "__builtin_amdgcn_mfma_f32_32x32x16_f16", "__builtin_amdgcn_mfma_f32_32x32x16_bf16"),
    Mfma("16x16x32", 16, 16, 32, ("gfx950",),
         "__builtin_amdgcn_mfma_f32_16x16x32_f16", "__builtin_amdgcn_mfma_f32_16x16x32_bf16"),
)


def a_coords(s: Mfma, lane: int, i: int) -> tuple[int, int]:
    """(row, k) of A held by ``lane`` in its element ``i``."""
    return lane % s.m, s.kpl * (lane // s.n) + i


def b_coords(s: Mfma, lane: int, i: int) -> tuple[int, int]:
    """(k, col) of B held by ``lane`` in its element ``i``."""
    return s.kpl * (lane // s.n) + i, lane % s.n


def d_coords(s: Mfma, lane: int, r: int) -> tuple[int, int]:
    """(row, col) of the accumulator held by ``lane`` in its element ``r``."""
    grp = lane // s.n
    if s.m == 32:
        return 8 * (r // 4) + 4 * grp + r % 4, lane % s.n
    return 4 * grp + r, lane % s.n


def scatter_a(s: Mfma, a: np.ndarray) -> np.ndarray:
    """A [M, K] as the wavefront's registers [64, KPL]."""
    return np.array([[a[a_coords(s, l, i)] for i in range(s.kpl)] for l in range(WAVE)], dtype=a.dtype)


def scatter_b(s: Mfma, b: np.ndarray) -> np.ndarray:
    """B [K, N] as the wavefront's registers [64, KPL]."""
    return np.array([[b[b_coords(s, l, i)] for i in range(s.kpl)] for l in range(WAVE)], dtype=b.dtype)


def mfma_model(s: Mfma, ra: np.ndarray, rb: np.ndarray, rc: np.ndarray) -> np.ndarray:
    """The instruction, lane by lane: each lane's accumulator element (row, col) becomes
    C + sum over k of A[row, k] B[k, col], where A[row, k] is read from the lane and register
    that hold it (its ``a_coords``) and B[k, col] likewise. Registers [64, KPL], [64, KPL],
    [64, ACC] in, [64, ACC] float32 out."""
    where_a = {a_coords(s, l, i): (l, i) for l in range(WAVE) for i in range(s.kpl)}
    where_b = {b_coords(s, l, i): (l, i) for l in range(WAVE) for i in range(s.kpl)}
    out = np.array(rc, dtype=np.float32, copy=True)
    for l in range(WAVE):
        for r in range(s.acc):
            row, col = d_coords(s, l, r)
            acc = np.float32(out[l, r])
            for k in range(s.k):
                acc += np.float32(ra[where_a[(row, k)]]) * np.float32(rb[where_b[(k, col)]])
            out[l, r] = acc
    return out


def gather_d(s: Mfma, rd: np.ndarray) -> np.ndarray:
    """The wavefront's accumulator registers [64, ACC] as D [M, N]."""
    d = np.zeros((s.m, s.n), dtype=rd.dtype)
    for l in range(WAVE):
        for r in range(s.acc):
            d[d_coords(s, l, r)] = rd[l, r]
    return d


@dataclass(frozen=True)
class TrRead:
    """A transposed LDS read: ``name`` (the instruction), the targets that have it, the builtins."""

    name: str
    targets: tuple[str, ...]
    builtins: tuple[str, ...]


TR16 = TrRead("ds_read_b64_tr_b16", ("gfx950",),
              ("__builtin_amdgcn_ds_read_tr16_b64_v4i16", "__builtin_amdgcn_ds_read_tr16_b64_v4f16",
               "__builtin_amdgcn_ds_read_tr16_b64_v4bf16"))


def tr16_address(lane: int) -> tuple[int, int]:
    """(row, first column) of its group's 4 x 16 block that ``lane``'s 8-byte address points at."""
    j = lane % 16
    return j // 4, 4 * (j % 4)


def tr16_source(lane: int, r: int) -> tuple[int, int]:
    """(lane, element) of the 8-byte values the group's lanes read that lands in element ``r`` of
    ``lane``'s result: row r, column lane % 16 of the block."""
    j = lane % 16
    return 16 * (lane // 16) + 4 * r + j // 4, j % 4


def tr16_model(loaded: np.ndarray) -> np.ndarray:
    """The instruction, lane by lane: registers [64, 4] (each lane's 4 elements at its address)
    in, the transposed registers [64, 4] out."""
    return np.array([[loaded[tr16_source(l, r)] for r in range(4)] for l in range(WAVE)], dtype=loaded.dtype)
