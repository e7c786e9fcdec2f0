// Types and constants shared by every cupy-fmha kernel. No architecture-specific code here.
//
// Elements travel as raw 16-bit patterns (uint16_t): FMHA_BF16=1 means bfloat16, 0 means float16.
// Sizes that shape register arrays (padded head dims, tile sizes, warps) are compile-time constants
// (config.cuh); lengths, strides and the mask window are run-time parameters (params.cuh).
#pragma once
#ifdef FMHA_HIP_SHIM  // the offline AMD compile without HIP headers (arch/gfx9/hip_shim.cuh)
#include "arch/gfx9/hip_shim.cuh"
#endif
#include "config.cuh"
#include "types.cuh"

#define FMHA_LOG2E 1.4426950408889634f
#define FMHA_INF __int_as_float(0x7f800000)

namespace fmha {

// Row pitch, in elements, of a shared-memory tile whose rows hold D elements. The extra 8
// elements (16 bytes) make 8 consecutive rows start in 8 different 16-byte bank groups, so
// ldmatrix (plain and transposed) and 16-byte cp.async stores are free of bank conflicts.
__host__ __device__ constexpr int smem_pitch(int d) { return d + 8; }

// CK's generic window (block_masking.hpp): row i sees key j iff i - y + 1 <= j < i + x, and
// j < seqlen_k. "No mask" is a window wider than any sequence.
struct Window {
    int y, x;
    __device__ __forceinline__ bool visible(int i, int j, int seqlen_k) const {
        return j < seqlen_k && j >= i - y + 1 && j < i + x;
    }
    // Does tile [q0, q0 + m) x [k0, k0 + n) need per-element tests?
    __device__ __forceinline__ bool tile_needs_test(int q0, int m, int k0, int n, int seqlen_q,
                                                    int seqlen_k) const {
        return k0 + n > min(q0 + x, seqlen_k) || q0 + m > min(k0 + y, seqlen_q);
    }
};


// Key blocks of width n seen by query rows [q0, q0 + m): [begin, end), empty when end <= begin.
__device__ __forceinline__ void key_block_range(const Window& w, int q0, int m, int n, int seqlen_q, int seqlen_k,
                                                int& begin, int& end) {
    const int lo = max(q0 - w.y + 1, 0);
    const int hi = min(min(q0 + m, seqlen_q) - 1 + w.x, seqlen_k);
    begin = lo / n;
    end = hi > lo ? (hi + n - 1) / n : begin;
}

// Query blocks of height m that see keys [k0, k0 + n) (CK's GetTileRangeAlongY).
__device__ __forceinline__ void query_block_range(const Window& w, int k0, int n, int m, int seqlen_q, int seqlen_k,
                                                  int& begin, int& end) {
    const int lo = max(k0 - w.x + 1, 0);
    const int hi = min(min(k0 + n, seqlen_k) - 1 + w.y, seqlen_q);
    begin = lo / m;
    end = hi > lo ? (hi + m - 1) / m : begin;
}

// Deterministic dQ by ordered adds: the first key block (of width n) whose query_block_range holds
// query block qb, from `first`, a key block at or below it whose range held an earlier query block
// of this CTA (or this CTA's own key block, kb, for its first one). The key blocks seeing one query
// block are contiguous, and the first moves right with qb, so a CTA's walk costs O(key blocks) in
// all. Mirrored in cupy_fmha/launch.py (first_key_block), checked against counting.
__device__ __forceinline__ int first_key_block(const Window& w, int qb, int first, bool first_call, int n, int m,
                                               int seqlen_q, int seqlen_k) {
    int b, e;
    if (first_call) {
        for (; first > 0; --first) {
            query_block_range(w, (first - 1) * n, n, m, seqlen_q, seqlen_k, b, e);
            if (qb < b || qb >= e) break;
        }
        return first;
    }
    for (;; ++first) {
        query_block_range(w, first * n, n, m, seqlen_q, seqlen_k, b, e);
        if (qb >= b && qb < e) return first;
    }
}

// The dQ workspace of the kernels that add a query block's dQ with one bulk copy (DQ_TILED): per
// (batch, query head), ceil(pitch_q / BLOCK_M) * BLOCK_M rows of HDIM_Q floats, so that a block's
// rows are one contiguous tile; inside row r, the 16-byte chunk j of columns [4j, 4j + 4) is
// stored at chunk dq_tile_chunk(r, j), which keeps the staging stores of the MMA fragments free
// of shared-memory bank conflicts (rows % 8 spread over 8 chunk pairs). An even XOR: columns
// [8m, 8m + 8) stay 32 contiguous bytes. Needs rows of at least 64 floats. kind 2 (the ws backward's
// dQ^T builds, BLOCK_M % 64 != 0: a thread holds two adjacent query rows of one column, and a warp's
// store spans 4 row pairs x 8 columns): the XOR takes (r / 2) % 4 instead, which spreads those 4 row
// pairs and 2 chunks over 8 chunks (stage_dq_tile_t, arch/sm90/tile.cuh); BLOCK_M stays a multiple of 8,
// so a tile's row r and the workspace's row agree in r % 8.
__host__ __device__ __forceinline__ constexpr int dq_tile_chunk(int r, int j, int kind = 1) {
    return j ^ ((kind == 2 ? (r >> 1) & 3 : r & 7) << 1);
}

// Zeroes N accumulator tiles of 4 elements per thread (the layout of every architecture's AccFrag).
template <int N>
__device__ __forceinline__ void zero(float (*acc)[4]) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
}

}  // namespace fmha
