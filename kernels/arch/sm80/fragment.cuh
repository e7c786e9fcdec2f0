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
    // (row(e), col(n, e)). KEEP_TILES: tiles per word of fwd_keep_words (SLOT_ELEMS bits each).
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

    // Backward dropout: the keep bit of element e of tile n of S^T (rows: keys key0l + row(e) of the
    // word tile fill_keep_words makes, key0l a multiple of 16; columns: query rows col(n, e) of it,
    // M of them). The thread's keys g and g + 8 share a call (philox.cuh: c = 4 (key0l >> 5) +
    // ((g >> 1) & 3)) and its query rows 8n + 2t + (e & 1) are row pairs 8 (n >> 1) + 2t + (e & 1),
    // so one 32-bit read of words [c][8 (n >> 1) + 2t ..] serves tiles n and n + 1 (n even), both
    // columns and both row slots: bit 16 (e & 1) + 8 (n & 1) + 2 ((key0l >> 3) & 3) + 2 (e >> 1) + (g & 1).
    __device__ __forceinline__ bool keep_bit(const uint16_t* words, int M, int key0l, int n, int e) const {
        const uint32_t pair = *reinterpret_cast<const uint32_t*>(words + (4 * (key0l >> 5) + ((g >> 1) & 3)) * (M / 2) +
                                                                 8 * (n >> 1) + 2 * t);
        return (pair >> (16 * (e & 1) + 8 * (n & 1) + 2 * ((key0l >> 3) & 3) + 2 * (e >> 1) + (g & 1))) & 1u;
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

    // Forward dropout on P's A operand (the warp-specialized forward; key blocks of whole 32-key
    // spans): the keep decisions of this thread's elements of NS n8 tiles from k0 as the top bits of
    // their draws' bytes, w[q][v] = word v of Dropout::keep_msb of call 4 (k0 / 32 + q) + t of row
    // pair row0 + g: byte k of word v is draw 4v + k = 8r + 2m + c (row slot r, tile m of span q,
    // column c). Three operations a word where keep bits cost seven (bench/NOTES.md step 96).
    template <int NS, class Drop>
    __device__ __forceinline__ void fwd_keep_msb(const Drop& drop, int row0, int k0, uint32_t (&w)[NS / 4][4]) const {
        static_assert(NS % 4 == 0, "fwd_keep_msb: key blocks of whole 32-key spans");
        const int ip = row0 + g, c0 = 4 * (k0 >> 5) + t;
#pragma unroll
        for (int q = 0; q < NS / 4; ++q) {
            const uint4 x = drop.keep_msb(ip, c0 + 4 * q);
            w[q][0] = x.x;
            w[q][1] = x.y;
            w[q][2] = x.z;
            w[q][3] = x.w;
        }
    }
    // Zero the dropped elements of k-step kk's A fragment (c_to_a: a[2h + r] holds n8 tile 2kk + h,
    // row slot r, columns 0 and 1 as a 16-bit pair) from fwd_keep_msb's words: tile 2kk + h is tile
    // 2 (kk & 1) + h of span kk >> 1, so its draws 8r + 2 (2 (kk & 1) + h) + c are bytes 2h + c of word
    // 2r + (kk & 1), and one PRMT in sign mode turns their top bits into the pair's mask (selector
    // 0x9988: bytes 0, 0, 1, 1; 0xBBAA: 2, 2, 3, 3), one LOP3 applies it (or `all`, Dropout::keep_all).
    template <int NQ>
    __device__ __forceinline__ static void keep_msb_apply(uint32_t (&a)[4], const uint32_t (&w)[NQ][4], int kk, uint32_t all) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 2; ++r) a[2 * h + r] &= prmt(w[kk >> 1][2 * r + (kk & 1)], 0u, h ? 0xBBAAu : 0x9988u) | all;
    }

    // Forward dropout: the keep bits of this thread's elements of NS n8 tiles of keys from k0 (k0 a
    // multiple of 8 NS), rows row0 + g and row0 + g + 8 (row0 a multiple of 16), as KeepBits' words:
    // w[r][a] bit 2m + c is column c of tile 8a + m in row slot r. The keying (philox.cuh) is this
    // layout's: call 4s + t of row pair row0 + g holds, at bit 8r + 2m + c, exactly this thread's
    // element (slot r, column c) of tile m of the 32-key span s, so a word is two calls' bytes r side by
    // side (one PRMT): no exchange across the quad (bench/NOTES.md step 96; before it each of the
    // quad's threads made one call of 16 consecutive keys and the bits were shuffled into place).
    // Key blocks of 16 keys (NS % 4 != 0: BLOCK_N 16 or 80) start 0 or 16 keys into a span: the
    // calls from the span holding k0 on, their bytes shifted into place (half a call's bits unused).
    template <int NS, int W, class Drop>
    __device__ __forceinline__ void fwd_keep_words(const Drop& drop, int row0, int k0, uint32_t (&w)[ROW_SLOTS][W]) const {
        static_assert(W == (NS + 7) / 8 && NS % 2 == 0, "fwd_keep_words: one word per 8 tiles; key blocks of 16-key multiples");
        const int ip = row0 + g, c0 = 4 * (k0 >> 5) + t;
        if constexpr (NS % 4 == 0) {
#pragma unroll
            for (int a = 0; a < W; ++a) {
                const uint32_t x = drop.keep16(ip, c0 + 8 * a);
                const uint32_t y = 8 * a + 4 < NS ? drop.keep16(ip, c0 + 8 * a + 4) : 0u;
                w[0][a] = __byte_perm(x, y, 0x0040);  // bytes 0 of x and y
                w[1][a] = __byte_perm(x, y, 0x0051);  // bytes 1
            }
        } else {
            constexpr int NC = (NS + 2 + 3) / 4;  // calls from the span of k0 (offset 0 or 2 tiles into it)
            static_assert(NC <= 4, "fwd_keep_words: at most 4 calls' bytes in a 32-bit word");
            uint32_t b0 = 0, b1 = 0;
#pragma unroll
            for (int q = 0; q < NC; ++q) {
                const uint32_t x = drop.keep16(ip, c0 + 4 * q);
                b0 |= (x & 0xffu) << (8 * q);
                b1 |= ((x >> 8) & 0xffu) << (8 * q);
            }
            const int o = 2 * ((k0 >> 3) & 3);  // bits of the span's tiles before k0
            b0 >>= o;
            b1 >>= o;
#pragma unroll
            for (int a = 0; a < W; ++a) {
                w[0][a] = (b0 >> (16 * a)) & 0xffffu;
                w[1][a] = (b1 >> (16 * a)) & 0xffffu;
            }
        }
    }
};

}  // namespace fmha
