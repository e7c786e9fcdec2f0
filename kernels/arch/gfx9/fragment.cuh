// Architecture layer, gfx9 (wave64): the accumulator layout of the mma.sync-family kernels on
// MFMA (fmha_fwd.cu, fmha_bwd_dq_dk_dv.cu), under the names the sm80 layer gives it (AccFrag,
// warp_sync).
//
// The products are computed transposed: for S = Q K^T the instruction (v_mfma_f32_16x16x16,
// layout.cuh's Mfma16x16x16) gets K's rows as its A operand and Q^T as B, so its accumulator
// D = K Q^T = S^T puts one query row in each lane's column (D's column: lane % 16) and the keys in
// the lane's registers (D's rows: 4 (lane / 16) + r). A lane thus holds, per tile of 16 keys, 4
// adjacent columns of one row: the row maths needs no exchange across a row inside a lane, the 4
// lane groups holding one row combine with two xor shuffles (16, 32), and S's accumulator is
// already the B operand of O^T = V^T P^T (tile.cuh). The backward computes S^T the same way with
// the roles swapped (D = Q K^T: a lane holds one key, its column, and 4 adjacent query rows per
// tile), and its accumulators feed dV += P^T dO and dK += dS^T Q as B operands. Issue 12;
// compile-checked, never run.
#pragma once
#include "../../common.cuh"
#include "instr.cuh"
#include "elem.cuh"
#include "../../philox.cuh"

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
    // (enumerators, as on sm80; KEEP_TILES: tiles per word of fwd_keep_words, 4 bits each)
    enum : int { N = 16, ROW_SLOTS = 1, SLOT_ELEMS = 4, KEEP_TILES = 8 };
    int lane;

    __device__ __forceinline__ explicit AccFrag(int tid) : lane(lane_of(tid)) {}

    // D = K Q^T: this lane's D column is its query row, D's rows its keys
    __device__ __forceinline__ int row(int e) const { return L::d_col(lane, e); }
    __device__ __forceinline__ int col(int n, int e) const { return n * N + L::d_row(lane, e); }
    // row(e) = 8 row_group(e) + row_in_group(), as on sm80
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
    // Whether p holds in any lane of the wavefront (wave64)
    __device__ __forceinline__ bool any(bool p) const { return __builtin_amdgcn_ballot_w64(p) != 0; }

    // The NT tiles of acc in the input dtype into rows m0 .. m0 + 15 of a row-major tile s (pitch in elements):
    // the lane's 4 adjacent columns of its row, one 8-byte store per tile.
    template <int NT>
    __device__ __forceinline__ void store_16bit(uint16_t* s, int pitch, int m0, const float (*acc)[4]) const {
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<uint2*>(s + (m0 + row(0)) * pitch + col(n, 0)) =
                make_uint2(pack2(acc[n][0], acc[n][1]), pack2(acc[n][2], acc[n][3]));
    }

    // Backward dropout: the keep bit of element e of tile n of S^T (Q K^T's accumulator: the lane's
    // key key0l + row(e) and its 4 adjacent query rows col(n, 0) .. + 3) from the word tile
    // fill_keep_words makes (philox.cuh), by the keying's formula (keep_word_bit; the keying follows
    // the mma.sync fragment, so here each element finds its word and bit on its own).
    __device__ __forceinline__ bool keep_bit(const uint16_t* words, int M, int key0l, int n, int e) const {
        return keep_word_bit(words, M, col(n, e), key0l + row(e));
    }

    // A row slot's SLOT_ELEMS = 4 adjacent values to global memory at row + col (col: the slot's
    // first column; 16-byte aligned for fp32, 8 for 16-bit: head dims and row strides are
    // multiples of 8): fp32 stores, stores in the input dtype, or fp32 atomic adds (dQ; 4 scalar
    // adds: there is no packed fp32 atomic); from accumulator elements v[0..3], or from a Slot
    // (dK's values scaled first, scaled_slot). The same overloads as sm80's.
    struct Slot {
        float v[SLOT_ELEMS];
    };
    __device__ __forceinline__ static Slot scaled_slot(const float* v, float scale) {
        return Slot{{v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale}};
    }
    __device__ __forceinline__ static void store_slot_f32(float* row, int col, const float* v) {
        *reinterpret_cast<float4*>(row + col) = make_float4(v[0], v[1], v[2], v[3]);
    }
    __device__ __forceinline__ static void store_slot_16bit(uint16_t* row, int col, const float* v) {
        *reinterpret_cast<uint2*>(row + col) = make_uint2(pack2(v[0], v[1]), pack2(v[2], v[3]));
    }
    __device__ __forceinline__ static void store_slot_f32(float* row, int col, const Slot& x) { store_slot_f32(row, col, x.v); }
    __device__ __forceinline__ static void store_slot_16bit(uint16_t* row, int col, const Slot& x) {
        store_slot_16bit(row, col, x.v);
    }
    __device__ __forceinline__ static void add_slot_f32(float* row, int col, const float* v) {
#pragma unroll
        for (int c = 0; c < SLOT_ELEMS; ++c) gfx9::atomic_add_f32(row + col + c, v[c]);
    }

    // Forward dropout: the keep bits of NS tiles of keys from k0 in this lane's row row0 + row(0), as
    // KeepBits' words: w[0][a] bits 4m + c for column col(8a + m, c). The lane's 4 adjacent keys
    // jb .. jb + 3 (jb = k0 + col(m, 0), a multiple of 4) are draws d, d + 1 of two calls (philox.cuh:
    // calls call_of(jb) and call_of(jb) + 1, the same draw index d = draw_of(i, jb)), and the next
    // tile's, 16 keys on in the same 32-key span, draws d + 4, d + 5 of the same two: where key blocks
    // are whole spans (NS even: BLOCK_N 32 or 64, so k0 % 32 == 0) two Philox calls serve a pair of
    // tiles, else (BLOCK_N 16) one tile (the keying follows the mma.sync fragment, whose thread holds
    // all 16 draws of a call; here a lane uses 4 of each; before bench/NOTES.md step 96 one call per tile).
    template <int NS, int W, class Drop>
    __device__ __forceinline__ void fwd_keep_words(const Drop& drop, int row0, int k0, uint32_t (&w)[ROW_SLOTS][W]) const {
        static_assert(W == (NS + KEEP_TILES - 1) / KEEP_TILES && KEEP_TILES % 2 == 0, "fwd_keep_words: one word per KEEP_TILES tiles");
        constexpr int PAIR = NS % 2 == 0 ? 2 : 1;  // tiles per two calls
        const int i = row0 + row(0);
#pragma unroll
        for (int a = 0; a < W; ++a) {
            uint32_t bits = 0;
#pragma unroll
            for (int m = 0; m < KEEP_TILES; m += PAIR) {
                if (KEEP_TILES * a + m >= NS) break;
                const int jb = k0 + col(KEEP_TILES * a + m, 0), c = Drop::call_of(jb), d = Drop::draw_of(i, jb);
                const uint32_t x = drop.keep16(i & ~8, c);
                const uint32_t y = drop.keep16(i & ~8, c + 1);
#pragma unroll
                for (int u = 0; u < PAIR; ++u)  // tile m + u: draws d + 4u, d + 4u + 1
                    bits |= (((x >> (d + 4 * u)) & 3u) | (((y >> (d + 4 * u)) & 3u) << 2)) << (4 * (m + u));
            }
            w[0][a] = bits;
        }
    }
};

}  // namespace fmha
