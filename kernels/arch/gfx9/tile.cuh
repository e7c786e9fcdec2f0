// Architecture layer, gfx9 (wave64): tile movement and the MFMA fragment loaders of the
// mma.sync-family kernels, under the sm80 layer's names (load_tile_async, load_a, mma_row_nmajor,
// mma_row_kmajor, acc_to_a). One instruction, v_mfma_f32_16x16x16 (fp16 / bf16; all three
// targets), with the products transposed (fragment.cuh): per 16x16 k-step a wavefront computes
// D = B_tile * A_rows^T, the rows' fragment (FragA: 4 consecutive k elements of one row, lane %
// 16 the row, lane / 16 the k group) being the instruction's B operand.
//
// Shared-memory tiles are row-major with pitch smem_pitch(D), as on sm80. Global -> LDS copies are
// plain 16-byte loads and stores (synchronous: cp_async_commit / cp_async_wait are no-ops; the
// kernels' barriers still order them). Issue 12; compile-checked, never run.
#pragma once
#include "../../common.cuh"
#include "instr.cuh"
#include "elem.cuh"

namespace fmha {

// 4 16-bit elements of one row (consecutive k), lo element in bits 0..15 of word 0.
typedef uint32_t FragA[2];

// D += A B on one 16x16x16 tile: a holds A's elements (A[lane % 16][4 (lane / 16) + i]), b B's
// (B[4 (lane / 16) + i][lane % 16]), d the accumulator (D[4 (lane / 16) + r][lane % 16]).
__device__ __forceinline__ void mfma_16x16x16(float d[4], const uint32_t a[2], const uint32_t b[2]) {
    typedef uint32_t u32x2 __attribute__((ext_vector_type(2)));
    const u32x2 av = {a[0], a[1]}, bv = {b[0], b[1]};
    gfx9::floatx4_t c = {d[0], d[1], d[2], d[3]};
    if constexpr (FMHA_BF16)
        c = gfx9::mfma_16x16x16(__builtin_bit_cast(gfx9::bf16x4_t, av), __builtin_bit_cast(gfx9::bf16x4_t, bv), c);
    else
        c = gfx9::mfma_16x16x16(__builtin_bit_cast(gfx9::half4_t, av), __builtin_bit_cast(gfx9::half4_t, bv), c);
#pragma unroll
    for (int r = 0; r < 4; ++r) d[r] = c[r];
}

// Copy rows [row0, row0 + R) x cols [0, D) of a global matrix (row stride `stride`) into a
// shared-memory tile, 16 bytes per thread and step; rows >= nrows and columns >= ncols read as 0.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile_async(uint16_t* smem, const uint16_t* gmem, index_t stride,
                                                int row0, int nrows, int ncols, int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int c = tid; c < R * CHUNKS; c += NT) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < nrows && col < ncols) v = *reinterpret_cast<const uint4*>(gmem + (index_t)(row0 + r) * stride + col);
        *reinterpret_cast<uint4*>(smem + r * smem_pitch(D) + col) = v;
    }
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}

// The row fragment of k-step (m0, k0) of a row-major [m][k] tile: row m0 + lane % 16, columns
// k0 + 4 (lane / 16) .. + 3 (one 8-byte LDS read).
__device__ __forceinline__ void load_a(uint32_t a[2], const uint16_t* s, int pitch, int m0, int k0, int lane) {
    using L = gfx9::Mfma16x16x16;
    const uint2 v = *reinterpret_cast<const uint2*>(s + (m0 + L::b_col(lane, 0)) * pitch + k0 + L::b_k(lane, 0));
    a[0] = v.x;
    a[1] = v.y;
}

// acc[n] += rows * B[:, tile n] for NT tiles of 16 columns from n0 of an [n][k] tile (B n-major):
// B's rows are read like the row fragment and go in as the instruction's A operand.
template <int NT>
__device__ __forceinline__ void mma_row_nmajor(float (*acc)[4], const uint32_t a[2], const uint16_t* s,
                                               int pitch, int n0, int k0, int lane) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        FragA b;
        load_a(b, s, pitch, n0 + n * 16, k0, lane);
        mfma_16x16x16(acc[n], b, a);
    }
}

// acc[n] += rows * B[:, tile n] for NT tiles of 16 columns from n0 of a [k][n] tile (B k-major):
// the instruction's A operand B^T[n0 + 16 n + lane % 16][k0 + 4 (lane / 16) + i] is a column of
// the tile, read as 4 16-bit LDS loads (gfx950's transposed LDS reads would make it one).
template <int NT>
__device__ __forceinline__ void mma_row_kmajor(float (*acc)[4], const uint32_t a[2], const uint16_t* s,
                                               int pitch, int n0, int k0, int lane) {
    using L = gfx9::Mfma16x16x16;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const uint16_t* col = s + (k0 + L::a_k(lane, 0)) * pitch + n0 + n * 16 + L::a_row(lane, 0);
        const uint32_t b[2] = {col[0] | (uint32_t)col[pitch] << 16, col[2 * pitch] | (uint32_t)col[3 * pitch] << 16};
        mfma_16x16x16(acc[n], b, a);
    }
}

// The row fragment of k-step kk (16 keys) from the accumulator tiles c: tile kk holds, per lane,
// its row's 4 columns 4 (lane / 16) .. + 3 of that k-step, exactly FragA's elements.
__device__ __forceinline__ void acc_to_a(uint32_t a[2], const float (*c)[4], int kk) {
    a[0] = pack2(c[kk][0], c[kk][1]);
    a[1] = pack2(c[kk][2], c[kk][3]);
}

}  // namespace fmha
