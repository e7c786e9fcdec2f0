"""Launch maths: grid, block and dynamic shared-memory sizes for every kernel, and workspaces.

Pure Python (no CuPy), so CI checks it without a GPU.

Group mode (varlen): the same launch functions take ``max_seqlen_q`` / ``max_seqlen_k`` for the
sequence lengths (grid x covers the longest sequence; blocks past a shorter sequence's end exit
at once), and the window travels in top-left form plus a bottom-right flag
(:func:`kernel_window_spec`).
"""

from __future__ import annotations

from .backends.cuda import SMEM_LIMIT, fwd_ws_persist, smem_pitch  # noqa: F401 - re-exported (tests, bench read L.SMEM_LIMIT)
from .spec import KernelSpec, dropout_mask_spec

__all__ = ["smem_pitch", "fwd_launch", "dq_dk_dv_launch", "dq_dk_dv_key_blocks",
           "dot_do_o_launch", "convert_launch", "Launch",
           "WINDOW_INF", "kernel_window", "dq_dk_dv_blocks", "query_block_range", "first_key_block", "DqWorkspace", "dq_workspace",
           "kernel_window_spec", "sequence_window", "empty_grid", "dropout_mask_launch", "tma_boxes"]

#: A window edge wider than any sequence ("unlimited"); small enough that q0 + x fits in int32.
WINDOW_INF = 1 << 30

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


def kernel_window_spec(spec) -> tuple[int, int, int]:
    """(y, x, bottom_right) kernel arguments for a length-independent ``MaskSpec`` (group mode).

    The window is given in top-left form: ``y = 1 + left``, ``x = 1 + right`` (WINDOW_INF for an
    unlimited side); with ``bottom_right = 1`` each kernel shifts it by its sequence's own lengths
    (:func:`sequence_window`, ``window_for_sequence`` in ``kernels/varlen.cuh``). No mask is
    (WINDOW_INF, WINDOW_INF, 0); a generic ``g:y,x`` window is passed as is (clamped).
    """
    clamp = lambda v: max(-WINDOW_INF, min(WINDOW_INF, int(v)))  # noqa: E731
    if spec is None or spec.kind == "none":
        return WINDOW_INF, WINDOW_INF, 0
    if spec.kind == "generic":
        return clamp(spec.left), clamp(spec.right), 0
    y = WINDOW_INF if spec.left < 0 else clamp(1 + spec.left)
    x = WINDOW_INF if spec.right < 0 else clamp(1 + spec.right)
    if spec.kind == "top_left":
        return y, x, 0
    if spec.kind == "bottom_right":
        return y, x, 1
    raise ValueError(f"mask: unknown kind {spec.kind!r}")


def sequence_window(y: int, x: int, bottom_right: int, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """What a kernel makes of (y, x, bottom_right) for one sequence: the Python mirror of
    ``window_for_sequence`` (kernels/varlen.cuh), for tests. Unlimited edges stay unlimited;
    others are shifted by the length difference and clamped to +-WINDOW_INF."""
    if not bottom_right:
        return y, x
    d = seqlen_q - seqlen_k
    clamp = lambda v: max(-WINDOW_INF, min(WINDOW_INF, v))  # noqa: E731
    if -WINDOW_INF < y < WINDOW_INF:
        y = clamp(y + d)
    if -WINDOW_INF < x < WINDOW_INF:
        x = clamp(x - d)
    return y, x


def empty_grid(launch: "Launch") -> bool:
    """True when the grid has no blocks (group mode: every sequence empty), so nothing launches."""
    return 0 in launch.grid  # (a tuple of ints: one C-level scan, no generator per launch)


#: kernels that take TMA tensor maps before their params, and of which tensors (in that order)
TMA_TENSORS = {"fmha_fwd_sm90_ws": ("q", "k", "v"), "fmha_bwd_dq_dk_dv_sm90_ws": ("q", "k", "v", "do"),
               "fmha_bwd_dq_dk_dv_sm90_ws_wide": ("q", "k", "v", "do")}


def tma_boxes(spec: KernelSpec, batch: int, nhead_q: int, nhead_k: int, hdim_q: int, hdim_v: int,
              rows_q: int, rows_k: int) -> tuple:
    """The tensor maps ``spec``'s kernel takes before its params (``()`` for kernels without): per
    tensor, (element type name, batch, heads, rows, head dim, box rows, padded head dim, swizzle),
    for ``api._tile_map``. Q and dO are read in boxes of BLOCK_M rows, K and V of BLOCK_N. Group
    mode passes batch 1 and the total token counts as ``rows_q`` / ``rows_k`` (packed tokens);
    batch mode the padded lengths. ``swizzle`` is 128 for the instances built with ``SWIZZLE``
    (128-byte-swizzled tiles in boxes of 64 columns), else 0 (column-blocked tiles, one box each).
    Resolved once per plan, so a call only looks the maps up."""
    names = TMA_TENSORS.get(spec.source, ())
    if not names:
        return ()
    dtype = "bfloat16" if spec.dtype == "bf16" else "float16"
    swizzle = 128 if spec.macro("SWIZZLE", 0) else 0
    geom = {"q": (nhead_q, rows_q, hdim_q, spec.macro("BLOCK_M"), spec.macro("HDIM_Q")),
            "k": (nhead_k, rows_k, hdim_q, spec.macro("BLOCK_N"), spec.macro("HDIM_Q")),
            "v": (nhead_k, rows_k, hdim_v, spec.macro("BLOCK_N"), spec.macro("HDIM_V")),
            "do": (nhead_q, rows_q, hdim_v, spec.macro("BLOCK_M"), spec.macro("HDIM_V"))}
    return tuple((dtype, batch, *geom[n], swizzle) for n in names)


def fwd_launch(spec: KernelSpec, batch: int, nhead_q: int, seqlen_q: int) -> Launch:
    """fmha_fwd / fmha_fwd_sm90 / fmha_fwd_sm90_ws: one block of BLOCK_M query rows per CTA; the ws
    forward up to n of them (grid x ``ceil(row blocks / n)``; the kernel strides over its row
    blocks by grid x), n from the instance's PERSIST macro (``CUPY_FMHA_FWD_WS_TILES=PERSIST=n``,
    comparisons) or else by :func:`backends.cuda.fwd_ws_persist`; sizes from the spec's macros."""
    nqb, per = cdiv(seqlen_q, spec.macro("BLOCK_M")), spec.macro("PERSIST")
    if per is None:
        per = fwd_ws_persist(nqb, batch * nhead_q, spec.macro("HDIM_Q")) if spec.source == "fmha_fwd_sm90_ws" else 0
    return Launch((cdiv(nqb, per) if per else nqb, nhead_q, batch), (spec.macro("NTHREADS"), 1, 1),
                  spec.macro("SMEM_BYTES"))


def dq_dk_dv_launch(spec: KernelSpec, batch: int, nhead_q: int, seqlen_k: int) -> Launch:
    """fmha_bwd_dq_dk_dv(_sm90): NSPLIT blocks per BLOCK_N keys; sizes from the spec's macros.
    With ``HEADS_X`` >= 1 (the ws kernels under causal masks, :func:`backends.cuda.use_heads_x`) the grid
    is (nhead_q, key blocks, batch): the GPU starts CTAs x-fastest, so the heavy key blocks of every
    head (or, HEADS_X = n >= 2, of every group of n heads) start first (kernels/bwd_ws.cuh bwd_ws_tile)."""
    bn, ns, hx = spec.macro("BLOCK_N"), spec.macro("NSPLIT", 1), spec.macro("HEADS_X", 0)
    if hx > 1 and nhead_q % hx:
        raise ValueError(f"{spec.name}: HEADS_X={hx} takes groups of {hx} heads, and nhead_q={nhead_q} is no multiple "
                         "(CUPY_FMHA_BWD_WS_TILES?)")
    nkb = cdiv(seqlen_k, bn) * ns
    grid = (nhead_q, nkb, batch) if hx else (nkb, nhead_q, batch)
    return Launch(grid, (spec.macro("NTHREADS"), 1, 1), spec.macro("SMEM_BYTES"))


def dq_dk_dv_key_blocks(spec: KernelSpec, launch: Launch) -> int:
    """The number of key blocks (times NSPLIT) in a :func:`dq_dk_dv_launch` grid."""
    return launch.grid[1] if spec.macro("HEADS_X", 0) else launch.grid[0]


#: threads per block of the keep-mask kernel (its NTHREADS macro)
DROPOUT_MASK_THREADS = dropout_mask_spec().macro("NTHREADS")


def dropout_mask_launch(batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int) -> Launch:
    """fmha_dropout_mask: one thread per (query row, 8 keys)."""
    calls = seqlen_q * cdiv(seqlen_k, 8)
    return Launch((max(1, cdiv(calls, DROPOUT_MASK_THREADS)), nhead_q, batch), (DROPOUT_MASK_THREADS, 1, 1), 0)


def dot_do_o_launch(spec: KernelSpec, batch: int, nhead_q: int, seqlen_q: int) -> Launch:
    rows = spec.macro("ROWS")
    return Launch((cdiv(seqlen_q, rows), nhead_q, batch), (spec.macro("NTHREADS"), 1, 1), 0)


def convert_launch(spec: KernelSpec, batch: int, nhead_out: int, seqlen: int) -> Launch:
    rows = spec.macro("ROWS")
    return Launch((cdiv(seqlen, rows), nhead_out, batch), (spec.macro("NTHREADS"), 1, 1), 0)


# --------------------------------------------------------------------------- deterministic dQ


def dq_dk_dv_blocks(spec: KernelSpec) -> tuple[int, int]:
    """(BLOCK_N keys per CTA, BLOCK_M query rows per step) of a dq_dk_dv instance."""
    return spec.macro("BLOCK_N"), spec.macro("BLOCK_M")


def query_block_range(win_y: int, win_x: int, k0: int, n: int, m: int, seqlen_q: int,
                      seqlen_k: int) -> tuple[int, int]:
    """Query blocks ``[begin, end)`` of height ``m`` that see keys ``[k0, k0 + n)``; empty when
    ``end <= begin``. Mirrors ``query_block_range`` in kernels/attention.cuh line for line (the
    kernels' window is (y, x) from :func:`kernel_window`); used by the CPU tests."""
    lo = max(k0 - win_x + 1, 0)
    hi = min(min(k0 + n, seqlen_k) - 1 + win_y, seqlen_q)
    begin = lo // m
    end = -(-hi // m) if hi > lo else begin
    return begin, end


def first_key_block(win_y: int, win_x: int, qb: int, first: int, first_call: bool, n: int, m: int,
                    seqlen_q: int, seqlen_k: int) -> int:
    """Mirrors ``first_key_block`` in kernels/common.cuh (the deterministic ordered dQ adds)."""
    if first_call:
        while first > 0:
            b, e = query_block_range(win_y, win_x, (first - 1) * n, n, m, seqlen_q, seqlen_k)
            if qb < b or qb >= e:
                break
            first -= 1
        return first
    while True:
        b, e = query_block_range(win_y, win_x, first * n, n, m, seqlen_q, seqlen_k)
        if b <= qb < e:
            return first
        first += 1


class DqWorkspace(tuple):
    """(shape, nsplit, split_stride, tiled, nsem): the fp32 dQ workspace of one backward call."""

    def __new__(cls, shape, nsplit, split_stride, tiled=0, nsem=0):
        return super().__new__(cls, (tuple(shape), int(nsplit), int(split_stride), int(tiled), int(nsem)))

    shape = property(lambda s: s[0])
    nsplit = property(lambda s: s[1])  # 0: one accumulator (atomic adds)
    split_stride = property(lambda s: s[2])  # elements between slabs; 0 in atomic mode
    tiled = property(lambda s: s[3])  # 0, or whole query-block tiles, chunks placed as dq_tile_chunk of this kind (1, 2)
    pitch = property(lambda s: s[0][-2])  # rows per (batch, head)
    cols = property(lambda s: s[0][-1])  # floats per row
    nsem = property(lambda s: s[4])  # deterministic by ordered adds: int32 semaphores, one per query tile

    @property
    def nbytes(self) -> int:
        n = 4
        for d in self.shape:
            n *= d
        return n + 4 * self.nsem


def dq_tile_kind(spec: KernelSpec) -> int:
    """How the dq_dk_dv instance ``spec`` places a row's 16-byte chunks in the tiled dQ workspace
    (``dq_tile_chunk``'s kind in kernels/common.cuh): 0 not tiled; 1 (``DQ_TILED``); 2 where the ws
    backward stages dQ^T fragments (``DQ_T`` in kernels/fmha_bwd_dq_dk_dv_sm90_ws.cu: BLOCK_M not a
    multiple of 64)."""
    if not spec.macro("DQ_TILED", 0):
        return 0
    return 2 if spec.source == "fmha_bwd_dq_dk_dv_sm90_ws" and spec.macro("BLOCK_M") % 64 else 1


def dq_workspace(spec: KernelSpec, batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int, hdim_q: int,
                 deterministic: bool) -> DqWorkspace:
    """The dQ workspace for the dq_dk_dv instance ``spec``.

    Atomic mode: [batch, nhead_q, seqlen_q, hdim_q], zero-filled by the caller. Deterministic:
    [nsplit, batch, nhead_q, seqlen_q, hdim_q] with nsplit = ceil(seqlen_k / BLOCK_N) (one slab per
    key block), not zero-filled: convert_dq reads only the slabs that were written. That is
    nsplit times the memory, e.g. 32 slabs (4.3 GB) for batch 4, 16 heads, 4096 x 4096, hdim 128
    on the Hopper kernel (BLOCK_N = 128).

    Tiled (instances with ``DQ_TILED``, which add a query block's dQ with one bulk copy): rows
    rounded up to a multiple of BLOCK_M and rows of HDIM_Q (the padded head dim) floats, so that
    each block's rows are one contiguous tile; inside a row the 16-byte chunks are permuted as
    ``dq_tile_chunk`` in kernels/common.cuh says (convert_dq undoes it).

    Deterministic on instances with ``DQ_ORDERED`` (fmha_bwd_dq_dk_dv_sm90_ws, and the wide ws
    backward where hdim_q <= hdim_v once both are rounded up to a multiple of 128; at 256 / 128 it
    stores slabs like the older kernels): no
    slabs; the one workspace (zero-filled, as in atomic mode) plus an int32 semaphore per
    (batch, head, query tile), zeroed, which admits the key blocks' adds of a tile in ascending
    order (kernels/fmha_bwd_dq_dk_dv_sm90_ws.cu)."""
    tiled = dq_tile_kind(spec)
    if tiled:
        bm = spec.macro("BLOCK_M")
        per = (batch, nhead_q, cdiv(seqlen_q, bm) * bm, spec.macro("HDIM_Q"))
    else:
        per = (batch, nhead_q, seqlen_q, hdim_q)
    plane = per[0] * per[1] * per[2] * per[3]
    if not deterministic:
        return DqWorkspace(per, 0, 0, tiled)
    if spec.macro("DQ_ORDERED", 0):
        return DqWorkspace(per, 0, 0, tiled, batch * nhead_q * cdiv(seqlen_q, spec.macro("BLOCK_M")))
    bn, _ = dq_dk_dv_blocks(spec)
    nsplit = cdiv(seqlen_k, bn)
    return DqWorkspace((nsplit, *per), nsplit, plane, tiled)
