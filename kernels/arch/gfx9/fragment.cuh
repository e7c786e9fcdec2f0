// Architecture layer, gfx9 (wave64): the accumulator layout of the mma.sync-family kernels on
// MFMA (fmha_fwd.cu), under the names the sm80 layer gives it (AccFrag, warp_sync).
//
// The products are computed transposed: for S = Q K^T the instruction (v_mfma_f32_16x16x16,
// layout.cuh's Mfma16x16x16) gets K's rows as its A operand and Q^T as B, so its accumulator
// D = K Q^T = S^T puts one query row in each lane's column (D's column: lane % 16) and the keys in
// the lane's registers (D's rows: 4 (lane / 16) + r). A lane thus holds, per tile of 16 keys, 4
// adjacent columns of one row: the row maths needs no exchange across a row inside a lane, the 4
// lane groups holding one row combine with two xor shuffles (16, 32), and S's accumulator is
// already the B operand of O^T = V^T P^T (tile.cuh). Issue 12; compile-checked, never run.
#pragma once
#include "../../common.cuh"
#include "instr.cuh"
#include "elem.cuh"

namespace fmha {

__device__ __forceinline__ void warp_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}

// A 16-row tile of accumulator tiles of N = 16 columns; element e (0..3) of tile n (flattened
// [4n + e]) sits at row row(e) and column col(n, e); one row slot of 4 columns per tile.
struct AccFrag {
    using L = gfx9::Mfma16x16x16;
    // (enumerators, as on sm80; KEEP_TILES: tiles per word of row_keep_bits, 4 bits each)
    enum : int { N = 16, ROW_SLOTS = 1, SLOT_ELEMS = 4, KEEP_TILES = 8 };
    int lane;

    __device__ __forceinline__ explicit AccFrag(int tid) : lane(lane_of(tid)) {}

    // D = K Q^T: this lane's D column is its query row, D's rows its keys
    __device__ __forceinline__ int row(int e) const { return L::d_col(lane, e); }
    __device__ __forceinline__ int col(int n, int e) const { return n * N + L::d_row(lane, e); }
    // row(e) = 8 row_group(e) + row_in_group(), as on sm80 (the backward's keep-bit addressing,
    // attention.cuh's backward_p_ds, still assumes sm80's column pairs: not ported yet)
    __device__ __forceinline__ int row_group(int e) const { return row(e) >> 3; }
    __device__ __forceinline__ int row_in_group() const { return row(0) & 7; }
    __device__ __forceinline__ bool row_leader() const { return lane < N; }

    __device__ __forceinline__ float reduce_max(float x) const {
        x = fmaxf(x, gfx9::shfl_xor(x, 16, 64));
        return fmaxf(x, gfx9::shfl_xor(x, 32, 64));
    }
    __device__ __forceinline__ float reduce_sum(float x) const {
        x += gfx9::shfl_xor(x, 16, 64);
        return x + gfx9::shfl_xor(x, 32, 64);
    }

    // The NT tiles of acc in the input dtype into rows m0 .. m0 + 15 of a row-major tile s (pitch in elements):
    // the lane's 4 adjacent columns of its row, one 8-byte store per tile.
    template <int NT>
    __device__ __forceinline__ void store_16bit(uint16_t* s, int pitch, int m0, const float (*acc)[4]) const {
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<uint2*>(s + (m0 + row(0)) * pitch + col(n, 0)) =
                make_uint2(pack2(acc[n][0], acc[n][1]), pack2(acc[n][2], acc[n][3]));
    }

    // Forward dropout: keep bits of tiles m = 0 .. tiles - 1 (keys 8 jg0 + 16 m ..) in row i, bits
    // 4m + c for this lane's columns col(m, c). The lane's 4 keys are half of one Philox key group
    // (philox.cuh: 8 keys per call), so each lane makes its own call per tile and keeps 2 words.
    template <class Drop>
    __device__ __forceinline__ uint32_t row_keep_bits(const Drop& drop, int i, int jg0, int tiles) const {
        const int c0 = L::d_row(lane, 0);  // first of the lane's 4 columns inside a tile: 0, 4, 8, 12
        uint32_t bits = 0;
#pragma unroll
        for (int m = 0; m < KEEP_TILES; ++m) {
            if (m >= tiles) break;
            const uint4 r = drop.random8(i, jg0 + (N / 8) * m + c0 / 8);
            const bool hi = (c0 & 7) != 0;  // draws 4..7 of the group: words z, w
            const uint32_t lo2 = drop.keep_word(hi ? r.z : r.x), hi2 = drop.keep_word(hi ? r.w : r.y);
            bits |= (lo2 | (hi2 << 2)) << (4 * m);
        }
        return bits;
    }
};

}  // namespace fmha
