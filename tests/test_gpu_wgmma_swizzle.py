"""wgmma on TMA-loaded tiles against NumPy, for the shared-memory layouts of the Hopper kernels
(kernels/arch/sm90/tile.cuh: column-blocked; kernels/arch/sm90/tma.cuh: 128-byte swizzled), so a
descriptor error shows here, in one GEMM, before it shows as a wrong attention output.

A probe kernel of one warpgroup loads A (a 128-row tile, K-major) and B (K-major: an N x K tile;
MN-major: a K x N tile, as the forward's V) with TMA into shared memory, in the column-blocked
layout (one box of the 5-D column-blocked view) or 128-byte swizzled (one box of 64 columns per
slab), then runs K / 16 wgmma m64nNk16 on rows a_row0 .. a_row0 + 63 of A, with A from shared
memory or from registers (the forward's P V), and writes the fp32 accumulator out. Inputs are
small integers, so the products and sums are exact and the check is equality.

The MN-major swizzled descriptor is the one the ISA text leaves easiest to misread (which of LBO
and SBO is the stride between 64-column atoms along N, which between 8-row groups along K):
the library's reading (arch/sm90/tma.cuh desc_sw_mnmajor: LBO = atom stride along N, SBO = 1024)
is the one the H200 computes (the note at the end of this file).

The ws backward's GEMM4 (dQ = dS K, SWIZZLE builds) reads K MN-major over one warpgroup's half of
the columns: at hdim 128 the second half is the second slab (col0 = 64), at hdim 64 it starts 64
bytes into the one slab's swizzle atom (N = 32, col0 = 32), a start address the ISA's canonical
layouts do not show; test_wgmma_column_start checks those starts (B a K x BC swizzled tile, N of
its columns from col0). Needs sm_90."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

try:
    import cupy as cp
except Exception:  # pragma: no cover
    cp = None

from cupy_fmha import compile as C
from cupy_fmha.backends import tma
import conftest
from conftest import seed_for

pytestmark = pytest.mark.gpu

A_ROWS = 128  # A's tile: 128 rows (the forward's Q tile; a warpgroup multiplies 64 of them)

_PROBE = r"""
#include "arch/arch.cuh"
using namespace fmha;

// SW: 1 swizzled tiles, 0 column-blocked. TB: 1 B is MN-major. RS: A from registers.
// MODE (swizzled MN-major B only): 0 the library's desc_sw_mnmajor, 1 the descriptor with the
// given lbo / sbo (candidates).
template <int N, int K, int TB, int RS, int SW>
__device__ __forceinline__ void probe(const TmaMap& ma, const TmaMap& mb, const uint16_t* a_g, float* out,
                                      int a_row0, int mode, int lbo, int sbo) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned char* base = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    uint16_t* sA = reinterpret_cast<uint16_t*>(base);
    uint16_t* sB = sA + A_ROWS * K;
    const int tid = threadIdx.x;
    if (tid == 0) {
        mbarrier_init(smem_u32(&bar), 1);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (tid == 0) {  // A only when it is read from shared memory (RS = 0)
        mbarrier_arrive_expect_tx(smem_u32(&bar), 2u * ((RS ? 0 : A_ROWS * K) + N * K));
        if constexpr (SW) {
            if constexpr (!RS)
                for (int c = 0; c < K / 64; ++c)  // A: slabs of 64 columns
                    tma_load_4d(smem_u32(sA) + c * (A_ROWS * 128), ma, smem_u32(&bar), c * 64, 0, 0, 0);
            constexpr int BR = TB ? K : N, BC = TB ? N : K;  // B's tile: rows x columns
            for (int c = 0; c < BC / 64; ++c)
                tma_load_4d(smem_u32(sB) + c * (BR * 128), mb, smem_u32(&bar), c * 64, 0, 0, 0);
        } else {
            if constexpr (!RS) tma_load_5d(smem_u32(sA), ma, smem_u32(&bar), 0, 0, 0, 0, 0);
            tma_load_5d(smem_u32(sB), mb, smem_u32(&bar), 0, 0, 0, 0, 0);
        }
    }
    mbarrier_wait(smem_u32(&bar), 0);

    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        const int k0 = kk * 16;
        unsigned long long db;
        if constexpr (SW) {
            if constexpr (TB) db = mode == 0 ? desc_sw_mnmajor<K>(sB, k0, 0) : wgmma_desc_sw128(smem_u32(sB) + k0 * 128, lbo, sbo);
            else db = desc_sw_kmajor<N>(sB, 0, k0);
        } else {
            if constexpr (TB) db = desc_cb_mnmajor<K>(sB, k0, 0);
            else db = desc_cb_kmajor<N>(sB, 0, k0);
        }
        if constexpr (RS) {
            // the m16n8k16 A fragment of this warp's 16 rows, straight from global memory
            const uint16_t* r0 = a_g + (a_row0 + 16 * warp + g) * K + k0 + 2 * t;
            const uint16_t* r1 = r0 + 8 * K;
            uint32_t a[4];
            a[0] = r0[0] | (uint32_t(r0[1]) << 16);
            a[1] = r1[0] | (uint32_t(r1[1]) << 16);
            a[2] = r0[8] | (uint32_t(r0[9]) << 16);
            a[3] = r1[8] | (uint32_t(r1[9]) << 16);
            wgmma_rs<N, TB>(acc, a, db, 1);
        } else {
            const unsigned long long da = SW ? desc_sw_kmajor<A_ROWS>(sA, a_row0, k0) : desc_cb_kmajor<A_ROWS>(sA, a_row0, k0);
            wgmma_ss<N, 0, TB>(acc, da, db, 1);
        }
    }
    wgmma_commit();
    wgmma_wait0();
    fence_operand<N / 2>(acc);
    // accumulator element 4n + e: row 16 warp + g + 8 (e / 2), column 8n + 2t + e % 2
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[(16 * warp + g + 8 * (e >> 1)) * N + 8 * n + 2 * t + (e & 1)] = acc[4 * n + e];
}

// B MN-major, swizzled, BC columns wide (BC / 64 slabs); the wgmma reads N of them from col0
// (desc_sw_mnmajor's column start: a slab boundary, or inside one slab when N < 64).
template <int N, int K, int BC>
__device__ __forceinline__ void probe_cols(const TmaMap& ma, const TmaMap& mb, float* out, int col0) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned char* base = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    uint16_t* sA = reinterpret_cast<uint16_t*>(base);
    uint16_t* sB = sA + A_ROWS * K;
    const int tid = threadIdx.x;
    if (tid == 0) {
        mbarrier_init(smem_u32(&bar), 1);
        mbarrier_init_fence();
    }
    __syncthreads();
    if (tid == 0) {
        mbarrier_arrive_expect_tx(smem_u32(&bar), 2u * (A_ROWS * K + K * BC));
        for (int c = 0; c < K / 64; ++c) tma_load_4d(smem_u32(sA) + c * (A_ROWS * 128), ma, smem_u32(&bar), c * 64, 0, 0, 0);
        for (int c = 0; c < BC / 64; ++c) tma_load_4d(smem_u32(sB) + c * (K * 128), mb, smem_u32(&bar), c * 64, 0, 0, 0);
    }
    mbarrier_wait(smem_u32(&bar), 0);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
        wgmma_ss<N, 0, 1>(acc, desc_sw_kmajor<A_ROWS>(sA, 0, kk * 16), desc_sw_mnmajor<K>(sB, kk * 16, col0), 1);
    wgmma_commit();
    wgmma_wait0();
    fence_operand<N / 2>(acc);
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[(16 * warp + g + 8 * (e >> 1)) * N + 8 * n + 2 * t + (e & 1)] = acc[4 * n + e];
}
"""

# (N, K, BC, col0): GEMM4 of the ws backward, SWIZZLE builds: hdim 64 (N 32 from a 64-column K
# tile, columns 0 and 32), hdim 128 (N 64 from a 128-column tile, columns 0 and 64); K = 128 keys;
# and N 32 from column 96 of a 128-column tile (inside the second slab's atom)
COL_CASES = [(32, 128, 64, 0), (32, 128, 64, 32), (64, 128, 128, 0), (64, 128, 128, 64), (32, 128, 128, 96)]

# (N, K, TB: B MN-major, RS: A from registers, SW: swizzled). A swizzled K-major tile (A from shared
# memory, or B with TB = 0) needs K >= 64: one 128-byte row per box; an MN-major B of K = 16 rows
# (A from registers) is one k16 step of the forward's P V.
CASES = [(n, k, tb, rs, sw) for n, k, (tb, rs), sw in itertools.product((64, 128), (16, 64, 128), ((0, 0), (1, 0), (1, 1)), (0, 1))
         if not (sw and k < 64 and not rs)]


def _name(n, k, tb, rs, sw):
    return f"probe_n{n}_k{k}_tb{tb}_rs{rs}_sw{sw}"


def _source() -> str:
    wrappers = "\n".join(
        f'extern "C" __global__ void __launch_bounds__(128, 1) {_name(*c)}(const __grid_constant__ TmaMap ma, '
        f"const __grid_constant__ TmaMap mb, const uint16_t* a_g, float* out, int a_row0, int mode, int lbo, int sbo) "
        f"{{ probe<{c[0]}, {c[1]}, {c[2]}, {c[3]}, {c[4]}>(ma, mb, a_g, out, a_row0, mode, lbo, sbo); }}"
        for c in CASES)
    wrappers += "\n" + "\n".join(
        f'extern "C" __global__ void __launch_bounds__(128, 1) probe_cols_n{n}_k{k}_bc{bc}(const __grid_constant__ TmaMap ma, '
        f"const __grid_constant__ TmaMap mb, float* out, int col0) {{ probe_cols<{n}, {k}, {bc}>(ma, mb, out, col0); }}"
        for n, k, bc in sorted({c[:3] for c in COL_CASES}))
    return C.expand_includes(_PROBE.replace("A_ROWS", str(A_ROWS))) + "\n" + wrappers


@pytest.fixture(scope="module")
def module():
    if not conftest.is_sm90():
        pytest.skip("wgmma and TMA need sm_90")
    return cp.RawModule(code=_source(), options=("-std=c++17", "-arch=sm_90a", "-DFMHA_BF16=1"))


def _ints(key, shape):
    """Small integers as bf16 bits (exact products and fp32 sums)."""
    import ml_dtypes

    rng = np.random.default_rng(seed_for(*key))
    x = rng.integers(-4, 5, size=shape).astype(np.float32)
    return x, x.astype(ml_dtypes.bfloat16).view(np.uint16)


def _map(bits_dev, rows, cols, box_rows, sw):
    """The TMA map of a row-major [rows, cols] matrix as the kernels read a bshd tensor of one batch
    entry and one head: swizzled boxes of box_rows x 64, or one column-blocked box of all columns."""
    shape, strides = (1, rows, 1, cols), (rows * cols * 2, cols * 2, cols * 2, 2)
    if sw:
        args = tma.tile_map_args("bfloat16", bits_dev.data.ptr, shape, strides, (1, box_rows, 1, 64), 128)
    else:
        v_shape, v_strides = tma.column_blocked_view(shape, strides, 2, row_axis=1)
        args = tma.tile_map_args("bfloat16", bits_dev.data.ptr, v_shape, v_strides, (1, cols // 8, box_rows, 1, 8), 0)
    return tma.encode_tile_map(args)


def _run(module, case, a_row0, mode=0, lbo=0, sbo=0):
    n, k, tb, rs, sw = case
    a, a_bits = _ints(("wgmma-a", n, k, tb, rs, sw), (A_ROWS, k))
    b_rows, b_cols = (k, n) if tb else (n, k)
    b, b_bits = _ints(("wgmma-b", n, k, tb, rs, sw), (b_rows, b_cols))
    a_dev, b_dev = cp.asarray(a_bits), cp.asarray(b_bits)
    out = cp.full((64, n), np.nan, dtype=cp.float32)  # poisoned
    fn = module.get_function(_name(*case))
    smem = 1024 + 2 * (A_ROWS * k + n * k)
    fn.max_dynamic_shared_size_bytes = smem
    mb = _map(b_dev, b_rows, b_cols, b_rows, sw)
    ma = mb if rs else _map(a_dev, A_ROWS, k, A_ROWS, sw)  # (A from registers: its map is not read)
    fn((1, 1, 1), (128, 1, 1), (ma, mb, a_dev, out, np.int32(a_row0), np.int32(mode), np.int32(lbo), np.int32(sbo)),
       shared_mem=smem)
    want = a[a_row0:a_row0 + 64].astype(np.float64) @ (b if tb else b.T).astype(np.float64)
    return cp.asnumpy(out), want


@pytest.mark.parametrize("case", CASES, ids=lambda c: _name(*c)[6:])
def test_wgmma_on_tma_tiles(module, case):
    """The library's descriptors (column-blocked, or swizzled) give A B exactly."""
    a_row0 = 64 if case[1] == 64 else 0  # the second warpgroup's rows of a 128-row Q tile, sometimes
    got, want = _run(module, case, a_row0)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{_name(*case)}: {len(bad)} of {got.size} wrong, first at {bad[:4].tolist()}"


@pytest.mark.parametrize("case", COL_CASES, ids=lambda c: "n{}_k{}_bc{}_col{}".format(*c))
def test_wgmma_column_start(module, case):
    """desc_sw_mnmajor with a column start: a slab boundary (col0 % 64 == 0), or inside the swizzle
    atom (N = 32 from column 32 or 96: the ws backward's GEMM4 at hdim 64) gives A B[:, col0:col0 + N]."""
    n, k, bc, col0 = case
    a, a_bits = _ints(("wgmma-cols-a", n, k, bc), (A_ROWS, k))
    b, b_bits = _ints(("wgmma-cols-b", n, k, bc), (k, bc))
    a_dev, b_dev = cp.asarray(a_bits), cp.asarray(b_bits)
    out = cp.full((64, n), np.nan, dtype=cp.float32)  # poisoned
    fn = module.get_function(f"probe_cols_n{n}_k{k}_bc{bc}")
    smem = 1024 + 2 * (A_ROWS * k + k * bc)
    fn.max_dynamic_shared_size_bytes = smem
    ma, mb = _map(a_dev, A_ROWS, k, A_ROWS, 1), _map(b_dev, k, bc, k, 1)
    fn((1, 1, 1), (128, 1, 1), (ma, mb, out, np.int32(col0)), shared_mem=smem)
    got = cp.asnumpy(out)
    want = a[:64].astype(np.float64) @ b[:, col0:col0 + n].astype(np.float64)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{case}: {len(bad)} of {got.size} wrong, first at {bad[:4].tolist()}"


# The H200 run of 2026-12-01 (bench/NOTES.md step 27) settled the MN-major swizzled reading: LBO =
# the byte stride between 64-column atoms along N, SBO = 1024 between 8-row groups along K (the
# library's, checked by the test above) gives A B exactly; the swapped reading gave wrong products
# on the first shape and an illegal address on the next (it points wgmma outside the tile), so it
# is not tried here: a faulting probe poisons the CUDA context for every test after it.
