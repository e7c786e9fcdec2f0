// Architecture layer, sm90: the TMA-loaded tiles of the warp-specialized kernels in either of their
// two layouts, chosen at compile time by SW (the kernels pass their SWIZZLE macro):
//   SW = 0  column-blocked ([C/8][R][8]: desc_cb_* and cb_zero_rows in tile.cuh), one box of the
//           column-blocked 5-D view per tile (cupy_fmha/backends/tma.py, column_blocked_view)
//   SW = 1  128-byte swizzled slabs ([C/64][R][64]: desc_sw_* and sw_zero_rows in tma.cuh), one box
//           of 64 columns of the plain 4-D map per slab
// Shared by fmha_fwd_sm90_ws.cu, fmha_bwd_dq_dk_dv_sm90_ws.cu and fmha_bwd_dq_dk_dv_sm90_ws_wide.cu.
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
// (both also take the tile's shared-memory address in place of its pointer: the kernels' DESC_ADDR
// builds form every loop descriptor from one 32-bit address plus constant offsets, pick below)
template <bool SW, int R>
__device__ __forceinline__ unsigned long long desc_tile_kmajor(unsigned tile, int row0, int k0) {
    if constexpr (SW) return desc_sw_kmajor<R>(tile, row0, k0);
    else return desc_cb_kmajor<R>(tile, row0, k0);
}
template <bool SW, int R>
__device__ __forceinline__ unsigned long long desc_tile_mnmajor(unsigned tile, int k0, int col0) {
    if constexpr (SW) return desc_sw_mnmajor<R>(tile, k0, col0);
    else return desc_cb_mnmajor<R>(tile, k0, col0);
}
// `a` with A, else `b`: a descriptor operand, the tile's shared-memory address (DESC_ADDR) or its pointer
template <bool A, class T, class U>
__device__ __forceinline__ auto pick(T a, U b) {
    if constexpr (A) return a;
    else return b;
}
// `x` made opaque to the compiler where this stands (an empty asm that may have changed it): values
// formed from it after this point are formed again there, not hoisted or kept from before (the
// DESC_ADDR loops: the descriptors per block, not all of them held in registers across the loop)
__device__ __forceinline__ void opaque_u32(unsigned& x) { asm volatile("" : "+r"(x)); }
// Rows [r0, R) of a tile of C columns set to zero by THREADS threads (rows a box brought from the
// next sequence, group mode).
template <bool SW, int R, int C, int THREADS>
__device__ __forceinline__ void zero_tile_rows(uint16_t* tile, int r0, int tid) {
    if constexpr (SW) sw_zero_rows<R, C, THREADS>(tile, r0, tid);
    else cb_zero_rows<R, C, THREADS>(tile, r0, tid);
}


// ---- The elementwise bias as a TMA-loaded tile (fmha_fwd_sm90_ws's BIAS build): BM query rows x
// BN keys of E-byte elements (E = 2: fp16 or bf16, chosen at run time by `kind`; E = 4: fp32),
// brought in boxes of 128-byte rows with 128-byte swizzle, one box per slab of 128 / E columns:
// [BN * E / 128][BM][128 bytes], slabs BM * 128 bytes apart (a multiple of 1024, so each slab starts
// the swizzle pattern afresh: chunk j of row r at chunk j ^ (r % 8)). A bias broadcast along the
// query rows comes as boxes of one row: row_mul = 0 reads row 0 for every row.
//
// Two readers, both adding log2 units (the scores are in log2 units by then):
//   add()             the forward's S fragment of NS n8 tiles whose rows start at row0 (a multiple of
//                     16 tile rows into the tile; rows row0 + f.row(e)) and whose columns are the
//                     tile's (f.col(n, e)): per n8 tile and row, the thread's two adjacent columns in
//                     one 4-byte (E = 2) or 8-byte (E = 4) read; the 8 rows a warp reads at once
//                     (f.row_in_group() = 0..7) fall on 8 different chunks: no bank conflicts
//   t_offsets, at_t   the backward's S^T fragments (rows = keys, columns = query rows), one element
//                     per read; the 4 query rows of a warp's access fall on 4 different chunks

// Shared-memory loads at 32-bit shared addresses (the bias tile's reads: a generic 64-bit pointer
// per access cost the ws forward's MMA warps registers they did not have, ptxas spilled)
__device__ __forceinline__ uint32_t lds_u32(unsigned addr) {
    uint32_t x;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(x) : "r"(addr));
    return x;
}
__device__ __forceinline__ uint16_t lds_u16(unsigned addr) {
    uint16_t x;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(x) : "r"(addr));
    return x;
}
__device__ __forceinline__ float lds_f32(unsigned addr) {
    float x;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(addr));
    return x;
}
__device__ __forceinline__ float2 lds_f32x2(unsigned addr) {
    float2 x;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x.x), "=f"(x.y) : "r"(addr));
    return x;
}
// A 16-bit bias element's bits as a float: bf16 or fp16
__device__ __forceinline__ float bias16_to_float(uint16_t u, bool bf16) {
    return bf16 ? bf16_bits_to_float(u) : f16_bits_to_float(u);
}

template <int BM, int BN, int E>
struct SwBiasTile {
    enum : int { PAIRS = 1, SLAB_COLS = 128 / E };
    unsigned tile;  // shared address of the stage's first slab
    int row_mul;    // 1, or 0 for a bias broadcast along the query rows
    int kind;       // BiasArg.kind: 1 fp16, 2 bf16, 3 fp32

    // The backward's S^T fragments (rows = keys key_row0 + f.row(e) of the tile, a multiple of 16;
    // columns = the tile's query rows f.col(n, e)): t_offsets fills off[e] with element (n = 0, e)'s
    // address and returns the step per n8 tile (8 rows, 0 when broadcast along the rows); at_t reads
    // element (n, e) from those.
    __device__ __forceinline__ unsigned t_offsets(unsigned off[4], int key_row0, const AccFrag& f) const {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = f.col(0, e) * row_mul, c = key_row0 + f.row(e);
            off[e] = tile + (c / SLAB_COLS) * (BM * 128) + r * 128 + (((((c % SLAB_COLS) * E) >> 4) ^ (r & 7)) << 4) +
                     ((c * E) & 15);
        }
        return 8 * 128 * row_mul;
    }
    __device__ __forceinline__ float at_t(const unsigned off[4], unsigned step, int n, int e) const {
        const unsigned a = off[e] + n * step;
        if constexpr (E == 4) return lds_f32(a) * FMHA_LOG2E;
        else return bias16_to_float(lds_u16(a), kind == 2) * FMHA_LOG2E;
    }

    // Forward: s[4 n + e] += the bias of its element, in log2 units (times log2(e)), for the
    // accumulator rows row0 + f.row(e) of the tile, columns f.col(n, e)
    template <int NS>
    __device__ __forceinline__ void add(float* s, int row0, const AccFrag& f) const {
        apply<NS, false>(s, row0, f, FMHA_LOG2E);
    }
    // ... s[4 n + e] = the bias times `mul` (the ws forward's BIAS_ACC: S's accumulator starts at
    // bias / softmax_scale, and the S GEMM adds Q K^T to it)
    template <int NS>
    __device__ __forceinline__ void set(float* s, int row0, const AccFrag& f, float mul) const {
        apply<NS, true>(s, row0, f, mul);
    }

  private:
    template <int NS, bool SET>
    __device__ __forceinline__ void apply(float* s, int row0, const AccFrag& f, float mul) const {
        static_assert(NS * 8 == BN && BN % SLAB_COLS == 0, "SwBiasTile: one accumulator row of n8 tiles spans the tile");
        const int xr = f.row_in_group() * row_mul;  // r % 8 of both row slots (row0 is a multiple of 16)
        const unsigned rows = tile + (row0 + f.row_in_group()) * row_mul * 128;
        const unsigned step = 8 * 128 * row_mul;  // the second row slot, 8 rows down
        if constexpr (E == 4) {
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                // columns 8n + 2t, +1: slab n / 4, chunk 2 (n % 4) + t / 2, bytes 8 (t % 2) in it
                const unsigned a = rows + (n / 4) * (BM * 128) + (((2 * (n % 4) + (f.t >> 1)) ^ xr) << 4) + (f.t & 1) * 8;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float2 x = lds_f32x2(a + r * step);
                    put<SET>(s[4 * n + 2 * r], x.x * mul);
                    put<SET>(s[4 * n + 2 * r + 1], x.y * mul);
                }
            }
        } else if (kind == 2) {
            apply16<NS, true, SET>(s, rows, xr, step, f, mul);
        } else {
            apply16<NS, false, SET>(s, rows, xr, step, f, mul);
        }
    }
    template <bool SET>
    __device__ __forceinline__ static void put(float& s, float x) {
        if constexpr (SET) s = x;
        else s += x;
    }
    template <int NS, bool BF16, bool SET>
    __device__ __forceinline__ void apply16(float* s, unsigned rows, int xr, unsigned step, const AccFrag& f,
                                            float mul) const {
#pragma unroll
        for (int n = 0; n < NS; ++n) {
            // columns 8n + 2t, +1: slab n / 8, chunk n % 8, bytes 4t in it
            const unsigned a = rows + (n / 8) * (BM * 128) + (((n % 8) ^ xr) << 4) + f.t * 4;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint32_t x = lds_u32(a + r * step);
                const uint16_t lo = static_cast<uint16_t>(x & 0xFFFFu), hi = static_cast<uint16_t>(x >> 16);
                put<SET>(s[4 * n + 2 * r], bias16_to_float(lo, BF16) * mul);
                put<SET>(s[4 * n + 2 * r + 1], bias16_to_float(hi, BF16) * mul);
            }
        }
    }
};

// The bias tile of one key block into `dst` (BM * BN * E bytes, 1024-byte aligned) at query row q0,
// key k0 of bias plane (head, batch) (the map's coordinates; 0 along a broadcast dimension, q0 too
// for a map of one-row boxes), completing `bar`.
template <int BM, int BN, int E>
__device__ __forceinline__ void tma_load_bias(const unsigned char* dst, const TmaMap& m, unsigned bar, int q0, int k0,
                                              int head, int batch) {
#pragma unroll
    for (int c = 0; c < BN * E / 128; ++c)
        tma_load_4d(smem_u32(dst) + c * (BM * 128), m, bar, k0 + c * (128 / E), q0, head, batch);
}

// stmatrix .x4 .trans (PTX ISA, sm_90): four 8x8 matrices of 16-bit elements held as mma fragments
// (register r[i] of lane l: row l / 4, columns 2 (l % 4) and +1 of matrix i) stored transposed: column
// j of matrix i becomes the 16 contiguous bytes at the address lane 8 i + j passes.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const uint32_t* r) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// Backward (the ws kernel's BIAS build): as bwd_p_ds_operands (tile.cuh), but dS goes into sdS
// untransposed, as a K-major 128-byte-swizzled tile of M query rows by the block's keys
// ([keys / 64][M][64], desc_sw_kmajor<M>): the layout GEMM4 reads as a K-major A and a TMA store of
// 64-key boxes (swizzle 128B) writes to dBias. One stmatrix.x4.trans per k16 slice: the four 8x8
// blocks of dsa[kk] (keys key0 + {0, 8} x queries 16 kk + {0, 8}) land as rows of 8 keys (16 bytes)
// of one query each; lane 8 i + c addresses query 16 kk + 8 (i >> 1) + c, keys key0 + 8 (i & 1) ..
// + 7, whose chunk (key % 64) / 8 the swizzle XORs with the query row % 8 = c, so the eight rows of
// each block hit eight different 16-byte bank groups. key0 a multiple of 16.
template <int M>
__device__ __forceinline__ void bwd_p_ds_operands_sw(const float* s, const float* dp, uint32_t (*pa)[4],
                                                     uint32_t (*dsa)[4], uint16_t* sdS, int key0, const AccFrag& f) {
    const int lane = 4 * f.g + f.t, i = lane >> 3, c = lane & 7;
    const unsigned at = smem_u32(sdS) + (key0 >> 6) * (M * 128) + (8 * (i >> 1) + c) * 128 +
                        (((((key0 & 63) >> 3) + (i & 1)) ^ c) << 4);
#pragma unroll
    for (int kk = 0; kk < M / 16; ++kk) {
        c_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
        c_to_a(dsa[kk], dp + 8 * kk, dp + 8 * kk + 4);
        stmatrix_x4_trans(at + kk * (16 * 128), dsa[kk]);
    }
}

}  // namespace fmha
