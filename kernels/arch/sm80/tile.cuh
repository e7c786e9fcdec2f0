// Architecture layer, sm80: tile movement (cp.async into row-major shared-memory tiles) and the
// ldmatrix-based mma fragment loaders.
//
// Shared-memory tiles are row-major with pitch smem_pitch(D) elements (see common.cuh).
// Fragment naming follows mma.m16n8k16: g = lane / 4, t = lane % 4;
//   A (16x16): a[0] (row g, cols 2t..2t+1), a[1] (row g+8), a[2] (row g, cols 2t+8..), a[3] (g+8, 2t+8..)
//   B (16x8):  b[0] (k rows 2t..2t+1, col g), b[1] (k rows 2t+8.., col g)
//   C (16x8):  c[0..1] (row g, cols 2t..2t+1), c[2..3] (row g+8, cols 2t..2t+1)
#pragma once
#include "../../common.cuh"
#include "instr.cuh"
#include "fragment.cuh"

namespace fmha {

// Asynchronously copy rows [row0, row0 + R) x cols [0, D) of a global matrix (row stride
// `stride` elements, unit column stride) into shared memory. Rows >= nrows and columns >= ncols
// are zero-filled. D is a multiple of 8; ncols a multiple of 8.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile_async(uint16_t* smem, const uint16_t* gmem, index_t stride,
                                                int row0, int nrows, int ncols, int tid) {
    constexpr int CH = D / 8;
    constexpr int TOTAL = R * CH;
#pragma unroll
    for (int i = 0; i < (TOTAL + NT - 1) / NT; ++i) {
        int c = tid + i * NT;
        if (TOTAL % NT == 0 || c < TOTAL) {
            int r = c / CH, ch = c % CH;
            int row = row0 + r;
            bool ok = row < nrows && ch * 8 < ncols;
            const uint16_t* src = ok ? gmem + (index_t)row * stride + ch * 8 : gmem;
            cp_async_16(smem_u32(smem + r * smem_pitch(D) + ch * 8), src, ok);
        }
    }
}

// Asynchronously copy `n` floats v[row0 .. row0 + n) into shared memory, zero past nrows.
template <int N, int NT>
__device__ __forceinline__ void load_vec_async(float* smem, const float* gmem, int row0, int nrows, int tid) {
    for (int r = tid; r < N; r += NT) {
        bool ok = row0 + r < nrows;
        cp_async_4(smem_u32(smem + r), ok ? gmem + row0 + r : gmem, ok);
    }
}

// The A fragment of a 16x16 k-step (the row operand of an mma: 16 rows of a [m][k] tile).
typedef uint32_t FragA[4];

// A fragment (16x16) from a row-major [m][k] tile at (m0, k0).
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t* s, int pitch, int m0, int k0, int lane) {
    ldsm_x4(a, smem_u32(s + (m0 + (lane & 15)) * pitch + k0 + (lane >> 4) * 8));
}
// A fragment (16x16) of A = M^T from a row-major [k][m] tile M, at (m0, k0).
__device__ __forceinline__ void load_a_t(uint32_t a[4], const uint16_t* s, int pitch, int m0, int k0, int lane) {
    ldsm_x4_t(a, smem_u32(s + (k0 + (lane & 7) + ((lane >> 4) & 1) * 8) * pitch + m0 + ((lane >> 3) & 1) * 8));
}
// B fragments of two n-tiles (n0, n0 + 8) x k16 from a row-major [n][k] tile: b[0..1] tile n0, b[2..3] n0 + 8.
__device__ __forceinline__ void load_b2(uint32_t b[4], const uint16_t* s, int pitch, int n0, int k0, int lane) {
    ldsm_x4(b, smem_u32(s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * pitch + k0 + ((lane >> 3) & 1) * 8));
}
// B fragments of two n-tiles from a row-major [k][n] tile (B stored k-major), via transposed loads.
__device__ __forceinline__ void load_b2_t(uint32_t b[4], const uint16_t* s, int pitch, int n0, int k0, int lane) {
    ldsm_x4_t(b, smem_u32(s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0 + (lane >> 4) * 8));
}
// B fragment of one n-tile from a row-major [k][n] tile, via transposed loads.
__device__ __forceinline__ void load_b1_t(uint32_t b[2], const uint16_t* s, int pitch, int n0, int k0, int lane) {
    ldsm_x2_t(b, smem_u32(s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0));
}

// acc[n] += A * B[:, n-tile n] for NT n-tiles starting at column n0 of a [k][n] tile (B k-major).
template <int NT>
__device__ __forceinline__ void mma_row_kmajor(float (*acc)[4], const uint32_t a[4], const uint16_t* s,
                                               int pitch, int n0, int k0, int lane) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
        if (n + 1 < NT) {
            uint32_t b[4];
            load_b2_t(b, s, pitch, n0 + n * 8, k0, lane);
            mma_16816(acc[n], a, b);
            mma_16816(acc[n + 1], a, b + 2);
        } else {
            uint32_t b[2];
            load_b1_t(b, s, pitch, n0 + n * 8, k0, lane);
            mma_16816(acc[n], a, b);
        }
    }
}

// acc[n] += A * B[:, n-tile n] for NT (even) n-tiles starting at n0 of an [n][k] tile (B n-major).
template <int NT>
__device__ __forceinline__ void mma_row_nmajor(float (*acc)[4], const uint32_t a[4], const uint16_t* s,
                                               int pitch, int n0, int k0, int lane) {
    static_assert(NT % 2 == 0, "n-major B needs an even number of n-tiles");
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
        uint32_t b[4];
        load_b2(b, s, pitch, n0 + n * 8, k0, lane);
        mma_16816(acc[n], a, b);
        mma_16816(acc[n + 1], a, b + 2);
    }
}

// The A fragment a (k-step at (m0, k0)) into a row-major [m][k] tile s, 16-bit: the inverse of
// load_a, through the accumulator layout the fragment came from (c_to_a / acc_to_a: a[0], a[1]
// rows row(0), row(2) of columns col(0, 0) .. + 1; a[2], a[3] the same rows of col(1, 0) .. + 1).
// m0 by reference: with an int parameter NVVM's first pass over this function (callees first)
// puts the parameter second in m0 + row(0), and after inlining the kernel's PTX names the
// operands the other way round (the only difference against the stores written out in the kernel).
__device__ __forceinline__ void store_a(uint16_t* s, int pitch, const int& m0, int k0, const uint32_t a[4], const AccFrag& f) {
    *reinterpret_cast<uint32_t*>(s + (m0 + f.row(0)) * pitch + k0 + f.col(0, 0)) = a[0];
    *reinterpret_cast<uint32_t*>(s + (m0 + f.row(2)) * pitch + k0 + f.col(0, 0)) = a[1];
    *reinterpret_cast<uint32_t*>(s + (m0 + f.row(0)) * pitch + k0 + f.col(1, 0)) = a[2];
    *reinterpret_cast<uint32_t*>(s + (m0 + f.row(2)) * pitch + k0 + f.col(1, 0)) = a[3];
}

// C fragments of n-tiles 2j, 2j+1 (fp32) -> A fragment (16-bit) of k-step j: the register reuse
// that lets P and dS feed the next GEMM without a trip through shared memory.
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack2(c0[0], c0[1]);
    a[1] = pack2(c0[2], c0[3]);
    a[2] = pack2(c1[0], c1[1]);
    a[3] = pack2(c1[2], c1[3]);
}

// The A fragment of k-step kk (16 keys) from the accumulator tiles c (n8 tiles 2 kk, 2 kk + 1).
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float (*c)[4], int kk) { c_to_a(a, c[2 * kk], c[2 * kk + 1]); }

}  // namespace fmha
