// Architecture layer, sm90: the "blocked" shared-memory tile layout read by wgmma (no swizzle): a R x C tile (C a
// multiple of 8) is stored as 8x8 core matrices of 128 contiguous bytes, core (r/8, c/8) at
// element offset ((r/8) * (C/8) + c/8) * 64, row r%8 of a core at +8*(r%8).
//
// As a K-major operand (rows = M or N, columns = K): LBO = 128 B, SBO = (C/8) * 128 B.
// As an MN-major operand (rows = K, columns = M or N): LBO = (C/8) * 128 B, SBO = 128 B.
#pragma once
#include "../../common.cuh"
#include "../sm80/instr.cuh"
#include "../sm80/fragment.cuh"
#include "../sm80/tile.cuh"
#include "wgmma.cuh"

namespace fmha {

__device__ __forceinline__ int blk_offset(int r, int c, int C) {
    return ((r >> 3) * (C >> 3) + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
}

// Asynchronously copy rows [row0, row0 + R) x cols [0, C) of a global matrix into a blocked
// tile; rows >= nrows and cols >= ncols are zero-filled. Consecutive threads fill consecutive
// 16-byte rows of one core matrix, so a warp writes 512 contiguous bytes (no bank conflicts).
template <int R, int C, int NT>
__device__ __forceinline__ void load_blocked_async(uint16_t* smem, const uint16_t* gmem, index_t stride,
                                                   int row0, int nrows, int ncols, int tid) {
    constexpr int CB = C / 8, TOTAL = R * CB;
#pragma unroll
    for (int i = 0; i < (TOTAL + NT - 1) / NT; ++i) {
        const int idx = tid + i * NT;
        if (TOTAL % NT == 0 || idx < TOTAL) {
            const int rr = idx & 7, cb = (idx >> 3) % CB, rb = (idx >> 3) / CB;
            const int r = rb * 8 + rr, row = row0 + r;
            const bool ok = row < nrows && cb * 8 < ncols;
            const uint16_t* src = ok ? gmem + (index_t)row * stride + cb * 8 : gmem;
            cp_async_16(smem_u32(smem + (rb * CB + cb) * 64 + rr * 8), src, ok);
        }
    }
}

// Descriptors below: the tile's base descriptor advanced by the slice's byte offset (desc_advance).
// Descriptor of the 16-wide K slice starting at (row0, k0) of a K-major blocked tile (C = K extent).
template <int C>
__device__ __forceinline__ unsigned long long desc_kmajor(const uint16_t* tile, int row0, int k0) {
    return desc_advance(wgmma_desc(smem_u32(tile), 128, (C / 8) * 128), 2u * blk_offset(row0, k0, C));
}
// Descriptor of the 16-deep K slice starting at (k0, col0) of an MN-major blocked tile (rows = K).
template <int C>
__device__ __forceinline__ unsigned long long desc_mnmajor(const uint16_t* tile, int k0, int col0) {
    return desc_advance(wgmma_desc(smem_u32(tile), (C / 8) * 128, 128), 2u * blk_offset(k0, col0, C));
}
// (each descriptor helper also takes the tile's shared-memory address in place of its pointer)
template <int C>
__device__ __forceinline__ unsigned long long desc_mnmajor(unsigned tile, int k0, int col0) {
    return desc_advance(wgmma_desc(tile, (C / 8) * 128, 128), 2u * blk_offset(k0, col0, C));
}

// Column-blocked tiles: [C/8][R][8] (column block by column block, each a stack of 8x8 core
// matrices of 128 contiguous bytes), what one TMA box of backends/tma.py's column_blocked_view
// writes. Core (r/8, c/8) at element offset ((c/8) * (R/8) + r/8) * 64. As above, LBO is the core
// stride along K and SBO along M/N.
// K-major (R rows = M or N, columns = K): the 16-wide K slice at (row0, k0).
template <int R>
__device__ __forceinline__ unsigned long long desc_cb_kmajor(const uint16_t* tile, int row0, int k0) {
    return desc_advance(wgmma_desc(smem_u32(tile), (R / 8) * 128, 128), 128u * ((k0 >> 3) * (R >> 3) + (row0 >> 3)));
}
template <int R>
__device__ __forceinline__ unsigned long long desc_cb_kmajor(unsigned tile, int row0, int k0) {
    return desc_advance(wgmma_desc(tile, (R / 8) * 128, 128), 128u * ((k0 >> 3) * (R >> 3) + (row0 >> 3)));
}
// MN-major (R rows = K, columns = M or N): the 16-deep K slice at (k0, col0).
template <int R>
__device__ __forceinline__ unsigned long long desc_cb_mnmajor(const uint16_t* tile, int k0, int col0) {
    return desc_advance(wgmma_desc(smem_u32(tile), 128, (R / 8) * 128), 128u * ((col0 >> 3) * (R >> 3) + (k0 >> 3)));
}
template <int R>
__device__ __forceinline__ unsigned long long desc_cb_mnmajor(unsigned tile, int k0, int col0) {
    return desc_advance(wgmma_desc(tile, 128, (R / 8) * 128), 128u * ((col0 >> 3) * (R >> 3) + (k0 >> 3)));
}

// Rows [r0, R) of a column-blocked tile of C columns set to zero by THREADS threads (16-byte
// stores; rows a TMA box brought from beyond a sequence's end, group mode).
template <int R, int C, int THREADS>
__device__ __forceinline__ void cb_zero_rows(uint16_t* tile, int r0, int tid) {
    const int n = R - r0;
    for (int u = tid; u < (C / 8) * n; u += THREADS)
        *reinterpret_cast<uint4*>(tile + ((u / n) * R + r0 + u % n) * 8) = make_uint4(0u, 0u, 0u, 0u);
}

// Backward, once P^T and dS^T sit in a warp's S^T / dP^T accumulators (its keys key0 + f.row(e),
// M query columns): both as register A operands of GEMM1 and GEMM3 (pa, dsa: M / 16 k16 slices),
// and dS^T into the blocked [keys][M] tile sdS that GEMM4 reads.
template <int M>
__device__ __forceinline__ void bwd_p_ds_operands(const float* s, const float* dp, uint32_t (*pa)[4], uint32_t (*dsa)[4],
                                                  uint16_t* sdS, int key0, const AccFrag& f) {
#pragma unroll
    for (int kk = 0; kk < M / 16; ++kk) {
        c_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
        c_to_a(dsa[kk], dp + 8 * kk, dp + 8 * kk + 4);
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(0), kk * 16 + f.col(0, 0), M)) = dsa[kk][0];
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(2), kk * 16 + f.col(0, 0), M)) = dsa[kk][1];
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(0), kk * 16 + f.col(1, 0), M)) = dsa[kk][2];
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(2), kk * 16 + f.col(1, 0), M)) = dsa[kk][3];
    }
}

// The two halves of bwd_p_ds_operands, for a caller that issues the dV GEMM before dS exists
// (the ws backward's SPLIT_PDS build): P^T's A fragments; dS^T's A fragments and its tile sdS.
template <int M>
__device__ __forceinline__ void bwd_p_operands(const float* s, uint32_t (*pa)[4]) {
#pragma unroll
    for (int kk = 0; kk < M / 16; ++kk) c_to_a(pa[kk], s + 8 * kk, s + 8 * kk + 4);
}
template <int M>
__device__ __forceinline__ void bwd_ds_operands(const float* dp, uint32_t (*dsa)[4], uint16_t* sdS, int key0, const AccFrag& f) {
#pragma unroll
    for (int kk = 0; kk < M / 16; ++kk) {
        c_to_a(dsa[kk], dp + 8 * kk, dp + 8 * kk + 4);
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(0), kk * 16 + f.col(0, 0), M)) = dsa[kk][0];
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(2), kk * 16 + f.col(0, 0), M)) = dsa[kk][1];
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(0), kk * 16 + f.col(1, 0), M)) = dsa[kk][2];
        *reinterpret_cast<uint32_t*>(sdS + blk_offset(key0 + f.row(2), kk * 16 + f.col(1, 0), M)) = dsa[kk][3];
    }
}

// Backward, the wide-head-dim ws kernel (fmha_bwd_dq_dk_dv_sm90_ws_wide.cu): a warp's P^T and dS^T
// (rows key0 + f.row(e), NQ n8 tiles of query columns from col0, a multiple of 16) rounded to 16 bits
// into the blocked [keys][M] tiles sP and sdS, where both warpgroups' GEMMs read them from shared
// memory (A operands of dV, dK; dS for dQ). The same pairs and places as bwd_p_ds_operands.
template <int NQ, int M>
__device__ __forceinline__ void bwd_store_p_ds(const float* s, const float* dp, uint16_t* sP, uint16_t* sdS, int key0,
                                               int col0, const AccFrag& f) {
#pragma unroll
    for (int kk = 0; kk < NQ / 2; ++kk) {
        uint32_t pa[4], dsa[4];
        c_to_a(pa, s + 8 * kk, s + 8 * kk + 4);
        c_to_a(dsa, dp + 8 * kk, dp + 8 * kk + 4);
        const int c = col0 + kk * 16;
        const int o0 = blk_offset(key0 + f.row(0), c + f.col(0, 0), M), o1 = blk_offset(key0 + f.row(2), c + f.col(0, 0), M);
        const int o2 = blk_offset(key0 + f.row(0), c + f.col(1, 0), M), o3 = blk_offset(key0 + f.row(2), c + f.col(1, 0), M);
        *reinterpret_cast<uint32_t*>(sP + o0) = pa[0];
        *reinterpret_cast<uint32_t*>(sP + o1) = pa[1];
        *reinterpret_cast<uint32_t*>(sP + o2) = pa[2];
        *reinterpret_cast<uint32_t*>(sP + o3) = pa[3];
        *reinterpret_cast<uint32_t*>(sdS + o0) = dsa[0];
        *reinterpret_cast<uint32_t*>(sdS + o1) = dsa[1];
        *reinterpret_cast<uint32_t*>(sdS + o2) = dsa[2];
        *reinterpret_cast<uint32_t*>(sdS + o3) = dsa[3];
    }
}

// Backward: a warp's dQ accumulator (rows row0 + f.row(e), N8 n8 tiles from column col0) into the
// fp32 dQ tile sdQ of D columns, laid out as the workspace (dq_tile_chunk, common.cuh).
// OPAQUE_LANE (the ws backward): row0 and col0 are multiples of 8, so row & 7 = f.g and the chunk of
// column col0 + 8n + 2t, (col / 4) ^ (2 g), is 2 ((col0 / 8 + n) ^ g) + t / 2: the float offset
// inside the row is 8 ((col0 / 8 + n) ^ g) + 2t. The lane's g and t pass through an opaque move, so
// the compiler forms the N8 addresses here (two integer operations each) instead of hoisting them
// out of the caller's loop into registers the MMA warpgroups do not have (the ws backward spilled
// them, bench/NOTES.md step 31). The first wgmma backward keeps the plain form: there the opaque one
// spilled 20 B at hdim 128.
template <int N8, int D, bool OPAQUE_LANE = false>
__device__ __forceinline__ void stage_dq_tile(float* sdQ, const float* acc, int row0, int col0, const AccFrag& f) {
    if constexpr (OPAQUE_LANE) {
        int g, t;
        asm volatile("mov.b32 %0, %1;" : "=r"(g) : "r"(f.g));
        asm volatile("mov.b32 %0, %1;" : "=r"(t) : "r"(f.t));
        float* base = sdQ + (row0 + g) * D + 2 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < N8; ++n)
                *reinterpret_cast<float2*>(base + r * 8 * D + 8 * (((col0 >> 3) + n) ^ g)) =
                    make_float2(acc[4 * n + 2 * r], acc[4 * n + 2 * r + 1]);
    } else {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < N8; ++n) {
                const int row = row0 + f.row(2 * r), col = col0 + f.col(n, 0);
                *reinterpret_cast<float2*>(sdQ + row * D + 4 * dq_tile_chunk(row, col / 4) + (col & 3)) =
                    make_float2(acc[4 * n + 2 * r], acc[4 * n + 2 * r + 1]);
            }
    }
}

// Backward, the ws build with dQ^T (BLOCK_M % 64 != 0, e.g. 80 query rows at hdim 128: GEMM4 as
// dQ^T = K^T dS^T, since wgmma's M is 64): a warp's dQ^T accumulator (rows = dQ columns col0 + f.row(e),
// col0 a multiple of 16; N8 n8 tiles of query rows 8n + f.col(n, e)) into the fp32 dQ tile sdQ of D
// columns, chunks placed by dq_tile_chunk kind 2 (common.cuh). Element (query row q, column c) goes to
// q * D + 4 (c / 4 ^ 2 ((q / 2) % 4)) + c % 4; for this thread (q / 2) % 4 = t, so each of its two
// column chunks (rows f.row(0), f.row(2)) is one offset for all its query rows, and the warp's scalar
// stores are free of bank conflicts (4 row pairs x 8 columns land on 8 distinct chunks mod 8). The lane's
// g and t pass through an opaque move, as in stage_dq_tile's OPAQUE_LANE form.
template <int N8, int D>
__device__ __forceinline__ void stage_dq_tile_t(float* sdQ, const float* acc, int col0, const AccFrag& f) {
    int g, t;
    asm volatile("mov.b32 %0, %1;" : "=r"(g) : "r"(f.g));
    asm volatile("mov.b32 %0, %1;" : "=r"(t) : "r"(f.t));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float* base = sdQ + 2 * t * D + 4 * (((col0 >> 2) + 2 * r + (g >> 2)) ^ (2 * t)) + (g & 3);
#pragma unroll
        for (int n = 0; n < N8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) base[(8 * n + e) * D] = acc[4 * n + 2 * r + e];
    }
}

}  // namespace fmha
