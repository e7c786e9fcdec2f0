// Architecture layer, gfx9 (wave64): tile movement and the MFMA fragment loaders of the
// mma.sync-family kernels, under the sm80 layer's names (load_tile_async, load_vec_async, load_a,
// load_a_t, store_a, mma_row_nmajor, mma_row_kmajor, acc_to_a). One instruction,
// v_mfma_f32_16x16x16 (fp16 / bf16; all three targets), with the products transposed
// (fragment.cuh): per 16x16 k-step a wavefront computes D = B_tile * A_rows^T, the rows' fragment
// (FragA: 4 consecutive k elements of one row, lane % 16 the row, lane / 16 the k group) being the
// instruction's B operand.
//
// Shared-memory tiles are row-major with pitch smem_pitch(D), as on sm80. Global -> LDS copies are
// plain 16-byte loads and stores (synchronous: cp_async_commit / cp_async_wait are no-ops; the
// kernels' barriers still order them). Column fragments (a k-major B operand, a transposed A) are
// one ds_read_b64_tr_b16 per lane on gfx950, four 16-bit reads elsewhere (load_col_frag). Issue
// 12; compile-checked, never run.
#pragma once
#include "../../common.cuh"
#include "instr.cuh"
#include "elem.cuh"
#include "fragment.cuh"

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
// Copy N floats v[row0 .. row0 + N) into shared memory, 0 past nrows (the per-row LSE and D).
template <int N, int NT>
__device__ __forceinline__ void load_vec_async(float* smem, const float* gmem, int row0, int nrows, int tid) {
    for (int r = tid; r < N; r += NT) smem[r] = row0 + r < nrows ? gmem[row0 + r] : 0.f;
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

// The 4 elements of column m0 + lane % 16, rows k0 + 4 (lane / 16) .. + 3, of a row-major tile:
// the row fragment of A = M^T at k-step (m0, k0) for M a [k][m] tile (load_a_t), and the A
// operand of mma_row_kmajor. On gfx950 one transposed LDS read (its 16-lane group reads the 4 x 16
// block of rows k0 + 4 (lane / 16) .. + 3, columns m0 .. m0 + 15, each lane addressing the 4
// elements DsReadTr16 names); elsewhere four 16-bit LDS reads.
__device__ __forceinline__ void load_col_frag(uint32_t a[2], const uint16_t* s, int pitch, int m0, int k0, int lane) {
    using L = gfx9::Mfma16x16x16;
#if defined(__gfx950__)
    using T = gfx9::DsReadTr16;
    const gfx9::short4_t v = gfx9::ds_read_tr16(s + (k0 + L::b_k(lane, 0) + T::addr_row(lane)) * pitch + m0 + T::addr_col(lane));
    a[0] = (uint16_t)v[0] | (uint32_t)(uint16_t)v[1] << 16;
    a[1] = (uint16_t)v[2] | (uint32_t)(uint16_t)v[3] << 16;
#else
    const uint16_t* col = s + (k0 + L::b_k(lane, 0)) * pitch + m0 + L::b_col(lane, 0);
    a[0] = col[0] | (uint32_t)col[pitch] << 16;
    a[1] = col[2 * pitch] | (uint32_t)col[3 * pitch] << 16;
#endif
}

// The row fragment of k-step (m0, k0) of A = M^T, M a row-major [k][m] tile: row m0 + lane % 16
// of A is column m0 + lane % 16 of M, its k elements k0 + 4 (lane / 16) .. + 3 rows of M.
__device__ __forceinline__ void load_a_t(uint32_t a[2], const uint16_t* s, int pitch, int m0, int k0, int lane) {
    load_col_frag(a, s, pitch, m0, k0, lane);
}

// The row fragment a of k-step (m0, k0) into a row-major [m][k] tile s: the inverse of load_a
// (one 8-byte LDS store: row m0 + lane % 16, columns k0 + 4 (lane / 16) .. + 3).
__device__ __forceinline__ void store_a(uint16_t* s, int pitch, int m0, int k0, const uint32_t a[2], const AccFrag& f) {
    using L = gfx9::Mfma16x16x16;
    *reinterpret_cast<uint2*>(s + (m0 + L::b_col(f.lane, 0)) * pitch + k0 + L::b_k(f.lane, 0)) = make_uint2(a[0], a[1]);
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
// the tile (load_col_frag: A's (row, k) are B's (col, k), layout.cuh).
template <int NT>
__device__ __forceinline__ void mma_row_kmajor(float (*acc)[4], const uint32_t a[2], const uint16_t* s,
                                               int pitch, int n0, int k0, int lane) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        uint32_t b[2];
        load_col_frag(b, s, pitch, n0 + n * 16, k0, lane);
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
