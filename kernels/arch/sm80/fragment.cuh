// Architecture layer, sm80: the register fragment layout of mma.sync's m16n8 tiles (which wgmma
// keeps per warp), lanes per warp, and the exchanges across the threads that share a row. The
// attention maths (attention.cuh) and the kernels address accumulators only through AccFrag.
#pragma once
#include "../../common.cuh"
#include "instr.cuh"

namespace fmha {

inline constexpr int WARP_LANES = 32;  // threads per warp
__device__ __forceinline__ int lane_of(int tid) { return tid & 31; }
__device__ __forceinline__ int warp_of(int tid) { return tid >> 5; }
// Orders the shared-memory accesses of the warp's lanes (their stores before the loads after it).
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
// x summed over the warp's lanes (every lane gets the sum).
__device__ __forceinline__ float warp_reduce_sum(float x) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) x += shfl_xor(x, m);
    return x;
}

// The accumulator (C) fragment one thread holds of a 16-row tile of n8 tiles: element e (0..3) of
// n8 tile n (flattened: [4n + e]) sits at row row(e) and column col(n, e). Rows fall in two groups
// of 8 (row_group(e)), at row_in_group() inside the group. The threads holding one row (a quad of
// lanes here) combine their values with reduce_max / reduce_sum.
struct AccFrag {
    // (enumerators, not static constexpr members: NVRTC emits those as .global variables into
    // every instance's module)
    // N: columns per accumulator tile (an n8 tile). Each thread holds ROW_SLOTS rows of a tile,
    // SLOT_ELEMS adjacent columns each: element e = SLOT_ELEMS * r + c is column c of row slot r
    // (row(e), col(n, e)). KEEP_TILES: tiles per word of row_keep_bits (SLOT_ELEMS bits each).
    enum : int { N = 8, ROW_SLOTS = 2, SLOT_ELEMS = 2, KEEP_TILES = 8 };
    int g, t;  // lane / 4: the row in each group of 8; lane % 4: the column pair in each n8 tile

    __device__ __forceinline__ explicit AccFrag(int tid) : g(lane_of(tid) >> 2), t(lane_of(tid) & 3) {}

    __device__ __forceinline__ int row(int e) const { return g + (e >> 1) * 8; }
    __device__ __forceinline__ int col(int n, int e) const { return n * 8 + 2 * t + (e & 1); }
    __device__ __forceinline__ int row_group(int e) const { return e >> 1; }
    __device__ __forceinline__ int row_in_group() const { return g; }
    // One thread per row, for per-row stores (LSE).
    __device__ __forceinline__ bool row_leader() const { return t == 0; }

    __device__ __forceinline__ float reduce_max(float x) const {
        x = fmaxf(x, shfl_xor(x, 1));
        return fmaxf(x, shfl_xor(x, 2));
    }
    __device__ __forceinline__ float reduce_sum(float x) const {
        x += shfl_xor(x, 1);
        return x + shfl_xor(x, 2);
    }
    // Whether p holds in any lane of the warp (a warp-uniform answer, for branches over the fragment)
    __device__ __forceinline__ bool any(bool p) const { return __any_sync(0xffffffffu, p); }

    // The NT tiles of acc in the input dtype into rows m0 .. m0 + 15 of a row-major tile s (pitch in elements).
    template <int NT>
    __device__ __forceinline__ void store_16bit(uint16_t* s, int pitch, int m0, const float (*acc)[4]) const {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            *reinterpret_cast<uint32_t*>(s + (m0 + row(0)) * pitch + col(n, 0)) = pack2(acc[n][0], acc[n][1]);
            *reinterpret_cast<uint32_t*>(s + (m0 + row(2)) * pitch + col(n, 0)) = pack2(acc[n][2], acc[n][3]);
        }
    }

    // Backward dropout: the keep bit of element e of tile n, from the byte mask fill_keep_bits
    // makes (byte [key group][query row], `pitch` bytes per key group) of a tile whose rows are
    // keys and whose columns are query rows (S^T): the bytes of query rows col(n, 0) and
    // col(n, 0) + 1 in one 16-bit read, bit row_in_group() (+ 8 for the second column).
    __device__ __forceinline__ bool keep_bit(const unsigned char* bits, int pitch, int n, int e) const {
        const uint32_t pair = *reinterpret_cast<const uint16_t*>(bits + row_group(e) * pitch + col(n, 0));
        return (pair >> ((e & 1) * 8 + row_in_group())) & 1u;
    }

    // Backward dropout without the byte mask (the warp-specialized backward): the keep bits of this
    // thread's elements of NQ tiles of S^T (rows: the warp's 16 keys from key0, a multiple of 16;
    // columns: query rows from q0), computed by the warp itself. Round u (NQ / 4 of them): lane
    // (g, t) makes the Philox call of the warp's 16 keys (drop.keep16: bit r is key row r) and query
    // row q0 + 8 (g + 8 (u >> 1)) + 2t + (u & 1); sixteen ballots, one per bit r, give every lane bit
    // r of all 32 calls, and the lanes of rows g and g + 8 keep ballots g and g + 8 shifted by t, so
    // word 4 (u >> 1) + 2 s + (u & 1) holds, at bit 4 m (m = 0..7, the calling lane's row), the
    // element of row slot s, tile m + 8 (u >> 1), column u & 1 (keep_bit_t). Each call is made once
    // per warp.
    template <int NQ, class Drop>
    __device__ __forceinline__ void keep_bits_t(const Drop& drop, int key0, int q0, uint32_t (&w)[NQ / 2]) const {
        static_assert(NQ % 8 == 0, "keep_bits_t: whole groups of 8 tiles");
#pragma unroll 1  // one Philox chain at a time (it runs under GEMM0/2): the caller is at its register limit
        for (int u = 0; u < NQ / 4; ++u) {
            const uint32_t bits = drop.keep16(q0 + 8 * (g + 8 * (u >> 1)) + 2 * t + (u & 1), key0 >> 4);
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                const uint32_t v = ballot((bits >> r) & 1u), x = ballot((bits >> (r + 8)) & 1u);
                lo = g == r ? v : lo;
                hi = g == r ? x : hi;
            }
            lo >>= t;
            hi >>= t;
            const int k0 = 4 * (u >> 1) + (u & 1);
#pragma unroll
            for (int k = 0; k < NQ / 2; ++k) w[k] = k == k0 ? lo : k == k0 + 2 ? hi : w[k];  // (static indices: w stays in registers)
        }
    }
    // The keep bit of element e of tile n from keep_bits_t's words.
    template <int NQ>
    __device__ __forceinline__ static bool keep_bit_t(const uint32_t (&w)[NQ / 2], int n, int e) {
        return (w[4 * (n >> 3) + 2 * (e >> 1) + (e & 1)] >> (4 * (n & 7))) & 1u;
    }

    // A row slot's SLOT_ELEMS adjacent values to global memory at row + col (col: the slot's first
    // column): fp32 stores, stores in the input dtype, or fp32 atomic adds (dQ); from accumulator
    // elements v[0..], or from a Slot (dK's values scaled first, scaled_slot). The forms keep the
    // CUDA build's code what it was before these helpers (bench/NOTES.md step 25): the scaled
    // values built without a loop (a local array filled by a loop stays in memory until the loop
    // is unrolled, and NVVM's code changed), and the address row + col formed here, after the
    // values for the stores (a plain store's order: with the address first NVVM hoisted it out of
    // the fp32 / 16-bit branches, or placed it between the values).
    struct Slot {
        float v[SLOT_ELEMS];
    };
    __device__ __forceinline__ static Slot scaled_slot(const float* v, float scale) { return Slot{{v[0] * scale, v[1] * scale}}; }
    __device__ __forceinline__ static void store_slot_f32(float* row, int col, const float* v) {
        *reinterpret_cast<float2*>(row + col) = make_float2(v[0], v[1]);
    }
    __device__ __forceinline__ static void store_slot_16bit(uint16_t* row, int col, const float* v) {
        *reinterpret_cast<uint32_t*>(row + col) = pack2(v[0], v[1]);
    }
    __device__ __forceinline__ static void store_slot_f32(float* row, int col, const Slot& x) {
        *reinterpret_cast<float2*>(row + col) = make_float2(x.v[0], x.v[1]);
    }
    __device__ __forceinline__ static void store_slot_16bit(uint16_t* row, int col, const Slot& x) {
        *reinterpret_cast<uint32_t*>(row + col) = pack2(x.v[0], x.v[1]);
    }
    __device__ __forceinline__ static void add_slot_f32(float* row, int col, const float* v) {
        red_add_f32x2(row + col, v[0], v[1]);
    }

    // Forward dropout: keep bits of n8 tiles jg0 + m, m = 0..7 (jg0 even: whole Philox calls of 16
    // keys; bits 2m, 2m + 1: this thread's columns of tile m) in row i. The four threads of a row
    // each make one Philox call (keys 16 (jg0 / 2 + t) .. + 15, tiles 2t and 2t + 1; drop.keep16,
    // philox.cuh) and place its 16 keep bits at bit 16 (t & 1) of a word; an xor exchange with the
    // pair neighbour completes tiles 0-3 (threads 0, 1) or 4-7 (threads 2, 3), a second one brings
    // the other half (byte b of a word: tile b's 8 columns), and this thread takes bits 2t, 2t + 1
    // of each byte. Two shuffles and one call per eight tiles. (The exchange used to send each
    // thread one Philox output word, chosen by a per-thread index: the compiler branched around
    // every choice, which with the shuffles cost more than the Philox rounds; bench/NOTES.md step 48.)
    // (All eight tiles are computed whatever `tiles`, the number the caller uses.)
    template <class Drop>
    __device__ __forceinline__ uint32_t row_keep_bits(const Drop& drop, int i, int jg0, int /*tiles*/) const {
        uint32_t w = drop.keep16(i, (jg0 >> 1) + t) << (16 * (t & 1));
        w |= shfl_xor_u32(w, 1);
        const uint32_t other = shfl_xor_u32(w, 2);
        const uint32_t lo = t < 2 ? w : other, hi = t < 2 ? other : w;  // tiles 0-3, 4-7
        // this thread's two bits of byte m (bits 8m + 2t, + 1), as a 2-bit field at 8m, to bits
        // 18 + 2m, + 1 by one multiply: field m times 2^(18 - 6m') lands at 8m + 18 - 6m', distinct
        // 2-bit places for all 16 (m, m') pairs, so nothing carries (bench/NOTES.md step 74; was
        // three shifts and masks per byte)
        auto mine = [&](uint32_t x) { return ((x >> (2 * t)) & 0x03030303u) * 0x00041041u; };
        return ((mine(lo) >> 18) & 0xffu) | ((mine(hi) >> 10) & 0xff00u);
    }
};

}  // namespace fmha
