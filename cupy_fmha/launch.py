"""Launch maths: grid, block and dynamic shared-memory sizes for every kernel, and workspaces.

Pure Python (no CuPy), so CI checks it without a GPU.
"""

from __future__ import annotations

from .spec import KernelSpec

__all__ = ["smem_pitch", "fwd_launch", "dq_dk_dv_launch", "dot_do_o_launch", "convert_launch", "Launch",
           "WINDOW_INF", "kernel_window", "keep_bits_bytes", "dropout_mask_launch"]

#: A window edge wider than any sequence ("unlimited"); small enough that q0 + x fits in int32.
WINDOW_INF = 1 << 30

SMEM_LIMIT = 227 * 1024  # bytes of dynamic shared memory one block may use on sm_90 / sm_80


def smem_pitch(d: int) -> int:
    """Row pitch in elements of a shared-memory tile (mirrors ``smem_pitch`` in common.cuh)."""
    return d + 8


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Launch(tuple):
    """(grid, block, shared_mem_bytes)."""

    def __new__(cls, grid, block, smem):
        return super().__new__(cls, (tuple(grid), tuple(block), int(smem)))

    grid = property(lambda s: s[0])
    block = property(lambda s: s[1])
    smem = property(lambda s: s[2])


def kernel_window(window) -> tuple[int, int]:
    """(y, x) for the kernels: a resolved ``Window`` clamped to +-WINDOW_INF, or unlimited."""
    if window is None:
        return WINDOW_INF, WINDOW_INF
    clamp = lambda v: max(-WINDOW_INF, min(WINDOW_INF, int(v)))  # noqa: E731
    return clamp(window.y), clamp(window.x)


def fwd_launch(spec: KernelSpec, batch: int, nhead_q: int, seqlen_q: int) -> Launch:
    bn, dq, dv = spec.macro("BLOCK_N"), spec.macro("HDIM_Q"), spec.macro("HDIM_V")
    if spec.target == "sm90a":  # fmha_fwd_sm90: NWG warpgroups of 64 rows, blocked tiles
        nwg = spec.macro("NWG")
        bm = 64 * nwg
        smem = 2 * (bm * dq + 2 * bn * dq + 2 * bn * dv)
        return Launch((cdiv(seqlen_q, bm), nhead_q, batch), (128 * nwg, 1, 1), smem)
    nw = spec.macro("NWARPS")
    bm = 16 * nw
    pq, pv = smem_pitch(dq), smem_pitch(dv)
    smem = 2 * (bm * max(pq, pv) + 2 * bn * pq + 2 * bn * pv)
    return Launch((cdiv(seqlen_q, bm), nhead_q, batch), (32 * nw, 1, 1), smem)


def dq_dk_dv_launch(spec: KernelSpec, batch: int, nhead_q: int, seqlen_k: int) -> Launch:
    dq, dv = spec.macro("HDIM_Q"), spec.macro("HDIM_V")
    if spec.target == "sm90a":  # fmha_bwd_dq_dk_dv_sm90: 2 warpgroups, 128 keys, 64 query rows
        bn, bm = 128, 64
        smem = 2 * (bn * dq + bn * dv + 2 * bm * dq + 2 * bm * dv + bn * bm) + 4 * 4 * bm
        smem += keep_bits_bytes(spec, bm, bn)
        return Launch((cdiv(seqlen_k, bn), nhead_q, batch), (256, 1, 1), smem)
    nw, bm, ns = spec.macro("NWARPS"), spec.macro("BLOCK_M"), spec.macro("NSPLIT")
    bn = 16 * nw
    pq, pv, ps = smem_pitch(dq), smem_pitch(dv), smem_pitch(bm)
    smem = 2 * (bn * pq + bn * pv + 2 * bm * pq + 2 * bm * pv + bn * ps) + 4 * 4 * bm
    smem += keep_bits_bytes(spec, bm, bn)
    return Launch((cdiv(seqlen_k, bn) * ns, nhead_q, batch), (32 * nw, 1, 1), smem)


def keep_bits_bytes(spec: KernelSpec, block_m: int, block_n: int) -> int:
    """Shared memory of the dq_dk_dv kernels' dropout keep bits: two [block_n / 8][block_m] byte
    tiles (the current Q block's and the next one's); 0 without ``DROPOUT``."""
    return 2 * (block_n // 8) * block_m if spec.macro("DROPOUT", 0) else 0


#: threads per block of the keep-mask kernel (NTHREADS in fmha_dropout_mask.cu)
DROPOUT_MASK_THREADS = 256


def dropout_mask_launch(batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int) -> Launch:
    """fmha_dropout_mask: one thread per (query row, 8 keys)."""
    calls = seqlen_q * cdiv(seqlen_k, 8)
    return Launch((max(1, cdiv(calls, DROPOUT_MASK_THREADS)), nhead_q, batch), (DROPOUT_MASK_THREADS, 1, 1), 0)


def dot_do_o_launch(spec: KernelSpec, batch: int, nhead_q: int, seqlen_q: int) -> Launch:
    rows = spec.macro("ROWS")
    return Launch((cdiv(seqlen_q, rows), nhead_q, batch), (32 * rows, 1, 1), 0)


def convert_launch(spec: KernelSpec, batch: int, nhead_out: int, seqlen: int) -> Launch:
    rows = spec.macro("ROWS")
    return Launch((cdiv(seqlen, rows), nhead_out, batch), (256, 1, 1), 0)
