"""The CUDA backend: NVIDIA GPUs of compute capability 8.0 and newer.

Everything this GPU family decides lives here: the instance table (which kernel source and
which tile sizes serve a head dim and feature set, on sm_80-class devices and on Hopper), the
NVRTC compile options and targets, and the device limits (warp width, shared memory per block).
:mod:`cupy_fmha.spec` asks the backend of a device for its kernel instances; a new GPU family
(ROCm's gfx9, later) is a module beside this one with the same functions, and a folder of its
own under ``kernels/arch/``.

Two kernel families: ``mma.sync`` kernels (``fmha_fwd``, ``fmha_bwd_dq_dk_dv``; target
``sm80``, any device from sm_80) and Hopper kernels on warpgroup MMA (target ``sm90a``) for
compute capability 9.0: ``fmha_fwd_sm90`` and ``fmha_bwd_dq_dk_dv_sm90`` where both padded head
dims are 64 or 128, the warp-specialized ``fmha_fwd_sm90_ws`` (head dims rounding up to 64, 128,
192, 256), ``fmha_bwd_dq_dk_dv_sm90_ws`` (64, 128) and ``fmha_bwd_dq_dk_dv_sm90_ws_wide`` (above
128, rounded up to 256). The tile table below is the only place tile sizes are chosen; the
kernels get them as ``-D`` macros.
"""

from __future__ import annotations

import os

from ..spec import DTYPES, BwdSpecs, KernelSpec, _mk, feature_macros, pad_hdim

__all__ = ["NAME", "WARP_SIZE", "SMEM_LIMIT", "OFFLINE_ARCHS", "derived_macros", "smem_pitch", "compile_arch", "compile_options", "fwd_spec",
           "bwd_specs", "bwd_ws_spec", "bwd_ws_wide_spec", "BWD_WS_WIDE_HDIMS", "BWD_WS_WIDE_BUILDS", "bwd_ws_tiles", "BWD_WS_VARIANTS", "BWD_WS_BUILDS", "fwd_ws_spec", "fwd_ws_tiles", "fwd_ws_persist", "FWD_WS_PERSIST", "FWD_WS_PERSIST_BY_HDIM", "FWD_WS_VARIANTS", "FWD_WS_BUILDS", "use_ws", "use_fwd_ws", "use_fwd_ws_short", "use_heads_x", "use_bwd_ws_diagonal", "BWD_WS_DIAGONAL_SEQLEN_K", "BWD_WS_HEADS_X_SEQLEN_K", "BWD_WS_HEADS_GROUP", "BWD_WS_HEADS_GROUP_SEQLEN_K", "experimental_table", "dropout_mask_spec", "dispatch_table", "use_sm90", "use_wg_skip", "fwd_tiles", "bwd_tiles",
           "fwd_sm90_tiles", "padded_dims", "SM90_HDIMS", "FWD_WS_HDIMS", "FEATURE_SETS"]

NAME = "cuda"
#: threads per warp (the m16n8 fragment layouts of kernels/arch/sm80 assume it)
WARP_SIZE = 32
#: bytes of dynamic shared memory one block may use (sm_80: 163 KiB, sm_90: 227 KiB; the kernels
#: are sized for the larger, and the launcher raises the per-function limit above 48 KiB)
SMEM_LIMIT = 227 * 1024
#: targets the offline compile check builds every instance for (CI, no GPU)
OFFLINE_ARCHS = ("sm_80", "sm_90a")


def smem_pitch(d: int) -> int:
    """Row pitch in elements of an mma.sync shared-memory tile (``smem_pitch`` in the sm80 arch layer)."""
    return d + 8


def derived_macros(source: str, m: dict[str, int]) -> dict[str, int]:
    """The macros that follow from an instance's table entries: BLOCK_M / BLOCK_N (where the table
    gives warps), NTHREADS, SMEM_BYTES, the dynamic shared memory of the kernel's layout
    struct (each kernel ``static_assert``s that its struct has exactly this size; the launcher
    passes it), DQ_TILED for the dq_dk_dv kernels that write the tiled dQ workspace and
    DQ_ORDERED for those whose deterministic mode adds in order instead of using slabs
    (:func:`cupy_fmha.launch.dq_workspace`)."""
    if source == "fmha_fwd":  # NWARPS warps of 16 query rows; Q (also O's staging), K, V x 2
        bm, bn, pq, pv = 16 * m["NWARPS"], m["BLOCK_N"], smem_pitch(m["HDIM_Q"]), smem_pitch(m["HDIM_V"])
        return dict(BLOCK_M=bm, NTHREADS=32 * m["NWARPS"],
                    SMEM_BYTES=2 * (bm * max(pq, pv) + 2 * bn * pq + 2 * bn * pv))
    if source == "fmha_fwd_sm90":  # NWG warpgroups of 64 query rows; blocked Q, K, V x 2
        bm, bn, dq, dv = 64 * m["NWG"], m["BLOCK_N"], m["HDIM_Q"], m["HDIM_V"]
        return dict(BLOCK_M=bm, NTHREADS=128 * m["NWG"], SMEM_BYTES=2 * (bm * dq + 2 * bn * dq + 2 * bn * dv))
    if source == "fmha_fwd_sm90_ws":  # a producer and NWG warpgroups of 64 rows; Q; K, V x STAGES;
        # mbarriers (q_full, q_empty; k_full, v_full, empty, k_empty per stage); SWIZZLE: 1024
        # bytes to align the tiles. BIAS: from the next 1024-byte boundary BIAS_STAGES bias tiles of
        # BIAS_TMA-byte elements and their mbarriers (full, empty); two stages where they fit in SMEM_LIMIT, else one
        bm, bn, dq, dv, st = 64 * m["NWG"], m["BLOCK_N"], m["HDIM_Q"], m["HDIM_V"], m.get("STAGES", 2)
        smem = 2 * (bm * dq + st * bn * (dq + dv)) + 8 * (2 + 4 * st)
        align = 1024 if m.get("SWIZZLE") else 0
        out = dict(BLOCK_M=bm, NTHREADS=128 * (m["NWG"] + 1))
        if m.get("BIAS"):
            out["BIAS_STAGES"], smem = _bias_ring(smem, bm * bn * m.get("BIAS_TMA", 2), align)
        # O_STAGE: from the next 16-byte boundary, O's stage (BLOCK_M rows of HDIM_V + 8 16-bit
        # elements) where it fits and O_REG (the register stores, for comparisons) is not asked for
        staged = -(-smem // 16) * 16 + 2 * bm * (dv + 8)
        out["O_STAGE"] = 1 if not m.get("O_REG") and staged + align <= SMEM_LIMIT else 0
        return dict(out, SMEM_BYTES=(staged if out["O_STAGE"] else smem) + align)
    if source == "fmha_bwd_dq_dk_dv":  # K, V, Q x 2, dO x 2, dS^T, LSE x 2, D x 2 (+ keep bits x 2)
        bn, bm = 16 * m["NWARPS"], m["BLOCK_M"]
        pq, pv, ps = smem_pitch(m["HDIM_Q"]), smem_pitch(m["HDIM_V"]), smem_pitch(bm)
        smem = 2 * (bn * pq + bn * pv + 2 * bm * pq + 2 * bm * pv + bn * ps) + 4 * 4 * bm
        return dict(BLOCK_N=bn, NTHREADS=32 * m["NWARPS"], SMEM_BYTES=smem + _keep_bits_bytes(m, bm, bn))
    if source == "fmha_bwd_dq_dk_dv_sm90":  # the same, blocked, (+ the fp32 dQ tile, DQ_BULK)
        bn, bm, dq, dv = m["BLOCK_N"], m["BLOCK_M"], m["HDIM_Q"], m["HDIM_V"]
        smem = 2 * (bn * dq + bn * dv + 2 * bm * dq + 2 * bm * dv + bn * bm) + 4 * 4 * bm + _keep_bits_bytes(m, bm, bn)
        bulk = m.get("DQ_BULK", 1)
        if bulk:
            smem += 4 * bm * dq
        return dict(NTHREADS=128 * m["NWG"], SMEM_BYTES=smem, DQ_TILED=1 if bulk else 0)
    if source == "fmha_bwd_dq_dk_dv_sm90_ws":  # K, V; Q, dO x STAGES; dS^T x 2; dQ tile; LSE, D x STAGES; mbarriers
        # (full, empty per stage; kv); SWIZZLE: 1024 bytes to align the tiles
        bn, bm, dq, dv, st = m["BLOCK_N"], m["BLOCK_M"], m["HDIM_Q"], m["HDIM_V"], m.get("STAGES", 2)
        smem = (2 * (bn * dq + bn * dv) + 2 * st * bm * (dq + dv) + 2 * 2 * bn * bm + 4 * bm * dq
                + 4 * 2 * st * bm + 8 * (2 * st + 1))
        if m.get("DQ_WRITER"):  # the dQ writer's two mbarriers and job (24 bytes)
            smem += 8 * 2 + 24
        if m.get("DROPOUT"):  # two buffers of a block's keep words (fill_keep_words)
            smem += _keep_bits_bytes(m, bm, bn)
        out = dict(NTHREADS=128 * (m["NWG"] + 1), DQ_TILED=1, DQ_ORDERED=1)
        align = 1024 if m.get("SWIZZLE") else 0
        if m.get("BIAS"):  # the bias ring, as the forward's less the `empty` mbarriers
            out["BIAS_STAGES"], smem = _bias_ring(smem, bm * bn * m.get("BIAS_TMA", 2), align, barriers=1)
        return dict(out, SMEM_BYTES=smem + align)
    if source == "fmha_bwd_dq_dk_dv_sm90_ws_wide":  # K, V; Q, dO x STAGES; P^T, dS^T x 2; LSE, D x STAGES; mbarriers
        bn, bm, dq, dv, st = m["BLOCK_N"], m["BLOCK_M"], m["HDIM_Q"], m["HDIM_V"], m.get("STAGES", 2)
        smem = 2 * bn * (dq + dv) + 2 * st * bm * (dq + dv) + 2 * 2 * 2 * bn * bm + 4 * 2 * st * bm + 8 * (2 * st + 1)
        # dQ staged in a block's Q and dO buffers (tiled workspace, ordered deterministic adds) where
        # the dO buffer holds half the fp32 tile, i.e. HDIM_Q <= HDIM_V; else (or DQ_STAGE=0 in
        # CUPY_FMHA_BWD_WS_WIDE_TILES, for comparisons) atomics and slabs. DQ_WRITER (a variant, where
        # dQ is staged): the producer warpgroup's second warp adds the tiles (bench/NOTES.md step 75)
        staged = 1 if dq <= dv and m.get("DQ_STAGE", 1) else 0
        if staged and m.get("DQ_WRITER", 0):  # the writer's dq_full mbarriers and jobs (24 bytes) per stage
            smem += (8 + 24) * st
        if m.get("TIMING", 0):  # the diagnostics build's phase sums (WT_WORDS words), after the layout: a static
            smem += 8 * (8 + 2 * 7)  # array would push the 1024-aligned dynamic one past the limit
        return dict(NTHREADS=128 * (m["NWG"] + 1), DQ_TILED=staged, DQ_ORDERED=staged, SMEM_BYTES=smem + 1024)
    if source == "fmha_bwd_dot_do_o":  # one warp per row
        return dict(NTHREADS=32 * m["ROWS"])
    return dict(NTHREADS=256)  # fmha_bwd_convert_dq, fmha_dropout_mask


def _check_bias_tma(n: int) -> int:
    """``n`` (the bytes per element of a bias TMA can load, or 0) when it is 0, 2 or 4."""
    if n not in (0, 2, 4):
        raise ValueError(f"bias_tma: expected 0, 2 or 4 (bytes per bias element), got {n!r}")
    return n


def _ws_feats(source: str, tiles: dict, alibi: bool, bias_tma: int, dropout: bool = False) -> dict[str, int]:
    """The feature macros of a ws kernel's instance: ALiBi, dropout (``DROPOUT=1``), or with
    ``bias_tma`` (2 or 4) the bias build (``BIAS=1``, ``BIAS_TMA``), which needs the swizzled tiles."""
    feats = feature_macros(alibi, bool(_check_bias_tma(bias_tma)), dropout)
    if bias_tma:
        if not tiles.get("SWIZZLE"):
            raise ValueError(f"{source}: the bias tiles need SWIZZLE=1")
        feats["BIAS_TMA"] = bias_tma
    return feats


def _bias_ring(smem: int, tile: int, align: int, barriers: int = 2) -> tuple[int, int]:
    """(tiles, shared memory) of a ws kernel's bias ring after ``smem`` bytes of its layout: from the
    next 1024-byte boundary, tiles of ``tile`` bytes and ``barriers`` mbarriers each, as many as
    fit in SMEM_LIMIT (with ``align`` more) up to 2; at least 1 (the instance is then too large
    and the dispatch keeps the older kernel)."""
    start = smem + 1024 - smem % 1024
    per = tile + 8 * barriers
    n = next((n for n in (2, 1) if start + n * per + align <= SMEM_LIMIT), 1)
    return n, start + n * per


def _keep_bits_bytes(m: dict[str, int], block_m: int, block_n: int) -> int:
    """The dq_dk_dv kernels' dropout keep bits: two word tiles of block_m * block_n / 8 bytes (the current
    Q block's and the next one's; a key block shorter than a 32-key call span takes the whole span);
    0 without ``DROPOUT``."""
    return 2 * (max(block_n, 32) // 8) * block_m if m.get("DROPOUT", 0) else 0


def compile_arch(spec: KernelSpec) -> str | None:
    """NVRTC ``-arch`` for ``spec`` on a device: ``sm_90a`` for the wgmma kernels (Hopper-only
    instructions need the ``a`` target), else ``None`` (CuPy picks the device's)."""
    return "sm_90a" if spec.target == "sm90a" else None


def compile_options(spec: KernelSpec, arch: str | None = None) -> tuple[str, ...]:
    """NVRTC options for ``spec``: C++17, its ``-D`` macros, and ``-arch`` when given."""
    opts = ["-std=c++17", *spec.defines()]
    if arch:
        opts.append(f"-arch={arch}")
    return tuple(opts)




def _override(var: str, tiles: dict[str, int]) -> dict[str, int]:
    """Tuning hook: ``CUPY_FMHA_FWD_TILES`` / ``CUPY_FMHA_BWD_TILES`` = ``"NWARPS=8,BLOCK_M=64"``
    replaces entries of the table for every head dim (benchmarks only; not a public option)."""
    text = os.environ.get(var, "").strip()
    if text:
        for item in text.split(","):
            if not item.strip():
                continue
            key, _, val = item.partition("=")
            try:
                tiles[key.strip()] = int(val)
            except ValueError:
                raise ValueError(f"{var}: {key.strip()} expects an integer (NAME=n), got {val.strip()!r}") from None
    return tiles


def fwd_tiles(hdim_q: int, hdim_v: int, bias: bool = False, alibi: bool = False,
              dropout: bool = False) -> dict[str, int]:
    """Forward tiles: NWARPS warps of 16 query rows each, BLOCK_N keys per step. Head dims above
    128 with the elementwise bias, ALiBi or dropout step 16 keys at a time: at 32 the bias's
    address arithmetic (or the Philox state) pushes them past 255 registers (spills)."""
    d = max(pad_hdim(hdim_q), pad_hdim(hdim_v))
    if d <= 128:
        tiles = dict(NWARPS=8, BLOCK_N=64, Q_IN_REGS=1)
    elif d in (224, 240) or pad_hdim(hdim_q) < pad_hdim(hdim_v):
        # 32-key blocks sit at the 255-register cap here (251 before group mode) and spill once
        # the per-sequence lengths and window live in registers; 16-key blocks use ~215. The same
        # when hdim_v is the wider (128 / 256 spilled 4-8 B at 32 keys)
        tiles = dict(NWARPS=4, BLOCK_N=16, Q_IN_REGS=0)
    else:
        tiles = dict(NWARPS=4, BLOCK_N=16 if (bias or alibi or dropout) else 32, Q_IN_REGS=0)
    return _override("CUPY_FMHA_FWD_TILES", tiles)


def bwd_tiles(hdim_q: int, hdim_v: int, bias: bool = False, dropout: bool = False) -> dict[str, int]:
    """Backward dq_dk_dv tiles: BLOCK_N = 16 * NWARPS keys per CTA, BLOCK_M query rows per step,
    NSPLIT CTAs sharing one key block's output columns (head dims above 128). The bias (all head
    dims) and dropout (above 64) halve BLOCK_M: 32-row steps spill at 255 registers."""
    d = max(hdim_q, hdim_v)
    if d <= 64:
        tiles = dict(NWARPS=8, BLOCK_M=64, NSPLIT=1, MIN_BLOCKS=1)
    elif d <= 128:
        # padded 112 (hdim 104/112) spills at 32 rows on sm_80 since group mode and the dQ slabs
        tiles = dict(NWARPS=8, BLOCK_M=16 if pad_hdim(d) == 112 else 32, NSPLIT=1, MIN_BLOCKS=1)
    else:
        tiles = dict(NWARPS=4, BLOCK_M=16, NSPLIT=2, MIN_BLOCKS=1)
    if (bias or (dropout and d > 64)) and tiles["NSPLIT"] == 1 and tiles["BLOCK_M"] > 16:  # the bias's loads and the dS store: half the rows per step, no spills
        tiles["BLOCK_M"] //= 2
    return _override("CUPY_FMHA_BWD_TILES", tiles)


def padded_dims(hdim_q: int, hdim_v: int, nsplit: int = 1) -> tuple[int, int]:
    """Padded head dims: multiples of 16 (the mma k-step); with NSPLIT > 1, multiples of 64 so
    each split's columns divide evenly among the warps of the dQ GEMM."""
    m = 16 if nsplit == 1 else 64
    return pad_hdim(hdim_q, m), pad_hdim(hdim_v, m)


def fwd_sm90_tiles(hdim_q: int, hdim_v: int, dropout: bool = False) -> dict[str, int]:
    """Hopper forward tiles: NWG warpgroups of 64 query rows, BLOCK_N keys per step.

    The dropout instances need registers for the Philox state (ptxas, sm_90a): at head dim 64,
    2 CTAs of 2 warpgroups (at most 128 registers) spill, one CTA of 3 warpgroups fits (155);
    at head dim 128, 3 warpgroups (at most 168) spill, 2 fit (about 200)."""
    small = max(pad_hdim(hdim_q), pad_hdim(hdim_v)) <= 64
    if dropout:
        tiles = dict(NWG=3 if small else 2, BLOCK_N=64, MIN_BLOCKS=1)
    elif small:
        tiles = dict(NWG=2, BLOCK_N=64, MIN_BLOCKS=2)
    else:
        tiles = dict(NWG=3, BLOCK_N=64, MIN_BLOCKS=1)
    return _override("CUPY_FMHA_FWD_SM90_TILES", tiles)


#: Longest seqlen_q for which the 3-warpgroup forward with a diagonal mask takes the WG_SKIP build.
WG_SKIP_MAX_SEQLEN = 2048


def use_wg_skip(diagonal: bool, seqlen_q: int) -> bool:
    """Whether the 3-warpgroup Hopper forward (hdim 128) should skip, per warpgroup, the key
    blocks none of its rows sees. Measured on the H200 (bench/NOTES.md): with a causal mask at
    seqlen 1024 the skip gains 5-8%, because a 192-row block spans three 64-key diagonal blocks;
    in long or unmasked problems its extra loop copies cost 6-9% (the kernel is at its
    168-register cap), so it is used only with a diagonal mask and seqlen_q <= 2048."""
    return bool(diagonal) and 0 < seqlen_q <= WG_SKIP_MAX_SEQLEN


def use_fwd_ws_short(diagonal: bool, seqlen_q: int) -> bool:
    """Whether the warp-specialized forward should take its entries for short diagonal masks
    (:data:`FWD_WS_SHORT_BY_HDIM`): a mask with a diagonal (``diagonal``: causal or a sliding window,
    in batch or group mode) over at most :data:`FWD_WS_SHORT_SEQLEN` query rows (``seqlen_q``: the max
    in group mode)."""
    return bool(diagonal) and 0 < seqlen_q <= FWD_WS_SHORT_SEQLEN


def use_heads_x(causal: bool, seqlen_k: int, nhead_q: int = 1, hdim: int = 128) -> int:
    """The order in which the warp-specialized backwards start their CTAs (their ``HEADS_X`` macro,
    kernels/bwd_ws.cuh ``bwd_ws_tile``): 0 key blocks first (the plain grid); with a causal mask
    (``causal``: the window's left side reaches every query row, its right side is limited) the
    heavy key blocks first: 1, every head's, up to :data:`BWD_WS_HEADS_X_SEQLEN_K` keys (seqlen_k:
    the max in group mode); :data:`BWD_WS_HEADS_GROUP` (groups of that many of the ``nhead_q``
    heads, which it must divide) up to :data:`BWD_WS_HEADS_GROUP_SEQLEN_K` keys, for the 128-key
    CTAs of head dims (``hdim``: the larger of the two) up to 128; else 0."""
    if not causal or seqlen_k <= 0:
        return 0
    if seqlen_k <= BWD_WS_HEADS_X_SEQLEN_K:
        return 1
    if seqlen_k <= BWD_WS_HEADS_GROUP_SEQLEN_K and hdim <= 128 and nhead_q % BWD_WS_HEADS_GROUP == 0:
        return BWD_WS_HEADS_GROUP
    return 0


def fwd_spec(dtype: str, hdim_q: int, hdim_v: int, cc: int = 80, *, alibi: bool = False,
             bias: bool = False, dropout: bool = False, wg_skip: bool = False, bias_tma: int = 0,
             short: bool = False) -> KernelSpec:
    """Forward kernel instance for these head dims on a device of compute capability ``cc``
    (``alibi``: the instance that adds ALiBi; ``bias``: an elementwise bias, ``-D BIAS=1``;
    ``dropout``: the Philox keep test, ``-D DROPOUT=1``). ``bias_tma``: with ``bias``, the bytes
    per element (2 or 4) of a bias that TMA can load (keys contiguous, not broadcast; the caller
    lays it out so: :func:`cupy_fmha.api._tma_bias`), which the warp-specialized Hopper forward
    takes; 0 for one it cannot (the per-element reading kernels). ``wg_skip`` (the caller's
    :func:`use_wg_skip` decision) picks, for the plain 3-warpgroup Hopper instance, the build whose
    warpgroups skip key blocks none of their rows sees (``-D WG_SKIP=1``). ``short`` (the caller's
    :func:`use_fwd_ws_short` decision: a diagonal mask over few query rows) picks, for the
    warp-specialized forward, the entries of :data:`FWD_WS_SHORT_BY_HDIM` (none since step 118)."""
    feats = feature_macros(alibi, bias, dropout)
    tma_bias = _check_bias_tma(bias_tma) if bias else 0
    ws_tiles = fwd_ws_tiles(max(pad_hdim(hdim_q, 64), pad_hdim(hdim_v, 64)), alibi) if _wgmma_allowed(cc) else {}
    if tma_bias and ws_tiles.get("BLOCK_N", 0) * tma_bias % 128:
        tma_bias = 0  # (the bias tile is whole 128-byte boxes of keys: not at the 80 or 112-key blocks of 192/256)
    # (the ws forward takes a bias through TMA only, and not together with dropout: no such build)
    if (_wgmma_allowed(cc) and use_fwd_ws(hdim_q, hdim_v, bias=bias and (not tma_bias or dropout))
            and (not tma_bias or ws_tiles.get("SWIZZLE"))):
        ws = fwd_ws_spec(dtype, hdim_q, hdim_v, alibi=alibi, bias_tma=tma_bias, dropout=dropout, short=short)
        if ws.macro("SMEM_BYTES") <= SMEM_LIMIT:  # (a bias ring that does not fit: hdim 192 and 256)
            return ws
    if use_sm90(hdim_q, hdim_v, cc):
        tiles = fwd_sm90_tiles(hdim_q, hdim_v, dropout)
        if not feats and tiles["NWG"] == 3 and wg_skip:
            tiles["WG_SKIP"] = 1
        return _mk("fmha_fwd_sm90", dtype, "sm90a", HDIM_Q=pad_hdim(hdim_q), HDIM_V=pad_hdim(hdim_v),
                   **tiles, **feats)
    dq, dv = padded_dims(hdim_q, hdim_v)
    return _mk("fmha_fwd", dtype, HDIM_Q=dq, HDIM_V=dv, **fwd_tiles(hdim_q, hdim_v, bias, alibi, dropout), **feats)


#: padded head dims the Hopper (wgmma) kernels are built for
SM90_HDIMS = (64, 128)


#: head dims the warp-specialized forward is built for, each head dim rounded up to a multiple of 64
#: (its tiles are slabs of 64 columns; TMA zero-fills the columns past a smaller head dim)
FWD_WS_HDIMS = (64, 128, 192, 256)


def _wgmma_allowed(cc: int) -> bool:
    """Compute capability 9.0, unless ``CUPY_FMHA_DISABLE_WGMMA=1`` (comparisons) forces the
    mma.sync kernels."""
    return cc == 90 and os.environ.get("CUPY_FMHA_DISABLE_WGMMA", "") in ("", "0")


def use_sm90(hdim_q: int, hdim_v: int, cc: int) -> bool:
    """The first wgmma kernels (and the ws backward) serve compute capability 9.0 when both padded
    head dims are 64 or 128 (``CUPY_FMHA_DISABLE_WGMMA=1`` forces the mma.sync kernels, for
    comparisons). The ws forward has its own head dims, :data:`FWD_WS_HDIMS`."""
    return _wgmma_allowed(cc) and pad_hdim(hdim_q) in SM90_HDIMS and pad_hdim(hdim_v) in SM90_HDIMS


#: The warp-specialized kernels are the default only above this head dim: at 32 the ws forward (its
#: tiles 64 wide) measured 1.00-1.05x the time of the mma.sync forward (bench/NOTES.md step 45)
WS_MIN_HDIM = 49


def _ws_choice(switch_var: str, hdim_q: int, hdim_v: int, unsupported: bool, hdims: tuple[int, ...],
               pad: int = 64) -> bool:
    """The rule both warp-specialized kernels follow: never for a feature they lack
    (``unsupported``: a bias they cannot take) or head dims that, rounded up to a multiple of 64 (their tiles
    are slabs of 64 columns; TMA zero-fills the rest; ``pad`` 128 for the wide backward, whose
    warpgroups split them in halves), fall outside ``hdims``; else ``switch_var``
    set to ``1`` takes them wherever they apply, ``0`` never; unset, above :data:`WS_MIN_HDIM` at
    equal rounded head dims, or unequal ones with one above 128 (e.g. 192 / 128: the alternative
    there is the mma.sync kernel; at 128 / 64 it is the first wgmma kernel, not compared yet)."""
    switch = os.environ.get(switch_var, "").strip()
    if switch not in ("", "0", "1"):
        raise ValueError(f"{switch_var}: expected 0 or 1 (or unset), got {switch!r}")
    dq, dv = pad_hdim(hdim_q, pad), pad_hdim(hdim_v, pad)
    if unsupported or dq not in hdims or dv not in hdims:
        return False
    if switch:
        return switch == "1"
    return (dq == dv or max(hdim_q, hdim_v) > 128) and max(hdim_q, hdim_v) >= WS_MIN_HDIM


def use_ws(hdim_q: int, hdim_v: int, *, bias: bool = False, dropout: bool = False,
           deterministic: bool = False) -> bool:
    """Whether a Hopper backward runs the warp-specialized kernel (``fmha_bwd_dq_dk_dv_sm90_ws``,
    which takes dropout (its DROPOUT build), and a bias only through TMA (:data:`BWD_WS_BIAS_HDIMS`)
    and not together with dropout: ``bias`` here means one it cannot take, see :func:`bwd_specs`): by
    default when both head dims round up (to a multiple of 64) to 64 or both to 128 (deterministic
    mode too, by ordered adds instead of slabs), where it measured 0.76-0.87 (hdim 128) and
    0.84-0.92 (hdim 64) of the time of ``fmha_bwd_dq_dk_dv_sm90`` (bench/NOTES.md step 22), with
    dropout 0.75 (hdim 128) and 0.77-0.78 (hdim 64; step 50); head dims that round up (72-120 ->
    128) leave the mma.sync kernel (step 45). ``CUPY_FMHA_BWD_WS=1`` takes it wherever it applies (unequal head dims too), ``=0``
    never (comparisons; the same switch governs the wide ws backward above 128, :func:`bwd_specs`,
    so ``=0`` sends those back to the mma.sync kernel too)."""
    return _ws_choice("CUPY_FMHA_BWD_WS", hdim_q, hdim_v, bias, SM90_HDIMS)


def use_fwd_ws(hdim_q: int, hdim_v: int, *, bias: bool = False) -> bool:
    """Whether a Hopper forward runs the warp-specialized kernel (``fmha_fwd_sm90_ws``, which takes
    dropout, and a bias only through TMA and without dropout: ``bias`` here means one it cannot
    take, see :func:`fwd_spec`'s ``bias_tma``): by default when both head dims round up (to a multiple of 64)
    to the same one of :data:`FWD_WS_HDIMS`. At 64 and 128 it measured 0.77-0.89 of the time of
    ``fmha_fwd_sm90`` (a tie at hdim 64, causal, seqlen 1024; bench/NOTES.md step 23); at 192 and 256,
    and at head dims that round up (96 -> 128, 160 -> 192, 224 -> 256), it replaces the mma.sync
    forward (bench/NOTES.md step 45). ``CUPY_FMHA_FWD_WS=1`` takes it wherever it applies (unequal
    head dims too), ``=0`` never (comparisons)."""
    return _ws_choice("CUPY_FMHA_FWD_WS", hdim_q, hdim_v, bias, FWD_WS_HDIMS)


def bwd_specs(dtype: str, hdim_q: int, hdim_v: int, cc: int = 80, *, alibi: bool = False,
              bias: bool = False, dropout: bool = False, deterministic: bool = False, bias_tma: int = 0,
              heads_x: int = 0, diagonal: bool = False) -> BwdSpecs:
    """Backward kernel instances for these head dims on a device of compute capability ``cc``
    (e.g. 90 for H100/H200: the wgmma kernel where it applies); ``alibi`` as in :func:`fwd_spec`;
    ``bias=True``: a dq_dk_dv instance that adds an elementwise bias and can write dS for dBias;
    ``dropout=True``: the ``-D DROPOUT=1`` build of dq_dk_dv (the other two kernels do not change);
    ``deterministic=True``: the instance for the dQ-slab mode (on the Hopper kernel at hdim 128,
    the build without the bulk dQ path; elsewhere the same instance). ``bias_tma``: as in
    :func:`fwd_spec` (a bias TMA can load: the warp-specialized backward takes it). ``heads_x``: the
    warp-specialized builds with the grid (nhead_q, key blocks, batch) and that start order
    (``-D HEADS_X=n``, for causal masks: :func:`use_heads_x`); the other kernels ignore it.
    ``diagonal``: :func:`use_bwd_ws_diagonal`'s decision (a short diagonal mask or a sliding window):
    the ws backward's :data:`BWD_WS_DIAGONAL_BY_HDIM` entries apply."""
    feats = feature_macros(alibi, bias, dropout)
    tma_bias = _check_bias_tma(bias_tma) if bias else 0
    # (with dropout at hdim 128 the wgmma backward spills 16-60 bytes at its 255 registers, and
    # still runs 1.6x faster than the mma.sync kernel, which must halve its query block to fit:
    # 5.30 against 8.47 ms at bf16, batch 4, 16 heads, seqlen 4096 on the H200; bench/NOTES.md)
    if use_sm90(hdim_q, hdim_v, cc):
        # dQ leaves through shared memory, one bulk reduce-add of the whole block into the tiled
        # workspace (DQ_BULK, the kernel's default): against per-thread atomics 2-4% faster at
        # hdim 64, and at hdim 128 3-5% faster than the per-row bulk copies it replaced (bench/
        # NOTES.md step 22). Per-thread atomics / stores instead with dropout, where the staging
        # pushed the hdim-128 spill past 64 bytes, and for the deterministic slabs, where bulk
        # stores (then one per row) measured 12% slower than plain ones (5.90 against 5.26 ms,
        # bench/features.py; not re-measured with one store per block).
        bulk = not dropout and not deterministic
        # two warpgroups of 64 keys; 64 query rows per step (GEMM4 splits dQ's columns in halves;
        # the ws kernel that replaces this one at hdim 64 and 128 has its own rows, BWD_WS_BY_HDIM)
        tiles = dict(NWG=2, BLOCK_N=128, BLOCK_M=64)
        if not bulk:
            tiles["DQ_BULK"] = 0
        tiles = _override("CUPY_FMHA_BWD_SM90_TILES", tiles)
        main = _mk("fmha_bwd_dq_dk_dv_sm90", dtype, "sm90a", HDIM_Q=pad_hdim(hdim_q), HDIM_V=pad_hdim(hdim_v),
                   **tiles, **feats)
    else:
        tiles = bwd_tiles(hdim_q, hdim_v, bias, dropout)
        dq, dv = padded_dims(hdim_q, hdim_v, tiles["NSPLIT"])
        main = _mk("fmha_bwd_dq_dk_dv", dtype, HDIM_Q=dq, HDIM_V=dv, **tiles, **feats)
    # the warp-specialized backward, where it applies (head dims rounding up to 64 or 128; wider ones
    # to multiples of 128 up to 256: the wide build), in place of either
    d = max(pad_hdim(hdim_q, 64), pad_hdim(hdim_v, 64))
    if (_wgmma_allowed(cc) and not (bias or dropout) and d > 128
            and _ws_choice("CUPY_FMHA_BWD_WS", hdim_q, hdim_v, False, BWD_WS_WIDE_HDIMS, pad=128)):
        wide = bwd_ws_wide_spec(dtype, hdim_q, hdim_v, alibi=alibi, heads_x=heads_x, deterministic=deterministic)
        if wide.macro("SMEM_BYTES") <= SMEM_LIMIT:  # (231,464 B at 256 / 256)
            main = wide
    if tma_bias and d not in BWD_WS_BIAS_HDIMS:
        tma_bias = 0  # (the older kernels, bias=True)
    # (a bias with dropout: no ws build, so the older kernel, as for a bias TMA cannot read)
    if (_wgmma_allowed(cc) and use_ws(hdim_q, hdim_v, bias=bias and (not tma_bias or dropout), dropout=dropout,
                                      deterministic=deterministic)
            and (not tma_bias or bwd_ws_tiles(d).get("SWIZZLE"))):
        ws = bwd_ws_spec(dtype, hdim_q, hdim_v, alibi=alibi, bias_tma=tma_bias, dropout=dropout, heads_x=heads_x,
                         deterministic=deterministic, diagonal=diagonal)
        if ws.macro("SMEM_BYTES") <= SMEM_LIMIT:  # (a bias ring that does not fit: the older kernel)
            main = ws
    return BwdSpecs(
        dot_do_o=_mk("fmha_bwd_dot_do_o", dtype, ROWS=8),
        dq_dk_dv=main,
        convert_dq=_mk("fmha_bwd_convert_dq", dtype, ROWS=16),
        convert_dq_split=_mk("fmha_bwd_convert_dq", dtype, ROWS=16, DQ_SPLIT=1),
    )


#: every combination of compile-time features the library dispatches to (the elementwise bias
#: and ALiBi exclude each other; dropout combines with either)
FEATURE_SETS = ({}, {"alibi": True}, {"bias": True},
                {"dropout": True}, {"dropout": True, "alibi": True}, {"dropout": True, "bias": True})


#: The warp-specialized backward's compile-time variants (kernels/fmha_bwd_dq_dk_dv_sm90_ws.cu), each
#: a 0/1 macro: SWIZZLE (K, V, Q, dO as 128-byte-swizzled tiles in boxes of 64 columns instead of
#: column-blocked tiles of 16-byte rows, as the forward's SWIZZLE). On by default: 1.02-1.06x the
#: column-blocked build at every point measured on the H200 (bench/NOTES.md step 30);
#: ``CUPY_FMHA_BWD_WS_TILES`` (e.g. ``SWIZZLE=0``) switches it for comparisons
#: (``bench/ab.py --env-b CUPY_FMHA_BWD_WS_TILES=SWIZZLE=0``). DESC_ADDR (the loop's wgmma descriptors
#: from one 32-bit shared-memory address plus constant offsets instead of the tile pointers; the same
#: descriptor values; bench/NOTES.md steps 102 and 104): no R2UR in the loop where the pointer-formed
#: dQ-writer builds took 60-67, and no spill where the 80-row build spilled 4 bytes; 0.95-1.02x the time
#: of the pointer-formed build at hdim 128 (0.97-0.99 at most points), 0.98-1.01 at 64 and 256, bf16 and
#: fp16, on an H100 (``bench/ab.py``, 3-5 rounds). bwd_ws_spec leaves it out of the bias and dropout
#: builds, which keep the pointers (the addresses spilled more there); ``DESC_ADDR=0`` for comparisons.
BWD_WS_VARIANTS = dict(SWIZZLE=1, DESC_ADDR=1)

#: The ws backward's entries by padded head dim, each chosen by measurement on the H200:
#: BLOCK_M (query rows per step) 128 at hdim 64, where GEMM4 then splits dQ by rows and stays at
#: N = 64 (1.09-1.24x the 64-row build, bench/NOTES.md step 35); 80 at hdim 128 (FlashAttention-3's
#: step there without a mask; 128 rows would need 320 KB of shared memory), where GEMM4 forms dQ^T
#: (kernels/fmha_bwd_dq_dk_dv_sm90_ws.cu, DQ_T), with SPLIT_PDS=2 (P formed while the dP GEMM runs;
#: SPLIT_PDS=1, which also issues the dV GEMM before dS exists, spills 108 bytes there and ptxas
#: serializes its wgmmas) and the dQ writer (DQ_WRITER=1: 4 bytes of spill, without it 20, and the build
#: without it measured 1.05-1.08x slower): 0.94-0.98x the time of the 64-row build without a mask
#: at s2048-16384 (bf16, FlashAttention's grid, `bench/ab.py` on an H100, step 100). LSE2 (0/1: the
#: producer stores the LSE in log2 units) at hdim 64 only: 1.01-1.03x there, 0.96-1.0x at hdim 128
#: (step 36). bwd_ws_spec keeps 64 rows at hdim 128 in the column-blocked build, and 80 rows only
#: where hdim_q pads to 128, whatever ``CUPY_FMHA_BWD_WS_TILES`` asks.
BWD_WS_BY_HDIM = {64: dict(BLOCK_M=128, LSE2=1), 128: dict(BLOCK_M=80, SPLIT_PDS=2, DQ_WRITER=1)}
#: ... and with dropout (the DROPOUT build, whose warps make their own keep bits, 64 or 128 rows: its
#: keep-word tile), over those: at hdim 128 64 rows. At hdim 64 the 128-row build spills 64-128 bytes
#: (the 64-row one none) and still measured 1.05-1.06x faster (bf16 b4 h16 s4096: 2.76 against 2.90 ms,
#: causal 1.57 against 1.64; bench/NOTES.md step 50)
BWD_WS_DROPOUT_BY_HDIM: dict[int, dict[str, int]] = {128: dict(BLOCK_M=64)}
#: ... and where :func:`use_bwd_ws_diagonal` says (a mask with a diagonal over at most
#: :data:`BWD_WS_DIAGONAL_SEQLEN_K` keys, or a sliding window), or hdim_q pads below hdim_v (80 rows
#: need hdim_q 128), over :data:`BWD_WS_BY_HDIM`'s (before dropout's): at hdim 128 the 64-row build
#: with SPLIT_PDS=1 (P formed, and the dV GEMM issued, while the dP GEMM runs: 1.02-1.03x, step 57),
#: no dQ writer in atomic mode (1.01-1.1x the time with it, step 100; deterministic mode takes it,
#: :data:`BWD_WS_DQ_WRITER`). Causal, 80 rows measured 1.02 / 1.00 / 0.97 / 0.94x the time of these at
#: s2048 / 4096 / 8192 / 16384 (step 100).
BWD_WS_DIAGONAL_BY_HDIM: dict[int, dict[str, int]] = {128: dict(BLOCK_M=64, SPLIT_PDS=1, DQ_WRITER=0)}
#: the longest seqlen_k (the max in group mode) at which a causal mask takes :data:`BWD_WS_DIAGONAL_BY_HDIM`
BWD_WS_DIAGONAL_SEQLEN_K = 4096


def use_bwd_ws_diagonal(diagonal: bool, causal: bool, seqlen_k: int) -> bool:
    """Whether the ws backward should take :data:`BWD_WS_DIAGONAL_BY_HDIM`'s entries: a mask with a
    diagonal (``diagonal``) that is a sliding window (not ``causal``: the window's left side does not
    reach every query row, so a key block sees few query blocks) or covers at most
    :data:`BWD_WS_DIAGONAL_SEQLEN_K` keys (``seqlen_k``: the max in group mode)."""
    return bool(diagonal) and (not causal or seqlen_k <= BWD_WS_DIAGONAL_SEQLEN_K)


#: padded head dims at which the ws backward takes the elementwise bias (its BIAS build). At hdim
#: 128 its MMA warpgroups spill 80 bytes (240 registers, offline) and it still measured 3.8x faster
#: than fmha_bwd_dq_dk_dv_sm90 (bf16 b4 h16 s4096: 3.77 against 14.44 ms, with dBias 5.40 against
#: 15.55; bench/NOTES.md step 52); an fp32 bias there (232,456 bytes of shared memory) stays on it
BWD_WS_BIAS_HDIMS = (64, 128)


#: Where the ws backwards build the dQ writer by default (``DQ_WRITER=1``: a producer thread adds the
#: dQ tiles and waits for the ordered adds' turns instead of an MMA thread; bench/NOTES.md steps 75-76),
#: by dQ mode ("atomic", "deterministic"): the padded head dims (64, 128: fmha_bwd_dq_dk_dv_sm90_ws;
#: 256: the wide build, by its larger head dim), by measurement on the H200 (bench/NOTES.md step 83,
#: ``bench/probe/time78_gpu.sh``, bf16 b4 h16 s4096): deterministic mode 1.15-1.19x the atomic backward
#: with the writer against 1.44-1.52x without (hdim 64, 128), the wide backward 0.88-0.91x the time
#: at s2048-8192 causal and not; not in atomic mode at 128 with 64 rows (1.02x the time) or 64 (0.99x,
#: and its build's wgmma descriptors leave the uniform registers: 60 R2UR, tests/test_bwd_ws_sass.py);
#: the 80-row build at 128 takes it in both modes (its :data:`BWD_WS_BY_HDIM` entry, step 100).
#: ``CUPY_FMHA_BWD_WS_TILES`` / ``CUPY_FMHA_BWD_WS_WIDE_TILES`` (``DQ_WRITER=0`` or ``=1``) override it.
BWD_WS_DQ_WRITER: dict[str, tuple[int, ...]] = {"atomic": (256,), "deterministic": (64, 128, 256)}


def _dq_writer_default(hdim: int, deterministic: bool) -> dict[str, int]:
    return {"DQ_WRITER": 1} if hdim in BWD_WS_DQ_WRITER["deterministic" if deterministic else "atomic"] else {}


def bwd_ws_tiles(hdim: int, dropout: bool = False, deterministic: bool = False,
                 diagonal: bool = False) -> dict[str, int]:
    """The ws backward's table entries at padded head dim ``hdim``: two MMA warpgroups of 64 keys,
    the entries of :data:`BWD_WS_BY_HDIM` (with ``diagonal``, a mask with a diagonal, those of
    :data:`BWD_WS_DIAGONAL_BY_HDIM` over them; with ``dropout`` those of :data:`BWD_WS_DROPOUT_BY_HDIM`
    over those), and the variant macros that are on (:data:`BWD_WS_VARIANTS`, then
    ``CUPY_FMHA_BWD_WS_TILES``); 0/1 macros at 0 are left out, so the default instances keep their
    names and code. Besides the table's entries the variable takes DQ_WRITER=0/1 (the dQ writer
    thread, bench/NOTES.md step 76; by default where :data:`BWD_WS_DQ_WRITER` says for the dQ mode,
    ``deterministic``; :func:`bwd_ws_spec` leaves it out of the bias and dropout builds)."""
    tiles = _override("CUPY_FMHA_BWD_WS_TILES",
                      {**dict(NWG=2, BLOCK_N=128, LSE2=0), **BWD_WS_BY_HDIM[hdim],
                       **(BWD_WS_DIAGONAL_BY_HDIM.get(hdim, {}) if diagonal else {}),
                       **(BWD_WS_DROPOUT_BY_HDIM.get(hdim, {}) if dropout else {}), **BWD_WS_VARIANTS,
                       **_dq_writer_default(hdim, deterministic)})
    switches = {"LSE2", "SPLIT_PDS", "DQ_WRITER", "DESC_ADDR", *BWD_WS_VARIANTS}
    unknown = set(tiles) - {"NWG", "BLOCK_N", "BLOCK_M", "STAGES", "TIMING", "HEADS_X", *switches}
    if unknown:
        raise ValueError(f"CUPY_FMHA_BWD_WS_TILES: unknown entries {sorted(unknown)}")
    return {k: v for k, v in tiles.items() if v or k not in switches}


def bwd_ws_spec(dtype: str, hdim_q: int, hdim_v: int, *, alibi: bool = False,
                tiles: dict[str, int] | None = None, bias_tma: int = 0, dropout: bool = False,
                heads_x: int = 0, deterministic: bool = False, diagonal: bool = False) -> KernelSpec:
    """The warp-specialized Hopper backward (``fmha_bwd_dq_dk_dv_sm90_ws``: a producer warpgroup
    loading with TMA, two MMA warpgroups) for head dims rounding up (to a multiple of 64) to 64 and
    128 (:func:`use_ws` says when it is dispatched). ``dropout``: the build whose warps make their
    own keep bits (``-D DROPOUT=1``; not with a bias). ``bias_tma`` 2 or 4: the build with an
    elementwise bias of 16-bit or fp32 elements loaded through TMA (``-D BIAS=1 -D BIAS_TMA=n``;
    needs the swizzled tiles; 64 query rows per step, where the bias tiles fit); 0 none.
    ``tiles``: the table entries (default :func:`bwd_ws_tiles`, for the dQ mode ``deterministic`` and
    the mask's ``diagonal``).
    ``heads_x``: the ``-D HEADS_X=n``
    build (n >= 1: grid (nhead_q, key blocks, batch), :func:`use_heads_x`), unless the tile variable
    sets HEADS_X itself (for comparisons).

    Raises:
        ValueError: ``bias_tma`` not 0, 2 or 4, a bias with tiles that are not swizzled, a bias
            with dropout, or a BLOCK_M other than 64, 80 or 128."""
    dq, dv = pad_hdim(hdim_q, 64), pad_hdim(hdim_v, 64)
    d = max(dq, dv)
    # (hdim_q padding below hdim_v: the 64-row entries, as under a short diagonal; 80 rows need hdim_q 128)
    tiles = dict(bwd_ws_tiles(d, dropout, deterministic, diagonal or dq < d) if tiles is None else tiles)
    if ((tiles.get("BLOCK_M") == 80 and (dq != 128 or dv > 128 or bias_tma or dropout or not tiles.get("SWIZZLE")))
            or (tiles.get("BLOCK_M") == 128 and d > 64)):
        # (80 rows: GEMM4 as dQ^T, whose M is the warpgroup's half of hdim_q, so hdim_q 128 only, swizzled;
        # 231,720 bytes of shared memory at 128 / 128; the keep-word and bias tiles assume 64 or 128
        # rows; 128 rows at hdim 128 would need 320 KB): the 64-row entries instead, as under a short
        # diagonal mask
        tiles.update(BWD_WS_DIAGONAL_BY_HDIM.get(d, {}), BLOCK_M=64, **_dq_writer_default(d, deterministic))
        tiles = {k: v for k, v in tiles.items() if v or k not in ("SPLIT_PDS", "DQ_WRITER")}
    feats = _ws_feats("fmha_bwd_dq_dk_dv_sm90_ws", tiles, alibi, bias_tma, dropout)
    if bias_tma:
        if dropout:
            raise ValueError("fmha_bwd_dq_dk_dv_sm90_ws: no build with both the bias and dropout")
        tiles["BLOCK_M"] = 64  # (at 128 rows the bias tile does not fit beside the rest)
    if bias_tma or dropout:
        tiles.pop("SPLIT_PDS", None)  # (those builds form P and dS together: the same code, one name)
        tiles.pop("DQ_WRITER", None)  # (built without the bias or dropout)
        tiles.pop("DESC_ADDR", None)  # (the pointer-formed descriptors there: the same code, one name)
    if tiles.get("BLOCK_M", 64) not in (64, 80, 128):
        raise ValueError(f"fmha_bwd_dq_dk_dv_sm90_ws: BLOCK_M must be 64, 80 or 128, got {tiles['BLOCK_M']}")
    if not tiles.get("SWIZZLE"):
        # (the column-blocked build keeps the 64 rows of the step-30 comparison build, which at hdim 64
        # also needs LSE2=0)
        tiles["BLOCK_M"] = 64
    if (dropout or bias_tma) and heads_x > 1:
        heads_x = 0  # (the grouped start order's index arithmetic spills in these builds, at their limit)
    if heads_x and "HEADS_X" not in tiles:
        tiles["HEADS_X"] = int(heads_x)
    return _mk("fmha_bwd_dq_dk_dv_sm90_ws", dtype, "sm90a", HDIM_Q=dq, HDIM_V=dv, **tiles, **feats)


#: Longest seqlen_k (the max in group mode) for which the ws backwards under a causal mask take
#: the ``HEADS_X=1`` build (grid (nhead_q, key blocks, batch): the heavy key blocks of every head
#: start first). Measured on the H200 (bench/NOTES.md step 61, bf16, FlashAttention's grid, time
#: against the key-blocks-first grid): causal 0.96-0.98 at 2048-4096 at every head dim, 0.97 at 1024
#: at hdim 256; 0.99-1.05 at 8192 and 1.01-1.04 at 16384 (fewer heads share L2), and slower
#: without a mask from 4096 (1.02-1.06), so only causal masks up to this length.
BWD_WS_HEADS_X_SEQLEN_K = 4096
#: ... and up to this length, the ``HEADS_X`` = :data:`BWD_WS_HEADS_GROUP` build: the heavy key
#: blocks first within groups of that many heads, so the CTAs running together stay within a few
#: heads' Q and dO (at 8192 keys a head has 64 CTAs of 128 keys: two heads fill the 132 SMs about
#: once). A model of the CTAs' list scheduling (2.2 us per 64-row step, 4 us per CTA) gives the same
#: 5% shorter tail at 8192 keys as every head first, which measured 0.99-1.05 there (bench/NOTES.md
#: steps 61, 65); at 16384 neither order shortens the tail by more than 0.3% in that model
BWD_WS_HEADS_GROUP, BWD_WS_HEADS_GROUP_SEQLEN_K = 2, 8192


#: head dims (each rounded up to a multiple of 128) the wide ws backward is built for
#: (``fmha_bwd_dq_dk_dv_sm90_ws_wide``: each MMA warpgroup half of dK, dV and dQ's columns)
BWD_WS_WIDE_HDIMS = (128, 256)


def bwd_ws_wide_spec(dtype: str, hdim_q: int, hdim_v: int, *, alibi: bool = False,
                     heads_x: int = 0, variant: dict[str, int] | None = None,
                     deterministic: bool = False) -> KernelSpec:
    """The warp-specialized Hopper backward for wide head dims (``fmha_bwd_dq_dk_dv_sm90_ws_wide``:
    64 keys per CTA, 64 query rows per step, the two MMA warpgroups splitting GEMM0/2 by query rows
    and GEMM1/3/4 by head-dim columns, so that dK and dV of hdim 256 fit in registers); head dims
    rounded up to a multiple of 128 (at most 256; :func:`bwd_specs` takes it only when one of them is
    above 128); no dropout or bias. ``CUPY_FMHA_BWD_WS_WIDE_TILES`` (e.g.
    ``DQ_STAGE=0``, ``DQ_WRITER=1``; kernels/fmha_bwd_dq_dk_dv_sm90_ws_wide.cu) switches its
    variants for comparisons; ``variant`` (entries of the same kind) builds one directly
    (:data:`BWD_WS_WIDE_BUILDS`). ``heads_x``: as in :func:`bwd_ws_spec`. The dQ writer by default
    where :data:`BWD_WS_DQ_WRITER` says for the dQ mode, ``deterministic`` (its key: the larger head
    dim rounded up to 128)."""
    d = max(pad_hdim(hdim_q, 128), pad_hdim(hdim_v, 128))
    tiles = _override("CUPY_FMHA_BWD_WS_WIDE_TILES",
                      {**dict(NWG=2, BLOCK_N=64, BLOCK_M=64, SWIZZLE=1), **_dq_writer_default(d, deterministic),
                       **(variant or {})})
    if not tiles.get("DQ_WRITER", 1):
        tiles.pop("DQ_WRITER")  # (off: the default build's name)
    unknown = set(tiles) - {"NWG", "BLOCK_N", "BLOCK_M", "SWIZZLE", "STAGES", "DQ_STAGE", "DQ_WRITER", "HEADS_X", "TIMING"}
    if unknown:
        raise ValueError(f"CUPY_FMHA_BWD_WS_WIDE_TILES: unknown entries {sorted(unknown)}")
    if tiles.get("STAGES", 2) < 2:
        raise ValueError("CUPY_FMHA_BWD_WS_WIDE_TILES: STAGES must be at least 2 (a stage goes back a block late)")
    if heads_x and "HEADS_X" not in tiles:
        tiles["HEADS_X"] = int(heads_x)
    return _mk("fmha_bwd_dq_dk_dv_sm90_ws_wide", dtype, "sm90a", HDIM_Q=pad_hdim(hdim_q, 128),
               HDIM_V=pad_hdim(hdim_v, 128), **tiles, **feature_macros(alibi, False, False))


def with_switch(tiles: dict[str, int], key: str, value: int) -> dict[str, int]:
    """``tiles`` with the switch ``key`` set to ``value``; at 0 the switch is left out, as the tile
    functions leave it, so the instance keeps the name of the build without it."""
    out = {k: v for k, v in tiles.items() if k != key}
    return {**out, key: value} if value else out


def flip_switch(tiles: dict[str, int], key: str) -> dict[str, int]:
    """``tiles`` with the 0/1 switch ``key`` in the other position (:func:`with_switch`): the comparison
    build of a table entry, e.g. the ws kernels' DESC_ADDR (wgmma descriptors from one 32-bit address or
    from the tile pointers; the same values, bench/NOTES.md steps 102-104) or the forward's ALIGN_END."""
    return with_switch(tiles, key, 0 if tiles.get(key) else 1)


#: the ws backward's variant builds compiled offline besides the default (experimental_table)
BWD_WS_BUILDS = (dict(), dict(SWIZZLE=1, BLOCK_M=64), dict(DESC_ADDR=1))  # (the last: DESC_ADDR on column-blocked tiles)

#: the wide ws backward's variant builds compiled offline besides the default (experimental_table):
#: without the dQ writer warp (MMA thread 0 adds dQ, the build before bench/NOTES.md step 75; the writer is
#: the default in both dQ modes since step 83, BWD_WS_DQ_WRITER), for comparisons
BWD_WS_WIDE_BUILDS = (dict(DQ_WRITER=0),)


#: The warp-specialized forward's pipeline variants (kernels/fmha_fwd_sm90_ws.cu, issue 11 second
#: step), each a 0/1 macro: SWIZZLE (128-byte-swizzled tiles in boxes of 64 columns instead of
#: column-blocked tiles of 16-byte rows), PV_OVERLAP (softmax of block j under P_{j-1} V_{j-1}),
#: PINGPONG (the MMA warpgroups take turns on the tensor cores; needs PV_OVERLAP). All three
#: on by default: the fastest of the variants at every point measured on the H200 (bench/NOTES.md
#: step 27: 1.08-1.11x the column-blocked build at hdim 64, 1.43-1.51x at hdim 128).
#: ``CUPY_FMHA_FWD_WS_TILES`` (e.g. ``SWIZZLE=1,PV_OVERLAP=0,PINGPONG=0``; all three at 0 is the
#: first ws forward) switches them for comparisons.
FWD_WS_VARIANTS = dict(SWIZZLE=1, PV_OVERLAP=1, PINGPONG=1)


#: The ws forward's entries by padded head dim, chosen by measurement on the H200: NWG=3 at hdim 64
#: (three MMA warpgroups, 192 query rows per CTA at 160 registers each, FlashAttention-3's hdim-64
#: shape): 0.88-0.92x the time of two without a mask from s2048, 0.95-0.96 causal from s8192 (bench/NOTES.md
#: step 67; the fp32 bias and bias-with-ALiBi builds take two, FWD_WS_BIAS_BY_HDIM, and so did short diagonal masks
#: until step 118, FWD_WS_SHORT_BY_HDIM; the dropout builds take two taking turns, FWD_WS_DROPOUT_BY_HDIM); 96-key blocks with three measured 0.96-1.21x the time of 128. FOLD (0/1: the
#: softmax scale folded into one FFMA per exponent, softmax_p_folded) at hdim 64 only: 1.01-1.04x
#: there, 0.93-1.02x at hdim 128 (bench/NOTES.md step 37). O_REG (0/1: O stored from the registers
#: instead of through the shared-memory stage and bulk row copies, O_STAGE) at hdim 64: the stage
#: measured 0.5-8% slower there (about 0.6 us per row block; not the lanes' serialized issue, which a
#: second version ruled out; the cause is not pinned down) and 0.5-5% faster at 128 (step 63); at 192/256 (equal head dims) the stage does not fit
#: (derived_macros), while the unequal pairs (192, 128), (256, 128) and (128, 256) take it (tested,
#: not timed).
#: At 192 and 256 the key blocks are as long as shared memory allows with two stages of K and V
#: beside Q (112 and 80 keys: 222,288 and 230,480 bytes); FlashAttention-3 takes 80 at 256 too.
#: 128 keys at 128: 144-192 measured 2-13% slower (step 62), 176 and 192 on today's pipeline 0.5-3% slower without a mask
#: and 3-22% causal at s1024 (step 111, an H100). O_IN_Q at 256 (O staged in the
#: warpgroup's rows of Q's buffer, then 16-byte stores of whole rows): 0.95-1.00x the time (step 86);
#: at 64 1.00-1.07x, so not there. O_IN_KV (bench/NOTES.md rows 127-128): O staged in the last
#: key block's K and V tiles instead, so Q goes back after the last S GEMM and the next row block's Q loads
#: under the epilogue (row 124: at 256 it waited 1.50 us for O_IN_Q's hand-back); where it applies (the overlapped
#: pipeline's two warpgroups; fwd_ws_spec drops it elsewhere and drops O_IN_Q where it applies). The table's at 192,
#: where O left from the registers: 0.90-0.99x the time at s1024-4096 (bf16 / fp16, causal and not), 0.99-1.03 at
#: 8192-16384 (an H100); ALiBi at 192 takes it too (tested, not timed). Not at 256: 0.97-0.99x at s1024-2048 against
#: O_IN_Q, 0.99-1.03 from 4096. DESC_ADDR (the loop's wgmma descriptors from one 32-bit address plus
#: constant offsets, the same values; bench/NOTES.md steps 103-104) at 192 and 256, whose pointer-formed
#: builds move their Q and K descriptors over with 34-112 R2UR in the loop: 0.95-1.00x the time there
#: (bf16, s1024-16384, causal and not, an H100, 3 rounds); at 64 and 128, where the pointer-formed
#: descriptors are uniform already, 0.95-1.08 (within the tool's spread), so not there.
#: The softmax at 64, 128 and 256 (bench/NOTES.md step 113, an H100, bf16 / fp16, s1024-16384, causal and not):
#: FOLD with SMAX_TREE (the folded form's sign test around the whole step, so the row slots' code is not split)
#: and LAZY_RESCALE=8 (O rescaled only when a row's maximum moved by more than 2^8, FlashAttention-4's
#: conditional rescale) measured 0.92-0.94x the time at 128 without a mask (0.86-1.02 causal, the slower ones
#: at s1024-2048), 0.90-0.98x at 256; at 64 (FOLD there already) SMAX_TREE with LAZY_RESCALE 0.89-0.94x
#: without a mask, 0.91-0.95 causal from s4096, 0.99-1.00 causal below (the short-diagonal build). Each
#: alone measured less (FOLD+SMAX_TREE 0.95-0.99 at 128, LAZY_RESCALE 0.96-1.02). At 192 the three measured
#: 0.94-0.96x without a mask and 0.91-0.96x causal (step 115, an H100, bf16, s1024-16384).
#: MASK_ROWS=2 (an edge tile's mask test from each row's visible columns, the lower bound only where it crosses)
#: at 64 and 128: 0.96-0.99x the time causal at 64, 0.97-1.00x at 128 (step 115, an H100, bf16, s1024-16384; step
#: 91 had measured 0.96-1.05 before the loop got faster); not at 192 (untimed) or 256 (it spills 4 bytes there).
#: ALIGN_END at 64 (row blocks counted back from each sequence's end, so the partial 192-row block is the first rows'
#: instead of the last: under a causal mask the lightest block instead of the heaviest; bench/NOTES.md step 118, an
#: H100, bf16): 0.944x the time causal at s4096 (the work model: 0.945), 0.985 at 8192, 1.015 at 16384, 0.98-1.01
#: without a mask; with it three warpgroups also under short diagonal masks (FWD_WS_SHORT_BY_HDIM). Not at 128-256,
#: whose 128-row blocks see as many key blocks either way where keys come in blocks of 128 (untimed at 192 / 256).
FWD_WS_SOFTMAX = dict(FOLD=1, SMAX_TREE=1, LAZY_RESCALE=8)
#: WG_SKIP (MMA warpgroups leave out the key blocks none of their rows sees; batch mode) at 64 and 256 (bench/NOTES.md
#: row 130, an H100, bf16, bench/ab.py best of 3): at 64 0.944-0.993x the time at s1024-4096, causal or not (the partial
#: first 192-row block's warpgroups with no rows in the sequence compute nothing, and under a causal mask the first
#: warpgroups stop before the diagonal's last blocks), at 256 causal 0.987-0.989 (warpgroup 0 stops one 80-key block
#: early), 1.000 without a mask; at 128 (aligned 128-row and 128-key blocks: nothing to leave out at those lengths)
#: 1.003-1.013, so not there; with ALiBi at 64 as the plain build (tested, untimed)
FWD_WS_BY_HDIM = {64: dict(NWG=3, O_REG=1, MASK_ROWS=2, ALIGN_END=1, WG_SKIP=1, **FWD_WS_SOFTMAX),
                  128: dict(MASK_ROWS=2, **FWD_WS_SOFTMAX),
                  192: dict(BLOCK_N=112, DESC_ADDR=1, O_IN_KV=1, **FWD_WS_SOFTMAX),
                  256: dict(BLOCK_N=80, O_IN_Q=1, DESC_ADDR=1, WG_SKIP=1, **FWD_WS_SOFTMAX)}
#: ... and with ALiBi, where the MMA warpgroups' registers run out: at 256 the overlapped pipeline
#: spills (20 bytes at 240 registers, offline), the serial one does not (191)
FWD_WS_ALIBI_BY_HDIM = {256: dict(PV_OVERLAP=0, PINGPONG=0)}
#: ... and with dropout, where each MMA thread also computes its keep bits (bench/NOTES.md step 48):
#: the serial pipeline from hdim 128 on, where the overlapped one spilled with 16-bit draws (44-196
#: bytes) and the serial one measured fastest at 128 (2.33 ms against 2.35-2.39 for 64/96-key
#: overlapped builds, bf16 s4096 b4 h16); with 8-bit draws the overlapped one spills 0 bytes at 128
#: (ALiBi 32, 192: 60, 256: 80) and is still 5% slower there (step 69; with 7 Philox rounds serial
#: and ping-pong within 1%, step 73); 96-key blocks at 192 (80: 11% slower; overlapped 64: within 1%, but spills
#: with ALiBi); at 64 two MMA warpgroups taking turns (ping-pong), as without dropout before step 67:
#: with the cheaper keep mask of step 73 they measured 0.89-0.97x the time of three serial ones
#: (step 71's choice at 10 rounds, 0.92-0.93x the two then) at s1024-16384, causal and not, except
#: 1.01x non-causal at s4096 (bench/NOTES.md step 74); at 128 three with 64- or 80-key blocks were
#: not faster (step 71). Since step 96's shorter keep work, hdim 128 takes the plain build's overlapped
#: ping-pong pipeline: 0.94-0.97x the serial one's time on the H200 at s1024-16384, causal and not
#: (0.90-0.96x at s16384; step 97), 0 spills with ALiBi too
#: FOLD=0 in each: the folded softmax takes dropout since step 114 (a variant: FOLD=1 in CUPY_FMHA_FWD_WS_TILES; the
#: serial pipeline at 192 / 256 does not fold), and measured 0.98-1.01x the time at 64 and 128 (step 115, an H100):
#: the dropout loop is held by its Philox work, not by the softmax's issue, so the builds keep the scaled form.
#: At 64 also step 113's tree maxima and lazy rescale off: with them the dropout forward measured 1.00-1.03x the time
#: of the softmax before step 113 at all six points (s1024 / 4096 / 16384, causal and not; at 128 0.98-1.03, mixed)
#: KEEP_SINK at 64 (step 116): the keep decisions made inside the softmax, where ptxas interleaves their Philox work with
#: the exponentials, measured 0.89-0.92x the dropout forward's time there (an H100, s1024-16384, causal and not; 1.69-1.71x
#: plain -> 1.55x in features.py's shape); at 128 0.98-1.01x (within the spread). KEEP_SINK=2 at 128 (step 117: the first
#: half of each key block's 32-key spans under the S GEMM, the second inside the softmax) measured 0.88-0.96x the dropout
#: forward's time (drop_ws.py, an H100, s1024-16384, causal and not; s4096 1.24 -> 1.17 ms, 1.50 -> 1.41x plain)
#: ALIGN_END=0 at 64 (step 118 is for the 192-row blocks; on this build's 128-row ones it measured 1.01-1.04x the time,
#: drop_ws.py on an H100, s1024-16384, causal and not); WG_SKIP=0 there (bench/NOTES.md row 131, an H100: 1.06-1.09x
#: the dropout time at 128, 0.99-1.01 at 64)
FWD_WS_DROPOUT_BY_HDIM = {64: dict(NWG=2, FOLD=0, SMAX_TREE=0, LAZY_RESCALE=0, KEEP_SINK=1, ALIGN_END=0, WG_SKIP=0),
                          128: dict(FOLD=0, KEEP_SINK=2),
                          192: dict(BLOCK_N=96, PV_OVERLAP=0, PINGPONG=0, FOLD=0),
                          256: dict(PV_OVERLAP=0, PINGPONG=0, FOLD=0)}
#: ... and with an elementwise bias (the TMA bias builds), by the bias element's bytes (2: fp16/bf16,
#: 4: fp32): at hdim 64 the bias goes into S's accumulator (BIAS_ACC), and the 16-bit bias takes three
#: MMA warpgroups as the plain build does (0 spills with BIAS_ACC, step 90; measured -5.6% and -5.4% against
#: two on an H100, steps 91 and 92; not yet on the H200), the fp32 bias two: three spill 132 bytes there;
#: the 16-bit one without SMAX_TREE (FWD_WS_SOFTMAX's tree maxima spill 240 bytes there, step 113)
#: At 128 the 16-bit bias takes BIAS_ACC too (step 119, an H100, features.py bf16 b4 h16 s4096: 1.154 / 1.173 ms ->
#: 1.124 / 1.128, 1.40 -> 1.36x plain; its softmax then the folded one); the fp32 bias there is untimed, so not it
FWD_WS_BIAS_BY_HDIM = {64: {2: dict(NWG=3, BIAS_ACC=1, SMAX_TREE=0), 4: dict(NWG=2, BIAS_ACC=1)}, 128: {2: dict(BIAS_ACC=1)}}
#: ... and with both a bias and ALiBi: two MMA warpgroups at hdim 64 (three spill 380-576 bytes)
FWD_WS_BIAS_ALIBI_BY_HDIM = {64: dict(NWG=2)}
#: ... and under a diagonal mask over at most FWD_WS_SHORT_SEQLEN query rows (use_fwd_ws_short): two
#: MMA warpgroups at hdim 64, where three measured 1.15-1.19x the time at causal s1024 and 1.00-1.02x
#: at s2048 (192-row blocks: 5.3 per 1024 rows, the last one a third full, and more of each block
#: on the diagonal), against 0.99-1.00 at causal s4096, 0.95-0.96 from s8192 and 0.88-0.92 without a
#: mask from s2048 (bench/NOTES.md step 67; batch mode; group mode takes the same rule, not measured);
#: with dropout the same build as without a short mask (two ping-pong warpgroups, step 74; the
#: pipeline entries here kept it so while step 71 had three serial ones for long masks). Empty since step 118: with
#: ALIGN_END (the partial 192-row block the first rows', the lightest under a causal mask) three warpgroups measured
#: 0.99x the two-warpgroup build's time at causal s1024 and 0.92x at 2048 (an H100, bf16 and fp16; without ALIGN_END
#: 1.10x and 0.95x), so hdim 64 takes its one build under every mask; the bias builds follow (untimed under short
#: masks). The mechanism stays for other head dims' short builds.
FWD_WS_SHORT_BY_HDIM: dict[int, dict[str, int]] = {}
FWD_WS_SHORT_SEQLEN = 2048


#: The ws forward's row blocks per CTA (PERSIST; the kernel is the same for every count, only the
#: grid changes) by the row blocks of one (batch, head): (at most this many row blocks, per CTA),
#: first match. Measured on the H200 (bench/NOTES.md step 39, bf16, FlashAttention's grid): 4 per
#: CTA at seqlen 1024 (8 row blocks) 1.04-1.11x one per CTA, 2 at seqlen 2048 1.01-1.04x; from
#: seqlen 4096 on one per CTA (2: 0.98-1.02x at 4096, 0.94x causal at 8192, 4: 0.90x at 8192).
#: Counted in row blocks, measured with 128 rows each: the 192-row blocks of hdim 64 (NWG=3) get 4
#: per CTA up to seqlen 1536 and 2 up to 3072; step 67's A/B timed that as it is, no other count.
#: At hdim 128 (step 115, an H100, bf16, b16 h16): 2 per CTA at seqlen 1024 measured 0.945x the time of 4 without a
#: mask and 0.98x causal (8: 1.32-1.54x); at 2048, 1 and 4 measured 1.00-1.02x of 2; at hdim 64 2 at seqlen 1024 was
#: 1.02x of 4, so the other head dims keep FWD_WS_PERSIST (192 and 256 untimed).
FWD_WS_PERSIST = ((8, 4), (16, 2))
FWD_WS_PERSIST_BY_HDIM = {128: ((16, 2),)}
#: ... and only while the grid keeps at least this many CTAs (three waves of a 132-SM H100/H200),
#: so a small batch is not left on a few SMs
FWD_WS_PERSIST_MIN_CTAS = 396


def fwd_ws_persist(row_blocks: int, batch_heads: int, hdim: int = 0) -> int:
    """Row blocks per CTA of the ws forward by default (:data:`FWD_WS_PERSIST`, or at padded head dim
    ``hdim`` :data:`FWD_WS_PERSIST_BY_HDIM`'s entry): ``row_blocks`` per (batch, head), ``batch_heads`` =
    batch * nhead_q; 0 is one per CTA (the plain grid)."""
    for most, per in FWD_WS_PERSIST_BY_HDIM.get(hdim, FWD_WS_PERSIST):
        if row_blocks <= most and -(-row_blocks // per) * batch_heads >= FWD_WS_PERSIST_MIN_CTAS:
            return per
    return 0


#: variants of the ws forward removed after their measurements (bench/NOTES.md steps 80-81, 84-85, 88;
#: ROWSUM_MMA, the row sums by a 72-wide P V GEMM at hdim_v 64: step 89, no gain on an H100 in step 91;
#: KEEP_RING, dropout keep decisions made by the producer warpgroup's idle warps: step 99, slower at every
#: share of the calls, on an H100 and the H200; the build is commit d6d5747; O_WRITER, O's staged rows sent
#: by a producer-warpgroup thread: step 106, 0.99-1.02x the time at hdim 128 and 1.03-1.08x at 64 on an H100,
#: no gain at 16 row blocks per CTA either (step 109); XRB, the next row block's S_0 under this one's last
#: P V with two Q buffers: step 109, 1-2% slower on an H100; both builds are commit c61a27c; LINEAR, a persistent
#: grid of n CTAs walking every (batch, head, row block): step 110, 0.998-1.07x the time without a mask and
#: 1.04-1.58x causal at hdim 128 on the H200, the same DRAM bytes as one row block per CTA; its build is commit 97f2a53):
#: asking for one is an error rather than a build that quietly is the default
FWD_WS_REMOVED = ("Q_EARLY", "TURN_CARRY", "Q_STAGES", "O_VEC", "CLUSTER", "ROWSUM_MMA", "KEEP_RING", "O_WRITER", "XRB", "LINEAR")


def fwd_ws_tiles(hdim: int, alibi: bool = False, dropout: bool = False, bias_tma: int = 0,
                 short: bool = False) -> dict[str, int]:
    """The ws forward's table entries at padded head dim ``hdim``: two MMA warpgroups (three at 64), 128-key
    blocks, the entries of :data:`FWD_WS_BY_HDIM`, the variant macros that are on
    (:data:`FWD_WS_VARIANTS`; with ``alibi`` less those :data:`FWD_WS_ALIBI_BY_HDIM` turns off,
    with ``dropout`` those :data:`FWD_WS_DROPOUT_BY_HDIM` does, with ``bias_tma`` (the TMA bias builds:
    2 or 4 bytes per bias element, 0 none) :data:`FWD_WS_BIAS_BY_HDIM`'s for those bytes, and with ALiBi
    too :data:`FWD_WS_BIAS_ALIBI_BY_HDIM`'s, with ``short`` (:func:`use_fwd_ws_short`'s decision: a diagonal mask
    over few query rows) :data:`FWD_WS_SHORT_BY_HDIM`'s), then ``CUPY_FMHA_FWD_WS_TILES``;
    0/1 macros at 0 are left out, so the default instances keep their names."""
    tiles = _override("CUPY_FMHA_FWD_WS_TILES", {**dict(NWG=2, BLOCK_N=128, FOLD=0), **FWD_WS_BY_HDIM[hdim],
                                                     **FWD_WS_VARIANTS,
                                                     **(FWD_WS_ALIBI_BY_HDIM.get(hdim, {}) if alibi else {}),
                                                     **(FWD_WS_DROPOUT_BY_HDIM.get(hdim, {}) if dropout else {}),
                                                     **(FWD_WS_BIAS_BY_HDIM.get(hdim, {}).get(bias_tma, {})),
                                                     **(FWD_WS_BIAS_ALIBI_BY_HDIM.get(hdim, {}) if bias_tma and alibi else {}),
                                                     **(FWD_WS_SHORT_BY_HDIM.get(hdim, {}) if short else {})})
    if tiles.get("PINGPONG") and not tiles.get("PV_OVERLAP"):
        raise ValueError("CUPY_FMHA_FWD_WS_TILES: PINGPONG=1 needs PV_OVERLAP=1")
    if tiles.get("NWG") not in (2, 3):
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: NWG must be 2 or 3, got {tiles.get('NWG')} (one MMA warpgroup "
                         "per CTA, two CTAs per SM, measured 1.08-1.32x the time at hdim 128 and was removed: "
                         "bench/NOTES.md step 101)")
    if tiles.get("PERSIST", 0) < 0:
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: PERSIST must be >= 0, got {tiles['PERSIST']}")
    if tiles.get("KEEP_SINK", 0) not in (0, 1, 2):
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: KEEP_SINK must be 0, 1 or 2, got {tiles['KEEP_SINK']}")
    if tiles.get("MASK_ROWS", 0) not in (0, 1, 2):
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: MASK_ROWS must be 0, 1 or 2, got {tiles['MASK_ROWS']}")
    if not 0 <= tiles.get("EXP_EMU", 0) <= 8:
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: EXP_EMU (tiles of 8 with poly_exp2) must be 0..8, got {tiles['EXP_EMU']}")
    if not 0 <= tiles.get("LAZY_RESCALE", 0) <= 15:  # (P up to 2^(LAZY_RESCALE + 1/4): float16 holds 2^15.25)
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: LAZY_RESCALE must be 0..15, got {tiles['LAZY_RESCALE']}")
    removed = sorted(set(tiles) & set(FWD_WS_REMOVED))
    if removed:
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: {', '.join(removed)} no longer "
                         f"{'exists' if len(removed) == 1 else 'exist'} (removed after the measurements of "
                         f"bench/NOTES.md steps 88, 91, 99, 106, 109 and 110)")
    switches = {"FOLD", "O_REG", "O_IN_Q", "O_IN_KV", "WG_SKIP", "SMAX_TREE", "EXP_EMU", "MASK_ROWS", "LAZY_RESCALE", "BIAS_ACC", "DESC_ADDR", "KEEP_SINK",
                "ALIGN_END",
                *FWD_WS_VARIANTS}  # (PERSIST comes only from the variable, kept even at 0: the
    # launcher then takes one row block per CTA instead of fwd_ws_persist's choice)
    unknown = set(tiles) - {"NWG", "BLOCK_N", "STAGES", "TIMING", "PERSIST", *switches}
    if unknown:  # (else a typo would become a -D macro no kernel reads, timed as if it were a variant)
        raise ValueError(f"CUPY_FMHA_FWD_WS_TILES: unknown entries {sorted(unknown)}")
    return {k: v for k, v in tiles.items() if v or k not in switches}


def fwd_ws_spec(dtype: str, hdim_q: int, hdim_v: int, *, alibi: bool = False,
                tiles: dict[str, int] | None = None, bias_tma: int = 0, dropout: bool = False,
                short: bool = False) -> KernelSpec:
    """The warp-specialized Hopper forward (``fmha_fwd_sm90_ws``, issue 11: a producer warpgroup
    loading with TMA, two MMA warpgroups of 64 query rows, three at hdim 64) for head dims up to 256, each rounded up
    to a multiple of 64 (:data:`FWD_WS_HDIMS`) (:func:`use_fwd_ws` says when it is dispatched).
    ``dropout``: the build with the Philox keep test (``-D DROPOUT=1``; the entries of
    :data:`FWD_WS_DROPOUT_BY_HDIM`, FOLD off unless the variable asks for it). ``bias_tma`` 2 or 4: the build with
    an elementwise bias of 16-bit or fp32 elements loaded through TMA like K and V (``-D BIAS=1
    -D BIAS_TMA=n``; needs the swizzled tiles; FOLD off); 0 none. ``tiles``: the table entries
    (default :func:`fwd_ws_tiles`; ``short`` as there). O_IN_Q and O_IN_KV (where O has no stage of its own) are
    dropped where they do not apply; where O_IN_KV applies (the overlapped pipeline on two MMA warpgroups, head dims
    equal, swizzled tiles of at least 64 keys) it replaces O_IN_Q. WG_SKIP (MMA warpgroups leave out the key blocks
    none of their rows sees) is dropped outside the overlapped pipeline, from the bias builds and beside O_IN_KV.

    Raises:
        ValueError: ``bias_tma`` not 0, 2 or 4, or a bias with tiles that are not swizzled."""
    dq, dv = pad_hdim(hdim_q, 64), pad_hdim(hdim_v, 64)
    tiles = dict(fwd_ws_tiles(max(dq, dv), alibi, dropout, bias_tma, short) if tiles is None else tiles)
    if dropout and dq == dv == 128 and tiles.get("BLOCK_N", 128) > 128:
        tiles["BLOCK_N"] = 128  # (step 111's longer key blocks are plain / ALiBi builds: with dropout 176 keys
        # overflow the keep words and 192 spill 256 bytes)
    feats = _ws_feats("fmha_fwd_sm90_ws", tiles, alibi, bias_tma, dropout)
    if bias_tma:
        tiles.pop("FOLD", None)  # (softmax_p_folded: no bias term; BIAS_ACC's own folded form aside)
    if not bias_tma or dropout or alibi or not tiles.get("PV_OVERLAP"):
        tiles.pop("BIAS_ACC", None)  # (a variant of the bias build's overlapped pipeline only)
    if not dropout or not tiles.get("PV_OVERLAP") or tiles.get("BLOCK_N", 128) % 32:
        tiles.pop("KEEP_SINK", None)  # (the overlapped pipeline's KEEP_MSB keep decisions only)
    spec = _mk("fmha_fwd_sm90_ws", dtype, "sm90a", HDIM_Q=dq, HDIM_V=dv, **tiles, **feats)
    drop = set()
    if tiles.get("O_IN_KV"):
        if (spec.macro("O_STAGE") or dq != dv or not tiles.get("SWIZZLE") or not tiles.get("PV_OVERLAP")
                or tiles.get("NWG", 2) != 2 or tiles.get("BLOCK_N", 128) < 64):
            drop.add("O_IN_KV")  # (O in the last key block's K / V tiles: the overlapped pipeline's two warpgroups,
            # where O has no stage of its own, tiles of at least 64 rows as wide as O)
        else:
            drop.add("O_IN_Q")  # (one place for O: O_IN_KV's, wherever it applies)
    if tiles.get("O_IN_Q") and (spec.macro("O_STAGE") or dq != dv or not tiles.get("SWIZZLE")):
        drop.add("O_IN_Q")  # (O in Q's buffer only where its own stage does not fit, Q as wide as O)
    if tiles.get("WG_SKIP") and (not tiles.get("PV_OVERLAP") or bias_tma or (tiles.get("O_IN_KV") and "O_IN_KV" not in drop)):
        drop.add("WG_SKIP")  # (the overlapped pipeline's, without the bias ring or O in the last key block's stage)
    if drop & set(tiles):
        for k in drop:
            tiles.pop(k, None)
        spec = _mk("fmha_fwd_sm90_ws", dtype, "sm90a", HDIM_Q=dq, HDIM_V=dv, **tiles, **feats)
    return spec


#: the ws forward's variant builds compiled offline besides the default (experimental_table)
FWD_WS_BUILDS = (dict(), dict(SWIZZLE=1), dict(PV_OVERLAP=1), dict(SWIZZLE=1, PV_OVERLAP=1),
                 dict(DESC_ADDR=1))  # (the last: DESC_ADDR on column-blocked tiles, the serial pipeline)


def experimental_table() -> list[KernelSpec]:
    """Instances built and compile-checked that the library dispatches only under a switch: the
    ``fmha_bwd_dq_dk_dv_sm90`` and ``fmha_fwd_sm90`` builds the warp-specialized kernels replaced
    at hdim 64 and 128 (``CUPY_FMHA_BWD_WS=0``, :func:`use_ws`; ``CUPY_FMHA_FWD_WS=0``,
    :func:`use_fwd_ws`), the ws forward's pipeline variants (:data:`FWD_WS_BUILDS`,
    ``CUPY_FMHA_FWD_WS_TILES``) and the ws backward's (:data:`BWD_WS_BUILDS`, ``CUPY_FMHA_BWD_WS_TILES``)."""
    out = [_mk("fmha_bwd_dq_dk_dv_sm90", dtype, "sm90a", HDIM_Q=d, HDIM_V=d, NWG=2, BLOCK_N=128, BLOCK_M=64,
               **({"DQ_BULK": 0} if drop else {}), **feature_macros(alibi, False, drop))
           for dtype in DTYPES for d in (64, 128) for alibi in (False, True) for drop in (False, True)]
    # the ws backward's variants (BWD_WS_VARIANTS), not dispatched by default
    for variant in BWD_WS_BUILDS:
        out += [bwd_ws_spec(dtype, d, d, alibi=alibi, tiles={**dict(NWG=2, BLOCK_N=128, BLOCK_M=64), **variant})
                for dtype in DTYPES for d in (64, 128) for alibi in (False, True)
                if "BLOCK_M" not in variant or d == 64]  # (at hdim 128 BLOCK_M=64 is the default)
    # the ws backward's dQ writer (bench/NOTES.md step 76; dispatched in deterministic mode since step 83,
    # so these stay for the atomic builds), on each head dim's table entries
    out += [bwd_ws_spec(dtype, d, d, alibi=alibi, tiles={**bwd_ws_tiles(d), "DQ_WRITER": 1}, heads_x=hx)
            for dtype in DTYPES for d in (64, 128) for alibi in (False, True) for hx in (0, 1, 2)]
    # the ws backward's descriptors from the tile pointers (DESC_ADDR off; the default forms them from one
    # 32-bit address since bench/NOTES.md step 104), on each head dim's table entries with and without a
    # short diagonal, both dQ modes, for comparisons
    out += [bwd_ws_spec(dtype, d, d, alibi=alibi, tiles=flip_switch(bwd_ws_tiles(d, deterministic=det, diagonal=diag), "DESC_ADDR"))
            for dtype in DTYPES for d in (64, 128) for alibi in (False, True) for det in (False, True)
            for diag in ((False, True) if d == 128 else (False,))]
    # the wide ws backward's variants, where dQ is staged (hdim_q <= hdim_v)
    for variant in BWD_WS_WIDE_BUILDS:
        out += [bwd_ws_wide_spec(dtype, hq, hv, alibi=alibi, heads_x=hx, variant=variant)
                for dtype in DTYPES for hq, hv in ((256, 256), (128, 256)) for alibi in (False, True)
                for hx in (0, 1)]
    # the ws forward's bias build with the bias as S's starting value (BIAS_ACC, bench/NOTES.md step 77)
    # (not the fp32 bias at hdim 128: it spills 4 bytes there; that bias target is met without it)
    out += [fwd_ws_spec(dtype, d, d, bias_tma=n, tiles={**fwd_ws_tiles(d, bias_tma=n), "BIAS_ACC": 1})
            for dtype in DTYPES for d in (64, 128) for n in (2, 4) if d == 64 or n == 2]
    # O staged in Q's buffer where its own stage is off (O_IN_Q, step 86), plain and ALiBi; hdim 64 and 256
    # (at 192 the build spills 68-92 bytes)
    out += [fwd_ws_spec(dtype, d, d, alibi=alibi, tiles={**fwd_ws_tiles(d, alibi), "O_IN_Q": 1})
            for dtype in DTYPES for d in (64, 256) for alibi in (False, True)]  # (64: O_REG there, no stage)
    # ... and O's other place than the table's (O_IN_KV, bench/NOTES.md rows 127-128: the last key block's K and V tiles,
    # Q handed back after the last S GEMM): at 256 O_IN_KV (plain; ALiBi is serial there), at 192, where it is the
    # table's, the register stores it replaced (plain and ALiBi)
    out += [fwd_ws_spec(dtype, d, d, alibi=alibi, tiles={**fwd_ws_tiles(d, alibi), "O_IN_KV": int(d == 256)})
            for dtype in DTYPES for d in (192, 256) for alibi in (False, True) if not (alibi and d == 256)]
    # ... and with MMA warpgroups leaving out the key blocks none of their rows sees (WG_SKIP, bench/NOTES.md row 130) or
    # not, the other form than the table's (on at 64 and 256, off at 128 and in the dropout builds), on each head dim's
    # overlapped builds: plain, ALiBi, dropout (fwd_ws_spec drops it from the others, which are then the dispatched
    # builds and fall out below)
    out += [fwd_ws_spec(dtype, d, d, alibi=alibi, dropout=drop, tiles=flip_switch(fwd_ws_tiles(d, alibi, drop), "WG_SKIP"))
            for dtype in DTYPES for d in (64, 128, 256) for alibi in (False, True) for drop in (False, True)]
    # ... and at 128 with a third stage of K and V in the room O's own stage had (STAGES=3, bench/NOTES.md step 107:
    # 230,512 bytes, 0 spills), plain and ALiBi
    out += [fwd_ws_spec(dtype, 128, 128, alibi=alibi, tiles={**fwd_ws_tiles(128, alibi), "STAGES": 3, "O_IN_Q": 1})
            for dtype in DTYPES for alibi in (False, True)]
    # ... and with 176- or 192-key blocks (step 111: FlashAttention-3's 176 at hdim 128 without a mask; O staged in
    # Q's buffer, since O's own stage does not fit beside them; measured slower, kept for comparisons): plain and
    # ALiBi (fwd_ws_spec keeps 128 keys with dropout)
    out += [fwd_ws_spec(dtype, 128, 128, alibi=alibi, tiles={**fwd_ws_tiles(128, alibi), "BLOCK_N": n, "O_IN_Q": 1})
            for dtype in DTYPES for n in (176, 192) for alibi in (False, True)]
    # ... and the softmax before step 113 (FWD_WS_SOFTMAX off: at 128, 192 and 256 unfolded, the chain maxima, O
    # rescaled every block; at 64 folded as since step 37), plain builds, for comparisons
    out += [fwd_ws_spec(dtype, d, d, tiles={**fwd_ws_tiles(d), "FOLD": int(d == 64), "SMAX_TREE": 0, "LAZY_RESCALE": 0})
            for dtype in DTYPES for d in (64, 128, 192, 256)]
    # ... and the dropout builds with the folded softmax (step 114: FOLD=1; the dropped elements still leave as P is
    # packed), at 64 and 128, where the dropout builds run the overlapped pipeline
    out += [fwd_ws_spec(dtype, d, d, dropout=True, tiles={**fwd_ws_tiles(d, dropout=True), "FOLD": 1})
            for dtype in DTYPES for d in (64, 128)]
    # ... and with the keep decisions made in the other forms than the table's (steps 116-117, KEEP_SINK: 0 under the S
    # GEMM, the table's at 128; 1 inside the softmax, the table's at 64; 2 half and half), with and without ALiBi
    out += [fwd_ws_spec(dtype, d, d, alibi=alibi, dropout=True, tiles=with_switch(fwd_ws_tiles(d, alibi, True), "KEEP_SINK", k))
            for dtype in DTYPES for d in (64, 128) for alibi in (False, True) for k in (0, 1, 2)
            if k != fwd_ws_tiles(d, alibi, True).get("KEEP_SINK", 0)]
    # the forward softmax's step-87 variants (tools/sass_sched.py's schedules; none dispatched): SMAX_TREE (row maxima by
    # pairwise trees) with MASK_ROWS=1 (an edge tile's mask test from per-row bounds), both giving the same values, on
    # each head dim's entries (plain, ALiBi, dropout; the bias builds at 64 and 128); MASK_ROWS=0 at 64 and 128 (the mask
    # test before step 115 made MASK_ROWS=2, the lower bound only where it crosses, the default there; 4 bytes of spill at
    # 256), EXP_EMU=1 (1 of 8 tiles' exponentials by poly_exp2 on the FMA pipes)
    # likewise at 64 and 128 (LAZY_RESCALE=8, O rescaled only when a maximum moved by more than 2^8, was one of them
    # until step 113 made it the default); all four (EXP_EMU=2, MASK_ROWS=2), plain and dropout
    for variant, hdims in (({"SMAX_TREE": 1, "MASK_ROWS": 1}, (64, 128, 192, 256)), ({"MASK_ROWS": 0}, (64, 128)),
                           ({"EXP_EMU": 1}, (64, 128))):
        out += [fwd_ws_spec(dtype, d, d, alibi=alibi, dropout=drop, tiles={**fwd_ws_tiles(d, alibi, drop), **variant})
                for dtype in DTYPES for d in hdims for alibi in (False, True) for drop in (False, True)]
        out += [fwd_ws_spec(dtype, d, d, bias_tma=2, tiles={**fwd_ws_tiles(d, bias_tma=2), **variant})
                for dtype in DTYPES for d in (64, 128)
                if not (d == 64 and variant.get("SMAX_TREE"))]  # (the trees spill 240 B there beside LAZY_RESCALE)
    out += [fwd_ws_spec(dtype, d, d, dropout=drop, tiles={**fwd_ws_tiles(d, dropout=drop), "EXP_EMU": 2, "SMAX_TREE": 1, "MASK_ROWS": 2,
                                                                   "LAZY_RESCALE": 8})
            for dtype in DTYPES for d in (64, 128) for drop in (False, True)]
    # the loop descriptors in the other form than the table's (DESC_ADDR, bench/NOTES.md steps 103-104: from one
    # 32-bit address at 64 and 128, from the tile pointers at 192 and 256), on each head dim's entries: plain,
    # ALiBi, dropout, the 16-bit bias
    def desc_other(d, alibi, drop):  # (at 256 without WG_SKIP, the table's there since row 130: beside it the
        # descriptors from the pointers spill 20 bytes)
        tiles = flip_switch(fwd_ws_tiles(d, alibi, drop), "DESC_ADDR")
        return with_switch(tiles, "WG_SKIP", 0) if d == 256 else tiles
    out += [fwd_ws_spec(dtype, d, d, alibi=alibi, dropout=drop, tiles=desc_other(d, alibi, drop))
            for dtype in DTYPES for d in (64, 128, 192, 256) for alibi in (False, True) for drop in (False, True)]
    out += [fwd_ws_spec(dtype, d, d, bias_tma=2, tiles=flip_switch(fwd_ws_tiles(d, bias_tma=2), "DESC_ADDR"))
            for dtype in DTYPES for d in (64, 128)]
    # row blocks counted back from each sequence's end or not (ALIGN_END, step 118: the partial block holds the first
    # rows; the table's at 64), the other form than the table's: the plain builds in bf16 (the A/B's), and one build of
    # each other epilogue and feature path in fp16 (the GPU tests' dtype): dropout at 64 and 128, the 16-bit bias at 64
    # and 128, ALiBi at 256 (the serial pipeline)
    out += [fwd_ws_spec(dtype, d, d, alibi=alibi, dropout=drop, bias_tma=bias,
                        tiles=flip_switch(fwd_ws_tiles(d, alibi, drop, bias), "ALIGN_END"))
            for dtype, d, alibi, drop, bias in [*(("bf16", d, False, False, 0) for d in (64, 128, 192, 256)),
                                                ("fp16", 64, False, True, 0), ("fp16", 128, False, True, 0),
                                                ("fp16", 64, False, False, 2), ("fp16", 128, False, False, 2),
                                                ("fp16", 256, True, False, 0)]]
    # the hdim-64 16-bit bias build on two MMA warpgroups, the table's before step 92 (bench/probe/s23_gpu.sh times it)
    out += [fwd_ws_spec(dtype, 64, 64, bias_tma=2, tiles={**fwd_ws_tiles(64, bias_tma=2), "NWG": 2}) for dtype in DTYPES]
    # the diagnostics builds of the probes' timelines (TIMING: bench/probe/fwd_timeline.py, timeline58.py), bf16
    out += [fwd_ws_spec("bf16", d, d, tiles={**fwd_ws_tiles(d), "TIMING": 1}) for d in (64, 128)]
    out.append(bwd_ws_spec("bf16", 128, 128, tiles={**bwd_ws_tiles(128), "TIMING": 1}))
    out += [bwd_ws_wide_spec("bf16", 256, 256, variant={"TIMING": 1, **w}) for w in ({}, {"DQ_WRITER": 0})]
    # the ws forward's pipeline variants (FWD_WS_VARIANTS), not dispatched by default
    for variant in FWD_WS_BUILDS:
        out += [fwd_ws_spec(dtype, d, d, alibi=alibi, tiles=dict(NWG=2, BLOCK_N=128, **variant))
                for dtype in DTYPES for d in (64, 128) for alibi in (False, True)]
    for dtype in DTYPES:
        for d in (64, 128):
            tiles = fwd_sm90_tiles(d, d, False)
            skips = (False, True) if tiles["NWG"] == 3 else (False,)
            out += [_mk("fmha_fwd_sm90", dtype, "sm90a", HDIM_Q=d, HDIM_V=d, **tiles,
                        **({"WG_SKIP": 1} if skip else {}), **feature_macros(alibi, False, False))
                    for alibi in (False, True) for skip in skips if not (alibi and skip)]
    # (variants since adopted, e.g. the dQ writer in deterministic mode or BIAS_ACC at hdim 64, are
    # the dispatch table's now: each instance once, in the table that dispatches it)
    dispatched = {s.name for s in dispatch_table()}
    return list({s.name: s for s in out if s.name not in dispatched}.values())


def dropout_mask_spec() -> KernelSpec:
    """The keep-mask kernel (``fmha_dropout_mask``): no dtype dependence, built once as fp16."""
    return _mk("fmha_dropout_mask", "fp16")


def dispatch_table() -> list[KernelSpec]:
    """Every kernel instance the library dispatches to for the head dims it supports
    (multiples of 8 up to 256, hdim_q == hdim_v, plus the pairs (192, 128), (256, 128), (128, 256)), both dtypes, on
    sm_80-class and sm_90 devices, for every feature set, in atomic and deterministic dQ mode,
    with and without the heads-first grid of causal backwards (:func:`use_heads_x`) and the ws
    backward's entries for diagonal masks (:func:`use_bwd_ws_diagonal`), plus the keep-mask kernel."""
    seen: dict[str, KernelSpec] = {}
    pairs = [(d, d) for d in range(8, 257, 8)] + [(192, 128), (256, 128), (128, 256)]
    for feats in FEATURE_SETS:
        for dtype in DTYPES:
            for hq, hv in pairs:
                for cc in (80, 90):
                    tma = (2, 4) if feats.get("bias") else ()  # the ws kernels' bias builds
                    for spec in (fwd_spec(dtype, hq, hv, cc, **feats),
                                 fwd_spec(dtype, hq, hv, cc, **feats, wg_skip=True),
                                 fwd_spec(dtype, hq, hv, cc, **feats, short=True),
                                 *(fwd_spec(dtype, hq, hv, cc, **feats, bias_tma=n) for n in tma),
                                 *vars(bwd_specs(dtype, hq, hv, cc, **feats)).values(),
                                 *(bwd_specs(dtype, hq, hv, cc, **feats, bias_tma=n, deterministic=det).dq_dk_dv
                                   for n in tma for det in (False, True)),
                                 bwd_specs(dtype, hq, hv, cc, **feats, deterministic=True).dq_dk_dv,
                                 *(bwd_specs(dtype, hq, hv, cc, **feats, bias_tma=n, deterministic=det,
                                             heads_x=hx, diagonal=diag).dq_dk_dv for n in (0, *tma)
                                   for det in (False, True) for diag in (False, True)
                                   for hx in ((0, 1, BWD_WS_HEADS_GROUP) if max(hq, hv) <= 128 else (0, 1)))):
                        seen.setdefault(spec.name, spec)
    spec = dropout_mask_spec()
    seen.setdefault(spec.name, spec)
    return list(seen.values())
