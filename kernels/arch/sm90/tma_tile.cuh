// Architecture layer, sm90: the TMA-loaded tiles of the warp-specialized kernels in either of their
// two layouts, chosen at compile time by SW (the kernels pass their SWIZZLE macro):
//   SW = 0  column-blocked ([C/8][R][8]: desc_cb_* and cb_zero_rows in tile.cuh), one box of the
//           column-blocked 5-D view per tile (cupy_fmha/backends/tma.py, column_blocked_view)
//   SW = 1  128-byte swizzled slabs ([C/64][R][64]: desc_sw_* and sw_zero_rows in tma.cuh), one box
//           of 64 columns of the plain 4-D map per slab
// Shared by fmha_fwd_sm90_ws.cu and fmha_bwd_dq_dk_dv_sm90_ws.cu.
#pragma once
#include "tile.cuh"
#include "tma.cuh"

namespace fmha {

// One tile of R rows from `row` (all D columns) of a map into `dst`, completing `bar`.
template <bool SW, int R, int D>
__device__ __forceinline__ void tma_load_tile(uint16_t* dst, const TmaMap& m, unsigned bar, int head, int row,
                                              int batch) {
    if constexpr (SW) {
#pragma unroll
        for (int c = 0; c < D / 64; ++c) tma_load_4d(smem_u32(dst) + c * (R * 128), m, bar, c * 64, head, row, batch);
    } else {
        tma_load_5d(smem_u32(dst), m, bar, 0, head, row, 0, batch);
    }
}
// Descriptors of the 16-deep K slices of a tile of R rows: K-major at (row0, k0), MN-major at
// (k0, col0) (col0: a multiple of 64, or with SW inside one slab, as desc_sw_mnmajor allows).
template <bool SW, int R>
__device__ __forceinline__ unsigned long long desc_tile_kmajor(const uint16_t* tile, int row0, int k0) {
    if constexpr (SW) return desc_sw_kmajor<R>(tile, row0, k0);
    else return desc_cb_kmajor<R>(tile, row0, k0);
}
template <bool SW, int R>
__device__ __forceinline__ unsigned long long desc_tile_mnmajor(const uint16_t* tile, int k0, int col0) {
    if constexpr (SW) return desc_sw_mnmajor<R>(tile, k0, col0);
    else return desc_cb_mnmajor<R>(tile, k0, col0);
}
// Rows [r0, R) of a tile of C columns set to zero by THREADS threads (rows a box brought from the
// next sequence, group mode).
template <bool SW, int R, int C, int THREADS>
__device__ __forceinline__ void zero_tile_rows(uint16_t* tile, int r0, int tid) {
    if constexpr (SW) sw_zero_rows<R, C, THREADS>(tile, r0, tid);
    else cb_zero_rows<R, C, THREADS>(tile, r0, tid);
}

}  // namespace fmha
